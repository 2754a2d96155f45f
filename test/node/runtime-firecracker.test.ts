// The firecracker runtime: the microvm core over the FirecrackerBackend, driving the firecracker
// API fake (testing/firecracker-fake.ts) that validates every request as firecracker's spec
// does and boots the real guest image with QEMU (TCG) behind the API. No firecracker binary is
// available here: everything but the VMM binary itself is exercised (docs/firecracker.md).
// Guests boot one at a time; each boot costs a few seconds of CPU.
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFile, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { request } from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runConformance } from "../../core/conformance/index.ts";
import type { InstanceObserved, InstanceSpec } from "../../agent/runtimes/contract.ts";
import { runtimeConformanceCases, withUserData, type RuntimeSubject } from "../../agent/runtimes/conformance.ts";
import type { VmmBackend, VmmLaunch } from "../../agent/runtimes/microvm/backend.ts";
import { MicroVmRuntime } from "../../agent/runtimes/microvm/core.ts";
import { FirecrackerBackend, firecrackerRuntime } from "../../agent/runtimes/microvm/firecracker.ts";
import { hostTscKhz, processesNaming, run } from "../../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage, type GuestImage } from "../../agent/runtimes/microvm/image.ts";
import { netnsExists, netnsName } from "../../agent/runtimes/microvm/network.ts";
import { writeSeedOnce } from "../../agent/runtimes/microvm/seed.ts";

const repo = path.resolve(import.meta.dirname, "../..");
const FAKE = [process.execPath, "--import", "tsx", path.join(repo, "testing/firecracker-fake.ts")];
const POST_BOOT = "The requested operation is not supported after starting the microVM.";

let image: GuestImage;
let scratch: string;

beforeAll(async () => {
  image = await ensureGuestImage(); // built once into the cache (minutes the first time), reused after
  scratch = await mkdtemp(path.join(tmpdir(), "bc-fc-"));
}, 900_000);

afterAll(async () => {
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

/** One API call to the fake's unix socket, as a client of firecracker would make it. */
function call(
  sock: string,
  method: string,
  route: string,
  body?: unknown,
): Promise<{ status: number; body: Record<string, unknown> | undefined }> {
  const payload = body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: sock, method, path: route, agent: false }, (res) => {
      let text = "";
      res.on("data", (chunk) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined }));
    });
    req.on("error", reject);
    req.end(payload);
  });
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function userData(text: string): { bytes: Buffer; sha256: string } {
  const bytes = Buffer.from(text);
  return { bytes, sha256: createHash("sha256").update(bytes).digest("hex") };
}

