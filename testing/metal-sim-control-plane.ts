// The in-process control plane of createMetalSim (better-compute/testing/metal): the real
// betterCompute (provision engine, metal module, JoinService) on PGlite through the production
// driver and the WebSocket bridge. What a deployment runs in Durable Objects runs here in
// process: WorkflowRunner drives advance() as the WorkflowDO does, and Gateway holds agent
// sessions as the NodeDO does (challenge, signed hello, ordered delivery, results taken once),
// writing through the same core/agents/sessions.ts. SIMULATED: only the socket (in memory).
import { sql } from "drizzle-orm";
import { betterCompute, postgres, type Compute, type Module, type PkiOptions } from "better-compute";
import { memoryBlobs, rows, type DatabasePort, type Store, type Tx } from "better-compute/core";
import { metalModule, type HardwareProfile } from "better-compute/metal";
import { advance, provisionModule, wakeStalledWorkflows } from "better-compute/provision";
import { AgentError, type AgentTransport } from "../agent/client.ts";
import { BufferedSocket } from "../agent/socket.ts";
import { verifyCredential } from "../core/agents/credentials.ts";
import { nextDelivery, recordConnected, recordDisconnected, recordResult, waitingObject } from "../core/agents/sessions.ts";
import { databaseSecrets } from "../core/store/ports.ts";
import { base64url } from "../core/encoding.ts";
import {
  CloseCode,
  helloMessage,
  PING,
  PONG,
  PROTOCOL_VERSION,
  readAgentFrame,
  verifyMessage,
  type ServerFrame,
} from "../core/protocol.ts";
import type { RoundTripHook } from "../core/store/database.ts";
import { applyMigrations } from "../core/store/migrate.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../local/node-store.ts";
import { startPglite } from "../local/pglite-server.ts";
import { startBridge } from "../local/ws-bridge.ts";

/** What the simulated site needs of a control plane: in process here, or a running stack. */
export interface SimControlPlane {
  baseUrl: string;
  transport: AgentTransport;
  /** A store on the control plane's database, for assertions and the simulation's own reads. */
  store: NodeStore;
  compute?: Compute;
  call<T>(method: string, input?: Record<string, unknown>): Promise<T>;
  /** The same with another API key (a role's view of the API). */
  callAs<T>(apiKey: string, method: string, input?: Record<string, unknown>): Promise<T>;
  /** Moves compute_now() forward and wakes what waits on time. */
  advanceClock(seconds: number): Promise<void>;
  roundTrips(): number;
  stop(): Promise<void>;
}

const BASE_URL = "https://metal-sim.test";
const SECRET = "metal-sim-deployment-secret-0123456789abcdef";

