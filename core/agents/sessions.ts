// What an agent's session writes to the record, whoever holds the socket: the NodeDO in a
// deployment, or a simulation's in-process gateway (better-compute/testing/metal). Each
// function is one guarded write with its events, so running it twice changes nothing twice; the
// command path's (results, delivery) are one statement each, not a transaction of several.
import { sql } from "drizzle-orm";
import type { NodeSpecView, SecretRef, SecretStore } from "../context.ts";
import { databaseEvents, pgArray } from "../store/ports.ts";
import { CloseCode, FrameError, resultMessage, verifyMessage, type CommandFrame, type HelloFrame, type ResultFrame } from "../protocol.ts";
import { one, rows, type Store } from "../store/database.ts";
import type { BudgetSummary } from "./frame-budget.ts";
import { originObject } from "./notify.ts";

export const RESERVED_LABEL_PREFIX = "bc.dev/";

export interface SessionRef {
  nodeId: string;
  sessionId: string;
}

const events = (nodeId: string) => databaseEvents("agents", `node:${nodeId}`, undefined);
/** The agents module's events whose actor each statement computes (a batch's results may come from several nodes). */
const agentEvents = databaseEvents("agents", undefined, undefined);

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
  // Agent-reported labels replace the previous report; driver labels are rewritten whole. The
  // waits read the labels the node has after this hello (RETURNING), so a workflow waiting for
  // them wakes now.
  const row = (await one<{ connected: boolean; waking: string[] | string }>(
    store,
    sql`
    WITH node AS (
      UPDATE bc_nodes
      SET state = 'connected', session_id = ${session.sessionId}, boot_id = ${hello.bootId}, agent_version = ${hello.version},
          connected_at = compute_now(), resources = ${hello.resources ? JSON.stringify(hello.resources) : null}::jsonb,
          labels = (SELECT coalesce(jsonb_object_agg(k, v), '{}'::jsonb) FROM jsonb_each(labels) AS l(k, v) WHERE k NOT LIKE 'bc.dev/driver.%')
                   || ${JSON.stringify({ ...reported, ...driverLabels })}::jsonb
      WHERE id = ${session.nodeId} AND revoked_at IS NULL AND public_key = ${session.publicKey}
      RETURNING role, labels),
    fired AS (
      UPDATE bc_agent_waits w SET fired_at = compute_now() FROM node
      WHERE w.role = node.role AND w.fired_at IS NULL AND node.labels @> w.labels
      RETURNING w.workflow_id),
    connected_event AS (${events(session.nodeId).insertSql([
      {
        type: "node.connected",
        subject: `nodes/${session.nodeId}`,
        data: { sessionId: session.sessionId, bootId: hello.bootId, version: hello.version, role: hello.role, drivers: hello.drivers },
        from: "node",
      },
    ])})
    SELECT EXISTS (SELECT 1 FROM node) AS connected, coalesce((SELECT array_agg(workflow_id) FROM fired), '{}') AS waking`,
  ))!;
  return { connected: row.connected, waking: row.connected ? parseTextArray(row.waking) : [] };
}

/** Only the node's current session may mark it disconnected (a replaced one may not). */
export async function recordDisconnected(store: Store, session: SessionRef, code: number): Promise<void> {
  await store.write(sql`
    WITH node AS (
      UPDATE bc_nodes SET state = 'disconnected', disconnected_at = compute_now()
      WHERE id = ${session.nodeId} AND session_id = ${session.sessionId} RETURNING id)
    ${events(session.nodeId).insertSql([
      { type: "node.disconnected", subject: `nodes/${session.nodeId}`, data: { sessionId: session.sessionId, code }, from: "node" },
    ])}`);
}

/**
 * The node's socket was closed for exceeding its frame budget (core/agents/frame-budget.ts): the
 * event says what it sent. Written whether or not the session is still the node's current one.
 */
export async function recordRateLimited(store: Store, session: SessionRef, summary: BudgetSummary): Promise<void> {
  await store.write(
    sql`${events(session.nodeId).insertSql([
      {
        type: "node.rate-limited",
        subject: `nodes/${session.nodeId}`,
        data: { sessionId: session.sessionId, code: CloseCode.POLICY_VIOLATION, ...summary },
      },
    ])}`,
  );
}

export type ResultOutcome =
  | { refused: (typeof FrameError)[keyof typeof FrameError]; message: string }
  | { duplicate: true }
  | { recorded: true; origin: string | null };

/** A result as it arrived: the frame and the node whose socket it came on. */
export interface ArrivedResult {
  node: { nodeId: string; publicKey: string };
  frame: ResultFrame;
}

/**
 * Takes a result once: it must answer a command sent to this node under the same key, and be
 * signed by the node's key where the kind is attested. A redelivered result changes nothing.
 */
