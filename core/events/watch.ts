// GET /v1/events.watch: the event record as Server-Sent Events, live. The same API key and IAM
// decision as events.list; the stream polls bc_events and ends after a bounded time, and a client
// that reconnects with Last-Event-ID (every EventSource does) resumes exactly where it was.
import { sql } from "drizzle-orm";
import { Hono, type Context } from "hono";
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

const eventPosition = z.string().regex(/^\d{1,18}$/, "an event's position (digits): the position of the last event seen");
const query = z.strictObject({ subject: resourceId.optional(), type: eventTypeFilter.optional(), after: eventPosition.optional() });

export function watchRoutes(deps: { iam: IamPort; openStore: (env: Bindings) => Store; options?: WatchOptions }): Hono<AppEnv> {
  const app = new Hono<AppEnv>();

  app.get("/v1/events.watch", async (c) => {
    c.set("method", "events.watch");
    const principal = await deps.iam.authenticate(c.req.raw, c.get("store"));
    if (!principal) throw new ComputeError("UNAUTHENTICATED", "credentials are required: send 'Authorization: Bearer <API key>'");
    const { filter, after } = watchRequest(c);
    // The same decision as events.list: whoever may read the record may watch it.
    if (!(await deps.iam.authorize(principal, "events.list", "*"))) {
      throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not events.list on *`, { action: "events.list", resource: "*" });
    }
    return eventStream(c, deps.openStore(c.env ?? {}), filter, after, deps.options);
  });
  return app;
}

/** A watch request's filter (?subject, ?type) and where it resumes (Last-Event-ID, else ?after). */
export function watchRequest(c: Context<AppEnv>): { filter: { subject?: string; type?: string }; after: string | undefined } {
  const { after, ...filter } = parseQuery(c.req.query());
  // A reconnecting EventSource sends Last-Event-ID with its first URL (?after= included): the header is newer.
  const lastEventId = c.req.header("last-event-id");
  return { filter, after: lastEventId ? parseLastEventId(lastEventId) : after };
}

/**
 * The events after `after` (or from the live tail) as Server-Sent Events, once the caller has
 * decided who may see them (events.watch; the console's live updates). `store` is the stream's
 * own: the request's store closes when the handler returns, the stream outlives it. `announce`
 * first sends a `ready` event carrying the position the stream starts from, so a client that
 * reconnects resumes from there even when no event came in between; `typed: false` sends events
 * unnamed (a browser's EventSource hears only the names it listens for, and types are open-ended).
 */
export function eventStream(
  c: Context<AppEnv>,
  store: Store,
  filter: { subject?: string; type?: string },
  after: string | undefined,
  options: WatchOptions & { announce?: boolean; typed?: boolean } = {},
): Response {
  const pollMs = options.pollMs ?? 750;
  const heartbeatMs = options.heartbeatMs ?? 15_000;
  const maxMs = options.maxMs ?? 5 * 60_000;
  return streamSSE(c, async (stream) => {
    const cursor = new EventCursor(store, filter, after === undefined ? undefined : Number(after));
    try {
      await cursor.start();
      // Without it a client waits out its default (3 s in browsers) after each bounded stream.
      await stream.write(`retry: ${pollMs}\n\n`);
      if (options.announce) await stream.writeSSE({ id: String(cursor.at), event: "ready", data: "{}" });
      const ends = Date.now() + maxMs;
      let quietSince = Date.now();
      while (!stream.aborted && Date.now() < ends) {
        const { events, more } = await cursor.next();
        for (const event of events) {
          await stream.writeSSE({
            id: event.position,
            event: options.typed === false ? undefined : event.type,
            data: JSON.stringify(event),
          });
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
      await endWithError(stream, err, c.get("requestId"));
    } finally {
      await store.close();
    }
  });
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
  if (!eventPosition.safeParse(value).success) throw invalidArgument("the Last-Event-ID header must be an event's position (digits)");
  return value;
}

/** A failure after the stream opened cannot change the status: it is the stream's last event. */
async function endWithError(stream: SSEStreamingApi, err: unknown, requestId: string): Promise<void> {
  const error = toComputeError(err);
  log.error("the event stream failed", { requestId, code: error.code, ...describeError(err) });
  await stream.writeSSE({ event: "error", data: JSON.stringify(errorBody(error, [], requestId)) });
}

/**
 * Reads bc_events in commit order (outbox_seq: each row is numbered as its transaction commits,
 * migration core/0010), so "after position N" never passes an event that commits later: a row is
 * visible only once it has its number, and every smaller number is already visible or never was.
 */
export class EventCursor {
  constructor(
    private readonly store: Store,
    private readonly filter: { subject?: string; type?: string },
    /** The last position handed out (or passed over by the filter); undefined: the live tail. */
    private position: number | undefined,
  ) {}

  /** The last position handed out or passed over (0 before start on an empty record). */
  get at(): number {
    return this.position ?? 0;
  }

  /** Without a position: the live tail, from the newest event committed now. */
  async start(): Promise<void> {
    if (this.position !== undefined) return;
    const { rows } = await this.store.db.execute(sql`SELECT coalesce(max(outbox_seq), 0)::text AS top FROM bc_events`);
    this.position = Number((rows[0] as { top: string }).top);
  }

  /** The next events in order that the filter takes; more: a full page was read, look again at once. */
  async next(): Promise<{ events: ReturnType<typeof eventFromRow>[]; more: boolean }> {
    const { rows } = await this.store.db.execute(sql`
      SELECT e.*, ${eventMatches(this.filter)} AS matches FROM bc_events e
      WHERE outbox_seq > ${this.position ?? 0} ORDER BY outbox_seq LIMIT ${PAGE}`);
    const events: ReturnType<typeof eventFromRow>[] = [];
    for (const row of rows as Record<string, any>[]) {
      this.position = Number(row.outbox_seq);
      if (row.matches) events.push(eventFromRow(row));
    }
    return { events, more: rows.length === PAGE };
  }
}
