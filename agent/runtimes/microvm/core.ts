// The microVM runtime core: one RuntimeDriver over a VmmBackend (qemu-microvm, firecracker). It
// owns validation, the work dir, the seed, the network namespace, the boot wait, the death watch,
// graceful stop, console capping and adoption; the backend only starts, asks, watches and explains
// a VMM. docs/runtimes.md describes the whole.
//
// Every step of apply and remove is idempotent and crash-safe: state.json is replaced atomically,
// the seed and the disk are built beside their target and renamed into place, and a VMM is found
// by the work dir its command line names before anything starts one, so an agent killed at any
// point converges on restart and never boots a guest twice.
import { createHash } from "node:crypto";
import { copyFile, mkdir, open, readdir, readFile, rename, rm, stat, truncate } from "node:fs/promises";
import path from "node:path";
import { AgentError, type AgentLogger } from "../../contracts.ts";
import { writeAtomic } from "../../file-state.ts";
import type { GuestReport, InstanceObserved, InstanceSpec, InstanceState, RuntimeDriver, RuntimeProbe, StopReason } from "../contract.ts";
import type { Accel, VmmBackend, VmmLaunch } from "./backend.ts";
import { hostTscKhz, isVmmOf, lastLines, mibToBytes, parseSize, parseVcpus, processesNaming, readPart, sleep } from "./helpers.ts";
import { DEFAULT_NETWORK, deleteNetns, ensureNetns, guestMac, netnsName, TAP, validateNetworkPlan, type NetworkPlan } from "./network.ts";
import { writeSeedOnce } from "./seed.ts";

/** What the core needs of a guest image (agent/runtimes/microvm/image.ts's GuestImage has these). */
export interface MicroVmImage {
  kernel: string;
  initrd: string;
  /** A raw root disk image; an instance's disk is a copy grown to its size. */
  rootfs: string;
  rootfsBytes: number;
}

export interface MicroVmRuntimeOptions {
  /** The work dirs' parent: one `<root>/<name>/` per guest. */
  root: string;
  /** The images by name, or a resolver (undefined: no such image). */
  images: Record<string, MicroVmImage> | ((name: string) => Promise<MicroVmImage | undefined>);
  backend: VmmBackend;
  /** The runtime's driver id; default the backend's. */
  id?: string;
  /** Bound on process start to the guest's report (default 120 s: TCG under load). */
  bootTimeoutMs?: number;
  /** How long a guest asked to shut down has before it is killed (default 10 s). */
  stopGraceMs?: number;
  /** console.log is capped near this size by copy-truncate (default 256 KiB). */
  consoleMaxBytes?: number;
  network?: NetworkPlan;
  /** The largest vCPU count a guest may ask for (default 64). */
  maxVcpus?: number;
  /** Death watch period (default 1 s). */
  watchIntervalMs?: number;
  /** The host's boot id (default /proc/sys/kernel/random/boot_id); injectable for tests. */
  hostBootId?: () => string | Promise<string>;
  now?: () => Date;
  log?: AgentLogger;
  /** Called between the steps of apply, stop and remove (chaos tests kill the process here). */
  crashPoint?: (step: CrashStep) => void | Promise<void>;
}

export type CrashStep =
  "workdir" | "seed" | "disk" | "netns" | "start" | "started" | "report" | "stop-requested" | "stopped" | "netns-removed";

/** state.json: what survives the agent. */
interface GuestState {
  name: string;
  /** What a guest is created with and cannot change: a different one needs a remove first. */
  identity: { image: string; userDataSha256: string; diskMiB: number };
  vcpus: number;
  memoryMiB: number;
  hostBootId: string;
  rebootCount: number;
  state: InstanceState;
  reason?: StopReason;
  message?: string;
  pid?: number;
  vmm?: string;
  bootStartedAt?: string;
  report?: GuestReport;
  since: string;
}

