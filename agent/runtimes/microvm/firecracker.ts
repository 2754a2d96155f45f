// The firecracker backend: the microvm core driving firecracker's HTTP API on its unix socket
// (<workDir>/firecracker.sock): logger through --log-path, boot source, drives (root, then the
// seed read-only), machine config, the tap as eth0, InstanceStart; SendCtrlAltDel to stop. The
// VMM runs detached inside the guest's network namespace, as it would under its jailer; the guest's
// serial console is its stdout (appended to console.log), its log is vmm.log. Firecracker exits
// when the guest resets (reboot=k on x86) and logs "Firecracker exiting successfully": that line
// is how a guest's own ending is told from a VMM that died. Tested against the API fake in
// testing/firecracker-fake.ts (docs/firecracker.md).
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import { request } from "node:http";
import path from "node:path";
import { AgentError } from "../../contracts.ts";
import type { Accel, VmmBackend, VmmLaunch } from "./backend.ts";
import { MicroVmRuntime, type MicroVmRuntimeOptions } from "./core.ts";
import { lastLines, run, sleep } from "./helpers.ts";
import { inNetns } from "./qemu.ts";

/** What the fake prints on its second `--version` line: it runs guests under QEMU TCG, needs no KVM. */
export const FIRECRACKER_FAKE_MARKER = "bc firecracker fake";

export interface FirecrackerBackendOptions {
  /** The firecracker command (argv prefix); default ["firecracker"]. */
  binary?: string[];
  /** How long the API socket may take to appear after the process starts. */
  socketTimeoutMs?: number;
}

/** Written into the work dir at start, so a later agent (adoption) finds the socket and the log. */
interface FirecrackerFiles {
  apiSock: string;
  vmmLog: string;
}

const FILES = "firecracker.json";
const EXITED_CLEANLY = "Firecracker exiting successfully. exit_code=0";
// sun_path holds 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH = 107;

export class FirecrackerBackend implements VmmBackend {
  readonly id = "firecracker";
  private readonly binary: string[];
  private readonly socketTimeoutMs: number;

  constructor(opts: FirecrackerBackendOptions = {}) {
    this.binary = opts.binary ?? ["firecracker"];
    this.socketTimeoutMs = opts.socketTimeoutMs ?? 30_000;
  }

  async probe(): Promise<{ ok: boolean; accel: Accel; detail: string }> {
    let version: string;
    try {
      version = await run([...this.binary, "--version"], { timeoutMs: 30_000 });
    } catch (error) {
      return { ok: false, accel: "kvm", detail: `${this.binary.join(" ")} --version failed: ${(error as Error).message}` };
    }
    const [first = "", second = ""] = version.trim().split("\n").filter(Boolean);
    if (second.startsWith(FIRECRACKER_FAKE_MARKER)) return { ok: true, accel: "tcg", detail: `${first} (${second}); no KVM needed` };
    // Real firecracker only runs on KVM (and there is no TCG to fall back to).
    try {
      await access("/dev/kvm", constants.R_OK | constants.W_OK);
    } catch {
      return { ok: false, accel: "kvm", detail: `${first}: firecracker needs /dev/kvm, which is missing or not accessible` };
    }
    return { ok: true, accel: "kvm", detail: `${first} on /dev/kvm` };
  }

  async start(launch: VmmLaunch): Promise<{ pid: number }> {
    const files: FirecrackerFiles = { apiSock: path.join(launch.workDir, "firecracker.sock"), vmmLog: launch.vmmLog };
    if (Buffer.byteLength(files.apiSock) > MAX_SOCKET_PATH) {
      throw new AgentError(
        "FAILED_PRECONDITION",
        `the API socket path ${files.apiSock} is longer than a unix socket allows: use a shorter runtime dir`,
      );
    }
    await rm(files.apiSock, { force: true });
    await writeFileAtomic(path.join(launch.workDir, FILES), JSON.stringify(files));
    // Firecracker opens its log file without O_APPEND (writing from offset 0): one log per VMM run.
    const vmmLog = await open(launch.vmmLog, "w");
    const consoleLog = await open(launch.consoleLog, "a");
    const argv = inNetns(launch.net?.netns, [
      ...this.binary,
      "--api-sock",
      files.apiSock,
      "--id",
      launch.name,
      "--log-path",
      launch.vmmLog,
      "--level",
      "Info",
    ]);
    let child;
    try {
      child = spawn(argv[0]!, argv.slice(1), { detached: true, stdio: ["ignore", consoleLog.fd, vmmLog.fd] });
    } finally {
      await vmmLog.close();
      await consoleLog.close();
    }
    child.unref();
    const pid = child.pid;
    if (pid === undefined) throw new AgentError("DRIVER_ERROR", `could not start ${argv[0]}`);
    let exited = false;
    child.once("exit", () => (exited = true));
    child.once("error", () => (exited = true));
    try {
      await this.waitForSocket(files.apiSock, () => exited);
      const root = launch.drives.find((d) => d.id === "root");
      await api(files.apiSock, "PUT", "/boot-source", {
        kernel_image_path: launch.kernel,
        initrd_path: launch.initrd,
        boot_args: launch.cmdline,
      });
      for (const drive of launch.drives) {
        await api(files.apiSock, "PUT", `/drives/${drive.id}`, {
          drive_id: drive.id,
          path_on_host: drive.path,
          is_root_device: drive === root,
          is_read_only: drive.readOnly,
        });
      }
      await api(files.apiSock, "PUT", "/machine-config", { vcpu_count: launch.vcpus, mem_size_mib: launch.memoryMiB, smt: false });
      if (launch.net) {
        await api(files.apiSock, "PUT", "/network-interfaces/eth0", {
          iface_id: "eth0",
          host_dev_name: launch.net.tap,
          guest_mac: launch.net.mac,
        });
      }
      await api(files.apiSock, "PUT", "/actions", { action_type: "InstanceStart" });
    } catch (error) {
      killGroup(pid);
      if (error instanceof AgentError) throw error;
      throw new AgentError("DRIVER_ERROR", `firecracker did not start: ${(error as Error).message}`);
    }
    return { pid };
  }

