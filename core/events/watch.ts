// GET /v1/events.watch: the event record as Server-Sent Events, live. The same API key and IAM
// decision as events.list; the stream polls bc_events and ends after a bounded time, and a client
// that reconnects with Last-Event-ID (every EventSource does) resumes exactly where it was.
import { sql } from "drizzle-orm";
import { Hono } from "hono";
import { streamSSE, type SSEStreamingApi } from "hono/streaming";
import { z } from "zod";
import type { Bindings } from "../bindings.ts";
import { eventFromRow, eventMatches, eventTypeFilter } from "../core-module.ts";
import { ComputeError, errorBody, invalidArgument, schemaIssues } from "../errors.ts";
import { describeError, toComputeError, type AppEnv } from "../http.ts";
import type { IamPort } from "../iam.ts";
import { createLogger } from "../log.ts";
import { resourceId } from "../schemas.ts";
import type { Store } from "../store/database.ts";

export interface WatchOptions {
  /** How often the stream looks for new events; default 750 ms. */
  pollMs?: number;
  /** A comment line this often keeps proxies from closing an idle stream; default 15 s. */
  heartbeatMs?: number;
  /** The stream ends after this long, so clients reconnect (and a Worker's request ends); default 5 min. */
  maxMs?: number;
}

const PAGE = 500;
const log = createLogger({ component: "events.watch" });

const eventId = z.string().regex(/^\d{1,18}$/, "an event id (digits): the id of the last event seen");
const query = z.strictObject({ subject: resourceId.optional(), type: eventTypeFilter.optional(), after: eventId.optional() });

