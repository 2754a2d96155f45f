// The provisioning ramdisk's command handlers: the machine booted into a small OS that lists
// its disks, wipes them and writes an image onto one (raw, gzip or zstd; with an OpenStack config
// drive after it if asked). The disks are an interface so the same handlers run against real
// block devices (block-devices.ts) and simulated ones (testing/sim-disks.ts). docs/ramdisk.md.
// Node-only (node:crypto's incremental sha256, node:zlib).
import { createHash, randomUUID } from "node:crypto";
import http from "node:http";
import https from "node:https";
import { Readable } from "node:stream";
import { createGunzip, createZstdDecompress } from "node:zlib";
import { z } from "zod";
import { SECRET_REF } from "../../core/schemas.ts";
import { AgentError, type CommandContext, type CommandHandler, type FetchLike } from "../contracts.ts";
import type { MachineFacts } from "./machine-facts.ts";
import { readMbr } from "./mbr.ts";
import { fetchFailureReason } from "./redfish.ts";
import { parseBody } from "./site.ts";

export interface RamdiskDisk {
  device: string;
  sizeBytes: number;
  model?: string;
  serial?: string;
  /** The disk's world-wide name as Linux reports it (wwid: naa., eui., nvme.…). */
  wwn?: string;
  rotational?: boolean;
  removable?: boolean;
}

export type WipeMethod = "zero" | "discard";

/** What a wipe of one disk did: the method that erased it, and what was read back. */
export interface WipeResult {
  bytes: number;
  /** The method that erased the disk when it is not the one asked for (a discard that fell back to zeroes). */
  method?: WipeMethod;
  /** What was read back as zeroes: all of the disk (whole) or a sample of regions. */
  verified?: { whole: boolean; bytes: number; regions: number };
  /** The discard did not read back as zeroes, so zeroes were written. */
  discardFallback?: boolean;
}

export interface ConfigDriveResult {
  partition: string;
  label: string;
  offsetBytes: number;
  sizeBytes: number;
  files: string[];
}

export interface RamdiskDisks {
  list(): Promise<RamdiskDisk[]>;
  wipe(device: string, method: WipeMethod): Promise<WipeResult>;
  /** Writes the chunks from the start of the disk; resolves once they are on it (fsync). */
  write(device: string, chunks: AsyncIterable<Uint8Array>): Promise<{ bytes: number }>;
  /**
   * Adds a vfat partition labelled config-2 after the image just written (imageBytes long) to its
   * MBR and writes the files into it (paths relative to its root). Absent: no config drives here.
   */
  addConfigDrive?(device: string, imageBytes: number, files: Record<string, string>): Promise<ConfigDriveResult>;
}

export interface RamdiskHandlerOptions {
  disks: RamdiskDisks;
  /** The machine's DMI product UUID, reported by inventory so the control plane can match it. */
  productUuid?: string;
  /** The machine beyond its disks (CPUs, memory, NICs, DMI serial), for the inventory: real hardware only. */
  machine?: () => Promise<MachineFacts>;
  /** How images are fetched; default node:http(s) (httpGet). */
  fetch?: FetchLike;
  /** The control plane's URL as this agent reaches it: a config drive's default. */
  controlPlaneUrl?: () => string | undefined;
}

const FORMATS = ["raw", "gzip", "zstd"] as const;
type ImageFormat = (typeof FORMATS)[number];
const GZIP_MAGIC = Buffer.from([0x1f, 0x8b]);
const ZSTD_MAGIC = Buffer.from([0x28, 0xb5, 0x2f, 0xfd]);

const wipeBody = z.object({ method: z.enum(["zero", "discard"]).default("zero") });
const configDrive = z.strictObject({
  hostname: z
    .string()
    .max(253)
    .regex(/^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$/, "must be a host name"),
  /** Default: the control plane's URL as the ramdisk reached it (the machine's network reaches it so). */
  controlPlaneUrl: z.url({ protocol: /^https?$/ }).optional(),
  // The message does not echo the value: it may be a token sent by mistake.
  joinToken: z.string().regex(SECRET_REF, "must be a secret://<id> reference, never the token itself"),
  metaData: z.record(z.string(), z.unknown()).optional(),
  userData: z
    .string()
    .max(32 * 1024)
    .optional(),
  networkData: z.record(z.string(), z.unknown()).optional(),
});
const writeImageBody = z.object({
  url: z.url({ protocol: /^https?$/ }),
  sha256: z
    .string()
    .regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits")
    .transform((s) => s.toLowerCase()),
  device: z.string().min(1).optional(),
  /** What the bytes fetched are; default: told by their first bytes (gzip and zstd magic), else raw. */
  format: z.enum(FORMATS).optional(),
  configDrive: configDrive.optional(),
});

