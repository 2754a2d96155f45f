// An IPMI 2.0 BMC (RMCP+, `ipmitool -I lanplus`) for QEMU machines: OpenIPMI's ipmi_sim, one
// process per machine (a LAN channel of ipmi_sim reaches one BMC, whose chassis is one machine;
// and every server has its own BMC), configured from files generated in a work directory
// (../shared/IPMI.md has the spike behind every choice). ipmi_sim is the real protocol (sessions,
// RAKP authentication, cipher suites, SDR, FRU, SEL, SOL); what it does to the machine goes
// through this Node process, which owns the QemuMachine objects:
//
//   ipmitool ─UDP─► ipmi_sim ─popen─► chassis-control (sh + socat) ─unix─► chassisControl() ─► QemuMachine
//                      │                                                 answers at once, acts after
//                      └─ sol "tcp:127.0.0.1:<p>" ─TCP─► the SOL server ◄─► its console (QEMU's stdout / stdin)
//
// ipmi_sim popen()s its chassis_control synchronously (the whole BMC waits) and ipmitool
// retransmits (ipmi_sim then runs the script again), so each request is answered before any slow
// work: power on, off, reset and the boot device are done after the answer, in the order asked
// (QemuMachine queues them), and `get power` answers what was last asked while that is under way.
//
// With `netns`, each ipmi_sim runs inside that namespace at 127.0.0.1:<port> (the emulated site's
// site agent lives there; IPMI is UDP, which the namespace's unix-socket TCP relays cannot carry),
// and its SOL connection reaches this process through a socat inside (TCP there, a unix socket
// here). The chassis-control socket is a path, which crosses namespaces as it is.
//
// Boot device semantics: ipmi_sim hands chassis_control the device only (it drops the persistent
// and EFI flags of Set System Boot Options), so every `chassis bootdev` here is for the next boot
// only (IPMI's default, a Once override of the machine); `options=persistent` acts as Once too.
// `bootdev none` clears the override; `bootdev bios` (setup) is refused.
//
// The password is written only to lan.conf (mode 600, in a 700 directory), never to an argv.
// stop() kills every process started, closes every socket and removes the work directory; an
// exit of this process kills the processes too, and a run killed outright (SIGKILL) leaves what
// the next start removes (the directory is named for the pid that made it).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import dgram from "node:dgram";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Netns } from "./netns.ts";
import type { QemuBootTarget, QemuMachine } from "./qemu-machine.ts";

export interface IpmiBmcMachine {
  machine: QemuMachine;
  /** Its name in address() (default the machine's name). */
  id?: string;
  /** Its UDP port on 127.0.0.1 (default: a free one). */
  port?: number;
}

export interface IpmiBmcOptions {
  machines: Array<QemuMachine | IpmiBmcMachine>;
  /** The one administrator account (IPMI user 2); at most 16 characters. */
  user: string;
  /** At most 20 characters (IPMI 2.0), printable ASCII without `"` or `\` (lan.conf has no escapes). */
  password: string;
  /** Where the BMCs' own directory is made (removed at stop); default the system's temp directory. */
  workDir?: string;
  /** Run the BMCs inside this namespace (its 127.0.0.1); default this host's loopback. */
  netns?: Netns;
  /** ipmi_sim's complaints and failed background operations; default stderr. */
  log?: (line: string) => void;
}

export interface IpmiBmc {
  /** The machines' ids, in the order given. */
  ids: string[];
  /** `127.0.0.1:<port>` of a machine's BMC (inside the namespace, with netns). */
  address(id: string): string;
  port(id: string): number;
  /** The BMC's own files (lan.conf, bmc.emu, fru.bin, state/): for reading, not changing. */
  dir: string;
  stop(): Promise<void>;
}

