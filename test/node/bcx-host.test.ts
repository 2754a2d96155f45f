// bcx (docs/bcx.md) with real plugin processes: fixture plugins written with serveDriver
// (test/fixtures/bcx/), bundled here with esbuild as an operator would, pinned by sha256 and run by
// bcd's PluginHost, sandboxed as nobody under the seccomp filter unless privileged. Round trips,
// deadlines, cancellation and streams; the faults (killed mid-invoke, an exit, a hang, garbage,
// 100 MB on stdout, a changed file, a mount) each a DRIVER_ERROR naming the plugin while the host
// serves the others and nothing runs twice; the conformance cases; and the real bcd advertising a
// hosted driver in its hello and serving driver.invoke.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runConformance } from "better-compute/conformance";
import { driverConformanceCases, externalDriver, bcxSubject } from "better-compute/driver-sdk";
import { AgentError, type AgentLogger, type CommandContext } from "../../agent/contracts.ts";
import { PluginHost, SANDBOX_HELPER, type PluginHostOptions, type PluginTiming } from "../../agent/bcx/host.ts";
import { driverInvokeHandlers } from "../../agent/bcx/handlers.ts";
import type { PluginPin, PluginsConfig } from "../../agent/bcx/config.ts";
import { repoRoot } from "../../local/node-store.ts";
import { runBcd, spawnBcd, type BcdProcess } from "../../local/bcd-process.ts";
import { FakeNodeServer } from "../../testing/fake-server.ts";
import { eventually } from "../support/eventually.ts";

// Traversable by nobody: the sandboxed fixtures append to count files in it.
const work = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bcx-"));
fs.chmodSync(work, 0o755);
const hosts: PluginHost[] = [];
let bcd: BcdProcess | undefined;
let server: FakeNodeServer | undefined;

/** A fixture bundled to one file, as a plugin ships; `id` bundles it as another driver. */
async function bundle(fixture: "well" | "faulty", file: string, id?: string): Promise<string> {
  const out = path.join(work, file);
  await build({
    entryPoints: [path.join(repoRoot, "test", "fixtures", "bcx", `${fixture}.ts`)],
    bundle: true,
    platform: "node",
    format: "esm",
    outfile: out,
    logLevel: "warning",
    ...(id ? { define: { BCX_FIXTURE_ID: JSON.stringify(id) } } : {}),
  });
  return out;
}

const sha256 = (file: string) => createHash("sha256").update(fs.readFileSync(file)).digest("hex");
const pin = (file: string): PluginPin => ({ path: file, sha256: sha256(file) });

/** A file every plugin user may append to: a fixture writes one line per operation it runs. */
function countFile(name: string): string {
  const file = path.join(work, `${name}.count`);
  fs.writeFileSync(file, "");
  fs.chmodSync(file, 0o666);
  return file;
}
const counted = (file: string) => fs.readFileSync(file, "utf8").split("\n").filter(Boolean);

interface Logged {
  level: string;
  message: string;
  fields: Record<string, unknown>;
}
function memoryLog(): AgentLogger & { lines: Logged[]; text(): string } {
  const lines: Logged[] = [];
  const at =
    (level: string) =>
    (message: string, fields: Record<string, unknown> = {}) =>
      void lines.push({ level, message, fields });
  return {
    lines,
    info: at("info"),
    warn: at("warn"),
    error: at("error"),
    text: () => lines.map((l) => `${l.message} ${JSON.stringify(l.fields)}`).join("\n"),
  };
}

const FAST: Partial<PluginTiming> = {
  handshakeMs: 5_000,
  pingIntervalMs: 300,
  pingTimeoutMs: 1_500,
  cancelGraceMs: 500,
  backoffInitialMs: 40,
  backoffMaxMs: 200,
  stopGraceMs: 500,
};

