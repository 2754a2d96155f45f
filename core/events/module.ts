// The sinks module (built in): what an operator sees of the dispatcher (each sink's cursor, lag
// and last error), the dead letters and their replay, and the cron's safety-net pass.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type Module } from "../contracts.ts";
import { ComputeError, notFound } from "../errors.ts";
import { defineListMethod } from "../methods.ts";
import { nextCursor, pageLimit } from "../paging.ts";
import { one, rows } from "../store/database.ts";
import { deliverOne, drainSinks, registeredSinks, sinkLag, type SinkSource } from "./dispatch.ts";
import { sinkMetrics } from "./metrics.ts";

const sinkId = z.string().regex(/^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*$/, "a sink id");
const deadLetterId = z.string().regex(/^\d{1,18}$/, "a dead letter id (digits)");

const sinkView = z.object({
  id: z.string(),
  version: z.string(),
  source: z.enum(["events", "audit"]),
  /** The outbox position (outbox_seq) of the last row delivered; "0" before the first. */
  cursor: z.string(),
  lag: z.object({
    /** Rows of its source after the cursor. */
    behind: z.number(),
    /** The oldest of them, and its age in seconds (database time); null when caught up. */
    oldestAt: z.string().nullable(),
    oldestAgeSeconds: z.number().nullable(),
  }),
  /** Failed deliveries of the batch at the cursor (0 when healthy). */
  attempts: z.number(),
  nextAttemptAt: z.string().nullable(),
  /** The sink's last error (clipped; secret values it resolved are scrubbed). */
  lastError: z.string().nullable(),
  lastDeliveredAt: z.string().nullable(),
  /** Dead letters not replayed yet. */
  deadLetters: z.number(),
});

const deadLetterView = z.object({
  id: z.string(),
  sink: z.string(),
  source: z.enum(["events", "audit"]),
  /** The row's id in bc_events (events.list) or bc_audit. */
  recordId: z.string(),
  position: z.string(),
  attempts: z.number(),
  lastError: z.string(),
  createdAt: z.string(),
  replayedAt: z.string().nullable(),
  replayedBy: z.string().nullable(),
});

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());

function deadLetterRow(r: Record<string, any>): z.input<typeof deadLetterView> {
  return {
    id: String(r.id),
    sink: r.sink,
    source: r.source,
    recordId: String(r.record_id),
    position: String(r.position),
    attempts: Number(r.attempts),
    lastError: r.last_error,
    createdAt: iso(r.created_at)!,
    replayedAt: iso(r.replayed_at),
    replayedBy: r.replayed_by,
  };
}

const sinksList = defineListMethod({
  name: "events.sinks.list",
  description: "The registered event and audit sinks: cursor, lag, retry state, last error and open dead letters",
  items: { sinks: sinkView },
  find: async (tx, _input, ctx) => {
    const sinks = [];
    for (const sink of registeredSinks(ctx)) {
      const row = (await one<Record<string, any>>(
        tx,
        sql`
        SELECT c.position::text AS position, c.attempts, c.next_attempt_at, c.last_error, c.last_delivered_at, compute_now() AS now,
               (SELECT count(*)::int FROM bc_sink_dead_letters d WHERE d.sink = ${sink.id} AND d.replayed_at IS NULL) AS dead
        FROM (SELECT 1) one LEFT JOIN bc_sink_cursors c ON c.sink = ${sink.id}`,
      ))!;
      const cursor = row.position ?? "0";
      const lag = await sinkLag(tx, sink.kind, cursor);
      const now = new Date(row.now).getTime();
      sinks.push({
        id: sink.id,
        version: sink.version,
        source: sink.kind,
        cursor,
        lag: {
          behind: lag.behind,
          oldestAt: lag.oldestAt,
          oldestAgeSeconds: lag.oldestAt === null ? null : Math.max(0, Math.round((now - new Date(lag.oldestAt).getTime()) / 1000)),
        },
        attempts: Number(row.attempts ?? 0),
        nextAttemptAt: iso(row.next_attempt_at),
        lastError: row.last_error ?? null,
        lastDeliveredAt: iso(row.last_delivered_at),
        deadLetters: Number(row.dead),
      });
    }
    return sinks;
  },
});

