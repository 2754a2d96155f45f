// What an agent's session writes to the record, whoever holds the socket: the NodeDO in a
// deployment, or a simulation's in-process gateway (better-compute/testing/metal). Each
// function is one guarded transaction with its event, so running it twice changes nothing twice.
import { sql } from "drizzle-orm";
import { databaseEvents, pgArray, type SecretRef, type SecretStore } from "../context.ts";
import { FrameError, resultMessage, verifyMessage, type CommandFrame, type HelloFrame, type ResultFrame } from "../protocol.ts";
import type { Store } from "../store/database.ts";

export const RESERVED_LABEL_PREFIX = "bc.dev/";

export interface SessionRef {
  nodeId: string;
  sessionId: string;
}

const events = (nodeId: string) => databaseEvents("agents", `node:${nodeId}`, undefined);

/**
 * Records the verified hello: the node is connected on this session. Answers whether it may
 * connect (false: revoked, or its key changed) and the workflows that waited for this agent
 * (ctx.nodes.wakeWhenConnected): wake them after this.
 */
export async function recordConnected(
  store: Store,
  session: SessionRef & { publicKey: string },
  hello: HelloFrame,
): Promise<{ connected: boolean; waking: string[] }> {
  const driverLabels = Object.fromEntries(hello.drivers.map((d) => [`bc.dev/driver.${d.id}`, d.version]));
  // bc.dev/ labels are the platform's (attestors vouch for a site, a machine, a product UUID):
  // an agent's own report cannot set or override them.
  const reported = Object.fromEntries(Object.entries(hello.labels).filter(([key]) => !key.startsWith(RESERVED_LABEL_PREFIX)));
  return store.transaction(async (tx) => {
    // Agent-reported labels replace the previous report; driver labels are rewritten whole.
    const updated = await tx.execute(sql`
      UPDATE bc_nodes
      SET state = 'connected', session_id = ${session.sessionId}, boot_id = ${hello.bootId}, agent_version = ${hello.version},
          connected_at = compute_now(), resources = ${hello.resources ? JSON.stringify(hello.resources) : null}::jsonb,
          labels = (SELECT coalesce(jsonb_object_agg(k, v), '{}'::jsonb) FROM jsonb_each(labels) AS l(k, v) WHERE k NOT LIKE 'bc.dev/driver.%')
                   || ${JSON.stringify({ ...reported, ...driverLabels })}::jsonb
      WHERE id = ${session.nodeId} AND revoked_at IS NULL AND public_key = ${session.publicKey}
      RETURNING role, labels`);
    const node = updated.rows[0] as { role: string; labels: Record<string, string> } | undefined;
    if (!node) return { connected: false, waking: [] };
    const fired = await tx.execute(sql`
      UPDATE bc_agent_waits SET fired_at = compute_now()
      WHERE role = ${node.role} AND fired_at IS NULL AND ${JSON.stringify(node.labels)}::jsonb @> labels
      RETURNING workflow_id`);
    await events(session.nodeId).publish(tx, {
      type: "node.connected",
      subject: `nodes/${session.nodeId}`,
      data: { sessionId: session.sessionId, bootId: hello.bootId, version: hello.version, role: hello.role, drivers: hello.drivers },
    });
    return { connected: true, waking: (fired.rows as { workflow_id: string }[]).map((r) => r.workflow_id) };
  });
}

/** Only the node's current session may mark it disconnected (a replaced one may not). */
export async function recordDisconnected(store: Store, session: SessionRef, code: number): Promise<void> {
  await store.transaction(async (tx) => {
    const updated = await tx.execute(sql`
      UPDATE bc_nodes SET state = 'disconnected', disconnected_at = compute_now()
      WHERE id = ${session.nodeId} AND session_id = ${session.sessionId} RETURNING id`);
    if (updated.rows.length === 0) return;
    await events(session.nodeId).publish(tx, {
      type: "node.disconnected",
      subject: `nodes/${session.nodeId}`,
      data: { sessionId: session.sessionId, code },
    });
  });
}

export type ResultOutcome =
  | { refused: (typeof FrameError)[keyof typeof FrameError]; message: string }
  | { duplicate: true }
  | { recorded: true; origin: string | null };

/**
 * Takes a result once: it must answer a command sent to this node under the same key, and be
 * signed by the node's key where the kind is attested. A redelivered result changes nothing.
 */
