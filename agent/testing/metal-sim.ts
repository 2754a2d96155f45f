// createMetalSim: a simulated site for tests and benchmarks (Node only). SIMULATED: the machines,
// their disks and their BMCs (the Redfish emulator over real HTTP), and the in-process gateway
// that stands in for the NodeDO. REAL: Postgres (PGlite through the production driver and the
// WebSocket bridge), betterCompute with the provision engine and the metal module, JoinService
// and its attestors, the agents (AgentClient with the site role's Redfish client and the
// ramdisk role), their signed hellos and node-signed results, and the record writes of a
// session (core/agents/sessions.ts, shared with the NodeDO).
//
// A machine powered on boots what its BMC says: PXE brings up a ramdisk agent that joins by
// discovery (the site agent signs for it), a CD whose image the `install` hook accepts installs
// an OS whose agent joins with the provisioned token found in the image, a disk with that OS
// on it boots the same agent again. Power off stops whatever runs; a wipe removes the OS.
import { betterCompute, type Compute, type Module } from "better-compute";
import { metalModule, type HardwareProfile } from "better-compute/metal";
import { advance, provisionModule, wakeStalledWorkflows } from "better-compute/provision";
import { AgentClient, AgentError, type AgentTransport, type CommandHandler } from "../client.ts";
import { BufferedSocket } from "../socket.ts";
import { MemoryState } from "../state.ts";
import { siteHandlers } from "../roles/site.ts";
import { ramdiskHandlers } from "../roles/ramdisk.ts";
import { simulatedDisks, type SimulatedDisks } from "./sim-disks.ts";
import { startRedfishEmulator, type MachineState, type RedfishEmulator, type RedfishFaults } from "./redfish-emulator.ts";
import { verifyCredential } from "../../core/agents/credentials.ts";
import { expireOverdue, markDelivered, openCommands, recordConnected, recordDisconnected, recordResult, waitingWorkflow } from "../../core/agents/sessions.ts";
import { databaseSecrets } from "../../core/context.ts";
import { base64url } from "../../core/encoding.ts";
import { agentFrame, CloseCode, discoveryMessage, FrameError, generateNodeKey, helloMessage, importNodeKey, PING, PONG, PROTOCOL_VERSION, signMessage, verifyMessage, type CommandFrame, type DiscoveryAssertion, type ServerFrame } from "../../core/protocol.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { sql } from "drizzle-orm";
import { coreMigrations, openNodeStore, type NodeStore } from "../../scripts/local/node-store.ts";
import { startPglite, type PgliteServer } from "../../scripts/local/pglite-server.ts";
import { startBridge, type Bridge } from "../../scripts/local/ws-bridge.ts";

const BASE_URL = "https://metal-sim.test";
const SECRET = "metal-sim-deployment-secret-0123456789abcdef";
export const SIM_BMC_USER = "admin";
export const SIM_BMC_PASSWORD = "sim-bmc-password";

export interface InstallMedia {
  machine: SimMachine;
  /** The image URL the BMC mounted. */
  image: string;
}

export interface MetalSimOptions {
  /** Extra modules and third-party plugins, registered the way a deployment's config would. */
  modules?: Module[];
  /** Accepts a mounted CD image as an installer: returns the provisioned join token it carries. */
  install?: (media: InstallMedia) => { token: string } | undefined | Promise<{ token: string } | undefined>;
  /** Simulated machines behind the emulated BMCs; default 1. */
  machines?: number;
  faults?: RedfishFaults;
  hardwareProfiles?: Record<string, HardwareProfile>;
  /** The pool's hardware profile; default redfish-pxe. */
  hardwareProfile?: string;
  allowUnverifiedRelease?: boolean;
  /** Delay of the simulated firmware between power on and the booted agent dialling in (ms); default 0. */
  bootDelayMs?: number;
}

export interface SimMachine {
  /** The emulator's system id. */
  id: string;
  uuid: string;
  /** Its BMC address for metal.enroll: .../redfish/v1/Systems/<id>. */
  address: string;
  bmc: MachineState;
  disks: SimulatedDisks;
  /** What is installed on its disk: an OS whose agent joins with the token it was installed with. */
  os: { state: MemoryState; token: string; joined: boolean } | undefined;
  /** What it booted, in order. */
  boots: ("pxe" | "cd" | "disk" | "nothing")[];
  /** A ramdisk whose results arrive unsigned (a ramdisk that cannot attest). */
  unsignedRamdisk: boolean;
  /** The agent running on it now. */
  agent: AgentClient | undefined;
}

