// The provisioning ramdisk's command handlers: the machine booted into a small OS that lists
// its disks, wipes them and writes an image onto one. The disks are an interface so the same
// handlers run against real block devices and simulated ones (testing/sim-disks.ts).
// Node-only (node:crypto's incremental sha256).
import { createHash } from "node:crypto";
import { z } from "zod";
import { AgentError, type CommandHandler, type FetchLike } from "../contracts.ts";
import { fetchFailureReason } from "./redfish.ts";
import { parseBody } from "./site.ts";

export interface RamdiskDisk {
  device: string;
  sizeBytes: number;
  model?: string;
  serial?: string;
}

export type WipeMethod = "zero" | "discard";

export interface RamdiskDisks {
  list(): Promise<RamdiskDisk[]>;
  wipe(device: string, method: WipeMethod): Promise<{ bytes: number }>;
  write(device: string, chunks: AsyncIterable<Uint8Array>): Promise<{ bytes: number }>;
}

export interface RamdiskHandlerOptions {
  disks: RamdiskDisks;
  /** The machine's DMI product UUID, reported by inventory so the control plane can match it. */
  productUuid?: string;
  fetch?: FetchLike;
}

const wipeBody = z.object({ method: z.enum(["zero", "discard"]).default("zero") });
const writeImageBody = z.object({
  url: z.url({ protocol: /^https?$/ }),
  sha256: z
    .string()
    .regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits")
    .transform((s) => s.toLowerCase()),
  device: z.string().min(1).optional(),
});

/** The URL as named in messages: no credentials, no query (a signed URL's query is a secret). */
const shownUrl = (url: string) => {
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

/** The body's chunks, fed through the hash on their way to the disk. */
async function* hashed(url: string, body: ReadableStream<Uint8Array>, hash: ReturnType<typeof createHash>): AsyncIterable<Uint8Array> {
  const reader = body.getReader();
  const read = async () => {
    try {
      return await reader.read();
    } catch (e) {
      // Blame the download, not the disk the chunks were going to.
      throw new AgentError("DRIVER_ERROR", `the image ${shownUrl(url)} stopped mid-transfer: ${fetchFailureReason(e)}`);
    }
  };
  try {
    for (let r = await read(); !r.done; r = await read()) {
      hash.update(r.value);
      yield r.value;
    }
  } finally {
    await reader.cancel().catch(() => {}); // a writer that stopped early must not leave the download open
  }
}

export function ramdiskHandlers(options: RamdiskHandlerOptions): Record<string, CommandHandler> {
  const { disks } = options;
  const fetchImpl: FetchLike = options.fetch ?? ((url, init) => fetch(url, init));

  return {
    "metal.ramdisk.inventory": async () => ({ productUuid: options.productUuid ?? null, disks: await disks.list() }),

    // Attested: the AgentClient signs this result when the command frame asks for it.
    "metal.ramdisk.wipe": async (raw, ctx) => {
      const { method } = parseBody(ctx.kind, wipeBody, raw);
      const devices: { device: string; bytes: number; method: WipeMethod }[] = [];
      for (const { device } of await disks.list()) {
        ctx.signal.throwIfAborted();
        const { bytes } = await onDisk(device, ctx.signal, () => disks.wipe(device, method));
        devices.push({ device, bytes, method });
      }
      return { devices, method };
    },

    "metal.ramdisk.writeImage": async (raw, ctx) => {
      const body = parseBody(ctx.kind, writeImageBody, raw);
      const listed = await disks.list();
      const device = body.device ?? listed[0]?.device;
      if (device === undefined) throw new AgentError("DRIVER_ERROR", "this machine has no disk to write the image to");
      if (!listed.some((d) => d.device === device))
        throw new AgentError("INVALID_ARGUMENT", `${ctx.kind}: no disk ${device} on this machine`);

      let res: Response;
      try {
        res = await fetchImpl(body.url, { signal: ctx.signal });
      } catch (e) {
        if (ctx.signal.aborted) throw ctx.signal.reason;
        throw new AgentError("DRIVER_ERROR", `could not fetch the image ${shownUrl(body.url)}: ${fetchFailureReason(e)}`);
      }
      if (!res.ok || !res.body) {
        await res.body?.cancel();
        throw new AgentError(
          "DRIVER_ERROR",
          `the image ${shownUrl(body.url)} answered ${res.status}${res.statusText ? ` ${res.statusText}` : ""}`,
        );
      }
      const hash = createHash("sha256");
      const { bytes } = await onDisk(device, ctx.signal, () => disks.write(device, hashed(body.url, res.body!, hash)));
      const sha256 = hash.digest("hex");
      if (sha256 !== body.sha256) throw new AgentError("DRIVER_ERROR", `image digest mismatch: expected ${body.sha256}, got ${sha256}`);
      return { device, bytes, sha256 };
    },
  };
}
