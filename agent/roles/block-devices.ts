// The provisioning ramdisk's real disks: RamdiskDisks over Linux block devices (/sys/block and
// /dev), with busybox's blkdiscard, blockdev, mkdosfs and mount for what Node cannot do itself
// (ioctls, file systems). docs/ramdisk.md describes what the role reports and how it wipes and
// writes. Node-only, Linux only.
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import path from "node:path";
import { AgentError } from "../contracts.ts";
import { MBR_TYPE_FAT32_LBA, mbrEntry, mbrEntryOffset, readMbr } from "./mbr.ts";
import { sysText } from "./machine-facts.ts";
import type { ConfigDriveResult, RamdiskDisk, RamdiskDisks, WipeMethod, WipeResult } from "./ramdisk.ts";

/** Not disks a machine is provisioned onto: loop devices, RAM disks, CD drives, device-mapper and md arrays. */
const NOT_DISKS = /^(loop|ram|zram|sr|dm-|md)/;
const MiB = 1024 * 1024;
const CHUNK = 4 * MiB;
/** A disk up to this size is read back whole after a wipe; a larger one by sample. */
const VERIFY_WHOLE_MAX_BYTES = 1024 * MiB;
/** The sample: this much at each end, and this many 1 MiB regions evenly spaced between. */
const VERIFY_EDGE_BYTES = 16 * MiB;
const VERIFY_REGIONS = 64;
/** The config drive's partition: 64 MiB, as OpenStack's (busybox mkdosfs makes FAT32, which needs ~33 MiB at least). */
export const CONFIG_DRIVE_BYTES = 64 * MiB;
export const CONFIG_DRIVE_LABEL = "config-2";

export interface BlockDevicesOptions {
  /** Where sysfs is and where the device nodes are (a test's fake trees). */
  sys?: string;
  dev?: string;
  /** Where the config drive is mounted while its files are written. */
  mountDir?: string;
}

/** A busybox tool (blkdiscard, blockdev, mkdosfs, mount, umount); a failure is an Error with its stderr. */
function tool(program: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) =>
    execFile(program, args, { timeout: 10 * 60_000 }, (err, _stdout, stderr) =>
      err ? reject(new Error(`${program} ${args.join(" ")}: ${String(stderr).trim() || err.message}`)) : resolve(),
    ),
  );
}

/** Whether the bytes of [offset, offset + length) of the open device are all zero; the first offset that is not, or -1. */
async function firstNonZero(fh: fs.FileHandle, offset: number, length: number, buf: Buffer, zero: Buffer): Promise<number> {
  for (let at = offset; at < offset + length;) {
    const want = Math.min(buf.length, offset + length - at);
    const { bytesRead } = await fh.read(buf, 0, want, at);
    if (bytesRead === 0) throw new Error(`read back ${at - offset} of ${length} bytes at ${offset}: the device ended early`);
    if (!buf.subarray(0, bytesRead).equals(zero.subarray(0, bytesRead))) {
      for (let i = 0; i < bytesRead; i++) if (buf[i] !== 0) return at + i;
    }
    at += bytesRead;
  }
  return -1;
}

/** The regions read back after a wipe: all of a small disk; the ends and evenly spaced MiBs of a large one. */
export function verifyRegions(sizeBytes: number): { offset: number; length: number }[] {
  if (sizeBytes <= VERIFY_WHOLE_MAX_BYTES) return [{ offset: 0, length: sizeBytes }];
  const regions = [
    { offset: 0, length: VERIFY_EDGE_BYTES },
    { offset: sizeBytes - VERIFY_EDGE_BYTES, length: VERIFY_EDGE_BYTES },
  ];
  const between = sizeBytes - 2 * VERIFY_EDGE_BYTES - MiB;
  for (let i = 0; i < VERIFY_REGIONS; i++) {
    const offset = VERIFY_EDGE_BYTES + Math.floor((between * (i + 1)) / (VERIFY_REGIONS + 1) / 512) * 512;
    regions.push({ offset, length: MiB });
  }
  return regions.sort((a, b) => a.offset - b.offset);
}

