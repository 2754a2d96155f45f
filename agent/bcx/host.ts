// PluginHost: bcd's side of bcx (docs/bcx.md). It runs each pinned plugin as a child process,
// checked against its sha256 before every start, sandboxed unless the config names it privileged,
// and speaks the protocol to it over its stdio: invokes with deadlines and cancellation, health
// pings, streams. A plugin that crashes, hangs or writes garbage fails what it was running with a
// DRIVER_ERROR naming it (never run again: no command runs twice) and is restarted with backoff;
// bcd never dies with it. Its stderr is its log: bounded, and each line tagged with its name.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { chmod, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { jitterBackoff } from "../backoff.ts";
import { AgentError, type AgentLogger } from "../contracts.ts";
import { isPrivileged, pluginFileName, readPinned, type PluginPin, type PluginsConfig } from "./config.ts";
import {
  encodeFrame,
  FrameError,
  LineSplitter,
  MAX_CHUNK_BYTES,
  MAX_FRAME_BYTES,
  parsePluginFrame,
  PLUGIN_ERROR_CODES,
  type FrameErrorBody,
  type HostFrame,
  type Manifest,
  type PluginFrame,
} from "./protocol.ts";

export interface PluginTiming {
  /** A started plugin must send its handshake within this. */
  handshakeMs: number;
  /** A ready plugin is pinged this often... */
  pingIntervalMs: number;
  /** ...and killed (then restarted) if it does not answer within this. */
  pingTimeoutMs: number;
  /** A cancelled invoke or a closed stream must be answered within this, or the plugin is killed. */
  cancelGraceMs: number;
  /** An invoke's deadline when the caller gives none. */
  defaultDeadlineMs: number;
  /** Restarts wait jitterBackoff from this, doubling per failed start, up to backoffMaxMs. */
  backoffInitialMs: number;
  backoffMaxMs: number;
  /** A plugin up this long starts its backoff over when it dies. */
  healthyAfterMs: number;
  /** close() waits this long for a plugin to exit once its stdin is closed, then kills it. */
  stopGraceMs: number;
  /** At most this many stderr lines a second per plugin are logged; the rest are counted. */
  stderrLinesPerSecond: number;
  /** A longer stderr line is cut here. */
  stderrLineBytes: number;
}

const DEFAULT_TIMING: PluginTiming = {
  handshakeMs: 5_000,
  pingIntervalMs: 15_000,
  pingTimeoutMs: 5_000,
  cancelGraceMs: 5_000,
  defaultDeadlineMs: 60_000,
  backoffInitialMs: 500,
  backoffMaxMs: 30_000,
  healthyAfterMs: 10_000,
  stopGraceMs: 2_000,
  stderrLinesPerSecond: 100,
  stderrLineBytes: 4096,
};

export interface PluginHostOptions {
  log: AgentLogger;
  /** Ids of the drivers bcd has built in: a plugin announcing one of them is refused. */
  builtinDrivers: readonly string[];
  timing?: Partial<PluginTiming>;
  /** The sandbox helper; default the one next to bcd. */
  sandbox?: { helper?: string };
}

/** A driver a plugin serves, as drivers() lists it. */
export interface HostedDriver {
  id: string;
  version: string;
  kinds: string[];
  operations: string[];
  streams: string[];
  /** The plugin's file name. */
  plugin: string;
}

/** How each pinned plugin is doing (for `bcd run --check`, tests and conformance). */
export interface PluginStatus {
  plugin: string;
  driver?: string;
  state: "starting" | "ready" | "restarting" | "refused" | "closed";
  pid?: number;
  /** Starts after the first. */
  restarts: number;
  /** Why it is refused. */
  error?: string;
}

export interface BcxStream {
  onData(cb: (data: Buffer) => void): void;
  /** Once: without an error when the plugin ended the stream, with one when it failed or the plugin died. */
  onEnd(cb: (error?: Error) => void): void;
  write(data: Buffer | string): void;
  /** Ask the plugin to end the stream; onEnd follows. */
  close(): void;
}

