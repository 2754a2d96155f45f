// acme-ns: a container runtime over Linux namespaces, written as a third party writes a bcx plugin
// (Walkthrough 4, docs/bcx.md): one file importing only better-compute/driver-sdk and node:
// built-ins, bundled to one file and pinned in bcd's [plugins]. On `bcd node` it serves the
// RuntimeDriver contract (agent/runtimes/contract.ts) over positional JSON arguments: apply(spec),
// observe(name), list(), remove(name), console(name, maxBytes), probe().
//
// An instance's workload is `unshare --mount --uts --ipc --pid --fork --mount-proc` running busybox
// sh: it names its host after the instance, mounts a tmpfs in its own mount namespace, decodes the
// user data into it, writes a report, runs the user data when it is a script, and stays up printing
// to its console. Namespaces and mounts are what bcd's seccomp filter refuses, so this plugin works
// only when pinned under [plugins] privileged (as Kata would). Sandboxed it tries the rootless way
// (a user namespace first), which the filter refuses too: the instance fails, saying why.
//
// Level-triggered and idempotent like every runtime: apply of a running instance changes nothing, a
// failed start is remembered and never retried for the same spec, remove of an absent one succeeds.
// Each instance keeps a directory under STATE (state.json, user-data.b64, console.log, report.json);
// its workload runs in a session of its own, so it outlives a restarted plugin, which finds it again.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, open, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { DriverError, serveDriver, type Invocation } from "better-compute/driver-sdk";

/** Where instances' directories live: baked in when bundled (esbuild's define), else where runc keeps its own. */
declare const ACME_NS_STATE: string | undefined;

const ID = "acme-ns";
const VERSION = "0.1.0";
const uid = process.getuid!();
// One directory per uid, as a rootless runtime keeps its own apart from root's.
const STATE =
  typeof ACME_NS_STATE === "string"
    ? path.join(ACME_NS_STATE, `uid-${uid}`)
    : uid === 0
      ? "/run/acme-ns"
      : path.join(os.tmpdir(), `acme-ns-${uid}`);
/** How long a workload has to write its report. */
const START_MS = 20_000;
/** How long a stopping workload has before it is killed, and then to be gone. */
const STOP_MS = 5_000;
const NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;

// The workload: busybox sh as the namespaces' init ($1 the instance's name, $2 its directory). As
// pid 1 it ignores signals it has no handler for: it traps TERM to stop when asked.
const WORKLOAD = `set -eu
name=$1 dir=$2
trap 'echo "acme-ns: $name stopping"; exit 0' TERM
hostname "$name"
mount -t tmpfs -o size=4m,mode=0700 acme-ns "$dir/rootfs"
base64 -d < "$dir/user-data.b64" > "$dir/rootfs/user-data"
sum=$(sha256sum "$dir/rootfs/user-data" | cut -d' ' -f1)
printf '{"instanceId":"%s","hostname":"%s","userDataSha256":"%s","hostKeys":[]}\\n' "$name" "$(hostname)" "$sum" > "$dir/report.json.new"
mv "$dir/report.json.new" "$dir/report.json"
echo "acme-ns: $name is up (user data sha256 $sum)"
case $(head -c 2 "$dir/rootfs/user-data") in '#!') sh "$dir/rootfs/user-data" || echo "acme-ns: the user data exited $?" ;; esac
up=0
while :; do sleep 5 & wait $!; up=$((up + 5)); echo "acme-ns: $name up $up s"; done
`;

// ---- the contract's shapes (agent/runtimes/contract.ts), as this plugin answers them

type State = "booting" | "running" | "stopping" | "stopped" | "failed" | "absent";
interface Report {
  instanceId: string;
  hostname: string;
  userDataSha256: string;
  hostKeys: string[];
}
interface Observed {
  name: string;
  state: State;
  vmm?: string;
  rebootCount?: number;
  report?: Report;
  reason?: string;
  message?: string;
  lastOutput?: string;
  since: string;
}
interface Spec {
  name: string;
  desired: "running" | "stopped";
  userData: string;
  rebootCount: number;
}

