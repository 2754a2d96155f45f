// serveDriver: the plugin side of bcx (docs/bcx.md). A plugin is one file bcd runs; it calls
// serveDriver once with its manifest and operations, and this speaks the protocol over its stdio:
// the handshake, invokes (each with its own AbortSignal, aborted at its deadline or when the host
// cancels), pings, and streams. The plugin's own logging goes to stderr (console.error), never stdout.
import {
  BCX_PROTOCOL,
  encodeFrame,
  FrameError,
  LineSplitter,
  MAX_CHUNK_BYTES,
  MAX_FRAME_BYTES,
  parseHostFrame,
  PLUGIN_ERROR_CODES,
  type FrameErrorBody,
  type HostFrame,
  type PluginErrorCode,
  type PluginFrame,
} from "./protocol.ts";
import type { DriverKind } from "../../core/contracts.ts";

/** What an operation runs with besides its arguments: `this` inside it (write operations with method syntax). */
export interface Invocation {
  /** Aborted at the invoke's deadline or when the host cancels it: stop, and answer (throw) soon. */
  signal: AbortSignal;
  /** When the host stops waiting (ms since the epoch). */
  deadline: number;
}

/** One operation: called with the invoke's positional JSON arguments; its value (JSON) is the result. */
export type DriverOperation = (this: Invocation, ...args: any[]) => unknown;

export interface StreamIo {
  /** Send bytes to the host (split into frames as needed). */
  write(data: Buffer | Uint8Array | string): void;
  /** Bytes the host writes to the stream (a console's keystrokes). */
  onInput(cb: (data: Buffer) => void): void;
  /** Aborted when the host closes the stream: resolve soon after. */
  signal: AbortSignal;
}

/** One stream (a console): runs until it resolves (the stream ends) or throws (it ends with that error). */
export type DriverStream = (args: unknown[], io: StreamIo) => Promise<void>;

export interface ServeDriverOptions {
  id: string;
  version: string;
  kinds: DriverKind[];
  operations: Record<string, DriverOperation>;
  streams?: Record<string, DriverStream>;
}