export interface SeenCommand {
  nodeId: string;
  role: string;
  kind: string;
  key: string;
  body: Record<string, unknown>;
}

export interface MetalSim {
  compute: Compute;
  store: NodeStore;
  bmc: RedfishEmulator;
  machines: SimMachine[];
  site: { id: string; pool: string; agentNodeId: string };
  /** Every command any agent of the site received, as delivered (without secret values). */
  commandsSeen: SeenCommand[];
  /** POST /v1/<method> as an admin; throws an Error with .code on a refusal. */
  call<T = Record<string, unknown>>(method: string, input?: Record<string, unknown>): Promise<T>;
  /** Enrolls machine i (default with the right BMC password) into the sim's pool. */
  enroll(machine: SimMachine, opts?: { password?: string; id?: string }): Promise<{ id: string; state: string }>;
  /** Resolves once the metal node is in one of the states; rejects after timeoutMs with where it is. */
  waitForState(nodeId: string, states: string | string[], timeoutMs?: number): Promise<Record<string, unknown>>;
  /** Moves database time forward (compute_now()) and wakes every running workflow. */
  advanceClock(seconds: number): Promise<void>;
  /** Postgres round trips so far (the embedded server's count). */
  roundTrips(): number;
  stop(): Promise<void>;
}

export async function createMetalSim(options: MetalSimOptions = {}): Promise<MetalSim> {
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  try {
    return await build(options, cleanup, stop);
  } catch (err) {
    await stop();
    throw err;
  }
}