export function blockDevices(opts: BlockDevicesOptions = {}): RamdiskDisks {
  const sys = opts.sys ?? "/sys";
  const dev = opts.dev ?? "/dev";
  const mountDir = opts.mountDir ?? "/run/bc-config-drive";
  const attr = (name: string, ...rel: string[]) => sysText(path.join(sys, "block", name, ...rel));
  const sizeOf = async (name: string) => Number((await attr(name, "size")) ?? 0) * 512;
  const nameOf = (device: string) => {
    const name = path.basename(device);
    if (device !== path.join(dev, name)) throw new AgentError("INVALID_ARGUMENT", `${device} is not a device under ${dev}`);
    return name;
  };
  /** Writes what the page cache holds for the device and drops it, so what is read next comes from the disk. */
  const flush = (device: string) => tool("blockdev", ["--flushbufs", device]);

  async function writeZeroes(device: string, sizeBytes: number): Promise<void> {
    const fh = await fs.open(device, "r+");
    try {
      const zero = Buffer.alloc(CHUNK);
      for (let at = 0; at < sizeBytes; at += CHUNK) await fh.write(zero, 0, Math.min(CHUNK, sizeBytes - at), at);
      await fh.datasync(); // a disk that fails writes says so here at the latest
    } finally {
      await fh.close();
    }
  }

  /** Reads the verification regions back; the offset of the first byte that is not zero, or -1. */
  async function readBack(device: string, sizeBytes: number): Promise<{ nonZeroAt: number; bytes: number; regions: number }> {
    await flush(device);
    const regions = verifyRegions(sizeBytes);
    const fh = await fs.open(device, "r");
    try {
      const buf = Buffer.alloc(CHUNK);
      const zero = Buffer.alloc(CHUNK);
      let bytes = 0;
      for (const r of regions) {
        const at = await firstNonZero(fh, r.offset, r.length, buf, zero);
        bytes += r.length;
        if (at >= 0) return { nonZeroAt: at, bytes, regions: regions.length };
      }
      return { nonZeroAt: -1, bytes, regions: regions.length };
    } finally {
      await fh.close();
    }
  }

  return {
    async list(): Promise<RamdiskDisk[]> {
      const names = (await fs.readdir(path.join(sys, "block"))).filter((n) => !NOT_DISKS.test(n)).sort();
      return Promise.all(
        names.map(async (name): Promise<RamdiskDisk> => {
          // NVMe: the controller (device/) holds model and serial, the namespace its wwid; virtio-blk: serial only; SCSI: device/wwid.
          const model = await attr(name, "device", "model");
          const serial = (await attr(name, "serial")) ?? (await attr(name, "device", "serial"));
          const wwn = (await attr(name, "wwid")) ?? (await attr(name, "device", "wwid"));
          return {
            device: path.join(dev, name),
            sizeBytes: await sizeOf(name),
            ...(model ? { model } : {}),
            ...(serial ? { serial } : {}),
            ...(wwn ? { wwn } : {}),
            rotational: (await attr(name, "queue", "rotational")) === "1",
            removable: (await attr(name, "removable")) === "1",
          };
        }),
      );
    },

    async wipe(device: string, method: WipeMethod): Promise<WipeResult> {
      const name = nameOf(device);
      const sizeBytes = await sizeOf(name);
      let used: WipeMethod = "zero";
      let discardFallback = false;
      if (method === "discard" && Number((await attr(name, "queue", "discard_max_bytes")) ?? 0) > 0) {
        await tool("blkdiscard", [device]);
        used = "discard";
        const back = await readBack(device, sizeBytes);
        if (back.nonZeroAt < 0)
          return { bytes: sizeBytes, method: used, verified: { whole: back.regions === 1, bytes: back.bytes, regions: back.regions } };
        // Many devices discard without reading back zeroes: then zeroes are written after all.
        used = "zero";
        discardFallback = true;
      }
      await writeZeroes(device, sizeBytes);
      const back = await readBack(device, sizeBytes);
      if (back.nonZeroAt >= 0) throw new Error(`read back a byte that is not zero at offset ${back.nonZeroAt} after writing zeroes`);
      return {
        bytes: sizeBytes,
        method: used,
        verified: { whole: back.regions === 1, bytes: back.bytes, regions: back.regions },
        ...(discardFallback ? { discardFallback } : {}),
      };
    },

    async write(device: string, chunks: AsyncIterable<Uint8Array>): Promise<{ bytes: number }> {
      const sizeBytes = await sizeOf(nameOf(device));
      const fh = await fs.open(device, "r+");
      let bytes = 0;
      try {
        // Gathered into large writes: the download's chunks are tens of KiB.
        const buf = Buffer.alloc(CHUNK);
        let filled = 0;
        const drain = async () => {
          await fh.write(buf, 0, filled, bytes - filled);
          filled = 0;
        };
        for await (const chunk of chunks) {
          if (bytes + chunk.byteLength > sizeBytes)
            throw new Error(`no space left on ${device}: the image is larger than ${sizeBytes} bytes`);
          for (let taken = 0; taken < chunk.byteLength;) {
            const n = Math.min(CHUNK - filled, chunk.byteLength - taken);
            buf.set(chunk.subarray(taken, taken + n), filled);
            filled += n;
            taken += n;
            bytes += n;
            if (filled === CHUNK) await drain();
          }
        }
        if (filled > 0) await drain();
        await fh.datasync();
      } finally {
        await fh.close();
      }
      // The kernel learns the image's partitions (best effort: a disk without a table has none to learn).
      await tool("blockdev", ["--rereadpt", device]).catch(() => {});
      return { bytes };
    },

    async addConfigDrive(device: string, imageBytes: number, files: Record<string, string>): Promise<ConfigDriveResult> {
      const name = nameOf(device);
      const sizeBytes = await sizeOf(name);
      const sector = Number((await attr(name, "queue", "logical_block_size")) ?? 512);
      const fh = await fs.open(device, "r+");
      let index: number;
      let start: number;
      let sectors: number;
      try {
        const first = Buffer.alloc(512);
        await fh.read(first, 0, 512, 0);
        const table = readMbr(first);
        if ("problem" in table) throw new AgentError("UNSUPPORTED", `${device}: cannot add the config drive: ${table.problem}`);
        const free = [0, 1, 2, 3].find((i) => !table.partitions.some((p) => p.index === i));
        if (free === undefined) throw new AgentError("UNSUPPORTED", `${device}: the image's MBR has no free entry for the config drive`);
        index = free;
        // At the end of the disk, 1 MiB aligned, after the image's partitions and its bytes.
        const align = MiB / sector;
        const used = Math.max(...table.partitions.map((p) => p.start + p.sectors), Math.ceil(imageBytes / sector));
        const diskSectors = Math.floor(sizeBytes / sector);
        start = Math.floor((diskSectors - CONFIG_DRIVE_BYTES / sector) / align) * align;
        sectors = diskSectors - start;
        if (start < Math.ceil(used / align) * align)
          throw new AgentError(
            "INVALID_ARGUMENT",
            `${device}: no room for the ${CONFIG_DRIVE_BYTES / MiB} MiB config drive after the image (it uses ${used * sector} of ${sizeBytes} bytes)`,
          );
        if (start + sectors > 2 ** 32)
          throw new AgentError("UNSUPPORTED", `${device}: an MBR cannot address a partition past 2^32 sectors`);
        await fh.write(mbrEntry(MBR_TYPE_FAT32_LBA, start, sectors), 0, 16, mbrEntryOffset(index));
        await fh.datasync();
      } finally {
        await fh.close();
      }
      await flush(device);
      await tool("blockdev", ["--rereadpt", device]);
      const partition = await partitionDevice(name, index + 1);
      await tool("mkdosfs", ["-n", CONFIG_DRIVE_LABEL, partition]);
      await fs.mkdir(mountDir, { recursive: true, mode: 0o700 });
      await tool("mount", ["-t", "vfat", partition, mountDir]);
      try {
        for (const [file, text] of Object.entries(files)) {
          await fs.mkdir(path.dirname(path.join(mountDir, file)), { recursive: true });
          await fs.writeFile(path.join(mountDir, file), text, { mode: 0o600 });
        }
      } finally {
        await tool("umount", [mountDir]);
      }
      await tool("sync", []);
      return { partition, label: CONFIG_DRIVE_LABEL, offsetBytes: start * sector, sizeBytes: sectors * sector, files: Object.keys(files) };
    },
  };

  /** The device node of the disk's partition `number`, once the kernel has made it (up to 5 s). */
  async function partitionDevice(disk: string, number: number): Promise<string> {
    for (let tries = 0; tries < 50; tries++) {
      for (const entry of await fs.readdir(path.join(sys, "block", disk))) {
        if ((await sysText(path.join(sys, "block", disk, entry, "partition"))) !== String(number)) continue;
        const node = path.join(dev, entry);
        if (
          await fs.stat(node).then(
            (s) => s.isBlockDevice(),
            () => false,
          )
        )
          return node;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`partition ${number} did not appear after the partition table was read again`);
  }
}
