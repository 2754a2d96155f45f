// AgentClient: the agent's side of core/protocol.ts. Joins (HTTPS), keeps one WebSocket to its
// NodeDO (dial-out, reconnecting with backoff), proves possession of its key in the hello,
// runs commands in order (per lane) and at most once per idempotency key, signs every result, renews
// its credential before it expires.
//
// Platform-free: no Node built-ins and no socket library. The transport (fetch + sockets) and
// the state store are injected, so the same code is the real agent `bcd` in Node and the
// FakeDaemon inside workerd.
import { z } from "zod";
import { unbase64url, utf8 } from "../core/encoding.ts";
import { redact } from "../core/log.ts";
import {
  CONNECT_PATH,
  CloseCode,
  FrameError,
  JOIN_PATH,
  MAX_FRAME_BYTES,
  PING,
  PONG,
  PROTOCOL_VERSION,
  RENEW_PATH,
  generateNodeKey,
  helloFrame,
  helloMessage,
  importNodeKey,
  joinMessage,
  joinResponse,
  renewMessage,
  resultMessage,
  serverFrame,
  signMessage,
  type AgentFrame,
  type CommandFrame,
  type HelloFrame,
  type JoinRequest,
  type NodeKeyPair,
  type ResultFrame,
} from "../core/protocol.ts";
import type { SocketLike } from "./socket.ts";
import type { AgentIdentity, AgentStateStore, Role } from "./state.ts";

export type { SocketHandlers, SocketLike } from "./socket.ts";
export type { AgentIdentity, AgentStateStore, JournalRecord, JournalStart, Role } from "./state.ts";

export const AGENT_VERSION = "0.1.0";

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

export interface AgentLogger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
  debug?(message: string, fields?: Record<string, unknown>): void;
}

const silentLogger: AgentLogger = { info() {}, warn() {}, error() {} };

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

export interface BackoffOptions {
  /** First reconnect delay bound (ms); doubles per failed attempt. Default 250. */
  initialMs?: number;
  /** Cap of the delay bound (ms). Default 30 000. */
  maxMs?: number;
  /** A session that stayed welcomed this long resets the backoff. Default 10 000. */
  healthyAfterMs?: number;
}

export interface AgentClientOptions {
  transport: AgentTransport;
  state: AgentStateStore;
  /** The control plane (http: or https:); join() records it in the identity for run(). */
  baseUrl?: string;
  handlers?: Record<string, CommandHandler>;
  labels?: Record<string, string>;
  drivers?: { id: string; version: string }[];
  version?: string;
  /** This agent boot (process start); default a random UUID. Sent and signed in every hello. */
  bootId?: string;
  logger?: AgentLogger;
  /** Send PING this often once welcomed (ms). Default 30 000. */
  heartbeatMs?: number;
  /** A welcomed socket with no traffic (not even PONG) for this long is dropped (ms). Default 2.5 × heartbeatMs. */
  deadAfterMs?: number;
  /** A socket not welcomed within this is dropped (ms). Default 15 000. */
  handshakeTimeoutMs?: number;
  backoff?: BackoffOptions;
  /** Renew when this fraction of the credential's lifetime has passed. Default 2/3. */
  renewAt?: number;
  /** stop() waits this long for a running handler after aborting its signal (ms). Default 5 000. */
  stopGraceMs?: number;
  /** Commands running at once, each in its own lane (see CommandHandler.lane). Default 32. */
  maxConcurrentCommands?: number;
  /** For tests: the jitter source (default Math.random) and the clock. */
  random?: () => number;
  now?: () => number;
}

export interface AgentEvents {
  connected: { nodeId: string; sessionId: string };
  disconnected: { code: number; reason: string; welcomed: boolean };
  "connect-failed": { error: AgentError };
  reconnecting: { attempt: number; delayMs: number };
  command: CommandFrame;
  /** A handler is about to run (first and only time for its key). */
  executing: { id: string; key: string; kind: string };
  /** A result was produced or answered from the journal (sent now, or on the next welcome). */
  result: ResultFrame;
  "result-ack": { id: string };
  "server-error": { code: string; message: string; ref?: string };
  renewed: { expiresAt: string };
  /** The client stopped for good: REVOKED, CREDENTIAL_EXPIRED. run() rejects with the same error. */
  fatal: AgentError;
}

export interface AgentCounters {
  connects: number;
  connectFailures: number;
  disconnects: number;
  commandsReceived: number;
  executed: number;
  replayed: number;
  interrupted: number;
  resultsSent: number;
  resultsResent: number;
  resultAcks: number;
  serverErrors: number;
  pingsSent: number;
  renewals: number;
}

type Outcome = { ok: true; output?: unknown } | { ok: false; error: { code: string; message: string; permanent?: boolean } };

interface Session {
  sock: SocketLike;
  welcomed: boolean;
  helloSent: boolean;
  sessionId?: string;
  openedAt: number;
  welcomedAt: number;
  lastSeen: number;
  heartbeat?: ReturnType<typeof setInterval>;
  handshake?: ReturnType<typeof setTimeout>;
  retryTimers: Set<ReturnType<typeof setTimeout>>;
  ended: Promise<void>;
}

