// The sink dispatcher: delivers the outbox (bc_events, or bc_audit for audit sinks) to each
// registered sink in outbox order (docs/sinks.md). A pass over one sink is one transaction that
// holds the sink's cursor row (FOR UPDATE SKIP LOCKED), reads the next batch after the cursor,
// calls deliver() and moves the cursor: two racing passes never deliver the same sink at once,
// so never out of order, and a crash before the commit delivers the batch again (at-least-once).
// A failing batch backs off; after maxAttempts its first event is tried alone, and after as
// many more it goes to the dead letter and the cursor moves past it.
import { sql } from "drizzle-orm";
import type { SinkContext, SinkDefinition, SinkEvent } from "../contracts.ts";
import type { ModuleContext, SecretRef } from "../context.ts";
import { ComputeError, invalidConfig } from "../errors.ts";
import type { Logger } from "../log.ts";
import { one, rows, type Tx } from "../store/database.ts";

export type SinkSource = "events" | "audit";

export const DEFAULT_MAX_BATCH = 100;
export const DEFAULT_MAX_ATTEMPTS = 5;
/** Backoff after the n-th failure: BASE * 2^(n-1) seconds, at most MAX. */
const BACKOFF_BASE_SECONDS = 2;
const BACKOFF_MAX_SECONDS = 300;
/** An error kept in the cursor or a dead letter is clipped to this. */
const MAX_ERROR_CHARS = 500;
/** How long a caller waits before trying a sink another pass holds. */
const BUSY_RETRY_MS = 1_000;

/** What a dispatch needs of a module context (the sinks module's, or a test's). */
export type DispatchContext = Pick<ModuleContext, "store" | "env" | "secrets" | "log" | "registered">;

/** The deployment's sinks, each once by id (a cursor is keyed by the sink's id). */
export function registeredSinks(ctx: Pick<ModuleContext, "registered">): SinkDefinition[] {
  return checkSinks(ctx.registered.extensions<SinkDefinition>("sink"));
}

/** Refuses two sinks with one id (INVALID_CONFIG): they would share a cursor. */
export function checkSinks(sinks: SinkDefinition[]): SinkDefinition[] {
  const seen = new Set<string>();
  for (const sink of sinks) {
    if (seen.has(sink.id))
      throw invalidConfig(`two sinks are registered with the id ${sink.id}: a sink's id names its cursor`, { sink: sink.id });
    seen.add(sink.id);
    for (const [option, value] of [
      ["maxBatch", sink.maxBatch],
      ["maxAttempts", sink.maxAttempts],
    ] as const) {
      if (value !== undefined && (!Number.isInteger(value) || value < 1 || value > 10_000)) {
        throw invalidConfig(`sink ${sink.id}: ${option} must be an integer from 1 to 10000`, { sink: sink.id, [option]: value });
      }
    }
  }
  return sinks;
}

export type PassOutcome =
  /** Another pass holds the sink's cursor. */
  | { state: "busy" }
  /** Nothing after the cursor. */
  | { state: "caught-up" }
  /** Backing off after a failure: the next attempt is due in this many ms. */
  | { state: "waiting"; inMs: number }
  | { state: "delivered"; count: number; more: boolean }
  | { state: "failed"; error: string; inMs: number }
  | { state: "dead-lettered"; position: string };

