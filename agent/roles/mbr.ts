// MBR partition tables, as the provisioning ramdisk reads an image's and adds the config drive's
// partition to it. Pure: the first sector in, the entries (or why there is no usable table) out.

/** A primary partition entry of an MBR (sizes in the disk's logical sectors). */
export interface MbrPartition {
  /** 0-3: its slot in the table; the kernel names it partition index + 1. */
  index: number;
  type: number;
  start: number;
  sectors: number;
}

const MBR_SIGNATURE_OFFSET = 510;
const TABLE_OFFSET = 446;
const ENTRY_BYTES = 16;
const GPT_PROTECTIVE = 0xee;
/** FAT32 with LBA addressing: what the config drive's partition is. */
export const MBR_TYPE_FAT32_LBA = 0x0c;

/** The table's partitions, or why the image has no MBR table a partition could be added to. */
export function readMbr(sector: Uint8Array): { partitions: MbrPartition[] } | { problem: string } {
  if (sector.length < 512) return { problem: "the image is smaller than one sector, so it has no partition table" };
  if (sector[MBR_SIGNATURE_OFFSET] !== 0x55 || sector[MBR_SIGNATURE_OFFSET + 1] !== 0xaa)
    return { problem: "the image has no MBR partition table (no 0x55AA signature): a bare file system has nowhere to add a partition" };
  const view = new DataView(sector.buffer, sector.byteOffset, 512);
  const partitions: MbrPartition[] = [];
  for (let index = 0; index < 4; index++) {
    const at = TABLE_OFFSET + index * ENTRY_BYTES;
    const type = sector[at + 4]!;
    if (type === 0) continue;
    if (type === GPT_PROTECTIVE)
      return {
        problem:
          "the image has a GPT partition table: a partition added after it needs a GPT entry and the backup GPT header moved to the end of the disk, which the ramdisk does not do (use an image with an MBR table)",
      };
    const status = sector[at]!;
    // Boot code where a table should be (a file system's boot sector also ends in 0x55AA).
    if (status !== 0 && status !== 0x80) return { problem: "the image's first sector is not an MBR partition table" };
    partitions.push({ index, type, start: view.getUint32(at + 8, true), sectors: view.getUint32(at + 12, true) });
  }
  if (partitions.length === 0) return { problem: "the image's MBR lists no partition" };
  return { partitions };
}

/** The 16 bytes of a primary entry: not bootable, CHS fields saying "use the LBA" (as for any disk over 8 GB). */
export function mbrEntry(type: number, start: number, sectors: number): Uint8Array {
  const entry = new Uint8Array(ENTRY_BYTES);
  const view = new DataView(entry.buffer);
  entry.set([0x00, 0xfe, 0xff, 0xff, type, 0xfe, 0xff, 0xff]);
  view.setUint32(8, start, true);
  view.setUint32(12, sectors, true);
  return entry;
}

/** The byte offset of entry `index` in the first sector. */
export const mbrEntryOffset = (index: number) => TABLE_OFFSET + index * ENTRY_BYTES;
