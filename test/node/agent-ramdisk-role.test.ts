// The provisioning ramdisk's role (agent/roles/ramdisk.ts) on simulated disks
// (testing/sim-disks.ts): inventory, wipes of every disk, an image streamed from the
// site's image cache over HTTP and checked against its sha256.
import { createHash } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import type { CommandContext } from "../../agent/client.ts";
import { createImageCache } from "../../agent/roles/image-cache.ts";
import { ramdiskHandlers } from "../../agent/roles/ramdisk.ts";
import { simulatedDisks } from "../../testing/sim-disks.ts";
import { agentFailure } from "../support/agent-error.ts";

const UUID = "4c4c4544-0042-3510-8051-b7c04f443232";
const MiB = 1024 * 1024;
const stops: Array<() => Promise<void>> = [];

afterEach(async () => {
  await Promise.all(stops.splice(0).map((stop) => stop()));
});

function setup() {
  const disks = simulatedDisks([
    { device: "/dev/nvme0n1", sizeBytes: 4 * MiB },
    { device: "/dev/sda", sizeBytes: MiB },
  ]);
  const handlers = ramdiskHandlers({ disks, productUuid: UUID });
  const run = (kind: string, body: Record<string, unknown> = {}) =>
    handlers[kind]!(body, {
      id: "c1",
      key: "k1",
      kind,
      seq: 1,
      attested: true,
      deadline: null,
      signal: new AbortController().signal,
    } as CommandContext) as Promise<any>;
  return { disks, run };
}

/** An image of n pseudo-random bytes in a served image cache. */
async function servedImage(n: number) {
  const cache = createImageCache();
  const bytes = new Uint8Array(n).map((_, i) => (i * 7919) % 256);
  const sha256 = cache.put(bytes);
  const server = await cache.serve();
  stops.push(() => server.stop());
  return { bytes, sha256, url: `${server.url}/images/${sha256}`, base: server.url };
}

describe("ramdisk role", () => {
  it("reports the product UUID and the disks", async () => {
    const { run } = setup();
    expect(await run("metal.ramdisk.inventory")).toEqual({
      productUuid: UUID,
      disks: [
        { device: "/dev/nvme0n1", sizeBytes: 4 * MiB, model: "Simulated disk", serial: "SIM-1" },
        { device: "/dev/sda", sizeBytes: MiB, model: "Simulated disk", serial: "SIM-2" },
      ],
    });
  });

  it("wipes every disk, zero by default", async () => {
    const { disks, run } = setup();
    expect(await run("metal.ramdisk.wipe")).toEqual({
      method: "zero",
      devices: [
        { device: "/dev/nvme0n1", bytes: 4 * MiB, method: "zero" },
        { device: "/dev/sda", bytes: MiB, method: "zero" },
      ],
    });
    expect([...disks.disks.values()].map((d) => [d.wipes, d.lastWipe])).toEqual([
      [1, "zero"],
      [1, "zero"],
    ]);
    expect((await run("metal.ramdisk.wipe", { method: "discard" })).method).toBe("discard");
    expect([...disks.disks.values()].map((d) => [d.wipes, d.lastWipe])).toEqual([
      [2, "discard"],
      [2, "discard"],
    ]);
    expect(await agentFailure(run("metal.ramdisk.wipe", { method: "shred" }))).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(disks.disks.get("/dev/sda")!.wipes).toBe(2);
  });

  it("writes an image from the image cache to the first disk, or the one named, checking its digest", async () => {
    const { disks, run } = setup();
    const image = await servedImage(3 * MiB + 17); // many HTTP chunks
    expect(await run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256 })).toEqual({
      device: "/dev/nvme0n1",
      bytes: image.bytes.length,
      sha256: image.sha256,
    });
    const nvme = disks.disks.get("/dev/nvme0n1")!;
    expect(nvme.sha256).toBe(image.sha256);
    expect(Buffer.compare(nvme.data!, image.bytes)).toBe(0);

    const small = await servedImage(1000);
    const out = await run("metal.ramdisk.writeImage", { url: small.url, sha256: small.sha256.toUpperCase(), device: "/dev/sda" });
    expect(out).toEqual({ device: "/dev/sda", bytes: 1000, sha256: small.sha256 });
    expect(disks.disks.get("/dev/sda")!.sha256).toBe(small.sha256);
    expect(nvme.sha256).toBe(image.sha256); // untouched

    await run("metal.ramdisk.wipe");
    expect(nvme.data).toBeNull();
  });

  it("fails a wrong digest with DRIVER_ERROR naming both digests", async () => {
    const { disks, run } = setup();
    const image = await servedImage(5000);
    const expected = createHash("sha256").update("another image").digest("hex");
    const e = await agentFailure(run("metal.ramdisk.writeImage", { url: image.url, sha256: expected }));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toBe(`image digest mismatch: expected ${expected}, got ${image.sha256}`);
    expect(disks.disks.get("/dev/nvme0n1")!.sha256).toBe(image.sha256); // what actually landed on the disk
  });

  it("fails a missing image, a disk too small and bad bodies", async () => {
    const { disks, run } = setup();
    const image = await servedImage(2 * MiB);
    const missing = `${image.base}/images/${"0".repeat(64)}`;
    const e404 = await agentFailure(run("metal.ramdisk.writeImage", { url: `${missing}?token=signed-secret`, sha256: "0".repeat(64) }));
    expect(e404.code).toBe("DRIVER_ERROR");
    expect(e404.message).toBe(`the image ${missing} answered 404 Not Found`);

    const full = await agentFailure(run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256, device: "/dev/sda" }));
    expect(full.code).toBe("DRIVER_ERROR");
    expect(full.message).toContain("/dev/sda: no space left");
    expect(disks.disks.get("/dev/sda")!.data).toBeNull();

    for (const body of [
      { url: image.url, sha256: "abc" },
      { url: "file:///etc/passwd", sha256: image.sha256 },
      { url: image.url, sha256: image.sha256, device: "/dev/sdz" },
    ]) {
      expect(await agentFailure(run("metal.ramdisk.writeImage", body))).toMatchObject({ code: "INVALID_ARGUMENT" });
    }
  });
});