interface ValidSpec {
  name: string;
  desired: "running" | "stopped";
  vcpus: number;
  memoryMiB: number;
  diskMiB: number;
  imageName: string;
  image: MicroVmImage;
  userData: Buffer;
  userDataSha256: string;
  rebootCount: number;
}

const NAME = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const MAX_USER_DATA_BYTES = 1024 * 1024;
const MIN_MEMORY_MiB = 64;
const KILL_WAIT_MS = 10_000;
const REPORT_SEARCH_BYTES = 1024 * 1024;
// sun_path holds 107 bytes: the longest control socket a backend puts in a work dir ("firecracker.sock") must fit.
const MAX_SOCKET_PATH = 107;
const LONGEST_SOCKET_NAME = "firecracker.sock";

export class MicroVmRuntime implements RuntimeDriver {
  readonly id: string;
  readonly version = "1";
  readonly #o: Required<Omit<MicroVmRuntimeOptions, "id" | "log" | "crashPoint" | "hostBootId" | "now">> & MicroVmRuntimeOptions;
  readonly #plan: NetworkPlan & { prefix: number };
  readonly #listeners = new Set<(o: InstanceObserved) => void>();
  readonly #locks = new Map<string, Promise<unknown>>();
  /** Guests whose VMM runs: the death watch polls them. */
  readonly #watched = new Map<string, { pid: number; detach?: () => void }>();
  /** Failed boots whose work dir is gone (FC-BOOT-TIMEOUT): apply of the same spec answers this, never boots in a loop. */
  readonly #failed = new Map<string, { key: string; observed: InstanceObserved }>();
  #ready: Promise<void> | undefined;
  #probe: Promise<RuntimeProbe & { accel: Accel }> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #ticking = false;
  #closed = false;

