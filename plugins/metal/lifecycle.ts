// The metal node lifecycle as an explicit state machine (after Ironic's): every change of state
// is one named event allowed from a fixed set of states, written with its history row and its
// event in the caller's transaction, and guarded by the state it expects, so a second runner
// (a retried reconciler pass, a concurrent one) changes nothing. The table below is the only
// place the rules live: methods ask assertCan() before they act, and the reconciler settles a
// transitional state by the event ON_WORKFLOW_SUCCESS names for it.
//
//   enrolled → commissioning → ready → deploying → deployed → releasing → ready
//   off path: failed (maintenance on), retired; deployed → rescuing → rescue → unrescuing → deployed
import { sql } from "drizzle-orm";
import { ComputeError, one, type ModuleContext, type Tx } from "better-compute/core";

export const METAL_STATES = [
  "enrolled",
  "commissioning",
  "ready",
  "deploying",
  "deployed",
  "releasing",
  "failed",
  "retired",
  "rescuing",
  "rescue",
  "unrescuing",
] as const;
export type MetalState = (typeof METAL_STATES)[number];

/**
 * The states a workflow drives the machine through (metal_nodes.workflow_id), each with the event
 * that settles it when that workflow succeeds (Ironic's add_state(..., target=...)); when the
 * workflow fails or is cancelled, `fail` settles it.
 */
export const ON_WORKFLOW_SUCCESS = {
  commissioning: "commissioned",
  deploying: "deployed",
  releasing: "released",
  rescuing: "rescued",
  unrescuing: "unrescued",
} as const satisfies Partial<Record<MetalState, string>>;

export type TransitionalState = keyof typeof ON_WORKFLOW_SUCCESS;
/** Only the end of the machine's workflow moves it on from these. */
export const TRANSITIONAL_STATES = Object.keys(ON_WORKFLOW_SUCCESS) as TransitionalState[];
export const isTransitional = (state: MetalState): state is TransitionalState => state in ON_WORKFLOW_SUCCESS;
/** No workflow drives the machine in these (Ironic's STABLE_STATES). */
export const STABLE_STATES = METAL_STATES.filter((s) => !isTransitional(s));

/** Who moves an event: a method (by its name) or the lifecycle reconciler. */
type Mover = `metal.${string}` | "reconciler";

interface Transition {
  from: readonly MetalState[];
  to: MetalState;
  by: readonly Mover[];
  /** The workflow profile the event starts, where it is fixed (otherwise the hardware profile's or the caller's). */
  profile?: string;
  /** The machine reaches it only after exactly one attested wipe in its workflow (or an allowed unverified release). */
  attestedWipe?: true;
  /** The ramdisk the workflow booted stays up (otherwise the workflow's end revokes it). */
  keepsRamdisk?: true;
}

export const TRANSITIONS = {
  /** Commissioning (inspect, wipe) starts at enrollment, when an enrolled machine leaves maintenance, or by the reconciler once the site has an agent. */
  commission: {
    from: ["enrolled"],
    to: "commissioning",
    by: ["metal.enroll", "metal.nodes.recommission", "metal.nodes.maintenance", "reconciler"],
  },
  /** Commissioning ended with exactly one attested wipe. */
  commissioned: { from: ["commissioning"], to: "ready", by: ["reconciler"], attestedWipe: true },
  deploy: { from: ["ready"], to: "deploying", by: ["metal.deploy"] },
  deployed: { from: ["deploying"], to: "deployed", by: ["reconciler"] },
  undeploy: { from: ["deployed"], to: "releasing", by: ["metal.undeploy"] },
  /** Release ended with exactly one attested wipe (or the pool allows an unverified release). */
  released: { from: ["releasing"], to: "ready", by: ["reconciler"], attestedWipe: true },
  /** A workflow failed, or a wipe was not attested: maintenance goes on. */
  fail: { from: TRANSITIONAL_STATES, to: "failed", by: ["reconciler"] },
  /** A deployed machine boots the ramdisk (its disk untouched) for an operator to look into. */
  rescue: { from: ["deployed"], to: "rescuing", by: ["metal.rescue"], profile: "metal.rescue" },
  /** The ramdisk is up and connected; it stays until unrescue. */
  rescued: { from: ["rescuing"], to: "rescue", by: ["reconciler"], keepsRamdisk: true },
  /** The rescue ramdisk is revoked; the machine boots from its disk. */
  unrescue: { from: ["rescue"], to: "unrescuing", by: ["metal.unrescue"], profile: "metal.unrescue" },
  /** Booted from its disk again. */
  unrescued: { from: ["unrescuing"], to: "deployed", by: ["reconciler"] },
  /** An operator fixed a failed machine: it is commissioned again from the start. */
  recommission: { from: ["failed"], to: "enrolled", by: ["metal.nodes.recommission"] },
  retire: { from: ["enrolled", "ready", "failed"], to: "retired", by: ["metal.nodes.retire"] },
} as const satisfies Record<string, Transition>;

