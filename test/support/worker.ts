// The Worker the workers test project runs: the default deployment's modules plus the
// third-party test plugins, registered the way a deployment's config would. Its WorkflowDO
// runs their steps.
import { betterCompute, postgres } from "../../core/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";
import { acmeProvision } from "../extensions/acme-provision/plugin.ts";
import { chaos, chaosDatabase } from "./chaos.ts";
import { chaosSteps } from "./chaos-steps.ts";

const registrations = { modules: [provisionModule()], plugins: [acmeProvision, chaosSteps] };

/** The test deployment; its database port injects faults only while a chaos test arms it. */
export const testCompute = betterCompute({ database: chaosDatabase(postgres()), ...registrations });
const entry = deploymentEntry(testCompute);

/** The NodeDOs' round trips to the database so far (a test reads it: the objects run in the tests' isolate). */
export const nodeRoundTrips = { count: 0 };

// The chaos switch stops the Worker's request and the WorkflowDO, never an agent's session: the
// NodeDO is the same deployment's, without the fault-injecting port (its transactions are not counted).
export const NodeDO = deploymentEntry(
  betterCompute({ ...registrations, database: postgres({ onRoundTrip: () => void nodeRoundTrips.count++ }) }),
).NodeDO;
export const SinkDO = entry.SinkDO;

/** The deployment's WorkflowDO, telling the chaos switch which object is running. */
export class WorkflowDO extends entry.WorkflowDO {
  override wake() {
    chaos.running(() => this.ctx.abort("chaos: the object died here") as never);
    return super.wake();
  }
  override alarm() {
    chaos.running(() => this.ctx.abort("chaos: the object died here") as never);
    return super.alarm();
  }
}
export default entry.handler;
