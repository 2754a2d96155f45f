// The API Worker's entry: the deployment's compute serves every request (API, JoinService,
// agent gateway); the Durable Object classes are exported for their bindings; the cron
// trigger runs what the modules registered for it (compute.sweep).
import { compute } from "../../better-compute.config.ts";
import { deploymentEntry } from "./entry.ts";

const entry = deploymentEntry(compute);
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