/** One pass over one sink: at most one batch, in one transaction. */
export async function dispatchOnce(ctx: DispatchContext, sink: SinkDefinition): Promise<PassOutcome> {
  const source: SinkSource = sink.kind;
  const maxBatch = sink.maxBatch ?? DEFAULT_MAX_BATCH;
  const maxAttempts = sink.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  const log = ctx.log.child({ sink: sink.id });
  return ctx.store.transaction(async (tx) => {
    await tx.execute(sql`INSERT INTO bc_sink_cursors (sink, source) VALUES (${sink.id}, ${source}) ON CONFLICT (sink) DO NOTHING`);
    const cursor = await one<{
      source: string;
      position: string;
      attempts: number;
      isolate_through: string | null;
      wait_ms: number | null;
    }>(
      tx,
      sql`
      SELECT source, position::text AS position, attempts, isolate_through::text AS isolate_through,
             GREATEST(0, EXTRACT(EPOCH FROM (next_attempt_at - compute_now())) * 1000)::float8 AS wait_ms
      FROM bc_sink_cursors WHERE sink = ${sink.id} FOR UPDATE SKIP LOCKED`,
    );
    if (!cursor) return { state: "busy" };
    if (cursor.source !== source) {
      throw invalidConfig(`sink ${sink.id} is now an ${source} sink, but its cursor is over ${cursor.source}: give it another id`, {
        sink: sink.id,
      });
    }
    if (cursor.wait_ms !== null && cursor.wait_ms > 0) return { state: "waiting", inMs: Math.ceil(cursor.wait_ms) };

    // A batch that failed maxAttempts times is retried one record at a time up to its last record:
    // it may have failed for one poisoned record, which then goes to the dead letter alone.
    const isolating = cursor.isolate_through !== null && BigInt(cursor.position) < BigInt(cursor.isolate_through);
    const rows = await readAfter(tx, source, cursor.position, isolating ? 1 : maxBatch);
    if (rows.length === 0) return { state: "caught-up" };
    const batch = rows.map((r) => r.event);
    const last = rows.at(-1)!.position;

    const context = sinkContext(ctx, log);
    try {
      await inSavepoint(tx, context.ctx, () => sink.deliver(batch, context.ctx));
    } catch (err) {
      const error = clipError(err, context.resolved);
      const attempts = cursor.attempts + 1;
      if (isolating && attempts >= maxAttempts) {
        // Its batch's attempts count too: it was in every one of them.
        const first = rows[0]!;
        await tx.execute(sql`
          INSERT INTO bc_sink_dead_letters (sink, source, position, record_id, attempts, last_error)
          VALUES (${sink.id}, ${source}, ${first.position}::bigint, ${first.event.id}, ${maxAttempts + attempts}, ${error})
          ON CONFLICT (sink, position) DO NOTHING`);
        await tx.execute(sql`
          UPDATE bc_sink_cursors SET position = ${first.position}::bigint, attempts = 0, next_attempt_at = NULL, last_error = ${error},
                 isolate_through = CASE WHEN isolate_through > ${first.position}::bigint THEN isolate_through END
          WHERE sink = ${sink.id}`);
        log.warn("a sink refused an event for good: it is in the dead letter", { position: first.position, error });
        return { state: "dead-lettered", position: first.position };
      }
      if (!isolating && attempts >= maxAttempts) {
        await tx.execute(sql`
          UPDATE bc_sink_cursors SET attempts = 0, last_error = ${error}, isolate_through = ${last}::bigint,
                 next_attempt_at = compute_now() + make_interval(secs => ${BACKOFF_BASE_SECONDS})
          WHERE sink = ${sink.id}`);
        log.warn("a sink's batch failed every attempt; its records are retried one at a time", { attempts, error });
        return { state: "failed", error, inMs: BACKOFF_BASE_SECONDS * 1000 };
      }
      const delay = Math.min(BACKOFF_BASE_SECONDS * 2 ** (attempts - 1), BACKOFF_MAX_SECONDS);
      await tx.execute(sql`
        UPDATE bc_sink_cursors SET attempts = ${attempts}, last_error = ${error},
               next_attempt_at = compute_now() + make_interval(secs => ${delay})
        WHERE sink = ${sink.id}`);
      log.warn("a sink's delivery failed; it backs off", { attempts, retryInSeconds: delay, error });
      return { state: "failed", error, inMs: delay * 1000 };
    }
    await tx.execute(sql`
      UPDATE bc_sink_cursors SET position = ${last}::bigint, attempts = 0, next_attempt_at = NULL, last_error = NULL,
             last_delivered_at = compute_now(), isolate_through = CASE WHEN isolate_through > ${last}::bigint THEN isolate_through END
      WHERE sink = ${sink.id}`);
    return { state: "delivered", count: batch.length, more: rows.length === (isolating ? 1 : maxBatch) };
  });
}

export interface DrainResult {
  delivered: number;
  /** When a pass should run again: 0 now (more is waiting), a backoff's ms, or null (every sink caught up). */
  nextInMs: number | null;
}