async function startHost(
  pins: PluginPin[],
  opts: {
    privileged?: string[];
    log?: AgentLogger;
    timing?: Partial<PluginTiming>;
    builtin?: string[];
    sandbox?: PluginHostOptions["sandbox"];
  } = {},
): Promise<PluginHost> {
  const config: PluginsConfig = { dir: work, user: "nobody", privileged: opts.privileged ?? [], pins };
  const host = await PluginHost.start(config, {
    log: opts.log ?? memoryLog(),
    builtinDrivers: opts.builtin ?? ["redfish", "ipxe", "qemu-microvm", "firecracker"],
    timing: { ...FAST, ...opts.timing },
    ...(opts.sandbox ? { sandbox: opts.sandbox } : {}),
  });
  hosts.push(host);
  return host;
}

/** The rejection of p, which must reject with an AgentError. */
async function refusal(p: Promise<unknown>): Promise<AgentError> {
  const e = await p.then(
    (v) => {
      throw new Error(`expected a refusal, got ${JSON.stringify(v)}`);
    },
    (e: unknown) => e,
  );
  expect(e).toBeInstanceOf(AgentError);
  return e as AgentError;
}

const ready = (host: PluginHost, plugin: string) =>
  eventually(
    async () => host.status().find((s) => s.plugin === plugin),
    (s) => s?.state === "ready",
    `${plugin} ready again`,
    { ms: 10_000, intervalMs: 50 },
  );

let well: string;
let faulty: string;

beforeAll(async () => {
  [well, faulty] = await Promise.all([bundle("well", "well.mjs"), bundle("faulty", "faulty.mjs")]);
}, 60_000);

afterAll(async () => {
  await Promise.all(hosts.map((h) => h.close()));
  await bcd?.stop();
  await server?.close();
  fs.rmSync(work, { recursive: true, force: true });
});

