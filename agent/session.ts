// The reconnecting session: one WebSocket to the node's NodeDO at a time, dialled out and
// dialled again with backoff until the agent stops (kept apart from what the frames mean, as
// partysocket keeps ReconnectingWebSocket). It proves the node's key in the hello, keeps the
// welcomed socket alive with heartbeats, and hands every later frame to its owner; `send` goes
// out on the welcomed socket.
import {
  CONNECT_PATH,
  CloseCode,
  MAX_FRAME_BYTES,
  MAX_SPEC_FRAME_BYTES,
  PING,
  PONG,
  PROTOCOL_VERSION,
  helloFrame,
  helloMessage,
  serverFrame,
  type AgentFrame,
  type HelloFrame,
  type ServerFrame,
} from "../core/protocol.ts";
import { utf8 } from "../core/encoding.ts";
import { jitterBackoff, withTimeout, type BackoffOptions } from "./backoff.ts";
import { AgentError, asAgentError, type AgentTransport } from "./contracts.ts";
import { isRevocation, localExpiry, trimBase, type Credentials } from "./credentials.ts";
import type { Plumbing } from "./events.ts";
import type { SocketLike } from "./socket.ts";

export interface SessionOptions {
  labels?: Record<string, string>;
  /** The drivers this agent serves; a function is asked at every hello (bcd's plugins come and go). */
  drivers?: { id: string; version: string }[] | (() => { id: string; version: string }[]);
  /** What the machine has, reported in every hello (a node agent's; capacity reads it). */
  resources?: HelloFrame["resources"];
  /** Send PING this often once welcomed (ms). Default 30 000. */
  heartbeatMs?: number;
  /** A welcomed socket with no traffic (not even PONG) for this long is dropped (ms). Default 2.5 × heartbeatMs. */
  deadAfterMs?: number;
  /** A socket not welcomed within this is dropped (ms). Default 15 000. */
  handshakeTimeoutMs?: number;
  backoff?: BackoffOptions;
}

/** The frames a welcomed session hands on. */
export type SessionFrame = Extract<ServerFrame, { t: "command" | "result-ack" | "error" | "spec" }>;

interface SessionDeps extends Plumbing {
  transport: AgentTransport;
  credentials: Pick<Credentials, "identity" | "sign" | "baseUrl">;
  bootId: string;
  version: string;
  stopping: () => boolean;
  /** Stop the agent for good (REVOKED, CREDENTIAL_EXPIRED, a hello the protocol refuses). */
  fail: (error: AgentError) => void;
  /** A socket was welcomed. */
  welcomed: () => void;
  /** A frame after the welcome. */
  frame: (frame: SessionFrame) => void;
  /** The socket closed. */
  closed: () => void;
}

/** One socket, from upgrade to close. */
interface Connection {
  sock: SocketLike;
  welcomed: boolean;
  helloSent: boolean;
  sessionId?: string;
  openedAt: number;
  welcomedAt: number;
  lastSeen: number;
  heartbeat?: ReturnType<typeof setInterval>;
  handshake?: ReturnType<typeof setTimeout>;
  ended: Promise<void>;
}