export interface InvokeOptions {
  /** How long the caller waits (ms), starting now; default timing.defaultDeadlineMs. */
  deadlineMs?: number;
  signal?: AbortSignal;
}

/** The sandbox helper as installed next to bcd (agent/bcx/sandbox.py; in the build, usr/lib/bcd/sandbox.py). */
export const SANDBOX_HELPER = fileURLToPath(new URL("./sandbox.py", import.meta.url));
/** Debian's python3, which python3-seccomp is installed for (not whatever python3 is first on PATH). */
const SANDBOX_PYTHON = "/usr/bin/python3";
/** A plugin's whole environment: bcd's own (which may hold a join token) never reaches it. */
const PLUGIN_ENV = { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C.UTF-8" };
const JS = /\.(m?js|cjs)$/;
const STDERR_PERIOD_MS = 1000;
const PERMANENT_CODES = new Set(["INVALID_ARGUMENT", "UNSUPPORTED"]);

interface Pending {
  op: string;
  resolve(value: unknown): void;
  reject(error: AgentError): void;
  /** The caller was answered (deadline, abort): the plugin's answer is awaited only to know it honoured the cancel. */
  abandoned: boolean;
  timer?: ReturnType<typeof setTimeout>;
}

/** One running process of a plugin, from spawn to exit. */
interface Live {
  child: ChildProcess;
  startedAt: number;
  handshaken: boolean;
  /** Why bcd killed it, when it did. */
  fault?: string;
  pending: Map<string, Pending>;
  streams: Map<string, HostStream>;
  pings: Map<string, { timer: ReturnType<typeof setTimeout>; resolve: () => void; reject: (e: AgentError) => void }>;
  timers: Set<ReturnType<typeof setTimeout> | ReturnType<typeof setInterval>>;
  exited: Promise<void>;
}

interface Plugin {
  pin: PluginPin;
  file: string;
  privileged: boolean;
  manifest?: Manifest;
  state: PluginStatus["state"];
  live?: Live;
  restarts: number;
  /** Failed starts in a row (the backoff's attempt). */
  attempt: number;
  refused?: AgentError;
  waiters: Set<{ resolve(live: Live): void; reject(e: AgentError): void }>;
  restartTimer?: ReturnType<typeof setTimeout>;
}

/** The name a plugin goes by in messages: its file, and its driver once it said. */
const label = (p: Plugin) => `bcx plugin ${p.file}${p.manifest ? ` (driver ${p.manifest.id})` : ""}`;
const driverError = (p: Plugin, message: string, permanent = false) =>
  new AgentError("DRIVER_ERROR", `${label(p)}: ${message}`, undefined, { permanent });

export class PluginHost {
  readonly #opts: PluginHostOptions;
  readonly #timing: PluginTiming;
  readonly #plugins: Plugin[];
  readonly #byDriver = new Map<string, Plugin>();
  readonly #runDir: string;
  /** Why unprivileged plugins cannot run here (no helper, no python3-seccomp, no such user), if so. */
  readonly #sandboxProblem: string | undefined;
  readonly #config: PluginsConfig;
  #nextId = 0;
  #closing = false;

  private constructor(config: PluginsConfig, opts: PluginHostOptions, runDir: string, sandboxProblem: string | undefined) {
    this.#config = config;
    this.#opts = opts;
    this.#timing = { ...DEFAULT_TIMING, ...opts.timing };
    this.#runDir = runDir;
    this.#sandboxProblem = sandboxProblem;
    this.#plugins = config.pins.map((pin) => ({
      pin,
      file: pluginFileName(pin),
      privileged: isPrivileged(config, pin),
      state: "starting",
      restarts: 0,
      attempt: 0,
      waiters: new Set(),
    }));
  }

  /**
   * Start every pinned plugin and wait until each has completed its handshake or failed its first
   * start (a failed one is restarted with backoff, a refused one is not). Never throws for a plugin.
   */
  static async start(config: PluginsConfig, opts: PluginHostOptions): Promise<PluginHost> {
    const sandboxed = config.pins.some((pin) => !isPrivileged(config, pin));
    const sandboxProblem = sandboxed ? await checkSandbox(config, opts.sandbox) : undefined;
    // The verified copies run from here: root's, others may only traverse it (a sandboxed plugin reads its own file).
    const runDir = await mkdtemp(path.join(tmpdir(), "bcd-bcx-"));
    await chmod(runDir, 0o711);
    const host = new PluginHost(config, opts, runDir, sandboxProblem);
    await Promise.all(host.#plugins.map((p) => host.#launch(p, 0)));
    // One refused after its start (a twin pinned before it came up later) is gone too.
    await Promise.all(host.#plugins.map((p) => (p.state === "refused" ? p.live?.exited : undefined)));
    return host;
  }

  /** The drivers the plugins serve (those refused are not listed). */
  drivers(): HostedDriver[] {
    return this.#plugins
      .filter((p) => p.manifest && p.state !== "refused")
      .map((p) => {
        const m = p.manifest!;
        return {
          id: m.id,
          version: m.version,
          kinds: [...m.kinds],
          operations: [...m.operations],
          streams: [...m.streams],
          plugin: p.file,
        };
      });
  }

  /** Whether a plugin serves this driver (it may be restarting). */
  has(driverId: string): boolean {
    const p = this.#byDriver.get(driverId);
    return p !== undefined && p.state !== "refused";
  }

  status(): PluginStatus[] {
    return this.#plugins.map((p) => ({
      plugin: p.file,
      ...(p.manifest ? { driver: p.manifest.id } : {}),
      state: p.state,
      ...(p.live?.child.pid !== undefined ? { pid: p.live.child.pid } : {}),
      restarts: p.restarts,
      ...(p.refused ? { error: p.refused.message } : {}),
    }));
  }

  /**
   * Run `op` of a hosted driver with positional JSON arguments (which may hold secrets: they are
   * never logged). Resolves with the plugin's value; rejects with its error (its code kept), or with
   * DRIVER_ERROR naming the plugin when it crashed, hung past the deadline or broke the protocol.
   * A failed invoke is never sent again.
   */
  async invoke(driverId: string, op: string, args: unknown[], opts: InvokeOptions = {}): Promise<unknown> {
    const plugin = this.#plugin(driverId);
    const deadlineAt = Date.now() + (opts.deadlineMs ?? this.#timing.defaultDeadlineMs);
    const live = await this.#ready(plugin, deadlineAt, opts.signal, op);
    const id = String(++this.#nextId);
    let line: string;
    try {
      line = encodeFrame({ t: "invoke", id, op, args, deadlineMs: Math.max(1, deadlineAt - Date.now()) });
    } catch (e) {
      throw new AgentError("INVALID_ARGUMENT", `${label(plugin)}: ${op}: ${(e as Error).message}`, undefined, { permanent: true });
    }
    // Aborted while it waited for the plugin: nothing was sent, so there is nothing to cancel.
    if (opts.signal?.aborted) throw abortError(opts.signal, plugin, op);
    return new Promise((resolve, reject) => {
      const detach = () => opts.signal?.removeEventListener("abort", onAbort);
      const pending: Pending = {
        op,
        abandoned: false,
        resolve: (value) => (detach(), resolve(value)),
        reject: (error) => (detach(), reject(error)),
      };
      // The caller is answered now; the plugin must still answer the cancel within the grace.
      const abandon = (error: AgentError) => {
        if (pending.abandoned) return;
        pending.abandoned = true;
        clearTimeout(pending.timer);
        pending.reject(error);
        this.#send(live, { t: "cancel", id });
        pending.timer = setTimeout(
          () => this.#fault(plugin, live, `did not answer the cancel of ${op} within ${this.#timing.cancelGraceMs} ms`),
          this.#timing.cancelGraceMs,
        );
      };
      const onAbort = () => abandon(abortError(opts.signal!, plugin, op));
      const deadlineMs = opts.deadlineMs ?? this.#timing.defaultDeadlineMs;
      pending.timer = setTimeout(
        () => abandon(driverError(plugin, `${op} did not answer within ${deadlineMs} ms; cancelled`)),
        Math.max(0, deadlineAt - Date.now()),
      );
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      live.pending.set(id, pending);
      this.#write(live, line);
    });
  }

  /** A health ping through the protocol: resolves with the round trip (ms). */
  async ping(driverId: string): Promise<number> {
    const plugin = this.#plugin(driverId);
    const live = await this.#ready(plugin, Date.now() + this.#timing.pingTimeoutMs, undefined, "ping");
    const started = Date.now();
    await this.#ping(plugin, live);
    return Date.now() - started;
  }

  /** Open a stream (a console) of a hosted driver. Data and the end arrive through the callbacks. */
  openStream(driverId: string, op: string, args: unknown[]): BcxStream {
    const plugin = this.#plugin(driverId);
    const id = String(++this.#nextId);
    const stream = new HostStream(id, op, {
      write: (data) => {
        for (let at = 0; at < data.length; at += MAX_CHUNK_BYTES)
          if (stream.live)
            this.#send(stream.live, { t: "stream.write", id, data: data.subarray(at, at + MAX_CHUNK_BYTES).toString("base64") });
      },
      close: () => {
        const live = stream.live;
        if (!live) return; // not opened yet: it ends when the plugin is ready
        this.#send(live, { t: "stream.close", id });
        const grace = setTimeout(() => {
          if (live.streams.has(id))
            this.#fault(plugin, live, `did not end stream ${op} within ${this.#timing.cancelGraceMs} ms of its close`);
        }, this.#timing.cancelGraceMs);
        live.timers.add(grace);
      },
    });
    this.#ready(plugin, Date.now() + this.#timing.defaultDeadlineMs, undefined, op).then(
      (live) => {
        if (stream.closed) return stream.end();
        stream.live = live;
        live.streams.set(id, stream);
        this.#send(live, { t: "stream.open", id, op, args });
      },
      (e: AgentError) => stream.end(e),
    );
    return stream.api;
  }

  /** Stop every plugin: stdin closed (a plugin exits then), killed after the grace period. */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    await Promise.all(
      this.#plugins.map(async (p) => {
        clearTimeout(p.restartTimer);
        for (const w of p.waiters) w.reject(driverError(p, "bcd is stopping"));
        p.waiters.clear();
        const live = p.live;
        p.state = "closed";
        if (!live) return;
        live.child.stdin?.end();
        const timer = setTimeout(() => kill(live.child), this.#timing.stopGraceMs);
        await live.exited;
        clearTimeout(timer);
      }),
    );
    await rm(this.#runDir, { recursive: true, force: true });
  }

  // ------------------------------------------------------------------ internals

  #plugin(driverId: string): Plugin {
    const plugin = this.#byDriver.get(driverId);
    if (!plugin)
      throw new AgentError("UNSUPPORTED", `no bcx plugin on this agent serves driver ${driverId}`, undefined, { permanent: true });
    return plugin;
  }

  /** The plugin's live process once it is ready (waiting through a restart), within the deadline. */
  #ready(plugin: Plugin, deadlineAt: number, signal: AbortSignal | undefined, what: string): Promise<Live> {
    if (plugin.state === "ready" && plugin.live && !plugin.live.fault) return Promise.resolve(plugin.live);
    if (plugin.refused) return Promise.reject(plugin.refused);
    if (plugin.state === "closed") return Promise.reject(driverError(plugin, "bcd is stopping"));
    if (signal?.aborted) return Promise.reject(abortError(signal, plugin, what));
    return new Promise<Live>((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        plugin.waiters.delete(waiter);
      };
      const waiter = {
        resolve: (live: Live) => (done(), resolve(live)),
        reject: (e: AgentError) => (done(), reject(e)),
      };
      const onAbort = () => waiter.reject(abortError(signal!, plugin, what));
      const timer = setTimeout(
        () => waiter.reject(driverError(plugin, `not running (restarting after a failure); ${what} was not sent`)),
        Math.max(0, deadlineAt - Date.now()),
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      plugin.waiters.add(waiter);
    });
  }

  /** Verify, copy and spawn the plugin; resolves once it is ready, refused, or this start failed. */
  async #launch(plugin: Plugin, delayMs: number): Promise<void> {
    if (delayMs > 0) await new Promise<void>((r) => (plugin.restartTimer = setTimeout(r, delayMs)));
    if (this.#closing || plugin.refused) return;
    if (!plugin.privileged && this.#sandboxProblem)
      return this.#refuse(
        plugin,
        driverError(plugin, `refused: it must run sandboxed, and the sandbox is not available: ${this.#sandboxProblem}`, true),
      );
    let command: string[];
    try {
      command = await this.#prepare(plugin);
    } catch (e) {
      const error = driverError(plugin, (e as Error).message, e instanceof AgentError && e.permanent);
      if (error.permanent) return this.#refuse(plugin, error);
      this.#opts.log.error("bcx plugin could not start", { plugin: plugin.file, error: error.message });
      return this.#scheduleRestart(plugin);
    }
    if (this.#closing) return;
    const [program, ...args] = command;
    // Its own process group: a fault kills the plugin and whatever it started.
    const child = spawn(program!, args, { stdio: ["pipe", "pipe", "pipe"], env: PLUGIN_ENV, cwd: "/", detached: true });
    let exited!: () => void;
    const live: Live = {
      child,
      startedAt: Date.now(),
      handshaken: false,
      pending: new Map(),
      streams: new Map(),
      pings: new Map(),
      timers: new Set(),
      exited: new Promise((r) => (exited = r)),
    };
    plugin.live = live;
    // This start's outcome: ready, or gone (refused, failed).
    const outcome = new Promise<void>((resolve) => {
      const waiter = {
        resolve: () => (plugin.waiters.delete(waiter), resolve()),
        reject: () => (plugin.waiters.delete(waiter), live.exited.then(resolve)),
      };
      plugin.waiters.add(waiter);
      live.exited.then(resolve);
    });
    this.#opts.log.info("bcx plugin starting", {
      plugin: plugin.file,
      pid: child.pid,
      sandbox: plugin.privileged ? "none (privileged: root, no filter)" : `seccomp, user ${this.#config.user}`,
    });
    const splitter = new LineSplitter(
      MAX_FRAME_BYTES,
      (line) => this.#onLine(plugin, live, line),
      () => this.#fault(plugin, live, `wrote a line over the ${MAX_FRAME_BYTES}-byte frame limit`),
    );
    child.stdout!.on("data", (chunk: Buffer) => {
      if (!live.fault) splitter.push(chunk);
    });
    this.#readLog(plugin, live);
    child.stdin!.on("error", () => {}); // a plugin gone mid-write: its exit says what happened
    const onClose = (code: number | null, signal: NodeJS.Signals | null) => {
      exited();
      this.#onExit(plugin, live, code, signal);
    };
    child.once("close", onClose);
    child.once("error", (e) => {
      live.fault ??= `could not be run: ${e.message}`;
      // Never spawned: no close follows.
      if (child.pid === undefined) onClose(null, null);
      else kill(child);
    });
    live.timers.add(
      setTimeout(() => this.#fault(plugin, live, `sent no handshake within ${this.#timing.handshakeMs} ms`), this.#timing.handshakeMs),
    );
    await outcome;
  }

  /** The verified bytes, copied where the plugin's user can read them, and the command that runs them. */
  async #prepare(plugin: Plugin): Promise<string[]> {
    const bytes = await readPinned(plugin.pin);
    const copy = path.join(this.#runDir, `${this.#plugins.indexOf(plugin)}-${plugin.file}`);
    const js = JS.test(plugin.file);
    await writeFile(`${copy}.new`, bytes, { mode: js ? 0o444 : 0o555 });
    await chmod(`${copy}.new`, js ? 0o444 : 0o555);
    await rename(`${copy}.new`, copy);
    const command = js ? [process.execPath, copy] : [copy];
    if (plugin.privileged) return command;
    const { user, group } = this.#config;
    const sandbox = this.#opts.sandbox;
    return [
      SANDBOX_PYTHON,
      "-I",
      sandbox?.helper ?? SANDBOX_HELPER,
      "--user",
      String(user),
      ...(group !== undefined ? ["--group", String(group)] : []),
      "--",
      ...command,
    ];
  }

  #onLine(plugin: Plugin, live: Live, line: Buffer): void {
    if (live.fault || plugin.live !== live) return;
    let frame: PluginFrame;
    try {
      frame = parsePluginFrame(line);
    } catch (e) {
      if (!(e instanceof FrameError)) throw e;
      return this.#fault(plugin, live, `broke the protocol: ${e.message}`);
    }
    if (!live.handshaken) {
      if (frame.t !== "handshake") return this.#fault(plugin, live, `broke the protocol: a ${frame.t} frame before its handshake`);
      return this.#onHandshake(plugin, live, frame);
    }
    switch (frame.t) {
      case "handshake":
        return this.#fault(plugin, live, "broke the protocol: a second handshake");
      case "result": {
        const pending = live.pending.get(frame.id);
        if (!pending) return this.#fault(plugin, live, `broke the protocol: a result for ${frame.id}, which it was not running`);
        live.pending.delete(frame.id);
        clearTimeout(pending.timer);
        if (pending.abandoned) return;
        if (frame.ok) return pending.resolve(frame.value);
        return pending.reject(pluginError(plugin, pending.op, frame.error));
      }
      case "pong": {
        const ping = live.pings.get(frame.id);
        if (!ping) return this.#fault(plugin, live, `broke the protocol: a pong for ${frame.id}, which was not sent`);
        live.pings.delete(frame.id);
        clearTimeout(ping.timer);
        return ping.resolve();
      }
      case "stream.data":
      case "stream.end": {
        const stream = live.streams.get(frame.id);
        if (!stream) return this.#fault(plugin, live, `broke the protocol: ${frame.t} for ${frame.id}, which is not an open stream`);
        if (frame.t === "stream.data") return stream.data(Buffer.from(frame.data, "base64"));
        live.streams.delete(frame.id);
        return stream.end(frame.error ? pluginError(plugin, stream.op, frame.error) : undefined);
      }
    }
  }

  #onHandshake(plugin: Plugin, live: Live, manifest: Manifest): void {
    live.handshaken = true;
    const id = manifest.id;
    const refusal = (p: Plugin, why: string) =>
      new AgentError("DRIVER_ERROR", `bcx plugin ${p.file} (driver ${id}): refused: ${why}`, undefined, { permanent: true });
    const refuse = (why: string) => this.#refuse(plugin, refusal(plugin, why));
    if (this.#opts.builtinDrivers.includes(id))
      return refuse(`its driver ${id} is built into bcd, and a plugin never shadows a built-in driver`);
    if (plugin.pin.id && plugin.pin.id !== id) return refuse(`the config pins it as driver ${plugin.pin.id}, and it says it is ${id}`);
    if (plugin.manifest && plugin.manifest.id !== id)
      return refuse(`it was driver ${plugin.manifest.id}, and after a restart says it is ${id}`);
    const other = this.#byDriver.get(id);
    if (other && other !== plugin) {
      // One id, two plugins: the one pinned first serves it, whichever started first.
      const [first, second] = this.#plugins.indexOf(other) < this.#plugins.indexOf(plugin) ? [other, plugin] : [plugin, other];
      this.#refuse(second, refusal(second, `driver ${id} is served by ${first.file}, pinned before it`));
      if (second === plugin) return;
    }
    if (!plugin.manifest) this.#opts.log.info("bcx plugin registered", { plugin: plugin.file, driver: id, version: manifest.version });
    plugin.manifest = manifest;
    this.#byDriver.set(id, plugin);
    plugin.state = "ready";
    for (const t of live.timers) clearTimeout(t);
    live.timers.clear();
    live.timers.add(setInterval(() => void this.#ping(plugin, live).catch(() => {}), this.#timing.pingIntervalMs));
    for (const w of [...plugin.waiters]) w.resolve(live);
  }

  /** One ping; no pong within pingTimeoutMs is a hung plugin: killed and restarted. */
  #ping(plugin: Plugin, live: Live): Promise<void> {
    const id = String(++this.#nextId);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#fault(plugin, live, `did not answer a health ping within ${this.#timing.pingTimeoutMs} ms (hung)`);
        reject(driverError(plugin, "did not answer a ping"));
      }, this.#timing.pingTimeoutMs);
      live.pings.set(id, { timer, resolve, reject });
      this.#send(live, { t: "ping", id });
    });
  }

  /** bcd gives up on this process: killed now; its exit fails what it was running and restarts it. */
  #fault(plugin: Plugin, live: Live, why: string): void {
    if (live.fault || plugin.live !== live) return;
    live.fault = why;
    if (plugin.state === "ready") plugin.state = "restarting";
    this.#opts.log.error("bcx plugin failed; killing it", {
      plugin: plugin.file,
      ...(plugin.manifest ? { driver: plugin.manifest.id } : {}),
      why,
    });
    live.child.stdout?.destroy(); // nothing more is read from it
    kill(live.child);
  }

  /** Refused for good (pin mismatch, shadowing, no sandbox): not restarted, its driver not served. */
  #refuse(plugin: Plugin, error: AgentError): void {
    plugin.refused = error;
    plugin.state = "refused";
    this.#opts.log.error("bcx plugin refused", { plugin: plugin.file, error: error.message });
    if (plugin.live) {
      plugin.live.fault ??= error.message;
      kill(plugin.live.child);
    }
    for (const w of [...plugin.waiters]) w.reject(error);
  }

  #onExit(plugin: Plugin, live: Live, code: number | null, signal: NodeJS.Signals | null): void {
    for (const t of live.timers) clearTimeout(t);
    if (plugin.live === live) plugin.live = undefined;
    const why =
      live.fault ?? (this.#closing ? "bcd is stopping" : `exited unexpectedly (${signal ? `signal ${signal}` : `exit code ${code}`})`);
    for (const [, pending] of live.pending) {
      clearTimeout(pending.timer);
      if (!pending.abandoned) pending.reject(driverError(plugin, `${why}; ${pending.op} failed and is not run again`));
    }
    for (const [, ping] of live.pings) {
      clearTimeout(ping.timer);
      ping.reject(driverError(plugin, why));
    }
    for (const [, stream] of live.streams) stream.end(driverError(plugin, why));
    if (this.#closing || plugin.state === "refused") return;
    this.#opts.log.warn("bcx plugin exited", { plugin: plugin.file, code, signal, why });
    if (Date.now() - live.startedAt >= this.#timing.healthyAfterMs && live.handshaken) plugin.attempt = 0;
    this.#scheduleRestart(plugin);
  }

  #scheduleRestart(plugin: Plugin): void {
    if (this.#closing || plugin.refused) return;
    const delayMs = Math.max(
      this.#timing.backoffInitialMs / 2,
      jitterBackoff(plugin.attempt++, { initialMs: this.#timing.backoffInitialMs, maxMs: this.#timing.backoffMaxMs }),
    );
    plugin.state = "restarting";
    plugin.restarts++;
    this.#opts.log.warn("bcx plugin restarting", { plugin: plugin.file, delayMs });
    void this.#launch(plugin, delayMs);
  }

  /** Its stderr: one log line per line, tagged with the plugin, cut at stderrLineBytes, at most stderrLinesPerSecond. */
  #readLog(plugin: Plugin, live: Live): void {
    const { stderrLineBytes, stderrLinesPerSecond } = this.#timing;
    let windowStart = 0;
    let logged = 0;
    let dropped = 0;
    const emit = (line: string) => {
      const now = Date.now();
      if (now - windowStart >= STDERR_PERIOD_MS) {
        windowStart = now;
        logged = 0;
      }
      if (logged >= stderrLinesPerSecond) {
        // Counted, and said once per period.
        if (dropped++ === 0)
          setTimeout(() => {
            this.#opts.log.warn(`[${plugin.manifest?.id ?? plugin.file}] ${dropped} log lines dropped (over ${stderrLinesPerSecond}/s)`, {
              plugin: plugin.file,
            });
            dropped = 0;
          }, STDERR_PERIOD_MS).unref();
        return;
      }
      logged++;
      this.#opts.log.info(`[${plugin.manifest?.id ?? plugin.file}] ${line}`, { plugin: plugin.file });
    };
    const splitter = new LineSplitter(
      stderrLineBytes,
      (line) => emit(line.toString("utf8")),
      (head) => emit(`${head.toString("utf8")} …(cut at ${stderrLineBytes} bytes)`),
    );
    live.child.stderr!.on("data", (chunk: Buffer) => splitter.push(chunk));
  }

  #send(live: Live, frame: HostFrame): void {
    this.#write(live, encodeFrame(frame));
  }

  #write(live: Live, line: string): void {
    if (!live.fault && live.child.stdin?.writable) live.child.stdin.write(line);
  }
}