/** SDRs (sdrcomp's text format): the BMC's management controller and one temperature sensor, as upstream's ipmisim1.sdrs. */
const SDRS = `
sdr type 18
  device_slave_address 0x20
  device_channel_number 0
  chassis true
  ipmb_event_gen false
  ipmb_event_recv false
  fru_inventory true
  sel true
  sdr true
  sensor true
  entity_id system_board
  entity_instance 1
  id_string "BMC"
endsdr
sdr type 1
  sensor_owner_id 0x20
  sensor_owner_lun 0
  channel_number 0
  sensor_number 1
  entity_id system_board
  entity_instance 1
  sensor_type Temperature
  init_scanning true
  init_sensor_type true
  default_sensor_scan_on true
  event_reading_type_code 1
  analog_data_format unsigned
  rate_unit none
  modifier_unit none
  percentage false
  base_unit degrees_C
  modifier_unit_code unspecified
  linearization linear
  m 1
  tolerance 0
  b 0
  accuracy 1
  accuracy_exp 0
  sensor_direction input
  r_exp 0
  b_exp 0
  sensor_maximum 255
  sensor_minimum 0
  id_string "MB Temp"
endsdr
`;

/** The temperature the sensor reads (°C): constant, nothing here heats up. */
const TEMPERATURE = 40;

const CHASSIS_CONTROL = `#!/bin/sh
# ipmi_sim's chassis_control, popen()ed synchronously: "<socket> get power", "<socket> set boot pxe"...
# go to the Node process that owns the machine, which answers at once (testing/ipmi-bmc.ts).
sock=$1
shift
out=$(printf '%s\\n' "$*" | socat -t 5 -T 5 - "UNIX-CONNECT:$sock") || exit 1
case $out in
error:*) printf '%s\\n' "$out" >&2; exit 1 ;;
esac
printf '%s\\n' "$out"
`;

/** ipmi_sim's boot names (bmc_chassis.c's boot_map) and the machine's override targets; `default` is ipmitool's `disk`. */
const BOOT_FROM_IPMI: Record<string, QemuBootTarget> = { none: "None", pxe: "Pxe", default: "Hdd", cdrom: "Cd" };
const BOOT_TO_IPMI: Record<QemuBootTarget, string> = { None: "none", Pxe: "pxe", Hdd: "default", Cd: "cdrom" };

/** What BMCs not stopped yet started and made: killed and removed at this process's exit. */
const live = { processes: new Set<ChildProcess>(), dirs: new Set<string>() };
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const c of live.processes) killGroup(c, "SIGKILL");
    for (const d of live.dirs) rmSync(d, { recursive: true, force: true });
  });
}

