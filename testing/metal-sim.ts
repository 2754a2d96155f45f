// createMetalSim (better-compute/testing/metal, Node only): a simulated site for tests and
// benchmarks. SIMULATED: the machines, their disks and their BMCs (the Redfish emulator over
// real HTTP). REAL: the agents (AgentClient: the site role's Redfish client, the ramdisk role,
// the installed system's agent) with their signed hellos and node-signed results, and the
// control plane: by default in process (metal-sim-control-plane.ts: PGlite through the
// production driver, the engine, the metal module, JoinService), or a running stack
// (`stack`: wrangler dev with its NodeDOs and WorkflowDOs, agents over real WebSockets).
//
// The site agent may also be a real bcd process outside the sim (`siteAgent`, as `npm run dev`
// runs it): the sim's machines then network-boot from that agent.
//
// A machine powered on boots what its BMC says. PXE asks the site's network boot (the site
// agent's real NetbootService: what DHCP would answer the machine's MAC, then its iPXE script over
// HTTP): a ramdisk script brings up a ramdisk agent that joins with the single-use token on its
// kernel command line, `exit` goes on to the disk, no answer boots nothing. A CD whose image the
// `install` hook accepts installs an OS whose agent joins with the provisioned token found in the
// image; an image written with a config drive installs one whose agent joins with the config
// drive's token; a disk with that OS on it boots the same agent again. Power off stops whatever
// runs; a wipe removes the OS. SIMULATED: DHCP itself (the sim reads the site's machines), the
// kernels and initrds (the site serves a stand-in ramdisk), the machines and disks.
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Module, PkiOptions } from "better-compute";
import type { HardwareProfile } from "better-compute/metal";
import { AgentClient, inLane, type AgentTransport, type CommandHandler } from "../agent/client.ts";
import { nodeTransport } from "../agent/node-transport.ts";
import type { SocketLike } from "../agent/socket.ts";
import { FileState } from "../agent/file-state.ts";
import { MemoryState, type AgentIdentity } from "../agent/state.ts";
import { httpProxyHandlers } from "../agent/roles/http-proxy.ts";
import { siteHandlers } from "../agent/roles/site.ts";
import { ramdiskHandlers } from "../agent/roles/ramdisk.ts";
import { netbootHandlers } from "../agent/roles/netboot/handlers.ts";
import { normalMac, type NetbootMachine } from "../agent/roles/netboot/machines.ts";
import { NetbootService } from "../agent/roles/netboot/service.ts";
import { BLOBS_PATH } from "../core/protocol.ts";
import { simulatedDisks, type SimulatedDisks } from "./sim-disks.ts";
import { fakeMac, startRedfishEmulator, type MachineState, type RedfishEmulator, type RedfishFaults } from "./redfish-emulator.ts";
import { callApi, inProcessControlPlane, type ChaosPlan, type SimControlPlane } from "./metal-sim-control-plane.ts";
import { openNodeStore } from "../local/node-store.ts";
import { sql } from "drizzle-orm";
import { rows, type RoundTripHook } from "../core/store/database.ts";

export { ChaosPlan, createSimSchema, inSchema, type ChaosBoundary } from "./metal-sim-control-plane.ts";
export { selfSignedCertificate, type SelfSignedCertificate } from "./tls.ts";

export const SIM_BMC_USER = "admin";
export const SIM_BMC_PASSWORD = "sim-bmc-password";

/**
 * An operating system that runs no bcd (Talos...): started each time the machine boots it,
 * stopped when the machine powers off or restarts.
 */
export interface AgentlessOs {
  start(machine: SimMachine): Promise<{ stop(): Promise<void> }>;
}

export interface InstallMedia {
  machine: SimMachine;
  /** The image URL the BMC mounted. */
  image: string;
}

/** A running control plane to drive instead of the in-process one (e.g. startStack's). */
export interface SimStack {
  url: string;
  adminKey: string;
  databaseUrl: string;
  databaseStats?: { roundTrips: number };
}