export async function inProcessControlPlane(options: {
  modules?: Module[];
  hardwareProfiles?: Record<string, HardwareProfile>;
  chaos?: ChaosPlan;
  pki?: PkiOptions;
  databaseUrl?: string;
  databaseSchema?: string;
  onRoundTrip?: RoundTripHook;
}): Promise<SimControlPlane> {
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  try {
    const db = options.databaseUrl
      ? await postgresDatabase(options.databaseUrl, options.onRoundTrip, options.databaseSchema)
      : await pgliteDatabase();
    cleanup.push(() => db.stop());
    // The store the control plane's passes and sessions run on (counted on a real Postgres).
    const { store, engine = store } = db;

    const extra = options.modules ?? [];
    const blobs = memoryBlobs(); // the R2 bucket's stand-in
    const compute = betterCompute({
      secret: SECRET,
      blobs: () => blobs,
      ...(db.port ? { database: db.port } : {}),
      ...(options.pki ? { pki: options.pki } : {}),
      modules: [
        provisionModule(),
        metalModule({ hardwareProfiles: options.hardwareProfiles }),
        ...extra.filter((m) => m.contract === "module"),
      ],
      plugins: extra.filter((m) => m.contract === "plugin"),
    });
    await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
    const adminKey = (await compute.mintApiKey(store, { name: "metal-sim", roles: ["admin"] })).key;

    let stopped = false;
    const workflows = new WorkflowRunner(
      compute,
      () => env,
      engine,
      () => stopped,
      options.chaos,
    );
    const gateway = new Gateway(engine, SECRET, () => workflows);
    // The Durable Object bindings, as wakeObjects() finds them: a wake-up calls straight in.
    const namespace = (wake: (name: string) => void) => ({
      idFromName: (name: string) => name,
      get: (name: string) => ({ wake: async () => wake(name) }),
    });
    const env: Record<string, unknown> = {
      ...db.env,
      BC_SECRET: SECRET,
      NODE: namespace((nodeId) => gateway.deliverSoon(nodeId)),
      WORKFLOW: namespace((id) => workflows.wake(id)),
    };
    // The safety nets, faster: the cron's (stalled workflows are woken, the reconcilers run) and
    // the NodeDO's sweep alarm (commands whose wake-up was lost, e.g. in a crash, are delivered).
    const tick = setInterval(() => {
      if (stopped) return;
      void wakeStalledWorkflows(compute.moduleContext("provision", env, engine), 30).catch(() => {});
      workflows.reconcileSoon();
      void gateway.sweep().catch(() => {});
    }, 1000);
    tick.unref();
    cleanup.push(async () => {
      stopped = true;
      clearInterval(tick);
      workflows.stopAll();
      await gateway.closeAll();
    });

    return {
      baseUrl: BASE_URL,
      transport: { fetch: (url, init) => compute.fetch(new Request(url, init), env), openSocket: (_url, headers) => gateway.open(headers) },
      store,
      compute,
      call: (method, input) => callApi(BASE_URL, adminKey, method, input, (request) => compute.fetch(request, env)),
      callAs: (apiKey, method, input) => callApi(BASE_URL, apiKey, method, input, (request) => compute.fetch(request, env)),
      async advanceClock(seconds) {
        await store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${seconds})`);
        const running = await rows<{ id: string }>(store.db, sql`SELECT id FROM workflows WHERE state = 'running'`);
        for (const row of running) workflows.wake(row.id);
      },
      roundTrips: db.roundTrips,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The control plane's database: how its requests reach it, a store on it, and its round trips. */
interface SimDatabase {
  store: NodeStore;
  /** The store of the workflow passes and agent sessions, when it is not `store`. */
  engine?: Store;
  /** The Worker's database bindings (the per-request driver), or a port every request shares. */
  env: Record<string, unknown>;
  port?: DatabasePort;
  roundTrips(): number;
  stop(): Promise<void>;
}

/** The embedded PGlite behind the WebSocket bridge; round trips counted by the PGlite server. */
async function pgliteDatabase(): Promise<SimDatabase> {
  const pglite = await startPglite();
  const bridge = await startBridge().catch(async (err: unknown) => {
    await pglite.stop();
    throw err;
  });
  const store = await openNodeStore(pglite.connectionString, { bridge: bridge.url });
  return {
    store,
    env: { DATABASE_URL: pglite.connectionString, BC_DB_WS_PROXY: bridge.url },
    roundTrips: () => pglite.stats.roundTrips,
    async stop() {
      await store.close();
      await bridge.stop();
      await pglite.stop();
    },
  };
}

/**
 * A real Postgres, in a schema of its own (dropped at stop) so runs never meet each other's rows,
 * or in `schema`, made by the caller for several sims to share (parallel lanes of one fleet: each
 * process one control plane, as a deployment runs many Workers on one database), left in place.
 * Every request, pass and session shares one pool over TCP with node-postgres, the driver of the
 * Hyperdrive binding: pooled connections, as Hyperdrive keeps them to Neon in production, where a
 * pool per request would pay a connection and its password exchange each time. Its statements are
 * prepared by name once per connection (preparedStatements). Round trips are
 * counted at that driver (onRoundTrip); the returned store is another pool, for the sim's and the
 * caller's own reads, not counted.
 */
async function postgresDatabase(url: string, onRoundTrip?: RoundTripHook, shared?: string): Promise<SimDatabase> {
  const made = shared ? undefined : await createSimSchema(url);
  const schema = shared ?? made!.schema;
  let roundTrips = 0;
  const pool = postgres({
    hyperdrive: { connectionString: inSchema(url, schema) },
    maxConnections: 20,
    // The pool lives as long as the sim: each connection parses a statement once (docs/decisions.md).
    preparedStatements: true,
    onRoundTrip: (statement, answered) => {
      roundTrips++;
      onRoundTrip?.(statement, answered);
    },
  }).open({});
  const store = postgres({ hyperdrive: { connectionString: inSchema(url, schema) }, maxConnections: 4 }).open({});
  return {
    store,
    engine: pool,
    env: {},
    // A request's close() must not end the pool the others share.
    port: { open: () => ({ ...pool, close: async () => {} }) },
    roundTrips: () => roundTrips,
    async stop() {
      await pool.close();
      await store.close();
      await made?.drop();
    },
  };
}

/** A new, empty schema for a sim's tables on the Postgres at url; drop() removes it and them. */
export async function createSimSchema(url: string): Promise<{ schema: string; drop(): Promise<void> }> {
  const schema = `metal_sim_${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 8)}`;
  const admin = postgres({ hyperdrive: { connectionString: url }, maxConnections: 1 }).open({});
  await admin.db.execute(sql.raw(`CREATE SCHEMA ${schema}`));
  return {
    schema,
    async drop() {
      await admin.db.execute(sql.raw(`DROP SCHEMA ${schema} CASCADE`)).catch(() => {});
      await admin.close();
    },
  };
}

/** The connection string of url with schema first on its search_path. */
export function inSchema(url: string, schema: string): string {
  const u = new URL(url);
  u.searchParams.set("options", `-c search_path=${schema}`);
  return u.toString();
}

/** POST /v1/<method> as the admin; a refusal throws an Error carrying the API's code and details. */
export async function callApi<T>(
  baseUrl: string,
  adminKey: string,
  method: string,
  input: Record<string, unknown> = {},
  send: (request: Request) => Promise<Response> = fetch,
): Promise<T> {
  const res = await send(
    new Request(`${baseUrl}/v1/${method}`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      body: JSON.stringify(input),
    }),
  );
  const body = (await res.json()) as Record<string, unknown>;
  if (!res.ok)
    throw Object.assign(new Error(`${method}: ${String(body.code)}: ${String(body.message)}`), { code: body.code, details: body.details });
  return body as T;
}

export type ChaosBoundary = "before-commit" | "after-commit";

/**
 * TEST HOOK (test/metal/chaos.test.ts): the control plane crashes at a transaction boundary.
 * It sees only the transactions of the workflow runner and the reconcilers (what the WorkflowDO
 * and the cron run), never the API's or the gateway's. Every advance() pass and every reconcile
 * run is a process of its own (process()); once armed, the at-th transaction counted from arm()
 * kills the process running it: it throws inside the transaction after its callback ran (rolled
 * back: "died before commit") or right after it committed ("died after commit"), and every later
 * query or transaction of that process throws too, so no catch block of the dead process gets
 * to write. The runner's retry a second later is the restarted WorkflowDO, the next reconcile
 * tick the next cron run: both start from Postgres, with nothing of the dead one in memory.
 */
export class ChaosPlan {
  /** Transactions seen since arm() or reset(), the fatal one included. */
  count = 0;
  /** The armed boundary was reached (and the process there died). */
  hit = false;
  #armed: { at: number; boundary: ChaosBoundary } | undefined;

  /** Kills the process at the at-th transaction from now, at the boundary. */
  arm(at: number, boundary: ChaosBoundary): void {
    this.count = 0;
    this.hit = false;
    this.#armed = { at, boundary };
  }

  /** Counts from zero again, killing nothing. */
  reset(): void {
    this.arm(Number.POSITIVE_INFINITY, "after-commit");
  }

  /** The store as one process sees it: it dies with the process. */
  process(store: Store): Store {
    let dead = false;
    const check = () => {
      if (dead) throw new Error("chaos: this process died");
    };
    const die = (boundary: ChaosBoundary): never => {
      dead = true;
      this.hit = true;
      this.#armed = undefined;
      throw new Error(`chaos: the process died at transaction ${this.count}, ${boundary}`);
    };
    const db = new Proxy(store.db, {
      get(target, key) {
        check();
        const value: unknown = Reflect.get(target, key, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
    /** A commit boundary (a transaction, or a one-statement write): `commit` alone, or the process dies there. */
    const boundary = async <T>(fn: (tx: Tx) => Promise<T>, commit: () => Promise<T>): Promise<T> => {
      check();
      const fatal = ++this.count === this.#armed?.at ? this.#armed.boundary : undefined;
      if (fatal === "before-commit") {
        return store.transaction(async (tx) => {
          await fn(tx);
          return die(fatal); // thrown inside: the transaction rolls back
        });
      }
      const result = await commit();
      return fatal ? die(fatal) : result;
    };
    return {
      db,
      close: async () => {},
      transaction: (fn) => boundary(fn, () => store.transaction(fn)),
      write: (statement) =>
        boundary(
          (tx) => tx.execute(statement),
          () => store.write(statement),
        ),
    };
  }
}

/** The WorkflowDO's part: advance() per workflow, one pass at a time, woken or on a timer. */
export class WorkflowRunner {
  readonly #timers = new Map<string, NodeJS.Timeout>();
  readonly #running = new Map<string, Promise<void>>();
  readonly #again = new Set<string>();
  #reconciling: Promise<void> | undefined;
  #reconcileAgain = false;

  constructor(
    private readonly compute: Compute,
    private readonly env: () => object,
    private readonly store: Store,
    private readonly stopped: () => boolean,
    private readonly chaos?: ChaosPlan,
  ) {}

  /** The store of one pass (a WorkflowDO event, a cron run): under a chaos plan, one that can die. */
  #process(): Store {
    return this.chaos ? this.chaos.process(this.store) : this.store;
  }

  wake(id: string): void {
    if (this.stopped()) return;
    clearTimeout(this.#timers.get(id));
    this.#timers.delete(id);
    if (this.#running.has(id)) return void this.#again.add(id);
    const pass = this.#pass(id).finally(() => {
      this.#running.delete(id);
      if (this.#again.delete(id)) this.wake(id);
    });
    this.#running.set(id, pass);
  }

  async #pass(id: string): Promise<void> {
    try {
      // The context is built per pass: a restarted WorkflowDO keeps nothing in memory.
      const result = await advance(this.compute.moduleContext("provision", this.env(), this.#process()), id);
      if (result.wakeInMs === null) return this.reconcileSoon();
      this.#later(id, result.wakeInMs);
    } catch (err) {
      if (!this.stopped()) console.warn(`metal-sim: advancing ${id} failed, retrying: ${err instanceof Error ? err.message : String(err)}`);
      this.#later(id, 1000);
    }
  }

  #later(id: string, ms: number): void {
    if (this.stopped()) return;
    const timer = setTimeout(() => this.wake(id), ms);
    timer.unref();
    this.#timers.set(id, timer);
  }

  /** Runs the reconcilers (metal's lifecycle); requests during a pass coalesce into one more. */
  reconcileSoon(): void {
    if (this.stopped()) return;
    if (this.#reconciling) return void (this.#reconcileAgain = true);
    this.#reconciling = this.compute
      .reconcile(this.env(), this.#process())
      .then(
        () => undefined,
        () => undefined,
      )
      .finally(() => {
        this.#reconciling = undefined;
        if (this.#reconcileAgain) {
          this.#reconcileAgain = false;
          this.reconcileSoon();
        }
      });
  }

  stopAll(): void {
    for (const t of this.#timers.values()) clearTimeout(t);
    this.#timers.clear();
  }
}

interface Session {
  nodeId: string;
  role: string;
  publicKey: string;
  sessionId: string;
  nonce: string | null;
  ready: boolean;
  sentSeq: number;
  socket: BufferedSocket;
  delivering: Promise<void>;
  deliveryQueued: boolean;
  closed: boolean;
}

/**
 * The NodeDO's part, in process: challenge, signed hello, ordered delivery, results taken once.
 * Every write goes through core/agents/sessions.ts, as the NodeDO's do.
 */
export class Gateway {
  /** Each node's proven session (its hello verified); sockets waiting for their hello are apart, and displace nothing. */
  readonly #sessions = new Map<string, Session>();
  readonly #unproven = new Set<Session>();
  readonly #secrets;

  constructor(
    private readonly store: Store,
    secret: string,
    private readonly workflows: () => WorkflowRunner,
  ) {
    this.#secrets = databaseSecrets(store, secret);
  }

  async open(headers: Record<string, string>): Promise<BufferedSocket> {
    const credential = /^Bearer\s+(\S+)$/i.exec(headers.authorization ?? headers.Authorization ?? "")?.[1];
    let node;
    try {
      node = await verifyCredential(this.store, credential ?? "");
    } catch (err) {
      throw new AgentError((err as { code?: string }).code ?? "UNAUTHENTICATED", (err as Error).message, 401);
    }
    const nonce = base64url(crypto.getRandomValues(new Uint8Array(32)));
    const session: Session = {
      nodeId: node.nodeId,
      role: node.role,
      publicKey: node.publicKey,
      sessionId: crypto.randomUUID(),
      nonce,
      ready: false,
      sentSeq: 0,
      delivering: Promise.resolve(),
      deliveryQueued: false,
      closed: false,
      socket: new BufferedSocket({
        send: (text) => queueMicrotask(() => void this.#onFrame(session, text)),
        close: (code = 1000, reason = "") => queueMicrotask(() => void this.#closed(session, code, reason)),
        terminate: () => queueMicrotask(() => void this.#closed(session, 1006, "terminated")),
      }),
    };
    this.#unproven.add(session);
    this.#send(session, { t: "challenge", protocol: PROTOCOL_VERSION, nonce });
    return session.socket;
  }

  #send(session: Session, frame: ServerFrame | string): void {
    const text = typeof frame === "string" ? frame : JSON.stringify(frame);
    queueMicrotask(() => session.socket.receive(text));
  }

  async #onFrame(session: Session, text: string): Promise<void> {
    if (session.closed) return;
    if (text === PING) return this.#send(session, PONG);
    const reading = readAgentFrame(text);
    if ("close" in reading) return this.#end(session, reading.close, reading.reason);
    const { frame } = reading;
    if (frame.t === "hello") {
      if (
        frame.nonce !== session.nonce ||
        !(await verifyMessage(session.publicKey, helloMessage(session.nodeId, frame.nonce, frame.bootId), frame.signature))
      ) {
        return this.#end(session, CloseCode.PROOF_FAILED, "the hello does not answer this socket's challenge");
      }
      session.nonce = null;
      const outcome = await recordConnected(this.store, session, frame);
      if (!outcome.connected) return this.#end(session, CloseCode.REVOKED, "the node was revoked");
      const replaced = this.#sessions.get(session.nodeId);
      this.#unproven.delete(session);
      this.#sessions.set(session.nodeId, session);
      if (replaced) this.#end(replaced, CloseCode.REPLACED, "replaced by a newer connection");
      for (const id of outcome.waking) this.workflows().wake(id);
      session.ready = true;
      this.#send(session, { t: "welcome", nodeId: session.nodeId, sessionId: session.sessionId });
      return this.deliverSoon(session.nodeId);
    }
    if (!session.ready) return this.#end(session, CloseCode.HELLO_REQUIRED, "say hello first");
    if (frame.t !== "result") return;
    const outcome = await recordResult(this.store, session, frame);
    if ("refused" in outcome) return this.#send(session, { t: "error", code: outcome.refused, message: outcome.message, ref: frame.id });
    this.#send(session, { t: "result-ack", id: frame.id });
    // The sim's only objects that wait on results are its workflows.
    const waiting = waitingObject(outcome);
    if (waiting?.kind === "workflow") this.workflows().wake(waiting.name);
  }

  /** The NodeDO's sweep: delivery to every connected agent that has commands still pending. */
  async sweep(): Promise<void> {
    if (this.#sessions.size === 0) return;
    const pending = await rows<{ node_id: string }>(this.store.db, sql`SELECT DISTINCT node_id FROM bc_commands WHERE state = 'pending'`);
    for (const row of pending) this.deliverSoon(row.node_id);
  }

  deliverSoon(nodeId: string): void {
    const session = this.#sessions.get(nodeId);
    if (!session?.ready || session.closed) return;
    // One delivery waiting behind the running one is enough: it sends everything open by then.
    if (session.deliveryQueued) return;
    session.deliveryQueued = true;
    session.delivering = session.delivering
      .then(() => {
        session.deliveryQueued = false;
        return this.#deliver(session);
      })
      .catch((err: unknown) => {
        if (session.closed) return; // the simulation is stopping
        console.warn(`metal-sim: delivery to ${nodeId} failed: ${err instanceof Error ? err.message : String(err)}`);
      });
  }

  async #deliver(session: Session): Promise<void> {
    for (;;) {
      if (session.closed) return;
      const { frames } = await nextDelivery(
        this.store,
        session.nodeId,
        { afterSeq: session.sentSeq, specAfter: null, limit: 100 },
        () => this.#secrets,
      );
      if (frames.length === 0) return;
      for (const frame of frames) {
        this.#send(session, frame);
        session.sentSeq = Math.max(session.sentSeq, frame.seq);
      }
    }
  }

  #end(session: Session, code: number, reason: string): void {
    queueMicrotask(() => session.socket.end(code, reason));
    void this.#closed(session, code, reason);
  }

  async #closed(session: Session, code: number, _reason: string): Promise<void> {
    if (session.closed) return;
    session.closed = true;
    session.socket.end(code, _reason);
    this.#unproven.delete(session);
    if (this.#sessions.get(session.nodeId) === session) this.#sessions.delete(session.nodeId);
    if (session.ready) await recordDisconnected(this.store, session, code).catch(() => {});
  }

  async closeAll(): Promise<void> {
    for (const session of [...this.#sessions.values(), ...this.#unproven]) await this.#closed(session, 1001, "the simulation stopped");
  }
}