/** One stream, host side. */
class HostStream {
  live: Live | undefined;
  closed = false;
  #ended: { error?: Error } | undefined;
  readonly #data: ((b: Buffer) => void)[] = [];
  readonly #end: ((e?: Error) => void)[] = [];

  constructor(
    readonly id: string,
    readonly op: string,
    readonly send: { write(data: Buffer): void; close(): void },
  ) {}

  readonly api: BcxStream = {
    onData: (cb) => void this.#data.push(cb),
    onEnd: (cb) => {
      if (this.#ended) cb(this.#ended.error);
      else this.#end.push(cb);
    },
    write: (data) => {
      if (!this.closed && !this.#ended) this.send.write(typeof data === "string" ? Buffer.from(data) : data);
    },
    close: () => {
      if (this.closed || this.#ended) return;
      this.closed = true;
      this.send.close();
    },
  };

  data(bytes: Buffer): void {
    if (!this.#ended) for (const cb of this.#data) cb(bytes);
  }

  end(error?: Error): void {
    if (this.#ended) return;
    this.#ended = error ? { error } : {};
    for (const cb of this.#end.splice(0)) cb(error);
  }
}

/** What a plugin answered, as the caller's error: its code when it is one of the protocol's, DRIVER_ERROR otherwise. */
function pluginError(plugin: Plugin, what: string, e: FrameErrorBody): AgentError {
  const code = (PLUGIN_ERROR_CODES as readonly string[]).includes(e.code) ? e.code : "DRIVER_ERROR";
  return new AgentError(code, `${label(plugin)}: ${what}: ${e.message.slice(0, 2000)}`, undefined, {
    permanent: PERMANENT_CODES.has(code),
  });
}

/** The caller gave up: its signal's reason when that is an AgentError (the executor's DEADLINE_EXCEEDED, INTERRUPTED). */
function abortError(signal: AbortSignal, plugin: Plugin, what: string): AgentError {
  return signal.reason instanceof AgentError ? signal.reason : driverError(plugin, `${what} was cancelled by its caller`);
}

/** SIGKILL to the plugin's process group (detached: it leads its own). */
function kill(child: ChildProcess): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, "SIGKILL");
  } catch {
    child.kill("SIGKILL");
  }
}

/**
 * Whether unprivileged plugins can run here: the helper runs its own check (python3-seccomp
 * importable, the filter builds, the user and group exist, bcd is root). The problem, or undefined.
 */
export async function checkSandbox(
  config: Pick<PluginsConfig, "user" | "group">,
  sandbox: PluginHostOptions["sandbox"] = {},
): Promise<string | undefined> {
  const helper = sandbox.helper ?? SANDBOX_HELPER;
  const args = [
    "-I",
    helper,
    "--check",
    "--user",
    String(config.user),
    ...(config.group !== undefined ? ["--group", String(config.group)] : []),
  ];
  try {
    await promisify(execFile)(SANDBOX_PYTHON, args, { timeout: 10_000, env: PLUGIN_ENV });
    return undefined;
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === "ENOENT") return `${SANDBOX_PYTHON} is not installed (apt-get install python3 python3-seccomp)`;
    const said = String(err.stderr ?? "")
      .trim()
      .split("\n")
      .at(-1);
    return said?.replace(/^bcx-sandbox: /, "") || `the sandbox helper ${helper} failed: ${err.message}`;
  }
}
