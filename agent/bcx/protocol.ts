// The bcx protocol, version 1 (docs/bcx.md): how bcd talks to a driver plugin it runs. One JSON
// object per line ("frame") on the plugin's stdin (host → plugin) and stdout (plugin → host); the
// plugin's stderr is its log. Both sides (agent/bcx/host.ts and serveDriver in agent/bcx/serve.ts)
// read frames with these checks, so what one side refuses the other never sends.
//
// Plain TypeScript over Node's Buffer, no schema library: a plugin bundles this file, and it stays small.
import type { DriverKind } from "../../core/contracts.ts";

export const BCX_PROTOCOL = 1;
/** The longest frame either side sends or accepts, newline excluded. */
export const MAX_FRAME_BYTES = 1 << 20;
/** Stream data travels in chunks of at most this many bytes (base64 makes 4/3 of it: well within a frame). */
export const MAX_CHUNK_BYTES = 512 * 1024;
/** The error codes a plugin may answer; anything else reaches the caller as DRIVER_ERROR. */
export const PLUGIN_ERROR_CODES = ["INVALID_ARGUMENT", "UNSUPPORTED", "DRIVER_ERROR", "UNAVAILABLE", "FAILED_PRECONDITION"] as const;
export type PluginErrorCode = (typeof PLUGIN_ERROR_CODES)[number];
export const DRIVER_KINDS = [
  "power",
  "management",
  "boot",
  "deploy",
  "media",
  "bios",
  "raid",
  "firmware",
  "runtime",
] as const satisfies readonly DriverKind[];

/** A driver id, as core's defineDriver takes it. */
export const DRIVER_ID = /^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*$/;
/** An operation or stream name: "power.set", "sol". */
const OPERATION_NAME = /^[a-zA-Z][a-zA-Z0-9._-]{0,63}$/;
const MAX_ID_CHARS = 64;
const MAX_NAMES = 256;

/** What a plugin says it is, in its first frame. */
export interface Manifest {
  protocol: typeof BCX_PROTOCOL;
  id: string;
  version: string;
  kinds: DriverKind[];
  operations: string[];
  streams: string[];
}

export interface FrameErrorBody {
  code: string;
  message: string;
}

export type HostFrame =
  | { t: "invoke"; id: string; op: string; args: unknown[]; deadlineMs: number }
  | { t: "cancel"; id: string }
  | { t: "ping"; id: string }
  | { t: "stream.open"; id: string; op: string; args: unknown[] }
  | { t: "stream.write"; id: string; data: string }
  | { t: "stream.close"; id: string };

export type PluginFrame =
  | ({ t: "handshake" } & Manifest)
  | { t: "result"; id: string; ok: true; value: unknown }
  | { t: "result"; id: string; ok: false; error: FrameErrorBody }
  | { t: "pong"; id: string }
  | { t: "stream.data"; id: string; data: string }
  | { t: "stream.end"; id: string; error?: FrameErrorBody };

/** A frame that breaks the protocol: the side that reads it treats the other as broken. */
export class FrameError extends Error {
  override name = "FrameError";
}

/** One frame as the line that carries it; FrameError if it is over MAX_FRAME_BYTES (or not JSON: a cycle, a BigInt). */
export function encodeFrame(frame: HostFrame | PluginFrame): string {
  let text: string;
  try {
    text = JSON.stringify(frame);
  } catch (e) {
    throw new FrameError(`a ${frame.t} frame is not JSON: ${(e as Error).message}`);
  }
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_FRAME_BYTES) throw new FrameError(`a ${frame.t} frame of ${bytes} bytes is over the ${MAX_FRAME_BYTES}-byte limit`);
  return `${text}\n`;
}

type Fields = Record<string, unknown>;