  constructor(options: MicroVmRuntimeOptions) {
    this.#o = {
      bootTimeoutMs: 120_000,
      stopGraceMs: 10_000,
      consoleMaxBytes: 256 * 1024,
      network: DEFAULT_NETWORK,
      maxVcpus: 64,
      watchIntervalMs: 1_000,
      ...options,
    };
    this.id = options.id ?? options.backend.id;
    // Checked before any guest exists: a bad plan is a configuration error (FC-GUEST-IS-NOT-GATEWAY).
    this.#plan = validateNetworkPlan(this.#o.network);
  }

  probe(): Promise<RuntimeProbe & { accel: Accel }> {
    this.#probe ??= this.#o.backend.probe().then((p) => ({ ok: p.ok, accel: p.accel, detail: p.detail }));
    return this.#probe;
  }

  async apply(spec: InstanceSpec, signal?: AbortSignal): Promise<InstanceObserved> {
    const v = await this.#validate(spec); // everything is checked before anything is allocated
    await this.#init();
    return this.#locked(v.name, () => this.#apply(v, signal));
  }

  async observe(name: string): Promise<InstanceObserved> {
    checkName(name);
    await this.#init();
    const st = await this.#read(name);
    if (st) return observed(st);
    return this.#failed.get(name)?.observed ?? { name, state: "absent", since: this.#now() };
  }

  async list(): Promise<InstanceObserved[]> {
    await this.#init();
    const out: InstanceObserved[] = [];
    const names = new Set([...(await this.#names()), ...this.#failed.keys()]);
    for (const name of [...names].sort()) {
      const o = await this.observe(name);
      // A work dir without state.json is a create that died at its first step: listed so it is removed or converged.
      if (o.state === "absent" && (await exists(this.#dir(name)))) out.push({ ...o, state: "stopped", message: "incomplete work dir" });
      else if (o.state !== "absent") out.push(o);
    }
    return out;
  }

  async remove(name: string, _signal?: AbortSignal): Promise<void> {
    checkName(name);
    await this.#init();
    await this.#locked(name, async () => {
      const dir = this.#dir(name);
      const st = await this.#read(name);
      if ((await processesNaming(dir)).length > 0) await this.#stop(name, st);
      // FC-WORKDIR-REMOVAL: the disk a live guest runs on is never deleted under it.
      if ((await processesNaming(dir)).length > 0)
        throw new AgentError("DRIVER_ERROR", `the VMM of ${name} is still running; its work dir is kept`);
      await this.#crash("stopped");
      await deleteNetns(netnsName(name));
      await this.#crash("netns-removed");
      await rm(dir, { recursive: true, force: true });
      this.#failed.delete(name);
      this.#o.log?.info("microvm removed", { name });
    });
  }

  async console(name: string, maxBytes: number): Promise<string> {
    checkName(name);
    if (!Number.isSafeInteger(maxBytes) || maxBytes <= 0) throw new AgentError("INVALID_ARGUMENT", "maxBytes must be a positive integer");
    const limit = Math.min(maxBytes, 2 * this.#o.consoleMaxBytes);
    const dir = this.#dir(name);
    const current = await readPart(path.join(dir, "console.log"), limit, "end");
    const older = current.length < limit ? await readPart(path.join(dir, "console.log.1"), limit - current.length, "end") : Buffer.alloc(0);
    return Buffer.concat([older, current]).toString("utf8");
  }

  watch(listener: (observed: InstanceObserved) => void): () => void {
    this.#listeners.add(listener);
    void this.#init().catch((e: unknown) => this.#o.log?.warn("microvm adoption failed", { error: String(e) }));
    return () => this.#listeners.delete(listener);
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    await this.#ready?.catch(() => {});
    await Promise.allSettled([...this.#locks.values()]);
    for (const w of this.#watched.values()) w.detach?.();
    this.#watched.clear();
  }

  // ---- validation ----

  async #validate(spec: InstanceSpec): Promise<ValidSpec> {
    if (!spec || typeof spec !== "object") throw new AgentError("INVALID_ARGUMENT", "an instance spec is required");
    checkName(spec.name);
    if (path.join(this.#dir(spec.name), LONGEST_SOCKET_NAME).length > MAX_SOCKET_PATH) {
      throw new AgentError("INVALID_ARGUMENT", `instance name ${spec.name} is too long for a control socket under ${this.#o.root}`);
    }
    if (spec.desired !== "running" && spec.desired !== "stopped") {
      throw new AgentError("INVALID_ARGUMENT", `desired must be "running" or "stopped"`);
    }
    // FC-USERDATA-REQUIRED: on a microVM the user data IS the guest; without it nothing is allocated.
    if (typeof spec.userData !== "string" || spec.userData.length === 0) {
      throw new AgentError("INVALID_ARGUMENT", `instance ${spec.name} has no user data`);
    }
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(spec.userData) || spec.userData.length % 4 !== 0) {
      throw new AgentError("INVALID_ARGUMENT", "userData is not base64");
    }
    const userData = Buffer.from(spec.userData, "base64");
    if (userData.byteLength === 0) throw new AgentError("INVALID_ARGUMENT", `instance ${spec.name} has no user data`);
    if (userData.byteLength > MAX_USER_DATA_BYTES)
      throw new AgentError("INVALID_ARGUMENT", `user data is larger than ${MAX_USER_DATA_BYTES} bytes`);
    const sha = createHash("sha256").update(userData).digest("hex");
    if (spec.userDataSha256 !== sha) throw new AgentError("INVALID_ARGUMENT", "userDataSha256 is not the sha256 of the user data");
    const vcpus = parseVcpus(spec.vcpus, this.#o.maxVcpus);
    const memoryMiB = parseSize(spec.memory, "memory");
    if (memoryMiB < MIN_MEMORY_MiB) throw new AgentError("INVALID_ARGUMENT", `memory must be at least ${MIN_MEMORY_MiB}M`);
    const diskMiB = parseSize(spec.disk, "disk");
    const rebootCount = spec.rebootCount ?? 0;
    if (!Number.isSafeInteger(rebootCount) || rebootCount < 0)
      throw new AgentError("INVALID_ARGUMENT", "rebootCount must be a non-negative integer");
    if (typeof spec.image !== "string" || !spec.image) throw new AgentError("INVALID_ARGUMENT", "image is required");
    const images = this.#o.images;
    const image =
      typeof images === "function" ? await images(spec.image) : Object.hasOwn(images, spec.image) ? images[spec.image] : undefined;
    if (!image) throw new AgentError("INVALID_ARGUMENT", `unknown image ${JSON.stringify(spec.image)}`);
    // FC-IMAGE-ROOTFS-SIZE: a root file system cannot be shrunk into a smaller disk.
    if (mibToBytes(diskMiB) < image.rootfsBytes) {
      throw new AgentError(
        "INVALID_ARGUMENT",
        `disk ${spec.disk} is smaller than image ${spec.image}'s root file system (${image.rootfsBytes} bytes)`,
      );
    }
    return {
      name: spec.name,
      desired: spec.desired,
      vcpus,
      memoryMiB,
      diskMiB,
      imageName: spec.image,
      image,
      userData,
      userDataSha256: sha,
      rebootCount,
    };
  }

  // ---- apply ----

  async #apply(v: ValidSpec, signal?: AbortSignal): Promise<InstanceObserved> {
    const identity = { image: v.imageName, userDataSha256: v.userDataSha256, diskMiB: v.diskMiB };
    const key = applyKey(identity, v.vcpus, v.memoryMiB, v.desired, v.rebootCount);
    const dir = this.#dir(v.name);
    let st = await this.#read(v.name);
    if (!st) {
      const failed = this.#failed.get(v.name);
      if (failed?.key === key) return failed.observed;
      this.#failed.delete(v.name);
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await this.#crash("workdir");
      st = {
        name: v.name,
        identity,
        vcpus: v.vcpus,
        memoryMiB: v.memoryMiB,
        hostBootId: await this.#bootId(),
        rebootCount: v.rebootCount,
        state: "stopped",
        since: this.#now(),
      };
      await this.#write(st);
    } else if (JSON.stringify(st.identity) !== JSON.stringify(identity)) {
      throw new AgentError("FAILED_PRECONDITION", `instance ${v.name} exists with another image, user data or disk; remove it first`);
    }
    // FC-ENRICH-ONCE: the seed is the stored bytes, written once; a later apply or an adoption never rewrites it.
    await writeSeedOnce(path.join(dir, "seed.img"), { name: v.name, userData: v.userData, network: this.#o.network });
    await this.#crash("seed");
    await this.#ensureDisk(dir, v);
    await this.#crash("disk");
    await ensureNetns(netnsName(v.name), this.#plan);
    await this.#crash("netns");

    const running = (await processesNaming(dir)).length > 0;
    if (v.desired === "stopped") {
      if (running || st.state !== "stopped") st = (await this.#stop(v.name, st))!;
      await this.#crash("stopped");
      return observed(st);
    }
    if (running) {
      if (st.state !== "running" && st.state !== "booting") {
        // A stop that died half way, and the guest is still up: it is running again.
        await this.#write(
          (st = { ...st, state: st.report ? "running" : "booting", reason: undefined, message: undefined, since: this.#now() }),
        );
      }
      this.#adopt(v.name, st);
      if (!st.report) st = await this.#awaitReport(v.name, st, signal);
      if (st.state === "running" && v.rebootCount > st.rebootCount) {
        // A reboot: graceful stop, then the same seed and disk boot again.
        st = (await this.#stop(v.name, st))!;
        return this.#boot(v, st, signal);
      }
      return this.#result(st);
    }
    return this.#boot(v, st, signal);
  }

  async #ensureDisk(dir: string, v: ValidSpec): Promise<void> {
    const disk = path.join(dir, "disk.img");
    if (await exists(disk)) return;
    const tmp = `${disk}.tmp`;
    await copyFile(v.image.rootfs, tmp);
    await truncate(tmp, mibToBytes(v.diskMiB)); // grown sparse: the guest sees the whole disk size
    await rename(tmp, disk);
  }

  async #boot(v: ValidSpec, st: GuestState, signal?: AbortSignal): Promise<InstanceObserved> {
    const dir = this.#dir(v.name);
    const { accel } = await this.probe();
    // This boot's console starts empty: the first report line in console.log is this boot's.
    await rename(path.join(dir, "console.log"), path.join(dir, "console.log.1")).catch(ignoreMissing);
    await rm(path.join(dir, "exit-event.json"), { force: true });
    st = {
      ...st,
      vcpus: v.vcpus,
      memoryMiB: v.memoryMiB,
      rebootCount: Math.max(st.rebootCount, v.rebootCount),
      hostBootId: await this.#bootId(),
      state: "booting",
      vmm: `${this.#o.backend.id}/${accel}`,
      bootStartedAt: this.#now(),
      since: this.#now(),
      report: undefined,
      reason: undefined,
      message: undefined,
      pid: undefined,
    };
    await this.#write(st);
    await this.#crash("start");
    const tsc = accel === "tcg" ? await hostTscKhz() : undefined;
    const launch: VmmLaunch = {
      name: v.name,
      workDir: dir,
      kernel: v.image.kernel,
      initrd: v.image.initrd,
      cmdline: ["console=ttyS0 reboot=k panic=-1 quiet", ...(tsc ? [`tsc_early_khz=${tsc}`] : [])].join(" "),
      vcpus: v.vcpus,
      memoryMiB: v.memoryMiB,
      drives: [
        { id: "root", path: path.join(dir, "disk.img"), readOnly: false },
        { id: "seed", path: path.join(dir, "seed.img"), readOnly: true },
      ],
      net: { netns: netnsName(v.name), tap: TAP, mac: guestMac(this.#plan.guest) },
      consoleLog: path.join(dir, "console.log"),
      vmmLog: path.join(dir, "vmm.log"),
      accel,
    };
    this.#o.log?.info("microvm starting", { name: v.name, vmm: st.vmm });
    let pid: number;
    try {
      pid = (await this.#o.backend.start(launch)).pid;
    } catch (e) {
      return this.#result(
        await this.#failBoot(v.name, st, "boot_failed", `the VMM did not start: ${e instanceof Error ? e.message : String(e)}`),
      );
    }
    st = { ...st, pid };
    await this.#write(st);
    await this.#crash("started");
    this.#adopt(v.name, st);
    return this.#result(await this.#awaitReport(v.name, st, signal));
  }

  /** A guest's observed state; a failed boot's carries the VMM's last output. */
  #result(st: GuestState): InstanceObserved {
    const failed = this.#failed.get(st.name);
    return st.state === "failed" && failed ? failed.observed : observed(st);
  }

  /** Waits for the guest's report line, bounded (FC-BOOT-TIMEOUT); a VMM gone first is boot_failed. */
  async #awaitReport(name: string, st: GuestState, signal?: AbortSignal): Promise<GuestState> {
    const dir = this.#dir(name);
    const started = Date.parse(st.bootStartedAt ?? st.since);
    for (;;) {
      const report = await this.#readReport(name);
      if (report instanceof Error) return this.#failBoot(name, st, "boot_failed", report.message);
      if (report) {
        st = { ...st, state: "running", report, since: this.#now() };
        await this.#write(st);
        this.#o.log?.info("microvm running", { name, vmm: st.vmm });
        await this.#crash("report");
        return st;
      }
      const pids = await processesNaming(dir);
      if (pids.length === 0) {
        // The console may have been written just before the VMM exited: look once more.
        if (await this.#readReport(name)) continue;
        return this.#failBoot(name, st, "boot_failed", "the VMM exited before the guest reported");
      }
      if (Date.now() - started > this.#o.bootTimeoutMs) {
        return this.#failBoot(name, st, "boot_timeout", `the guest did not report within ${this.#o.bootTimeoutMs} ms`);
      }
      if (signal?.aborted) return st;
      await sleep(250, signal);
    }
  }

  /** A failed boot: kill the VMM, remove the netns and the work dir, keep the VMM's and console's last lines. */
  async #failBoot(name: string, st: GuestState, reason: StopReason, message: string): Promise<GuestState> {
    const dir = this.#dir(name);
    const vmmLog = await readPart(path.join(dir, "vmm.log"), 4096, "end");
    const consoleLog = await readPart(path.join(dir, "console.log"), 4096, "end");
    const lastOutput = [
      vmmLog.length ? `vmm: ${lastLines(vmmLog.toString("utf8").trimEnd(), 20, 2000)}` : "",
      consoleLog.length ? `console: ${lastLines(consoleLog.toString("utf8").trimEnd(), 20, 2000)}` : "",
    ]
      .filter(Boolean)
      .join("\n");
    this.#unwatch(name);
    await this.#kill(name);
    await deleteNetns(netnsName(name));
    await rm(dir, { recursive: true, force: true });
    this.#o.log?.warn("microvm boot failed", { name, reason });
    const failed: GuestState = { ...st, state: "failed", reason, message, pid: undefined, since: this.#now() };
    const o: InstanceObserved = { ...observed(failed), lastOutput: lastOutput || undefined };
    this.#failed.set(name, { key: applyKey(st.identity, st.vcpus, st.memoryMiB, "running", st.rebootCount), observed: o });
    return failed;
  }

  /** The first `bc-report` line of this boot's console (read from its start: printed early); an Error for a malformed one. */
  async #readReport(name: string): Promise<GuestReport | Error | undefined> {
    const text = (await readPart(path.join(this.#dir(name), "console.log"), REPORT_SEARCH_BYTES, "start")).toString("utf8");
    const m = /(?:^|\n)bc-report (.*)/.exec(text);
    if (!m) return undefined;
    const line = m[1]!.replace(/\r$/, "");
    if (!text.slice(m.index + m[0].length).includes("\n")) return undefined; // not the whole line yet
    try {
      const r = JSON.parse(line) as GuestReport;
      if (
        typeof r.instanceId !== "string" ||
        typeof r.hostname !== "string" ||
        typeof r.userDataSha256 !== "string" ||
        !Array.isArray(r.hostKeys)
      ) {
        throw new Error("missing fields");
      }
      return r;
    } catch (e) {
      return new Error(`the guest's report is malformed: ${(e as Error).message}`);
    }
  }

  // ---- stop and the death watch ----

  /** FC-GRACEFUL-STOP: ask the guest, wait the grace, then SIGKILL; the VMM is confirmed gone before this returns. */
  async #stop(name: string, st: GuestState | undefined): Promise<GuestState | undefined> {
    const dir = this.#dir(name);
    // A stop we asked for is not a death to report; the control socket stays open until the VMM is gone.
    const watched = this.#watched.get(name);
    this.#watched.delete(name);
    if (st) await this.#write((st = { ...st, state: "stopping", since: this.#now() }));
    if ((await processesNaming(dir)).length > 0) {
      try {
        await this.#o.backend.requestShutdown(dir);
      } catch (e) {
        this.#o.log?.warn("microvm shutdown request failed", { name, error: e instanceof Error ? e.message : String(e) });
      }
      await this.#crash("stop-requested");
      const deadline = Date.now() + this.#o.stopGraceMs;
      while ((await processesNaming(dir)).length > 0 && Date.now() < deadline) await sleep(100);
      await this.#kill(name);
    }
    watched?.detach?.();
    if (st)
      await this.#write((st = { ...st, state: "stopped", reason: "requested", message: undefined, pid: undefined, since: this.#now() }));
    this.#o.log?.info("microvm stopped", { name });
    return st;
  }

  /** SIGKILL every process naming the work dir and wait until they are gone. */
  async #kill(name: string): Promise<void> {
    const dir = this.#dir(name);
    const deadline = Date.now() + KILL_WAIT_MS;
    for (;;) {
      const pids = await processesNaming(dir);
      if (pids.length === 0) return;
      if (Date.now() > deadline) throw new AgentError("DRIVER_ERROR", `the VMM of ${name} (pid ${pids.join(", ")}) did not die`);
      for (const pid of pids) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone already
        }
      }
      await sleep(50);
    }
  }

  /** Starts watching a running VMM: its control socket (exit reasons) and the death watch. */
  #adopt(name: string, st: GuestState): void {
    if (this.#watched.has(name)) return;
    const entry: { pid: number; detach?: () => void } = { pid: st.pid ?? 0 };
    this.#watched.set(name, entry);
    void processesNaming(this.#dir(name)).then((pids) => {
      if (pids[0]) entry.pid = pids[0];
    });
    void this.#o.backend.attach?.(this.#dir(name)).then(
      (detach) => (this.#watched.get(name) === entry ? (entry.detach = detach) : detach()),
      (e: unknown) => this.#o.log?.warn("microvm attach failed", { name, error: e instanceof Error ? e.message : String(e) }),
    );
    this.#timer ??= setInterval(() => void this.#tick(), this.#o.watchIntervalMs);
    this.#timer.unref?.();
  }

  #unwatch(name: string): void {
    this.#watched.get(name)?.detach?.();
    this.#watched.delete(name);
  }

  /** FC-GUEST-DEATH-WATCH: every running VMM is polled; one that exited is recorded and reported with its reason. */
  async #tick(): Promise<void> {
    if (this.#ticking || this.#closed) return;
    this.#ticking = true;
    try {
      for (const [name, w] of [...this.#watched]) {
        if (this.#locks.has(name)) continue; // an apply, stop or remove owns it now
        await this.#locked(name, async () => {
          if (this.#watched.get(name) !== w) return;
          const dir = this.#dir(name);
          let st = await this.#read(name);
          if (!st) return void this.#watched.delete(name);
          if (w.pid > 0 ? await isVmmOf(w.pid, dir) : (await processesNaming(dir)).length > 0) {
            if (st.state === "booting") {
              // adopted mid-boot with no apply waiting on it
              const report = await this.#readReport(name);
              if (report && !(report instanceof Error)) {
                await this.#write((st = { ...st, state: "running", report, since: this.#now() }));
                this.#emit(observed(st));
              }
            }
            await this.#capConsole(dir);
            return;
          }
          w.detach?.();
          this.#watched.delete(name);
          const { reason, detail } = await this.#o.backend.exitReason(dir);
          st = {
            ...st,
            state: reason === "guest_poweroff" ? "stopped" : "failed",
            reason,
            message: detail,
            pid: undefined,
            since: this.#now(),
          };
          await this.#write(st);
          this.#o.log?.info("microvm exited", { name, reason });
          this.#emit(observed(st));
        });
      }
    } catch (e) {
      this.#o.log?.warn("microvm death watch failed", { error: e instanceof Error ? e.message : String(e) });
    } finally {
      this.#ticking = false;
    }
  }

  /** FC-CONSOLE: copy-truncate console.log once it passes the cap, keeping its last consoleMaxBytes in console.log.1. */
  async #capConsole(dir: string): Promise<void> {
    const file = path.join(dir, "console.log");
    const size = (await stat(file).catch(() => undefined))?.size ?? 0;
    if (size <= this.#o.consoleMaxBytes) return;
    const kept = await readPart(file, this.#o.consoleMaxBytes, "end");
    const tmp = path.join(dir, "console.log.1.tmp");
    const fh = await open(tmp, "w", 0o600);
    try {
      await fh.writeFile(kept);
    } finally {
      await fh.close();
    }
    await rename(tmp, path.join(dir, "console.log.1"));
    await truncate(file, 0); // the VMM appends (O_APPEND), so its next write lands at the new end
  }

  #emit(o: InstanceObserved): void {
    for (const listener of this.#listeners) {
      try {
        listener(o);
      } catch (e) {
        this.#o.log?.warn("microvm watch listener failed", { error: e instanceof Error ? e.message : String(e) });
      }
    }
  }

  // ---- adoption ----

  /** FC-ADOPT-AFTER-RESTART: once per runtime, adopt every guest whose VMM still runs; record the others as gone. */
  #init(): Promise<void> {
    this.#ready ??= (async () => {
      await mkdir(this.#o.root, { recursive: true, mode: 0o700 });
      const bootId = await this.#bootId();
      for (const name of await this.#names()) {
        await this.#locked(name, async () => {
          let st = await this.#read(name);
          if (!st) return;
          if ((await processesNaming(this.#dir(name))).length > 0) {
            this.#o.log?.info("microvm adopted", { name });
            return this.#adopt(name, st);
          }
          if (st.state !== "running" && st.state !== "booting" && st.state !== "stopping") return;
          const gone =
            st.hostBootId !== bootId
              ? { reason: "host_reboot" as const, detail: "the host rebooted" }
              : st.state === "stopping"
                ? { reason: "requested" as const, detail: "stopped as asked" }
                : await this.#o.backend.exitReason(this.#dir(name));
          st = {
            ...st,
            state: gone.reason === "vmm_exited" ? "failed" : "stopped",
            reason: gone.reason,
            message: gone.detail,
            pid: undefined,
            since: this.#now(),
          };
          await this.#write(st);
          this.#o.log?.info("microvm gone at adoption", { name, reason: gone.reason });
        });
      }
    })();
    return this.#ready;
  }

  // ---- plumbing ----

  #dir(name: string): string {
    return path.join(this.#o.root, name);
  }

  async #names(): Promise<string[]> {
    const entries = await readdir(this.#o.root, { withFileTypes: true }).catch(() => []);
    return entries.filter((e) => e.isDirectory() && NAME.test(e.name)).map((e) => e.name);
  }

  async #read(name: string): Promise<GuestState | undefined> {
    try {
      return JSON.parse(await readFile(path.join(this.#dir(name), "state.json"), "utf8")) as GuestState;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw e;
    }
  }

  async #write(st: GuestState): Promise<void> {
    await writeAtomic(path.join(this.#dir(st.name), "state.json"), `${JSON.stringify(st, null, 2)}\n`);
  }

  async #locked<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(name) ?? Promise.resolve();
    const next = prev.catch(() => {}).then(fn);
    const settled = next.catch(() => {});
    this.#locks.set(name, settled);
    try {
      return await next;
    } finally {
      if (this.#locks.get(name) === settled) this.#locks.delete(name);
    }
  }

  async #crash(step: CrashStep): Promise<void> {
    await this.#o.crashPoint?.(step);
  }

  async #bootId(): Promise<string> {
    if (this.#o.hostBootId) return this.#o.hostBootId();
    return (await readFile("/proc/sys/kernel/random/boot_id", "utf8")).trim();
  }

  #now(): string {
    return (this.#o.now?.() ?? new Date()).toISOString();
  }
}

/** What a remembered failed boot answers for: the same spec applied again. */
function applyKey(identity: GuestState["identity"], vcpus: number, memoryMiB: number, desired: string, rebootCount: number): string {
  return JSON.stringify([identity, vcpus, memoryMiB, desired, rebootCount]);
}

function checkName(name: unknown): asserts name is string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new AgentError("INVALID_ARGUMENT", `instance name ${JSON.stringify(name)} must be [a-z0-9-], at most 63 characters`);
  }
}

function observed(st: GuestState): InstanceObserved {
  return {
    name: st.name,
    state: st.state,
    ...(st.vmm ? { vmm: st.vmm } : {}),
    rebootCount: st.rebootCount,
    ...(st.report ? { report: st.report } : {}),
    ...(st.reason ? { reason: st.reason } : {}),
    ...(st.message ? { message: st.message } : {}),
    since: st.since,
  };
}

async function exists(file: string): Promise<boolean> {
  return stat(file).then(
    () => true,
    () => false,
  );
}

function ignoreMissing(e: unknown): void {
  if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
}
