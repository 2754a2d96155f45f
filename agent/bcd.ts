// bcd: the Better Compute agent (Node). Run with `tsx agent/bcd.ts <command> ...`.
//
//   bcd join  --url URL --role site|node|ramdisk --state-dir DIR [--hostname NAME] [--attestor ID] <the attestor's flags>
//   bcd run   --state-dir DIR [--url URL] [--label k=v ...] [--heartbeat SECONDS] [--config FILE]
//             [--runtime-dir DIR] [--access-file FILE] [--firecracker-bin PATH]   (role node)
//   bcd start --url URL [--attestor ID] <its flags> --role ROLE --state-dir DIR [...]   join unless joined, then run
//   bcd install --config FILE   the installer ISO's one job: the image FILE names onto the first disk (agent/roles/install.ts)
//
// A join token (--token TOKEN) may also come from --token-file FILE or the BC_JOIN_TOKEN environment variable
// (a command line is visible to every user of the machine). It is sent once and never
// written to the state directory or the logs. --attestor names what vouches for the machine:
// `join-token` (default; a token minted by an operator), `provisioned` (a token minted for this
// machine by the control plane, e.g. in a VPS instance's user data: it joins as the node the token
// names), `x509pop` (a certificate and its key), `cloud-iid` (the cloud's instance identity), `tpm`.
// agent/attestation/index.ts builds each one's evidence from its flags (docs/attestors.md).
//
// As a node, bcd runs the node role (agent/roles/node.ts): it converges the NodeSpec the control
// plane sends (docs/nodespec.md) with the runtimes this host has, advertises them as drivers in its
// hello, and reports the host's CPUs, memory and the runtime directory's disk.
//
// With --config FILE (TOML), whatever its role, bcd hosts the bcx driver plugins its [plugins]
// section pins (agent/bcx/, docs/bcx.md): each checked against its sha256 and sandboxed, its driver
// advertised in the hello and reachable with the driver.invoke command (and a site's BMC commands).
//
// Exit codes: 0 done (or stopped by SIGINT/SIGTERM), 1 runtime failure, 2 usage.
import { constants, realpathSync } from "node:fs";
import { access, mkdir, statfs } from "node:fs/promises";
import { cpus, hostname as osHostname, totalmem } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { AGENT_VERSION, AgentClient, AgentError, trimBase, type AgentLogger, type CommandHandler } from "./client.ts";
import { FileState, writeAtomic } from "./file-state.ts";
import { nodeCommandHandlers, nodeRole, type NodeRole } from "./roles/node.ts";
import type { RuntimeDriver } from "./runtimes/contract.ts";
import { firecrackerRuntime, qemuMicroVmRuntime, type CrashStep } from "./runtimes/index.ts";
import { ensureGuestImage, GUEST_IMAGE_NAME, type GuestImage } from "./runtimes/microvm/image.ts";
import { BLOBS_PATH, type HelloFrame } from "../core/protocol.ts";
import { httpProxyHandlers } from "./roles/http-proxy.ts";
import { siteHandlers } from "./roles/site.ts";
import { netbootHandlers } from "./roles/netboot/handlers.ts";
import { NETBOOT_FLAGS, NETBOOT_USAGE, NetbootFlagError, netbootFromFlags } from "./roles/netboot/options.ts";
import type { NetbootConfig, NetbootService } from "./roles/netboot/service.ts";
import { blockDevices } from "./roles/block-devices.ts";
import { machineFacts, readProductUuid } from "./roles/machine-facts.ts";
import { ramdiskHandlers } from "./roles/ramdisk.ts";
import { install } from "./roles/install.ts";
import { nodeTransport } from "./node-transport.ts";
import { evidenceProducers, ProducerUsageError } from "./attestation/index.ts";
import type { Role } from "./state.ts";
import { ConfigError, isPrivileged, pluginFileName, readBcdConfig, readPinned, type BcdConfig } from "./bcx/config.ts";
import { checkSandbox, PluginHost } from "./bcx/host.ts";
import { driverInvokeHandlers } from "./bcx/handlers.ts";
import { pluginRuntimes } from "./bcx/plugin-runtime.ts";

