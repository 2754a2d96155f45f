// The Worker the workers test project runs: the default deployment's modules plus the
// third-party test plugins, registered the way a deployment's config would. Its WorkflowDO
// runs their steps.
import { betterCompute } from "../../core/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";
import { acmeProvision } from "../extensions/acme-provision/plugin.ts";

export const testCompute = betterCompute({ modules: [provisionModule()], plugins: [acmeProvision] });

export { NodeDO } from "../../durable-objects/node.ts";
const entry = deploymentEntry(testCompute);
export const WorkflowDO = entry.WorkflowDO;
export default entry.handler;
