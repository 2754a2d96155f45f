// `better-compute events watch`: GET /v1/events.watch (Server-Sent Events), one line per event,
// for as long as the operator wants. The server ends each stream after a few minutes; this
// reconnects with Last-Event-ID, so the lines go on with nothing missed and nothing twice.
import { ApiError } from "./api.ts";
import { splitArgs } from "./args.ts";
import { resolveConnection, UsageError, type Connection } from "./connection.ts";
import { compact } from "./format.ts";

export const EVENTS_WATCH_HELP = `better-compute events watch [--type T] [--subject S] [--after POSITION] [--count N]
  Prints events as they are published, one line each (--json: one JSON object per line), until Ctrl-C.
  --type      exactly this type, or a prefix ending in .* (metal.node.*)
  --subject   exactly this subject (metal/nodes/m-1)
  --after     start after this position (an event's position from events list); without it, only new events
  --count     exit after this many events`;

interface WatchFlags {
  json: boolean;
  help: boolean;
  url?: string;
  apiKey?: string;
}

interface Event {
  id: string;
  /** Its place in commit order: what Last-Event-ID and --after name. */
  position: string;
  type: string;
  subject: string | null;
  actor: string | null;
  occurredAt: string;
  data: Record<string, unknown>;
}

const RETRIED = new Set(["UNAVAILABLE", "INTERNAL"]);
/** How long to wait before reconnecting after the connection failed (a stream that ended reconnects at once). */
const RETRY_MS = 1000;

export async function eventsWatch(flags: WatchFlags, words: string[], tail: string[]): Promise<number> {
  if (flags.help) {
    console.log(EVENTS_WATCH_HELP);
    return 0;
  }
  const known = ["type", "subject", "after", "count"];
  const split = splitArgs(tail, () => true);
  const unknown = split.flags.find((f) => !known.includes(f.name));
  if (words.length || split.words.length || unknown)
    throw new UsageError(`usage: ${EVENTS_WATCH_HELP.split("\n")[0]}${unknown ? ` (unknown flag --${unknown.name})` : ""}`);
  const flag = (name: string) => {
    const found = split.flags.find((f) => f.name === name);
    if (found && !found.value) throw new UsageError(`--${name} needs a value`);
    return found?.value;
  };
  const count = flag("count") === undefined ? Infinity : Number(flag("count"));
  if (!((count >= 1 && Number.isInteger(count)) || count === Infinity)) throw new UsageError("--count takes a whole number of at least 1");

  const connection = resolveConnection(flags);
  const query = new URLSearchParams();
  for (const name of ["type", "subject"]) if (flag(name)) query.set(name, flag(name)!);
  let lastPosition = flag("after");

  const controller = new AbortController();
  const stop = () => controller.abort();
  process.once("SIGINT", stop);
  try {
    let printed = 0;
    while (!controller.signal.aborted) {
      try {
        for await (const event of stream(connection, query, lastPosition, controller.signal)) {
          lastPosition = event.position;
          console.log(flags.json ? JSON.stringify(event) : line(event));
          if (++printed >= count) return 0;
        }
      } catch (err) {
        if (controller.signal.aborted) break;
        // A refusal (key, permission, query) does not get better by retrying; a server's failure may.
        if (err instanceof ApiError && !RETRIED.has(err.code)) throw err;
        console.error(`${err instanceof Error ? err.message : String(err)}; reconnecting`);
        await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
      }
    }
    return 130;
  } finally {
    process.off("SIGINT", stop);
  }
}

const line = (e: Event) => `${e.position}  ${e.occurredAt}  ${e.type}  ${e.subject ?? "-"}  ${e.actor ?? "-"}  ${compact(e.data)}`;

/** One connection's events, in order; ends when the server ends the stream. */
async function* stream(connection: Connection, query: URLSearchParams, lastPosition: string | undefined, signal: AbortSignal) {
  const headers: Record<string, string> = { authorization: `Bearer ${connection.apiKey}`, accept: "text/event-stream" };
  if (lastPosition) headers["last-event-id"] = lastPosition;
  const url = `${connection.url}/v1/events.watch${query.size ? `?${query}` : ""}`;
  let res: Response;
  try {
    res = await fetch(url, { headers, signal });
  } catch (err) {
    if (signal.aborted) return;
    throw new ApiError("UNAVAILABLE", `cannot reach ${connection.url} (the connection failed; from ${connection.source})`);
  }
  if (!res.ok) throw await refusal(res);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        const message = parseMessage(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (message.event === "error") throw streamError(message.data);
        if (message.data !== undefined) yield JSON.parse(message.data) as Event;
      }
    }
  } catch (err) {
    if (signal.aborted) return;
    if (err instanceof ApiError) throw err;
    throw new ApiError("UNAVAILABLE", `the event stream from ${connection.url} broke off`);
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** The fields of one SSE message (comments, the heartbeats, are dropped). */
function parseMessage(block: string): { event?: string; data?: string } {
  const message: { event?: string; data?: string } = {};
  for (const text of block.split("\n")) {
    if (text.startsWith(":")) continue;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    const value = colon < 0 ? "" : text.slice(colon + 1).replace(/^ /, "");
    if (field === "data") message.data = message.data === undefined ? value : `${message.data}\n${value}`;
    else if (field === "event") message.event = value;
  }
  return message;
}

/** The server's last message when the stream failed after it opened: the API's error envelope. */
function streamError(data: string | undefined): ApiError {
  try {
    const body = JSON.parse(data ?? "") as { code: string; message: string; requestId?: string };
    return new ApiError(body.code, body.message, body.requestId);
  } catch {
    return new ApiError("INTERNAL", "the event stream failed");
  }
}

async function refusal(res: Response): Promise<ApiError> {
  const body = (await res.json().catch(() => ({}))) as { code?: string; message?: string; requestId?: string };
  return new ApiError(
    body.code ?? `HTTP_${res.status}`,
    body.message ?? res.statusText,
    body.requestId ?? res.headers.get("x-request-id") ?? undefined,
  );
}
