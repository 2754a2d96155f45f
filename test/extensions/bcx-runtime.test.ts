// Walkthrough 4 (docs/bcx.md): a runtime driver written as a third party would, hosted by `bcd node`
// as a bcx plugin and selected by a host pool, booting a real workload. acme-ns
// (test/extensions/bcx-runtime/plugin.ts) is a container runtime over Linux namespaces; its
// control-plane declaration (./bcx-runtime/driver.ts, externalDriver) is registered by the
// deployment this file's stack runs (test/support/bcx-runtime-worker.ts).
// Two REAL `bcd node` processes (the package's bcd launcher) join one local stack: host A pins the
// plugin under privileged, host B pins nothing. A's node carries bc.dev/driver.acme-ns, so a pool
// naming the runtime places only there (B refused by the runtime filter), and the workload really
// runs in namespaces of its own. Then B pins the same plugin WITHOUT privileged: bcd's seccomp
// filter refuses the workload's namespaces, the instance fails saying so, bcd and the plugin keep
// running, nothing starts twice. Nothing is simulated: real processes, namespaces, mounts, sockets
// and the real sandbox. Like every extension, it imports only public entry points: the stack comes
// from the node project's stack broker, bcd is run as its command, the API over HTTP.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";

const has = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
const skipReason =
  process.platform !== "linux" || process.getuid?.() !== 0
    ? "needs Linux and root (bcd's sandbox runs plugins as nobody; the runtime makes namespaces)"
    : !has("unshare") || !has("busybox") || !has("nsenter")
      ? "missing unshare, nsenter or busybox (apt-get install util-linux busybox)"
      : spawnSync("/usr/bin/python3", ["-c", "import seccomp"]).status !== 0
        ? "missing python3-seccomp, which bcd's plugin sandbox needs (apt-get install python3-seccomp)"
        : undefined;
if (skipReason) console.warn(`bcx-runtime: skipped: ${skipReason}`);

const VERSION = "0.1.0";
const LABEL = "bc.dev/driver.acme-ns";
const HOST_LABEL = "acme.test/host";

/** This run's files (made in beforeAll): bcd's configs and state, the bundled plugin, the plugin's state root. */
let work = "";
/** The plugin's state root (baked in when bundled); one directory per uid under it, like /tmp. */
let stateRoot = "";
const instanceDir = (uid: number, id: string) => path.join(stateRoot, `uid-${uid}`, id);