const deadLettersList = defineMethod({
  name: "events.deadLetters.list",
  readOnly: true,
  description: "Events and audit rows a sink refused for good, oldest first; page with after: the previous page's next",
  input: z.object({
    sink: sinkId.optional(),
    /** false: only those not replayed yet (default); true: only replayed ones. all: true lists both. */
    replayed: z.boolean().default(false),
    all: z.boolean().default(false),
    after: deadLetterId.optional(),
    limit: pageLimit,
  }),
  output: z.object({ deadLetters: z.array(deadLetterView), next: z.string().nullable() }),
  handler: async (_ctx, input, tx) => {
    if (input.after !== undefined) {
      const named = await tx.execute(sql`SELECT 1 FROM bc_sink_dead_letters WHERE id = ${input.after}::bigint`);
      if (named.rows.length === 0) throw notFound(`dead letter ${input.after} does not exist`, { after: input.after });
    }
    const found = await rows(
      tx,
      sql`
      SELECT * FROM bc_sink_dead_letters
      WHERE (${input.sink ?? null}::text IS NULL OR sink = ${input.sink ?? null})
        AND (${input.all} OR (replayed_at IS NOT NULL) = ${input.replayed})
        AND (${input.after ?? null}::bigint IS NULL OR id > ${input.after ?? null}::bigint)
      ORDER BY id LIMIT ${input.limit}`,
    );
    const deadLetters = found.map(deadLetterRow);
    return { deadLetters, next: nextCursor(deadLetters, input.limit, (d) => d.id) };
  },
});

const deadLettersReplay = defineMethod({
  name: "events.deadLetters.replay",
  resource: (input) => `deadLetters/${input.id}`,
  description:
    "Delivers a dead letter to its sink again, outside the sink's cursor, and marks it replayed; replaying it again changes nothing",
  input: z.object({ id: deadLetterId }),
  output: z.object({ deadLetter: deadLetterView, delivered: z.boolean() }),
  handler: async (ctx, input, tx) => {
    // The row lock makes two replays at once deliver once.
    const row = await one<Record<string, any>>(tx, sql`SELECT * FROM bc_sink_dead_letters WHERE id = ${input.id}::bigint FOR UPDATE`);
    if (!row) throw notFound(`dead letter ${input.id} does not exist`, { id: input.id });
    if (row.replayed_at !== null) return { deadLetter: deadLetterRow(row), delivered: false };
    const sink = registeredSinks(ctx).find((s) => s.id === row.sink);
    if (!sink) {
      throw new ComputeError(
        "FAILED_PRECONDITION",
        `sink ${row.sink} is no longer registered: register it again to replay its dead letters`,
        {
          sink: row.sink,
        },
      );
    }
    await deliverOne(ctx, tx, sink, row.source as SinkSource, String(row.record_id));
    const updated = await one(
      tx,
      sql`
      UPDATE bc_sink_dead_letters SET replayed_at = compute_now(), replayed_by = ${ctx.principal.id}
      WHERE id = ${input.id}::bigint RETURNING *`,
    );
    await ctx.events.publish(tx, {
      type: "sink.deadLetter.replayed",
      subject: `sinks/${sink.id}/deadLetters/${input.id}`,
      data: { sink: sink.id, deadLetter: input.id, recordId: String(row.record_id) },
    });
    return { deadLetter: deadLetterRow(updated!), delivered: true };
  },
});

export const SINKS_MODULE = "sinks";

export function sinksModule(): Module {
  return defineModule({
    id: SINKS_MODULE,
    description: "Event and audit sinks: the outbox dispatcher, its cursors and dead letters",
    iam: {
      actions: {
        "events.sinks.list": "Read each sink's cursor, lag and last error",
        "events.deadLetters.list": "Read the dead letters of sinks",
        "events.deadLetters.replay": "Deliver a dead letter to its sink again",
      },
    },
    api: [sinksList, deadLettersList, deadLettersReplay],
    metrics: sinkMetrics,
    // The safety net: a pass over every sink from the cron, whatever wake-ups were lost.
    sweeps: [
      {
        id: "sinks.dispatch",
        run: async (ctx) => {
          const drained = await drainSinks(ctx);
          // More than one sweep's share is waiting: the SinkDO carries on.
          if (drained.nextInMs === 0) ctx.wake.sinks();
          return drained.delivered;
        },
      },
    ],
  });
}
