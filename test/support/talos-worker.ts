// A deployment for test/metal/talos-dev-stack.test.ts: the default modules plus the acme-talos
// plugin, registered the way a deployment's config would, run by `wrangler dev` (startStack's main).
import { betterCompute } from "../../core/index.ts";
import { metalModule } from "../../plugins/metal/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";
import { acmeTalos } from "../extensions/acme-talos/plugin.ts";

const entry = deploymentEntry(betterCompute({ modules: [provisionModule(), metalModule()], plugins: [acmeTalos] }));
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
