// Disks for tests: SIMULATED HARDWARE, nothing here touches a real block device. Implements
// RamdiskDisks in memory and keeps what a test asserts on: how many times each disk was
// wiped, the bytes last written to it with their sha256, and the files of its config drive.
import { createHash } from "node:crypto";
import { readMbr } from "../agent/roles/mbr.ts";
import type { RamdiskDisk, RamdiskDisks, WipeMethod } from "../agent/roles/ramdisk.ts";

export interface SimulatedDisk {
  device: string;
  sizeBytes: number;
  wipes: number;
  lastWipe: WipeMethod | null;
  /** The image last written; null when never written or wiped since. */
  data: Uint8Array | null;
  sha256: string | null;
  /** The files of the config drive added after the image; null when none (or wiped since). */
  configDrive: Record<string, string> | null;
}

export interface SimulatedDisks extends RamdiskDisks {
  disks: Map<string, SimulatedDisk>;
}

export function simulatedDisks(specs: { device: string; sizeBytes: number }[]): SimulatedDisks {
  const disks = new Map<string, SimulatedDisk>(
    specs.map((s) => [
      s.device,
      { device: s.device, sizeBytes: s.sizeBytes, wipes: 0, lastWipe: null, data: null, sha256: null, configDrive: null },
    ]),
  );
  const disk = (device: string) => {
    const d = disks.get(device);
    if (!d) throw new Error(`no such disk ${device}`);
    return d;
  };

  return {
    disks,
    async list(): Promise<RamdiskDisk[]> {
      return [...disks.values()].map((d, i) => ({
        device: d.device,
        sizeBytes: d.sizeBytes,
        model: "Simulated disk",
        serial: `SIM-${i + 1}`,
      }));
    },
    async wipe(device, method) {
      const d = disk(device);
      Object.assign(d, { wipes: d.wipes + 1, lastWipe: method, data: null, sha256: null, configDrive: null });
      return { bytes: d.sizeBytes };
    },
    async write(device, chunks) {
      const d = disk(device);
      Object.assign(d, { data: null, sha256: null, configDrive: null }); // a write that fails part-way leaves no image
      const parts: Uint8Array[] = [];
      let bytes = 0;
      for await (const chunk of chunks) {
        bytes += chunk.byteLength;
        if (bytes > d.sizeBytes) throw new Error(`no space left on ${device}: the image is larger than ${d.sizeBytes} bytes`);
        parts.push(chunk.slice());
      }
      d.data = new Uint8Array(Buffer.concat(parts));
      d.sha256 = createHash("sha256").update(d.data).digest("hex");
      return { bytes };
    },
    async addConfigDrive(device, imageBytes, files) {
      const d = disk(device);
      const table = d.data && readMbr(d.data.subarray(0, 512));
      if (!table || "problem" in table || imageBytes !== d.data!.length) throw new Error(`${device} holds no image with an MBR table`);
      d.configDrive = { ...files };
      return {
        partition: `${device}-config`,
        label: "config-2",
        offsetBytes: imageBytes,
        sizeBytes: d.sizeBytes - imageBytes,
        files: Object.keys(files),
      };
    },
  };
}