  async requestShutdown(workDir: string): Promise<void> {
    const files = await readFiles(workDir);
    await api(files.apiSock, "PUT", "/actions", { action_type: "SendCtrlAltDel" });
  }

  async exitReason(workDir: string): Promise<{ reason: "guest_poweroff" | "vmm_exited"; detail: string }> {
    const files = await readFiles(workDir);
    const log = await readFile(files.vmmLog, "utf8").catch(() => "");
    if (log.includes(EXITED_CLEANLY)) return { reason: "guest_poweroff", detail: "the guest reset or powered off; firecracker exited 0" };
    return { reason: "vmm_exited", detail: `firecracker exited: ${lastLines(log.trim(), 3, 500) || "no log output"}` };
  }

  /** Waits until the API answers GET /; fails early when the process exits first (its log says why). */
  private async waitForSocket(apiSock: string, exited: () => boolean): Promise<void> {
    const deadline = Date.now() + this.socketTimeoutMs;
    for (;;) {
      if (exited()) throw new AgentError("DRIVER_ERROR", "firecracker exited before serving its API");
      try {
        await api(apiSock, "GET", "/");
        return;
      } catch (error) {
        if (error instanceof AgentError && error.code === "DRIVER_ERROR") throw error;
      }
      if (Date.now() > deadline)
        throw new AgentError("DRIVER_ERROR", `firecracker's API socket did not answer within ${this.socketTimeoutMs} ms`);
      await sleep(100);
    }
  }
}

export type FirecrackerRuntimeOptions = Omit<MicroVmRuntimeOptions, "backend"> & { firecracker?: FirecrackerBackendOptions };

/** The `firecracker` runtime: the microvm core over this backend (bcd offers it with --firecracker-bin). */
export function firecrackerRuntime(options: FirecrackerRuntimeOptions): MicroVmRuntime {
  const { firecracker, ...rest } = options;
  return new MicroVmRuntime({ ...rest, backend: new FirecrackerBackend(firecracker) });
}

/**
 * One API call. A refusal (4xx/5xx) is DRIVER_ERROR carrying firecracker's fault_message; a socket
 * that does not answer is UNAVAILABLE (the VMM is gone or not up yet).
 */
function api(socketPath: string, method: "GET" | "PUT", route: string, body?: unknown): Promise<unknown> {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        method,
        path: route,
        agent: false,
        timeout: 10_000,
        headers: {
          Accept: "application/json",
          ...(payload ? { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(payload) } : {}),
        },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) return resolve(text ? JSON.parse(text) : undefined);
          reject(new AgentError("DRIVER_ERROR", `firecracker refused ${method} ${route} (${status}): ${faultMessage(text)}`));
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("timed out")));
    req.on("error", (error) => reject(new AgentError("UNAVAILABLE", `firecracker API ${method} ${route}: ${error.message}`)));
    req.end(payload);
  });
}

function faultMessage(text: string): string {
  try {
    const message = (JSON.parse(text) as { fault_message?: unknown }).fault_message;
    if (typeof message === "string") return message.slice(0, 500);
  } catch {
    // not JSON: fall through
  }
  return text.slice(0, 200) || "no fault_message";
}

async function readFiles(workDir: string): Promise<FirecrackerFiles> {
  try {
    return JSON.parse(await readFile(path.join(workDir, FILES), "utf8")) as FirecrackerFiles;
  } catch {
    throw new AgentError("FAILED_PRECONDITION", `no firecracker VMM was started in ${workDir}`);
  }
}

async function writeFileAtomic(file: string, text: string): Promise<void> {
  await writeFile(`${file}.tmp`, text);
  await rename(`${file}.tmp`, file);
}

/** The VMM leads its own process group (spawned detached): kill it whole. */
function killGroup(pid: number): void {
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // already gone
  }
}