function object(line: Buffer | string): Fields {
  let value: unknown;
  try {
    value = JSON.parse(typeof line === "string" ? line : line.toString("utf8"));
  } catch {
    throw new FrameError("a line that is not JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new FrameError("a frame that is not a JSON object");
  return value as Fields;
}

const id = (f: Fields): string => {
  if (typeof f.id !== "string" || f.id.length === 0 || f.id.length > MAX_ID_CHARS)
    throw new FrameError(`a ${f.t} frame without a valid id`);
  return f.id;
};
const name = (f: Fields, key: string): string => {
  const v = f[key];
  if (typeof v !== "string" || !OPERATION_NAME.test(v)) throw new FrameError(`a ${f.t} frame whose ${key} is not an operation name`);
  return v;
};
const args = (f: Fields): unknown[] => {
  if (!Array.isArray(f.args)) throw new FrameError(`a ${f.t} frame whose args are not an array`);
  return f.args;
};
const base64 = (f: Fields): string => {
  if (typeof f.data !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(f.data)) throw new FrameError(`a ${f.t} frame whose data is not base64`);
  return f.data;
};
const names = (f: Fields, key: string, optional = false): string[] => {
  const v = f[key];
  if (v === undefined && optional) return [];
  if (
    !Array.isArray(v) ||
    v.length > MAX_NAMES ||
    !v.every((n) => typeof n === "string" && OPERATION_NAME.test(n)) ||
    new Set(v).size !== v.length
  )
    throw new FrameError(`a handshake whose ${key} is not a list of distinct operation names`);
  return v as string[];
};
const errorBody = (f: Fields, v: unknown): FrameErrorBody => {
  const e = v as Fields | null;
  if (typeof e !== "object" || e === null || typeof e.code !== "string" || typeof e.message !== "string")
    throw new FrameError(`a ${f.t} frame whose error is not {code, message}`);
  return { code: e.code, message: e.message };
};

/** The manifest a handshake frame carries, checked. */
function manifest(f: Fields): Manifest {
  if (f.protocol !== BCX_PROTOCOL) throw new FrameError(`a handshake for protocol ${String(f.protocol)}; this host speaks ${BCX_PROTOCOL}`);
  if (typeof f.id !== "string" || f.id.length > 128 || !DRIVER_ID.test(f.id))
    throw new FrameError("a handshake whose id is not a driver id");
  if (typeof f.version !== "string" || f.version.length === 0 || f.version.length > 64)
    throw new FrameError("a handshake whose version is not a string of 1 to 64 characters");
  const kinds = f.kinds;
  if (!Array.isArray(kinds) || kinds.length === 0 || !kinds.every((k) => (DRIVER_KINDS as readonly unknown[]).includes(k)))
    throw new FrameError(`a handshake whose kinds are not driver kinds (${DRIVER_KINDS.join(", ")})`);
  return {
    protocol: BCX_PROTOCOL,
    id: f.id,
    version: f.version,
    kinds: [...new Set(kinds as DriverKind[])],
    operations: names(f, "operations"),
    streams: names(f, "streams", true),
  };
}

/** A line the plugin wrote, as a frame; FrameError when it is garbage. */
export function parsePluginFrame(line: Buffer | string): PluginFrame {
  const f = object(line);
  switch (f.t) {
    case "handshake":
      return { t: "handshake", ...manifest(f) };
    case "result":
      if (f.ok === true) return { t: "result", id: id(f), ok: true, value: f.value ?? null };
      if (f.ok === false) return { t: "result", id: id(f), ok: false, error: errorBody(f, f.error) };
      throw new FrameError("a result frame whose ok is not a boolean");
    case "pong":
      return { t: "pong", id: id(f) };
    case "stream.data":
      return { t: "stream.data", id: id(f), data: base64(f) };
    case "stream.end":
      return { t: "stream.end", id: id(f), ...(f.error !== undefined ? { error: errorBody(f, f.error) } : {}) };
    default:
      throw new FrameError(`a frame of unknown type ${JSON.stringify(f.t)?.slice(0, 40)}`);
  }
}

/** A line the host wrote, as a frame; FrameError when it is garbage. */
export function parseHostFrame(line: Buffer | string): HostFrame {
  const f = object(line);
  switch (f.t) {
    case "invoke": {
      const deadlineMs = f.deadlineMs;
      if (typeof deadlineMs !== "number" || !Number.isFinite(deadlineMs) || deadlineMs <= 0)
        throw new FrameError("an invoke frame whose deadlineMs is not a positive number");
      return { t: "invoke", id: id(f), op: name(f, "op"), args: args(f), deadlineMs };
    }
    case "cancel":
    case "ping":
    case "stream.close":
      return { t: f.t, id: id(f) };
    case "stream.open":
      return { t: "stream.open", id: id(f), op: name(f, "op"), args: args(f) };
    case "stream.write":
      return { t: "stream.write", id: id(f), data: base64(f) };
    default:
      throw new FrameError(`a frame of unknown type ${JSON.stringify(f.t)?.slice(0, 40)}`);
  }
}

/**
 * Splits a byte stream into lines without ever holding more than `max` bytes of one: a longer line
 * is handed to `tooLong` once (its first `max` bytes) and the rest of it is skipped up to its newline.
 */
export class LineSplitter {
  #parts: Buffer[] = [];
  #length = 0;
  #skipping = false;

  constructor(
    readonly max: number,
    readonly line: (line: Buffer) => void,
    readonly tooLong: (head: Buffer) => void,
  ) {}

  push(chunk: Buffer): void {
    let start = 0;
    while (start < chunk.length) {
      const nl = chunk.indexOf(10, start);
      const end = nl < 0 ? chunk.length : nl;
      if (!this.#skipping) this.#take(chunk.subarray(start, end));
      if (nl < 0) return;
      if (this.#skipping) this.#skipping = false;
      else this.line(this.#flush());
      start = nl + 1;
    }
  }

  #take(part: Buffer): void {
    if (this.#length + part.length > this.max) {
      this.#parts.push(part.subarray(0, this.max - this.#length));
      this.#length = this.max;
      this.#skipping = true;
      this.tooLong(this.#flush());
      return;
    }
    if (part.length > 0) {
      // A copy: the chunk it came from may be large, and is not kept for a few bytes of it.
      this.#parts.push(Buffer.from(part));
      this.#length += part.length;
    }
  }

  #flush(): Buffer {
    const whole = Buffer.concat(this.#parts, this.#length);
    this.#parts = [];
    this.#length = 0;
    return whole;
  }
}