async function build(options: MetalSimOptions, cleanup: Array<() => Promise<unknown>>, stop: () => Promise<void>): Promise<MetalSim> {
  const pglite: PgliteServer = await startPglite();
  cleanup.push(() => pglite.stop());
  const bridge: Bridge = await startBridge();
  cleanup.push(() => bridge.stop());
  const store = await openNodeStore(pglite.connectionString, { bridge: bridge.url });
  cleanup.push(() => store.close());

  const extra = options.modules ?? [];
  const compute = betterCompute({
    secret: SECRET,
    modules: [provisionModule(), metalModule({ hardwareProfiles: options.hardwareProfiles }), ...extra.filter((m) => m.contract === "module")],
    plugins: extra.filter((m) => m.contract === "plugin"),
  });
  await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
  const adminKey = (await compute.mintApiKey(store, { name: "metal-sim", roles: ["admin"] })).key;

  let stopped = false;
  const workflows = new WorkflowRunner(compute, () => env, store, () => stopped);
  const gateway = new Gateway(store, () => workflows);
  const namespace = (wake: (name: string) => void) => ({
    idFromName: (name: string) => name,
    get: (name: string) => ({ fetch: async () => (wake(name), new Response(null, { status: 204 })) }),
  });
  const env: Record<string, unknown> = {
    DATABASE_URL: pglite.connectionString,
    BC_DB_WS_PROXY: bridge.url,
    BC_SECRET: SECRET,
    NODE: namespace((nodeId) => gateway.deliverSoon(nodeId)),
    WORKFLOW: namespace((id) => workflows.wake(id)),
  };
  cleanup.push(async () => {
    stopped = true;
    workflows.stopAll();
    await gateway.closeAll();
  });

  const transport: AgentTransport = {
    fetch: (url, init) => compute.fetch(new Request(url, init), env),
    openSocket: (_url, headers) => gateway.open(headers),
  };

  async function call<T>(method: string, input: Record<string, unknown> = {}): Promise<T> {
    const res = await compute.fetch(
      new Request(`${BASE_URL}/v1/${method}`, { method: "POST", headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" }, body: JSON.stringify(input) }),
      env,
    );
    const body = (await res.json()) as Record<string, unknown>;
    if (!res.ok) throw Object.assign(new Error(`${method}: ${String(body.code)}: ${String(body.message)}`), { code: body.code, details: body.details });
    return body as T;
  }

  // The site: its agent joins with a site token and drives the BMCs with the real Redfish client.
  const siteId = "sim-site";
  const poolId = "sim-pool";
  await call("metal.sites.create", { id: siteId });
  await call("metal.pools.create", {
    id: poolId, site: siteId, agent: "bcd",
    policy: { hardwareProfile: options.hardwareProfile ?? "redfish-pxe", allowUnverifiedRelease: options.allowUnverifiedRelease ?? false },
  });
  const siteState = new MemoryState();
  const siteAgent = agentClient(transport, siteState, siteHandlers(), "site");
  const { token: siteToken } = await call<{ token: string }>("siteTokens.create", { site: siteId });
  const siteIdentity = await siteAgent.join({ attestor: "join-token", evidence: { token: siteToken }, role: "site", hostname: "site-agent" });
  await runAgent(siteAgent, cleanup);
  const siteKey = await importNodeKey((await siteState.loadKey())!);

  // The machines: power changes boot them (asynchronously, as firmware would).
  const machines: SimMachine[] = [];
  const byBmcId = new Map<string, SimMachine>();
  const bmc = await startRedfishEmulator({
    machines: options.machines ?? 1,
    username: SIM_BMC_USER,
    password: SIM_BMC_PASSWORD,
    ...(options.faults ? { faults: options.faults } : {}),
    onPowerChange: (state, _from, to) => {
      const machine = byBmcId.get(state.id);
      if (!machine) return;
      // Read now: a Once override is consumed as soon as this hook returns.
      const target = state.boot.enabled === "Disabled" ? "None" : state.boot.target;
      const media = state.media.inserted ? state.media.image : null;
      machine.boots; // (kept for the reader: boots are appended when the boot happens)
      void machineLife.enqueue(machine, () => (to === "On" ? boot(machine, target, media) : powerOff(machine)));
    },
  });
  cleanup.push(() => bmc.stop());
  for (const state of bmc.machines.values()) {
    const machine: SimMachine = {
      id: state.id, uuid: state.uuid, address: `${bmc.url}/redfish/v1/Systems/${state.id}`, bmc: state,
      disks: simulatedDisks([{ device: "/dev/sda", sizeBytes: 64 * 1024 * 1024 }]), os: undefined, boots: [], unsignedRamdisk: false, agent: undefined,
    };
    machines.push(machine);
    byBmcId.set(state.id, machine);
  }
  cleanup.push(async () => {
    for (const m of machines) await m.agent?.stop().catch(() => {});
  });

  const machineLife = new PerKeyQueue<SimMachine>();
  const databaseNow = async () => (await compute.moduleContext("metal", env, store).clock.now()).toISOString();

  async function powerOff(machine: SimMachine): Promise<void> {
    const agent = machine.agent;
    machine.agent = undefined;
    await agent?.stop();
  }

  async function boot(machine: SimMachine, target: string, media: string | null): Promise<void> {
    if (stopped) return;
    await powerOff(machine); // a restart: whatever ran is gone
    if (options.bootDelayMs) await new Promise((r) => setTimeout(r, options.bootDelayMs));
    if (target === "Pxe") return bootRamdisk(machine);
    if (target === "Cd" && media) {
      const accepted = await options.install?.({ machine, image: media });
      if (accepted) {
        machine.os = { state: new MemoryState(), token: accepted.token, joined: false };
        return bootOs(machine, "cd");
      }
    }
    if (machine.os) return bootOs(machine, "disk");
    machine.boots.push("nothing");
  }

  async function bootRamdisk(machine: SimMachine): Promise<void> {
    machine.boots.push("pxe");
    const state = new MemoryState();
    const key = await generateNodeKey();
    await state.saveKey(key.privateJwk);
    // The site agent vouches for what PXE-booted on its network (discovery attestation).
    const assertion: DiscoveryAssertion = { publicKey: key.publicKey, issuedAt: await databaseNow(), productUuid: machine.uuid.toLowerCase() };
    const signature = await signMessage(siteKey.privateKey, discoveryMessage(siteIdentity.nodeId, assertion));
    const handlers = ramdiskHandlers({ disks: machine.disks, productUuid: machine.uuid });
    const wipe = handlers["metal.ramdisk.wipe"]!;
    handlers["metal.ramdisk.wipe"] = async (body, ctx) => {
      const output = await wipe(body, ctx);
      machine.os = undefined; // the installed system is gone with its disk
      return output;
    };
    const agent = agentClient(transport, state, handlers, "ramdisk");
    await agent.join({ attestor: "discovery", evidence: { siteNodeId: siteIdentity.nodeId, assertion, signature }, role: "ramdisk", hostname: `ramdisk-${machine.id}` });
    if (machine.unsignedRamdisk) gateway.unsigned.add(agent.identity!.nodeId);
    machine.agent = agent;
    await runAgent(agent);
  }

  async function bootOs(machine: SimMachine, from: "cd" | "disk"): Promise<void> {
    machine.boots.push(from);
    const os = machine.os!;
    const agent = agentClient(transport, os.state, {}, "node");
    if (!os.joined) {
      await agent.join({ attestor: "provisioned", evidence: { token: os.token, productUuid: machine.uuid.toLowerCase() }, role: "node", hostname: `host-${machine.id}` });
      os.joined = true;
    }
    machine.agent = agent;
    await runAgent(agent);
  }

  const sim: MetalSim = {
    compute,
    store,
    bmc,
    machines,
    site: { id: siteId, pool: poolId, agentNodeId: siteIdentity.nodeId },
    commandsSeen: gateway.seen,
    call,
    enroll: (machine, opts = {}) =>
      call("metal.enroll", { pool: poolId, ...(opts.id ? { id: opts.id } : {}), bmc: { address: machine.address, username: SIM_BMC_USER, password: opts.password ?? SIM_BMC_PASSWORD } }),
    async waitForState(nodeId, states, timeoutMs = 30_000) {
      const wanted = Array.isArray(states) ? states : [states];
      const until = Date.now() + timeoutMs;
      let node: Record<string, unknown> = {};
      while (Date.now() < until) {
        node = await call("metal.nodes.get", { id: nodeId });
        if (wanted.includes(node.state as string)) return node;
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`metal node ${nodeId} is ${String(node.state)} after ${timeoutMs} ms, not ${wanted.join(" or ")} (last error: ${JSON.stringify(node.lastError)})`);
    },
    async advanceClock(seconds) {
      await store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${seconds})`);
      const running = await store.db.execute(sql`SELECT id FROM workflows WHERE state = 'running'`);
      for (const row of running.rows as { id: string }[]) workflows.wake(row.id);
    },
    roundTrips: () => pglite.stats.roundTrips,
    stop,
  };
  // The cron's safety net, faster: stalled workflows are woken and the reconcilers run.
  const tick = setInterval(() => {
    if (stopped) return;
    void wakeStalledWorkflows(compute.moduleContext("provision", env, store), 30).catch(() => {});
    workflows.reconcileSoon();
  }, 1000);
  tick.unref();
  cleanup.push(async () => clearInterval(tick));
  return sim;
}

function agentClient(transport: AgentTransport, state: MemoryState, handlers: Record<string, CommandHandler>, role: string): AgentClient {
  return new AgentClient({
    transport, state, baseUrl: BASE_URL, handlers, labels: { "bc.dev/sim-role": role },
    heartbeatMs: 60_000, backoff: { initialMs: 20, maxMs: 500, healthyAfterMs: 1000 },
  });
}

async function runAgent(agent: AgentClient, cleanup?: Array<() => Promise<unknown>>): Promise<void> {
  void agent.run().catch(() => {});
  if (cleanup) cleanup.push(() => agent.stop());
  await agent.waitConnected(10_000);
}

/** Runs tasks one after another per key (a machine's power events happen in order). */
class PerKeyQueue<K> {
  readonly #tails = new Map<K, Promise<void>>();
  enqueue(key: K, task: () => Promise<void>): Promise<void> {
    const next = (this.#tails.get(key) ?? Promise.resolve()).then(task).catch((err: unknown) => {
      console.warn(`metal-sim: ${err instanceof Error ? err.message : String(err)}`);
    });
    this.#tails.set(key, next);
    return next;
  }
}

/** The WorkflowDO's part: advance() per workflow, one pass at a time, woken or on a timer. */
class WorkflowRunner {
  readonly #timers = new Map<string, NodeJS.Timeout>();
  readonly #running = new Map<string, Promise<void>>();
  readonly #again = new Set<string>();
  #reconciling: Promise<void> | undefined;
  #reconcileAgain = false;

  constructor(private readonly compute: Compute, private readonly env: () => object, private readonly store: NodeStore, private readonly stopped: () => boolean) {}

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
      const result = await advance(this.compute.moduleContext("provision", this.env(), this.store), id);
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
      .reconcile(this.env(), this.store)
      .then(() => undefined, () => undefined)
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
  closed: boolean;
}

/**
 * The NodeDO's part, in process: challenge, signed hello, ordered delivery, results taken once.
 * Every write goes through core/agents/sessions.ts, as the NodeDO's do.
 */
class Gateway {
  readonly seen: SeenCommand[] = [];
  /** Nodes whose results arrive with their signature stripped (a ramdisk that cannot attest). */
  readonly unsigned = new Set<string>();
  readonly #sessions = new Map<string, Session>();
  readonly #secrets;

  constructor(private readonly store: NodeStore, private readonly workflows: () => WorkflowRunner) {
    this.#secrets = databaseSecrets(store, SECRET);
  }

  async open(headers: Record<string, string>): Promise<BufferedSocket> {
    const credential = /^Bearer\s+(\S+)$/i.exec(headers.authorization ?? headers.Authorization ?? "")?.[1];
    let node;
    try {
      node = await verifyCredential(this.store, credential ?? "");
    } catch (err) {
      throw new AgentError((err as { code?: string }).code ?? "UNAUTHENTICATED", (err as Error).message, 401);
    }
    this.#sessions.get(node.nodeId)?.socket.end(CloseCode.REPLACED, "replaced by a newer connection");
    const nonce = base64url(crypto.getRandomValues(new Uint8Array(32)));
    const session: Session = {
      nodeId: node.nodeId, role: node.role, publicKey: node.publicKey, sessionId: crypto.randomUUID(), nonce, ready: false, sentSeq: 0,
      delivering: Promise.resolve(), closed: false,
      socket: new BufferedSocket({
        send: (text) => queueMicrotask(() => void this.#onFrame(session, text)),
        close: (code = 1000, reason = "") => queueMicrotask(() => void this.#closed(session, code, reason)),
        terminate: () => queueMicrotask(() => void this.#closed(session, 1006, "terminated")),
      }),
    };
    this.#sessions.set(node.nodeId, session);
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
    const parsed = agentFrame.safeParse(JSON.parse(text));
    if (!parsed.success) return this.#end(session, CloseCode.MALFORMED_FRAME, "malformed frame");
    const frame = parsed.data;
    if (frame.t === "hello") {
      if (frame.nonce !== session.nonce || !(await verifyMessage(session.publicKey, helloMessage(session.nodeId, frame.nonce, frame.bootId), frame.signature))) {
        return this.#end(session, CloseCode.PROOF_FAILED, "the hello does not answer this socket's challenge");
      }
      session.nonce = null;
      if (!(await recordConnected(this.store, session, frame))) return this.#end(session, CloseCode.REVOKED, "the node was revoked");
      session.ready = true;
      this.#send(session, { t: "welcome", nodeId: session.nodeId, sessionId: session.sessionId });
      return this.deliverSoon(session.nodeId);
    }
    if (!session.ready) return this.#end(session, CloseCode.HELLO_REQUIRED, "say hello first");
    if (frame.t !== "result") return;
    const result = this.unsigned.has(session.nodeId) ? { ...frame, signature: undefined } : frame;
    const outcome = await recordResult(this.store, session, result);
    if ("refused" in outcome) return this.#send(session, { t: "error", code: outcome.refused, message: outcome.message, ref: frame.id });
    this.#send(session, { t: "result-ack", id: frame.id });
    const waiting = waitingWorkflow(outcome);
    if (waiting) this.workflows().wake(waiting);
  }

  deliverSoon(nodeId: string): void {
    const session = this.#sessions.get(nodeId);
    if (!session?.ready || session.closed) return;
    session.delivering = session.delivering.then(() => this.#deliver(session)).catch((err: unknown) => {
      console.warn(`metal-sim: delivery to ${nodeId} failed: ${err instanceof Error ? err.message : String(err)}`);
    });
  }

  async #deliver(session: Session): Promise<void> {
    await expireOverdue(this.store, session.nodeId);
    for (;;) {
      if (session.closed) return;
      const frames: CommandFrame[] = await openCommands(this.store, session.nodeId, session.sentSeq, 100, () => this.#secrets);
      if (frames.length === 0) return;
      for (const frame of frames) {
        this.seen.push({ nodeId: session.nodeId, role: session.role, kind: frame.kind, key: frame.key, body: frame.body });
        this.#send(session, frame);
        session.sentSeq = frame.seq;
      }
      await markDelivered(this.store, frames.map((f) => f.id));
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
    if (this.#sessions.get(session.nodeId) === session) this.#sessions.delete(session.nodeId);
    if (session.ready) await recordDisconnected(this.store, session, code).catch(() => {});
  }

  async closeAll(): Promise<void> {
    for (const session of [...this.#sessions.values()]) await this.#closed(session, 1001, "the simulation stopped");
  }
}

export { FrameError };