const USAGE = `usage:
  bcd join  --url URL --role site|node|ramdisk --state-dir DIR [--hostname NAME] [--attestor ID] <the attestor's flags>
${Object.entries(evidenceProducers)
  .map(([id, p]) => `            --attestor ${id}${id === "join-token" ? " (default)" : ""}: ${p.usage}`)
  .join("\n")}
  bcd run   --state-dir DIR [--url URL] [--label KEY=VALUE ...] [--heartbeat SECONDS]
            [--config FILE]            bcd's configuration (TOML): its [plugins] section pins the bcx driver
                                       plugins it hosts, whatever its role (docs/bcx.md)
            [--runtime-dir DIR]        role node: where guests' work dirs live (default <state-dir>/runtime)
            [--access-file FILE]       role node: the authorized_keys file the NodeSpec's access section owns
            [--firecracker-bin PATH]   role node: the firecracker binary (the firecracker runtime)
${NETBOOT_USAGE}
  bcd start --url URL [--attestor ID] <its flags> --role ROLE --state-dir DIR [run options]   join unless already joined, then run
  bcd install --config FILE    write the image the install config names onto this machine's first disk, with a
                               config drive holding its join token (the installer ISO's bc.mode=install; Linux)
  bcd run|start ... --check    check the options and the state directory, connect nowhere, exit 0 if they would do
  bcd version                  print bcd's and Node's versions
  bcd help`;

const ROLES: readonly Role[] = ["site", "node", "ramdisk"];
/** The drivers built into bcd, which no plugin may shadow (whether or not this host offers them). */
const BUILTIN_DRIVERS = ["redfish", "ipxe", "image-stream", "qemu-microvm", "firecracker"] as const;
/** The attestors bcd makes evidence for. */
const ATTESTORS = Object.keys(evidenceProducers);
/** Every producer's flags, parsed with bcd's own. */
const ATTESTOR_FLAGS = Object.assign({}, ...Object.values(evidenceProducers).map((p) => p.flags)) as Record<string, { type: "string" }>;

class UsageError extends Error {}