export interface MetalSimOptions {
  /** Extra modules and third-party plugins, registered the way a deployment's config would (in process only). */
  modules?: Module[];
  /** Drive this running stack (its config registers the modules) instead of an in-process control plane. */
  stack?: SimStack;
  /**
   * Accepts a mounted CD image as an installer: returns the provisioned join token it carries (the
   * installed system runs bcd and joins as role node), or an agentless system to run instead.
   */
  install?: (media: InstallMedia) => InstallResult | undefined | Promise<InstallResult | undefined>;
  /** The pool's agent: "none" makes an agentless pool (no ramdisk; allowUnverifiedRelease is then set). */
  agent?: "bcd" | "none";
  /** The pool's policy.provisioningCidrs (plain HTTP allowed to machines there). */
  provisioningCidrs?: string[];
  /** Each machine's IP addresses as its BMC reports them (Redfish EthernetInterfaces); default none. */
  machineAddresses?: (index: number) => string[];
  /** Simulated machines behind the emulated BMCs; default 1. */
  machines?: number;
  faults?: RedfishFaults;
  /** RAID-capable drives behind each machine's BMC (Redfish Storage); default none. */
  drives?: number;
  hardwareProfiles?: Record<string, HardwareProfile>;
  /** The pool's hardware profile; default redfish-pxe. */
  hardwareProfile?: string;
  allowUnverifiedRelease?: boolean;
  /** Site and pool ids; default sim-site and sim-site-pool (a stack shared by tests wants its own). */
  siteId?: string;
  /** Join the site's agent at creation; default true (false: a site whose agent comes later, see joinSiteAgent). */
  joinSiteAgent?: boolean;
  /**
   * The site's agent runs outside the sim (a real `bcd --role site` process, joined to the stack,
   * serving network boot): the sim joins none of its own, and its machines' PXE firmware asks that
   * agent's network boot (see siteAgentFromStateDir).
   */
  siteAgent?: ExternalSiteAgent;
  /** TEST HOOK (in process only): crash the workflow runner and the reconcilers at a transaction boundary (see ChaosPlan). */
  chaos?: ChaosPlan;
  /** The deployment's pki options (in process only), e.g. approvers for quorum (docs/quorum.md). */
  pki?: PkiOptions;
  /** A real Postgres for the in-process control plane instead of the embedded PGlite (a schema of its own, dropped at stop). */
  databaseUrl?: string;
  /**
   * With databaseUrl: this schema (createSimSchema), shared with other sims, instead of one of its
   * own; left in place at stop. Each sim then needs its own siteId, and its own node ids.
   */
  databaseSchema?: string;
  /** BENCH HOOK (with databaseUrl): every round trip of the control plane, with its duration (core/store/database.ts). */
  onRoundTrip?: RoundTripHook;
}

export type InstallResult = { token: string } | { os: AgentlessOs };

/** A site agent running outside the sim (a real bcd, started with --netboot-address and --ramdisk-dir simRamdiskDir()). */
export interface ExternalSiteAgent {
  nodeId: string;
  /** Its netboot state directory (<state-dir>/netboot) and its HTTP server's URL: what the sim's PXE firmware asks. */
  netboot: { stateDir: string; baseUrl: string };
}

/**
 * A stand-in for the ramdisk build a site agent serves (npm run ramdisk-image's manifest naming a
 * kernel and an initrd of a few bytes): SIMULATED machines never boot it, they only need a site
 * that will answer them. The caller removes the directory.
 */
export async function simRamdiskDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "bc-sim-ramdisk-"));
  await writeFile(path.join(dir, "vmlinuz"), "SIMULATED kernel\n");
  await writeFile(path.join(dir, "initrd.zst"), "SIMULATED initrd\n");
  await writeFile(path.join(dir, "manifest.json"), JSON.stringify({ kernel: { file: "vmlinuz" }, initrd: { file: "initrd.zst" } }));
  return dir;
}

/**
 * A joined bcd site agent, from its state dir (FileState's identity.json) and the URL its network
 * boot serves at (its --netboot-address and --netboot-port); throws if it has not joined.
 */
