// The provisioning ramdisk booted for real (agent/build/ramdisk.ts, docs/ramdisk.md): the image is
// built (or reused from its cache), a QEMU q35 machine under TCG boots its kernel and initrd with
// an NVMe and a virtio-blk disk pre-filled with random bytes, an SMBIOS UUID and serial, and
// user-mode networking only (the guest reaches this host's loopback as 10.0.2.2). Its bcd joins
// the local stack (PGlite, wrangler dev) with a provisioned token bound to its product UUID; the
// test then drives it through the API and checks every effect from outside the guest: the disk
// files, the config drive's FAT read with mtools, the signature in the database. A second machine
// has a disk whose writes fail (QEMU's blkdebug). The first run builds the image (allow minutes).
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash, randomFillSync } from "node:crypto";
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { gzipSync, zstdCompressSync } from "node:zlib";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildRamdisk, mib, type RamdiskImage } from "../../agent/build/ramdisk.ts";
import { mbrEntry, mbrEntryOffset, readMbr } from "../../agent/roles/mbr.ts";
import { hostTscKhz } from "../../agent/runtimes/microvm/helpers.ts";
import { QmpConnection } from "../../agent/runtimes/microvm/qmp.ts";
import { resultMessage, verifyMessage } from "../../core/protocol.ts";
import { one } from "../../core/store/database.ts";
import { openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { eventually } from "../support/eventually.ts";

const exec = promisify(execFile);
const MiB = 1024 * 1024;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-ramdisk-image-"));
const CONFIG_DRIVE_TOKEN = `bcj_${"c0ffee00".repeat(2)}_${"Cd7-token_never-logged".padEnd(43, "x")}`;

let ramdisk: RamdiskImage;
let stack: Stack;
let db: NodeStore;
let images: Server;
let imageBase: string;
const stackOutput: string[] = [];
const machines: Machine[] = [];
// Should this process end without afterAll (a crash, a kill), no QEMU outlives it.
process.once("exit", () => machines.forEach((m) => m.qemu.kill("SIGKILL")));

/** The images the loopback HTTP server serves, by path. */
const served = new Map<string, Buffer>();

beforeAll(async () => {
  const started = Date.now();
  ramdisk = await buildRamdisk({ log: (m) => console.log(m) });
  console.log(
    `ramdisk ${ramdisk.manifest.digest.slice(0, 12)}: kernel ${mib(ramdisk.manifest.kernel.bytes)}, initrd ${mib(ramdisk.manifest.initrd.bytes)} ` +
      `(${mib(ramdisk.manifest.initrdUnpackedBytes)} unpacked), ready in ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
  stack = await startStack({
    dataDir: path.join(tmp, "stack"),
    main: "test/node/ramdisk-image.worker.ts",
    onOutput: (l) => stackOutput.push(l),
  });
  db = await openNodeStore(stack.databaseUrl);
  // Every answer closes its connection: the ramdisk's download must cope with a server that ends
  // the connection while the body still waits for the disk.
  images = createServer((req, res) => {
    const body = served.get(req.url ?? "");
    res.writeHead(body ? 200 : 404, { connection: "close", ...(body ? { "content-length": body.length } : {}) });
    res.end(body);
  });
  await new Promise<void>((resolve) => images.listen(0, "127.0.0.1", resolve));
  imageBase = `http://10.0.2.2:${(images.address() as AddressInfo).port}`;
}, 900_000);

afterAll(async () => {
  for (const m of machines) m.qemu.kill("SIGKILL");
  await Promise.all(machines.map((m) => m.exited));
  images?.closeAllConnections();
  await new Promise((resolve) => (images ? images.close(resolve) : resolve(undefined)));
  await db?.close();
  await stack?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
}, 60_000);

/** The admin's API call; anything but a 200 throws. */
const api = <T = any>(name: string, input: Record<string, unknown>) => callApi<T>(stack.url, stack.adminKey, name, input);

interface DiskSpec {
  kind: "nvme" | "virtio-blk";
  serial: string;
  sizeBytes: number;
  /** Writes to it fail with EIO (QEMU's blkdebug), reads work. */
  failWrites?: boolean;
  /** QEMU drops its discards (the guest still sees a disk that takes them): they read back as what was there. */
  discardIgnored?: boolean;
}

interface Machine {
  qemu: ChildProcess;
  exited: Promise<number | null>;
  console: () => string;
  qmpSocket: string;
  disks: (DiskSpec & { file: string })[];
  startedAt: number;
}

/** A file of random bytes (so a wipe is visible), written before the machine starts. */
function randomDisk(file: string, bytes: number): void {
  const fd = fs.openSync(file, "w");
  const chunk = Buffer.alloc(8 * MiB);
  for (let at = 0; at < bytes; at += chunk.length) fs.writeSync(fd, randomFillSync(chunk), 0, Math.min(chunk.length, bytes - at), at);
  fs.closeSync(fd);
}

async function powerOn(
  name: string,
  opts: { uuid: string; serial: string; mac: string; disks: DiskSpec[]; token: string; attestor: string },
): Promise<Machine> {
  const dir = path.join(tmp, name);
  fs.mkdirSync(dir);
  const disks = opts.disks.map((d, i) => ({ ...d, file: path.join(dir, `disk${i}.img`) }));
  const diskArgs: string[] = [];
  for (const [i, d] of disks.entries()) {
    randomDisk(d.file, d.sizeBytes);
    const device = `${d.kind === "nvme" ? "nvme" : "virtio-blk-pci"},drive=d${i},serial=${d.serial}`;
    if (d.failWrites) {
      const config = path.join(dir, `blkdebug${i}.conf`);
      fs.writeFileSync(config, '[inject-error]\nevent = "write_aio"\niotype = "write"\nerrno = "5"\n');
      const image = { driver: "file", filename: d.file };
      diskArgs.push("-blockdev", JSON.stringify({ driver: "raw", "node-name": `d${i}`, file: { driver: "blkdebug", config, image } }));
    } else diskArgs.push("-drive", `if=none,id=d${i},file=${d.file},format=raw,discard=${d.discardIgnored ? "ignore" : "unmap"}`);
    diskArgs.push("-device", device);
  }
  const consoleLog = path.join(dir, "console.log");
  const qmpSocket = path.join(dir, "qmp.sock");
  const cmdline = [
    "console=ttyS0 quiet panic=-1",
    // Under TCG the kernel hangs calibrating the TSC now and then without it (PXE.md).
    `tsc_early_khz=${(await hostTscKhz()) ?? 2_000_000}`,
    `bc.url=http://10.0.2.2:${new URL(stack.url).port}`,
    `bc.token=${opts.token}`,
    `bc.attestor=${opts.attestor}`,
  ].join(" ");
  const startedAt = Date.now();
  // prettier-ignore
  const qemu = spawn("qemu-system-x86_64", [
    "-M", "q35", "-accel", "tcg", "-cpu", "max", "-m", "1G", "-smp", "1",
    "-nodefaults", "-no-user-config", "-display", "none",
    "-kernel", ramdisk.kernel, "-initrd", ramdisk.initrd, "-append", cmdline,
    "-serial", `file:${consoleLog}`, "-qmp", `unix:${qmpSocket},server=on,wait=off`,
    "-netdev", "user,id=n0,ipv6=off", "-device", `virtio-net-pci,netdev=n0,mac=${opts.mac}`,
    ...diskArgs,
    "-uuid", opts.uuid, "-smbios", `type=1,manufacturer=Emu,product=EmuServer,serial=${opts.serial}`,
  ], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  qemu.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => qemu.on("exit", (code) => resolve(code)));
  const machine: Machine = {
    qemu,
    exited,
    console: () => (fs.existsSync(consoleLog) ? fs.readFileSync(consoleLog, "utf8") : "") + stderr,
    qmpSocket,
    disks,
    startedAt,
  };
  machines.push(machine);
  return machine;
}

/** Power-on to the agent joined (its console says so) and connected (the API says so), printed. */
async function joined(m: Machine, nodeId: () => Promise<string | undefined>): Promise<string> {
  const detail = () => `console:\n${m.console().slice(-3000)}`;
  await eventually(
    async () => m.console(),
    (c) => c.includes("joined as "),
    "the ramdisk's bcd joining",
    { ms: 240_000, intervalMs: 100, detail },
  );
  const joinedAt = Date.now();
  let id: string | undefined;
  await eventually(
    async () => {
      id ??= await nodeId();
      return id ? ((await api("nodes.get", { node: id })).state as string) : "not joined";
    },
    (s) => s === "connected",
    "the ramdisk connecting",
    { ms: 60_000, detail },
  );
  const s = (at: number) => ((at - m.startedAt) / 1000).toFixed(1);
  console.log(`boot: power-on → bcd joined ${s(joinedAt)} s, → connected ${s(Date.now())} s`);
  return id!;
}

/** Sends a command to the node through the API and waits for its result. */
async function command(node: string, kind: string, body: Record<string, unknown> = {}): Promise<any> {
  const { id } = await api("commands.create", { node, kind, body, deadlineSeconds: 600 });
  return settled(id);
}

async function settled(id: string): Promise<any> {
  return eventually(
    () => api("commands.get", { id }),
    (c) => ["succeeded", "failed", "expired"].includes(c.state),
    `command ${id}'s result`,
    { ms: 300_000, intervalMs: 250, detail: () => machines.map((m) => m.console().slice(-2000)).join("\n---\n") },
  );
}

/** Whether the file's bytes are all zero. */
function allZero(file: string): boolean {
  const fd = fs.openSync(file, "r");
  try {
    const buf = Buffer.alloc(8 * MiB);
    const zero = Buffer.alloc(buf.length);
    for (let n; (n = fs.readSync(fd, buf, 0, buf.length, null)) > 0;) if (!buf.subarray(0, n).equals(zero.subarray(0, n))) return false;
    return true;
  } finally {
    fs.closeSync(fd);
  }
}

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");
const head = (file: string, n: number, from = 0) => {
  const buf = Buffer.alloc(n);
  const fd = fs.openSync(file, "r");
  fs.readSync(fd, buf, 0, n, from);
  fs.closeSync(fd);
  return buf;
};

/** 8 MiB of random bytes behind an MBR with one Linux partition (type 0xee instead: a GPT's protective MBR). */
function diskImage(type = 0x83): Buffer {
  const img = randomFillSync(Buffer.alloc(8 * MiB));
  img.fill(0, 446, 510);
  img.set(mbrEntry(type, 2048, 8 * 2048 - 2048), mbrEntryOffset(0));
  img.set([0x55, 0xaa], 510);
  return img;
}

/** Serves bytes under a name; answers the URL the guest fetches them by and their sha256. */
function serve(name: string, bytes: Buffer): { url: string; sha256: string } {
  served.set(`/${name}`, bytes);
  return { url: `${imageBase}/${name}`, sha256: sha256(bytes) };
}

describe("a machine booted into the ramdisk", () => {
  const uuid = "5f0c2a7e-91b3-4c1d-8e2f-3a4b5c6d7e8f";
  const mac = "52:54:00:5a:00:01";
  let m: Machine;
  let node: string;
  let token: string;

  beforeAll(async () => {
    // A token only this machine can use: bound to its SMBIOS product UUID, as a deploy mints one.
    const minted = await api("ramdiskTest.provisionedToken", { productUuid: uuid });
    token = minted.token;
    m = await powerOn("m1", {
      uuid,
      serial: "SRV-RD-0001",
      mac,
      token,
      attestor: "provisioned",
      disks: [
        { kind: "nvme", serial: "NVME-RD-0001", sizeBytes: 192 * MiB },
        { kind: "virtio-blk", serial: "VBLK-RD-0002", sizeBytes: 96 * MiB, discardIgnored: true },
      ],
    });
    node = await joined(m, async () => minted.nodeId);
  }, 300_000);

  it("joined with the provisioned token bound to its product UUID, named by its MAC", async () => {
    const n = await api("nodes.get", { node });
    expect(n).toMatchObject({ role: "ramdisk", attestor: "provisioned", hostname: "ramdisk-5254005a0001", state: "connected" });
  });

  it("reports its disks with their serials and sizes, its NIC, CPUs, memory, product UUID and serial", async () => {
    const c = await command(node, "metal.ramdisk.inventory");
    expect(c.state, JSON.stringify(c.error)).toBe("succeeded");
    const inv = c.result;
    expect(inv).toMatchObject({ productUuid: uuid, serial: "SRV-RD-0001", manufacturer: "Emu", model: "EmuServer" });
    expect(inv.disks).toEqual([
      expect.objectContaining({
        device: "/dev/nvme0n1",
        serial: "NVME-RD-0001",
        sizeBytes: 192 * MiB,
        model: "QEMU NVMe Ctrl",
        removable: false,
      }),
      expect.objectContaining({ device: "/dev/vda", serial: "VBLK-RD-0002", sizeBytes: 96 * MiB, removable: false }),
    ]);
    expect(inv.disks[0].wwn).toMatch(/^(nvme|eui|naa)\./);
    expect(inv.nics).toEqual([{ name: "eth0", mac, link: "up" }]);
    expect(inv.cpus.count).toBe(1);
    expect(inv.memoryBytes).toBeGreaterThan(900 * MiB);
  });

  it("wipes both disks (a discard that does not read back as zeroes falls back to zeroes), verified and signed", async () => {
    for (const method of ["discard", "zero"] as const) {
      if (method === "zero") for (const d of m.disks) fs.writeFileSync(d.file, randomFillSync(Buffer.alloc(MiB)), { flag: "r+" });
      expect(m.disks.map((d) => allZero(d.file))).toEqual([false, false]);
      const c = await command(node, "metal.ramdisk.wipe", { method });
      expect(c.state, JSON.stringify(c.error)).toBe("succeeded");
      const whole = { whole: true, regions: 1 };
      expect(c.result).toEqual({
        method,
        devices: [
          { device: "/dev/nvme0n1", bytes: 192 * MiB, method, verified: { ...whole, bytes: 192 * MiB } },
          // QEMU drops this disk's discards: the random bytes read back, so zeroes were written.
          method === "discard"
            ? { device: "/dev/vda", bytes: 96 * MiB, method: "zero", discardFallback: true, verified: { ...whole, bytes: 96 * MiB } }
            : { device: "/dev/vda", bytes: 96 * MiB, method, verified: { ...whole, bytes: 96 * MiB } },
        ],
      });
      expect(m.disks.map((d) => allZero(d.file))).toEqual([true, true]);

      // Attested: the result carries the ramdisk's signature over exactly this output.
      const row = await one<{ key: string; signature: string | null; attested: boolean; public_key: string }>(
        db.db,
        sql`SELECT c.idempotency_key AS key, c.signature, c.attested, n.public_key
            FROM bc_commands c JOIN bc_nodes n ON n.id = c.node_id WHERE c.id = ${c.id}::bigint`,
      );
      expect(row?.attested).toBe(true);
      const message = await resultMessage(node, { id: c.id, key: row!.key, ok: true, output: c.result });
      expect(await verifyMessage(row!.public_key, message, row!.signature!)).toBe(true);
    }
  });

  it("writes an image byte-exact, raw, gzip or zstd, and fails a wrong sha256 without reporting success", async () => {
    const image = diskImage();
    const cases = [
      { name: "image.raw", bytes: image, format: "raw", device: "/dev/nvme0n1" },
      { name: "image.raw.gz", bytes: gzipSync(image), format: "gzip", device: "/dev/vda" },
      { name: "image.raw.zst", bytes: zstdCompressSync(image), format: "zstd", device: "/dev/nvme0n1" },
    ];
    for (const { name, bytes, format, device } of cases) {
      const src = serve(name, bytes);
      const c = await command(node, "metal.ramdisk.writeImage", { url: src.url, sha256: src.sha256, device });
      expect(c.state, JSON.stringify(c.error)).toBe("succeeded");
      expect(c.result).toEqual({
        device,
        format,
        bytes: bytes.length,
        sha256: src.sha256,
        written: { bytes: image.length, sha256: sha256(image) },
      });
      const file = m.disks[device === "/dev/vda" ? 1 : 0]!.file;
      expect(sha256(head(file, image.length)), `${name} on ${device}`).toBe(sha256(image));
    }

    const other = diskImage();
    const src = serve("other.raw", other);
    const wrong = createHash("sha256").update("another image").digest("hex");
    const c = await command(node, "metal.ramdisk.writeImage", { url: src.url, sha256: wrong });
    expect(c.state).toBe("failed");
    expect(c.result).toBeNull();
    expect(c.error).toMatchObject({ code: "DRIVER_ERROR", message: `image digest mismatch: expected ${wrong}, got ${src.sha256}` });
  });

  it("adds a config drive: a vfat partition labelled config-2 after the image, holding the token; a GPT image is refused", async () => {
    const image = diskImage();
    const src = serve("with-config-drive.raw.zst", zstdCompressSync(image));
    const body = {
      url: src.url,
      sha256: src.sha256,
      configDrive: {
        hostname: "m-1",
        controlPlaneUrl: "https://compute.example.com",
        userData: "#cloud-config\n",
        networkData: { links: [] },
      },
    };
    const { id } = await api("ramdiskTest.writeImage", { node, body, joinToken: CONFIG_DRIVE_TOKEN });
    const c = await settled(id);
    expect(c.state, JSON.stringify(c.error)).toBe("succeeded");
    const disk = m.disks[0]!.file;
    const offset = 128 * MiB; // the last 64 MiB of the 192 MiB disk, 1 MiB aligned
    expect(c.result.configDrive).toEqual({
      partition: "/dev/nvme0n1p2",
      label: "config-2",
      offsetBytes: offset,
      sizeBytes: 64 * MiB,
      files: ["openstack/latest/meta_data.json", "openstack/latest/network_data.json", "openstack/latest/user_data"],
    });

    // The image is intact but for its table's new entry; the entry points at a FAT labelled config-2.
    expect(sha256(head(disk, image.length - 512, 512))).toBe(sha256(image.subarray(512)));
    const table = readMbr(head(disk, 512));
    expect(table).toEqual({
      partitions: [
        { index: 0, type: 0x83, start: 2048, sectors: 14336 },
        { index: 1, type: 0x0c, start: offset / 512, sectors: (64 * MiB) / 512 },
      ],
    });
    const at = `${disk}@@${offset}`;
    expect((await exec("mlabel", ["-i", at, "-s", "::"])).stdout).toContain("config-2");
    const meta = JSON.parse((await exec("mtype", ["-i", at, "::/openstack/latest/meta_data.json"])).stdout);
    expect(meta).toEqual({
      uuid,
      hostname: "m-1",
      name: "m-1",
      meta: { "bc.url": "https://compute.example.com", "bc.token": CONFIG_DRIVE_TOKEN },
    });
    expect((await exec("mtype", ["-i", at, "::/openstack/latest/user_data"])).stdout).toBe("#cloud-config\n");
    expect(JSON.parse((await exec("mtype", ["-i", at, "::/openstack/latest/network_data.json"])).stdout)).toEqual({ links: [] });

    // A GPT image cannot take it: refused before a byte is written.
    const before = sha256(head(disk, image.length));
    const gpt = serve("gpt.raw", diskImage(0xee));
    const refused = await settled(
      (await api("ramdiskTest.writeImage", { node, body: { ...body, url: gpt.url, sha256: gpt.sha256 }, joinToken: CONFIG_DRIVE_TOKEN }))
        .id,
    );
    expect(refused.state).toBe("failed");
    expect(refused.error.code).toBe("UNSUPPORTED");
    expect(refused.error.message).toContain("GPT partition table");
    expect(sha256(head(disk, image.length))).toBe(before);

    // No result, error, console line or control-plane log line holds either token.
    const results = JSON.stringify((await api("commands.list", { node, limit: 1000 })).commands);
    for (const secret of [CONFIG_DRIVE_TOKEN, token]) {
      expect(results).not.toContain(secret);
      expect(m.console()).not.toContain(secret);
      expect(stackOutput.join("\n")).not.toContain(secret);
    }
  });

  it("powers off on the power button (QMP system_powerdown)", async () => {
    const qmp = await QmpConnection.open(m.qmpSocket);
    try {
      await qmp.execute("system_powerdown");
    } finally {
      qmp.close();
    }
    expect(await m.exited).toBe(0);
    expect(m.console()).toContain("power button pressed: powering off");
  }, 60_000);
});

describe("a machine with a disk whose writes fail", () => {
  it("answers the wipe with DRIVER_ERROR naming that disk", async () => {
    const { token } = await api("joinTokens.create", { role: "ramdisk" });
    const m = await powerOn("m2", {
      uuid: "5f0c2a7e-91b3-4c1d-8e2f-3a4b5c6d7e90",
      serial: "SRV-RD-0002",
      mac: "52:54:00:5a:00:02",
      token,
      attestor: "join-token",
      disks: [
        { kind: "nvme", serial: "NVME-RD-0003", sizeBytes: 64 * MiB },
        { kind: "virtio-blk", serial: "VBLK-RD-BAD", sizeBytes: 32 * MiB, failWrites: true },
      ],
    });
    const node = await joined(m, async () => {
      const nodes = (await api("nodes.list", { role: "ramdisk" })).nodes as { id: string; hostname: string }[];
      return nodes.find((n) => n.hostname === "ramdisk-5254005a0002")?.id;
    });
    const c = await command(node, "metal.ramdisk.wipe", { method: "zero" });
    expect(c.state).toBe("failed");
    expect(c.error.code).toBe("DRIVER_ERROR");
    expect(c.error.message).toMatch(/^\/dev\/vda: .*EIO.* \(wiped before it: \/dev\/nvme0n1\)$/);
    expect(allZero(m.disks[0]!.file)).toBe(true);
    expect(allZero(m.disks[1]!.file)).toBe(false);
    expect(m.console()).not.toContain(token);
    m.qemu.kill("SIGKILL");
  }, 300_000);
});