export async function startIpmiBmc(options: IpmiBmcOptions): Promise<IpmiBmc> {
  const { user, password, netns } = options;
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  if (!/^[\x21-\x7e]{1,16}$/.test(user) || /["\\]/.test(user))
    throw new Error("the IPMI user must be 1-16 printable ASCII characters, no quotes");
  if (!/^[\x20-\x7e]{1,20}$/.test(password) || /["\\]/.test(password))
    throw new Error('the IPMI password must be 1-20 printable ASCII characters, without " or \\');
  const machines = options.machines.map((m) => ("machine" in m ? m : { machine: m }));
  const ids = machines.map((m) => m.id ?? m.machine.name);
  if (new Set(ids).size !== ids.length) throw new Error(`machine ids must be unique: ${ids.join(", ")}`);
  for (const id of ids)
    if (!/^[A-Za-z0-9_.-]{1,32}$/.test(id)) throw new Error(`machine id ${JSON.stringify(id)}: letters, digits, _ . - only`);

  const parent = path.resolve(options.workDir ?? tmpdir());
  // ipmi_sim's chassis_control is a command line, and a unix socket path has at most 107 bytes.
  if (!/^[\w/.-]+$/.test(parent) || parent.length > 50)
    throw new Error(`the IPMI BMC's work directory ${parent} must be a short path of letters, digits, _ . - /`);
  removeLeftovers(parent);
  // Named for this process, so a later run can tell a killed run's leftovers; mode 700.
  const dir = mkdtempSync(path.join(parent, `bc-ipmi-${process.pid}-`));
  live.dirs.add(dir);
  installExitHook();
  const run: Running = { children: [], servers: [], sockets: new Set(), stopped: false };
  const ports = new Map<string, number>();

  const stop = async () => {
    if (run.stopped) return;
    run.stopped = true;
    await Promise.all(run.children.map((c) => endProcess(c)));
    for (const s of run.sockets) s.destroy();
    await Promise.all(run.servers.map((s) => new Promise((resolve) => s.close(resolve))));
    rmSync(dir, { recursive: true, force: true });
    live.dirs.delete(dir);
  };

  try {
    const script = path.join(dir, "chassis-control");
    writeFileSync(script, CHASSIS_CONTROL, { mode: 0o700 });
    writeFileSync(path.join(dir, "bmc.sdrs"), SDRS);
    execFileSync("sdrcomp", ["-o", path.join(dir, "sdr.bin"), path.join(dir, "bmc.sdrs")], { stdio: "pipe" });
    for (const [i, { machine, port }] of machines.entries()) {
      const id = ids[i]!;
      const at = { id, dir: path.join(dir, id), sdrs: path.join(dir, "sdr.bin"), script, user, password };
      ports.set(id, await startMachineBmc(run, machine, at, port, netns, (line) => log(`ipmi bmc ${id}: ${line}`)));
    }
  } catch (e) {
    await stop();
    throw e;
  }

  const portOf = (id: string) => {
    const p = ports.get(id);
    if (p === undefined) throw new Error(`no IPMI BMC for machine ${JSON.stringify(id)} (have ${ids.join(", ")})`);
    return p;
  };
  return { ids, dir, port: portOf, address: (id) => `127.0.0.1:${portOf(id)}`, stop };
}

/** What a started BMC has running: stopped and closed at stop(). */
interface Running {
  children: ChildProcess[];
  servers: net.Server[];
  sockets: Set<net.Socket>;
  stopped: boolean;
}

/** One machine's BMC: its files, its chassis control and SOL servers, then its ipmi_sim; answers its UDP port. */
async function startMachineBmc(
  run: Running,
  machine: QemuMachine,
  at: { id: string; dir: string; sdrs: string; script: string; user: string; password: string },
  port: number | undefined,
  netns: Netns | undefined,
  log: (line: string) => void,
): Promise<number> {
  const { id, dir } = at;
  mkdirSync(dir);
  const name = `bc-${id}`;
  // The SDR repository ipmi_sim loads (persist_sdr): STATEDIR/ipmi_sim/<name>/sdr.20.main.
  const state = path.join(dir, "state");
  mkdirSync(path.join(state, "ipmi_sim", name), { recursive: true });
  writeFileSync(path.join(state, "ipmi_sim", name, "sdr.20.main"), readFileSync(at.sdrs));
  const fru = path.join(dir, "fru.bin");
  writeFileSync(fru, fruImage({ ...machine.smbios, partNumber: "q35", assetTag: id }));
  const emu = path.join(dir, "bmc.emu");
  writeFileSync(emu, emuCommands(fru));

  // chassis_control: one request in, its answer out, on a unix socket (a path: it crosses namespaces).
  const control = path.join(dir, "control.sock");
  const handle = chassisControl(machine, log);
  // allowHalfOpen: socat half-closes after the request, and the answer still has to go back.
  const controlServer = net.createServer({ allowHalfOpen: true }, (conn) => {
    track(run, conn);
    let request = "";
    conn.setEncoding("utf8").on("data", (d: string) => {
      request += d;
      if (!request.includes("\n")) return;
      handle(request.slice(0, request.indexOf("\n")))
        .then((answer) => conn.end(`${answer}\n`))
        .catch((e: Error) => conn.end(`error: ${e.message}\n`));
    });
  });
  run.servers.push(await listen(controlServer, control));

  // SOL: ipmi_sim connects at its start (then every 10 s while it cannot) and stays connected;
  // the console's bytes go to it, the keystrokes it passes on go to the machine's serial input.
  let solConnected!: () => void;
  const solReady = new Promise<void>((resolve) => (solConnected = resolve));
  const sol = net.createServer((conn) => {
    track(run, conn);
    const unsubscribe = machine.console.subscribe((bytes) => conn.write(bytes));
    conn.on("data", (bytes: Buffer) => machine.writeConsole(bytes)).on("close", unsubscribe);
    solConnected();
  });
  let solPort: number;
  if (!netns) {
    run.servers.push(await listen(sol, 0, "127.0.0.1"));
    solPort = (sol.address() as net.AddressInfo).port;
  } else {
    // Inside the namespace ipmi_sim's 127.0.0.1 is the namespace's: a socat there listens for it.
    const solSock = path.join(dir, "sol.sock");
    run.servers.push(await listen(sol, solSock));
    solPort = await freePort("tcp");
    const socat = ["socat", `TCP-LISTEN:${solPort},bind=127.0.0.1,reuseaddr,fork`, `UNIX-CONNECT:${solSock}`];
    const relay = spawnGroup([...netns.prefix, ...socat], "ignore");
    run.children.push(relay);
    await until(() => listening(relay, "tcp", solPort), relay, `the SOL relay of ${id} inside ${netns.name}`);
  }

  // ipmi_sim; a port taken between choosing it and binding it: another one (when it was ours to choose).
  for (let attempt = 1; ; attempt++) {
    const udp = port ?? (await freePort("udp"));
    const lanConf = path.join(dir, "lan.conf");
    writeFileSync(lanConf, lanConfig({ ...at, name, udp, control, solPort, uuid: machine.uuid }), { mode: 0o600 });
    const sim = spawnGroup([...(netns?.prefix ?? []), "ipmi_sim", "-c", lanConf, "-f", emu, "-s", state, "-n"], "pipe");
    run.children.push(sim);
    let said = "";
    for (const s of [sim.stdout!, sim.stderr!]) s.setEncoding("utf8").on("data", (d: string) => (said = (said + d).slice(-2000)));
    try {
      await until(
        () => listening(sim, "udp", udp),
        sim,
        `ipmi_sim of ${id} on 127.0.0.1:${udp}`,
        () => said,
      );
    } catch (e) {
      if (port !== undefined || attempt >= 3 || sim.exitCode === null) throw e;
      continue;
    }
    sim.once("exit", (code, signal) => run.stopped || log(`ipmi_sim exited (${signal ?? code}): ${said.trim()}`));
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      solReady,
      new Promise(
        (_, reject) => (timer = setTimeout(() => reject(new Error(`ipmi_sim of ${id} did not connect its SOL within 10 s`)), 10_000)),
      ),
    ]).finally(() => clearTimeout(timer));
    return udp;
  }
}

/** lan.conf: the LAN channel, the chassis control, SOL and the one user (the password: only here, mode 600). */
function lanConfig(c: {
  name: string;
  udp: number;
  script: string;
  control: string;
  solPort: number;
  user: string;
  password: string;
  /** The machine's SMBIOS UUID. */
  uuid: string;
}): string {
  return [
    `name "${c.name}"`,
    "set_working_mc 0x20",
    "  startlan 1",
    `    addr 127.0.0.1 ${c.udp}`,
    "    priv_limit admin",
    // Required (without a GUID every RMCP+ session fails); Get System GUID answers it, bytes in this
    // order: the machine's SMBIOS UUID, as a real BMC reports the system it sits in.
    `    guid ${c.uuid.replaceAll("-", "")}`,
    "  endlan",
    `  chassis_control "${c.script} ${c.control}"`,
    // history=: ipmi_sim keeps reading the console while no session is active (else QEMU's output backs up).
    `  sol "tcp:127.0.0.1:${c.solPort}" 115200 history=65536`,
    `  user 2 true "${c.user}" "${c.password}" admin 10 md5`,
    "",
  ].join("\n");
}

/** bmc.emu: the BMC's management controller (OpenIPMI's ids), its SEL, the temperature sensor and the FRU. */
function emuCommands(fru: string): string {
  return [
    "mc_setbmc 0x20",
    "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr",
    "sel_enable 0x20 1000 0x0a",
    "sensor_add 0x20 0 1 0x01 0x01",
    `sensor_set_value 0x20 0 1 ${TEMPERATURE} 0`,
    `mc_add_fru_data 0x20 0 256 file 0 "${fru}"`,
    "mc_enable 0x20",
    "",
  ].join("\n");
}

/**
 * One machine's chassis_control requests (`get power`, `set power 1`, `set boot pxe`...): each
 * answered at once; the work of a `set` goes on after the answer, in order (QemuMachine queues it).
 */
function chassisControl(q: QemuMachine, log: (line: string) => void): (request: string) => Promise<string> {
  const pending = { power: 0, boot: 0 };
  let power: "On" | "Off" = "Off"; // what the last power request makes it: answered while that is under way
  let boot: QemuBootTarget = "None";
  const later = (kind: keyof typeof pending, what: string, work: () => Promise<unknown>) => {
    pending[kind]++;
    void work()
      .catch((e: Error) => log(`${what} failed: ${e.message}`))
      .finally(() => pending[kind]--);
  };
  const powerNow = async () => (pending.power > 0 ? power : await q.powerState().catch(() => power));

  return async (request) => {
    const [verb, name, ...rest] = request.trim().split(/\s+/);
    const value = rest.join(" ");
    if (verb === "get" && name === "power") return `power:${(await powerNow()) === "On" ? 1 : 0}`;
    if (verb === "get" && name === "boot") return `boot:${BOOT_TO_IPMI[pending.boot > 0 ? boot : q.bootOverride.target]}`;
    if (verb !== "set") throw new Error(`unknown request ${JSON.stringify(request)}`);
    if (name === "power" && (value === "1" || value === "0")) {
      const to = (power = value === "1" ? "On" : "Off");
      later("power", `power ${to}`, () => (to === "On" ? q.powerOn() : q.forceOff()));
    } else if (name === "reset") {
      power = await powerNow(); // a machine that is off stays off
      later("power", "reset", () => q.forceRestart());
    } else if (name === "shutdown") {
      // The ACPI button: the guest decides, so the power reported stays QEMU's.
      void q.gracefulShutdown().catch((e: Error) => log(`soft off failed: ${e.message}`));
    } else if (name === "boot" && value in BOOT_FROM_IPMI) {
      const target = (boot = BOOT_FROM_IPMI[value]!);
      later("boot", `boot ${value}`, () => q.setBootOverride(target, target === "None" ? "Disabled" : "Once"));
    } else if (name !== "identify") {
      // (identify: the chassis light; there is none to light.)
      throw new Error(`cannot set ${name} to ${value}`);
    }
    return "";
  };
}

/** A FRU image (Platform Management FRU Information Storage Definition v1.0): a common header, chassis, board and product areas, 256 bytes. */
export function fruImage(info: {
  manufacturer: string;
  product: string;
  serial: string;
  partNumber?: string;
  version?: string;
  assetTag?: string;
}): Buffer {
  // Type/length byte 0xc0 | length: 8-bit ASCII, at most 63 bytes.
  const field = (s = "") => {
    const b = Buffer.from(s.slice(0, 63), "latin1");
    return [0xc0 | b.length, ...b];
  };
  const checksum = (bytes: number[]) => -bytes.reduce((a, b) => a + b, 0) & 0xff;
  // An area: its header bytes and fields, the end marker 0xc1, zeros to a multiple of 8, its checksum.
  const area = (head: number[], fields: Array<string | undefined>) => {
    const body = [...head, ...fields.flatMap((f) => field(f)), 0xc1];
    while ((body.length + 1) % 8 !== 0) body.push(0);
    body[1] = (body.length + 1) / 8;
    return [...body, checksum(body)];
  };
  const { manufacturer, product, serial, partNumber, version, assetTag } = info;
  const chassis = area([1, 0, 0x17], [partNumber, serial]); // 0x17: rack mount chassis
  const board = area([1, 0, 0, 0, 0, 0], [manufacturer, product, serial, partNumber, ""]); // English, no manufacturing date
  const productArea = area([1, 0, 0], [manufacturer, product, partNumber, version, serial, assetTag, ""]);
  const header = [1, 0, 1, 1 + chassis.length / 8, 1 + (chassis.length + board.length) / 8, 0, 0];
  const image = [...header, checksum(header), ...chassis, ...board, ...productArea];
  if (image.length > 256) throw new Error("the FRU data does not fit in 256 bytes");
  return Buffer.concat([Buffer.from(image), Buffer.alloc(256 - image.length)]);
}

// ------------------------------------------------------------ processes and sockets

/** A process in its own group (a kill reaches what it runs: ipmi_sim's chassis control), killed at this process's exit. */
function spawnGroup(argv: string[], output: "pipe" | "ignore"): ChildProcess {
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ["ignore", output, output], detached: true });
  live.processes.add(child);
  child.once("exit", () => live.processes.delete(child));
  return child;
}

