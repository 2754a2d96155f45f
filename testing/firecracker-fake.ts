// A faithful fake of the firecracker VMM (no firecracker binary is available to these machines):
// it serves firecracker's HTTP API on its unix socket as the published spec defines it, refuses
// what firecracker refuses (unknown fields, wrong types, missing fields, a path id that differs
// from the body's, pre-boot calls after InstanceStart) with firecracker's status and
// `{"fault_message": ...}` body, and on InstanceStart boots the configured guest with QEMU's
// microvm machine under TCG (qemuCommand, the qemu-microvm backend's builder) so the firecracker
// path runs end to end except for the VMM binary itself.
//
//   node --import tsx testing/firecracker-fake.ts --api-sock PATH [--id NAME] [--log-path FILE] [--level L]
//
// As firecracker: the guest's serial console is this process's stdout; the VMM's log goes to
// --log-path (or stdout); SendCtrlAltDel types Ctrl+Alt+Del into an emulated i8042 (QMP send-key)
// and the guest resets with reboot=k; on a guest reset it logs "Firecracker exiting successfully.
// exit_code=0" and exits 0. Where it differs: a guest poweroff (ACPI) also ends it (firecracker on
// x86 has no ACPI power-off and stays alive). Runs inside the guest's network namespace, as
// firecracker does under its jailer; QEMU gets the fake's netns, stdout and stderr.
import { spawn, type ChildProcess } from "node:child_process";
import { appendFileSync, closeSync, existsSync, mkdtempSync, openSync, rmSync, statSync, unlinkSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import type { VmmLaunch } from "../agent/runtimes/microvm/backend.ts";
import { FIRECRACKER_FAKE_MARKER } from "../agent/runtimes/microvm/firecracker.ts";
import { sleep } from "../agent/runtimes/microvm/helpers.ts";
import { QmpConnection, type QmpEvent } from "../agent/runtimes/microvm/qmp.ts";
import { qemuCommand } from "../agent/runtimes/microvm/qemu.ts";
import {
  BootSource,
  Drive,
  InstanceActionInfo,
  Logger,
  MachineConfiguration,
  NetworkInterface,
  parseBody,
  type InstanceInfo,
} from "./firecracker-api.ts";

/** The firecracker release whose API this fake serves. */
const FAKE_FIRECRACKER_VERSION = "1.17.0";

// Firecracker's own messages (src/vmm/src/rpc_interface.rs, api_server/parsed_request.rs).
const POST_BOOT = "The requested operation is not supported after starting the microVM.";
const PRE_BOOT = "The requested operation is not supported before starting the microVM.";
const DEFAULT_KERNEL_CMDLINE = "reboot=k panic=1 nomodule 8250.nr_uarts=0 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce";

class Fault extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

interface FakeOptions {
  apiSock: string;
  id: string;
  logPath?: string;
}

class FirecrackerFake {
  private state: InstanceInfo["state"] = "Not started";
  private bootSource?: BootSource;
  private readonly drives = new Map<string, Drive>();
  private machine: MachineConfiguration = { vcpu_count: 1, mem_size_mib: 128, smt: false, track_dirty_pages: false, huge_pages: "None" };
  private readonly interfaces = new Map<string, NetworkInterface>();
  private logPath?: string;
  private qemu?: ChildProcess;
  private qmp?: QmpConnection;
  private exiting = false;

  constructor(private readonly opts: FakeOptions) {
    this.logPath = opts.logPath;
  }

  /** Serves the API until the guest ends; resolves with the process exit code. */
  run(): Promise<number> {
    return new Promise((resolve) => {
      this.finish = (code) => {
        server.close();
        resolve(code);
      };
      const server = createServer((req, res) => void this.handle(req, res));
      server.on("error", (error) => {
        this.log(`Failed to open the API socket: ${error.message}`);
        this.log("Firecracker exiting with error. exit_code=1");
        resolve(1);
      });
      server.listen(this.opts.apiSock, () => this.log(`Running Firecracker v${FAKE_FIRECRACKER_VERSION}`));
    });
  }

  private finish: (code: number) => void = () => {};

  /** One log line in firecracker's format: `<time> [<id>:<thread>] <message>`. */
  private log(message: string): void {
    const line = `${new Date().toISOString()} [${this.opts.id}:main] ${message}\n`;
    if (this.logPath) appendFileSync(this.logPath, line);
    else process.stdout.write(line);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let raw = "";
    for await (const chunk of req) raw += chunk;
    const url = new URL(req.url ?? "/", "http://localhost");
    this.log(`The API server received a ${req.method} request on "${url.pathname}".`);
    try {
      const body = await this.route(req.method ?? "GET", url.pathname, raw);
      if (body === undefined) res.writeHead(204).end();
      else res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(body));
    } catch (error) {
      const fault = error instanceof Fault ? error : new Fault(500, (error as Error).message);
      this.log(`Received Error. Status code: ${fault.status}. Message: ${fault.message}`);
      res.writeHead(fault.status, { "Content-Type": "application/json" }).end(JSON.stringify({ fault_message: fault.message }));
    }
  }

  private async route(method: string, pathname: string, raw: string): Promise<unknown> {
    const [resource = "", id, ...rest] = pathname.replace(/^\/+/, "").split("/");
    const invalid = new Fault(400, `Invalid request method and/or path: ${method} ${resource}.`);
    if (rest.length > 0) throw invalid;
    if (method === "GET" && id === undefined) {
      if (resource === "") return { id: this.opts.id, state: this.state, vmm_version: FAKE_FIRECRACKER_VERSION, app_name: "Firecracker" };
      if (resource === "machine-config") return this.machine;
      if (resource === "version") return { firecracker_version: FAKE_FIRECRACKER_VERSION };
      throw invalid;
    }
    if (method !== "PUT" || raw.length === 0) throw invalid;
    // The VM's singletons, PUT without an id; a drive or a network interface is named by one.
    const singletons: Record<string, () => unknown> = {
      actions: () => this.action(parse(InstanceActionInfo, raw)),
      "boot-source": () => this.putBootSource(parse(BootSource, raw)),
      "machine-config": () => this.putMachineConfig(parse(MachineConfiguration, raw)),
      logger: () => this.putLogger(parse(Logger, raw)),
    };
    if (Object.hasOwn(singletons, resource)) {
      if (id === undefined) return singletons[resource]!();
      throw invalid;
    }
    if (resource === "drives") return this.putDrive(checkedId(id), parse(Drive, raw));
    if (resource === "network-interfaces") return this.putInterface(checkedId(id), parse(NetworkInterface, raw));
    throw invalid;
  }

  private preBootOnly(): void {
    if (this.state !== "Not started") throw new Fault(400, POST_BOOT);
  }

  private putBootSource(source: BootSource): void {
    this.preBootOnly();
    if (!readable(source.kernel_image_path))
      throw new Fault(400, "Boot source error: The kernel file cannot be opened: No such file or directory (os error 2)");
    if (source.initrd_path && !readable(source.initrd_path))
      throw new Fault(
        400,
        "Boot source error: The initrd file cannot be opened due to invalid path or invalid permissions. No such file or directory (os error 2)",
      );
    this.bootSource = source;
  }

  private putDrive(pathId: string, drive: Drive): void {
    if (drive.drive_id !== pathId) throw new Fault(400, "The id from the path does not match the id from the body!");
    this.preBootOnly();
    if (!drive.path_on_host || drive.socket) throw new Fault(400, "Drive config error: Unable to create the virtio block device: Config");
    if (!readable(drive.path_on_host))
      throw new Fault(
        400,
        "Drive config error: Unable to create the virtio block device: Virtio backend error: Error manipulating the backing file: No such file or directory (os error 2)",
      );
    const otherRoot = [...this.drives.values()].find((d) => d.is_root_device && d.drive_id !== drive.drive_id);
    if (drive.is_root_device && otherRoot) throw new Fault(400, "Drive config error: A root block device already exists!");
    this.drives.set(drive.drive_id, drive);
  }

  private putMachineConfig(config: MachineConfiguration): void {
    this.preBootOnly();
    const smt = config.smt ?? false;
    if (config.vcpu_count < 1 || config.vcpu_count > 32 || (smt && config.vcpu_count > 1 && config.vcpu_count % 2 === 1))
      throw new Fault(
        400,
        "Machine config error: The number of vCPUs must be greater than 0, less than 32 and must be 1 or an even number if SMT is enabled.",
      );
    if (config.mem_size_mib === 0)
      throw new Fault(400, "Machine config error: The memory size (MiB) is either 0, or not a multiple of the configured page size.");
    // Optional fields not given are reset to their defaults (the spec's PUT semantics).
    this.machine = { smt, track_dirty_pages: false, huge_pages: "None", ...config };
  }

  private putInterface(pathId: string, iface: NetworkInterface): void {
    if (iface.iface_id !== pathId)
      throw new Fault(400, `The id from the path [${pathId}] does not match the id from the body [${iface.iface_id}]!`);
    this.preBootOnly();
    // Firecracker opens the tap here; it must exist in the namespace the VMM runs in.
    if (!existsSync(`/sys/class/net/${iface.host_dev_name}`))
      throw new Fault(400, `Network config error: Cannot open/create the tap device: Open tap device failed: ${iface.host_dev_name}`);
    const mac = iface.guest_mac?.toLowerCase();
    if (mac && [...this.interfaces.values()].some((other) => other.iface_id !== pathId && other.guest_mac?.toLowerCase() === mac))
      throw new Fault(400, `Network config error: The MAC address is already in use: ${iface.guest_mac}`);
    this.interfaces.set(pathId, iface);
  }

  private putLogger(logger: Logger): void {
    this.preBootOnly();
    if (logger.log_path) this.logPath = logger.log_path;
  }

  private async action(info: InstanceActionInfo): Promise<void> {
    if (info.action_type === "FlushMetrics") return;
    if (info.action_type === "SendCtrlAltDel") {
      if (this.state === "Not started") throw new Fault(400, PRE_BOOT);
      await this.qmp?.execute("send-key", { keys: ["ctrl", "alt", "delete"].map((key) => ({ type: "qcode", data: key })) });
      return;
    }
    this.preBootOnly();
    if (!this.bootSource) throw new Fault(400, "Start microvm error: Cannot start microvm without kernel configuration.");
    if (this.interfaces.size > 1) throw new Fault(400, "Start microvm error: this fake boots at most one network interface");
    await this.startGuest(this.bootSource);
    this.state = "Running";
  }

  /** Boots the configured guest: QEMU microvm under TCG, the drives passed as open files. */
  private async startGuest(source: BootSource): Promise<void> {
    // Root first (/dev/vda), then the others in the order they were put, as firecracker orders them.
    const drives = [...this.drives.values()].sort((a, b) => Number(b.is_root_device) - Number(a.is_root_device));
    const root = drives.find((d) => d.is_root_device);
    let cmdline = source.boot_args ?? DEFAULT_KERNEL_CMDLINE;
    if (root) cmdline += ` ${root.partuuid ? `root=PARTUUID=${root.partuuid}` : "root=/dev/vda"} ${root.is_read_only ? "ro" : "rw"}`;
    const iface = [...this.interfaces.values()][0];
    // QEMU's argv must not name the work dir (only the VMM process may: the runtime finds its VMM
    // by /proc cmdline), so drives are passed as inherited descriptors and QMP lives in a temp dir.
    const privateDir = mkdtempSync(path.join(tmpdir(), "bc-fc-fake-"));
    const fds = drives.map((d) => openSync(d.path_on_host!, d.is_read_only ? "r" : "r+"));
    const launch: VmmLaunch = {
      name: this.opts.id,
      workDir: privateDir,
      kernel: source.kernel_image_path,
      initrd: source.initrd_path ?? "",
      cmdline,
      vcpus: this.machine.vcpu_count,
      memoryMiB: this.machine.mem_size_mib,
      // QEMU only needs a unique id per drive; firecracker's ids are alphanumeric, which QEMU accepts.
      drives: drives.map((d, i) => ({ id: d.drive_id as "root", path: `/proc/self/fd/${3 + i}`, readOnly: d.is_read_only ?? false })),
      net: iface ? { netns: "", tap: iface.host_dev_name, mac: iface.guest_mac ?? "06:00:00:00:00:01" } : undefined,
      consoleLog: "", // replaced below: the serial console goes to stdout

      vmmLog: "",
      accel: "tcg",
    };
    const qmpSocket = path.join(privateDir, "qmp.sock");
    let argv = qemuCommand(launch, { qmpSocket }).argv;
    if (!source.initrd_path) argv = withoutFlag(argv, "-initrd");
    argv = serialOnStdout(argv);
    // Firecracker's i8042: the keyboard controller SendCtrlAltDel types into and whose reset line
    // ends the VMM when the guest reboots with reboot=k.
    argv.push("-device", "i8042");
    // setpriv --pdeathsig: QEMU dies with the fake, as a guest dies with its firecracker process.
    const qemu = spawn("setpriv", ["--pdeathsig", "KILL", "--", ...argv], { stdio: ["ignore", "inherit", "inherit", ...fds] });
    for (const fd of fds) closeSync(fd);
    this.qemu = qemu;
    qemu.once("exit", (code, signal) => this.qemuExited(code, signal));
    try {
      this.qmp = await connectQmp(qmpSocket, qemu, (event) => this.qmpEvent(event));
    } finally {
      // Connected (QEMU serves one QMP client): the temp dir is not needed, and a killed fake leaves none.
      rmSync(privateDir, { recursive: true, force: true });
    }
  }

  private qmpEvent(event: QmpEvent): void {
    if (event.event !== "SHUTDOWN") return;
    const reason = event.data?.reason;
    if (reason === "guest-shutdown" || reason === "guest-reset") this.exiting = true;
  }

  private qemuExited(code: number | null, signal: NodeJS.Signals | null): void {
    this.state = "Not started";
    if (this.exiting && code === 0) {
      this.log("Vmm is stopping.");
      this.log("Firecracker exiting successfully. exit_code=0");
      this.finish(0);
      return;
    }
    this.log(`The guest's VMM (QEMU behind the fake) ended: ${signal ? `signal ${signal}` : `exit code ${code}`}`);
    this.log("Firecracker exiting with error. exit_code=1");
    this.finish(1);
  }

  /** SIGTERM: the guest ends with the VMM. */
  stop(): void {
    this.qemu?.kill("SIGKILL");
  }
}