export function watchRoutes(deps: { iam: IamPort; openStore: (env: Bindings) => Store; options?: WatchOptions }): Hono<AppEnv> {
  const pollMs = deps.options?.pollMs ?? 750;
  const heartbeatMs = deps.options?.heartbeatMs ?? 15_000;
  const maxMs = deps.options?.maxMs ?? 5 * 60_000;
  const app = new Hono<AppEnv>();

  app.get("/v1/events.watch", async (c) => {
    c.set("method", "events.watch");
    const principal = await deps.iam.authenticate(c.req.raw, c.var.store);
    if (!principal) throw new ComputeError("UNAUTHENTICATED", "credentials are required: send 'Authorization: Bearer <API key>'");
    const filter = parseQuery(c.req.query());
    // The same decision as events.list: whoever may read the record may watch it.
    if (!(await deps.iam.authorize(principal, "events.list", "*"))) {
      throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not events.list on *`, { action: "events.list", resource: "*" });
    }
    // A reconnecting EventSource sends Last-Event-ID with its first URL (?after= included): the header is newer.
    const lastEventId = c.req.header("last-event-id");
    const after = lastEventId ? parseLastEventId(lastEventId) : filter.after;

    // The request's store closes when the handler returns; the stream outlives it and opens its own.
    const store = deps.openStore(c.env ?? {});
    return streamSSE(c, async (stream) => {
      const cursor = new EventCursor(store, filter, after === undefined ? undefined : Number(after));
      try {
        await cursor.start();
        // Without it a client waits out its default (3 s in browsers) after each bounded stream.
        await stream.write(`retry: ${pollMs}\n\n`);
        const ends = Date.now() + maxMs;
        let quietSince = Date.now();
        while (!stream.aborted && Date.now() < ends) {
          const { events, more } = await cursor.next();
          for (const event of events) {
            await stream.writeSSE({ id: event.id, event: event.type, data: JSON.stringify(event) });
            quietSince = Date.now();
          }
          if (more) continue;
          if (Date.now() - quietSince >= heartbeatMs) {
            await stream.write(": heartbeat\n\n");
            quietSince = Date.now();
          }
          await stream.sleep(pollMs);
        }
      } catch (err) {
        await endWithError(stream, err, c.var.requestId);
      } finally {
        await store.close();
      }
    });
  });
  return app;
}

function parseQuery(raw: Record<string, string>): z.output<typeof query> {
  const parsed = query.safeParse(raw);
  if (parsed.success) return parsed.data;
  const issues = schemaIssues(parsed.error);
  throw invalidArgument(
    `the query does not match events.watch's parameters: ${issues.map((i) => `${i.path || "(root)"}: ${i.message}`).join("; ")}`,
    {
      issues,
    },
  );
}

function parseLastEventId(value: string): string {
  if (!eventId.safeParse(value).success) throw invalidArgument("the Last-Event-ID header must be an event id (digits)");
  return value;
}

/** A failure after the stream opened cannot change the status: it is the stream's last event. */
async function endWithError(stream: SSEStreamingApi, err: unknown, requestId: string): Promise<void> {
  const error = toComputeError(err);
  log.error("the event stream failed", { requestId, code: error.code, ...describeError(err) });
  await stream.writeSSE({ event: "error", data: JSON.stringify(errorBody(error, [], requestId)) });
}

/**
 * Reads bc_events in id order without ever skipping an event. Ids come from a sequence, so a
 * transaction can commit id 11 while id 10 is still in flight: reading "id > 10" then would miss
 * 10 for good. So an event is handed out only when every id below it is final: either it follows
 * the last one directly, or the ids between are gaps that Postgres says no running transaction
 * can fill any more (a rolled back transaction's ids stay gaps forever).
 */
export class EventCursor {
  /** The last id handed out (or passed over by the filter). */
  private position = 0;
  /** Every id up to here is final: committed and visible, or never to be. */
  private settledThrough = 0;
  /** Gaps seen below `top`; final once the transactions running at the next look (xids below `xmax`) have ended. */
  private pending: { top: number; xmax?: bigint }[] = [];

  constructor(
    private readonly store: Store,
    private readonly filter: { subject?: string; type?: string },
    private readonly after: number | undefined,
  ) {
    if (after !== undefined) this.position = this.settledThrough = after;
  }

  /** Without a position: the live tail, from the newest event committed now. */
  async start(): Promise<void> {
    if (this.after !== undefined) return;
    const { rows } = await this.store.db.execute(sql`SELECT coalesce(max(id), 0)::text AS top FROM bc_events`);
    this.position = this.settledThrough = Number((rows[0] as { top: string }).top);
  }

  /** The next events in order that the filter takes; more: a full page was read, look again at once. */
  async next(): Promise<{ events: ReturnType<typeof eventFromRow>[]; more: boolean }> {
    // The horizon before the rows: a gap seen by an earlier look is final if its transactions are gone now.
    const { rows: horizon } = await this.store.db.execute(
      sql`SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin, pg_snapshot_xmax(pg_current_snapshot())::text AS xmax`,
    );
    const { xmin, xmax } = horizon[0] as { xmin: string; xmax: string };
    for (const gap of this.pending) gap.xmax ??= BigInt(xmax);
    const settled = this.pending.filter((gap) => gap.xmax! <= BigInt(xmin));
    this.pending = this.pending.filter((gap) => !settled.includes(gap));
    for (const gap of settled) this.settledThrough = Math.max(this.settledThrough, gap.top);

    const { rows } = await this.store.db.execute(sql`
      SELECT e.*, ${eventMatches(this.filter)} AS matches FROM bc_events e
      WHERE id > ${this.position} ORDER BY id LIMIT ${PAGE}`);
    const events: ReturnType<typeof eventFromRow>[] = [];
    for (const row of rows as Record<string, any>[]) {
      const id = Number(row.id);
      if (id !== this.position + 1 && id - 1 > this.settledThrough) {
        // Ids below this one may still commit: wait for them (gaps are few and short-lived).
        const top = Number((rows.at(-1) as { id: string }).id);
        if (!this.pending.some((gap) => gap.top >= top)) this.pending.push({ top });
        return { events, more: false };
      }
      this.position = id;
      if (row.matches) events.push(eventFromRow(row));
    }
    return { events, more: rows.length === PAGE };
  }
}
