// A real machine for the Redfish emulator to drive: one QEMU q35 guest (SeaBIOS or OVMF) whose
// power, boot order and virtual CD are worked over QMP as a BMC works a server's. Nothing in it is
// simulated: the firmware boots what the boot order says, from NVMe disks, an ide-cd and NICs
// with iPXE in their option ROMs. ../shared/PXE.md has the measurements behind every choice.
//
//   off                 a QEMU process started with -S that has not run: status prelaunch
//   power on            cont; a process that has run is replaced by a fresh one first (a cold boot)
//   force off           the process is replaced by a fresh one, not started (as libvirt's destroy)
//   graceful shutdown   system_powerdown: the ACPI power button; a guest that acts on it powers off
//                       (-no-shutdown keeps QEMU: status shutdown)
//   force restart       a fresh process, started (libvirt's destroy + create, as sushy-tools does)
//   boot override       qom-set /machine/peripheral/<id> bootindex; a fresh process is started with it
//   virtual media       blockdev-change-medium on the ide-cd; eject: open tray, remove medium, close
//   serial console      QEMU's stdio: stdout is `console` (text, waits, subscribe() for the bytes),
//                       stdin takes writeConsole() (what a BMC's serial over LAN types)
//
// Why a fresh process rather than system_reset + cont: QEMU does not map SeaBIOS's ROM back at a
// reset, so SeaBIOS answers a warm reset of a machine that has run with a hard reboot of its own
// (one or two more RESET events, as it happens), and a Once boot override could not be spent on
// "the next boot" only. A fresh process is a cold boot every time; the UEFI variables, the disks
// and the inserted ISO carry over. Every process started is killed, and the work directory
// removed, at stop() or when this process exits.
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import {
  accessSync,
  appendFileSync,
  constants,
  copyFileSync,
  existsSync,
  mkdtempSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { QmpConnection, type QmpEvent } from "../agent/runtimes/microvm/qmp.ts";
import { sleep } from "../agent/runtimes/microvm/helpers.ts";

export type Firmware = "bios" | "uefi";
export type Accel = "kvm" | "tcg";
/** Redfish's names for the devices a boot override can put first. */
export const BOOT_DEVICES = ["Pxe", "Hdd", "Cd"] as const;
export type BootDevice = (typeof BOOT_DEVICES)[number];
export type QemuBootTarget = "None" | BootDevice;
export type QemuBootEnabled = "Disabled" | "Once" | "Continuous";

export const OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd";
export const OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/** Where a guest on user-mode networking reaches the host's loopback ports it was given (loopbackPorts). */
export const LOOPBACK_GUEST_ADDRESS = "10.0.2.100";

export interface QemuNicOptions {
  mac: string;
  /** A tap device (in the network namespace `prefix` enters); none: user-mode networking, restricted (no route out). */
  tap?: string;
  /** User-mode networking: the host's loopback ports the guest may reach, at LOOPBACK_GUEST_ADDRESS:<port>; nothing else is reachable. */
  loopbackPorts?: number[];
  /** User-mode networking: the boot file its DHCP offers (iPXE fetches an http URL, e.g. an iPXE script on a loopback port). */
  bootFile?: string;
}

export interface QemuDiskOptions {
  serial: string;
  /** A raw image; none: a sparse file of sizeBytes in the machine's work directory. */
  file?: string;
  sizeBytes?: number;
  /** Every write fails with EIO (QEMU's blkdebug), reads work: a dying disk. */
  failWrites?: boolean;
}

export interface QemuMachineOptions {
  name?: string;
  firmware?: Firmware;
  /** "auto" (default): KVM when a probe boot under KVM gets as far as iPXE, else TCG. */
  accel?: Accel | "auto";
  memoryMiB?: number;
  cpus?: number;
  /** SMBIOS type 1 UUID (product_uuid); default random. */
  uuid?: string;
  smbios?: { manufacturer?: string; product?: string; serial?: string };
  nics?: QemuNicOptions[];
  disks?: QemuDiskOptions[];
  /** What the firmware tries, in order, when no override is in effect. Default Pxe, Hdd, Cd. */
  defaultBootOrder?: BootDevice[];
  /** argv QEMU is started under, e.g. ["ip", "netns", "exec", "ns1"]. */
  prefix?: string[];
  /** A file that receives the serial console too (the caller's: left in place; the console is also kept in memory). */
  consoleFile?: string;
  qemuBinary?: string;
  /** One line at start (the accelerator and why) and on unexpected exits; default stderr. */
  log?: (line: string) => void;
}

export interface QemuNic extends QemuNicOptions {
  id: string;
}

export interface QemuDisk {
  id: string;
  serial: string;
  file: string;
  sizeBytes: number;
  failWrites: boolean;
}

/** QEMU's run states that are a machine with its power off; "exited": its QEMU is gone (it crashed, or was killed). */
const OFF_STATES = new Set(["prelaunch", "shutdown", "paused", "exited"]);

/** The serial console as text, with waits for what it prints. */
export class SerialConsole {
  #text = "";
  #listeners = new Set<() => void>();
  #subscribers = new Set<(bytes: Buffer) => void>();

  constructor(private readonly file?: string) {}

  get text(): string {
    return this.#text;
  }

  /** Where the next character will be: pass it as `from` to wait only for what comes after now. */
  get length(): number {
    return this.#text.length;
  }

  append(chunk: string): void {
    this.#text += chunk;
    if (this.file) appendFileSync(this.file, chunk);
    for (const l of this.#listeners) l();
    if (this.#subscribers.size > 0) {
      const bytes = Buffer.from(chunk, "latin1"); // QEMU's output is read as latin1: byte for byte
      for (const s of this.#subscribers) s(bytes);
    }
  }

  /** Calls `listener` with the console's bytes as they arrive (a BMC's serial-over-LAN); answers the unsubscribe. */
  subscribe(listener: (bytes: Buffer) => void): () => void {
    this.#subscribers.add(listener);
    return () => void this.#subscribers.delete(listener);
  }

  /** Resolves with the first match at or after `from`; rejects after timeoutMs, quoting the console's end. */
  waitFor(pattern: string | RegExp, opts: { from?: number; timeoutMs?: number } = {}): Promise<{ index: number; text: string }> {
    const from = opts.from ?? 0;
    const timeoutMs = opts.timeoutMs ?? 30_000;
    const find = () => {
      const rest = this.#text.slice(from);
      if (typeof pattern === "string") {
        const i = rest.indexOf(pattern);
        return i < 0 ? undefined : { index: from + i, text: pattern };
      }
      const m = pattern.exec(rest);
      return m ? { index: from + m.index, text: m[0] } : undefined;
    };
    return new Promise((resolve, reject) => {
      const check = () => {
        const found = find();
        if (!found) return;
        done();
        resolve(found);
      };
      const timer = setTimeout(() => {
        done();
        const tail = this.#text.slice(Math.max(from, this.#text.length - 600)).replace(/\x1b\[[0-9;=?]*[A-Za-z]/g, "");
        reject(new Error(`the console did not show ${String(pattern)} within ${timeoutMs / 1000} s; its end: ${JSON.stringify(tail)}`));
      }, timeoutMs);
      const done = () => (clearTimeout(timer), this.#listeners.delete(check));
      this.#listeners.add(check);
      check();
    });
  }
}

/** Machines not stopped yet, and KVM probes under way: killed at this process's exit so no guest outlives a failed test. */
const live = new Set<QemuMachine>();
const probing = new Set<ChildProcess>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const m of live) m.killNow();
    for (const child of probing) child.kill("SIGKILL");
  });
}