/** JSON lines on stderr (stdout is for command output). Fields named like secrets are redacted by the client. */
function stderrLogger(quiet: boolean): AgentLogger {
  const write = (level: string) => (message: string, fields?: Record<string, unknown>) => {
    if (quiet && level === "info") return;
    process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level, message, ...fields })}\n`);
  };
  return { info: write("info"), warn: write("warn"), error: write("error") };
}

/** The built-in command handlers. */
export function builtinHandlers(info: {
  bootId: () => string;
  role: () => Role | undefined;
  version: string;
}): Record<string, CommandHandler> {
  return {
    "agent.ping": () => ({ pong: true, bootId: info.bootId() }),
    "agent.info": () => ({
      hostname: osHostname(),
      version: info.version,
      role: info.role() ?? null,
      bootId: info.bootId(),
      node: process.version,
      platform: process.platform,
      arch: process.arch,
    }),
  };
}

interface Parsed {
  command: string;
  url?: string;
  attestor: string;
  /** Every flag as parsed: the attestor's producer reads its own. */
  flags: Record<string, string | boolean | string[] | undefined>;
  role?: string;
  stateDir?: string;
  hostname?: string;
  labels: Record<string, string>;
  heartbeatMs?: number;
  quiet: boolean;
  /** --check: validate, connect nowhere. */
  check: boolean;
  runtimeDir?: string;
  accessFile?: string;
  firecrackerBin?: string;
  /** install: the install config's file. */
  config?: string;
  /** run, start: bcd's configuration file (--config). */
  configFile?: string;
}

function parse(argv: string[]): Parsed {
  const [command, ...rest] = argv;
  if (!command || command === "help" || command === "--help" || command === "-h") throw new UsageError("");
  if (command === "version" || command === "--version")
    return { command: "version", labels: {}, attestor: "", flags: {}, quiet: true, check: false };
  if (command === "install") return parseInstall(rest);
  if (!["join", "run", "start"].includes(command)) throw new UsageError(`unknown command: ${command}`);
  let values;
  try {
    ({ values } = parseArgs({
      args: rest,
      strict: true,
      allowPositionals: false,
      options: {
        ...ATTESTOR_FLAGS,
        ...NETBOOT_FLAGS,
        url: { type: "string" },
        attestor: { type: "string" },
        role: { type: "string" },
        "state-dir": { type: "string" },
        hostname: { type: "string" },
        label: { type: "string", multiple: true },
        heartbeat: { type: "string" },
        quiet: { type: "boolean" },
        "runtime-dir": { type: "string" },
        "access-file": { type: "string" },
        "firecracker-bin": { type: "string" },
        check: { type: "boolean" },
        config: { type: "string" },
      },
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const labels: Record<string, string> = {};
  for (const l of values.label ?? []) {
    const eq = l.indexOf("=");
    if (eq <= 0) throw new UsageError(`--label wants KEY=VALUE, got ${l}`);
    labels[l.slice(0, eq)] = l.slice(eq + 1);
  }
  let heartbeatMs: number | undefined;
  if (values.heartbeat !== undefined) {
    const s = Number(values.heartbeat);
    if (!Number.isFinite(s) || s <= 0) throw new UsageError(`--heartbeat wants seconds, got ${values.heartbeat}`);
    heartbeatMs = s * 1000;
  }
  const attestor = values.attestor ?? "join-token";
  if (!ATTESTORS.includes(attestor)) throw new UsageError(`--attestor wants ${ATTESTORS.join("|")}, got ${attestor}`);
  const p: Parsed = { command, labels, attestor, flags: values, quiet: values.quiet ?? false, check: values.check ?? false };
  if (p.check && command === "join") throw new UsageError("--check is for run and start");
  if (values.config !== undefined && command === "join") throw new UsageError("--config is for run and start");
  if (values.config !== undefined) p.configFile = values.config;
  if (values.url !== undefined) p.url = values.url;
  if (values.role !== undefined) p.role = values.role;
  if (values["state-dir"] !== undefined) p.stateDir = values["state-dir"];
  if (values.hostname !== undefined) p.hostname = values.hostname;
  if (heartbeatMs !== undefined) p.heartbeatMs = heartbeatMs;
  if (values["runtime-dir"] !== undefined) p.runtimeDir = values["runtime-dir"];
  if (values["access-file"] !== undefined) p.accessFile = values["access-file"];
  if (values["firecracker-bin"] !== undefined) p.firecrackerBin = values["firecracker-bin"];
  if (!p.stateDir) throw new UsageError("--state-dir is required");
  if (p.url === "") throw new UsageError("--url is empty: give the control plane's URL (https://…)");
  if (p.url !== undefined && !/^https?:\/\//i.test(p.url)) throw new UsageError(`--url must be http:// or https://, got ${p.url}`);
  return p;
}

