// The contract between the agent and what it runs, and all a role (agent/roles/*.ts) imports:
// command handlers and their context, lanes, the agent's error and logger, and the transport a
// platform provides (fetch + sockets). A role never loads AgentClient (agent/client.ts).
//
// Platform-free: no Node built-ins, so roles and transports for workerd can use it too.
import type { SocketLike } from "./socket.ts";

export type FetchLike = (url: string, init: RequestInit) => Promise<Response>;

export interface AgentTransport {
  /** HTTPS to the join endpoints. */
  fetch: FetchLike;
  /**
   * Open a WebSocket to url (ws: or wss:) with these request headers; resolves once it is
   * open. A refused upgrade rejects with an AgentError carrying the HTTP status and the
   * server's {code, message} (see errorFromResponse).
   */
  openSocket(url: string, headers: Record<string, string>): Promise<SocketLike>;
}

/** A failure with a code: the server's {code, message}, or one of the agent's own. */
export class AgentError extends Error {
  /** Running the command again cannot succeed (sent with its result: the workflow does not retry it). */
  readonly permanent: boolean;
  constructor(
    readonly code: string,
    message: string,
    readonly status?: number,
    options: { permanent?: boolean } = {},
  ) {
    super(message);
    this.name = "AgentError";
    this.permanent = options.permanent === true;
  }
}

/** The server's JSON error body {code, message} as an AgentError; never the raw body. */
export async function errorFromResponse(res: Response, what: string): Promise<AgentError> {
  let code = `HTTP_${res.status}`;
  let message = `${what} was refused with HTTP ${res.status}`;
  try {
    const body = (await res.json()) as { code?: unknown; message?: unknown; error?: { code?: unknown; message?: unknown } };
    const e = body && typeof body.code === "string" ? body : body?.error;
    if (e && typeof e.code === "string") code = e.code;
    if (e && typeof e.message === "string") message = e.message;
  } catch {
    // not JSON: keep the status
  }
  return new AgentError(code, message, res.status);
}

/** e as an AgentError: itself, or its message under `code`. */
export function asAgentError(e: unknown, code: string): AgentError {
  if (e instanceof AgentError) return e;
  return new AgentError(code, e instanceof Error ? e.message : String(e));
}

export interface AgentLogger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
  debug?(message: string, fields?: Record<string, unknown>): void;
}

export interface CommandContext {
  id: string;
  key: string;
  kind: string;
  seq: number;
  attested: boolean;
  deadline: string | null;
  /** Aborted at the deadline (reason: DEADLINE_EXCEEDED) or when the agent stops (INTERRUPTED). */
  signal: AbortSignal;
  /** Values of the command's secret references (secret://id → value): use them, never return or log them. */
  secrets: Readonly<Record<string, string>>;
}

/** Runs one command kind. The resolved value is the result's output; a throw is a failed result. */
export interface CommandHandler {
  (body: Record<string, unknown>, ctx: CommandContext): unknown;
  /**
   * The lane a command runs in: commands of one lane run one at a time in seq order, lanes run
   * side by side (a site agent's lane is the BMC, so one slow BMC holds up only its machine).
   * Without it, the agent's one default lane.
   */
  lane?: (body: Record<string, unknown>) => string | undefined;
}

/** The handler, running in the lane `laneOf` names for each command body. */
export function inLane(laneOf: (body: Record<string, unknown>) => string | undefined, handler: CommandHandler): CommandHandler {
  return Object.assign((body: Record<string, unknown>, ctx: CommandContext) => handler(body, ctx), { lane: laneOf });
}
