// The metal node lifecycle as an explicit state machine (after Ironic's): every change of state
// is one named event allowed from a fixed set of states, written with its history row and its
// event in the caller's transaction, and guarded by the state it expects, so a second runner
// (a retried reconciler pass, a concurrent one) changes nothing.
//
//   enrolled → commissioning → ready → deploying → deployed → releasing → ready
//   off path: failed (maintenance on), retired; deployed → rescuing → rescue → unrescuing → deployed
import { sql } from "drizzle-orm";
import type { ModuleContext, Tx } from "better-compute/core";

export const METAL_STATES = ["enrolled", "commissioning", "ready", "deploying", "deployed", "releasing", "failed", "retired", "rescuing", "rescue", "unrescuing"] as const;
export type MetalState = (typeof METAL_STATES)[number];

export const TRANSITIONS = {
  /** The reconciler starts commissioning (inspect, wipe) by itself after enrollment. */
  commission: { from: ["enrolled"], to: "commissioning" },
  /** Commissioning ended with exactly one attested wipe. */
  commissioned: { from: ["commissioning"], to: "ready" },
  deploy: { from: ["ready"], to: "deploying" },
  deployed: { from: ["deploying"], to: "deployed" },
  undeploy: { from: ["deployed"], to: "releasing" },
  /** Release ended with exactly one attested wipe (or the pool allows an unverified release). */
  released: { from: ["releasing"], to: "ready" },
  /** A workflow failed, or a wipe was not attested: maintenance goes on. */
  fail: { from: ["commissioning", "deploying", "releasing", "rescuing", "unrescuing"], to: "failed" },
  /** A deployed machine boots the ramdisk (its disk untouched) for an operator to look into. */
  rescue: { from: ["deployed"], to: "rescuing" },
  /** The ramdisk is up and connected; it stays until unrescue. */
  rescued: { from: ["rescuing"], to: "rescue" },
  unrescue: { from: ["rescue"], to: "unrescuing" },
  /** Booted from its disk again. */
  unrescued: { from: ["unrescuing"], to: "deployed" },
  /** An operator fixed a failed machine: it is commissioned again from the start. */
  recommission: { from: ["failed"], to: "enrolled" },
  retire: { from: ["enrolled", "ready", "failed"], to: "retired" },
} as const satisfies Record<string, { from: readonly MetalState[]; to: MetalState }>;

export type MetalEvent = keyof typeof TRANSITIONS;

export interface TransitionPatch {
  /** The workflow now driving the machine (null: none). */
  workflowId?: string | null;
  maintenance?: boolean;
  reason?: string | null;
  role?: string | null;
  lastError?: Record<string, unknown> | null;
}

/**
 * Applies event to the node if it is in one of the event's from-states. Returns the state it left,
 * or undefined when the node was elsewhere (someone else moved it first): nothing was written.
 */
export async function transition(ctx: ModuleContext, tx: Tx, nodeId: string, event: MetalEvent, patch: TransitionPatch = {}): Promise<MetalState | undefined> {
  const { from, to } = TRANSITIONS[event];
  const set = (key: keyof TransitionPatch) => patch[key] !== undefined;
  const updated = await tx.execute(sql`
    UPDATE metal_nodes AS n SET
      state = ${to},
      workflow_id = CASE WHEN ${set("workflowId")} THEN ${patch.workflowId ?? null} ELSE n.workflow_id END,
      maintenance = CASE WHEN ${set("maintenance")} THEN ${patch.maintenance ?? false} ELSE n.maintenance END,
      maintenance_reason = CASE WHEN ${set("reason")} THEN ${patch.reason ?? null} ELSE n.maintenance_reason END,
      role = CASE WHEN ${set("role")} THEN ${patch.role ?? null} ELSE n.role END,
      last_error = CASE WHEN ${set("lastError")} THEN ${patch.lastError ? JSON.stringify(patch.lastError) : null}::jsonb ELSE n.last_error END,
      state_changed_at = compute_now(), updated_at = compute_now()
    FROM (SELECT id, state FROM metal_nodes WHERE id = ${nodeId} FOR UPDATE) AS before
    WHERE n.id = before.id AND before.state = ANY(${`{${from.join(",")}}`}::text[])
    RETURNING before.state AS previous`);
  const previous = (updated.rows[0] as { previous: MetalState } | undefined)?.previous;
  if (!previous) return undefined;
  await tx.execute(sql`
    INSERT INTO metal_transitions (node_id, event, from_state, to_state, workflow_id, reason)
    SELECT id, ${event}, ${previous}, ${to}, workflow_id, ${patch.reason ?? null} FROM metal_nodes WHERE id = ${nodeId}`);
  await ctx.events.publish(tx, {
    type: `metal.node.${event}`,
    subject: `metal/nodes/${nodeId}`,
    data: { from: previous, to, ...(patch.workflowId ? { workflow: patch.workflowId } : {}), ...(patch.reason ? { reason: patch.reason } : {}) },
  });
  return previous;
}