const REDIRECTS = [301, 302, 303, 307, 308];

/**
 * A GET over node:http(s), as a Response, following up to 5 redirects. Not fetch(): Node 22's
 * undici crashes the process (an uncatchable assert(!this.paused), nodejs/undici#5360) when a
 * server closes the connection while the body waits for a slow disk, and it streams slower.
 */
export const httpGet: FetchLike = async (url, init) => {
  let at = new URL(url);
  for (let hops = 0; ; hops++) {
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      const get = at.protocol === "https:" ? https.get : http.get;
      const headers = Object.fromEntries(new Headers(init.headers).entries());
      get(at, { headers, ...(init.signal ? { signal: init.signal } : {}) }, resolve).on("error", reject);
    });
    const status = res.statusCode ?? 0;
    if (REDIRECTS.includes(status) && res.headers.location && hops < 5) {
      res.resume();
      at = new URL(res.headers.location, at);
      continue;
    }
    const empty = status === 204 || status === 304;
    if (empty) res.resume();
    const headers = new Headers();
    for (const [name, value] of Object.entries(res.headers)) if (typeof value === "string") headers.set(name, value);
    return new Response(empty ? null : (Readable.toWeb(res) as ReadableStream<Uint8Array>), {
      status,
      statusText: res.statusMessage ?? "",
      headers,
    });
  }
};

/** The URL as named in messages: no credentials, no query (a signed URL's query is a secret). */
export const shownUrl = (url: string) => {
  const u = new URL(url);
  return u.origin + u.pathname;
};