export async function recordResult(store: Store, node: { nodeId: string; publicKey: string }, frame: ResultFrame): Promise<ResultOutcome> {
  return (await recordResults(store, [{ node, frame }]))[0]!;
}

/**
 * recordResult for results that arrived together, in one statement per batch: the guarded
 * UPDATE records the open ones and their events; the command rows (whose node, key and attested
 * flag never change) say why the others were not. The same command twice in one batch goes in
 * the next statement, so it is answered as the duplicate it is.
 */
export async function recordResults(store: Store, results: ArrivedResult[]): Promise<ResultOutcome[]> {
  const outcomes: (ResultOutcome | undefined)[] = results.map(({ frame }) =>
    /^\d{1,18}$/.test(frame.id) ? undefined : { refused: FrameError.UNKNOWN_COMMAND, message: `no command ${frame.id}` },
  );
  // Verified before the statement: a signature is checked against the socket's key, in the Worker.
  const signed = await Promise.all(
    results.map(
      async ({ node, frame }) =>
        frame.signature !== undefined && (await verifyMessage(node.publicKey, await resultMessage(node.nodeId, frame), frame.signature)),
    ),
  );
  for (;;) {
    // Each command once per statement: a second result for it waits for the next one.
    const taken = new Set<string>();
    const batch: number[] = [];
    results.forEach(({ frame }, i) => {
      if (outcomes[i] || taken.has(frame.id)) return;
      taken.add(frame.id);
      batch.push(i);
    });
    if (batch.length === 0) return outcomes as ResultOutcome[];
    // VALUES rather than a JSON list: the planner then knows how many rows there are, and looks each command up by its key.
    const input = batch.map((i) => {
      const { node, frame } = results[i]!;
      const output = frame.ok ? JSON.stringify(frame.output ?? null) : null;
      const error = frame.ok ? null : JSON.stringify(frame.error ?? { code: "UNKNOWN", message: "the agent reported no error" });
      return sql`(${i}::int, ${frame.id}::bigint, ${node.nodeId}::text, ${frame.key}::text, ${frame.ok}::boolean, ${output}::jsonb,
                  ${error}::jsonb, ${signed[i] ? frame.signature! : null}::text)`;
    });
    const answered = await rows<AnsweredResult & { ord: number }>(
      store,
      sql`
      WITH input (ord, id, node_id, key, ok, output, error, signature) AS (VALUES ${sql.join(input, sql`, `)}),
      recorded AS (
        UPDATE bc_commands c
        SET state = CASE WHEN i.ok THEN 'succeeded' ELSE 'failed' END, completed_at = compute_now(),
            result = i.output, error = i.error, signature = i.signature
        FROM input i
        WHERE c.id = i.id AND c.node_id = i.node_id AND c.idempotency_key = i.key AND c.state IN ('pending', 'delivered')
          AND (NOT c.attested OR i.signature IS NOT NULL)
        RETURNING c.id, c.kind, c.origin, i.ord, i.ok, i.node_id, i.error),
      recorded_events AS (${agentEvents.insertSql([
        {
          type: sql`CASE WHEN ok THEN 'command.succeeded' ELSE 'command.failed' END`,
          subject: sql`'nodes/' || node_id`,
          data: sql`jsonb_build_object('commandId', id::text, 'kind', kind)
                 || CASE WHEN ok THEN '{}'::jsonb ELSE jsonb_build_object('error', coalesce(error->>'code', 'UNKNOWN')) END`,
          actor: sql`'node:' || node_id`,
          from: "recorded",
          each: { orderBy: sql`ord` },
        },
      ])})
      SELECT i.ord, c.node_id, c.idempotency_key, c.kind, c.attested, r.id IS NOT NULL AS recorded, r.origin
      FROM input i LEFT JOIN bc_commands c ON c.id = i.id LEFT JOIN recorded r ON r.ord = i.ord`,
    );
    for (const row of answered) outcomes[row.ord] = outcomeOf(row, results[row.ord]!, signed[row.ord]!);
  }
}

/** The command a result answers, as the statement found it (all null: no such command), and whether it was recorded now. */
type AnsweredResult = {
  node_id: string | null;
  idempotency_key: string | null;
  kind: string | null;
  attested: boolean | null;
  recorded: boolean;
  origin: string | null;
};

/** Why a result was not recorded, in the order of the checks: no such command, not this node's, not signed; else a duplicate. */
function outcomeOf(command: AnsweredResult, { node, frame }: ArrivedResult, signed: boolean): ResultOutcome {
  if (command.node_id === null) return { refused: FrameError.UNKNOWN_COMMAND, message: `no command ${frame.id}` };
  if (command.node_id !== node.nodeId || command.idempotency_key !== frame.key) {
    return { refused: FrameError.NOT_YOUR_COMMAND, message: `command ${frame.id} was not sent to this node` };
  }
  if (command.attested && !signed)
    return { refused: FrameError.BAD_SIGNATURE, message: `the result of ${command.kind} must be signed by the node's key` };
  return command.recorded ? { recorded: true, origin: command.origin } : { duplicate: true };
}