export async function siteAgentFromStateDir(dir: string, netbootBaseUrl: string): Promise<ExternalSiteAgent> {
  // Read the files, not through FileState: that would open the journal bcd is appending to.
  const files = new FileState(dir);
  const read = async <T>(file: string): Promise<T | undefined> => {
    try {
      return JSON.parse(await readFile(file, "utf8")) as T;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
  };
  const identity = await read<AgentIdentity>(files.identityFile);
  if (!identity) throw new Error(`${dir} holds no joined agent (no identity.json)`);
  if (identity.role !== "site") throw new Error(`the agent in ${dir} is a ${identity.role} agent, not a site agent`);
  return { nodeId: identity.nodeId, netboot: { stateDir: path.join(dir, "netboot"), baseUrl: netbootBaseUrl } };
}

/** Waits for bcd to have joined (its identity in the state dir) and connected; answers its identity. */
export async function joinedSiteAgent(
  stateDir: string,
  netbootUrl: string,
  bcd: { exitCode: number | null },
  call: <T>(method: string, input?: Record<string, unknown>) => Promise<T>,
): Promise<ExternalSiteAgent> {
  const deadline = Date.now() + 60_000;
  let agent: ExternalSiteAgent | undefined;
  for (;;) {
    if (bcd.exitCode !== null) throw new Error(`the site agent (bcd) exited with ${bcd.exitCode} before it connected; its lines are above`);
    if (!agent && existsSync(path.join(stateDir, "identity.json"))) agent = await siteAgentFromStateDir(stateDir, netbootUrl);
    if (agent && (await call<{ state: string }>("nodes.get", { node: agent.nodeId })).state === "connected") return agent;
    if (Date.now() > deadline) throw new Error("the site agent (bcd) did not connect within 60 s; its lines are above");
    await new Promise((r) => setTimeout(r, 200));
  }
}

export interface SimMachine {
  /** The emulator's system id. */
  id: string;
  uuid: string;
  /** Its BMC address for metal.enroll: .../redfish/v1/Systems/<id>. */
  address: string;
  bmc: MachineState;
  disks: SimulatedDisks;
  /** Its IP addresses (what its BMC reports). */
  addresses: string[];
  /** Its NIC's MAC (lower case): what the site's network boot knows it by. */
  macs: string[];
  /** What is installed on its disk: an OS whose agent joins with the token it was installed with, or an agentless one. */
  os: { state: MemoryState; token: string; joined: boolean } | { agentless: AgentlessOs } | undefined;
  /** What it booted, in order ("pxe": its network boot was answered with the ramdisk). */
  boots: ("pxe" | "cd" | "disk" | "nothing")[];
  /** Its ramdisk sends results without the node's signature (a ramdisk that cannot attest). */
  unsignedRamdisk: boolean;
  /** The agent running on it now. */
  agent: AgentClient | undefined;
  /** The agentless system running on it now. */
  running: { stop(): Promise<void> } | undefined;
}

/** A command as an agent's handler received it (secret values are not in the body; they travel beside it). */
export interface SeenCommand {
  nodeId: string;
  role: string;
  kind: string;
  body: Record<string, unknown>;
}

export interface MetalSim {
  control: SimControlPlane;
  store: SimControlPlane["store"];
  bmc: RedfishEmulator;
  machines: SimMachine[];
  site: { id: string; pool: string; readonly agentNodeId: string | undefined };
  /** Joins the site's agent (done at creation unless joinSiteAgent: false; none with an external siteAgent); answers its node id. */
  joinSiteAgent(): Promise<string>;
  /** Every command an agent of the site ran, with its body, in order. */
  commandsSeen: SeenCommand[];
  /** POST /v1/<method> as an admin; throws an Error with .code on a refusal. */
  call<T = Record<string, unknown>>(method: string, input?: Record<string, unknown>): Promise<T>;
  /** Enrolls a machine into the sim's pool (with the right BMC password unless one is given). */
  enroll(machine: SimMachine, opts?: { password?: string; id?: string }): Promise<{ id: string; state: string }>;
  /** Resolves once the metal node is in one of the states; rejects after timeoutMs with where it is. */
  waitForState(nodeId: string, states: string | string[], timeoutMs?: number): Promise<Record<string, unknown>>;
  /** Moves database time forward (compute_now()) and wakes what waits on it. */
  advanceClock(seconds: number): Promise<void>;
  /** Postgres round trips so far (the embedded server's count; 0 when unknown). */
  roundTrips(): number;
  stop(): Promise<void>;
}

export async function createMetalSim(options: MetalSimOptions = {}): Promise<MetalSim> {
  if (options.stack && options.chaos) throw new Error("createMetalSim: a chaos plan needs the in-process control plane");
  if (
    options.stack &&
    (options.modules?.length || options.hardwareProfiles || options.pki || options.databaseUrl || options.databaseSchema)
  ) {
    throw new Error(
      "createMetalSim: modules, hardwareProfiles, pki and databaseUrl belong to the stack's own config when a stack is given",
    );
  }
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  try {
    const control = options.stack ? await stackControlPlane(options.stack) : await inProcessControlPlane(options);
    cleanup.push(() => control.stop());
    return await simulateSite(control, options, cleanup, stop);
  } catch (err) {
    await stop();
    throw err;
  }
}

async function stackControlPlane(stack: SimStack): Promise<SimControlPlane> {
  const store = await openNodeStore(stack.databaseUrl);
  return {
    baseUrl: stack.url,
    transport: nodeTransport(),
    store,
    call: (method, input) => callApi(stack.url, stack.adminKey, method, input),
    callAs: (apiKey, method, input) => callApi(stack.url, apiKey, method, input),
    // The WorkflowDOs see the new time at their next alarm.
    advanceClock: async (seconds) =>
      void (await store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${seconds})`)),
    roundTrips: () => stack.databaseStats?.roundTrips ?? 0,
    stop: () => store.close(),
  };
}

async function simulateSite(
  control: SimControlPlane,
  options: MetalSimOptions,
  cleanup: Array<() => Promise<unknown>>,
  stop: () => Promise<void>,
): Promise<MetalSim> {
  const commandsSeen: SeenCommand[] = [];
  const unsigned = new Set<string>();
  const transport = unsignedResults(control.transport, unsigned);
  let stopped = false;
  cleanup.push(async () => void (stopped = true));

  /** An agent whose handlers record what they were sent. */
  function simAgent(state: MemoryState, role: string, handlers: Record<string, CommandHandler>): AgentClient {
    const client = new AgentClient({
      transport,
      state,
      baseUrl: control.baseUrl,
      labels: { "sim/role": role },
      heartbeatMs: 60_000,
      backoff: { initialMs: 20, maxMs: 500, healthyAfterMs: 1000 },
    });
    for (const [kind, handler] of Object.entries(handlers)) {
      const seen: CommandHandler = (body, ctx) => {
        commandsSeen.push({ nodeId: client.identity?.nodeId ?? "", role, kind, body });
        return handler(body, ctx);
      };
      client.handle(kind, handler.lane ? inLane(handler.lane, seen) : seen);
    }
    return client;
  }

  async function run(agent: AgentClient): Promise<void> {
    void agent.run().catch(() => {});
    await agent.waitConnected(15_000);
  }

  // The site: its agent joins with a site token and drives the BMCs with the real Redfish client.
  const siteId = options.siteId ?? "sim-site";
  const poolId = `${siteId}-pool`;
  await control.call("metal.sites.create", { id: siteId });
  const agentless = options.agent === "none";
  await control.call("metal.pools.create", {
    id: poolId,
    site: siteId,
    agent: options.agent ?? "bcd",
    policy: {
      hardwareProfile: options.hardwareProfile ?? "redfish-pxe",
      allowUnverifiedRelease: options.allowUnverifiedRelease ?? agentless,
      provisioningCidrs: options.provisioningCidrs ?? [],
    },
  });
  let site: ExternalSiteAgent | undefined = options.siteAgent;
  /** The site's network boot, as a machine's PXE firmware sees it: its iPXE script for a MAC, or none. */
  let netbootScript: ((mac: string) => Promise<string | undefined>) | undefined = site && externalNetboot(site.netboot);
  async function joinSiteAgent(): Promise<string> {
    if (site) return site.nodeId;
    const siteState = new MemoryState();
    // The site agent's real network boot service, without DHCP: the machines ask it directly.
    const work = await mkdtemp(path.join(tmpdir(), "bc-sim-netboot-"));
    cleanup.push(() => rm(work, { recursive: true, force: true }));
    const ramdiskDir = await simRamdiskDir();
    cleanup.push(() => rm(ramdiskDir, { recursive: true, force: true }));
    const netboot = new NetbootService({
      stateDir: path.join(work, "netboot"),
      address: "127.0.0.1",
      httpPort: 0,
      ramdiskDir,
      controlPlaneUrl: control.baseUrl,
      images: { dir: path.join(work, "images"), maxBytes: 2 ** 30 },
      // Blobs come from the control plane with the site agent's credential, as bcd fetches them.
      blob: (sha256, signal) =>
        transport.fetch(`${control.baseUrl}${BLOBS_PATH}/${sha256}`, {
          headers: { authorization: `Bearer ${siteAgent.identity?.credential ?? ""}` },
          ...(signal ? { signal } : {}),
        }),
      log: { info() {}, warn() {}, error() {} },
    });
    await netboot.start();
    cleanup.push(() => netboot.stop());
    netbootScript = async (mac) => {
      const machine = netboot.machines.byMac(mac);
      return machine && fetchScript(netboot.scriptUrl(machine));
    };
    const siteAgent = simAgent(siteState, "site", { ...siteHandlers(), ...httpProxyHandlers(), ...netbootHandlers(netboot) });
    const { token } = await control.call<{ token: string }>("siteTokens.create", { site: siteId });
    const identity = await siteAgent.join({ attestor: "join-token", evidence: { token }, role: "site", hostname: `${siteId}-agent` });
    await run(siteAgent);
    cleanup.push(() => siteAgent.stop());
    site = { nodeId: identity.nodeId, netboot: { stateDir: path.join(work, "netboot"), baseUrl: netboot.baseUrl } };
    return site.nodeId;
  }
  if (options.joinSiteAgent !== false) await joinSiteAgent();

  // The machines: power changes boot them, one event after another per machine, as firmware would.
  const machines: SimMachine[] = [];
  const byBmcId = new Map<string, SimMachine>();
  const life = new Map<SimMachine, Promise<void>>();
  const count = options.machines ?? 1;
  const bmc = await startRedfishEmulator({
    // Every machine has a NIC: the site's network boot knows it by its MAC.
    machines: Array.from({ length: count }, (_, i) => ({ nic: true, addresses: options.machineAddresses?.(i) ?? [] })),
    username: SIM_BMC_USER,
    password: SIM_BMC_PASSWORD,
    ...(options.faults ? { faults: options.faults } : {}),
    ...(options.drives ? { drives: options.drives } : {}),
    onPowerChange: (state, _from, to) => {
      const machine = byBmcId.get(state.id);
      if (!machine) return;
      // Read now: a Once override is consumed as soon as this hook returns.
      const target = state.boot.enabled === "Disabled" ? "None" : state.boot.target;
      const media = state.media.inserted ? state.media.image : null;
      const next = (life.get(machine) ?? Promise.resolve())
        .then(() => (to === "On" ? boot(machine, target, media) : powerOff(machine)))
        .catch(
          (err: unknown) => void (stopped || console.warn(`metal-sim: ${machine.id}: ${err instanceof Error ? err.message : String(err)}`)),
        );
      life.set(machine, next);
    },
  });
  cleanup.push(() => bmc.stop());
  for (const state of bmc.machines.values()) {
    const machine: SimMachine = {
      id: state.id,
      uuid: state.uuid,
      address: `${bmc.url}/redfish/v1/Systems/${state.id}`,
      bmc: state,
      addresses: state.addresses,
      macs: [fakeMac(state.id).toLowerCase()],
      disks: simulatedDisks([{ device: "/dev/sda", sizeBytes: 64 * 1024 * 1024 }]),
      os: undefined,
      boots: [],
      unsignedRamdisk: false,
      agent: undefined,
      running: undefined,
    };
    machines.push(machine);
    byBmcId.set(state.id, machine);
  }
  cleanup.push(async () => {
    for (const m of machines) await powerOff(m).catch(() => {});
  });

  async function powerOff(machine: SimMachine): Promise<void> {
    const { agent, running } = machine;
    machine.agent = undefined;
    machine.running = undefined;
    await agent?.stop();
    await running?.stop();
  }

  async function boot(machine: SimMachine, target: string, media: string | null): Promise<void> {
    if (stopped) return;
    await powerOff(machine); // a restart: whatever ran is gone
    if (target === "Pxe") return networkBoot(machine);
    if (target === "Cd" && media) {
      const accepted = await options.install?.({ machine, image: media });
      if (accepted) {
        machine.os = "os" in accepted ? { agentless: accepted.os } : { state: new MemoryState(), token: accepted.token, joined: false };
        return bootOs(machine, "cd");
      }
    }
    if (machine.os) return bootOs(machine, "disk");
    machine.boots.push("nothing");
  }

  /**
   * PXE: what the site answers the machine's MAC. The ramdisk's script boots a ramdisk agent that
   * joins with the token on its kernel command line; `exit` goes on to the disk; no answer boots
   * nothing.
   */
  async function networkBoot(machine: SimMachine): Promise<void> {
    const script = await netbootScript?.(machine.macs[0]!);
    if (script === undefined) return void machine.boots.push("nothing");
    if (/^exit$/m.test(script)) return machine.os ? bootOs(machine, "disk") : void machine.boots.push("nothing");
    const token = /\bbc\.token=(\S+)/.exec(script)?.[1];
    if (!token) return void machine.boots.push("nothing");
    machine.boots.push("pxe");
    const state = new MemoryState();
    const handlers = ramdiskHandlers({ disks: machine.disks, productUuid: machine.uuid, controlPlaneUrl: () => control.baseUrl });
    const wipe = handlers["metal.ramdisk.wipe"]!;
    handlers["metal.ramdisk.wipe"] = async (body, ctx) => {
      const output = await wipe(body, ctx);
      machine.os = undefined; // the installed system is gone with its disk
      return output;
    };
    const write = handlers["metal.ramdisk.writeImage"]!;
    handlers["metal.ramdisk.writeImage"] = async (body, ctx) => {
      const output = await write(body, ctx);
      // An image with a config drive: the installed system's agent joins with the drive's token.
      const meta = [...machine.disks.disks.values()].find((d) => d.configDrive)?.configDrive?.["openstack/latest/meta_data.json"];
      const osToken = meta ? (JSON.parse(meta) as { meta?: Record<string, string> }).meta?.["bc.token"] : undefined;
      machine.os = osToken ? { state: new MemoryState(), token: osToken, joined: false } : undefined;
      return output;
    };
    const agent = simAgent(state, "ramdisk", handlers);
    const identity = await agent.join({
      attestor: "provisioned",
      evidence: { token, productUuid: machine.uuid.toLowerCase() },
      role: "ramdisk",
      hostname: `ramdisk-${machine.id}`,
    });
    if (machine.unsignedRamdisk) unsigned.add(identity.nodeId);
    machine.agent = agent;
    await run(agent);
  }

  async function bootOs(machine: SimMachine, from: "cd" | "disk"): Promise<void> {
    machine.boots.push(from);
    const os = machine.os!;
    if ("agentless" in os) {
      machine.running = await os.agentless.start(machine);
      return;
    }
    const agent = simAgent(os.state, "node", {});
    if (!os.joined) {
      await agent.join({
        attestor: "provisioned",
        evidence: { token: os.token, productUuid: machine.uuid.toLowerCase() },
        role: "node",
        hostname: `host-${machine.id}`,
      });
      os.joined = true;
    }
    machine.agent = agent;
    await run(agent);
  }

  return {
    control,
    store: control.store,
    bmc,
    machines,
    site: {
      id: siteId,
      pool: poolId,
      get agentNodeId() {
        return site?.nodeId;
      },
    },
    joinSiteAgent,
    commandsSeen,
    call: (method, input) => control.call(method, input),
    enroll: (machine, opts = {}) =>
      control.call("metal.enroll", {
        pool: poolId,
        ...(opts.id ? { id: opts.id } : {}),
        bmc: { address: machine.address, username: SIM_BMC_USER, password: opts.password ?? SIM_BMC_PASSWORD },
      }),
    async waitForState(nodeId, states, timeoutMs = 30_000) {
      const wanted = Array.isArray(states) ? states : [states];
      const until = Date.now() + timeoutMs;
      let node: Record<string, unknown> = {};
      while (Date.now() < until) {
        node = await control.call("metal.nodes.get", { node: nodeId });
        if (wanted.includes(node.state as string)) return node;
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(
        `metal node ${nodeId} is ${String(node.state)} after ${timeoutMs} ms, not ${wanted.join(" or ")} (last error: ${JSON.stringify(node.lastError)})`,
      );
    },
    advanceClock: (seconds) => control.advanceClock(seconds),
    roundTrips: () => control.roundTrips(),
    stop,
  };
}

/** An iPXE script as a machine's firmware fetches it. */
async function fetchScript(url: string): Promise<string | undefined> {
  const res = await fetch(url);
  return res.ok ? res.text() : undefined;
}

/** A real bcd's network boot (its netboot state directory and HTTP server), as the sim's PXE firmware asks it. */
function externalNetboot(netboot: { stateDir: string; baseUrl: string }): (mac: string) => Promise<string | undefined> {
  return async (mac) => {
    const listed = await readFile(path.join(netboot.stateDir, "machines.json"), "utf8").catch(() => "[]");
    const wanted = normalMac(mac);
    const machine = (JSON.parse(listed) as NetbootMachine[]).find((m) => wanted !== undefined && m.macs.includes(wanted));
    return machine && fetchScript(`${netboot.baseUrl}/boot/${machine.script}.ipxe`);
  };
}

/** A transition into ready (commissioning, or a release) and the attested wipes its workflow ran. */
export interface IntoReady {
  node_id: string;
  event: string;
  workflow_id: string;
  attested_wipes: number;
}

/**
 * Walkthrough 1's invariant (test/extensions/ubuntu-autoinstall.test.ts, the fleet bench): every
 * transition into ready, of one machine or of all, with its workflow's succeeded disk.wipe steps
 * whose command's result was signed by an attested ramdisk. Exactly one each is the rule.
 */
export async function transitionsIntoReady(store: SimControlPlane["store"], nodeId?: string): Promise<IntoReady[]> {
  return rows<IntoReady>(
    store.db,
    sql`
    SELECT t.node_id, t.event, t.workflow_id,
           (SELECT count(*)::int FROM workflow_steps s JOIN bc_commands c ON c.id = s.command_id
            WHERE s.workflow_id = t.workflow_id AND s.step_id = 'disk.wipe' AND s.state = 'succeeded'
              AND c.attested AND c.signature IS NOT NULL) AS attested_wipes
    FROM metal_transitions t WHERE t.to_state = 'ready' ${nodeId === undefined ? sql`` : sql`AND t.node_id = ${nodeId}`}
    ORDER BY t.id`,
  );
}

/**
 * Destructive commands done twice, in SQL (test/metal/chaos.test.ts checks the same per run):
 * one idempotency key enqueued more than once, or one workflow step position with more than one
 * destructive command an agent received. Answers the offenders (none is the rule).
 */
export async function destructiveTwice(store: SimControlPlane["store"]): Promise<Record<string, unknown>[]> {
  return rows(
    store.db,
    sql`
    SELECT 'key' AS what, idempotency_key AS at, count(*)::int AS n FROM bc_commands
    WHERE destructive AND idempotency_key IS NOT NULL GROUP BY idempotency_key HAVING count(*) > 1
    UNION ALL
    SELECT 'step', s.workflow_id || ':' || s.position, count(*)::int FROM workflow_steps s JOIN bc_commands c ON c.id = s.command_id
    WHERE c.destructive AND c.delivered_at IS NOT NULL GROUP BY s.workflow_id, s.position HAVING count(*) > 1`,
  );
}

/** The agents' transport, except that results of the listed nodes leave without their signature. */
function unsignedResults(inner: AgentTransport, nodes: ReadonlySet<string>): AgentTransport {
  return {
    fetch: inner.fetch,
    async openSocket(url, headers) {
      const socket = await inner.openSocket(url, headers);
      let nodeId: string | undefined;
      const strip: SocketLike = {
        listen: (handlers) =>
          socket.listen({
            message: (text) => {
              if (text.startsWith('{"t":"welcome"')) nodeId = (JSON.parse(text) as { nodeId: string }).nodeId;
              handlers.message(text);
            },
            close: handlers.close,
          }),
        send(text) {
          if (nodeId && nodes.has(nodeId) && text.startsWith('{"t":"result"')) {
            const frame = JSON.parse(text) as Record<string, unknown>;
            delete frame.signature;
            text = JSON.stringify(frame);
          }
          socket.send(text);
        },
        close: (code, reason) => socket.close(code, reason),
        terminate: () => socket.terminate(),
      };
      return strip;
    },
  };
}
