// A deployment for test/extensions/bcx-runtime.test.ts (Walkthrough 4; its own stack's Worker entry,
// see stack-broker.ts): the default config's host-pool modules plus the acme-ns runtime, declared
// with externalDriver the way a deployment's config would (betterCompute({ drivers })).
import { betterCompute } from "../../core/index.ts";
import { capacity } from "../../plugins/capacity/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { vps } from "../../plugins/vps/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";
import { acmeNs } from "../extensions/bcx-runtime/driver.ts";

const entry = deploymentEntry(betterCompute({ modules: [provisionModule(), capacity(), vps()], drivers: [acmeNs] }));
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
