// The provisioning ramdisk's role (agent/roles/ramdisk.ts) on simulated disks
// (testing/sim-disks.ts): inventory, wipes of every disk, an image streamed from the
// site's image cache over HTTP (raw, gzip or zstd) and checked against its sha256, a config
// drive whose token comes from the command's secrets. Also the Linux side's pure parts: MBR
// tables, the wipe's read-back sample, sysfs as block-devices.ts and machine-facts.ts read it.
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { gzipSync, zstdCompressSync } from "node:zlib";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import type { CommandContext } from "../../agent/client.ts";
import { createImageCache } from "../../testing/image-server.ts";
import { blockDevices, verifyRegions } from "../../agent/roles/block-devices.ts";
import { machineFacts, readProductUuid } from "../../agent/roles/machine-facts.ts";
import { mbrEntry, mbrEntryOffset, readMbr } from "../../agent/roles/mbr.ts";
import { ramdiskHandlers, type RamdiskDisks } from "../../agent/roles/ramdisk.ts";
import { simulatedDisks } from "../../testing/sim-disks.ts";
import { agentFailure } from "../support/agent-error.ts";

const sha256 = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex");
const UUID = "4c4c4544-0042-3510-8051-b7c04f443232";
const MiB = 1024 * 1024;
const stops: Array<() => Promise<void>> = [];

afterEach(async () => {
  await Promise.all(stops.splice(0).map((stop) => stop()));
});

function setup(wrap: (disks: RamdiskDisks) => RamdiskDisks = (d) => d) {
  const disks = simulatedDisks([
    { device: "/dev/nvme0n1", sizeBytes: 4 * MiB },
    { device: "/dev/sda", sizeBytes: MiB },
  ]);
  const handlers = ramdiskHandlers({ disks: wrap(disks), productUuid: UUID });
  const run = (kind: string, body: Record<string, unknown> = {}, secrets: Record<string, string> = {}) =>
    handlers[kind]!(body, {
      id: "c1",
      key: "k1",
      kind,
      seq: 1,
      attested: true,
      deadline: null,
      signal: new AbortController().signal,
      secrets,
    } as CommandContext) as Promise<any>;
  return { disks, run };
}

/** An image of n pseudo-random bytes behind an MBR with one partition (type 0xee: a GPT's protective MBR). */
function mbrImage(n: number, type = 0x83): Uint8Array {
  const bytes = new Uint8Array(n).map((_, i) => (i * 7919) % 256);
  bytes.fill(0, 446, 510);
  bytes.set(mbrEntry(type, 1, Math.floor(n / 512) - 1), mbrEntryOffset(0));
  bytes.set([0x55, 0xaa], 510);
  return bytes;
}