/**
 * Runs passes over every sink, concurrently across sinks, until each is caught up, backing off,
 * or has used `batches` passes. A sink whose pass throws (the database, a misconfiguration) is
 * logged and retried at the next drain.
 */
export async function drainSinks(ctx: DispatchContext, options: { batches?: number } = {}): Promise<DrainResult> {
  const budget = options.batches ?? 20;
  const results = await Promise.all(
    registeredSinks(ctx).map(async (sink) => {
      let delivered = 0;
      for (let pass = 0; pass < budget; pass++) {
        let outcome: PassOutcome;
        try {
          outcome = await dispatchOnce(ctx, sink);
        } catch (err) {
          ctx.log.warn("a sink pass failed; the next pass retries", { sink: sink.id, error: errorText(err) });
          return { delivered, nextInMs: BUSY_RETRY_MS * 5 };
        }
        switch (outcome.state) {
          case "delivered":
            delivered += outcome.count;
            if (!outcome.more) return { delivered, nextInMs: null };
            continue;
          case "dead-lettered":
            continue;
          case "caught-up":
            return { delivered, nextInMs: null };
          case "busy":
            return { delivered, nextInMs: BUSY_RETRY_MS };
          case "waiting":
          case "failed":
            return { delivered, nextInMs: outcome.inMs };
        }
      }
      return { delivered, nextInMs: 0 };
    }),
  );
  const waits = results.flatMap((r) => (r.nextInMs === null ? [] : [r.nextInMs]));
  return { delivered: results.reduce((n, r) => n + r.delivered, 0), nextInMs: waits.length ? Math.min(...waits) : null };
}

/** Delivers one dead letter again, outside the cursor (events.deadLetters.replay), in the caller's transaction. */
export async function deliverOne(ctx: DispatchContext, tx: Tx, sink: SinkDefinition, source: SinkSource, recordId: string): Promise<void> {
  const rows = await readRecord(tx, source, recordId);
  if (rows.length === 0) throw new ComputeError("NOT_FOUND", `the ${source} record ${recordId} no longer exists`, { recordId });
  const context = sinkContext(ctx, ctx.log.child({ sink: sink.id }));
  const batch = rows.map((r) => r.event);
  try {
    await inSavepoint(tx, context.ctx, () => sink.deliver(batch, context.ctx));
  } catch (err) {
    throw new ComputeError("DRIVER_ERROR", `sink ${sink.id} refused the event again: ${clipError(err, context.resolved)}`, {
      sink: sink.id,
    });
  }
}

// ---------------------------------------------------------------- the sink's context

const transactions = new WeakMap<SinkContext, Tx>();

/**
 * The dispatcher's transaction, for a built-in sink that writes to this database (tableSink): its
 * rows commit with the cursor. Undefined for a context the dispatcher did not make.
 */
export function sinkTransaction(ctx: SinkContext): Tx | undefined {
  return transactions.get(ctx);
}

/**
 * Runs deliver() in a savepoint of the pass's transaction: what a failing sink wrote there is
 * undone, and the pass can still record the failure.
 */
function inSavepoint(tx: Tx, sinkCtx: SinkContext, deliver: () => Promise<void>): Promise<void> {
  return tx.transaction(async (savepoint) => {
    transactions.set(sinkCtx, savepoint);
    try {
      await deliver();
    } finally {
      transactions.delete(sinkCtx);
    }
  });
}

/** The context deliver() gets, and the secret values it resolved (scrubbed from any error kept). */
function sinkContext(ctx: DispatchContext, log: Logger): { ctx: SinkContext; resolved: string[] } {
  const resolved: string[] = [];
  const sinkCtx: SinkContext = {
    env: ctx.env as SinkContext["env"],
    log,
    async secret(ref) {
      // In the pass's transaction: a second connection would wait behind it on a one-session database (PGlite).
      const value = await resolveSecret(ctx, transactions.get(sinkCtx), ref);
      resolved.push(value);
      return value;
    },
  };
  return { ctx: sinkCtx, resolved };
}