/** What the plugin keeps of an instance (state.json). */
interface Kept {
  /** The workload (unshare) while it runs, with its start time: together they name one process. */
  pid?: number;
  started?: number;
  rebootCount: number;
  report?: Report;
  /** Stopped on purpose (or never started). */
  stopped: boolean;
  /** A start that failed for this spec (key): answered again, never retried for it. */
  failed?: { key: string; message: string; lastOutput: string };
  since: string;
}

const now = () => new Date().toISOString();
const invalid = (message: string) => new DriverError("INVALID_ARGUMENT", message);
const dirOf = (name: string) => path.join(STATE, name);

function takes(op: string, args: unknown[], count: number): void {
  if (args.length !== count) throw invalid(`${op} takes ${count} argument${count === 1 ? "" : "s"}, got ${args.length}`);
}

function nameOf(v: unknown): string {
  if (typeof v !== "string" || !NAME.test(v)) throw invalid("name: 1 to 63 characters of [a-z0-9-]");
  return v;
}

/** The spec checked: it comes from a command. */
function specOf(v: unknown): Spec {
  if (typeof v !== "object" || v === null) throw invalid("apply takes an InstanceSpec");
  const s = v as Record<string, unknown>;
  const name = nameOf(s.name);
  if (s.desired !== "running" && s.desired !== "stopped") throw invalid("desired: running or stopped");
  if (typeof s.userData !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(s.userData)) throw invalid("userData: base64");
  const sha256 = createHash("sha256").update(Buffer.from(s.userData, "base64")).digest("hex");
  if (s.userDataSha256 !== sha256) throw invalid("userDataSha256 is not the sha256 of userData's bytes");
  const rebootCount = s.rebootCount ?? 0;
  if (typeof rebootCount !== "number" || !Number.isInteger(rebootCount) || rebootCount < 0) throw invalid("rebootCount: an integer ≥ 0");
  return { name, desired: s.desired, userData: s.userData, rebootCount };
}

// ---- processes

/** A process's start time (/proc/PID/stat field 22), or undefined when it is gone (or a zombie). */
function startTime(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[0] === "Z" ? undefined : Number(fields[19]);
  } catch {
    return undefined;
  }
}

const alive = (kept: Kept) => kept.pid !== undefined && kept.started !== undefined && startTime(kept.pid) === kept.started;