describe("the bcx host", () => {
  it("runs a pinned plugin sandboxed as nobody and round-trips invokes with positional arguments", async () => {
    const started = Date.now();
    const host = await startHost([pin(well)]);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(host.drivers()).toEqual([
      {
        id: "well",
        version: "1.2.3",
        kinds: ["power", "management"],
        operations: ["add", "echo", "whoami", "count", "sleep", "chatter", "mount"],
        streams: ["shout", "ticks"],
        plugin: "well.mjs",
      },
    ]);
    expect(host.has("well")).toBe(true);
    expect(await host.invoke("well", "add", [2, 3])).toBe(5);
    expect(await host.invoke("well", "echo", ["ab", 3])).toEqual({ text: "ab", times: 3, repeated: "ababab" });
    // Its own uid and group, no supplementary groups, no_new_privs, the filter (2: SECCOMP_MODE_FILTER),
    // and none of bcd's environment.
    expect(await host.invoke("well", "whoami", [])).toEqual({
      uid: 65534,
      gid: 65534,
      groups: "",
      noNewPrivs: "1",
      seccomp: "2",
      env: ["LANG", "PATH"],
    });
    // The plugin's refusals keep their codes; what no plugin serves is UNSUPPORTED.
    const bad = await refusal(host.invoke("well", "add", ["2", 3]));
    expect(bad).toMatchObject({ code: "INVALID_ARGUMENT", permanent: true });
    expect(bad.message).toBe("bcx plugin well.mjs (driver well): add: argument 1 must be a number");
    expect(await refusal(host.invoke("well", "reboot", []))).toMatchObject({ code: "UNSUPPORTED" });
    expect(await refusal(host.invoke("nobody-serves-this", "add", []))).toMatchObject({ code: "UNSUPPORTED" });
    expect(await host.ping("well")).toBeLessThan(1_000);
  });

  it("a deadline or an abort cancels the invoke: the plugin answers the cancel and lives on", async () => {
    const host = await startHost([pin(well)]);
    const count = countFile("deadline");
    const late = await refusal(host.invoke("well", "sleep", [count, 10_000], { deadlineMs: 200 }));
    expect(late).toMatchObject({ code: "DRIVER_ERROR" });
    expect(late.message).toBe("bcx plugin well.mjs (driver well): sleep did not answer within 200 ms; cancelled");
    const controller = new AbortController();
    const aborted = host.invoke("well", "sleep", [count, 10_000], { signal: controller.signal });
    setTimeout(() => controller.abort(new AgentError("INTERRUPTED", "the agent is stopping")), 100);
    expect(await refusal(aborted)).toMatchObject({ code: "INTERRUPTED" });
    // Past the cancel grace: the plugin answered both cancels, so it was not killed.
    await new Promise((r) => setTimeout(r, 700));
    expect(host.status()[0]).toMatchObject({ state: "ready", restarts: 0 });
    expect(counted(count)).toEqual(["sleep", "sleep"]);
  });

  it("streams both ways, ended by the host or the plugin", async () => {
    const host = await startHost([pin(well)]);
    const shout = host.openStream("well", "shout", ["hi"]);
    let received = "";
    shout.onData((b) => (received += b.toString()));
    const ended = new Promise<Error | undefined>((resolve) => shout.onEnd(resolve));
    await eventually(
      async () => received,
      (r) => r === "hi\n",
      "the greeting",
      { ms: 5_000, intervalMs: 20 },
    );
    shout.write("abc");
    shout.write(Buffer.from(" def"));
    await eventually(
      async () => received,
      (r) => r === "hi\nABC DEF",
      "the echo",
      { ms: 5_000, intervalMs: 20 },
    );
    shout.close();
    expect(await ended).toBeUndefined();

    const ticks = host.openStream("well", "ticks", [300]);
    let bytes = 0;
    ticks.onData((b) => (bytes += b.length));
    expect(await new Promise((resolve) => ticks.onEnd(resolve))).toBeUndefined();
    expect(bytes).toBe(300_000);

    const failing = host.openStream("well", "ticks", [-1]);
    expect(await new Promise((resolve) => failing.onEnd(resolve))).toMatchObject({ code: "FAILED_PRECONDITION" });
    const unknown = host.openStream("well", "nope", []);
    expect(await new Promise((resolve) => unknown.onEnd(resolve))).toMatchObject({ code: "UNSUPPORTED" });
    expect(host.status()[0]).toMatchObject({ state: "ready", restarts: 0 });
  });

  it("faults: killed mid-invoke, an exit, a hang, garbage, 100 MB on stdout: each a DRIVER_ERROR naming the plugin, never run twice", async () => {
    const log = memoryLog();
    const host = await startHost([pin(well), pin(faulty)], { log });
    const wellCount = countFile("well-faults");
    const faultyCount = countFile("faulty-faults");
    const pidOf = (plugin: string) => host.status().find((s) => s.plugin === plugin)!.pid!;

    // Killed in the middle of an invoke: it fails once, and the restarted plugin does not run it again.
    const sleeping = refusal(host.invoke("well", "sleep", [wellCount, 30_000]));
    await eventually(
      async () => counted(wellCount),
      (c) => c.length === 1,
      "the sleep to start",
      { ms: 5_000, intervalMs: 20 },
    );
    process.kill(pidOf("well.mjs"), "SIGKILL");
    expect((await sleeping).message).toBe(
      "bcx plugin well.mjs (driver well): exited unexpectedly (signal SIGKILL); sleep failed and is not run again",
    );

    const faults: [string, RegExp, number?][] = [
      ["exit", /^bcx plugin faulty\.mjs \(driver faulty\): exited unexpectedly \(exit code 3\); exit failed and is not run again$/],
      ["hang", /^bcx plugin faulty\.mjs \(driver faulty\): hang did not answer within 300 ms; cancelled$/, 300],
      [
        "garbage",
        /^bcx plugin faulty\.mjs \(driver faulty\): broke the protocol: a line that is not JSON; garbage failed and is not run again$/,
      ],
      [
        "flood",
        /^bcx plugin faulty\.mjs \(driver faulty\): wrote a line over the 1048576-byte frame limit; flood failed and is not run again$/,
      ],
    ];
    const rss = process.memoryUsage().rss;
    const faultyStatus = () => host.status().find((s) => s.plugin === "faulty.mjs")!;
    for (const [op, message, deadlineMs] of faults) {
      const restarts = faultyStatus().restarts;
      const e = await refusal(host.invoke("faulty", op, [faultyCount], deadlineMs ? { deadlineMs } : {}));
      expect(e, op).toMatchObject({ code: "DRIVER_ERROR" });
      expect(e.message, op).toMatch(message);
      // The other plugin serves on meanwhile; this one is back once restarted (the hung one after the cancel's grace).
      expect(await host.invoke("well", "add", [1, 1])).toBe(2);
      await eventually(
        async () => faultyStatus(),
        (s) => s.restarts === restarts + 1 && s.state === "ready",
        `faulty restarted after ${op}`,
        {
          ms: 10_000,
          intervalMs: 20,
        },
      );
    }
    // 100 MB were never held: the line was given up at the frame limit.
    expect(process.memoryUsage().rss - rss).toBeLessThan(64 * 2 ** 20);
    // The hung plugin did not answer the cancel: killed when the grace ended, then restarted.
    expect(log.text()).toContain("did not answer the cancel of hang within 500 ms");
    expect(await host.invoke("faulty", "ok", [faultyCount])).toBe("fine");
    expect(await host.invoke("well", "count", [wellCount])).toBe("counted");
    // Every operation ran exactly once, through all the restarts.
    await new Promise((r) => setTimeout(r, 300));
    expect(counted(faultyCount)).toEqual(["exit", "hang", "garbage", "flood", "ok"]);
    expect(counted(wellCount)).toEqual(["sleep", "count"]);
    expect(host.status().find((s) => s.plugin === "faulty.mjs")!.restarts).toBe(4);
  }, 60_000);

  it("a health ping finds a hung plugin: killed and restarted", async () => {
    const log = memoryLog();
    const host = await startHost([pin(faulty)], { log, timing: { pingIntervalMs: 100, pingTimeoutMs: 300 } });
    const count = countFile("ping");
    const hung = refusal(host.invoke("faulty", "hang", [count], { deadlineMs: 20_000 }));
    expect((await hung).message).toBe(
      "bcx plugin faulty.mjs (driver faulty): did not answer a health ping within 300 ms (hung); hang failed and is not run again",
    );
    await ready(host, "faulty.mjs");
    expect(counted(count)).toEqual(["hang"]);
  });

  it("checks the sha256 before every start: a pin that differs is refused, and so is a file changed before a restart", async () => {
    const log = memoryLog();
    const wrong = { path: well, sha256: "0".repeat(64) };
    const host = await startHost([wrong], { log });
    expect(host.drivers()).toEqual([]);
    const actual = sha256(well);
    const expected = `bcx plugin well.mjs: refused: ${well} has sha256 ${actual.slice(0, 16)}…, the config pins 0000000000000000…`;
    expect(host.status()).toEqual([{ plugin: "well.mjs", state: "refused", restarts: 0, error: expected }]);
    expect(log.lines).toContainEqual({ level: "error", message: "bcx plugin refused", fields: { plugin: "well.mjs", error: expected } });

    // Pinned right, then its bytes change: the next start is refused, and its driver is no longer served.
    const copy = path.join(work, "changing.mjs");
    fs.copyFileSync(well, copy);
    const changing = await startHost([pin(copy)]);
    expect(await changing.invoke("well", "add", [1, 2])).toBe(3);
    fs.appendFileSync(copy, "\n// changed\n");
    process.kill(changing.status()[0]!.pid!, "SIGKILL");
    await eventually(
      async () => changing.status()[0]!.state,
      (s) => s === "refused",
      "the changed plugin refused",
      { ms: 5_000, intervalMs: 20 },
    );
    const e = await refusal(changing.invoke("well", "add", [1, 2]));
    expect(e).toMatchObject({ code: "DRIVER_ERROR" });
    expect(e.message).toMatch(
      /^bcx plugin changing\.mjs \(driver well\): refused: .* has sha256 [0-9a-f]{16}…, the config pins [0-9a-f]{16}…$/,
    );
    expect(changing.has("well")).toBe(false);
    expect(changing.drivers()).toEqual([]);
  });

  it("a plugin never shadows a built-in driver, and a second plugin with one id is refused", async () => {
    const log = memoryLog();
    const redfish = await bundle("well", "redfish.mjs", "redfish");
    const twin = path.join(work, "twin.mjs");
    fs.copyFileSync(well, twin);
    const host = await startHost([pin(redfish), pin(well), pin(twin)], { log });
    expect(host.drivers().map((d) => d.id)).toEqual(["well"]);
    expect(host.status()).toEqual([
      {
        plugin: "redfish.mjs",
        state: "refused",
        restarts: 0,
        error:
          "bcx plugin redfish.mjs (driver redfish): refused: its driver redfish is built into bcd, and a plugin never shadows a built-in driver",
      },
      expect.objectContaining({ plugin: "well.mjs", state: "ready" }),
      expect.objectContaining({
        plugin: "twin.mjs",
        state: "refused",
        error: "bcx plugin twin.mjs (driver well): refused: driver well is served by well.mjs, pinned before it",
      }),
    ]);
    expect(host.has("redfish")).toBe(false);
  });

  it("the sandbox: an unprivileged plugin's mount is refused by the filter, a privileged one mounts a tmpfs", async () => {
    const root = await bundle("well", "well-root.mjs", "well-root");
    const host = await startHost([pin(well), pin(root)], { privileged: ["well-root"] });
    // As nobody, a user namespace would let it mount (the kernel allows that here): the filter refuses.
    const refused = await refusal(host.invoke("well", "mount", []));
    expect(refused).toMatchObject({ code: "FAILED_PRECONDITION" });
    expect(refused.message).toBe("bcx plugin well.mjs (driver well): mount: unshare: unshare failed: Operation not permitted");
    expect(await host.invoke("well-root", "mount", [])).toMatch(/^bcx-test \/mnt tmpfs /);
    expect(await host.invoke("well-root", "whoami", [])).toMatchObject({ uid: 0, seccomp: "0" });
  });

  it.runIf(process.arch === "x64")("the filter refuses each listed system call (EPERM; clone3 ENOSYS)", async () => {
    // x86_64 numbers. Null arguments: refused by the filter before the kernel reads any.
    const calls = {
      mount: 165,
      umount2: 166,
      pivot_root: 155,
      open_tree: 428,
      move_mount: 429,
      fsopen: 430,
      fsconfig: 431,
      fsmount: 432,
      fspick: 433,
      mount_setattr: 442,
      unshare: 272,
      setns: 308,
      bpf: 321,
      init_module: 175,
      finit_module: 313,
      delete_module: 176,
      kexec_load: 246,
      kexec_file_load: 320,
      clone3: 435,
    };
    const script = [
      "import ctypes, json, os",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "def errno(r):",
      "    return 'ok' if r >= 0 else os.strerror(ctypes.get_errno())",
      `out = {name: errno(libc.syscall(nr, 0x10000000 if name == 'unshare' else 0, 0, 0, 0, 0)) for name, nr in ${JSON.stringify(calls)}.items()}`,
      // clone(CLONE_NEWUSER | SIGCHLD): nobody may make a user namespace here, but not under the filter.
      "out['clone(CLONE_NEWUSER)'] = errno(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))",
      "print(json.dumps(out))",
    ].join("\n");
    const { stdout } = await promisify(execFile)("/usr/bin/python3", [
      "-I",
      SANDBOX_HELPER,
      "--user",
      "nobody",
      "--",
      "/usr/bin/python3",
      "-I",
      "-c",
      script,
    ]);
    const refused = JSON.parse(stdout) as Record<string, string>;
    expect(Object.keys(refused).length).toBe(20);
    for (const [call, error] of Object.entries(refused))
      expect(error, call).toBe(call === "clone3" ? "Function not implemented" : "Operation not permitted");
  });

  it("without the sandbox an unprivileged plugin is refused, never run unsandboxed; a privileged one still runs", async () => {
    const root = await bundle("well", "well-root.mjs", "well-root");
    const host = await startHost([pin(well), pin(root)], {
      privileged: ["well-root.mjs"],
      sandbox: { helper: path.join(work, "no-such-helper.py") },
    });
    expect(host.drivers().map((d) => d.id)).toEqual(["well-root"]);
    expect(host.status()[0]).toMatchObject({
      plugin: "well.mjs",
      state: "refused",
      error: expect.stringMatching(
        /^bcx plugin well\.mjs: refused: it must run sandboxed, and the sandbox is not available: .*no-such-helper\.py/,
      ),
    });
    expect(await host.invoke("well-root", "add", [1, 2])).toBe(3);
  });

  it("its stderr is its log: each line tagged with the plugin, cut when too long, at most so many a second", async () => {
    const log = memoryLog();
    const host = await startHost([pin(well)], { log, timing: { stderrLinesPerSecond: 20, stderrLineBytes: 200 } });
    await host.invoke("well", "chatter", [100, 10_000]);
    const logged = () => log.lines.filter((l) => l.level === "info" && l.message.startsWith("[well] line "));
    const dropped = () =>
      log.lines
        .map((l) => /^\[well\] (\d+) log lines dropped \(over 20\/s\)$/.exec(l.message)?.[1])
        .reduce((n, d) => n + Number(d ?? 0), 0);
    // Every line is either logged or counted in a report (a second later).
    await eventually(
      async () => logged().length + dropped(),
      (n) => n === 100,
      "all 100 lines accounted for",
      { ms: 5_000, intervalMs: 50 },
    );
    expect(logged()[0]).toEqual({
      level: "info",
      message: `[well] line 0 ${"x".repeat(193)} …(cut at 200 bytes)`,
      fields: { plugin: "well.mjs" },
    });
    // 20 a second: one burst fits in one or two periods.
    expect(logged().length).toBeGreaterThanOrEqual(20);
    expect(logged().length).toBeLessThanOrEqual(40);
  });
});

