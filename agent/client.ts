// AgentClient: the agent's side of core/protocol.ts. Joins (HTTPS), keeps one WebSocket to its
// NodeDO (dial-out, reconnecting with backoff), proves possession of its key in the hello,
// runs commands in order (per lane) and at most once per idempotency key, signs every result, renews
// its credential before it expires.
//
// A facade over its parts, each in its own file: credentials.ts (key, join, renewal),
// session.ts (the reconnecting socket: frames in, `send` out), executor.ts (lanes, journal,
// deadlines), outbox.ts (results until acknowledged), backoff.ts and events.ts. Roles import
// only contracts.ts, never this file.
//
// Platform-free: no Node built-ins and no socket library. The transport (fetch + sockets) and
// the state store are injected, so the same code is the real agent `bcd` in Node and the
// FakeDaemon inside workerd.
import { FrameError, type AgentFrame, type NodeSpec, type NodeStatus } from "../core/protocol.ts";
import { AgentError, type AgentLogger, type AgentTransport, type CommandHandler } from "./contracts.ts";
import { Credentials, type CredentialsOptions, type JoinOptions } from "./credentials.ts";
import { Emitter, redactingLogger, silentLogger, zeroCounters, type AgentCounters, type AgentEvents, type Plumbing } from "./events.ts";
import { Executor, type ExecutorOptions } from "./executor.ts";
import { Outbox, type OutboxOptions } from "./outbox.ts";
import { Session, type SessionFrame, type SessionOptions } from "./session.ts";
import type { AgentIdentity, AgentStateStore } from "./state.ts";

// What code outside agent/ imported from this file before it was split.
export {
  AgentError,
  errorFromResponse,
  inLane,
  type AgentLogger,
  type AgentTransport,
  type CommandContext,
  type CommandHandler,
  type FetchLike,
} from "./contracts.ts";
export type { BackoffOptions } from "./backoff.ts";
export { isRevocation, localExpiry, trimBase } from "./credentials.ts";
export { redactingLogger, type AgentCounters, type AgentEvents } from "./events.ts";
export { connectUrl } from "./session.ts";
export type { SocketHandlers, SocketLike } from "./socket.ts";
export type { AgentIdentity, AgentStateStore, JournalRecord, JournalStart, Role } from "./state.ts";

export const AGENT_VERSION = "0.1.0";

/** The options of every part (credentials, session, executor, outbox) and these. */
export interface AgentClientOptions extends CredentialsOptions, SessionOptions, ExecutorOptions, OutboxOptions {
  transport: AgentTransport;
  state: AgentStateStore;
  handlers?: Record<string, CommandHandler>;
  version?: string;
  /** This agent boot (process start); default a random UUID. Sent and signed in every hello. */
  bootId?: string;
  logger?: AgentLogger;
  /** stop() waits this long for a running handler after aborting its signal (ms). Default 5 000. */
  stopGraceMs?: number;
  /** For tests: the jitter source (default Math.random) and the clock. */
  random?: () => number;
  now?: () => number;
}

export class AgentClient {
  readonly bootId: string;
  readonly version: string;
  readonly counters: AgentCounters = zeroCounters();

  readonly #opts: AgentClientOptions;
  readonly #log: AgentLogger;
  readonly #handlers = new Map<string, CommandHandler>();
  readonly #events: Emitter;
  readonly #credentials: Credentials;
  readonly #outbox: Outbox;
  readonly #executor: Executor;
  readonly #session: Session;

  readonly #specListeners = new Set<(spec: NodeSpec) => void>();
  /** The last status the node role reported: sent again on every welcome. */
  #status: NodeStatus | undefined;

  #runPromise: Promise<void> | undefined;
  #stopping = false;
  #fatal: AgentError | undefined;

  constructor(opts: AgentClientOptions) {
    this.#opts = opts;
    const log = (this.#log = redactingLogger(opts.logger ?? silentLogger));
    this.#events = new Emitter(log);
    this.bootId = opts.bootId ?? crypto.randomUUID();
    this.version = opts.version ?? AGENT_VERSION;
    for (const [kind, handler] of Object.entries(opts.handlers ?? {})) this.#handlers.set(kind, handler);

    const plumbing: Plumbing = {
      log,
      now: opts.now ?? Date.now,
      random: opts.random ?? Math.random,
      counters: this.counters,
      emit: (event, payload) => this.#events.emit(event, payload),
    };
    const stopping = () => this.#stopping;
    const fail = (error: AgentError) => this.#fail(error);
    const send = (frame: AgentFrame) => this.#session.send(frame);
    const { transport, state } = opts;
    this.#credentials = new Credentials(opts, { ...plumbing, transport, state, stopping, fail });
    this.#outbox = new Outbox(opts, { ...plumbing, credentials: this.#credentials, send });
    this.#executor = new Executor(opts, { ...plumbing, state, handlers: this.#handlers, outbox: this.#outbox, send, stopping });
    this.#session = new Session(opts, {
      ...plumbing,
      transport,
      credentials: this.#credentials,
      bootId: this.bootId,
      version: this.version,
      stopping,
      fail,
      welcomed: () => {
        this.#outbox.resendAll();
        if (this.#status) this.#session.send({ t: "status", ...this.#status });
      },
      frame: (frame) => this.#onFrame(frame),
      closed: () => {
        this.#outbox.cancelRetries();
        this.#executor.dropQueued();
      },
    });
  }

