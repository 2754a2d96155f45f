// better-compute/testing. FakeDaemon: an agent for tests, the real AgentClient with MemoryState. Inside workerd it
// talks to the Worker through an injected fetch (`SELF`, `exports.default`, or a function);
// in Node it uses the global WebSocket (pass `transport: nodeTransport()` from
// agent/node-transport.ts for a kill() that really cuts the TCP connection).
//
//   const d = new FakeDaemon({ baseUrl: "http://bc.test", fetch: exports.default, role: "node",
//                              handlers: { "agent.ping": () => ({ pong: true }) } });
//   await d.join(token);  await d.connect();  ...  d.executed;  d.kill();  await d.stop();
import {
  AgentClient,
  AgentError,
  type AgentEvents,
  type AgentLogger,
  type AgentTransport,
  type BackoffOptions,
  type CommandHandler,
} from "../agent/client.ts";
import { fetchTransport, webSocketTransport, type FetchSource, type PortableTransport } from "../agent/fetch-transport.ts";
import { MemoryState, type AgentIdentity, type AgentStateStore, type Role } from "../agent/state.ts";
import type { HelloFrame, NodeStatus, ResultFrame } from "../core/protocol.ts";
import { nodeCommandHandlers, nodeRole, type NodeRole } from "../agent/roles/node.ts";
import type { RuntimeDriver } from "../agent/runtimes/contract.ts";
import { silentLogger } from "../agent/events.ts";

export interface FakeDaemonOptions {
  baseUrl: string;
  /** How HTTP reaches the control plane; default the global fetch. */
  fetch?: FetchSource;
  /** Overrides the default transport (fetchTransport in workerd, webSocketTransport elsewhere). */
  transport?: AgentTransport;
  role?: Role;
  labels?: Record<string, string>;
  drivers?: { id: string; version: string }[];
  /** What the simulated host has (CPU, memory, disk, devices), reported in its hello. */
  resources?: HelloFrame["resources"];
  handlers?: Record<string, CommandHandler>;
  /** Default a fresh MemoryState; pass the same store to a second FakeDaemon to simulate a restart. */
  state?: AgentStateStore;
  hostname?: string;
  version?: string;
  bootId?: string;
  heartbeatMs?: number;
  /** Default { initialMs: 20, maxMs: 500, healthyAfterMs: 1000 }: tests reconnect fast. */
  backoff?: BackoffOptions;
  logger?: AgentLogger;
  /**
   * Run the node role's converger (agent/roles/node.ts) with this daemon's state: the host
   * converges the NodeSpecs it is sent. Its runtimes (e.g. simulatedRuntime() from
   * testing/simulated-runtime.ts) are advertised as drivers in the hello.
   */
  node?: { runtimes?: RuntimeDriver[]; resyncMs?: number };
}

const inWorkerd = () => (globalThis as { navigator?: { userAgent?: string } }).navigator?.userAgent === "Cloudflare-Workers";

export class FakeDaemon {
  readonly client: AgentClient;
  readonly state: AgentStateStore;
  readonly role: Role;
  /** Every handler run, in order (a key appears once: redeliveries are answered from the journal). */
  readonly executed: { kind: string; key: string; id: string }[] = [];
  /** Every result produced or replayed, in order. */
  readonly results: ResultFrame[] = [];
  /** `error` frames the control plane sent. */
  readonly serverErrors: AgentEvents["server-error"][] = [];
  /** Close codes of ended sessions, in order. */
  readonly disconnects: { code: number; reason: string }[] = [];
  /** What stopped the daemon for good (REVOKED...), if anything. */
  fatal: AgentError | undefined;
  /** The node role's converger (with the `node` option). */
  readonly node: NodeRole | undefined;
  /** Every status the node role reported, in order. */
  readonly statuses: NodeStatus[] = [];

  readonly #transport: AgentTransport;
  readonly #hostname: string | undefined;
  #run: Promise<void> | undefined;