/** Whether KVM runs firmware far enough to be worth using, probed once per process (and QEMU binary). */
const kvmProbes = new Map<string, Promise<{ accel: Accel; why: string }>>();

/**
 * KVM "works" when the firmware gets under it as far as iPXE initialising a NIC: nested KVM
 * (this repository's CI and dev VMs) opens /dev/kvm and starts, then fails on the firmware
 * (OVMF: "KVM internal error"; SeaBIOS's iPXE hangs), so opening /dev/kvm proves nothing.
 */
function probeKvm(qemu: string): Promise<{ accel: Accel; why: string }> {
  let probe = kvmProbes.get(qemu);
  if (!probe) {
    // OVMF when there is one: it fails at once where KVM is broken, where SeaBIOS's iPXE hangs until the deadline.
    probe = runKvmProbe(qemu, existsSync(OVMF_CODE) && existsSync(OVMF_VARS) ? "uefi" : "bios");
    kvmProbes.set(qemu, probe);
  }
  return probe;
}

async function runKvmProbe(qemu: string, firmware: Firmware): Promise<{ accel: Accel; why: string }> {
  try {
    accessSync("/dev/kvm", constants.R_OK | constants.W_OK);
  } catch {
    return { accel: "tcg", why: "no usable /dev/kvm" };
  }
  const dir = mkdtempSync(path.join(tmpdir(), "bc-kvm-probe-"));
  try {
    const args = ["-M", "q35", "-accel", "kvm", "-m", "128", "-nodefaults", "-no-user-config", "-display", "none"];
    args.push("-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0");
    args.push(...firmwareArgs(firmware, path.join(dir, "vars.fd")));
    args.push("-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0,bootindex=1");
    const child = spawn(qemu, args, { stdio: ["ignore", "pipe", "pipe"] });
    probing.add(child);
    installExitHook();
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString("latin1")));
    child.stderr.on("data", (d: Buffer) => (err += d.toString("latin1")));
    const exited = new Promise<void>((resolve) => child.once("close", () => resolve()));
    let gone = false;
    void exited.then(() => (gone = true));
    const deadline = Date.now() + 10_000;
    while (!gone && Date.now() < deadline && !/iPXE initialising devices/.test(out) && !/KVM internal error|failed/i.test(err))
      await sleep(100);
    const reached = /iPXE initialising devices/.test(out);
    child.kill("SIGKILL");
    await exited;
    probing.delete(child);
    if (reached) return { accel: "kvm", why: `a probe boot of ${firmware} reached iPXE under KVM` };
    const said = /KVM internal error[^\n]*|[^\n]*failed[^\n]*/i.exec(err)?.[0];
    return {
      accel: "tcg",
      why: `KVM does not work here: a probe boot of ${firmware} ${said ? `failed (${said.trim()})` : "never reached iPXE"}`,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The firmware's options; UEFI's variables live in `varsCopy` (made from OVMF's template when missing). */
function firmwareArgs(firmware: Firmware, varsCopy: string): string[] {
  if (firmware === "bios") return ["-device", "sga"]; // SeaBIOS and iPXE write to the serial port
  if (!existsSync(varsCopy)) copyFileSync(OVMF_VARS, varsCopy); // each machine its own, kept across power cycles
  return ["-drive", `if=pflash,format=raw,readonly=on,file=${OVMF_CODE}`, "-drive", `if=pflash,format=raw,file=${varsCopy}`];
}

/** A value inside a QEMU option list: commas are doubled. */
const opt = (v: string) => v.replaceAll(",", ",,");

/** Starts a machine, powered off (QEMU's -S), its QMP connected. */
export async function startQemuMachine(options: QemuMachineOptions = {}): Promise<QemuMachine> {
  const machine = new QemuMachine(options);
  try {
    await machine.start();
  } catch (e) {
    await machine.stop();
    throw e;
  }
  return machine;
}

/** One QEMU process of a machine: a machine has a new one after every off (a cold boot each power-on). */
interface QemuProcess {
  child: ChildProcess;
  qmp?: QmpConnection;
  exited: boolean;
  /** Its output is all read (stdio closed): what it printed last is on the console before the next one's. */
  closed: Promise<void>;
  /** Replaced on purpose: its exit is not news. */
  retired: boolean;
  /** It has been started (cont): its firmware has run, so it cannot boot cold again. */
  ran: boolean;
  /** The bootindex of each device it was started with. */
  launchedOrder: Map<string, number>;
  stderr: string;
}

export class QemuMachine {
  readonly name: string;
  readonly firmware: Firmware;
  readonly uuid: string;
  readonly memoryMiB: number;
  readonly cpus: number;
  readonly smbios: { manufacturer: string; product: string; serial: string };
  readonly nics: QemuNic[];
  readonly disks: QemuDisk[];
  /** The ide-cd's QOM id. */
  readonly cdId = "cd0";
  readonly console: SerialConsole;
  readonly workDir: string;
  /** Every QMP event so far, of every process, with the time it came. */
  readonly events: Array<QmpEvent & { at: number }> = [];
  accel: Accel = "tcg";
  /** The override as a BMC records it; a Once goes back to None/Disabled at the boot it applied to. */
  bootOverride: { target: QemuBootTarget; enabled: QemuBootEnabled } = { target: "None", enabled: "Disabled" };
  /** The ISO in the virtual CD, if any. */
  media: string | null = null;
  /** QEMU processes started so far (one per cold boot, plus the first). */
  launches = 0;

  readonly #options: QemuMachineOptions;
  readonly #qemu: string;
  readonly #defaultOrder: BootDevice[];
  readonly #log: (line: string) => void;
  #proc: QemuProcess | undefined;
  #stopped = false;
  /** Each device's bootindex as it should be: set live (qom-set) and given to every new process. */
  readonly #bootIndex = new Map<string, number>();
  /** Operations one at a time: a power-on must not interleave with a force off. */
  #queue: Promise<unknown> = Promise.resolve();
  /** A GracefulRestart asked for: power on again once the guest has shut down. */
  #restartOnShutdown = false;
  #eventWaiters = new Set<(e: QmpEvent) => void>();
  #spendTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(options: QemuMachineOptions) {
    this.#options = options;
    this.#qemu = options.qemuBinary ?? "qemu-system-x86_64";
    this.name = options.name ?? `qm-${randomUUID().slice(0, 8)}`;
    this.firmware = options.firmware ?? "bios";
    this.uuid = options.uuid ?? randomUUID();
    this.memoryMiB = options.memoryMiB ?? 256;
    this.cpus = options.cpus ?? 1;
    this.smbios = {
      manufacturer: options.smbios?.manufacturer ?? "QEMU",
      product: options.smbios?.product ?? "Standard PC (Q35 + ICH9, 2009)",
      serial: options.smbios?.serial ?? `QM-${this.uuid.slice(0, 8).toUpperCase()}`,
    };
    this.#defaultOrder = options.defaultBootOrder ?? ["Pxe", "Hdd", "Cd"];
    this.#log = options.log ?? ((line) => process.stderr.write(`${line}\n`));
    (options.disks ?? []).forEach((d, i) => {
      if (!d.file && !(Number.isSafeInteger(d.sizeBytes) && d.sizeBytes! > 0)) throw new Error(`disk ${i}: give a file or a sizeBytes`);
    });
    this.console = new SerialConsole(options.consoleFile);
    this.nics = (options.nics ?? []).map((n, i) => {
      if (n.tap && (n.loopbackPorts || n.bootFile))
        throw new Error(`nic ${i}: loopbackPorts and bootFile are user-mode networking's, not a tap's`);
      return { ...n, id: `nic${i}`, mac: n.mac.toLowerCase() };
    });
    this.workDir = mkdtempSync(path.join(tmpdir(), "bc-qemu-"));
    live.add(this);
    installExitHook();
    this.disks = (options.disks ?? []).map((d, i) => {
      const id = `disk${i}`;
      const failWrites = d.failWrites ?? false;
      if (d.file) return { id, serial: d.serial, file: d.file, sizeBytes: statSync(d.file).size, failWrites };
      const file = path.join(this.workDir, `${id}.img`);
      // Sparse: writing a multi-GiB image stalls the guests while the host flushes it (PXE.md).
      writeFileSync(file, "");
      truncateSync(file, d.sizeBytes!);
      return { id, serial: d.serial, file, sizeBytes: d.sizeBytes!, failWrites };
    });
    for (const [id, index] of this.#orderFor("None")) this.#bootIndex.set(id, index);
  }

  /** @internal startQemuMachine's second half: the accelerator, then the first (powered-off) process. */
  async start(): Promise<void> {
    const asked = this.#options.accel ?? "auto";
    const { accel, why } = asked === "auto" ? await probeKvm(this.#qemu) : { accel: asked, why: "as asked" };
    this.accel = accel;
    await this.#launch();
    this.#log(
      `qemu machine ${this.name}: ${accel.toUpperCase()} (${why}), ${this.firmware === "bios" ? "SeaBIOS" : "OVMF"}, ` +
        `${this.memoryMiB} MiB, ${this.nics.length} NIC(s), ${this.disks.length} NVMe disk(s), pid ${this.#proc?.child.pid}`,
    );
  }

  /** The current QEMU process's pid (a new one after every off). */
  get pid(): number | undefined {
    return this.#proc?.child.pid;
  }

  /** QEMU's run state (query-status): prelaunch, running, shutdown...; "exited" when its QEMU is gone (a power-on starts another). */
  async status(): Promise<string> {
    if (this.#proc?.exited && !this.#stopped) return "exited";
    return ((await this.#execute("query-status")) as { status: string }).status;
  }

  /** On while the guest runs; Off before a power-on, after a force off, and once the guest powered itself off. */
  async powerState(): Promise<"On" | "Off"> {
    return OFF_STATES.has(await this.status()) ? "Off" : "On";
  }

  powerOn(): Promise<void> {
    return this.#power("Off", () => this.#coldBoot());
  }

  forceOff(): Promise<void> {
    return this.#power("On", () => this.#relaunch());
  }

  /** The ACPI power button; only a guest that acts on it powers off. */
  gracefulShutdown(): Promise<void> {
    return this.#power("On", () => this.#execute("system_powerdown"));
  }

  /** A cold boot of a running machine (sushy-tools: destroy + create); an Off machine stays off. */
  forceRestart(): Promise<void> {
    return this.#power("On", () => this.#coldBoot());
  }

  /** The power button, then a power-on once the guest has shut down (libvirt's reboot, which sushy-tools uses). */
  gracefulRestart(): Promise<void> {
    return this.#power("On", async () => {
      this.#restartOnShutdown = true;
      await this.#execute("system_powerdown");
    });
  }

  /** Off (when on), then on: a cold boot either way. */
  powerCycle(): Promise<void> {
    return this.#power("Either", () => this.#coldBoot());
  }

  nmi(): Promise<void> {
    return this.#power("On", () => this.#execute("inject-nmi"));
  }

  /**
   * The boot override: the target's devices first from the next boot on; Once applies to that
   * boot only, Continuous to every boot, Disabled (or target None) is the default order.
   */
  setBootOverride(target: QemuBootTarget, enabled: QemuBootEnabled): Promise<void> {
    return this.#serial(async () => {
      this.bootOverride = { target, enabled };
      await this.#applyBootOrder();
    });
  }

  /** Puts an ISO in the virtual CD (replacing what was there). */
  insertMedia(file: string): Promise<void> {
    return this.#serial(async () => {
      await this.#execute("blockdev-change-medium", { id: this.cdId, filename: file, format: "raw", "read-only-mode": "read-only" });
      this.media = file;
    });
  }

  ejectMedia(): Promise<void> {
    return this.#serial(async () => {
      if (this.media === null) return;
      // force: a guest that locked the tray does not keep the BMC from ejecting.
      await this.#execute("blockdev-open-tray", { id: this.cdId, force: true });
      await this.#execute("blockdev-remove-medium", { id: this.cdId });
      await this.#execute("blockdev-close-tray", { id: this.cdId });
      this.media = null;
    });
  }

  /**
   * Types into the serial console (QEMU's stdin is the serial port's input). Answers false when
   * no QEMU process is there to take it: keystrokes to a machine being replaced are lost, as on a wire.
   */
  writeConsole(bytes: Buffer | string): boolean {
    const stdin = this.#proc?.child.stdin;
    if (!stdin || this.#proc!.exited || !stdin.writable) return false;
    stdin.write(bytes);
    return true;
  }

  /** The devices' bootindex as QEMU has them (qom-get), for checking. */
  async bootIndexes(): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    for (const id of this.#bootIndex.keys())
      out[id] = (await this.#execute("qom-get", { path: `/machine/peripheral/${id}`, property: "bootindex" })) as number;
    return out;
  }

  /** The next QMP event of this name (registered now, so one that comes during the caller's next step is not missed). */
  nextEvent(name: string, timeoutMs = 30_000): Promise<QmpEvent> {
    return new Promise((resolve, reject) => {
      const waiter = (e: QmpEvent) => {
        if (e.event !== name) return;
        clearTimeout(timer);
        this.#eventWaiters.delete(waiter);
        resolve(e);
      };
      const timer = setTimeout(() => {
        this.#eventWaiters.delete(waiter);
        reject(new Error(`no QMP event ${name} within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      this.#eventWaiters.add(waiter);
    });
  }

  /** Kills QEMU (and anything its prefix started) and removes every file this machine made. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    clearTimeout(this.#spendTimer);
    if (this.#proc) await this.#kill(this.#proc);
    rmSync(this.workDir, { recursive: true, force: true });
    live.delete(this);
  }

  /** @internal The exit hook's synchronous stop. */
  killNow(): void {
    if (this.#proc) killGroup(this.#proc);
    rmSync(this.workDir, { recursive: true, force: true });
  }

  // ------------------------------------------------------------ processes

  /** Starts a QEMU process, powered off (-S), with the boot order and the ISO as they are now. */
  async #launch(): Promise<void> {
    const sock = path.join(this.workDir, "qmp.sock");
    rmSync(sock, { force: true });
    const args = ["-name", `bc-${this.name}`, "-M", "q35", "-accel", this.accel, "-cpu", this.accel === "kvm" ? "host" : "max"];
    args.push("-m", String(this.memoryMiB), "-smp", String(this.cpus), "-nodefaults", "-no-user-config", "-display", "none");
    args.push("-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0");
    args.push(...firmwareArgs(this.firmware, path.join(this.workDir, "vars.fd")));
    args.push("-S", "-no-shutdown", "-qmp", `unix:${sock},server=on,wait=off`);
    args.push("-uuid", this.uuid);
    const { manufacturer, product, serial } = this.smbios;
    args.push("-smbios", `type=1,manufacturer=${opt(manufacturer)},product=${opt(product)},serial=${opt(serial)},uuid=${this.uuid}`);
    const index = (id: string) => this.#bootIndex.get(id)!;
    this.nics.forEach((n, i) => {
      // Without a tap: user-mode networking with no route out (restrict=on); its DHCP still answers iPXE, and
      // guestfwd rules (which restrict=on lets through) reach the loopback ports given.
      const user = [
        `user,id=n${i},restrict=on`,
        ...(n.bootFile ? [`bootfile=${opt(n.bootFile)}`] : []),
        ...(n.loopbackPorts ?? []).map((p) => `guestfwd=tcp:${LOOPBACK_GUEST_ADDRESS}:${p}-tcp:127.0.0.1:${p}`),
      ];
      const netdev = n.tap ? `tap,id=n${i},ifname=${n.tap},script=no,downscript=no` : user.join(",");
      args.push("-netdev", netdev, "-device", `virtio-net-pci,id=${n.id},netdev=n${i},mac=${n.mac},bootindex=${index(n.id)}`);
    });
    this.disks.forEach((d, i) => {
      if (d.failWrites) {
        const config = path.join(this.workDir, `${d.id}-blkdebug.conf`);
        writeFileSync(config, '[inject-error]\nevent = "write_aio"\niotype = "write"\nerrno = "5"\n');
        const image = { driver: "file", filename: d.file };
        args.push("-blockdev", JSON.stringify({ driver: "raw", "node-name": `d${i}`, file: { driver: "blkdebug", config, image } }));
      } else args.push("-drive", `if=none,id=d${i},file=${opt(d.file)},format=raw,discard=unmap`);
      args.push("-device", `nvme,id=${d.id},drive=d${i},serial=${opt(d.serial)},bootindex=${index(d.id)}`);
    });
    args.push("-drive", `if=none,id=cdd,media=cdrom,readonly=on${this.media ? `,format=raw,file=${opt(this.media)}` : ""}`);
    args.push("-device", `ide-cd,id=${this.cdId},drive=cdd,bus=ide.0,bootindex=${index(this.cdId)}`);

    const argv = [...(this.#options.prefix ?? []), this.#qemu, ...args];
    // Its own process group: a kill reaches whatever the prefix started too.
    // stdin a pipe: the serial console's input side (writeConsole).
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ["pipe", "pipe", "pipe"], detached: true });
    child.stdin!.on("error", () => {}); // EPIPE once the process is gone: the keystrokes are lost
    const closed = new Promise<void>((resolve) => child.once("close", () => resolve()));
    const proc: QemuProcess = {
      child,
      exited: false,
      closed,
      retired: false,
      ran: false,
      launchedOrder: new Map(this.#bootIndex),
      stderr: "",
    };
    this.#proc = proc;
    this.launches++;
    child.stdout!.setEncoding("latin1");
    child.stdout!.on("data", (d: string) => this.console.append(d));
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (d: string) => (proc.stderr = (proc.stderr + d).slice(-4000)));
    child.once("exit", (code, signal) => {
      proc.exited = true;
      if (!proc.retired) this.#log(`qemu machine ${this.name}: QEMU exited (${signal ?? code}): ${proc.stderr.trim().slice(-500)}`);
    });
    child.once("error", () => (proc.exited = true));

    const deadline = Date.now() + 30_000;
    for (;;) {
      if (proc.exited) throw new Error(`QEMU exited at start: ${proc.stderr.trim().slice(-1000) || "no output"}`);
      try {
        proc.qmp = await QmpConnection.open(sock, (e) => this.#onEvent(proc, e));
        return;
      } catch (e) {
        if (Date.now() > deadline) throw new Error(`QEMU's QMP socket did not answer within 30 s: ${(e as Error).message}`);
        await sleep(50);
      }
    }
  }

  /** The current process ends; a fresh one, powered off, takes its place. */
  async #relaunch(): Promise<void> {
    if (this.#proc) await this.#kill(this.#proc);
    await this.#launch();
  }

  /** Quits a process (QMP quit, then SIGKILL to its group if it lingers) and waits until it is gone and its output read. */
  async #kill(proc: QemuProcess): Promise<void> {
    proc.retired = true;
    if (!proc.exited) await proc.qmp?.execute("quit", undefined, 2_000).catch(() => {});
    if (!(await Promise.race([proc.closed.then(() => true), sleep(3_000).then(() => false)]))) {
      killGroup(proc);
      await Promise.race([proc.closed, sleep(5_000)]);
    }
    proc.qmp?.close();
  }

  /** Power on as a cold boot: a process that has run (or was started with another boot order) is replaced first. */
  async #coldBoot(): Promise<void> {
    const proc = this.#proc!;
    const sameOrder = [...this.#bootIndex].every(([id, index]) => proc.launchedOrder.get(id) === index);
    if (proc.exited || proc.ran || !sameOrder || (await this.status()) !== "prelaunch") await this.#relaunch();
    await this.#execute("cont");
    this.#proc!.ran = true;
    await this.#bootStarted();
  }

  // ------------------------------------------------------------ internals

  async #execute(command: string, args?: Record<string, unknown>): Promise<unknown> {
    const qmp = this.#proc?.qmp;
    if (!qmp) throw new Error(`qemu machine ${this.name} is not started`);
    return qmp.execute(command, args, 10_000);
  }

  /** A power operation, done when the machine is `when`; it replaces a graceful restart still waiting for the guest. */
  #power(when: "On" | "Off" | "Either", run: () => Promise<unknown>): Promise<void> {
    return this.#serial(async () => {
      this.#restartOnShutdown = false;
      if (when === "Either" || (await this.powerState()) === when) await run();
    });
  }

  #serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.#queue.then(fn, fn);
    this.#queue = run.catch(() => {});
    return run;
  }

  /** A boot has begun with the order in force: a Once override is spent, the default order is back for the boot after. */
  async #bootStarted(): Promise<void> {
    clearTimeout(this.#spendTimer);
    if (this.bootOverride.enabled !== "Once") return;
    this.bootOverride = { target: "None", enabled: "Disabled" };
    await this.#applyBootOrder();
  }

  #onEvent(proc: QemuProcess, e: QmpEvent): void {
    if (proc !== this.#proc || proc.retired) return;
    this.events.push({ ...e, at: Date.now() });
    for (const w of [...this.#eventWaiters]) w(e);
    if (e.event === "RESET" && this.bootOverride.enabled === "Once") {
      // The guest rebooted: that boot spends a Once too, once the firmware's resets are over (SeaBIOS
      // answers a warm reset with a hard reboot of its own, and each reset reads the boot order afresh).
      clearTimeout(this.#spendTimer);
      this.#spendTimer = setTimeout(() => void this.#serial(() => this.#bootStarted()).catch(() => {}), 1_000);
    }
    if (e.event === "SHUTDOWN" && this.#restartOnShutdown) {
      this.#restartOnShutdown = false;
      void this.#serial(() => this.#coldBoot()).catch((err: Error) =>
        this.#log(`qemu machine ${this.name}: restart failed: ${err.message}`),
      );
    }
  }

  /** Each device's bootindex for a boot with this device first ("None": the default order). */
  #orderFor(first: QemuBootTarget): Map<string, number> {
    const members: Record<BootDevice, string[]> = {
      Pxe: this.nics.map((n) => n.id),
      Hdd: this.disks.map((d) => d.id),
      Cd: [this.cdId],
    };
    const groups = first === "None" ? [...this.#defaultOrder] : [first, ...this.#defaultOrder.filter((g) => g !== first)];
    for (const g of BOOT_DEVICES) if (!groups.includes(g)) groups.push(g);
    const order = new Map<string, number>();
    for (const id of groups.flatMap((g) => members[g])) order.set(id, order.size + 1);
    return order;
  }

  /** Sets each device's bootindex for the override in force (live: a process started later is given the same). */
  async #applyBootOrder(): Promise<void> {
    const { target, enabled } = this.bootOverride;
    const wanted = this.#orderFor(enabled === "Disabled" ? "None" : target);
    const changes = [...wanted].filter(([id, index]) => this.#bootIndex.get(id) !== index);
    // No two devices may hold one bootindex, even for a moment: the movers are parked past the end first.
    let park = 100;
    for (const [id] of changes) await this.#setBootIndex(id, park++);
    for (const [id, index] of changes) await this.#setBootIndex(id, index);
  }

  async #setBootIndex(id: string, index: number): Promise<void> {
    await this.#execute("qom-set", { path: `/machine/peripheral/${id}`, property: "bootindex", value: index });
    this.#bootIndex.set(id, index);
  }
}

/** SIGKILL to a process's group (QEMU and whatever its prefix started). */
function killGroup(proc: QemuProcess): void {
  const pid = proc.child.pid;
  if (pid === undefined || proc.exited) return;
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // already gone
  }
}