  // ------------------------------------------------------------ public surface

  /** Register (or replace) the handler of a command kind. */
  handle(kind: string, handler: CommandHandler): this {
    this.#handlers.set(kind, handler);
    return this;
  }

  /** Called with every NodeSpec the control plane sends (a newer generation than this socket had); returns the unsubscribe. */
  onSpec(listener: (spec: NodeSpec) => void): () => void {
    this.#specListeners.add(listener);
    return () => void this.#specListeners.delete(listener);
  }

  /** Reports the node's observed state: sent now if connected, and again after every reconnect (only the latest is kept). */
  sendStatus(status: NodeStatus): void {
    this.#status = status;
    this.#session.send({ t: "status", ...status });
  }

  /** Subscribe to an event; returns the unsubscribe function. */
  on<E extends keyof AgentEvents>(event: E, listener: (payload: AgentEvents[E]) => void): () => void {
    return this.#events.on(event, listener);
  }

  get identity(): AgentIdentity | undefined {
    return this.#credentials.identity;
  }

  get connected(): boolean {
    return this.#session.connected;
  }

  get running(): boolean {
    return this.#runPromise !== undefined;
  }

  /** The error that stopped the client for good, if any. */
  get fatalError(): AgentError | undefined {
    return this.#fatal;
  }

  /** The node's public key (raw, base64url), creating and saving the key pair if there is none. */
  publicKey(): Promise<string> {
    return this.#credentials.publicKey();
  }

  /**
   * Join the control plane: POST JOIN_PATH with a proof of possession of the node key, and
   * save the identity it answers. The evidence (a join token...) is sent once and never stored
   * or logged. A refusal throws an AgentError with the server's code and message.
   */
  join(opts: JoinOptions): Promise<AgentIdentity> {
    return this.#credentials.join(opts);
  }

  /**
   * Renew the credential now: POST RENEW_PATH with the current credential as bearer and a
   * signed timestamp; saves the new credential. run() calls this at 2/3 of the lifetime.
   */
  renew(): Promise<AgentIdentity> {
    return this.#credentials.renew();
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
    this.#session.wake();
    this.#credentials.cancelRenewal();
    this.#executor.interrupt();
    await this.#executor.settle(opts.graceMs ?? this.#opts.stopGraceMs ?? 5_000);
    await this.#session.close(2_000);
    await run?.catch(() => {});
  }

  /** Drop the current socket without a close handshake (a network cut); run() reconnects. */
  dropConnection(): void {
    this.#session.drop();
  }

  /** Resolves when a session is welcomed (now, if one is); rejects if the client stops first. */
  waitConnected(timeoutMs = 30_000): Promise<{ nodeId: string; sessionId: string }> {
    const identity = this.#credentials.identity;
    if (this.#session.connected && identity) return Promise.resolve({ nodeId: identity.nodeId, sessionId: this.#session.sessionId ?? "" });
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

  // ------------------------------------------------------------ wiring

  async #run(): Promise<void> {
    this.#stopping = false;
    this.#fatal = undefined;
    await this.#credentials.load();
    this.#credentials.scheduleRenewal();
    try {
      await this.#session.run();
    } finally {
      this.#credentials.cancelRenewal();
      this.#stopping = true;
    }
    if (this.#fatal) throw this.#fatal;
  }

  /** A frame from the welcomed session, to the part it is for. */
  #onFrame(frame: SessionFrame): void {
    if (frame.t === "command") return this.#executor.receive(frame);
    if (frame.t === "result-ack") return this.#outbox.acked(frame.id);
    if (frame.t === "spec") {
      const spec = { generation: frame.generation, sections: frame.sections };
      for (const listener of this.#specListeners) {
        try {
          listener(spec);
        } catch (err) {
          this.#log.error("a NodeSpec listener threw", { message: (err as Error).message });
        }
      }
      return;
    }
    // The control plane could not take a result just now (or this socket sent results over its
    // budget): offer it again after a backoff.
    const later = frame.code === FrameError.UNAVAILABLE || frame.code === FrameError.RATE_LIMITED;
    if (later && frame.ref !== undefined) this.#outbox.retry(frame.ref);
  }

  /** Stop for good (REVOKED, CREDENTIAL_EXPIRED...): run() rejects with the error. */
  #fail(error: AgentError): void {
    if (this.#fatal) return;
    this.#fatal = error;
    this.#stopping = true;
    this.#credentials.cancelRenewal();
    this.#executor.interrupt();
    this.#log.error("stopping for good", { code: error.code, message: error.message });
    this.#events.emit("fatal", error);
    void this.#session.close();
    this.#session.wake();
  }
}