export async function recordResult(store: Store, node: { nodeId: string; publicKey: string }, frame: ResultFrame): Promise<ResultOutcome> {
  if (!/^\d{1,18}$/.test(frame.id)) return { refused: FrameError.UNKNOWN_COMMAND, message: `no command ${frame.id}` };
  return store.transaction(async (tx): Promise<ResultOutcome> => {
    const found = await tx.execute(sql`
      SELECT node_id, kind, idempotency_key, attested, state, origin FROM bc_commands WHERE id = ${frame.id}::bigint FOR UPDATE`);
    const command = found.rows[0] as
      { node_id: string; kind: string; idempotency_key: string; attested: boolean; state: string; origin: string | null } | undefined;
    if (!command) return { refused: FrameError.UNKNOWN_COMMAND, message: `no command ${frame.id}` };
    if (command.node_id !== node.nodeId || command.idempotency_key !== frame.key) {
      return { refused: FrameError.NOT_YOUR_COMMAND, message: `command ${frame.id} was not sent to this node` };
    }
    const signed =
      frame.signature !== undefined && (await verifyMessage(node.publicKey, await resultMessage(node.nodeId, frame), frame.signature));
    if (command.attested && !signed)
      return { refused: FrameError.BAD_SIGNATURE, message: `the result of ${command.kind} must be signed by the node's key` };
    if (["succeeded", "failed", "expired"].includes(command.state)) return { duplicate: true };
    await tx.execute(sql`
      UPDATE bc_commands
      SET state = ${frame.ok ? "succeeded" : "failed"}, completed_at = compute_now(),
          result = ${frame.ok ? JSON.stringify(frame.output ?? null) : null}::jsonb,
          error = ${frame.ok ? null : JSON.stringify(frame.error ?? { code: "UNKNOWN", message: "the agent reported no error" })}::jsonb,
          signature = ${signed ? frame.signature! : null}
      WHERE id = ${frame.id}::bigint`);
    await events(node.nodeId).publish(tx, {
      type: frame.ok ? "command.succeeded" : "command.failed",
      subject: `nodes/${node.nodeId}`,
      data: { commandId: frame.id, kind: command.kind, ...(frame.ok ? {} : { error: frame.error?.code ?? "UNKNOWN" }) },
    });
    return { recorded: true, origin: command.origin };
  });
}

/** The workflow waiting on a recorded result, if any (origin "workflow:<id>"). */
export const waitingWorkflow = (outcome: ResultOutcome): string | undefined =>
  "recorded" in outcome && outcome.origin?.startsWith("workflow:") ? outcome.origin.slice("workflow:".length) : undefined;

/**
 * The node's open commands after seq, in order, as frames. A command's secret references are
 * resolved here, into the frame only: the record keeps references, the agent gets values.
 */
export async function openCommands(
  store: Store,
  nodeId: string,
  afterSeq: number,
  limit: number,
  secrets: () => SecretStore,
): Promise<CommandFrame[]> {
  const open = await store.db.execute(sql`
    SELECT id, seq, kind, idempotency_key, body, attested, deadline, secret_refs FROM bc_commands
    WHERE node_id = ${nodeId} AND state IN ('pending', 'delivered') AND seq > ${afterSeq}
    ORDER BY seq LIMIT ${limit}`);
  type Row = {
    id: string;
    seq: string;
    kind: string;
    idempotency_key: string;
    body: Record<string, unknown>;
    attested: boolean;
    deadline: string | null;
    secret_refs: string[] | string;
  };
  const rows = (open.rows as Row[]).map((r) => ({ ...r, refs: parseTextArray(r.secret_refs) as SecretRef[] }));
  // One round trip for the whole batch's secrets (a site agent's batch names a BMC password each).
  const refs = rows.flatMap((r) => r.refs);
  const values = refs.length > 0 ? await secrets().resolveAll(refs) : new Map<SecretRef, string>();
  return rows.map((r) => {
    const frame: CommandFrame = {
      t: "command",
      id: String(r.id),
      seq: Number(r.seq),
      kind: r.kind,
      key: r.idempotency_key,
      body: r.body,
      attested: r.attested,
      deadline: r.deadline ? new Date(r.deadline).toISOString() : null,
    };
    if (r.refs.length > 0) frame.secrets = Object.fromEntries(r.refs.map((ref) => [ref, values.get(ref)!]));
    return frame;
  });
}

export async function markDelivered(store: Store, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  await store.db.execute(sql`
    UPDATE bc_commands SET state = 'delivered', attempts = attempts + 1, delivered_at = compute_now()
    WHERE id = ANY(${pgArray(ids)}::bigint[]) AND state IN ('pending', 'delivered')`);
}

/** Commands past their deadline with no result are expired, each with its event. */
export async function expireOverdue(store: Store, nodeId: string): Promise<void> {
  await store.transaction(async (tx) => {
    const expired = await tx.execute(sql`
      UPDATE bc_commands SET state = 'expired', completed_at = compute_now(),
             error = '{"code":"DEADLINE_EXCEEDED","message":"no result before the command\\u0027s deadline"}'::jsonb
      WHERE node_id = ${nodeId} AND state IN ('pending', 'delivered') AND deadline < compute_now()
      RETURNING id, kind`);
    for (const row of expired.rows as { id: string; kind: string }[]) {
      await events(nodeId).publish(tx, {
        type: "command.expired",
        subject: `nodes/${nodeId}`,
        data: { commandId: String(row.id), kind: row.kind },
      });
    }
  });
}

/** Whether the node exists and is not revoked. */
export async function nodeLive(store: Store, nodeId: string): Promise<boolean> {
  const node = await store.db.execute(sql`SELECT revoked_at FROM bc_nodes WHERE id = ${nodeId}`);
  const row = node.rows[0] as { revoked_at: string | null } | undefined;
  return row !== undefined && row.revoked_at === null;
}

// The driver hands text[] back parsed; through some paths it arrives as the literal "{a,b}".
function parseTextArray(value: string[] | string | null): string[] {
  if (Array.isArray(value)) return value;
  if (!value || value === "{}") return [];
  return value.slice(1, -1).split(",");
}
