// A test image server (SIMULATED: it stands in for wherever a deployment keeps its images):
// images addressed by their sha256, served over HTTP on 127.0.0.1 (GET /images/<sha256>), in
// memory. The site agent's own image cache is agent/roles/netboot/image-store.ts. Node-only.
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

export interface ImageCache {
  /** Store the bytes (a copy); answers their sha256, lowercase hex. */
  put(bytes: Uint8Array): string;
  has(sha256: string): boolean;
  get(sha256: string): Uint8Array | undefined;
  /** Serve GET /images/<sha256> on 127.0.0.1 (a random port); anything else is 404. */
  serve(): Promise<{ url: string; stop(): Promise<void> }>;
}

const IMAGE_PATH = /^\/images\/([0-9a-f]{64})$/;

export function createImageCache(): ImageCache {
  const images = new Map<string, Uint8Array>();
  return {
    put(bytes) {
      const sha256 = createHash("sha256").update(bytes).digest("hex");
      if (!images.has(sha256)) images.set(sha256, bytes.slice());
      return sha256;
    },
    has: (sha256) => images.has(sha256),
    get: (sha256) => images.get(sha256),
    async serve() {
      const server = createServer((req, res) => {
        const sha256 = IMAGE_PATH.exec((req.url ?? "").split("?")[0] ?? "")?.[1];
        const image = sha256 === undefined ? undefined : images.get(sha256);
        if (!image || (req.method !== "GET" && req.method !== "HEAD")) {
          res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
          return;
        }
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(image.byteLength) });
        res.end(req.method === "HEAD" ? undefined : image);
      });
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => resolve());
      });
      const { port } = server.address() as AddressInfo;
      return {
        url: `http://127.0.0.1:${port}`,
        stop: () =>
          new Promise<void>((resolve, reject) => {
            server.close((err) => (err ? reject(err) : resolve()));
            server.closeAllConnections();
          }),
      };
    },
  };
}

/**
 * A simulated disk image: the text, after an MBR whose one partition holds it (so a deploy can add
 * its config drive after it, as to a real image).
 */
export function simulatedDiskImage(text: string): Uint8Array {
  const payload = new TextEncoder().encode(text);
  const sectors = Math.ceil(payload.byteLength / 512);
  const image = new Uint8Array(512 * (1 + sectors));
  const entry = new DataView(image.buffer, 446, 16);
  entry.setUint8(4, 0x83); // Linux
  entry.setUint32(8, 1, true);
  entry.setUint32(12, sectors, true);
  image.set([0x55, 0xaa], 510);
  image.set(payload, 512);
  return image;
}
