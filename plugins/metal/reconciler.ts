// The lifecycle reconciler (metal.lifecycle): settles machines whose workflow ended, by the event
// the lifecycle table names for their state, and starts commissioning for enrolled machines once
// their site has an agent. It runs from the cron sweep (a full pass) and when a workflow ends: then
// it settles only that workflow's machine. Every WorkflowDO whose workflow ends runs a pass, many
// at once in a busy fleet; full passes there settled each machine 34 times over (each a
// transaction of four round trips, all but the first changing nothing): docs/decisions.md.
import { sql } from "drizzle-orm";
import type { Reconciler } from "better-compute";
import { ComputeError, one, rows, type ModuleContext, type Tx } from "better-compute/core";
import { lifecycleProfile, type HardwareProfiles } from "./hardware.ts";
import { ON_WORKFLOW_SUCCESS, transition, transitionOf, TRANSITIONAL_STATES, type TransitionalState } from "./lifecycle.ts";
import { NODE_COLUMNS, revokeRamdisks, runLifecycle, type NodeRow } from "./nodes.ts";
import { WIPE_STEP } from "./steps.ts";

type EndedNode = NodeRow & { state: TransitionalState; wf_state: string; wf_error: Record<string, unknown> | null };

/** Exactly one attested wipe in the workflow: a succeeded wipe step whose command's result is node-signed. */
async function attestedWipes(tx: Tx, workflowId: string): Promise<number> {
  const found = await one<{ n: number }>(
    tx,
    sql`
    SELECT count(*)::int AS n FROM workflow_steps s JOIN bc_commands c ON c.id = s.command_id
    WHERE s.workflow_id = ${workflowId} AND s.step_id = ${WIPE_STEP} AND s.state = 'succeeded' AND c.attested AND c.signature IS NOT NULL`,
  );
  return found!.n;
}

/** Moves one node whose workflow ended; returns whether it changed. */
async function settle(ctx: ModuleContext, node: EndedNode): Promise<boolean> {
  return ctx.store.transaction(async (tx) => {
    const wf = node.workflow_id!;
    const event = node.wf_state === "succeeded" ? ON_WORKFLOW_SUCCESS[node.state] : "fail";
    // The ramdisks this workflow booted are done (unless the event keeps one up, as rescue does): none may act for the machine again.
    if (!transitionOf(event).keepsRamdisk) await revokeRamdisks(ctx, tx, node, `workflow ${wf} ended`);
    if (event === "fail") {
      const error = node.wf_error ?? { code: "CANCELLED", message: `workflow ${wf} was ${node.wf_state}` };
      const reason = `${node.state} failed: ${String(error.message ?? error.code)}`;
      return (
        (await transition(ctx, tx, node.id, "fail", { maintenance: true, reason, lastError: { ...error, workflow: wf } })) !== undefined
      );
    }
    if (!transitionOf(event).attestedWipe) return (await transition(ctx, tx, node.id, event)) !== undefined;
    const wipes = await attestedWipes(tx, wf);
    if (wipes === 1) return (await transition(ctx, tx, node.id, event, { role: null })) !== undefined;
    // Agentless machines commission and release without a wipe anyone could attest.
    if ((event === "released" || node.pool_agent === "none") && node.policy.allowUnverifiedRelease) {
      const moved = await transition(ctx, tx, node.id, event, {
        role: null,
        reason: `${event} without an attested wipe (pool policy allowUnverifiedRelease)`,
      });
      if (moved)
        await ctx.events.publish(tx, {
          type: "node.release.unverified",
          subject: `metal/nodes/${node.id}`,
          data: { workflow: wf, event, attestedWipes: wipes },
        });
      return moved !== undefined;
    }
    const reason = `${wipes === 0 ? "no attested wipe" : `${wipes} attested wipes`} in workflow ${wf}; a machine reaches ready only after exactly one`;
    return (
      (await transition(ctx, tx, node.id, "fail", {
        maintenance: true,
        reason,
        lastError: { code: "FAILED_PRECONDITION", message: reason, workflow: wf },
      })) !== undefined
    );
  });
}

/**
 * Machines a pass moves at once, each in a transaction of its own: as many as a Worker's store has
 * connections (postgres()'s default 4). One at a time, a pass fell behind at 10,000 machines: each
 * move waits on a few round trips while the rest of the fleet keeps the database busy.
 */
const MOVES_AT_ONCE = 4;

/** Runs move over the nodes, MOVES_AT_ONCE at a time; how many it moved. A failure fails the pass once the others end. */
async function moveEach<N>(nodes: readonly N[], move: (node: N) => Promise<boolean>): Promise<number> {
  let next = 0;
  let moved = 0;
  const lanes = Array.from({ length: Math.min(MOVES_AT_ONCE, nodes.length) }, async () => {
    while (next < nodes.length) if (await move(nodes[next++]!)) moved++;
  });
  const failed = (await Promise.allSettled(lanes)).find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) throw failed.reason;
  return moved;
}

export function lifecycleReconciler(hardwareProfiles: HardwareProfiles): Reconciler {
  return {
    id: "metal.lifecycle",
    async run(ctx, cause) {
      let changed = 0;
      // Machines whose workflow ended (the one workflow's machine, when its end is the cause).
      const ended = await rows<EndedNode>(
        ctx.store.db,
        sql`
        SELECT ${NODE_COLUMNS}, w.state AS wf_state, w.error AS wf_error
        FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id JOIN workflows w ON w.id = n.workflow_id
        WHERE n.state = ANY(${`{${TRANSITIONAL_STATES.join(",")}}`}::text[]) AND w.state NOT IN ('running', 'awaiting-approval')
          ${cause ? sql`AND n.workflow_id = ${cause.workflowEnded}` : sql``}
        ORDER BY n.state_changed_at LIMIT 500`,
      );
      changed += await moveEach(ended, (node) => settle(ctx, node));
      if (cause) return changed;
      // Enrolled machines (enrolled before their site had an agent where the pool needs one, or recommissioned): commission them.
      const enrolled = await rows<NodeRow>(
        ctx.store.db,
        sql`
        SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id
        WHERE n.state = 'enrolled' AND NOT n.maintenance ORDER BY n.created_at LIMIT 500`,
      );
      changed += await moveEach(enrolled, async (node) => {
        try {
          await ctx.store.transaction((tx) =>
            runLifecycle(ctx, tx, hardwareProfiles, node, "commission", lifecycleProfile(hardwareProfiles, node, "commission")),
          );
          return true;
        } catch (err) {
          // No site agent yet, or someone else moved it first: the next pass looks again.
          if (!(err instanceof ComputeError)) throw err;
          return false;
        }
      });
      return changed;
    },
  };
}