describe("better-compute/driver-sdk", () => {
  it("driverConformanceCases pass against the well-behaved plugin, sandboxed", async () => {
    const count = countFile("conformance");
    // mount has none: sandboxed, it answers FAILED_PRECONDITION, which is an answer.
    const samples = { add: [1, 2], echo: ["x", 2], whoami: [], count: [count], sleep: [count, 50], chatter: [1, 1] };
    const report = await runConformance(
      driverConformanceCases(),
      () => bcxSubject({ file: well, samples, timing: { cancelGraceMs: 500 } }),
      {
        dispose: (s) => s.close(),
      },
    );
    expect(report.failed).toEqual([]);
    expect(report.passed.length).toBe(driverConformanceCases().length);
  }, 60_000);

  it("externalDriver declares the driver for the control plane, marked as a bcx plugin's", () => {
    expect(externalDriver({ id: "ipmi", kinds: ["power", "management"], runsOn: "site", secretFields: ["password"] })).toEqual({
      contract: "driver",
      id: "ipmi",
      version: "1",
      kinds: ["power", "management"],
      runsOn: "site",
      secretFields: ["password"],
      transport: "bcx",
    });
  });

  it("driver.invoke replaces the command's secret references in the arguments, and never sends the body's own", async () => {
    const seen: unknown[][] = [];
    const handlers = driverInvokeHandlers({ invoke: async (_d, _op, args) => (seen.push(args), "ok") });
    const ctx = { kind: "driver.invoke", signal: new AbortController().signal, deadline: null, secrets: { "secret://bmc": "hunter2" } };
    await handlers["driver.invoke"]!(
      { driver: "ipmi", op: "power.set", args: [{ password: "secret://bmc" }, "on"] },
      ctx as unknown as CommandContext,
    );
    expect(seen).toEqual([[{ password: "hunter2" }, "on"]]);
    await expect(handlers["driver.invoke"]!({ driver: "ipmi", args: [] }, ctx as unknown as CommandContext)).rejects.toMatchObject({
      code: "INVALID_ARGUMENT",
    });
  });
});