/** An image of n pseudo-random bytes (or these bytes) in a served image cache. */
async function servedImage(n: number, given?: Uint8Array) {
  const cache = createImageCache();
  const bytes = given ?? new Uint8Array(n).map((_, i) => (i * 7919) % 256);
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
      format: "raw",
      written: { bytes: image.bytes.length, sha256: image.sha256 },
    });
    const nvme = disks.disks.get("/dev/nvme0n1")!;
    expect(nvme.sha256).toBe(image.sha256);
    expect(Buffer.compare(nvme.data!, image.bytes)).toBe(0);

    const small = await servedImage(1000);
    const out = await run("metal.ramdisk.writeImage", { url: small.url, sha256: small.sha256.toUpperCase(), device: "/dev/sda" });
    expect(out).toEqual({
      device: "/dev/sda",
      bytes: 1000,
      sha256: small.sha256,
      format: "raw",
      written: { bytes: 1000, sha256: small.sha256 },
    });
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

  it("resumes a download that stopped midway (its server restarted) with a Range request; one that cannot resume fails naming where it stopped", async () => {
    const image = new Uint8Array(3 * MiB).map((_, i) => (i * 31) % 251);
    const digest = sha256(image);
    const ranges: (string | undefined)[] = [];
    /** Serves the image, but the first answer stops after 1 MiB with its connection destroyed; Range requests as `resumes` says. */
    const cutServer = async (resumes: boolean) => {
      let first = true;
      const server = createServer((req, res) => {
        ranges.push(req.headers.range);
        const from = Number(/^bytes=(\d+)-$/.exec(req.headers.range ?? "")?.[1] ?? 0);
        if (first) {
          first = false;
          res.writeHead(200, { "content-length": image.length });
          return void res.write(image.subarray(0, MiB), () => setTimeout(() => res.destroy(), 20));
        }
        if (!resumes || from === 0) return void res.writeHead(200, { "content-length": image.length }).end(image);
        res.writeHead(206, { "content-length": image.length - from, "content-range": `bytes ${from}-${image.length - 1}/${image.length}` });
        res.end(image.subarray(from));
      });
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      stops.push(() => new Promise((resolve) => server.close(() => resolve())));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}/image`;
    };

    const { disks, run } = setup();
    const out = await run("metal.ramdisk.writeImage", { url: await cutServer(true), sha256: digest });
    expect(out).toMatchObject({ bytes: image.length, sha256: digest, written: { bytes: image.length, sha256: digest } });
    expect(disks.disks.get("/dev/nvme0n1")!.sha256).toBe(digest);
    expect(ranges).toHaveLength(2);
    expect(ranges[0]).toBeUndefined();
    expect(Number(/^bytes=(\d+)-$/.exec(ranges[1]!)?.[1])).toBeGreaterThanOrEqual(MiB);

    const url = await cutServer(false);
    const e = await agentFailure(setup().run("metal.ramdisk.writeImage", { url, sha256: digest }));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toMatch(new RegExp(`^the image ${url} stopped mid-transfer after \\d+ bytes: .* \\(no resume: 200\\)$`));
  });

  it("decompresses gzip and zstd (told by their magic, or by the body's format); the sha256 is over the bytes fetched", async () => {
    const { disks, run } = setup();
    const raw = mbrImage(2 * MiB);
    const rawSha = sha256(raw);
    for (const [format, packed] of [
      ["gzip", gzipSync(raw)],
      ["zstd", zstdCompressSync(raw)],
    ] as const) {
      const image = await servedImage(0, packed);
      expect(await run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256 })).toEqual({
        device: "/dev/nvme0n1",
        bytes: packed.length,
        sha256: image.sha256,
        format,
        written: { bytes: raw.length, sha256: rawSha },
      });
      expect(disks.disks.get("/dev/nvme0n1")!.sha256).toBe(rawSha);
    }
    // The body's format wins: a gzip file written as it is, or refused when it is not what the body says.
    const gz = await servedImage(0, gzipSync(raw));
    expect(await run("metal.ramdisk.writeImage", { url: gz.url, sha256: gz.sha256, format: "raw" })).toMatchObject({
      format: "raw",
      written: { sha256: gz.sha256 },
    });
    const e = await agentFailure(run("metal.ramdisk.writeImage", { url: gz.url, sha256: gz.sha256, format: "zstd" }));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toContain(`the image ${gz.url} does not decompress as zstd`);
  });

  it("adds a config drive whose token comes from the command's secrets, never from the body or into the result", async () => {
    const { disks, run } = setup();
    const token = "bcj_0123456789abcdef_the-config-drive-token-never-in-a-result-xx";
    const image = await servedImage(0, mbrImage(MiB));
    const configDrive = {
      hostname: "m-1",
      controlPlaneUrl: "https://compute.example.com",
      joinToken: "secret://cd-1",
      metaData: { availability_zone: "lab", meta: { role: "host" } },
      userData: "#cloud-config\n",
    };
    const out = await run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256, configDrive }, { "secret://cd-1": token });
    expect(out.configDrive).toMatchObject({ label: "config-2", files: expect.arrayContaining(["openstack/latest/meta_data.json"]) });
    expect(JSON.stringify(out)).not.toContain(token);
    const files = disks.disks.get("/dev/nvme0n1")!.configDrive!;
    expect(JSON.parse(files["openstack/latest/meta_data.json"]!)).toEqual({
      availability_zone: "lab",
      uuid: UUID,
      hostname: "m-1",
      name: "m-1",
      meta: { role: "host", "bc.url": "https://compute.example.com", "bc.token": token },
    });
    expect(files["openstack/latest/user_data"]).toBe("#cloud-config\n");
    expect(JSON.parse(files["openstack/latest/network_data.json"]!)).toEqual({ links: [], networks: [], services: [] });

    // Refused before the disk is touched: no value for the reference, a token by value, an image without an MBR table.
    const written = disks.disks.get("/dev/nvme0n1")!.sha256;
    const noValue = await agentFailure(run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256, configDrive }));
    expect(noValue).toMatchObject({ code: "INVALID_ARGUMENT", message: "the command carries no value for secret://cd-1" });
    const byValue = await agentFailure(
      run("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256, configDrive: { ...configDrive, joinToken: token } }),
    );
    expect(byValue.code).toBe("INVALID_ARGUMENT");
    expect(byValue.message).not.toContain(token);
    for (const [bytes, problem] of [
      [mbrImage(MiB, 0xee), "GPT partition table"],
      [new Uint8Array(MiB).fill(7), "no MBR partition table"],
    ] as const) {
      const other = await servedImage(0, bytes);
      const e = await agentFailure(
        run("metal.ramdisk.writeImage", { url: other.url, sha256: other.sha256, configDrive }, { "secret://cd-1": token }),
      );
      expect(e.code).toBe("UNSUPPORTED");
      expect(e.message).toContain(problem);
    }
    expect(disks.disks.get("/dev/nvme0n1")!.sha256).toBe(written);

    // Disks that cannot take a config drive say so.
    const { addConfigDrive: _, ...plain } = disks;
    const none = setup(() => plain).run;
    expect(await agentFailure(none("metal.ramdisk.writeImage", { url: image.url, sha256: image.sha256, configDrive }))).toMatchObject({
      code: "UNSUPPORTED",
    });
  });

  it("a disk that fails its wipe is a DRIVER_ERROR naming it and the disks wiped before it", async () => {
    const { run } = setup((d) => ({
      ...d,
      wipe: (device, method) => (device === "/dev/sda" ? Promise.reject(new Error("EIO: i/o error, fdatasync")) : d.wipe(device, method)),
    }));
    const e = await agentFailure(run("metal.ramdisk.wipe"));
    expect(e).toMatchObject({ code: "DRIVER_ERROR", message: "/dev/sda: EIO: i/o error, fdatasync (wiped before it: /dev/nvme0n1)" });
  });
});

describe("the ramdisk's Linux side", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-ramdisk-sysfs-"));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const put = (rel: string, text: string) => {
    fs.mkdirSync(path.dirname(path.join(tmp, rel)), { recursive: true });
    fs.writeFileSync(path.join(tmp, rel), text);
  };

  it("reads MBR tables, and says why an image has none a partition could be added to", () => {
    expect(readMbr(mbrImage(4096))).toEqual({ partitions: [{ index: 0, type: 0x83, start: 1, sectors: 7 }] });
    expect(readMbr(mbrImage(4096, 0xee))).toMatchObject({ problem: expect.stringContaining("GPT") });
    expect(readMbr(new Uint8Array(512))).toMatchObject({ problem: expect.stringContaining("0x55AA") });
    const bootCode = mbrImage(4096);
    bootCode[446] = 0xfa; // not a status byte: boot code
    expect(readMbr(bootCode)).toMatchObject({ problem: expect.stringContaining("not an MBR") });
    expect(readMbr(new Uint8Array(100))).toMatchObject({ problem: expect.stringContaining("smaller than one sector") });
  });

  it("reads back all of a small disk after a wipe, and the ends and 64 evenly spaced MiBs of a large one", () => {
    expect(verifyRegions(512 * MiB)).toEqual([{ offset: 0, length: 512 * MiB }]);
    const size = 10 * 1024 * MiB;
    const regions = verifyRegions(size);
    expect(regions).toHaveLength(66);
    expect(regions[0]).toEqual({ offset: 0, length: 16 * MiB });
    expect(regions.at(-1)).toEqual({ offset: size - 16 * MiB, length: 16 * MiB });
    for (const [i, r] of regions.entries()) {
      expect(r.offset % 512).toBe(0);
      if (i > 0) expect(r.offset).toBeGreaterThanOrEqual(regions[i - 1]!.offset + regions[i - 1]!.length);
    }
    expect(regions.reduce((n, r) => n + r.length, 0)).toBe(96 * MiB);
  });

  it("lists disks from sysfs (not loop, ram, zram, sr, dm or md devices) and the machine's facts", async () => {
    put("sys/block/nvme0n1/size", "2097152\n");
    put("sys/block/nvme0n1/device/model", "QEMU NVMe Ctrl                          \n");
    put("sys/block/nvme0n1/device/serial", "NVME-0001           \n");
    put("sys/block/nvme0n1/wwid", "eui.0123456789abcdef\n");
    put("sys/block/nvme0n1/queue/rotational", "0\n");
    put("sys/block/nvme0n1/removable", "0\n");
    put("sys/block/vda/size", "8192\n");
    put("sys/block/vda/serial", "VBLK-0002\n");
    put("sys/block/vda/queue/rotational", "1\n");
    put("sys/block/vda/removable", "0\n");
    for (const skipped of ["loop0", "ram0", "zram0", "sr0", "dm-0", "md127"]) put(`sys/block/${skipped}/size`, "8\n");
    const disks = await blockDevices({ sys: path.join(tmp, "sys"), dev: "/dev" }).list();
    expect(disks).toEqual([
      {
        device: "/dev/nvme0n1",
        sizeBytes: 1024 * MiB,
        model: "QEMU NVMe Ctrl",
        serial: "NVME-0001",
        wwn: "eui.0123456789abcdef",
        rotational: false,
        removable: false,
      },
      { device: "/dev/vda", sizeBytes: 4 * MiB, serial: "VBLK-0002", rotational: true, removable: false },
    ]);

    put("sys/class/dmi/id/product_uuid", "5F0C2A7E-91B3-4C1D-8E2F-3A4B5C6D7E8F\n");
    put("sys/class/dmi/id/product_serial", "SRV-0001\n");
    put("sys/class/dmi/id/sys_vendor", "Emu\n");
    put("sys/class/net/eth0/type", "1\n");
    put("sys/class/net/eth0/address", "52:54:00:12:34:56\n");
    put("sys/class/net/eth0/operstate", "up\n");
    put("sys/class/net/lo/type", "772\n");
    put("proc/cpuinfo", "processor\t: 0\nmodel name\t: Emu CPU\n\nprocessor\t: 1\nmodel name\t: Emu CPU\n");
    put("proc/meminfo", "MemTotal:        1000000 kB\nMemFree: 1 kB\n");
    // SMBIOS UUIDs compare case-insensitively: reported lower-case, as the provisioned attestor's evidence carries them.
    expect(await readProductUuid(path.join(tmp, "sys"))).toBe("5f0c2a7e-91b3-4c1d-8e2f-3a4b5c6d7e8f");
    expect(await machineFacts({ sys: path.join(tmp, "sys"), proc: path.join(tmp, "proc") })).toEqual({
      serial: "SRV-0001",
      manufacturer: "Emu",
      model: null,
      cpus: { count: 2, model: "Emu CPU" },
      memoryBytes: 1000000 * 1024,
      nics: [{ name: "eth0", mac: "52:54:00:12:34:56", link: "up" }],
    });
    // A UUID the firmware left unset is no UUID; no DMI, none either.
    put("sys/class/dmi/id/product_uuid", "00000000-0000-0000-0000-000000000000\n");
    expect(await readProductUuid(path.join(tmp, "sys"))).toBeUndefined();
    expect(await readProductUuid(path.join(tmp, "nowhere"))).toBeUndefined();
  });
});
