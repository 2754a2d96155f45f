// A deployment for test/node/emulated-site.test.ts (startStack's main): examples/emulated-site's
// modules plus the autoinstall plugin of Walkthrough 1 (test/extensions/acme-autoinstall), whose
// bc-os.autoinstall profile installs through virtual media on the emulated site.
import { betterCompute } from "../../core/index.ts";
import { modules } from "../../examples/emulated-site/better-compute.config.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";
import { acmeAutoinstall } from "../extensions/acme-autoinstall/plugin.ts";

const entry = deploymentEntry(betterCompute({ modules, plugins: [acmeAutoinstall] }));
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