/** The package's root, and its bcd launcher (package.json "bin"), run as an operator runs bcd. */
const root = fileURLToPath(new URL("../../", import.meta.url));
const BCD = path.join(root, (JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")) as { bin: { bcd: string } }).bin.bcd);

/** A stack of this file's own, running the deployment that declares acme-ns (test/support/stack-broker.ts). */
interface Stack {
  id: string;
  url: string;
  adminKey: string;
}
async function ownStack(main: string): Promise<Stack> {
  const res = await fetch(`${inject("stackBroker")}/stack/own`, { method: "POST", body: JSON.stringify({ main }) });
  if (!res.ok) throw new Error(`the stack did not start: ${await res.text()}`);
  return (await res.json()) as Stack;
}

/** One bcd process; what it writes (stdout and stderr) is kept. */
interface Bcd {
  process: ChildProcess;
  output(): string;
  stop(): Promise<void>;
}
function spawnBcd(args: string[], env: Record<string, string>): Bcd {
  const child = spawn(process.execPath, [BCD, ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  for (const stream of [child.stdout!, child.stderr!]) stream.setEncoding("utf8").on("data", (text: string) => (out += text));
  const exited = new Promise((resolve) => child.once("close", resolve));
  return {
    process: child,
    output: () => out,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const force = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(force);
    },
  };
}

let stack: Stack;
const bcd: { a?: Bcd; b?: Bcd } = {};
const nodes = { a: "", b: "" };
const tokens = { a: "", b: "" };

const output = () =>
  Object.entries(bcd)
    .map(([host, p]) => `--- bcd ${host}:\n${(p?.output() ?? "").slice(-3000)}`)
    .join("\n");
/** Polls read() until done(value); after ms, fails naming what did not happen, with the last value and bcd's output. */
async function eventually<T>(read: () => Promise<T>, done: (v: T) => boolean, what: string, ms = 30_000): Promise<T> {
  for (const until = Date.now() + ms; ; await new Promise((r) => setTimeout(r, 100))) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > until) throw new Error(`${what} did not happen within ${ms} ms; last: ${JSON.stringify(value)}\n${output()}`);
  }
}
/** The admin's API call; anything but a 200 throws with the API's code and message. */
async function api(name: string, input: Record<string, unknown>): Promise<any> {
  const res = await fetch(`${stack.url}/v1/${name}`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.adminKey}`, "content-type": "application/json" },
    body: JSON.stringify(input),
  });
  const body = (await res.json()) as Record<string, unknown>;
  if (!res.ok) throw new Error(`${name}: ${String(body.code)}: ${String(body.message)}`);
  return body;
}
const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");

/** bcd's configuration pinning the plugin by its sha256, privileged or not. */
function config(file: string, privileged: boolean): string {
  const plugin = path.join(work, "plugins", "acme-ns.mjs");
  fs.writeFileSync(
    file,
    [
      "[plugins]",
      'dir = "plugins"',
      'user = "nobody"',
      ...(privileged ? ['privileged = ["acme-ns"]'] : []),
      "[[plugins.pin]]",
      'path = "acme-ns.mjs"',
      `sha256 = "${sha256(fs.readFileSync(plugin))}"`,
      'id = "acme-ns"',
      "",
    ].join("\n"),
  );
  return file;
}

/** `bcd start` as a node host (joined with its token, which reaches it only in its environment). */
function startHost(host: "a" | "b", configFile?: string): Bcd {
  const args = ["start", "--url", stack.url, "--role", "node", "--state-dir", path.join(work, `bcd-${host}`), "--hostname", `host-${host}`];
  return (bcd[host] = spawnBcd([...args, ...(configFile ? ["--config", configFile] : [])], { BC_JOIN_TOKEN: tokens[host] }));
}

/** How many times the plugin on this bcd started a workload for the instance (its log, as bcd logs it). */
const starts = (host: "a" | "b", id: string) => bcd[host]!.output().split(`[acme-ns] ${id}: starting its workload`).length - 1;

/** Every process whose arguments name the path, or that lives in this pid namespace. */
function processes(where: { naming?: string; pidNs?: string }): number[] {
  return fs
    .readdirSync("/proc")
    .filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid)
    .filter((p) => {
      try {
        if (where.naming && fs.readFileSync(`/proc/${p}/cmdline`, "utf8").includes(where.naming)) return true;
        return where.pidNs !== undefined && fs.readlinkSync(`/proc/${p}/ns/pid`) === where.pidNs;
      } catch {
        return false; // gone meanwhile
      }
    })
    .map(Number);
}

/** The workload's init (unshare's child, pid 1 of its namespaces), from the plugin's state. */
function workloadInit(dir: string): number {
  const { pid } = JSON.parse(fs.readFileSync(path.join(dir, "state.json"), "utf8")) as { pid: number };
  return Number(fs.readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(" ")[0]);
}

const script = (marker: string) => `#!/bin/sh\necho "${marker} from $(hostname)"\n`;

describe.skipIf(skipReason !== undefined)("Walkthrough 4: a runtime driver hosted by bcd as a bcx plugin", () => {
  beforeAll(async () => {
    // Traversable by nobody, and the state root writable like /tmp: the sandboxed plugin keeps its state there.
    work = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bcx-runtime-"));
    fs.chmodSync(work, 0o755);
    stateRoot = path.join(work, "state");
    fs.mkdirSync(stateRoot);
    fs.chmodSync(stateRoot, 0o1777);
    // Bundled to one file as its author ships it; the state root baked in keeps this run's instances apart.
    await build({
      entryPoints: [fileURLToPath(new URL("./bcx-runtime/plugin.ts", import.meta.url))],
      bundle: true,
      platform: "node",
      format: "esm",
      outfile: path.join(work, "plugins", "acme-ns.mjs"),
      logLevel: "warning",
      define: { ACME_NS_STATE: JSON.stringify(stateRoot) },
    });
    stack = await ownStack("test/support/bcx-runtime-worker.ts");
    for (const host of ["a", "b"] as const)
      tokens[host] = (await api("joinTokens.create", { role: "node", labels: { [HOST_LABEL]: host } })).token;
    // Host A pins the plugin under privileged; host B pins nothing.
    startHost("a", config(path.join(work, "a.toml"), true));
    startHost("b");
    const joined = await eventually(
      async () => (await api("capacity.hosts.list", {})).hosts as any[],
      (hosts) => hosts.length === 2 && hosts.every((h) => h.schedulable),
      "both hosts joined and connected",
    );
    for (const h of joined) nodes[h.labels[HOST_LABEL] as "a" | "b"] = h.node;
  }, 120_000);

  afterAll(async () => {
    await Promise.all(Object.values(bcd).map((p) => p?.stop()));
    // Whatever a failed run left: the workloads outlive bcd on purpose.
    if (stateRoot) for (const pid of processes({ naming: stateRoot })) process.kill(pid, "SIGKILL");
    if (stack) await fetch(`${inject("stackBroker")}/stack/own/${stack.id}`, { method: "DELETE" });
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it("drivers.list shows the plugin's driver; only the node hosting it carries its label", async () => {
    const drivers = (await api("drivers.list", {})).drivers as any[];
    expect(drivers.find((d) => d.id === "acme-ns")).toEqual({
      id: "acme-ns",
      version: VERSION,
      kinds: ["runtime"],
      runsOn: "node",
      secretFields: [],
      manifest: null,
      transport: "bcx",
    });
    const a = await eventually(
      () => api("nodes.get", { node: nodes.a }),
      (n) => n.labels[LABEL] !== undefined,
      "host A labelled with the plugin's driver",
    );
    expect(a.labels[LABEL]).toBe(VERSION);
    expect((await api("nodes.get", { node: nodes.b })).labels[LABEL]).toBeUndefined();
    // A runs it as root without the filter, because its config names it under privileged.
    expect(bcd.a!.output()).toContain('"sandbox":"none (privileged: root, no filter)"');
    expect(bcd.a!.output()).toContain('"message":"bcx plugin registered","plugin":"acme-ns.mjs","driver":"acme-ns","version":"0.1.0"');
  });

  let web: any[] = [];

  it("a pool naming the runtime places only on that node (the other refused by the runtime filter); the workload runs in namespaces of its own", async () => {
    await api("vps.pools.create", { id: "ns", class: "host", runtime: "acme-ns" });
    await api("vps.flavors.create", { id: "ns-small", pool: "ns", vcpus: 1, memoryMiB: 64, diskGiB: 1 });
    await api("vps.tenants.create", { id: "acme", name: "Acme" });
    await api("vps.quotas.set", { tenant: "acme", pool: "ns", instances: 4, vcpus: 4, memoryMiB: 1024, diskGiB: 8 });

    // The placer's view of the pool's request: A takes it, B is refused for lacking the runtime's label.
    const explained = await api("capacity.explain", { runtime: "acme-ns", vcpus: 1, memoryMiB: 64, diskGiB: 1, pool: "ns" });
    expect(explained.pick).toBe(nodes.a);
    expect(explained.verdicts).toContainEqual({
      nodeId: nodes.b,
      accepted: false,
      filter: "runtime",
      reason: "does not run acme-ns (no label bc.dev/driver.acme-ns)",
    });

    // Two instances, spread by default: both on A all the same.
    web = [];
    for (const name of ["web-1", "web-2"])
      web.push(
        await api("vps.instances.create", { tenant: "acme", pool: "ns", flavor: "ns-small", name, userData: script(`hello-${name}`) }),
      );
    expect(web.map((i) => i.host)).toEqual([nodes.a, nodes.a]);

    for (const [i, created] of web.entries()) {
      const running = await eventually(
        () => api("vps.instances.get", { id: created.id }),
        (v) => v.state === "running" || v.state === "failed",
        `${created.id} running`,
      );
      expect(running.state, JSON.stringify(running.lastError)).toBe("running");
      // The workload's report: its hostname is the instance's, and it read exactly the stored bytes.
      const sent = sha256(script(`hello-web-${i + 1}`));
      expect(running.guest).toMatchObject({ hostname: created.id, userDataSha256: sent, storedUserDataSha256: sent, hostKeys: [] });
    }

    // Really in namespaces of its own: pid 1 there, its own mount, UTS, IPC and pid namespaces, a tmpfs only it sees.
    const id = web[0].id;
    const init = workloadInit(instanceDir(0, id));
    for (const ns of ["mnt", "uts", "ipc", "pid"])
      expect(fs.readlinkSync(`/proc/${init}/ns/${ns}`), ns).not.toBe(fs.readlinkSync(`/proc/self/ns/${ns}`));
    expect(fs.readFileSync(`/proc/${init}/status`, "utf8")).toMatch(new RegExp(`^NSpid:\\s+${init}\\s+1$`, "m"));
    const rootfs = path.join(instanceDir(0, id), "rootfs");
    expect(fs.readFileSync(`/proc/${init}/mounts`, "utf8")).toContain(`acme-ns ${rootfs} tmpfs`);
    expect(fs.readFileSync("/proc/self/mounts", "utf8")).not.toContain(rootfs);
    expect(spawnSync("nsenter", ["-t", String(init), "-u", "hostname"], { encoding: "utf8" }).stdout.trim()).toBe(id);

    // Its console is the workload's output: the user data ran inside, under the instance's hostname.
    const shown = await eventually(
      () => api("vps.instances.console", { id, maxBytes: 4096 }),
      (c) => typeof c.console === "string" && c.console.includes(`hello-web-1 from ${id}`),
      "the user data's output on the console",
    );
    expect(shown).toMatchObject({ host: nodes.a, error: null });
    expect(shown.console).toContain(`acme-ns: ${id} is up (user data sha256 ${sha256(script("hello-web-1"))})`);
    // The console is the tenant's: never in the host's log.
    expect(bcd.a!.output()).not.toContain(`hello-web-1 from ${id}`);
  }, 60_000);

  it("stop, start and delete converge; nothing is left behind", async () => {
    const [one, two] = web.map((i) => i.id as string);
    const dir = instanceDir(0, one!);
    const init = workloadInit(dir);
    const pidNs = fs.readlinkSync(`/proc/${init}/ns/pid`);
    const get = (id: string) => api("vps.instances.get", { id });

    await api("vps.instances.stop", { id: one });
    await eventually(
      () => get(one!),
      (v) => v.state === "stopped",
      `${one} stopped`,
    );
    expect(processes({ naming: dir, pidNs })).toEqual([]);
    expect(fs.existsSync(path.join(dir, "user-data.b64"))).toBe(true); // stopped, not removed

    await api("vps.instances.start", { id: one });
    const again = await eventually(
      () => get(one!),
      (v) => v.state === "running",
      `${one} running again`,
    );
    expect(again.guest).toMatchObject({ hostname: one, userDataSha256: again.guest.storedUserDataSha256 });
    // A new workload (a namespace's inode number may be reused once it is freed: the pids tell).
    const initAgain = workloadInit(dir);
    expect(initAgain).not.toBe(init);
    const pidNsAgain = fs.readlinkSync(`/proc/${initAgain}/ns/pid`);

    for (const id of [one!, two!]) await api("vps.instances.delete", { id });
    for (const id of [one!, two!])
      await eventually(
        () => get(id),
        (v) => v.state === "deleted",
        `${id} deleted`,
      );
    expect(processes({ naming: stateRoot, pidNs: pidNsAgain })).toEqual([]);
    expect(fs.readdirSync(path.join(stateRoot, "uid-0"))).toEqual([]);
    // Booted once each, the stopped one once more: however many passes re-applied them.
    expect([starts("a", one!), starts("a", two!)]).toEqual([2, 1]);
    for (const host of [nodes.a, nodes.b]) expect((await api("capacity.hosts.get", { node: host })).reservations).toBe(0);
  }, 60_000);

  it("unprivileged, the sandbox's filter refuses the workload's namespaces: the instance fails saying so, bcd keeps running, nothing starts twice", async () => {
    await api("vps.pools.create", { id: "ns-b", class: "host", hosts: { labels: { [HOST_LABEL]: "b" } }, runtime: "acme-ns" });
    await api("vps.flavors.create", { id: "ns-b-small", pool: "ns-b", vcpus: 1, memoryMiB: 64, diskGiB: 1 });
    await api("vps.quotas.set", { tenant: "acme", pool: "ns-b", instances: 4, vcpus: 4, memoryMiB: 1024, diskGiB: 8 });
    const create = (name: string) =>
      api("vps.instances.create", { tenant: "acme", pool: "ns-b", flavor: "ns-b-small", name, userData: script(name) });

    // B does not run the runtime yet: the instance waits, B named as refused by the runtime filter.
    const waiting = await create("job-1");
    expect(waiting).toMatchObject({ state: "pending", host: null });
    expect(waiting.placement.rejections).toEqual([
      { nodeId: nodes.b, filter: "runtime", reason: "does not run acme-ns (no label bc.dev/driver.acme-ns)" },
    ]);

    // B now pins the same plugin, without privileged: it runs as nobody under the seccomp filter.
    await bcd.b!.stop();
    const b = startHost("b", config(path.join(work, "b.toml"), false));
    await eventually(
      () => api("nodes.get", { node: nodes.b }),
      (n) => n.state === "connected" && n.labels[LABEL] === VERSION,
      "host B labelled with the plugin's driver",
    );
    expect(b.output()).toContain('"sandbox":"seccomp, user nobody"');

    // A new instance is placed on B at once, and the one waiting with it by the reconcile the create
    // runs (the minutely sweep would, too: hence the longer wait).
    const next = await create("job-2");
    expect(next.host).toBe(nodes.b);
    const ids = [waiting.id as string, next.id as string];
    for (const id of ids) {
      const failed = await eventually(
        () => api("vps.instances.get", { id }),
        (v) => v.state === "failed" || v.state === "running",
        `${id} failed`,
        75_000,
      );
      expect(failed).toMatchObject({ state: "failed", host: nodes.b, reason: "boot_failed" });
      expect(failed.lastError.message).toBe(
        `acme-ns: ${id} did not start: its workload ended (exit code 1): unshare: unshare failed: Operation not permitted; ` +
          "this plugin runs in bcd's sandbox, whose seccomp filter refuses namespaces and mounts: pin it under [plugins] privileged",
      );
    }

    // Deleting one re-applies the other in the same pass: its failure is answered again, never retried.
    await api("vps.instances.delete", { id: next.id });
    await eventually(
      () => api("vps.instances.get", { id: next.id }),
      (v) => v.state === "deleted",
      `${next.id} deleted`,
    );
    expect(ids.map((id) => starts("b", id))).toEqual([1, 1]);
    expect(fs.existsSync(instanceDir(65534, next.id))).toBe(false);

    // bcd and the plugin kept running throughout: one plugin start, the node connected.
    expect(b.process.exitCode).toBeNull();
    expect(b.output().split('"message":"bcx plugin starting"').length - 1).toBe(1);
    expect((await api("nodes.get", { node: nodes.b })).state).toBe("connected");

    await api("vps.instances.delete", { id: waiting.id });
    await eventually(
      () => api("vps.instances.get", { id: waiting.id }),
      (v) => v.state === "deleted",
      `${waiting.id} deleted`,
    );
    expect(fs.readdirSync(path.join(stateRoot, "uid-65534"))).toEqual([]);
    expect(processes({ naming: stateRoot })).toEqual([]);
  }, 120_000);
});