/** The object waiting on a recorded result (its command's origin: objectOrigin), if any. */
export const waitingObject = (outcome: ResultOutcome): ReturnType<typeof originObject> =>
  "recorded" in outcome ? originObject(outcome.origin) : undefined;

/** What a delivery pass sends: whether the node may still connect, its NodeSpec if newer than the one sent, its open commands. */
export interface Delivery {
  live: boolean;
  spec: Pick<NodeSpecView, "generation" | "sections"> | null;
  frames: CommandFrame[];
}

/**
 * One statement per delivery pass: expires the node's commands past their deadline (each with
 * its event), and reads whether the node is live (not revoked), its NodeSpec when its generation
 * is above specAfter (null: the caller sends no specs) and its open commands, in seq order, as
 * frames, marked delivered: the caller sends them next. Open is pending, or delivered with a seq
 * above afterSeq (the highest the caller sent on its socket: a new socket starts at 0, so it gets
 * every command without a result again). A pending command below afterSeq is one whose
 * transaction committed after a later one's was sent: seqs are not numbered in commit order.
 * (A send that fails leaves one attempt counted that never left; the command is still open, and
 * sent again on the next socket.)
 * A command's secret references are resolved here, into the frame only: the record keeps
 * references, the agent gets values.
 */
export async function nextDelivery(
  store: Store,
  nodeId: string,
  options: { afterSeq: number; specAfter: number | null; limit: number },
  secrets: () => SecretStore,
): Promise<Delivery> {
  type Open = {
    id: string;
    seq: number;
    kind: string;
    idempotency_key: string;
    body: Record<string, unknown>;
    attested: boolean;
    deadline: string | null;
    secret_refs: SecretRef[];
  };
  // The statement's parts see its snapshot, from before the expiry: `sending` leaves out what it expired.
  const row = (await one<{ live: boolean; spec: Delivery["spec"]; commands: Open[] }>(
    store,
    sql`
    WITH expired AS (
      UPDATE bc_commands SET state = 'expired', completed_at = compute_now(),
             error = '{"code":"DEADLINE_EXCEEDED","message":"no result before the command\\u0027s deadline"}'::jsonb
      WHERE node_id = ${nodeId} AND state IN ('pending', 'delivered') AND deadline < compute_now()
      RETURNING id, kind),
    expired_events AS (${events(nodeId).insertSql([
      {
        type: "command.expired",
        subject: `nodes/${nodeId}`,
        data: sql`jsonb_build_object('commandId', id::text, 'kind', kind)`,
        from: "expired",
        each: { orderBy: sql`id` },
      },
    ])}),
    sending AS (
      UPDATE bc_commands SET state = 'delivered', attempts = attempts + 1, delivered_at = compute_now()
      WHERE id IN (SELECT id FROM bc_commands
                   WHERE node_id = ${nodeId} AND (state = 'pending' OR (state = 'delivered' AND seq > ${options.afterSeq}))
                     AND id NOT IN (SELECT id FROM expired)
                   ORDER BY seq LIMIT ${options.limit})
        AND state IN ('pending', 'delivered')
      RETURNING id::text AS id, seq, kind, idempotency_key, body, attested, deadline, secret_refs)
    SELECT coalesce((SELECT revoked_at IS NULL FROM bc_nodes WHERE id = ${nodeId}), false) AS live,
           (SELECT jsonb_build_object('generation', generation, 'sections', sections) FROM bc_node_specs
            WHERE node_id = ${nodeId} AND generation > ${options.specAfter}::bigint) AS spec,
           (SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.seq), '[]'::jsonb) FROM sending s) AS commands`,
  ))!;
  // One round trip for the whole batch's secrets (a site agent's batch names a BMC password each).
  const refs = row.commands.flatMap((c) => c.secret_refs);
  const values = refs.length > 0 ? await secrets().resolveAll(refs) : new Map<SecretRef, string>();
  const frames = row.commands.map((c) => {
    const frame: CommandFrame = {
      t: "command",
      id: c.id,
      seq: Number(c.seq),
      kind: c.kind,
      key: c.idempotency_key,
      body: c.body,
      attested: c.attested,
      deadline: c.deadline ? new Date(c.deadline).toISOString() : null,
    };
    if (c.secret_refs.length > 0) frame.secrets = Object.fromEntries(c.secret_refs.map((ref) => [ref, values.get(ref)!]));
    return frame;
  });
  return { live: row.live, spec: row.spec, frames };
}

// The driver hands text[] back parsed; through some paths it arrives as the literal "{a,b}".
function parseTextArray(value: string[] | string | null): string[] {
  if (Array.isArray(value)) return value;
  if (!value || value === "{}") return [];
  return value.slice(1, -1).split(",");
}
