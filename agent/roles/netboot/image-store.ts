// The site's image cache on disk: images (and the ramdisk's files) kept under their sha256, so the
// machines of the provisioning network fetch them from the site agent, which fetched each once
// from where the control plane named it (an ImageSource: a URL and its sha256). What goes in is
// verified while it downloads; what is served is hashed again on its way out, and a file whose
// bytes no longer match is dropped. The cache survives a restart (it is a directory) and is
// bounded: past maxBytes the least recently used images go. Node-only.
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { sha256File } from "../../build/cache.ts";
import { AgentError, type FetchLike } from "../../contracts.ts";

const SHA256 = /^[0-9a-f]{64}$/;

export interface ImageStoreOptions {
  dir: string;
  /** The most the cache holds; older images go when a new one would pass it. */
  maxBytes: number;
  fetch?: FetchLike;
}

export interface StoredImage {
  sha256: string;
  bytes: number;
  path: string;
}

export class ImageStore {
  readonly #dir: string;
  readonly #maxBytes: number;
  readonly #fetch: FetchLike;
  /** Downloads in progress, by sha256: a second request for one joins the first. */
  readonly #pending = new Map<string, Promise<StoredImage>>();

  constructor(options: ImageStoreOptions) {
    this.#dir = options.dir;
    this.#maxBytes = options.maxBytes;
    this.#fetch = options.fetch ?? ((url, init) => fetch(url, init));
  }

  async open(): Promise<void> {
    await fs.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    // Downloads a crash interrupted.
    for (const name of await fs.readdir(this.#dir)) if (name.endsWith(".partial")) await fs.rm(path.join(this.#dir, name), { force: true });
  }

  /** The image if the cache has it (and marks it used), else undefined. */
  async get(sha256: string): Promise<StoredImage | undefined> {
    if (!SHA256.test(sha256)) return undefined;
    const file = path.join(this.#dir, sha256);
    const stat = await fs.stat(file).catch(() => undefined);
    if (!stat) return undefined;
    const now = new Date();
    await fs.utimes(file, now, now).catch(() => {});
    return { sha256, bytes: stat.size, path: file };
  }

  /**
   * The image named by url and sha256: from the cache, or downloaded once and verified. `open`
   * answers the download in place of a plain GET of url (a blob from the control plane, with the
   * agent's credential); url then only names it in messages.
   */
  async fetch(url: string, sha256: string, signal?: AbortSignal, open?: () => Promise<Response>): Promise<StoredImage> {
    sha256 = sha256.toLowerCase();
    if (!SHA256.test(sha256)) throw new AgentError("INVALID_ARGUMENT", "an image's sha256 is 64 hex digits");
    const cached = await this.get(sha256);
    if (cached) return cached;
    let pending = this.#pending.get(sha256);
    if (!pending) {
      pending = this.#download(url, sha256, open ?? (() => this.#fetch(url, { ...(signal ? { signal } : {}) }))).finally(() =>
        this.#pending.delete(sha256),
      );
      this.#pending.set(sha256, pending);
    }
    return pending;
  }

  /** A file already on this host (the ramdisk's kernel), added under its sha256. */
  async add(file: string): Promise<StoredImage> {
    const sha256 = await sha256File(file);
    const cached = await this.get(sha256);
    if (cached) return cached;
    const partial = path.join(this.#dir, `${sha256}.${randomBytes(4).toString("hex")}.partial`);
    await fs.copyFile(file, partial);
    return this.#keep(partial, sha256);
  }

  /**
   * Streams the image to `out`, hashing it on the way: bytes that no longer match their name
   * (the disk changed them) are dropped from the cache, and the stream fails. From a byte past the
   * first (a resumed download) nothing is checked here: the reader hashes the whole.
   */
  async serve(image: StoredImage, out: NodeJS.WritableStream, from = 0): Promise<void> {
    if (from > 0) return pipeline(createReadStream(image.path, { start: from }), out);
    const hash = createHash("sha256");
    const tee = new Transform({
      transform(chunk: Buffer, _enc, done) {
        hash.update(chunk);
        done(null, chunk);
      },
    });
    await pipeline(createReadStream(image.path), tee, out);
    if (hash.digest("hex") !== image.sha256) {
      await fs.rm(image.path, { force: true });
      throw new AgentError("DRIVER_ERROR", `the cached image ${image.sha256} no longer matches its sha256: dropped`);
    }
  }

  async #download(url: string, sha256: string, open: () => Promise<Response>): Promise<StoredImage> {
    await this.open();
    let res: Response;
    try {
      res = await open();
    } catch (e) {
      throw new AgentError("DRIVER_ERROR", `could not fetch the image ${shownUrl(url)}: ${(e as Error).message}`);
    }
    if (!res.ok || !res.body) {
      await res.body?.cancel();
      throw new AgentError("DRIVER_ERROR", `the image ${shownUrl(url)} answered ${res.status}`);
    }
    const partial = path.join(this.#dir, `${sha256}.${randomBytes(4).toString("hex")}.partial`);
    const hash = createHash("sha256");
    try {
      await pipeline(
        Readable.fromWeb(res.body as import("node:stream/web").ReadableStream<Uint8Array>),
        new Transform({
          transform(chunk: Buffer, _enc, done) {
            hash.update(chunk);
            done(null, chunk);
          },
        }),
        createWriteStream(partial, { mode: 0o600 }),
      );
    } catch (e) {
      await fs.rm(partial, { force: true });
      throw new AgentError("DRIVER_ERROR", `the image ${shownUrl(url)} stopped mid-transfer: ${(e as Error).message}`);
    }
    const got = hash.digest("hex");
    if (got !== sha256) {
      await fs.rm(partial, { force: true });
      // Fetching it again brings the same bytes: not retried.
      throw new AgentError("DRIVER_ERROR", `image digest mismatch for ${shownUrl(url)}: expected ${sha256}, got ${got}`, undefined, {
        permanent: true,
      });
    }
    return this.#keep(partial, sha256);
  }

  /** Moves a verified download into place, making room first. */
  async #keep(partial: string, sha256: string): Promise<StoredImage> {
    const bytes = (await fs.stat(partial)).size;
    if (bytes > this.#maxBytes) {
      await fs.rm(partial, { force: true });
      throw new AgentError(
        "FAILED_PRECONDITION",
        `the image ${sha256} (${bytes} bytes) is larger than the whole cache (${this.#maxBytes} bytes)`,
      );
    }
    await this.#makeRoom(bytes);
    const file = path.join(this.#dir, sha256);
    await fs.chmod(partial, 0o400);
    await fs.rename(partial, file);
    return { sha256, bytes, path: file };
  }

  /** Least recently used images go until `bytes` more fit. */
  async #makeRoom(bytes: number): Promise<void> {
    const images = [];
    for (const name of await fs.readdir(this.#dir)) {
      if (!SHA256.test(name)) continue;
      const stat = await fs.stat(path.join(this.#dir, name)).catch(() => undefined);
      if (stat) images.push({ name, bytes: stat.size, used: stat.mtimeMs });
    }
    let total = images.reduce((n, i) => n + i.bytes, 0);
    for (const image of images.sort((a, b) => a.used - b.used)) {
      if (total + bytes <= this.#maxBytes) break;
      await fs.rm(path.join(this.#dir, image.name), { force: true });
      total -= image.bytes;
    }
  }
}

/** A URL as named in messages: no credentials, no query (a signed URL's query is a secret). */
const shownUrl = (url: string) => {
  try {
    const u = new URL(url);
    return u.origin + u.pathname;
  } catch {
    return "(an invalid URL)";
  }
};