/** A connection to one of a BMC's servers: destroyed at stop (a server closes once its connections are gone). */
function track(run: Running, conn: net.Socket): void {
  run.sockets.add(conn);
  conn.on("close", () => run.sockets.delete(conn)).on("error", () => conn.destroy());
}

/** Listens on a unix socket (a path) or on host:port. */
function listen(server: net.Server, at: string | number, host?: string): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    if (typeof at === "string") server.listen(at, () => resolve(server));
    else server.listen(at, host, () => resolve(server));
  });
}

/** A port free on this host's loopback now (inside a namespace it is very likely free as well: its listeners mirror the host's). */
async function freePort(kind: "udp" | "tcp"): Promise<number> {
  if (kind === "tcp") {
    const s = await listen(net.createServer(), 0, "127.0.0.1");
    const { port } = s.address() as net.AddressInfo;
    await new Promise((resolve) => s.close(resolve));
    return port;
  }
  const s = dgram.createSocket("udp4");
  await new Promise<void>((resolve, reject) => s.once("error", reject).bind(0, "127.0.0.1", resolve));
  const { port } = s.address();
  await new Promise<void>((resolve) => s.close(resolve));
  return port;
}

/**
 * Whether a process holds a socket on 127.0.0.1:<port> (UDP bound, or TCP listening): the socket's
 * inode in /proc/<pid>/net (the table of the process's own namespace: `ip netns exec` execs its
 * command) among the process's descriptors.
 */
