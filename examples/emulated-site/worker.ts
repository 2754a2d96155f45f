// The emulated site's Worker: the API Worker's entry (workers/api/index.ts) over this deployment.
import { deploymentEntry } from "../../workers/api/entry.ts";
import { compute } from "./better-compute.config.ts";

const entry = deploymentEntry(compute);
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