export type MetalEvent = keyof typeof TRANSITIONS;

/** The rule of an event, its optional parts included. */
export const transitionOf = (event: MetalEvent): Transition => TRANSITIONS[event];

/**
 * Maintenance is a flag beside the state: its changes are recorded like transitions (from and to
 * the same state) and allowed from these states. Not while a workflow drives the machine (the
 * flag would not stop it), nor once it is retired; a failed machine leaves maintenance only by
 * recommission.
 */
export const FLAG_CHANGES = {
  "maintenance.on": { from: STABLE_STATES.filter((s) => s !== "retired"), by: ["metal.nodes.maintenance (on: true)"] },
  "maintenance.off": { from: STABLE_STATES.filter((s) => s !== "retired" && s !== "failed"), by: ["metal.nodes.maintenance (on: false)"] },
} as const satisfies Record<string, { from: readonly MetalState[]; by: readonly string[] }>;

export type FlagChange = keyof typeof FLAG_CHANGES;

const ruleOf = (event: MetalEvent | FlagChange): { from: readonly MetalState[]; by: readonly string[] } =>
  event in FLAG_CHANGES ? FLAG_CHANGES[event as FlagChange] : TRANSITIONS[event as MetalEvent];

/** "a", "a or b", "a, b or c". */
export const anyOf = (items: readonly string[]) =>
  items.length < 2 ? items.join("") : `${items.slice(0, -1).join(", ")} or ${items.at(-1)}`;

/**
 * Refuses an event the node's state does not allow (FAILED_PRECONDITION), worded from the table:
 * "metal node m-1 is deploying; metal.deploy needs it in state ready", with the allowed states in
 * details. hint says what to do about the state the node is in.
 */
export function assertCan(
  node: { id: string; state: MetalState },
  event: MetalEvent | FlagChange,
  hint?: (state: MetalState) => string | undefined,
): void {
  const { from, by } = ruleOf(event);
  if (from.includes(node.state)) return;
  const why = hint?.(node.state);
  throw new ComputeError(
    "FAILED_PRECONDITION",
    `metal node ${node.id} is ${node.state}; ${anyOf(by)} needs it in state ${anyOf(from)}${why ? `: ${why}` : ""}`,
    {
      node: node.id,
      state: node.state,
      allowed: [...from],
    },
  );
}

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
export async function transition(
  ctx: ModuleContext,
  tx: Tx,
  nodeId: string,
  event: MetalEvent,
  patch: TransitionPatch = {},
): Promise<MetalState | undefined> {
  const { from, to } = TRANSITIONS[event];
  const set = (key: keyof TransitionPatch) => patch[key] !== undefined;
  const data = {
    to,
    ...(patch.workflowId ? { workflow: patch.workflowId } : {}),
    ...(patch.reason ? { reason: patch.reason } : {}),
  };
  // The move, its history row and its event in one statement (one round trip).
  const updated = await one<{ previous: MetalState }>(
    tx,
    sql`
    WITH moved AS (
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
      RETURNING n.id, n.workflow_id, before.state AS previous),
    history AS (
      INSERT INTO metal_transitions (node_id, event, from_state, to_state, workflow_id, reason)
      SELECT id, ${event}, previous, ${to}, workflow_id, ${patch.reason ?? null} FROM moved),
    published AS (${ctx.events.insertSql([
      {
        from: "moved",
        type: `metal.node.${event}`,
        subject: `metal/nodes/${nodeId}`,
        data: sql`jsonb_build_object('from', previous) || ${JSON.stringify(data)}::jsonb`,
      },
    ])})
    SELECT previous FROM moved`,
  );
  return updated?.previous;
}