function listening(child: ChildProcess, kind: "udp" | "tcp", port: number): boolean {
  try {
    const local = `0100007F:${port.toString(16).toUpperCase().padStart(4, "0")}`;
    const inodes = readFileSync(`/proc/${child.pid}/net/${kind}`, "utf8")
      .split("\n")
      .map((line) => line.trim().split(/\s+/))
      .filter((f) => f[1] === local && (kind === "udp" || f[3] === "0A"))
      .map((f) => `socket:[${f[9]}]`);
    if (inodes.length === 0) return false;
    const fds = readdirSync(`/proc/${child.pid}/fd`);
    return fds.some((fd) => inodes.includes(readlinkSafe(`/proc/${child.pid}/fd/${fd}`)));
  } catch {
    return false; // not started yet, or gone
  }
}

const readlinkSafe = (p: string) => {
  try {
    return readlinkSync(p);
  } catch {
    return "";
  }
};

/**
 * A killed run's BMCs (its exit hook never ran): the processes naming a bc-ipmi-<pid>- directory
 * of `parent` whose pid is gone (ipmi_sim, its chassis control, a SOL socat) are killed, and those
 * directories removed.
 */
function removeLeftovers(parent: string): void {
  const gone = (pid: number) => {
    try {
      process.kill(pid, 0);
      return false;
    } catch (e) {
      return (e as NodeJS.ErrnoException).code === "ESRCH";
    }
  };
  const named = new RegExp(`${parent.replaceAll(".", "\\.")}/bc-ipmi-(\\d+)-`); // parent: [\w/.-] only
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let cmdline: string;
    try {
      cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
    } catch {
      continue;
    }
    const m = named.exec(cmdline);
    if (m && gone(Number(m[1]))) {
      try {
        process.kill(Number(entry), "SIGKILL");
      } catch {
        // gone meanwhile
      }
    }
  }
  for (const name of readdirSync(parent)) {
    const m = /^bc-ipmi-(\d+)-/.exec(name);
    if (m && gone(Number(m[1]))) rmSync(path.join(parent, name), { recursive: true, force: true });
  }
}

/** Polls `ready` until it holds; fails when the process exits first, or after 10 s. */
async function until(ready: () => boolean, child: ChildProcess, what: string, said: () => string = () => ""): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!ready()) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`${what} exited at start: ${said().trim() || "no output"}`);
    if (Date.now() > deadline) throw new Error(`${what} was not listening within 10 s: ${said().trim()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // gone
  }
}

/** SIGTERM to its group, SIGKILL if it lingers; resolves once it has exited. */
async function endProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  killGroup(child, "SIGTERM");
  const timer = setTimeout(() => killGroup(child, "SIGKILL"), 2_000);
  await exited;
  clearTimeout(timer);
}