function parseInstall(args: string[]): Parsed {
  let values;
  try {
    ({ values } = parseArgs({ args, strict: true, allowPositionals: false, options: { config: { type: "string" } } }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (!values.config) throw new UsageError("install needs --config FILE");
  return { command: "install", config: values.config, labels: {}, attestor: "", flags: values, quiet: false, check: false };
}

interface JoinArgs {
  url: string;
  role: Role;
  attestor: string;
}

/** What a node host runs guests with, from bcd's flags. */
export interface NodeRuntimeOptions {
  /** Guests' work dirs live under it. */
  runtimeDir: string;
  /** The firecracker binary (--firecracker-bin): the firecracker runtime is offered only with it. */
  firecrackerBin?: string;
  log: AgentLogger;
}

/**
 * The runtime drivers of this host, advertised in the hello (labels bc.dev/driver.<id>) and used
 * by the node role: qemu-microvm when QEMU is installed, firecracker when --firecracker-bin names
 * its binary (or testing/firecracker-fake). Its guest image (docs/guest-image.md) is
 * built or found in the cache on first use, once per process; the runtime probes KVM then, and
 * falls back to TCG (docs/runtimes.md).
 */
export async function nodeRuntimes(opts: NodeRuntimeOptions): Promise<RuntimeDriver[]> {
  const runtimes: RuntimeDriver[] = [];
  let image: Promise<GuestImage> | undefined;
  const images = async (name: string) => {
    if (name !== GUEST_IMAGE_NAME) return undefined;
    image ??= ensureGuestImage({ log: (message) => opts.log.info(message, {}) }).catch((e: unknown) => {
      image = undefined; // a later apply tries again (apt lists refreshed, a mirror back)
      throw e;
    });
    return image;
  };
  const crashPoint = testCrashPoint(opts.log);
  if (await onPath("qemu-system-x86_64"))
    runtimes.push(qemuMicroVmRuntime({ root: path.join(opts.runtimeDir, "qemu-microvm"), images, log: opts.log, crashPoint }));
  else opts.log.warn("qemu-system-x86_64 is not installed: this host offers no qemu-microvm runtime", {});
  if (opts.firecrackerBin)
    runtimes.push(
      firecrackerRuntime({
        root: path.join(opts.runtimeDir, "firecracker"),
        images,
        log: opts.log,
        crashPoint,
        firecracker: { binary: [path.resolve(opts.firecrackerBin)] },
      }),
    );
  return runtimes;
}

/**
 * A TEST HOOK that does nothing unless BC_TEST_CRASH_AT is set: it names a runtime step (a
 * CrashStep, e.g. "netns"; "<step>:<n>" for its n-th time in this process) at which bcd SIGKILLs
 * itself, so test/node/bcd-node-chaos.test.ts can kill the real agent at every step of create,
 * stop and delete.
 */
function testCrashPoint(log: AgentLogger): ((step: CrashStep) => void) | undefined {
  const at = process.env.BC_TEST_CRASH_AT;
  if (!at) return undefined;
  const [want, nth = "1"] = at.split(":");
  log.warn("BC_TEST_CRASH_AT is set: this bcd kills itself at that runtime step (a test hook)", { at });
  let seen = 0;
  return (step) => {
    if (step === want && ++seen === Number(nth)) process.kill(process.pid, "SIGKILL");
  };
}

/** Whether an executable of this name is on PATH. */
async function onPath(program: string): Promise<boolean> {
  for (const dir of (process.env.PATH ?? "").split(path.delimiter).filter(Boolean)) {
    try {
      await access(path.join(dir, program), constants.X_OK);
      return true;
    } catch {
      // not here
    }
  }
  return false;
}

/** What the host has, for the hello: its CPUs, memory, and the size of the runtime directory's file system. */
async function hostResources(runtimeDir: string): Promise<NonNullable<HelloFrame["resources"]>> {
  const fs = await statfs(runtimeDir);
  return {
    cpus: cpus().length,
    memoryMiB: Math.floor(totalmem() / 2 ** 20),
    diskGiB: Math.floor((fs.blocks * fs.bsize) / 2 ** 30),
    devices: [],
  };
}

/**
 * `--check`: what `run` or `start` would need before it connects (a usable state directory; an
 * identity to run with, or the URL and role to join with), checked without connecting. A systemd
 * unit runs it as ExecStartPre, so a bad configuration fails with one line in the journal.
 */
async function check(p: Parsed, state: FileState, config: BcdConfig): Promise<number> {
  const problem = await checkPlugins(config);
  if (problem) {
    process.stderr.write(`bcd: ${problem}\n`);
    return 2;
  }
  if (config.plugins) process.stdout.write(`bcd: plugins OK: ${config.plugins.pins.length} pinned, each file's sha256 checked\n`);
  try {
    await mkdir(p.stateDir!, { recursive: true, mode: 0o700 });
    await access(p.stateDir!, constants.W_OK);
  } catch (e) {
    process.stderr.write(`bcd: the state directory ${p.stateDir} is not usable: ${(e as Error).message}\n`);
    return 1;
  }
  try {
    netbootService(p, p.url ?? "", stderrLogger(true), undefined);
  } catch (e) {
    process.stderr.write(`bcd: ${(e as Error).message}\n`);
    return 2;
  }
  const identity = await state.loadIdentity();
  if (identity) {
    process.stdout.write(`bcd: configuration OK: joined as ${identity.nodeId} (${identity.role})\n`);
    return 0;
  }
  if (p.command === "run") {
    process.stderr.write(`bcd: ${p.stateDir} holds no identity: join first (bcd join or bcd start)\n`);
    return 1;
  }
  try {
    const join = joinArgs(p);
    process.stdout.write(`bcd: configuration OK: not joined yet; will join ${join.url} as ${join.role} (${join.attestor})\n`);
    return 0;
  } catch (e) {
    process.stderr.write(`bcd: ${(e as Error).message}\n`);
    return 2;
  }
}

/** What would keep a pinned plugin from running (a file whose bytes differ, no sandbox), or undefined. */
async function checkPlugins(config: BcdConfig): Promise<string | undefined> {
  const plugins = config.plugins;
  if (!plugins) return undefined;
  for (const pin of plugins.pins) {
    try {
      await readPinned(pin);
    } catch (e) {
      return `bcx plugin ${pluginFileName(pin)}: ${(e as Error).message}`;
    }
  }
  if (plugins.pins.some((pin) => !isPrivileged(plugins, pin))) {
    const sandbox = await checkSandbox(plugins);
    if (sandbox) return `the bcx plugin sandbox is not available, and every plugin not named under privileged needs it: ${sandbox}`;
  }
  return undefined;
}

/** `bcd install`: this machine's block devices, its product UUID, progress on stdout; 1 when it fails. */
async function runInstall(configFile: string): Promise<number> {
  if (process.platform !== "linux") {
    process.stderr.write("bcd: install writes this machine's block devices: Linux only\n");
    return 1;
  }
  try {
    const productUuid = await readProductUuid();
    await install(configFile, {
      disks: blockDevices(),
      ...(productUuid ? { productUuid } : {}),
      print: (line) => process.stdout.write(`bcd install: ${line}\n`),
    });
    return 0;
  } catch (e) {
    writeFailure("install failed", e);
    return 1;
  }
}

/** A command's failure on stderr: an AgentError's code and message (never a secret: its messages name none). */
function writeFailure(what: string, e: unknown): void {
  if (e instanceof AgentError) process.stderr.write(`bcd: ${what}: ${e.code}: ${e.message}${e.status ? ` (HTTP ${e.status})` : ""}\n`);
  else process.stderr.write(`bcd: ${what}: ${(e as Error).message ?? String(e)}\n`);
}

/** The network boot service the flags ask for (a usage error when they cannot work), or undefined. */
function netbootService(p: Parsed, url: string, log: AgentLogger, blob: NetbootConfig["blob"]): NetbootService | undefined {
  try {
    return netbootFromFlags(p.flags, { url, stateDir: p.stateDir!, log, blob });
  } catch (e) {
    if (e instanceof NetbootFlagError) throw new UsageError(e.message);
    throw e;
  }
}

function joinArgs(p: Parsed): JoinArgs {
  if (!p.url) throw new UsageError(`${p.command} needs --url`);
  if (!p.role || !ROLES.includes(p.role as Role)) throw new UsageError(`${p.command} needs --role ${ROLES.join("|")}`);
  return { url: p.url, role: p.role as Role, attestor: p.attestor };
}

export async function main(argv: string[]): Promise<number> {
  let p: Parsed;
  try {
    p = parse(argv);
  } catch (e) {
    if (e instanceof UsageError) {
      if (e.message) process.stderr.write(`bcd: ${e.message}\n`);
      process.stderr.write(`${USAGE}\n`);
      return e.message ? 2 : argv.length ? 0 : 2;
    }
    throw e;
  }
  if (p.command === "version") {
    process.stdout.write(`bcd ${AGENT_VERSION} (node ${process.version})\n`);
    return 0;
  }
  if (p.command === "install") return runInstall(p.config!);
  let config: BcdConfig = {};
  try {
    if (p.configFile) config = await readBcdConfig(p.configFile);
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    process.stderr.write(`bcd: --config ${e.message}\n`);
    return 2;
  }
  const state = new FileState(p.stateDir!);
  if (p.check) return check(p, state, config);
  const log = stderrLogger(p.quiet);
  let client: AgentClient | undefined;
  let netboot: NetbootService | undefined;
  let plugins: PluginHost | undefined;
  const bootId = crypto.randomUUID();
  try {
    let join: JoinArgs | undefined;
    if (p.command === "join") join = joinArgs(p);
    if (p.command === "start" && !(await state.loadIdentity())) join = joinArgs(p);

    // The bcx plugins the configuration pins, whatever the role; a plugin that fails never stops bcd.
    if (p.command !== "join" && config.plugins?.pins.length)
      plugins = await PluginHost.start(config.plugins, { log, builtinDrivers: BUILTIN_DRIVERS });

    // A node host: its runtimes (hosted runtime plugins among them) and resources go into every hello.
    const role = join?.role ?? (await state.loadIdentity())?.role;
    let host: { runtimes: RuntimeDriver[]; resources: NonNullable<HelloFrame["resources"]> } | undefined;
    if (p.command !== "join" && role === "node") {
      const runtimeDir = path.resolve(p.runtimeDir ?? path.join(p.stateDir!, "runtime"));
      await mkdir(runtimeDir, { recursive: true, mode: 0o700 });
      const runtimes = [
        ...(await nodeRuntimes({ runtimeDir, log, ...(p.firecrackerBin ? { firecrackerBin: p.firecrackerBin } : {}) })),
        ...(plugins ? pluginRuntimes(plugins, BUILTIN_DRIVERS) : []),
      ];
      host = { runtimes, resources: await hostResources(runtimeDir) };
    }

    const transport = nodeTransport();
    client = new AgentClient({
      transport,
      state,
      ...(p.url !== undefined ? { baseUrl: p.url } : {}),
      labels: p.labels,
      version: AGENT_VERSION,
      bootId,
      logger: log,
      ...(p.heartbeatMs !== undefined ? { heartbeatMs: p.heartbeatMs } : {}),
      // Asked at every hello: a plugin that comes up later is advertised from the next connection.
      drivers: () => {
        // The host's runtimes, runtime plugins among them: one that was not up when the node role took
        // its runtimes serves no instance, so it is not advertised (the next bcd start takes it).
        const runtimes = (host?.runtimes ?? []).map((r) => ({ id: r.id, version: r.version }));
        const hosted = (plugins?.drivers() ?? []).filter((d) => !d.kinds.includes("runtime"));
        return [...runtimes, ...hosted.map((d) => ({ id: d.id, version: d.version }))];
      },
      ...(host ? { resources: host.resources } : {}),
    });
    const c = client;
    for (const [kind, h] of Object.entries(
      builtinHandlers({ bootId: () => c.bootId, role: () => c.identity?.role, version: AGENT_VERSION }),
    ))
      c.handle(kind, h);

    if (join) {
      // The evidence is sent once: never saved, never logged.
      const evidence = await evidenceProducers[join.attestor]!.produce({
        command: p.command,
        url: join.url,
        role: join.role,
        publicKey: () => c.publicKey(),
        flags: p.flags,
        env: process.env,
        fetch: globalThis.fetch,
      });
      const identity = await client.join({
        baseUrl: join.url,
        attestor: join.attestor,
        evidence,
        role: join.role,
        hostname: p.hostname ?? osHostname(),
      });
      process.stdout.write(`joined as ${identity.nodeId} (${identity.role}); credential valid until ${identity.expiresAt}\n`);
      if (p.command === "join") return 0;
    }

    // The role's own command kinds. A ramdisk's disks are this machine's block devices (Linux
    // only; the simulated ramdisk is in better-compute/testing/metal).
    const joined = await state.loadIdentity();
    const joinedRole = joined?.role;
    if (plugins) for (const [kind, h] of Object.entries(driverInvokeHandlers(plugins))) c.handle(kind, h);
    if (joinedRole === "site")
      for (const [kind, h] of Object.entries({ ...siteHandlers({ log, ...(plugins ? { hosted: plugins } : {}) }), ...httpProxyHandlers() }))
        c.handle(kind, h);
    // The site boots its machines itself when told where (docs/netboot.md).
    // Blobs (ISOs rendered per machine) come from the control plane with this agent's own credential.
    const blob = (sha256: string, signal?: AbortSignal) =>
      transport.fetch(`${trimBase(c.identity?.baseUrl ?? p.url ?? "")}${BLOBS_PATH}/${sha256}`, {
        headers: { authorization: `Bearer ${c.identity?.credential ?? ""}` },
        ...(signal ? { signal } : {}),
      });
    netboot = netbootService(p, joined?.baseUrl ?? p.url ?? "", log, blob);
    if (netboot && joinedRole !== "site") throw new UsageError("the --netboot-* flags are for role site");
    if (netboot) {
      await netboot.start();
      for (const [kind, h] of Object.entries(netbootHandlers(netboot))) c.handle(kind, h);
    }
    if (joinedRole === "ramdisk" && process.platform === "linux") {
      const productUuid = await readProductUuid();
      const handlers = ramdiskHandlers({
        disks: blockDevices(),
        machine: () => machineFacts(),
        controlPlaneUrl: () => c.identity?.baseUrl,
        ...(productUuid ? { productUuid } : {}),
      });
      for (const [kind, h] of Object.entries(handlers)) c.handle(kind, h);
    } else if (joinedRole === "ramdisk") log.warn("the ramdisk role needs Linux block devices: its commands are not handled here", {});

    let converger: NodeRole | undefined;
    if (host) {
      const node = nodeRole({
        state,
        runtimes: host.runtimes,
        log,
        report: (status) => c.sendStatus(status),
        ...(p.accessFile ? { accessFile: { path: path.resolve(p.accessFile), write: writeAtomic } } : {}),
      });
      c.onSpec((spec) => void node.onSpec(spec));
      for (const [kind, h] of Object.entries(nodeCommandHandlers(host.runtimes))) c.handle(kind, h);
      // Converges the spec saved before a restart now, whether or not the control plane answers.
      await node.start();
      converger = node;
    }

    let signals = 0;
    const onSignal = (sig: NodeJS.Signals) => {
      if (++signals > 1) {
        process.stderr.write(`bcd: ${sig} again, exiting now\n`);
        process.exit(1);
      }
      log.info("stopping", { signal: sig });
      void converger?.stop();
      void c.stop();
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
    try {
      await client.run();
    } finally {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      await converger?.stop();
      await netboot?.stop();
      // The guests keep running: the next bcd adopts them.
      await Promise.all((host?.runtimes ?? []).map((r) => r.close()));
    }
    log.info("stopped", {});
    return 0;
  } catch (e) {
    if (e instanceof UsageError || e instanceof ProducerUsageError) {
      process.stderr.write(`bcd: ${e.message}\n${USAGE}\n`);
      return 2;
    }
    const what = p.command === "join" || (p.command === "start" && !client?.identity) ? "join failed" : `${p.command} failed`;
    writeFailure(what, e);
    return 1;
  } finally {
    await plugins?.close().catch(() => {});
    await state.close().catch(() => {});
  }
}

// Run when executed directly (tsx agent/bcd.ts ...), not when imported.
if (isEntry()) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (e: unknown) => {
      process.stderr.write(`bcd: ${(e as Error).stack ?? String(e)}\n`);
      process.exit(1);
    },
  );
}

function isEntry(): boolean {
  try {
    return !!process.argv[1] && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}