function parse<T extends Parameters<typeof parseBody>[0]>(schema: T, raw: string) {
  const parsed = parseBody(schema, raw);
  if (!parsed.ok) throw new Fault(400, parsed.fault);
  return parsed.value;
}

/** Firecracker's checked_id: a path id is non-empty, alphanumeric or underscore. */
function checkedId(id: string | undefined): string {
  if (!id) throw new Fault(400, "The ID cannot be empty.");
  if (!/^[\p{L}\p{N}_]+$/u.test(id)) throw new Fault(400, "API Resource IDs can only contain alphanumeric characters and underscores.");
  return id;
}

function readable(file: string): boolean {
  try {
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/** The guest's serial console on QEMU's stdout (this process's, inherited), as firecracker's is on its own. */
function serialOnStdout(argv: string[]): string[] {
  const at = argv.findIndex((arg) => arg.startsWith("file,id=console,"));
  if (at < 0) throw new Error("qemuCommand no longer has the console chardev this fake replaces");
  return argv.with(at, "stdio,id=console,signal=off");
}

function withoutFlag(argv: string[], flag: string): string[] {
  const at = argv.indexOf(flag);
  return at < 0 ? argv : [...argv.slice(0, at), ...argv.slice(at + 2)];
}

/** Connects to QEMU's QMP socket once QEMU has made it (or fails when QEMU exits first). */
async function connectQmp(socketPath: string, qemu: ChildProcess, onEvent: (event: QmpEvent) => void): Promise<QmpConnection> {
  for (;;) {
    if (qemu.exitCode !== null || qemu.signalCode !== null) throw new Fault(400, "Start microvm error: the VMM could not start the guest");
    try {
      return await QmpConnection.open(socketPath, onEvent);
    } catch {
      await sleep(50);
    }
  }
}

/** firecracker's command line, for the options this fake knows; anything else is refused as firecracker does. */
function parseArgs(argv: string[]): FakeOptions | { version: true } {
  const values = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--version") return { version: true };
    if (!["--api-sock", "--id", "--log-path", "--level"].includes(arg) || argv[i + 1] === undefined)
      throw new Error(`Arguments parsing error: Found argument '${arg}' which wasn't expected, or isn't valid in this context.`);
    values.set(arg, argv[++i]!);
  }
  const apiSock = values.get("--api-sock");
  if (!apiSock) throw new Error("Arguments parsing error: --api-sock is required by this fake (it serves the API only).");
  const id = values.get("--id") ?? "anonymous-instance";
  if (!/^[a-zA-Z0-9-]{1,64}$/.test(id)) throw new Error(`Invalid instance ID: ${id}`);
  return { apiSock, id, logPath: values.get("--log-path") };
}

async function main(): Promise<void> {
  let opts: ReturnType<typeof parseArgs>;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`${(error as Error).message}\n`);
    process.exit(1);
  }
  if ("version" in opts) {
    process.stdout.write(
      `Firecracker v${FAKE_FIRECRACKER_VERSION}\n${FIRECRACKER_FAKE_MARKER}: guests run under QEMU TCG behind the API\n`,
    );
    return;
  }
  const fake = new FirecrackerFake(opts);
  const done = (signal: NodeJS.Signals) => {
    fake.stop();
    process.exit(128 + (signal === "SIGINT" ? 2 : 15));
  };
  process.once("SIGTERM", done);
  process.once("SIGINT", done);
  const code = await fake.run();
  if (existsSync(opts.apiSock)) unlinkSync(opts.apiSock);
  process.exit(code);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