/** An error a plugin answers with its code (one of PLUGIN_ERROR_CODES; any other arrives as DRIVER_ERROR). */
export class DriverError extends Error {
  override name = "DriverError";
  constructor(
    readonly code: PluginErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** How a thrown value is answered: its own code when it carries one of the protocol's. */
function errorBody(e: unknown): FrameErrorBody {
  const code = (e as { code?: unknown } | null)?.code;
  const message = e instanceof Error ? e.message : String(e);
  return { code: (PLUGIN_ERROR_CODES as readonly unknown[]).includes(code) ? (code as string) : "DRIVER_ERROR", message };
}

/**
 * Serve a driver on this process's stdio until stdin ends (bcd closed it, or is gone): then the
 * process exits. Call it once, at the top level of the plugin's file.
 */
export function serveDriver(def: ServeDriverOptions): void {
  const operations = new Map(Object.entries(def.operations));
  const streamOps = new Map(Object.entries(def.streams ?? {}));
  const running = new Map<string, AbortController>();
  const streams = new Map<string, { controller: AbortController; input: ((b: Buffer) => void)[] }>();

  const send = (frame: PluginFrame) => {
    let line: string;
    try {
      line = encodeFrame(frame);
    } catch (e) {
      // A result too large (or not JSON) is the operation's failure, not the protocol's.
      if (frame.t !== "result" || !(e instanceof FrameError)) throw e;
      line = encodeFrame({ t: "result", id: frame.id, ok: false, error: { code: "DRIVER_ERROR", message: e.message } });
    }
    process.stdout.write(line);
  };

  const invoke = async (frame: Extract<HostFrame, { t: "invoke" }>) => {
    const op = operations.get(frame.op);
    if (!op)
      return send({
        t: "result",
        id: frame.id,
        ok: false,
        error: { code: "UNSUPPORTED", message: `${def.id} has no operation ${frame.op}` },
      });
    const controller = new AbortController();
    running.set(frame.id, controller);
    const timer = setTimeout(() => controller.abort(new DriverError("UNAVAILABLE", `${frame.op} passed its deadline`)), frame.deadlineMs);
    try {
      const value = await op.apply({ signal: controller.signal, deadline: Date.now() + frame.deadlineMs }, frame.args);
      // Cancelled: the host was answered already; what the operation settles to is dropped.
      if (running.get(frame.id) === controller) send({ t: "result", id: frame.id, ok: true, value: value ?? null });
    } catch (e) {
      if (running.get(frame.id) === controller) send({ t: "result", id: frame.id, ok: false, error: errorBody(e) });
    } finally {
      clearTimeout(timer);
      if (running.get(frame.id) === controller) running.delete(frame.id);
    }
  };

  const openStream = async (frame: Extract<HostFrame, { t: "stream.open" }>) => {
    const run = streamOps.get(frame.op);
    if (!run)
      return send({ t: "stream.end", id: frame.id, error: { code: "UNSUPPORTED", message: `${def.id} has no stream ${frame.op}` } });
    const state = { controller: new AbortController(), input: [] as ((b: Buffer) => void)[] };
    streams.set(frame.id, state);
    const write = (data: Buffer | Uint8Array | string) => {
      if (!streams.has(frame.id)) return; // ended: nothing more goes out
      const bytes = typeof data === "string" ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      for (let at = 0; at < bytes.length; at += MAX_CHUNK_BYTES)
        send({ t: "stream.data", id: frame.id, data: bytes.subarray(at, at + MAX_CHUNK_BYTES).toString("base64") });
    };
    let error: FrameErrorBody | undefined;
    try {
      await run(frame.args, { write, onInput: (cb) => state.input.push(cb), signal: state.controller.signal });
    } catch (e) {
      error = errorBody(e);
    }
    streams.delete(frame.id);
    send({ t: "stream.end", id: frame.id, ...(error ? { error } : {}) });
  };

  const onFrame = (frame: HostFrame) => {
    switch (frame.t) {
      case "invoke":
        return void invoke(frame);
      case "cancel": {
        const controller = running.get(frame.id);
        if (!controller) return; // answered already
        running.delete(frame.id);
        controller.abort(new DriverError("UNAVAILABLE", "cancelled by the host"));
        return send({ t: "result", id: frame.id, ok: false, error: { code: "UNAVAILABLE", message: "cancelled by the host" } });
      }
      case "ping":
        return send({ t: "pong", id: frame.id });
      case "stream.open":
        return void openStream(frame);
      case "stream.write": {
        const data = Buffer.from(frame.data, "base64");
        for (const cb of streams.get(frame.id)?.input ?? []) cb(data);
        return;
      }
      case "stream.close":
        return streams.get(frame.id)?.controller.abort(new DriverError("UNAVAILABLE", "closed by the host"));
    }
  };

  // A host that breaks the protocol is not one to keep talking to: say why on stderr, and exit.
  const broken = (why: string) => {
    process.stderr.write(`bcx: ${def.id}: the host broke the protocol (${why}); exiting\n`);
    process.exit(70);
  };
  const splitter = new LineSplitter(
    MAX_FRAME_BYTES,
    (line) => {
      try {
        onFrame(parseHostFrame(line));
      } catch (e) {
        if (!(e instanceof FrameError)) throw e;
        broken(e.message);
      }
    },
    () => broken(`a line over ${MAX_FRAME_BYTES} bytes`),
  );
  process.stdin.on("data", (chunk: Buffer) => splitter.push(chunk));
  process.stdin.on("end", () => process.exit(0));
  send({
    t: "handshake",
    protocol: BCX_PROTOCOL,
    id: def.id,
    version: def.version,
    kinds: def.kinds,
    operations: [...operations.keys()],
    streams: [...streamOps.keys()],
  });
}