interface InFlight {
  id: string;
  controller: AbortController;
  done: Promise<ResultFrame>;
}

/** What a renewal answers: the new credential (the join response's shape is accepted too). */
const renewResponse = z.object({ credential: z.string(), expiresAt: z.string(), nodeId: z.string().optional() });

const MAX_ERROR_CODE = 64;
const MAX_ERROR_MESSAGE = 4096;
const MAX_TIMER_MS = 2 ** 31 - 1;

export const trimBase = (baseUrl: string) => baseUrl.replace(/\/+$/, "");
/** The connect URL: http(s) base → ws(s). */
export function connectUrl(baseUrl: string): string {
  const base = trimBase(baseUrl);
  if (/^wss?:\/\//i.test(base)) return base + CONNECT_PATH;
  if (!/^https?:\/\//i.test(base)) throw new AgentError("INVALID_ARGUMENT", `the control plane URL must be http(s): ${base}`);
  return base.replace(/^http/i, "ws") + CONNECT_PATH;
}

export class AgentClient {
  readonly bootId: string;
  readonly version: string;
  readonly counters: AgentCounters = {
    connects: 0,
    connectFailures: 0,
    disconnects: 0,
    commandsReceived: 0,
    executed: 0,
    replayed: 0,
    interrupted: 0,
    resultsSent: 0,
    resultsResent: 0,
    resultAcks: 0,
    serverErrors: 0,
    pingsSent: 0,
    renewals: 0,
  };

  readonly #opts: AgentClientOptions;
  readonly #transport: AgentTransport;
  readonly #state: AgentStateStore;
  readonly #log: AgentLogger;
  readonly #handlers = new Map<string, CommandHandler>();
  readonly #listeners = new Map<keyof AgentEvents, Set<(payload: never) => void>>();
  readonly #now: () => number;
  readonly #random: () => number;

  #key: NodeKeyPair | undefined;
  #identity: AgentIdentity | undefined;
  #runPromise: Promise<void> | undefined;
  #stopping = false;
  #fatal: AgentError | undefined;
  #session: Session | undefined;
  #wake: (() => void) | undefined;
  #renewTimer: ReturnType<typeof setTimeout> | undefined;
  /** Commands received and not started yet, in seq order, with the session that delivered them. */
  #queue: { frame: CommandFrame; session: Session; lane: string }[] = [];
  /** The command running in each busy lane. */
  #lanes = new Map<string, Promise<void>>();
  #inflight = new Map<string, InFlight>();
  /** Results not yet result-acked, by command id, in the order produced. */
  #unacked = new Map<string, ResultFrame>();
  /** Resend attempts of results the control plane answered UNAVAILABLE, by command id. */
  #retries = new Map<string, number>();
  /** Results whose `done` record could not be written: still answered within this process. */
  #unjournaled = new Map<string, ResultFrame>();

  constructor(opts: AgentClientOptions) {
    this.#opts = opts;
    this.#transport = opts.transport;
    this.#state = opts.state;
    this.#log = redactingLogger(opts.logger ?? silentLogger);
    this.#now = opts.now ?? Date.now;
    this.#random = opts.random ?? Math.random;
    this.bootId = opts.bootId ?? crypto.randomUUID();
    this.version = opts.version ?? AGENT_VERSION;
    for (const [kind, handler] of Object.entries(opts.handlers ?? {})) this.#handlers.set(kind, handler);
  }

  // ------------------------------------------------------------ public surface

  /** Register (or replace) the handler of a command kind. */
  handle(kind: string, handler: CommandHandler): this {
    this.#handlers.set(kind, handler);
    return this;
  }

  /** Subscribe to an event; returns the unsubscribe function. */
  on<E extends keyof AgentEvents>(event: E, listener: (payload: AgentEvents[E]) => void): () => void {
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    set.add(listener as (payload: never) => void);
    return () => set.delete(listener as (payload: never) => void);
  }

  get identity(): AgentIdentity | undefined {
    return this.#identity;
  }

  get connected(): boolean {
    return this.#session?.welcomed ?? false;
  }

  get running(): boolean {
    return this.#runPromise !== undefined;
  }

  /** The error that stopped the client for good, if any. */
  get fatalError(): AgentError | undefined {
    return this.#fatal;
  }

  /** The node's public key (raw, base64url), creating and saving the key pair if there is none. */
  async publicKey(): Promise<string> {
    return (await this.#loadOrCreateKey()).publicKey;
  }

  /**
   * Join the control plane: POST JOIN_PATH with a proof of possession of the node key, and
   * save the identity it answers. The evidence (a join token...) is sent once and never stored
   * or logged. A refusal throws an AgentError with the server's code and message.
   */
  async join(opts: { baseUrl?: string; attestor: string; evidence: Record<string, unknown>; role: Role; hostname?: string }): Promise<AgentIdentity> {
    const baseUrl = opts.baseUrl ?? this.#opts.baseUrl;
    if (!baseUrl) throw new AgentError("INVALID_ARGUMENT", "join needs the control plane URL");
    const key = await this.#loadOrCreateKey();
    const request: JoinRequest = {
      attestor: opts.attestor,
      evidence: opts.evidence,
      publicKey: key.publicKey,
      role: opts.role,
      ...(opts.hostname !== undefined ? { hostname: opts.hostname } : {}),
      signature: await signMessage(key.privateKey, joinMessage(key.publicKey, opts.attestor)),
    };
    const res = await this.#post(trimBase(baseUrl) + JOIN_PATH, request, "join");
    if (!res.ok) throw await errorFromResponse(res, "join");
    const parsed = joinResponse.safeParse(await res.json().catch(() => undefined));
    if (!parsed.success) throw new AgentError("BAD_RESPONSE", "the join response is not a join response");
    if (parsed.data.role !== opts.role) throw new AgentError("BAD_RESPONSE", `joined as ${parsed.data.role}, asked for ${opts.role}`);
    const identity: AgentIdentity = { ...parsed.data, obtainedAt: new Date(this.#now()).toISOString(), baseUrl: trimBase(baseUrl) };
    await this.#state.saveIdentity(identity);
    this.#identity = identity;
    this.#log.info("joined", { nodeId: identity.nodeId, role: identity.role, expiresAt: identity.expiresAt, attestor: opts.attestor });
    return identity;
  }

  /**
   * Renew the credential now: POST RENEW_PATH with the current credential as bearer and a
   * signed timestamp; saves the new credential. run() calls this at 2/3 of the lifetime.
   */
  async renew(): Promise<AgentIdentity> {
    const identity = this.#identity ?? (await this.#state.loadIdentity());
    if (!identity) throw new AgentError("NOT_JOINED", "the agent has not joined");
    const key = await this.#requireKey();
    const baseUrl = this.#baseUrl(identity);
    const timestamp = new Date(this.#now()).toISOString();
    const body = { timestamp, signature: await signMessage(key.privateKey, renewMessage(identity.nodeId, timestamp)) };
    const res = await this.#post(baseUrl + RENEW_PATH, body, "renew", identity.credential);
    if (!res.ok) throw await errorFromResponse(res, "renew");
    const parsed = renewResponse.safeParse(await res.json().catch(() => undefined));
    if (!parsed.success) throw new AgentError("BAD_RESPONSE", "the renew response has no credential");
    if (parsed.data.nodeId !== undefined && parsed.data.nodeId !== identity.nodeId) throw new AgentError("BAD_RESPONSE", "the renewed credential is for another node");
    const renewed: AgentIdentity = { ...identity, credential: parsed.data.credential, expiresAt: parsed.data.expiresAt, obtainedAt: new Date(this.#now()).toISOString() };
    await this.#state.saveIdentity(renewed);
    this.#identity = renewed;
    this.counters.renewals++;
    this.#log.info("credential renewed", { nodeId: renewed.nodeId, expiresAt: renewed.expiresAt });
    this.#emit("renewed", { expiresAt: renewed.expiresAt });
    return renewed;
  }

  /**
   * Connect and serve until stop() (resolves) or a fatal close (rejects with REVOKED or
   * CREDENTIAL_EXPIRED). Reconnects on its own. Calling it while running returns the same promise.
   */
  run(): Promise<void> {
    this.#runPromise ??= this.#run().finally(() => {
      this.#runPromise = undefined;
    });
    return this.#runPromise;
  }

  /**
   * Stop serving: abort the running handler's signal (reason INTERRUPTED) and give it
   * stopGraceMs to finish and report, then close the socket with 1000. A handler that outlives
   * the grace stays `started` in the journal and is reported INTERRUPTED after the restart.
   */
  async stop(opts: { graceMs?: number } = {}): Promise<void> {
    const run = this.#runPromise;
    this.#stopping = true;
    this.#queue = [];
    this.#wake?.();
    clearTimeout(this.#renewTimer);
    for (const f of this.#inflight.values()) f.controller.abort(new AgentError("INTERRUPTED", "the agent is stopping"));
    const grace = opts.graceMs ?? this.#opts.stopGraceMs ?? 5_000;
    if (this.#lanes.size) await withTimeout(Promise.all(this.#lanes.values()), grace);
    const s = this.#session;
    if (s) {
      s.sock.close(1000, "agent stopping");
      if (!(await withTimeout(s.ended, 2_000))) s.sock.terminate();
    }
    await run?.catch(() => {});
  }

  /** Drop the current socket without a close handshake (a network cut); run() reconnects. */
  dropConnection(): void {
    this.#session?.sock.terminate();
  }

  /** Resolves when a session is welcomed (now, if one is); rejects if the client stops first. */
  waitConnected(timeoutMs = 30_000): Promise<{ nodeId: string; sessionId: string }> {
    const s = this.#session;
    if (s?.welcomed && this.#identity) return Promise.resolve({ nodeId: this.#identity.nodeId, sessionId: s.sessionId ?? "" });
    return new Promise((resolve, reject) => {
      const offs: (() => void)[] = [];
      const done = () => {
        clearTimeout(timer);
        offs.forEach((off) => off());
      };
      const timer = setTimeout(() => {
        done();
        reject(new AgentError("DEADLINE_EXCEEDED", `not connected within ${timeoutMs} ms`));
      }, timeoutMs);
      offs.push(this.on("connected", (c) => (done(), resolve(c))));
      offs.push(this.on("fatal", (e) => (done(), reject(e))));
      void this.#runPromise?.then(
        () => (done(), reject(new AgentError("STOPPED", "the agent stopped before it connected"))),
        (e: unknown) => (done(), reject(e)),
      );
    });
  }

  // ------------------------------------------------------------ the connection loop

  async #run(): Promise<void> {
    this.#stopping = false;
    this.#fatal = undefined;
    const identity = await this.#state.loadIdentity();
    if (!identity) throw new AgentError("NOT_JOINED", "the agent has not joined: no identity in its state");
    this.#identity = identity;
    await this.#requireKey();
    this.#scheduleRenew();
    let attempt = 0;
    try {
      while (!this.#stopping) {
        const healthy = await this.#connectOnce();
        if (this.#stopping) break;
        if (healthy) attempt = 0;
        const backoff = this.#opts.backoff ?? {};
        const bound = Math.min(backoff.maxMs ?? 30_000, (backoff.initialMs ?? 250) * 2 ** Math.min(attempt, 30));
        const delayMs = Math.floor(this.#random() * bound);
        attempt++;
        this.#emit("reconnecting", { attempt, delayMs });
        this.#log.info("reconnecting", { attempt, delayMs });
        await this.#sleep(delayMs);
      }
    } finally {
      clearTimeout(this.#renewTimer);
      this.#stopping = true;
    }
    if (this.#fatal) throw this.#fatal;
  }

  /** One connection, from upgrade to close. Resolves true if it was a healthy session. */
  async #connectOnce(): Promise<boolean> {
    const identity = this.#identity!;
    let sock: SocketLike;
    try {
      sock = await this.#transport.openSocket(connectUrl(this.#baseUrl(identity)), { Authorization: `Bearer ${identity.credential}` });
    } catch (e) {
      const error = asAgentError(e, "UNAVAILABLE");
      this.counters.connectFailures++;
      this.#log.warn("connect failed", { code: error.code, status: error.status, message: error.message });
      this.#emit("connect-failed", { error });
      if (isRevocation(error)) this.#fail(new AgentError("REVOKED", `the control plane revoked this node: ${error.message}`, error.status));
      else if (error.status === 401 && this.#now() >= localExpiry(identity, this.#now()).expires)
        this.#fail(new AgentError("CREDENTIAL_EXPIRED", "the node's credential expired before it was renewed; join again", 401));
      return false;
    }
    if (this.#stopping) {
      sock.close(1000, "agent stopping");
      return false;
    }
    let ended!: () => void;
    const now = this.#now();
    const s: Session = { sock, welcomed: false, helloSent: false, openedAt: now, welcomedAt: 0, lastSeen: now, retryTimers: new Set(), ended: new Promise((r) => (ended = r)) };
    this.#session = s;
    let healthy = false;
    await new Promise<void>((resolve) => {
      s.handshake = setTimeout(() => {
        this.#log.warn("no welcome in time; dropping the socket", { handshakeTimeoutMs: this.#handshakeTimeout() });
        sock.terminate();
      }, this.#handshakeTimeout());
      sock.listen({
        message: (text) => this.#onText(s, text),
        close: (code, reason) => {
          clearTimeout(s.handshake);
          clearInterval(s.heartbeat);
          s.retryTimers.forEach(clearTimeout);
          if (this.#session === s) this.#session = undefined;
          // Commands not started are dropped: the NodeDO redelivers what has no result.
          this.#queue = this.#queue.filter((q) => q.session !== s);
          healthy = s.welcomed && this.#now() - s.welcomedAt >= (this.#opts.backoff?.healthyAfterMs ?? 10_000);
          this.counters.disconnects++;
          this.#log.info("disconnected", { code, reason, welcomed: s.welcomed });
          this.#emit("disconnected", { code, reason, welcomed: s.welcomed });
          if (code === CloseCode.REVOKED) this.#fail(new AgentError("REVOKED", `the control plane revoked this node${reason ? `: ${reason}` : ""}`));
          else if (code === CloseCode.REPLACED) this.#log.warn("another connection of this node replaced this one", {});
          ended();
          resolve();
        },
      });
    });
    return healthy;
  }

  #onText(s: Session, text: string): void {
    if (this.#session !== s) return;
    s.lastSeen = this.#now();
    if (text === PONG) return;
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch {
      this.#log.warn("ignoring a frame that is not JSON", { bytes: text.length });
      return;
    }
    const parsed = serverFrame.safeParse(raw);
    if (!parsed.success) {
      this.#log.warn("ignoring an unknown frame", { t: (raw as { t?: unknown } | null)?.t });
      return;
    }
    const frame = parsed.data;
    switch (frame.t) {
      case "challenge":
        if (s.helloSent) return this.#log.warn("ignoring a second challenge", {});
        s.helloSent = true;
        void this.#sendHello(s, frame.nonce);
        return;
      case "welcome":
        return this.#onWelcome(s, frame.nodeId, frame.sessionId);
      case "command":
        if (!s.welcomed) return this.#log.warn("ignoring a command before welcome", { id: frame.id });
        this.counters.commandsReceived++;
        this.#emit("command", frame);
        return this.#onCommand(s, frame);
      case "result-ack":
        this.#unacked.delete(frame.id);
        this.#retries.delete(frame.id);
        this.counters.resultAcks++;
        this.#emit("result-ack", { id: frame.id });
        return;
      case "error":
        this.counters.serverErrors++;
        this.#log.warn("the control plane refused a frame", { code: frame.code, message: frame.message, ref: frame.ref });
        this.#emit("server-error", { code: frame.code, message: frame.message, ...(frame.ref !== undefined ? { ref: frame.ref } : {}) });
        // The control plane could not take a result just now: offer it again after a backoff.
        if (frame.code === FrameError.UNAVAILABLE && frame.ref !== undefined && this.#unacked.has(frame.ref)) this.#retryResult(s, frame.ref);
        return;
    }
  }

  #retryResult(s: Session, id: string): void {
    const attempt = (this.#retries.get(id) ?? 0) + 1;
    this.#retries.set(id, attempt);
    const bound = Math.min(this.#opts.backoff?.maxMs ?? 30_000, (this.#opts.backoff?.initialMs ?? 250) * 2 ** Math.min(attempt, 30));
    const timer = setTimeout(() => {
      s.retryTimers.delete(timer);
      const result = this.#unacked.get(id);
      if (result && this.#session === s && this.#send(s, result)) this.counters.resultsResent++;
    }, Math.floor(this.#random() * bound));
    s.retryTimers.add(timer);
  }

  async #sendHello(s: Session, nonce: string): Promise<void> {
    const identity = this.#identity!;
    const key = await this.#requireKey();
    const hello: HelloFrame = {
      t: "hello",
      protocol: PROTOCOL_VERSION,
      nonce,
      signature: await signMessage(key.privateKey, helloMessage(identity.nodeId, nonce, this.bootId)),
      role: identity.role,
      version: this.version,
      bootId: this.bootId,
      labels: this.#opts.labels ?? {},
      drivers: this.#opts.drivers ?? [],
    };
    // Labels, drivers or version outside the protocol's bounds would be refused on every
    // connect (MALFORMED_FRAME): a configuration error, not something to retry.
    const valid = helloFrame.safeParse(hello);
    if (!valid.success) {
      const issue = valid.error.issues[0];
      return this.#fail(new AgentError("INVALID_CONFIG", `the hello is not valid: ${issue?.path.join(".") || "frame"}: ${issue?.message ?? "invalid"}`));
    }
    this.#send(s, hello);
  }

  #onWelcome(s: Session, nodeId: string, sessionId: string): void {
    if (s.welcomed) return;
    const identity = this.#identity!;
    if (nodeId !== identity.nodeId) this.#log.warn("welcomed as another node", { expected: identity.nodeId, nodeId });
    s.welcomed = true;
    s.sessionId = sessionId;
    s.welcomedAt = this.#now();
    clearTimeout(s.handshake);
    const heartbeatMs = this.#opts.heartbeatMs ?? 30_000;
    const deadAfterMs = this.#opts.deadAfterMs ?? heartbeatMs * 2.5;
    s.heartbeat = setInterval(() => {
      if (this.#now() - s.lastSeen > deadAfterMs) {
        this.#log.warn("no traffic from the control plane; dropping the socket", { deadAfterMs });
        s.sock.terminate();
        return;
      }
      if (this.#sendText(s, PING)) this.counters.pingsSent++;
    }, heartbeatMs);
    this.counters.connects++;
    this.#log.info("connected", { nodeId, sessionId });
    this.#emit("connected", { nodeId, sessionId });
    // Results the control plane has not acknowledged go again, before anything new.
    for (const result of this.#unacked.values()) if (this.#send(s, result)) this.counters.resultsResent++;
  }

  // ------------------------------------------------------------ commands

  #onCommand(s: Session, frame: CommandFrame): void {
    const running = this.#inflight.get(frame.key);
    if (running) {
      // A redelivery of what this process is running: acknowledge, answer when it finishes.
      this.#send(s, { t: "ack", id: frame.id });
      if (running.id !== frame.id) void running.done.then(async (r) => this.#deliver(await this.#reissue(r, frame.id)));
      return;
    }
    if (this.#queue.some((q) => q.session === s && q.frame.id === frame.id)) return; // already waiting its turn
    this.#queue.push({ frame, session: s, lane: this.#laneOf(frame) });
    this.#startReady();
  }

  #laneOf(frame: CommandFrame): string {
    try {
      return this.#handlers.get(frame.kind)?.lane?.(frame.body) ?? "";
    } catch {
      return ""; // a body the lane cannot read fails in its handler, in the default lane
    }
  }

  /** Starts the first waiting command of every idle lane, up to the concurrency limit. */
  #startReady(): void {
    const limit = Math.max(1, this.#opts.maxConcurrentCommands ?? 32);
    for (let i = 0; i < this.#queue.length && this.#lanes.size < limit; ) {
      const item = this.#queue[i]!;
      if (item.session !== this.#session || this.#stopping) {
        this.#queue.splice(i, 1);
        continue;
      }
      if (this.#lanes.has(item.lane)) {
        i++;
        continue;
      }
      this.#queue.splice(i, 1);
      const run = this.#process(item.frame)
        .catch((e: unknown) => {
          this.#log.error("command processing failed", { id: item.frame.id, key: item.frame.key, kind: item.frame.kind, message: (e as Error).message });
        })
        .finally(() => {
          this.#lanes.delete(item.lane);
          this.#startReady();
        });
      this.#lanes.set(item.lane, run);
    }
  }

  async #process(frame: CommandFrame): Promise<void> {
    const { id, key, kind } = frame;
    const earlier = this.#unjournaled.get(key);
    const rec = earlier ? null : await this.#state.journal(key);
    if (earlier || rec?.state === "done") {
      const recorded = earlier ?? (rec as { result: ResultFrame }).result;
      this.counters.replayed++;
      this.#log.info("answering a redelivered command from the journal", { id, key, kind });
      this.#deliver(await this.#reissue(recorded, id));
      return;
    }
    if (rec?.state === "started") {
      this.counters.interrupted++;
      this.#log.warn("a command was interrupted by a restart; not running it again", { id, key, kind });
      await this.#finish(frame, { ok: false, error: { code: "INTERRUPTED", message: `the agent stopped while running ${kind} (key ${key}); it is not run again` } });
      return;
    }
    if (deadlineOf(frame) <= this.#now()) {
      await this.#finish(frame, { ok: false, error: { code: "DEADLINE_EXCEEDED", message: `the deadline ${frame.deadline} passed before the agent could start ${kind}` } });
      return;
    }

    // `ack` promises the command is journaled: a crash from here on reports it INTERRUPTED.
    await this.#state.journalStarted({ key, id, kind });
    const s = this.#session;
    if (s?.welcomed) this.#send(s, { t: "ack", id });
    const controller = new AbortController();
    let settle!: (r: ResultFrame) => void;
    const inflight: InFlight = { id, controller, done: new Promise((r) => (settle = r)) };
    this.#inflight.set(key, inflight);
    try {
      this.counters.executed++;
      this.#emit("executing", { id, key, kind });
      const outcome = await this.#runHandler(frame, controller);
      settle(await this.#finish(frame, outcome));
    } finally {
      this.#inflight.delete(key);
    }
  }

  async #runHandler(frame: CommandFrame, controller: AbortController): Promise<Outcome> {
    const handler = this.#handlers.get(frame.kind);
    if (!handler) return { ok: false, error: { code: "UNSUPPORTED", message: `this agent has no handler for ${frame.kind}` } };
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = deadlineOf(frame);
    if (deadline !== Infinity) {
      const ms = deadline - this.#now();
      timer = setTimeout(() => controller.abort(new AgentError("DEADLINE_EXCEEDED", `the deadline ${frame.deadline} passed`)), Math.min(Math.max(ms, 0), MAX_TIMER_MS));
    } else if (frame.deadline !== null) this.#log.warn("ignoring a deadline that is not a date", { id: frame.id, deadline: frame.deadline });
    const ctx: CommandContext = { id: frame.id, key: frame.key, kind: frame.kind, seq: frame.seq, attested: frame.attested, deadline: frame.deadline, signal: controller.signal, secrets: frame.secrets ?? {} };
    try {
      return { ok: true, output: await handler(frame.body, ctx) };
    } catch (e) {
      const reason: unknown = controller.signal.reason;
      const err = (controller.signal.aborted && reason instanceof AgentError && (e === reason || (e as Error)?.name === "AbortError") ? reason : e) as {
        code?: unknown;
        message?: unknown;
        permanent?: unknown;
      } | null;
      const code = err && err.code !== undefined && err.code !== null ? String(err.code) : "HANDLER_ERROR";
      const message = err && typeof err.message === "string" ? err.message : String(err);
      return { ok: false, error: { code, message, ...(err?.permanent === true ? { permanent: true } : {}) } };
    } finally {
      clearTimeout(timer);
    }
  }

  /** Build and sign the result, record it done, send it. */
  async #finish(frame: CommandFrame, outcome: Outcome): Promise<ResultFrame> {
    const result = await this.#buildResult(frame.id, frame.key, outcome);
    try {
      await this.#state.journalDone({ key: frame.key, id: frame.id, kind: frame.kind, result });
    } catch (e) {
      this.#unjournaled.set(frame.key, result);
      this.#log.error("could not record a result in the journal", { id: frame.id, key: frame.key, message: (e as Error).message });
    }
    this.#deliver(result);
    return result;
  }

  async #buildResult(id: string, key: string, outcome: Outcome): Promise<ResultFrame> {
    let body: Outcome = outcome;
    if (outcome.ok) {
      // Sign exactly what the control plane will parse: the output after a JSON round trip.
      try {
        const json = outcome.output === undefined ? undefined : JSON.stringify(outcome.output);
        body = json === undefined ? { ok: true } : { ok: true, output: JSON.parse(json) as unknown };
      } catch (e) {
        body = { ok: false, error: { code: "RESULT_NOT_JSON", message: `the handler's output cannot be sent as JSON: ${(e as Error).message}` } };
      }
    }
    const frame: ResultFrame = body.ok
      ? { t: "result", id, key, ok: true, ...(body.output !== undefined ? { output: body.output } : {}) }
      : { t: "result", id, key, ok: false, error: { code: body.error.code.slice(0, MAX_ERROR_CODE), message: body.error.message.slice(0, MAX_ERROR_MESSAGE), ...(body.error.permanent ? { permanent: true } : {}) } };
    frame.signature = await this.#sign(frame);
    const bytes = utf8(JSON.stringify(frame)).length;
    if (bytes > MAX_FRAME_BYTES) {
      return this.#buildResult(id, key, { ok: false, error: { code: "RESULT_TOO_LARGE", message: `the result frame would be ${bytes} bytes; the limit is ${MAX_FRAME_BYTES}` } });
    }
    return frame;
  }

  async #sign(frame: ResultFrame): Promise<string> {
    const key = await this.#requireKey();
    return signMessage(key.privateKey, await resultMessage(this.#identity!.nodeId, frame));
  }

  /** A recorded result answering another delivery id: same outcome, re-signed for the new id. */
  async #reissue(result: ResultFrame, id: string): Promise<ResultFrame> {
    if (result.id === id) return result;
    const frame: ResultFrame = { ...result, id };
    delete frame.signature;
    frame.signature = await this.#sign(frame);
    return frame;
  }

  /** Keep until result-ack; send now if a session is welcomed, else on the next welcome. */
  #deliver(result: ResultFrame): void {
    this.#unacked.delete(result.id);
    this.#unacked.set(result.id, result);
    this.#emit("result", result);
    const s = this.#session;
    if (s?.welcomed && this.#send(s, result)) this.counters.resultsSent++;
  }

  // ------------------------------------------------------------ plumbing

  #send(s: Session, frame: AgentFrame): boolean {
    const text = JSON.stringify(frame);
    if (utf8(text).length > MAX_FRAME_BYTES) {
      this.#log.error("not sending a frame over the size limit", { t: frame.t, bytes: utf8(text).length });
      return false;
    }
    return this.#sendText(s, text);
  }

  #sendText(s: Session, text: string): boolean {
    try {
      s.sock.send(text);
      return true;
    } catch (e) {
      this.#log.warn("send failed", { message: (e as Error).message });
      return false;
    }
  }

  #scheduleRenew(attempt = 0, retryMs?: number): void {
    clearTimeout(this.#renewTimer);
    const identity = this.#identity;
    if (!identity || this.#stopping) return;
    let delay = retryMs;
    if (delay === undefined) {
      const { from, expires } = localExpiry(identity, this.#now());
      delay = from + (expires - from) * (this.#opts.renewAt ?? 2 / 3) - this.#now();
    }
    this.#renewTimer = setTimeout(() => void this.#renewNow(attempt), Math.min(Math.max(delay, 0), MAX_TIMER_MS));
  }

  async #renewNow(attempt: number): Promise<void> {
    if (this.#stopping) return;
    try {
      await this.renew();
      this.#scheduleRenew();
    } catch (e) {
      const error = asAgentError(e, "UNAVAILABLE");
      if (this.#stopping) return;
      if (isRevocation(error)) return this.#fail(new AgentError("REVOKED", `the control plane revoked this node: ${error.message}`, error.status));
      const left = localExpiry(this.#identity!, this.#now()).expires - this.#now();
      if (left <= 0 && (error.status === 401 || error.status === 403)) {
        return this.#fail(new AgentError("CREDENTIAL_EXPIRED", `the node's credential expired and renewal was refused (${error.code}); join again`, error.status));
      }
      const bound = Math.min(this.#opts.backoff?.maxMs ?? 30_000, (this.#opts.backoff?.initialMs ?? 250) * 2 ** Math.min(attempt, 30));
      const retryMs = Math.max(1, Math.floor(this.#random() * bound));
      this.#log.warn("credential renewal failed; retrying", { code: error.code, status: error.status, message: error.message, retryMs });
      this.#scheduleRenew(attempt + 1, retryMs);
    }
  }

  #fail(error: AgentError): void {
    if (this.#fatal) return;
    this.#fatal = error;
    this.#stopping = true;
    this.#queue = [];
    clearTimeout(this.#renewTimer);
    for (const f of this.#inflight.values()) f.controller.abort(new AgentError("INTERRUPTED", "the agent is stopping"));
    this.#log.error("stopping for good", { code: error.code, message: error.message });
    this.#emit("fatal", error);
    this.#session?.sock.close(1000, "agent stopping");
    this.#wake?.();
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
    });
  }

  #handshakeTimeout(): number {
    return this.#opts.handshakeTimeoutMs ?? 15_000;
  }

  #baseUrl(identity: AgentIdentity): string {
    const base = this.#opts.baseUrl ?? identity.baseUrl;
    if (!base) throw new AgentError("INVALID_ARGUMENT", "no control plane URL: pass baseUrl or join first");
    return trimBase(base);
  }

  async #post(url: string, body: unknown, what: string, bearer?: string): Promise<Response> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (bearer) headers.authorization = `Bearer ${bearer}`;
    try {
      return await this.#transport.fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
    } catch (e) {
      throw new AgentError("UNAVAILABLE", `${what}: cannot reach ${originOf(url)}: ${(e as Error).message}`);
    }
  }

  async #loadOrCreateKey(): Promise<NodeKeyPair> {
    if (this.#key) return this.#key;
    const jwk = await this.#state.loadKey();
    if (jwk) return (this.#key = await importNodeKey(jwk));
    const { privateJwk, publicKey } = await generateNodeKey();
    await this.#state.saveKey(privateJwk);
    this.#log.info("generated the node key", { publicKey });
    // Re-imported non-extractable: the private half is never exported again.
    return (this.#key = await importNodeKey(privateJwk));
  }

  async #requireKey(): Promise<NodeKeyPair> {
    if (this.#key) return this.#key;
    const jwk = await this.#state.loadKey();
    if (!jwk) throw new AgentError("NOT_JOINED", "the agent has no key: join first");
    return (this.#key = await importNodeKey(jwk));
  }

  #emit<E extends keyof AgentEvents>(event: E, payload: AgentEvents[E]): void {
    for (const listener of this.#listeners.get(event) ?? []) {
      try {
        (listener as (p: AgentEvents[E]) => void)(payload);
      } catch (e) {
        this.#log.error("an event listener threw", { event, message: (e as Error).message });
      }
    }
  }
}

/** Wrap a logger so field values named like secrets are redacted (core/log.ts's rule). */
export function redactingLogger(inner: AgentLogger): AgentLogger {
  const f = (fields?: Record<string, unknown>) => (fields ? (redact(fields) as Record<string, unknown>) : fields);
  return {
    info: (m, x) => inner.info(m, f(x)),
    warn: (m, x) => inner.warn(m, f(x)),
    error: (m, x) => inner.error(m, f(x)),
    debug: (m, x) => inner.debug?.(m, f(x)),
  };
}

/** The command's deadline in ms since the epoch; Infinity when it has none (or an unreadable one). */
function deadlineOf(frame: CommandFrame): number {
  const ms = frame.deadline === null ? NaN : Date.parse(frame.deadline);
  return Number.isFinite(ms) ? ms : Infinity;
}

/**
 * Whether a refused upgrade or renewal means the node was revoked: the code REVOKED, or a 403
 * PERMISSION_DENIED (what the gateway and JoinService answer for a revoked node's credential).
 */
export function isRevocation(error: AgentError): boolean {
  return error.code === "REVOKED" || (error.status === 403 && error.code === "PERMISSION_DENIED");
}

/**
 * When the credential expires on this agent's clock: obtainedAt plus the credential's own
 * lifetime (the JWT's exp − iat, both control-plane time), so a skewed agent clock does not
 * move renewal past the expiry. Falls back to expiresAt when the credential is not a JWT.
 */
export function localExpiry(identity: AgentIdentity, now: number): { from: number; expires: number } {
  const from = identity.obtainedAt ? Date.parse(identity.obtainedAt) : now;
  let lifetime = Date.parse(identity.expiresAt) - from;
  try {
    const payload = identity.credential.split(".")[1];
    if (payload) {
      const claims = JSON.parse(new TextDecoder().decode(unbase64url(payload))) as { iat?: unknown; exp?: unknown };
      if (typeof claims.iat === "number" && typeof claims.exp === "number" && claims.exp > claims.iat) lifetime = (claims.exp - claims.iat) * 1000;
    }
  } catch {
    // not a JWT: expiresAt it is
  }
  return { from, expires: from + lifetime };
}

function asAgentError(e: unknown, code: string): AgentError {
  if (e instanceof AgentError) return e;
  return new AgentError(code, e instanceof Error ? e.message : String(e));
}

function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "the control plane";
  }
}

/** Resolves true if p settled within ms, false otherwise. */
async function withTimeout(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const settled = await Promise.race([p.then(() => true, () => true), new Promise<false>((r) => (timer = setTimeout(() => r(false), ms)))]);
  clearTimeout(timer);
  return settled;
}