/** The connect URL: http(s) base → ws(s). */
export function connectUrl(baseUrl: string): string {
  const base = trimBase(baseUrl);
  if (/^wss?:\/\//i.test(base)) return base + CONNECT_PATH;
  if (!/^https?:\/\//i.test(base)) throw new AgentError("INVALID_ARGUMENT", `the control plane URL must be http(s): ${base}`);
  return base.replace(/^http/i, "ws") + CONNECT_PATH;
}

export class Session {
  readonly #opts: SessionOptions;
  readonly #deps: SessionDeps;
  #current: Connection | undefined;
  #wake: (() => void) | undefined;

  constructor(opts: SessionOptions, deps: SessionDeps) {
    this.#opts = opts;
    this.#deps = deps;
  }

  /** Whether the current socket is welcomed. */
  get connected(): boolean {
    return this.#current?.welcomed ?? false;
  }

  get sessionId(): string | undefined {
    return this.#current?.sessionId;
  }

  /** Connect, and connect again after each close with backoff, until the agent stops. */
  async run(): Promise<void> {
    const { log, emit, random, stopping } = this.#deps;
    let attempt = 0;
    while (!stopping()) {
      const healthy = await this.#connectOnce();
      if (stopping()) break;
      if (healthy) attempt = 0;
      const delayMs = jitterBackoff(attempt, this.#opts.backoff, random);
      attempt++;
      emit("reconnecting", { attempt, delayMs });
      log.info("reconnecting", { attempt, delayMs });
      await this.#sleep(delayMs);
    }
  }

  /** Cut the wait before the next reconnect short (the loop then sees that the agent stops). */
  wake(): void {
    this.#wake?.();
  }

  /** Send on the welcomed socket; false if there is none or sending failed. */
  send(frame: AgentFrame): boolean {
    const c = this.#current;
    return c?.welcomed === true && this.#send(c, frame);
  }

  /** Drop the socket without a close handshake (a network cut); run() reconnects. */
  drop(): void {
    this.#current?.sock.terminate();
  }

  /** Close the socket with 1000; with graceMs, terminate it if it has not closed by then. */
  async close(graceMs?: number): Promise<void> {
    const c = this.#current;
    if (!c) return;
    c.sock.close(1000, "agent stopping");
    if (graceMs !== undefined && !(await withTimeout(c.ended, graceMs))) c.sock.terminate();
  }

  /** One connection, from upgrade to close. Resolves true if it was a healthy session. */
  async #connectOnce(): Promise<boolean> {
    const { transport, credentials, counters, log, emit, fail } = this.#deps;
    const identity = credentials.identity!;
    let sock: SocketLike;
    try {
      sock = await transport.openSocket(connectUrl(credentials.baseUrl(identity)), { Authorization: `Bearer ${identity.credential}` });
    } catch (e) {
      const error = asAgentError(e, "UNAVAILABLE");
      counters.connectFailures++;
      log.warn("connect failed", { code: error.code, status: error.status, message: error.message });
      emit("connect-failed", { error });
      if (isRevocation(error)) fail(new AgentError("REVOKED", `the control plane revoked this node: ${error.message}`, error.status));
      else if (error.status === 401 && this.#deps.now() >= localExpiry(identity, this.#deps.now()).expires)
        fail(new AgentError("CREDENTIAL_EXPIRED", "the node's credential expired before it was renewed; join again", 401));
      return false;
    }
    if (this.#deps.stopping()) {
      sock.close(1000, "agent stopping");
      return false;
    }
    let ended!: () => void;
    const openedAt = this.#deps.now();
    const c: Connection = {
      sock,
      welcomed: false,
      helloSent: false,
      openedAt,
      welcomedAt: 0,
      lastSeen: openedAt,
      ended: new Promise((r) => (ended = r)),
    };
    this.#current = c;
    let healthy = false;
    const handshakeTimeoutMs = this.#opts.handshakeTimeoutMs ?? 15_000;
    await new Promise<void>((resolve) => {
      c.handshake = setTimeout(() => {
        log.warn("no welcome in time; dropping the socket", { handshakeTimeoutMs });
        sock.terminate();
      }, handshakeTimeoutMs);
      sock.listen({
        message: (text) => this.#onText(c, text),
        close: (code, reason) => {
          clearTimeout(c.handshake);
          clearInterval(c.heartbeat);
          if (this.#current === c) this.#current = undefined;
          this.#deps.closed();
          healthy = c.welcomed && this.#deps.now() - c.welcomedAt >= (this.#opts.backoff?.healthyAfterMs ?? 10_000);
          counters.disconnects++;
          log.info("disconnected", { code, reason, welcomed: c.welcomed });
          emit("disconnected", { code, reason, welcomed: c.welcomed });
          if (code === CloseCode.REVOKED)
            fail(new AgentError("REVOKED", `the control plane revoked this node${reason ? `: ${reason}` : ""}`));
          else if (code === CloseCode.REPLACED) log.warn("another connection of this node replaced this one", {});
          ended();
          resolve();
        },
      });
    });
    return healthy;
  }

  #onText(c: Connection, text: string): void {
    const { log, counters, emit } = this.#deps;
    if (this.#current !== c) return;
    c.lastSeen = this.#deps.now();
    if (text === PONG) return;
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch {
      log.warn("ignoring a frame that is not JSON", { bytes: text.length });
      return;
    }
    const parsed = serverFrame.safeParse(raw);
    if (!parsed.success) {
      log.warn("ignoring an unknown frame", { t: (raw as { t?: unknown } | null)?.t });
      return;
    }
    const frame = parsed.data;
    switch (frame.t) {
      case "challenge":
        if (c.helloSent) return log.warn("ignoring a second challenge", {});
        c.helloSent = true;
        void this.#sendHello(c, frame.nonce);
        return;
      case "welcome":
        return this.#onWelcome(c, frame.nodeId, frame.sessionId);
      case "command":
        if (!c.welcomed) return log.warn("ignoring a command before welcome", { id: frame.id });
        return this.#deps.frame(frame);
      case "spec":
        if (!c.welcomed) return log.warn("ignoring a NodeSpec before welcome", { generation: frame.generation });
        return this.#deps.frame(frame);
      case "result-ack":
        return this.#deps.frame(frame);
      case "error":
        counters.serverErrors++;
        log.warn("the control plane refused a frame", { code: frame.code, message: frame.message, ref: frame.ref });
        emit("server-error", { code: frame.code, message: frame.message, ...(frame.ref !== undefined ? { ref: frame.ref } : {}) });
        return this.#deps.frame(frame);
    }
  }

  async #sendHello(c: Connection, nonce: string): Promise<void> {
    const { credentials, bootId, version } = this.#deps;
    const identity = credentials.identity!;
    const hello: HelloFrame = {
      t: "hello",
      protocol: PROTOCOL_VERSION,
      nonce,
      signature: await credentials.sign(helloMessage(identity.nodeId, nonce, bootId)),
      role: identity.role,
      version,
      bootId,
      labels: this.#opts.labels ?? {},
      drivers: typeof this.#opts.drivers === "function" ? this.#opts.drivers() : (this.#opts.drivers ?? []),
      ...(this.#opts.resources ? { resources: this.#opts.resources } : {}),
    };
    // Labels, drivers or version outside the protocol's bounds would be refused on every
    // connect (MALFORMED_FRAME): a configuration error, not something to retry.
    const valid = helloFrame.safeParse(hello);
    if (!valid.success) {
      const issue = valid.error.issues[0];
      return this.#deps.fail(
        new AgentError("INVALID_CONFIG", `the hello is not valid: ${issue?.path.join(".") || "frame"}: ${issue?.message ?? "invalid"}`),
      );
    }
    this.#send(c, hello);
  }

  #onWelcome(c: Connection, nodeId: string, sessionId: string): void {
    const { credentials, log, counters, emit } = this.#deps;
    if (c.welcomed) return;
    const identity = credentials.identity!;
    if (nodeId !== identity.nodeId) log.warn("welcomed as another node", { expected: identity.nodeId, nodeId });
    c.welcomed = true;
    c.sessionId = sessionId;
    c.welcomedAt = this.#deps.now();
    clearTimeout(c.handshake);
    const heartbeatMs = this.#opts.heartbeatMs ?? 30_000;
    const deadAfterMs = this.#opts.deadAfterMs ?? heartbeatMs * 2.5;
    c.heartbeat = setInterval(() => {
      if (this.#deps.now() - c.lastSeen > deadAfterMs) {
        log.warn("no traffic from the control plane; dropping the socket", { deadAfterMs });
        c.sock.terminate();
        return;
      }
      if (this.#sendText(c, PING)) counters.pingsSent++;
    }, heartbeatMs);
    counters.connects++;
    log.info("connected", { nodeId, sessionId });
    emit("connected", { nodeId, sessionId });
    this.#deps.welcomed();
  }

  #send(c: Connection, frame: AgentFrame): boolean {
    const text = JSON.stringify(frame);
    if (utf8(text).length > (frame.t === "status" ? MAX_SPEC_FRAME_BYTES : MAX_FRAME_BYTES)) {
      this.#deps.log.error("not sending a frame over the size limit", { t: frame.t, bytes: utf8(text).length });
      return false;
    }
    return this.#sendText(c, text);
  }

  #sendText(c: Connection, text: string): boolean {
    try {
      c.sock.send(text);
      return true;
    } catch (e) {
      this.#deps.log.warn("send failed", { message: (e as Error).message });
      return false;
    }
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
}
