// The BlobStore port's implementations: an R2 bucket (the Worker's BLOBS binding; miniflare's R2
// under wrangler dev) and memory (the in-process control plane of the Node tests). Blobs are
// named by their sha256, computed here: a caller cannot file bytes under another name.
import { hex } from "../encoding.ts";
import { ComputeError } from "../errors.ts";
import type { BlobStore } from "../context.ts";

export const SHA256_HEX = /^[0-9a-f]{64}$/;

export async function sha256Bytes(bytes: Uint8Array): Promise<string> {
  return hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)));
}

const key = (sha256: string) => `blobs/${sha256}`;

/** Blobs in an R2 bucket, under blobs/<sha256>; R2 checks the bytes against the sha256 it is given. */
export function r2Blobs(bucket: R2Bucket): BlobStore {
  return {
    async put(bytes) {
      const sha256 = await sha256Bytes(bytes);
      if (!(await bucket.head(key(sha256)))) await bucket.put(key(sha256), bytes, { sha256 });
      return { sha256, bytes: bytes.byteLength };
    },
    async get(sha256) {
      if (!SHA256_HEX.test(sha256)) return undefined;
      const object = await bucket.get(key(sha256));
      return object ? { sha256, bytes: object.size, body: object.body } : undefined;
    },
  };
}

/** Blobs in this process's memory (tests, the in-process control plane). */
export function memoryBlobs(): BlobStore {
  const blobs = new Map<string, Uint8Array>();
  return {
    async put(bytes) {
      const sha256 = await sha256Bytes(bytes);
      if (!blobs.has(sha256)) blobs.set(sha256, bytes.slice());
      return { sha256, bytes: bytes.byteLength };
    },
    async get(sha256) {
      const bytes = blobs.get(sha256);
      if (!bytes) return undefined;
      return { sha256, bytes: bytes.byteLength, body: new Blob([bytes]).stream() };
    },
  };
}

/** ctx.blobs of a deployment that binds none: every call says what to bind. */
export const noBlobs: BlobStore = {
  put: missingBlobs,
  get: missingBlobs,
};
async function missingBlobs(): Promise<never> {
  throw new ComputeError(
    "FAILED_PRECONDITION",
    "this deployment has no blob store: bind an R2 bucket as BLOBS in wrangler.toml (docs/operations.md), or pass blobs to betterCompute()",
  );
}