/** Disk failures as DRIVER_ERROR naming the device; the command's abort keeps its own reason. */
async function onDisk<T>(device: string, signal: AbortSignal, op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (e) {
    if (signal.aborted) throw signal.reason;
    if (e instanceof AgentError) throw e;
    throw new AgentError("DRIVER_ERROR", `${device}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** How often, and after how long, a download that stopped mid-transfer is resumed (RESUME_DELAYS_MS's sum: ~1 min). */
const RESUME_DELAYS_MS = [500, 1000, 2000, 4000, 8000, 15_000, 30_000];

/** Its first response, answered by the caller (who reports a refusal in its own words). */
async function fetchImage(fetchImpl: FetchLike, url: string, signal: AbortSignal): Promise<Response> {
  try {
    return await fetchImpl(url, { signal });
  } catch (e) {
    if (signal.aborted) throw signal.reason;
    throw new AgentError("DRIVER_ERROR", `could not fetch the image ${shownUrl(url)}: ${fetchFailureReason(e)}`);
  }
}

/**
 * The body's chunks. When the transfer stops midway (the site agent serving it restarted, a link
 * flapped), it resumes where it stopped with a Range request, over about a minute, from a server
 * that answers 206 from that byte; otherwise the failure is the download's, not the disk's.
 */
async function* downloaded(
  url: string,
  first: ReadableStream<Uint8Array>,
  resume: { fetch: FetchLike; signal: AbortSignal },
): AsyncIterable<Uint8Array> {
  let body = first;
  let got = 0;
  let retries = 0;
  for (;;) {
    const reader = body.getReader();
    let stopped: unknown;
    try {
      for (;;) {
        const r = await reader.read();
        if (r.done) return;
        got += r.value.byteLength;
        retries = 0;
        yield r.value;
      }
    } catch (e) {
      stopped = e;
    } finally {
      await reader.cancel().catch(() => {}); // a writer that stopped early must not leave the download open
    }
    // Blame the download, not the disk the chunks were going to.
    const failure = `the image ${shownUrl(url)} stopped mid-transfer after ${got} bytes: ${fetchFailureReason(stopped)}`;
    for (;;) {
      if (resume.signal.aborted) throw resume.signal.reason;
      const delay = RESUME_DELAYS_MS[retries++];
      if (delay === undefined) throw new AgentError("DRIVER_ERROR", `${failure} (resuming failed ${RESUME_DELAYS_MS.length} times)`);
      await new Promise((r) => setTimeout(r, delay));
      const res = await resume.fetch(url, { signal: resume.signal, headers: { range: `bytes=${got}-` } }).catch(() => undefined);
      if (res?.status === 206 && res.body && new RegExp(`^bytes ${got}-`).test(res.headers.get("content-range") ?? "")) {
        body = res.body;
        break;
      }
      await res?.body?.cancel();
      // A server that cannot resume (200: the whole image again) will not learn to.
      if (res && res.status !== 503 && res.status < 500) throw new AgentError("DRIVER_ERROR", `${failure} (no resume: ${res.status})`);
    }
  }
}

/** The first n bytes of a stream (fewer if it is shorter), and the whole stream again from its start. */
async function peek(
  source: AsyncIterable<Uint8Array>,
  n: number,
): Promise<{ head: Buffer; all: AsyncIterable<Uint8Array>; close: () => Promise<unknown> }> {
  const it = source[Symbol.asyncIterator]();
  const parts: Uint8Array[] = [];
  let have = 0;
  let ended = false;
  while (have < n) {
    const r = await it.next();
    if (r.done) {
      ended = true;
      break;
    }
    parts.push(r.value);
    have += r.value.byteLength;
  }
  const head = Buffer.concat(parts);
  async function* all() {
    try {
      if (head.length > 0) yield head;
      if (!ended) for (let r = await it.next(); !r.done; r = await it.next()) yield r.value;
    } finally {
      await it.return?.();
    }
  }
  return { head: head.subarray(0, n), all: all(), close: async () => it.return?.() };
}

/** The image's bytes as they go onto the disk: gunzipped or zstd-decompressed, or as they are. */
async function* decompressed(format: ImageFormat, source: AsyncIterable<Uint8Array>, url: string): AsyncIterable<Uint8Array> {
  if (format === "raw") return yield* source;
  const input = Readable.from(source, { objectMode: false });
  const inflate = format === "gzip" ? createGunzip() : createZstdDecompress();
  input.on("error", (e) => inflate.destroy(e));
  input.pipe(inflate);
  try {
    for await (const chunk of inflate) yield chunk as Buffer;
  } catch (e) {
    if (e instanceof AgentError) throw e; // the download's own failure
    throw new AgentError("DRIVER_ERROR", `the image ${shownUrl(url)} does not decompress as ${format}: ${(e as Error).message}`);
  } finally {
    input.destroy();
    inflate.destroy();
  }
}

interface Tally {
  bytes: number;
  hash: ReturnType<typeof createHash>;
}
const tally = (): Tally => ({ bytes: 0, hash: createHash("sha256") });

/** Counts and hashes what passes. */
async function* tallied(source: AsyncIterable<Uint8Array>, into: Tally): AsyncIterable<Uint8Array> {
  for await (const chunk of source) {
    into.hash.update(chunk);
    into.bytes += chunk.byteLength;
    yield chunk;
  }
}

type ConfigDriveBody = z.output<typeof configDrive>;

/** OpenStack's config drive layout (openstack/latest/…). The token goes into meta_data.json and nowhere else. */
function configDriveFiles(
  body: ConfigDriveBody & { controlPlaneUrl: string },
  token: string,
  productUuid: string | undefined,
): Record<string, string> {
  const meta = {
    ...body.metaData,
    uuid: productUuid ?? randomUUID(),
    hostname: body.hostname,
    name: body.hostname,
    meta: { ...(body.metaData?.meta as Record<string, unknown> | undefined), "bc.url": body.controlPlaneUrl, "bc.token": token },
  };
  return {
    "openstack/latest/meta_data.json": JSON.stringify(meta),
    "openstack/latest/network_data.json": JSON.stringify(body.networkData ?? { links: [], networks: [], services: [] }),
    ...(body.userData !== undefined ? { "openstack/latest/user_data": body.userData } : {}),
  };
}

export function ramdiskHandlers(options: RamdiskHandlerOptions): Record<string, CommandHandler> {
  const { disks } = options;
  const fetchImpl: FetchLike = options.fetch ?? httpGet;

  /** The config drive's token from the command's secrets (never the body), checked before the disk is touched. */
  const configDriveToken = (body: ConfigDriveBody | undefined, ctx: CommandContext): string | undefined => {
    if (!body) return undefined;
    if (!disks.addConfigDrive) throw new AgentError("UNSUPPORTED", `${ctx.kind}: these disks cannot take a config drive`);
    const token = ctx.secrets?.[body.joinToken];
    if (token === undefined) throw new AgentError("INVALID_ARGUMENT", `the command carries no value for ${body.joinToken}`);
    if (!body.controlPlaneUrl && !options.controlPlaneUrl?.())
      throw new AgentError("INVALID_ARGUMENT", `${ctx.kind}: configDrive.controlPlaneUrl is needed (this agent knows no URL of its own)`);
    return token;
  };

  return {
    "metal.ramdisk.inventory": async () => ({
      productUuid: options.productUuid ?? null,
      ...(options.machine ? await options.machine() : {}),
      disks: await disks.list(),
    }),

    // Attested: the AgentClient signs this result when the command frame asks for it.
    "metal.ramdisk.wipe": async (raw, ctx) => {
      const { method } = parseBody(ctx.kind, wipeBody, raw);
      const devices: ({ device: string; method: WipeMethod } & Omit<WipeResult, "method">)[] = [];
      for (const { device } of await disks.list()) {
        ctx.signal.throwIfAborted();
        const done = await onDisk(device, ctx.signal, () => disks.wipe(device, method)).catch((e: unknown) => {
          // The operator learns which disks were erased before the one that failed.
          if (!(e instanceof AgentError) || devices.length === 0) throw e;
          throw new AgentError(e.code, `${e.message} (wiped before it: ${devices.map((d) => d.device).join(", ")})`, e.status, e);
        });
        devices.push({ device, ...done, method: done.method ?? method });
      }
      return { devices, method };
    },

    "metal.ramdisk.writeImage": async (raw, ctx) => {
      const body = parseBody(ctx.kind, writeImageBody, raw);
      const token = configDriveToken(body.configDrive, ctx);
      const listed = await disks.list();
      const device = body.device ?? listed[0]?.device;
      if (device === undefined) throw new AgentError("DRIVER_ERROR", "this machine has no disk to write the image to");
      if (!listed.some((d) => d.device === device))
        throw new AgentError("INVALID_ARGUMENT", `${ctx.kind}: no disk ${device} on this machine`);

      const res = await fetchImage(fetchImpl, body.url, ctx.signal);
      if (!res.ok || !res.body) {
        await res.body?.cancel();
        throw new AgentError(
          "DRIVER_ERROR",
          `the image ${shownUrl(body.url)} answered ${res.status}${res.statusText ? ` ${res.statusText}` : ""}`,
        );
      }
      // sha256 over the bytes as fetched (what the body names), and over what lands on the disk
      // (for a raw image the same bytes: hashed once, the CPU being the write's bottleneck).
      const asFetched = tally();
      const fetched = await peek(
        tallied(downloaded(body.url, res.body, { fetch: fetchImpl, signal: ctx.signal }), asFetched),
        ZSTD_MAGIC.length,
      );
      const format =
        body.format ?? (fetched.head.subarray(0, 2).equals(GZIP_MAGIC) ? "gzip" : fetched.head.equals(ZSTD_MAGIC) ? "zstd" : "raw");
      const written = format === "raw" ? asFetched : tally();
      let image = format === "raw" ? fetched.all : tallied(decompressed(format, fetched.all, body.url), written);
      if (token !== undefined) {
        // Refused before a byte is written: an image without an MBR table could not take the config drive.
        const first = await peek(image, 512);
        const table = readMbr(first.head);
        if ("problem" in table) {
          await first.close();
          throw new AgentError("UNSUPPORTED", `cannot add a config drive to the image ${shownUrl(body.url)}: ${table.problem}`);
        }
        image = first.all;
      }
      await onDisk(device, ctx.signal, () => disks.write(device, image));
      const sha256 = asFetched.hash.digest("hex");
      if (sha256 !== body.sha256) throw new AgentError("DRIVER_ERROR", `image digest mismatch: expected ${body.sha256}, got ${sha256}`);
      const result = {
        device,
        bytes: asFetched.bytes,
        sha256,
        format,
        written: { bytes: written.bytes, sha256: written === asFetched ? sha256 : written.hash.digest("hex") },
      };
      if (token === undefined) return result;
      const files = configDriveFiles(
        { ...body.configDrive!, controlPlaneUrl: body.configDrive!.controlPlaneUrl ?? options.controlPlaneUrl!()! },
        token,
        options.productUuid,
      );
      const drive = await onDisk(device, ctx.signal, () => disks.addConfigDrive!(device, written.bytes, files));
      return { ...result, configDrive: drive };
    },
  };
}