/** `env:NAME` (a Worker secret or var) or `secret:<id>` (the secret store); anything else is INVALID_CONFIG naming the reference. */
export async function resolveSecret(ctx: Pick<ModuleContext, "env" | "secrets">, tx: Tx | undefined, ref: string): Promise<string> {
  const unknown = (why: string) => invalidConfig(`sink secret ${JSON.stringify(ref.slice(0, 100))} ${why}`, { ref: ref.slice(0, 100) });
  const env = /^env:([A-Za-z_][A-Za-z0-9_]*)$/.exec(ref);
  if (env) {
    const value = ctx.env[env[1]!];
    if (typeof value !== "string" || value.length === 0) throw unknown("is not set (wrangler secret put it)");
    return value;
  }
  const stored = /^secret:([A-Za-z0-9-]{1,100})$/.exec(ref);
  if (!stored) throw unknown("is not a reference: use env:NAME or secret:<id>");
  try {
    return await ctx.secrets.resolve(`secret://${stored[1]}` as SecretRef, tx);
  } catch (err) {
    if (err instanceof ComputeError && err.code === "NOT_FOUND") throw unknown("does not exist in the secret store");
    throw err;
  }
}

/** An error as kept in the cursor and dead letters: clipped, and without any secret value the sink resolved. */
function clipError(err: unknown, secrets: string[]): string {
  let text = errorText(err);
  for (const value of secrets) if (value.length > 0) text = text.split(value).join("[secret]");
  return text.length > MAX_ERROR_CHARS ? `${text.slice(0, MAX_ERROR_CHARS)}…` : text || "deliver() failed";
}

const errorText = (err: unknown) => (err instanceof Error ? `${err.name === "Error" ? "" : `${err.name}: `}${err.message}` : String(err));

// ---------------------------------------------------------------- reading the outbox

interface OutboxRow {
  position: string;
  event: SinkEvent;
}

function readAfter(tx: Tx, source: SinkSource, position: string, limit: number): Promise<OutboxRow[]> {
  return readRows(tx, source, sql`outbox_seq > ${position}::bigint ORDER BY outbox_seq LIMIT ${limit}`);
}

function readRecord(tx: Tx, source: SinkSource, recordId: string): Promise<OutboxRow[]> {
  return readRows(tx, source, sql`id = ${recordId}::bigint`);
}

async function readRows(tx: Tx, source: SinkSource, where: ReturnType<typeof sql>): Promise<OutboxRow[]> {
  if (source === "events") {
    const events = await rows<Record<string, any>>(
      tx,
      sql`
      SELECT id, outbox_seq::text AS position, event_id, type, module, subject, data, occurred_at FROM bc_events WHERE ${where}`,
    );
    return events.map((r) => ({
      position: r.position,
      event: {
        id: Number(r.id),
        eventId: r.event_id,
        type: r.type,
        module: r.module,
        subject: r.subject,
        data: r.data,
        occurredAt: new Date(r.occurred_at).toISOString(),
      },
    }));
  }
  const audit = await rows<Record<string, any>>(
    tx,
    sql`
    SELECT id, outbox_seq::text AS position, actor, action, resource, method, request_id, at FROM bc_audit WHERE ${where}`,
  );
  return audit.map((r) => ({ position: r.position, event: auditEvent(r) }));
}

/** An audit row as a sink sees it: the action is its type, the resource its subject. */
function auditEvent(r: Record<string, any>): SinkEvent {
  return {
    id: Number(r.id),
    eventId: `audit-${r.id}`,
    type: r.action,
    module: "audit",
    subject: r.resource,
    data: { actor: r.actor, action: r.action, resource: r.resource, method: r.method, requestId: r.request_id },
    occurredAt: new Date(r.at).toISOString(),
  };
}

/** Lag of one sink: rows after its cursor and the age of the oldest. */
export async function sinkLag(tx: Tx, source: SinkSource, position: string): Promise<{ behind: number; oldestAt: string | null }> {
  const table = source === "events" ? sql`bc_events` : sql`bc_audit`;
  const at = source === "events" ? sql`occurred_at` : sql`at`;
  const row = (await one<{ behind: number; oldest: string | null }>(
    tx,
    sql`SELECT count(*)::int AS behind, min(${at}) AS oldest FROM ${table} WHERE outbox_seq > ${position}::bigint`,
  ))!;
  return { behind: Number(row.behind), oldestAt: row.oldest === null ? null : new Date(row.oldest).toISOString() };
}
