// The qemu-microvm backend: QEMU's `microvm` machine (../shared/MICROVM.md's shape), QMP on a unix
// socket in the work dir. qemuCommand is pure (the firecracker fake boots through it too).
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { access, constants, mkdtemp, open, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { AgentError, type AgentLogger } from "../../contracts.ts";
import type { Accel, VmmBackend, VmmLaunch } from "./backend.ts";
import { lastLines, run, sleep } from "./helpers.ts";
import { QmpConnection } from "./qmp.ts";

export interface QemuCommandOptions {
  /** QMP control socket; default <workDir>/qmp.sock. */
  qmpSocket?: string;
  /** Default qemu-system-x86_64 (from PATH). */
  qemuBin?: string;
}

/**
 * The QEMU argv that runs one guest (argv[0] is QEMU). It must run inside launch.net.netns when
 * launch.net is set: wrap it with inNetns (start does; the firecracker fake already runs inside).
 * The work dir is named in the argv (-pidfile, the console path): adoption finds a running VMM by
 * its /proc cmdline.
 */
export function qemuCommand(launch: VmmLaunch, opts: QemuCommandOptions = {}): { argv: string[] } {
  const qmp = opts.qmpSocket ?? `${launch.workDir}/qmp.sock`;
  const qemu = [
    opts.qemuBin ?? "qemu-system-x86_64",
    ...["-name", launch.name],
    ...["-M", "microvm"],
    ...["-accel", launch.accel],
    ...["-cpu", launch.accel === "kvm" ? "host" : "max"],
    ...["-m", `${launch.memoryMiB}M`],
    ...["-smp", String(launch.vcpus)],
    "-nodefaults",
    "-no-user-config",
    ...["-display", "none"],
    "-no-reboot",
    ...["-kernel", launch.kernel],
    ...["-initrd", launch.initrd],
    ...["-append", launch.cmdline],
    ...["-chardev", `file,id=console,path=${launch.consoleLog},append=on`],
    ...["-serial", "chardev:console"],
  ];
  for (const drive of launch.drives) {
    qemu.push("-drive", `id=${drive.id},file=${drive.path},format=raw,if=none${drive.readOnly ? ",readonly=on" : ""}`);
    qemu.push("-device", `virtio-blk-device,drive=${drive.id}`);
  }
  if (launch.net) {
    // script=no,downscript=no: otherwise QEMU runs /etc/qemu-ifup in the root namespace.
    qemu.push("-netdev", `tap,id=net0,ifname=${launch.net.tap},script=no,downscript=no`);
    qemu.push("-device", `virtio-net-device,netdev=net0,mac=${launch.net.mac}`);
  }
  qemu.push("-qmp", `unix:${qmp},server=on,wait=off`);
  qemu.push("-pidfile", `${launch.workDir}/vmm.pid`);
  return { argv: qemu };
}

/** argv run inside the named network namespace. */
export function inNetns(netns: string | undefined, argv: string[]): string[] {
  return netns ? ["ip", "netns", "exec", netns, ...argv] : argv;
}

export interface QemuBackendOptions {
  qemuBin?: string;
  /** Skip the probe and use this accelerator. */
  accel?: Accel;
  /** The kernel and initrd the KVM probe boots (the guest image); without one the probe picks TCG. */
  probeImage?: () => Promise<{ kernel: string; initrd: string }>;
  /** How long the KVM probe boot may take to reach the guest's init (default 15 s). */
  probeTimeoutMs?: number;
  log?: AgentLogger;
}

/** SHUTDOWN reasons that mean the guest ended itself (MICROVM.md's table); anything else is the VMM's end. */
const GUEST_ENDINGS = new Set(["guest-shutdown", "guest-reset"]);

export class QemuBackend implements VmmBackend {
  readonly id = "qemu-microvm";
  readonly #qmp = new Map<string, QmpConnection>();
  #probe: Promise<{ ok: boolean; accel: Accel; detail: string }> | undefined;

  constructor(private readonly options: QemuBackendOptions = {}) {}

  #bin(): string {
    return this.options.qemuBin ?? "qemu-system-x86_64";
  }

  probe(): Promise<{ ok: boolean; accel: Accel; detail: string }> {
    this.#probe ??= this.#runProbe();
    return this.#probe;
  }

  async #runProbe(): Promise<{ ok: boolean; accel: Accel; detail: string }> {
    let version: string;
    try {
      version = (await run([this.#bin(), "--version"])).split("\n")[0]!.trim();
    } catch (e) {
      return { ok: false, accel: "tcg", detail: `no QEMU: ${(e as Error).message}` };
    }
    if (this.options.accel) return { ok: true, accel: this.options.accel, detail: `${version}; ${this.options.accel} as configured` };
    try {
      await access("/dev/kvm", constants.R_OK | constants.W_OK);
    } catch {
      return { ok: true, accel: "tcg", detail: `${version}; no usable /dev/kvm: using TCG` };
    }
    if (!this.options.probeImage) return { ok: true, accel: "tcg", detail: `${version}; no image to probe KVM with: using TCG` };
    const verdict = await this.#probeKvm(await this.options.probeImage());
    this.options.log?.info("qemu-microvm accelerator", { accel: verdict.accel, detail: verdict.detail });
    return { ok: true, accel: verdict.accel, detail: `${version}; ${verdict.detail}` };
  }

  /** Boots the image once under KVM: a nested KVM that cannot run a stock kernel never reaches its init. */
  async #probeKvm(image: { kernel: string; initrd: string }): Promise<{ accel: Accel; detail: string }> {
    const dir = await mkdtemp(path.join(tmpdir(), "bc-kvm-probe-"));
    const consoleLog = path.join(dir, "console.log");
    const { argv } = qemuCommand(
      {
        name: "kvm-probe",
        workDir: dir,
        kernel: image.kernel,
        initrd: image.initrd,
        cmdline: "console=ttyS0 reboot=k panic=-1",
        vcpus: 1,
        memoryMiB: 128,
        drives: [],
        consoleLog,
        vmmLog: path.join(dir, "vmm.log"),
        accel: "kvm",
      },
      { qemuBin: this.options.qemuBin },
    );
    const child = spawn(argv[0]!, argv.slice(1), { stdio: "ignore" });
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    const deadline = Date.now() + (this.options.probeTimeoutMs ?? 15_000);
    let reached = false;
    let gone = false;
    void exited.then(() => (gone = true));
    while (!reached && !gone && Date.now() < deadline) {
      await sleep(200);
      const text = await readFile(consoleLog, "utf8").catch(() => "");
      reached = /Run \/init as init process|bc-guest|bc-report/.test(text);
    }
    child.kill("SIGKILL");
    await exited;
    await rm(dir, { recursive: true, force: true });
    if (reached) return { accel: "kvm", detail: "KVM probe boot reached the guest's init: using KVM" };
    return { accel: "tcg", detail: `KVM probe boot ${gone ? "exited" : "did not reach the guest's init"}: using TCG` };
  }

  async start(launch: VmmLaunch): Promise<{ pid: number }> {
    const qmpSocket = path.join(launch.workDir, "qmp.sock");
    await rm(qmpSocket, { force: true });
    await rm(path.join(launch.workDir, "exit-event.json"), { force: true });
    const { argv: qemu } = qemuCommand(launch, { qmpSocket, qemuBin: this.options.qemuBin });
    const argv = inNetns(launch.net?.netns, qemu);
    const log = await open(launch.vmmLog, "a", 0o600);
    let child;
    try {
      // Its own session, stdio to vmm.log: the guest outlives the agent (a later agent adopts it).
      child = spawn(argv[0]!, argv.slice(1), { detached: true, stdio: ["ignore", log.fd, log.fd] });
    } finally {
      await log.close();
    }
    let exited = false;
    child.once("exit", () => (exited = true));
    child.once("error", () => (exited = true));
    child.unref();
    const pid = child.pid;
    // Started = the control socket is up (QEMU has parsed its options and created the machine).
    const deadline = Date.now() + 30_000;
    for (;;) {
      if (exited || pid === undefined) {
        const out = await readFile(launch.vmmLog, "utf8").catch(() => "");
        throw new AgentError("DRIVER_ERROR", `QEMU exited at start: ${lastLines(out.trim(), 5, 1000) || "no output"}`);
      }
      if (
        await stat(qmpSocket).then(
          () => true,
          () => false,
        )
      )
        return { pid };
      if (Date.now() > deadline) {
        process.kill(pid, "SIGKILL");
        throw new AgentError("DRIVER_ERROR", "QEMU did not create its QMP socket within 30 s");
      }
      await sleep(50);
    }
  }

  async attach(workDir: string): Promise<() => void> {
    const exitEvent = path.join(workDir, "exit-event.json");
    const qmp = await QmpConnection.open(path.join(workDir, "qmp.sock"), (event) => {
      // Written at once: the death watch may look for it as soon as QEMU is gone.
      if (event.event === "SHUTDOWN")
        writeFileSync(exitEvent, `${JSON.stringify({ reason: event.data?.reason ?? "unknown", guest: event.data?.guest })}\n`);
    });
    this.#qmp.set(workDir, qmp);
    void qmp.closed.then(() => this.#qmp.get(workDir) === qmp && this.#qmp.delete(workDir));
    return () => qmp.close();
  }

  /** ACPI power button (QMP system_powerdown): the guest runs acpid, which powers it off. */
  async requestShutdown(workDir: string): Promise<void> {
    const attached = this.#qmp.get(workDir);
    if (attached) {
      await attached.execute("system_powerdown");
      return;
    }
    const qmp = await QmpConnection.open(path.join(workDir, "qmp.sock"));
    try {
      await qmp.execute("system_powerdown");
    } finally {
      qmp.close();
    }
  }

  async exitReason(workDir: string): Promise<{ reason: "guest_poweroff" | "vmm_exited"; detail: string }> {
    let event: { reason?: string };
    try {
      event = JSON.parse(await readFile(path.join(workDir, "exit-event.json"), "utf8")) as { reason?: string };
    } catch {
      return { reason: "vmm_exited", detail: "QEMU exited without a SHUTDOWN event (killed, or nobody was watching)" };
    }
    const why = String(event.reason ?? "unknown");
    return GUEST_ENDINGS.has(why)
      ? { reason: "guest_poweroff", detail: `the guest ended itself (${why})` }
      : { reason: "vmm_exited", detail: `QEMU shut down: ${why}` };
  }
}