/** Processes whose arguments name the directory: the workload's unshare and its init. */
function processesOf(dir: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").includes(dir)) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

function kill(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // gone already
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function gone(dir: string, ms: number): Promise<boolean> {
  for (const until = Date.now() + ms; Date.now() < until; await sleep(50)) if (processesOf(dir).length === 0) return true;
  return processesOf(dir).length === 0;
}

/**
 * Stops the workload: SIGTERM, which its init (the namespaces' pid 1, which ignores signals it has no
 * handler for) traps and exits on, unshare then with it; SIGKILL to what is left (unshare's
 * --kill-child takes its namespaces' processes along).
 */
async function stopWorkload(dir: string): Promise<void> {
  for (const pid of processesOf(dir)) kill(pid, "SIGTERM");
  if (await gone(dir, STOP_MS)) return;
  for (const pid of processesOf(dir)) kill(pid, "SIGKILL");
  if (!(await gone(dir, STOP_MS))) throw new DriverError("UNAVAILABLE", `${ID}: the workload in ${dir} did not stop`);
}

/** Whether this process runs under a seccomp filter (bcd's sandbox). */
function filtered(): boolean {
  return /^Seccomp:\s*2$/m.test(readFileSync("/proc/self/status", "utf8"));
}

async function tail(file: string, maxBytes: number): Promise<string> {
  let handle;
  try {
    handle = await open(file, "r");
  } catch {
    return "";
  }
  try {
    const { size } = await handle.stat();
    const length = Math.min(size, maxBytes);
    const { buffer } = await handle.read(Buffer.alloc(length), 0, length, size - length);
    return buffer.toString("utf8");
  } finally {
    await handle.close();
  }
}

// ---- state

async function load(name: string): Promise<Kept | undefined> {
  try {
    return JSON.parse(await readFile(path.join(dirOf(name), "state.json"), "utf8")) as Kept;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}

async function save(name: string, kept: Kept): Promise<Kept> {
  const file = path.join(dirOf(name), "state.json");
  await writeFile(`${file}.new`, JSON.stringify(kept), { mode: 0o600 });
  await rename(`${file}.new`, file);
  return kept;
}

function observed(name: string, kept: Kept | undefined): Observed {
  if (!kept) return { name, state: "absent", since: now() };
  const base = { name, vmm: `${ID}/unshare`, rebootCount: kept.rebootCount, since: kept.since };
  if (kept.failed)
    return { ...base, state: "failed", reason: "boot_failed", message: kept.failed.message, lastOutput: kept.failed.lastOutput };
  if (alive(kept)) return kept.report ? { ...base, state: "running", report: kept.report } : { ...base, state: "booting" };
  if (kept.stopped) return { ...base, state: "stopped", reason: "requested" };
  return { ...base, state: "failed", reason: "vmm_exited", message: `${ID}: the workload of ${name} exited on its own` };
}

/** One operation at a time per instance: an apply and a remove never interleave. */
const locks = new Map<string, Promise<unknown>>();
function locked<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const run = (locks.get(name) ?? Promise.resolve()).then(fn, fn);
  const settled = run.catch(() => {});
  locks.set(name, settled);
  void settled.then(() => locks.get(name) === settled && locks.delete(name));
  return run;
}

// ---- apply

async function converge(spec: Spec, signal: AbortSignal): Promise<Observed> {
  const { name } = spec;
  const dir = dirOf(name);
  let kept = await load(name);
  if (!kept) {
    await mkdir(path.join(dir, "rootfs"), { recursive: true, mode: 0o700 });
    // The user data is written once, as given: a later apply never rewrites it.
    await writeFile(path.join(dir, "user-data.b64"), spec.userData, { mode: 0o600 });
    kept = await save(name, { rebootCount: spec.rebootCount, stopped: true, since: now() });
  }
  const key = `${spec.desired}/${spec.rebootCount}`;

  if (spec.desired === "stopped") {
    if (!kept.stopped || kept.failed) {
      await stopWorkload(dir);
      kept = await save(name, { rebootCount: kept.rebootCount, stopped: true, since: now() });
    }
    return observed(name, kept);
  }
  if (kept.failed?.key === key) return observed(name, kept); // this spec failed to start: never again
  if (alive(kept)) {
    if (!kept.report) return booted(name, kept, key, undefined, signal); // mid-boot when the plugin restarted
    if (kept.rebootCount >= spec.rebootCount) return observed(name, kept); // running: nothing changes
    console.error(`${name}: rebooting for rebootCount ${spec.rebootCount}`);
    await stopWorkload(dir);
  } else if (!kept.stopped && !kept.failed) {
    // It exited on its own: remembered as failed for this spec, not restarted behind the control plane's back.
    const why = observed(name, kept);
    return observed(name, await save(name, { ...kept, pid: undefined, failed: { key, message: why.message!, lastOutput: "" } }));
  }
  return start(spec, key, signal);
}

async function start(spec: Spec, key: string, signal: AbortSignal): Promise<Observed> {
  const { name } = spec;
  const dir = dirOf(name);
  await rm(path.join(dir, "report.json"), { force: true });
  // Rootless (not root), a user namespace comes first: what a sandboxed plugin is refused.
  const rootless = uid === 0 ? [] : ["--user", "--map-root-user"];
  const argv = [...rootless, "--mount", "--uts", "--ipc", "--pid", "--fork", "--mount-proc", "--kill-child"];
  console.error(`${name}: starting its workload (${uid === 0 ? "as root" : "rootless"})`);
  const log = await open(path.join(dir, "console.log"), "a", 0o600);
  // Its own session: a plugin restarted (its process group killed) leaves the workload running.
  const child = spawn("unshare", [...argv, "busybox", "sh", "-c", WORKLOAD, ID, name, dir], {
    cwd: dir,
    detached: true,
    stdio: ["ignore", log.fd, log.fd],
  });
  // Listening before anything is awaited: a refused unshare exits within milliseconds.
  const exited = new Promise<string>((resolve) => {
    child.once("exit", (code, sig) => resolve(sig ? `killed by ${sig}` : `exit code ${code}`));
    child.once("error", (e) => resolve(e.message));
  });
  child.unref();
  await log.close();
  const kept = await save(name, {
    rebootCount: spec.rebootCount,
    stopped: false,
    since: now(),
    ...(child.pid !== undefined ? { pid: child.pid, started: startTime(child.pid) } : {}),
  });
  return booted(name, kept, key, exited, signal);
}

/** Waits for the workload's report: running; or it exited, or never reported: failed, remembered for this spec. */
async function booted(name: string, kept: Kept, key: string, exited: Promise<string> | undefined, signal: AbortSignal): Promise<Observed> {
  const dir = dirOf(name);
  let ended: string | undefined;
  void exited?.then((why) => (ended = why));
  for (const until = Date.now() + START_MS; ; await sleep(50)) {
    signal.throwIfAborted(); // the caller gave up: it boots on, and the next apply waits again
    if (existsSync(path.join(dir, "report.json"))) {
      const report = JSON.parse(await readFile(path.join(dir, "report.json"), "utf8")) as Report;
      return observed(name, await save(name, { ...kept, report, since: now() }));
    }
    if (!exited && !alive(kept)) ended ??= "its process is gone";
    if (ended !== undefined || Date.now() > until) break;
  }
  const lastOutput = (await tail(path.join(dir, "console.log"), 2048)).trim();
  await stopWorkload(dir);
  const last = lastOutput.split("\n").at(-1) ?? "";
  let what = `${name} did not start: ${ended ? `its workload ended (${ended})${last ? `: ${last}` : ""}` : `no report within ${START_MS / 1000} s`}`;
  if (filtered() && /Operation not permitted/.test(lastOutput))
    what += `; this plugin runs in bcd's sandbox, whose seccomp filter refuses namespaces and mounts: pin it under [plugins] privileged`;
  console.error(what);
  const message = `${ID}: ${what}`;
  return observed(
    name,
    await save(name, { rebootCount: kept.rebootCount, stopped: false, failed: { key, message, lastOutput }, since: now() }),
  );
}

// ---- the driver

serveDriver({
  id: ID,
  version: VERSION,
  kinds: ["runtime"],
  operations: {
    apply(this: Invocation, ...args: unknown[]) {
      takes("apply", args, 1);
      const spec = specOf(args[0]);
      return locked(spec.name, () => converge(spec, this.signal));
    },
    async observe(...args: unknown[]) {
      takes("observe", args, 1);
      const name = nameOf(args[0]);
      return observed(name, await load(name));
    },
    async list(...args: unknown[]) {
      takes("list", args, 0);
      const names = existsSync(STATE) ? (await readdir(STATE)).filter((n) => NAME.test(n)) : [];
      return Promise.all(names.map(async (name) => observed(name, await load(name))));
    },
    remove(...args: unknown[]) {
      takes("remove", args, 1);
      const name = nameOf(args[0]);
      return locked(name, async () => {
        const dir = dirOf(name);
        if (!existsSync(dir)) return null;
        await stopWorkload(dir);
        await rm(dir, { recursive: true, force: true });
        console.error(`${name}: removed`);
        return null;
      });
    },
    async console(...args: unknown[]) {
      takes("console", args, 2);
      const name = nameOf(args[0]);
      const maxBytes = args[1];
      if (typeof maxBytes !== "number" || !Number.isInteger(maxBytes) || maxBytes < 1) throw invalid("maxBytes: an integer ≥ 1");
      return tail(path.join(dirOf(name), "console.log"), Math.min(maxBytes, 1 << 20));
    },
    probe(...args: unknown[]) {
      takes("probe", args, 0);
      const onPath = (cmd: string) => (process.env.PATH ?? "").split(":").some((d) => d && existsSync(path.join(d, cmd)));
      const missing = ["unshare", "busybox"].filter((c) => !onPath(c));
      if (missing.length) return { ok: false, detail: `${ID} needs ${missing.join(" and ")} (util-linux, busybox)` };
      return { ok: true, detail: `${ID} ${VERSION}: namespaces by unshare, ${uid === 0 ? "as root" : "rootless"}; state in ${STATE}` };
    },
  },
});