describe("bcd hosting plugins", () => {
  it("--check validates the config and each pin; run advertises the hosted driver in its hello and serves driver.invoke", async () => {
    server = await FakeNodeServer.start();
    const dir = path.join(work, "bcd");
    fs.mkdirSync(path.join(dir, "plugins"), { recursive: true });
    fs.copyFileSync(well, path.join(dir, "plugins", "well.mjs"));
    const redfish = await bundle("well", "redfish.mjs", "redfish");
    fs.copyFileSync(redfish, path.join(dir, "plugins", "redfish.mjs"));
    const config = path.join(dir, "bcd.toml");
    const toml = (pins: { path: string; sha256: string }[], extra = "") =>
      `[plugins]\ndir = "plugins"\nuser = "nobody"\n${extra}\n${pins.map((p) => `[[plugins.pin]]\npath = "${p.path}"\nsha256 = "${p.sha256}"\n`).join("\n")}`;
    const good = [
      { path: "well.mjs", sha256: sha256(well) },
      { path: "redfish.mjs", sha256: sha256(redfish) },
    ];
    const state = path.join(dir, "state");
    const token = server.token();
    const joined = await runBcd(["join", "--url", server.url, "--role", "site", "--state-dir", state], { env: { BC_JOIN_TOKEN: token } });
    expect(joined.code).toBe(0);
    const nodeId = /joined as (\S+)/.exec(joined.out)![1]!;

    // --check: the file's fields, then each pin's bytes.
    fs.writeFileSync(config, toml(good));
    expect(await runBcd(["run", "--check", "--state-dir", state, "--config", config])).toMatchObject({
      code: 0,
      out: `bcd: plugins OK: 2 pinned, each file's sha256 checked\nbcd: configuration OK: joined as ${nodeId} (site)\n`,
    });
    fs.writeFileSync(config, toml(good, "colour = 3"));
    expect(await runBcd(["run", "--check", "--state-dir", state, "--config", config])).toMatchObject({
      code: 2,
      err: `bcd: --config ${config}: plugins: Unrecognized key: "colour"\n`,
    });
    fs.writeFileSync(config, toml([{ path: "well.mjs", sha256: "abc" }]));
    expect((await runBcd(["run", "--check", "--state-dir", state, "--config", config])).err).toBe(
      `bcd: --config ${config}: plugins.pin[0].sha256: must be the file's sha256: 64 hex digits (sha256sum FILE)\n`,
    );
    fs.writeFileSync(config, toml([{ path: "well.mjs", sha256: "f".repeat(64) }]));
    expect(await runBcd(["run", "--check", "--state-dir", state, "--config", config])).toMatchObject({
      code: 2,
      err: `bcd: bcx plugin well.mjs: refused: ${path.join(dir, "plugins", "well.mjs")} has sha256 ${sha256(well).slice(0, 16)}…, the config pins ffffffffffffffff…\n`,
    });

    fs.writeFileSync(config, toml(good));
    bcd = spawnBcd(["run", "--state-dir", state, "--config", config]);
    await server.waitFor(() => server!.hellos.some((h) => h.nodeId === nodeId), 15_000, "bcd's hello");
    // The plugin's driver is advertised; the one named like a built-in is refused, not advertised.
    expect(server.hellos.find((h) => h.nodeId === nodeId)!.frame.drivers).toEqual([{ id: "well", version: "1.2.3" }]);
    expect(bcd.output("stderr")).toContain("a plugin never shadows a built-in driver");

    const secret = "sup3r-secret-argument";
    server.deliver = false;
    const echo = server.enqueue(nodeId, { kind: "driver.invoke", body: { driver: "well", op: "echo", args: ["secret://s-1", 2] } });
    echo.secrets = { "secret://s-1": secret };
    const add = server.enqueue(nodeId, { kind: "driver.invoke", body: { driver: "well", op: "add", args: [40, 2] } });
    const wrong = server.enqueue(nodeId, { kind: "driver.invoke", body: { driver: "well", op: "add", args: ["x", 2] } });
    server.deliverPending(nodeId);
    await server.waitFor(() => !!(echo.result && add.result && wrong.result), 10_000, "the invokes' results");
    expect(echo.result).toMatchObject({ ok: true, output: { text: secret, times: 2 } });
    expect(add.result).toMatchObject({ ok: true, output: 42 });
    expect(wrong.result).toMatchObject({ ok: false, error: { code: "INVALID_ARGUMENT" } });
    await bcd.stop();
    expect((await bcd.exited).code).toBe(0);
    // The arguments (a secret among them) are in no log line.
    expect(bcd.output()).not.toContain(secret);
    expect(bcd.output()).toContain('"message":"bcx plugin registered"');
  }, 60_000);
});