describe("the firecracker API fake validates requests as firecracker does", () => {
  const netns = `bc-fcapi-${process.pid}`;
  let dir: string;
  let sock: string;
  let fake: ChildProcess;
  let exited: Promise<number | null>;
  let console_ = "";

  beforeAll(async () => {
    dir = await mkdtemp(path.join(scratch, "api-"));
    sock = path.join(dir, "firecracker.sock");
    // The fake runs inside a namespace holding the tap, as the runtime runs it.
    await run(["ip", "netns", "add", netns]);
    await run(["ip", "-n", netns, "tuntap", "add", "dev", "tap0", "mode", "tap"]);
    fake = spawn("ip", ["netns", "exec", netns, ...FAKE, "--api-sock", sock, "--id", "api-test", "--log-path", path.join(dir, "vmm.log")], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    fake.stdout!.on("data", (chunk) => (console_ += chunk));
    exited = new Promise((resolve) => fake.once("exit", (code) => resolve(code)));
    await waitFor("the API socket", async () => (await call(sock, "GET", "/")).status === 200 || undefined);
  }, 60_000);

  afterAll(async () => {
    if (fake?.exitCode === null) fake.kill("SIGKILL");
    await run(["ip", "netns", "del", netns]).catch(() => {});
  });

  it("refuses unknown fields, wrong types and missing fields with 400 and a fault_message", async () => {
    const refused: [string, unknown, string][] = [
      ["/boot-source", { kernel_image_path: image.kernel, kernel_args: "x" }, "unknown field `kernel_args`"],
      ["/boot-source", { boot_args: "console=ttyS0" }, "missing field `kernel_image_path`"],
      ["/boot-source", { kernel_image_path: 42 }, "kernel_image_path"],
      ["/drives/root", { drive_id: "root", path_on_host: image.rootfs, is_read_only: false }, "missing field `is_root_device`"],
      ["/drives/root", { drive_id: "root", path_on_host: image.rootfs, is_root_device: "yes" }, "is_root_device"],
      [
        "/drives/root",
        { drive_id: "root", path_on_host: image.rootfs, is_root_device: true, rate_limiter: { ops: { size: 1 } } },
        "refill_time",
      ],
      ["/machine-config", { vcpu_count: 1 }, "missing field `mem_size_mib`"],
      ["/machine-config", { vcpu_count: "2", mem_size_mib: 128 }, "vcpu_count"],
      ["/machine-config", { vcpu_count: 1, mem_size_mib: 128, ht_enabled: true }, "unknown field `ht_enabled`"],
      ["/network-interfaces/eth0", { iface_id: "eth0" }, "missing field `host_dev_name`"],
      ["/network-interfaces/eth0", { iface_id: "eth0", host_dev_name: "tap0", guest_mac: "not-a-mac" }, "guest_mac"],
      ["/logger", { log_path: "/tmp/x", colour: true }, "unknown field `colour`"],
      ["/actions", { action_type: "Reboot" }, "action_type"],
      ["/actions", "{not json", "deserializing the json body"],
    ];
    for (const [route, body, fault] of refused) {
      const res = await call(sock, "PUT", route, body);
      expect({ route, status: res.status }).toEqual({ route, status: 400 });
      expect(res.body?.fault_message).toContain(fault);
    }
  });

  it("refuses a path id that differs from the body's, an invalid id, and values the VMM rejects", async () => {
    const refused: [string, unknown, string][] = [
      [
        "/drives/root",
        { drive_id: "seed", path_on_host: image.rootfs, is_root_device: true, is_read_only: false },
        "The id from the path does not match the id from the body!",
      ],
      [
        "/network-interfaces/eth0",
        { iface_id: "eth1", host_dev_name: "tap0" },
        "The id from the path [eth0] does not match the id from the body [eth1]!",
      ],
      [
        "/drives/root-disk",
        { drive_id: "root-disk", path_on_host: image.rootfs, is_root_device: true, is_read_only: false },
        "alphanumeric characters and underscores",
      ],
      ["/machine-config", { vcpu_count: 33, mem_size_mib: 128 }, "The number of vCPUs must be greater than 0"],
      ["/machine-config", { vcpu_count: 3, mem_size_mib: 128, smt: true }, "The number of vCPUs must be greater than 0"],
      ["/machine-config", { vcpu_count: 1, mem_size_mib: 0 }, "The memory size (MiB) is either 0"],
      ["/boot-source", { kernel_image_path: path.join(dir, "no-such-kernel") }, "The kernel file cannot be opened"],
      ["/network-interfaces/eth0", { iface_id: "eth0", host_dev_name: "tap9" }, "Cannot open/create the tap device"],
      ["/actions", { action_type: "SendCtrlAltDel" }, "not supported before starting the microVM"],
      ["/actions", { action_type: "InstanceStart" }, "without kernel configuration"],
      ["/nonexistent", {}, "Invalid request method and/or path"],
    ];
    for (const [route, body, fault] of refused) {
      const res = await call(sock, "PUT", route, body);
      expect({ route, status: res.status }).toEqual({ route, status: 400 });
      expect(res.body?.fault_message).toContain(fault);
    }
    expect((await call(sock, "GET", "/")).body?.state).toBe("Not started");
  });

  it("accepts a full configuration, boots the guest on InstanceStart, refuses pre-boot calls after it, and exits on SendCtrlAltDel", async () => {
    const disk = path.join(dir, "disk.img");
    const seed = path.join(dir, "seed.img");
    await copyFile(image.rootfs, disk);
    const data = userData("#!/bin/sh\necho api-test-user-data\n");
    await writeSeedOnce(seed, { name: "api-test", userData: data.bytes });

    const before = await call(sock, "GET", "/");
    expect(before).toEqual({
      status: 200,
      body: { id: "api-test", state: "Not started", vmm_version: expect.any(String), app_name: "Firecracker" },
    });
    expect((await call(sock, "GET", "/machine-config")).body).toMatchObject({ vcpu_count: 1, mem_size_mib: 128, smt: false });

    const config: [string, unknown][] = [
      ["/logger", { log_path: path.join(dir, "vmm.log"), level: "info", show_level: false }],
      // tsc_early_khz: required under TCG, as the core adds it (the guest hangs calibrating without).
      [
        "/boot-source",
        {
          kernel_image_path: image.kernel,
          initrd_path: image.initrd,
          boot_args: `console=ttyS0 reboot=k panic=-1 quiet tsc_early_khz=${await hostTscKhz()}`,
        },
      ],
      [
        "/drives/root",
        { drive_id: "root", path_on_host: disk, is_root_device: true, is_read_only: false, cache_type: "Unsafe", io_engine: "Sync" },
      ],
      ["/drives/seed", { drive_id: "seed", path_on_host: seed, is_root_device: false, is_read_only: true }],
      ["/machine-config", { vcpu_count: 1, mem_size_mib: 160, smt: false, track_dirty_pages: false }],
      ["/network-interfaces/eth0", { iface_id: "eth0", host_dev_name: "tap0", guest_mac: "06:00:0a:00:02:02" }],
      ["/actions", { action_type: "FlushMetrics" }],
    ];
    for (const [route, body] of config)
      expect({ route, ...(await call(sock, "PUT", route, body)) }).toEqual({ route, status: 204, body: undefined });
    expect((await call(sock, "GET", "/machine-config")).body).toMatchObject({ vcpu_count: 1, mem_size_mib: 160 });

    expect((await call(sock, "PUT", "/actions", { action_type: "InstanceStart" })).status).toBe(204);
    expect((await call(sock, "GET", "/")).body?.state).toBe("Running");
    // The serial console is the fake's stdout: the guest booted from what was configured.
    // A whole line: the console arrives in chunks, and `$` alone would match a line still being written.
    const report = await waitFor("the guest's report", async () => /^bc-report (.*)\r?\n/m.exec(console_)?.[1], 120_000);
    expect(JSON.parse(report)).toMatchObject({ instanceId: "api-test", userDataSha256: data.sha256 });

    for (const [route, body] of config.slice(0, 6)) {
      const res = await call(sock, "PUT", route, body);
      expect({ route, status: res.status, fault: res.body?.fault_message }).toEqual({ route, status: 400, fault: POST_BOOT });
    }
    expect((await call(sock, "PUT", "/actions", { action_type: "InstanceStart" })).body?.fault_message).toBe(POST_BOOT);

    // Ctrl+Alt+Del through the i8042: the guest resets (reboot=k) and the VMM exits 0.
    expect((await call(sock, "PUT", "/actions", { action_type: "SendCtrlAltDel" })).status).toBe(204);
    expect(await exited).toBe(0);
    expect(await readFile(path.join(dir, "vmm.log"), "utf8")).toContain("Firecracker exiting successfully. exit_code=0");
  }, 180_000);
});

/** Counts VMM starts per guest in a file beside the runtime's root, so a reopened runtime sees them too. */
class CountingBackend implements VmmBackend {
  readonly id: string;
  constructor(
    private readonly inner: FirecrackerBackend,
    private readonly countDir: string,
  ) {
    this.id = inner.id;
  }
  probe() {
    return this.inner.probe();
  }
  async start(launch: VmmLaunch) {
    await run(["sh", "-c", 'echo start >> "$1"', "sh", path.join(this.countDir, `${launch.name}.starts`)]);
    return this.inner.start(launch);
  }
  requestShutdown(workDir: string) {
    return this.inner.requestShutdown(workDir);
  }
  exitReason(workDir: string) {
    return this.inner.exitReason(workDir);
  }
}

describe("the firecracker runtime (microvm core + FirecrackerBackend + the fake)", () => {
  const runtimes: MicroVmRuntime[] = [];
  afterAll(async () => {
    for (const runtime of runtimes) await runtime.close();
  });

  function newRuntime(root: string, countDir: string, opts: { stopGraceMs?: number } = {}): MicroVmRuntime {
    const backend = new CountingBackend(new FirecrackerBackend({ binary: FAKE }), countDir);
    const runtime = new MicroVmRuntime({ root, backend, images: { "bc-guest": image }, stopGraceMs: opts.stopGraceMs });
    runtimes.push(runtime);
    return runtime;
  }

  let n = 0;
  function spec(name = `fc-${process.pid % 10000}-${++n}`): InstanceSpec {
    const data = userData("#!/bin/sh\necho firecracker-guest-user-data\n");
    return {
      name,
      desired: "running",
      vcpus: 1,
      memory: "128M",
      disk: "128M",
      image: "bc-guest",
      userData: data.bytes.toString("base64"),
      userDataSha256: data.sha256,
    };
  }

  async function subject(opts: { stopGraceMs?: number } = {}): Promise<RuntimeSubject & { root: string }> {
    const root = await mkdtemp(path.join(scratch, "rt-"));
    const s: RuntimeSubject & { root: string } = {
      root,
      runtime: newRuntime(root, scratch, opts),
      async reopen() {
        await s.runtime.close();
        s.runtime = newRuntime(root, scratch, opts);
        return s.runtime;
      },
      spec: (name) => spec(name),
      async starts(name) {
        const text = await readFile(path.join(scratch, `${name}.starts`), "utf8").catch(() => "");
        return text.split("\n").filter(Boolean).length;
      },
      async leftovers(name) {
        const dir = path.join(root, name);
        const left = (await processesNaming(dir)).map((pid) => `vmm pid ${pid}`);
        if (
          await stat(dir).then(
            () => true,
            () => false,
          )
        )
          left.push("work dir");
        if (await netnsExists(netnsName(name))) left.push(`netns ${netnsName(name)}`);
        return left;
      },
    };
    return s;
  }

  it("probes the fake: no KVM needed, guests run under TCG", async () => {
    const runtime = firecrackerRuntime({ root: scratch, images: { "bc-guest": image }, firecracker: { binary: FAKE } });
    runtimes.push(runtime);
    const probe = await runtime.probe();
    expect(probe).toMatchObject({ ok: true, accel: "tcg" });
    expect(probe.detail).toContain("Firecracker v");
    const missing = await new FirecrackerBackend({ binary: ["/nonexistent/firecracker"] }).probe();
    expect(missing.ok).toBe(false);
  });

  it("a configuration firecracker refuses is DRIVER_ERROR with its fault_message, and the VMM is killed", async () => {
    const workDir = await mkdtemp(path.join(scratch, "refused-"));
    const launch: VmmLaunch = {
      name: "refused",
      workDir,
      kernel: image.kernel,
      initrd: image.initrd,
      cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
      vcpus: 33,
      memoryMiB: 128,
      drives: [{ id: "root", path: image.rootfs, readOnly: true }],
      consoleLog: path.join(workDir, "console.log"),
      vmmLog: path.join(workDir, "vmm.log"),
      accel: "tcg",
    };
    await expect(new FirecrackerBackend({ binary: FAKE }).start(launch)).rejects.toMatchObject({
      code: "DRIVER_ERROR",
      message: expect.stringContaining("The number of vCPUs must be greater than 0"),
    });
    await waitFor("the refused VMM to be gone", async () => ((await processesNaming(workDir)).length === 0 ? true : undefined), 10_000);
  }, 60_000);

  it("passes runtimeConformanceCases()", async () => {
    const report = await runConformance(runtimeConformanceCases(), subject, {
      dispose: async (s) => {
        for (const guest of await s.runtime.list()) await s.runtime.remove(guest.name);
      },
    });
    expect(report.failed).toEqual([]);
    expect(report.passed.length).toBeGreaterThan(0);
  }, 900_000);

  it("FC-GRACEFUL-STOP: a stop asks through SendCtrlAltDel and the guest ends on its own before any kill", async () => {
    // A grace far longer than the test: the guest must end because it was asked, not killed.
    const s = await subject({ stopGraceMs: 600_000 });
    const guest = spec();
    expect((await s.runtime.apply(guest)).state).toBe("running");
    const stopped = await s.runtime.apply({ ...guest, desired: "stopped" });
    expect(stopped).toMatchObject({ state: "stopped", reason: "requested" });
    const vmmLog = await readFile(path.join(s.root, guest.name, "vmm.log"), "utf8");
    expect(vmmLog).toContain('PUT request on "/actions"');
    expect(vmmLog).toContain("Firecracker exiting successfully. exit_code=0");
    expect(await s.runtime.console(guest.name, 64 * 1024)).toContain("reboot: Restarting system");
    await s.runtime.remove(guest.name);
    expect(await s.leftovers(guest.name)).toEqual([]);
  }, 300_000);

  it("FC-VM-TERMINATED: a guest that resets itself is guest_poweroff, a VMM that dies is vmm_exited, read from the VMM log", async () => {
    const s = await subject();
    const seen = (name: string) =>
      new Promise<InstanceObserved>((resolve) => {
        const stop = s.runtime.watch((o) => {
          if (o.name === name && o.state !== "running" && o.state !== "booting") (stop(), resolve(o));
        });
      });

    // On x86 a firecracker guest ends itself by rebooting with reboot=k: the VMM exits 0.
    const resets = withUserData(spec(), "#!/bin/sh\nsleep 1\nreboot -f\n");
    const resetSeen = seen(resets.name);
    expect((await s.runtime.apply(resets)).state).toBe("running");
    expect(await resetSeen).toMatchObject({ state: "stopped", reason: "guest_poweroff" });
    await s.runtime.remove(resets.name);

    // The guest's VMM dies under it (QEMU behind the fake killed): firecracker logs an error exit.
    const dies = spec();
    const diedSeen = seen(dies.name);
    const running = await s.runtime.apply(dies);
    expect(running.state).toBe("running");
    const fakePid = await vmmPidOf(s, dies.name);
    const qemuPid = Number((await readFile(`/proc/${fakePid}/task/${fakePid}/children`, "utf8")).trim().split(/\s+/)[0]);
    expect(qemuPid).toBeGreaterThan(0);
    process.kill(qemuPid, "SIGKILL");
    const died = await diedSeen;
    expect(died.reason).toBe("vmm_exited");
    expect(died.state).not.toBe("running");
    await s.runtime.remove(dies.name);
    expect(await s.leftovers(dies.name)).toEqual([]);
  }, 300_000);
});

/** The fake's pid for a guest: the one process whose command line names its work dir. */
async function vmmPidOf(s: RuntimeSubject, name: string): Promise<number> {
  const pids = (await s.leftovers(name)).filter((l) => l.startsWith("vmm pid ")).map((l) => Number(l.slice("vmm pid ".length)));
  expect(pids).toHaveLength(1);
  return pids[0]!;
}