  constructor(opts: FakeDaemonOptions) {
    this.role = opts.role ?? "node";
    this.state = opts.state ?? new MemoryState();
    this.#hostname = opts.hostname;
    this.#transport = opts.transport ?? (inWorkerd() ? fetchTransport(opts.fetch) : webSocketTransport(opts.fetch));
    this.client = new AgentClient({
      transport: this.#transport,
      state: this.state,
      baseUrl: opts.baseUrl,
      handlers: opts.handlers ?? {},
      labels: opts.labels ?? {},
      drivers: [...(opts.drivers ?? []), ...(opts.node?.runtimes ?? []).map((r) => ({ id: r.id, version: r.version }))],
      ...(opts.resources ? { resources: opts.resources } : {}),
      ...(opts.version !== undefined ? { version: opts.version } : {}),
      ...(opts.bootId !== undefined ? { bootId: opts.bootId } : {}),
      ...(opts.logger !== undefined ? { logger: opts.logger } : {}),
      ...(opts.heartbeatMs !== undefined ? { heartbeatMs: opts.heartbeatMs } : {}),
      backoff: opts.backoff ?? { initialMs: 20, maxMs: 500, healthyAfterMs: 1000 },
    });
    this.client.on("executing", (e) => this.executed.push({ kind: e.kind, key: e.key, id: e.id }));
    this.client.on("result", (r) => this.results.push(r));
    this.client.on("server-error", (e) => this.serverErrors.push(e));
    this.client.on("disconnected", (e) => this.disconnects.push({ code: e.code, reason: e.reason }));
    this.client.on("fatal", (e) => (this.fatal = e));
    if (opts.node) {
      const role = nodeRole({
        state: this.state,
        runtimes: opts.node.runtimes ?? [],
        log: opts.logger ?? silentLogger,
        ...(opts.node.resyncMs !== undefined ? { resyncMs: opts.node.resyncMs } : {}),
        report: (status) => {
          this.statuses.push(status);
          this.client.sendStatus(status);
        },
      });
      this.client.onSpec((spec) => void role.onSpec(spec));
      // What bcd's node answers besides its NodeSpec (a guest's console), unless the test overrides it.
      for (const [kind, h] of Object.entries(nodeCommandHandlers(opts.node.runtimes ?? [])))
        if (!opts.handlers?.[kind]) this.client.handle(kind, h);
      this.node = role;
    }
  }

  get identity(): AgentIdentity | undefined {
    return this.client.identity;
  }

  get nodeId(): string | undefined {
    return this.client.identity?.nodeId;
  }

  get connected(): boolean {
    return this.client.connected;
  }

  /** Register a handler for a command kind. */
  handle(kind: string, handler: CommandHandler): this {
    this.client.handle(kind, handler);
    return this;
  }

  /** Join with a join token (attestor "join-token", evidence { token }). */
  join(token: string, opts: { hostname?: string } = {}): Promise<AgentIdentity> {
    const hostname = opts.hostname ?? this.#hostname;
    return this.client.join({
      attestor: "join-token",
      evidence: { token },
      role: this.role,
      ...(hostname !== undefined ? { hostname } : {}),
    });
  }

  /** Start serving; resolves at the first welcome, rejects if the connection is refused for good. */
  async connect(timeoutMs = 10_000): Promise<{ nodeId: string; sessionId: string }> {
    if (!this.#run) {
      await this.node?.start();
      this.#run = this.client.run().catch((e: unknown) => {
        this.fatal ??= e instanceof AgentError ? e : new AgentError("INTERNAL", String(e));
      });
      void this.#run.finally(() => (this.#run = undefined));
    }
    return this.client.waitConnected(timeoutMs);
  }

  /** Resolves at the next welcome (after kill(), a reconnect). */
  reconnected(timeoutMs = 10_000): Promise<{ nodeId: string; sessionId: string }> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => (off(), reject(new AgentError("DEADLINE_EXCEEDED", `no reconnect within ${timeoutMs} ms`))),
        timeoutMs,
      );
      const off = this.client.on("connected", (c) => (clearTimeout(timer), off(), resolve(c)));
    });
  }

  /** Resolves with the first event of this kind (after now) that matches. */
  next<E extends keyof AgentEvents>(
    event: E,
    match: (payload: AgentEvents[E]) => boolean = () => true,
    timeoutMs = 10_000,
  ): Promise<AgentEvents[E]> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => (off(), reject(new AgentError("DEADLINE_EXCEEDED", `no ${event} within ${timeoutMs} ms`))), timeoutMs);
      const off = this.client.on(event, (p) => {
        if (!match(p)) return;
        clearTimeout(timer);
        off();
        resolve(p);
      });
    });
  }

  /** Drop the socket without a close handshake (a network cut); the client reconnects on its own. */
  kill(): void {
    this.client.dropConnection();
  }

  /** Stop for good: close the socket with 1000 and end the run loop. */
  async stop(): Promise<void> {
    await this.node?.stop();
    await this.client.stop();
    await this.#run;
    (this.#transport as Partial<PortableTransport>).closeAbandoned?.();
  }
}

// better-compute/testing is this file: the API test client rides along with FakeDaemon.
export { createTestClient, type CallResult, type TestClient } from "./test-client.ts";
export { seededRandom } from "./seeded-random.ts";
