// The OS image a deploy writes (metal.deploy.image-stream) on the emulated site: a raw disk image
// with one bootable FAT partition holding the ramdisk's own kernel and initrd (so the same bcd
// build ships in both) and syslinux, for BIOS (mbr.bin + ldlinux.sys) and UEFI (syslinux.efi as
// EFI/BOOT/BOOTX64.EFI), booting with bc.mode=os: the init then reads the config drive the
// ramdisk wrote and runs bcd as role node with the token it holds (docs/os-image.md). Built from
// Debian packages (apt-get download, never installed) and the ramdisk build, content-addressed
// like them. Written in raw and zstd forms: the deploy streams the zstd one.
import fs from "node:fs/promises";
import path from "node:path";
import { mbrEntry, mbrEntryOffset, MBR_TYPE_FAT32_LBA } from "../roles/mbr.ts";
import { defaultBuildCacheDir } from "./bcd.ts";
import { cachedBuild, describeFile, manifestHeader, sha256, zstdFile, type BuiltFile } from "./cache.ts";
import * as debian from "./debian.ts";
import { buildRamdisk, mib, type RamdiskImage } from "./ramdisk.ts";

export const OS_IMAGE_BUILDER_VERSION = "1";
export const OS_IMAGE_NAME = "bc-os";
const PACKAGES = ["syslinux", "syslinux-common", "syslinux-efi"];
const SECTOR = 512;
/** The partition starts at 1 MiB, as partitioning tools align it. */
const PARTITION_START = 2048;
/** Room in the partition beyond the kernel and initrd (syslinux, the FAT itself). */
const SLACK_BYTES = 4 * 2 ** 20;

export interface OsImageManifest {
  name: typeof OS_IMAGE_NAME;
  digest: string;
  builderVersion: string;
  builtAt: string;
  /** The kernel command line syslinux boots it with. */
  cmdline: string;
  ramdisk: { digest: string; bcdPackageVersion: string };
  packages: debian.UnpackedPackage[];
  /** The raw image (what lands on the disk) and the same compressed with zstd (what a deploy streams). */
  raw: BuiltFile;
  zstd: BuiltFile;
}

export interface OsImage {
  dir: string;
  raw: string;
  zstd: string;
  manifest: OsImageManifest;
}

/** What a build booting the ramdisk's kernel and initrd takes (the OS image, the installer ISO). */
export interface BuildOsImageOptions {
  /** Default $BC_BUILD_CACHE/<the build's name> or ~/.cache/better-compute/<the build's name>. */
  cacheDir?: string;
  /** More kernel command line (console=ttyS0 is there; tsc_early_khz=… for TCG guests, ...). */
  cmdline?: string;
  log?: (msg: string) => void;
  run?: debian.RunProgram;
  /** The ramdisk to take the kernel and initrd from (default: buildRamdisk()). */
  ramdisk?: RamdiskImage;
}

export async function buildOsImage(opts: BuildOsImageOptions = {}): Promise<OsImage> {
  const { run, log, cacheDir, ramdisk, cmdline, versions, digest } = await ramdiskBootInputs(opts, {
    cache: "os-image",
    mode: "os",
    builderVersion: OS_IMAGE_BUILDER_VERSION,
    packages: PACKAGES,
  });
  const built = await cachedBuild<OsImageManifest>({
    cacheDir,
    digest,
    what: "OS image",
    log,
    keep: 2,
    files: (m) => [m.raw, m.zstd],
    build: (out, work) => writeOsImage({ out, work, run, log, cacheDir, versions, ramdisk, cmdline, digest }),
  });
  return { dir: built.dir, raw: path.join(built.dir, "os.img"), zstd: path.join(built.dir, "os.img.zst"), manifest: built.manifest };
}

/**
 * What a build booting the ramdisk with bc.mode=<mode> starts from: the ramdisk, the command line,
 * the Debian packages' versions, and the digest of them all with the builder's version.
 */
export async function ramdiskBootInputs(
  opts: BuildOsImageOptions,
  build: { cache: string; mode: string; builderVersion: string; packages: readonly string[] },
) {
  const run = opts.run ?? debian.runProgram;
  const log = opts.log ?? (() => {});
  const cacheDir = opts.cacheDir ?? defaultBuildCacheDir(build.cache);
  const ramdisk = opts.ramdisk ?? (await buildRamdisk({ log }));
  const cmdline = ["quiet", "console=ttyS0", `bc.mode=${build.mode}`, opts.cmdline ?? ""].join(" ").trim();
  const versions = await debian.packageVersions(run, [...build.packages]);
  const digest = sha256(
    JSON.stringify({
      builder: build.builderVersion,
      ramdisk: ramdisk.manifest.digest,
      cmdline,
      packages: build.packages.map((name) => `${name}=${versions[name]}`),
    }),
  );
  return { run, log, cacheDir, ramdisk, cmdline, versions, digest };
}

interface OsImageBuild {
  out: string;
  work: string;
  run: debian.RunProgram;
  log: (msg: string) => void;
  cacheDir: string;
  versions: Record<string, string>;
  ramdisk: RamdiskImage;
  cmdline: string;
  digest: string;
}

/** The image's files into `out`: the MBR and its partition, syslinux for BIOS and UEFI, the zstd copy. */
async function writeOsImage({ out, work, run, log, cacheDir, versions, ramdisk, cmdline, digest }: OsImageBuild): Promise<OsImageManifest> {
  const { packages, trees } = await debian.unpackPackages({ run, log, cacheDir, work }, PACKAGES, versions);
  const syslinuxBin = path.join(trees["syslinux"]!, "usr", "bin", "syslinux");
  const common = path.join(trees["syslinux-common"]!, "usr", "lib", "syslinux");
  const efi = path.join(trees["syslinux-efi"]!, "usr", "lib", "SYSLINUX.EFI", "efi64");

  const payload = (await fs.stat(ramdisk.kernel)).size + (await fs.stat(ramdisk.initrd)).size;
  const partitionSectors = Math.ceil((payload + SLACK_BYTES) / 2 ** 20) * (2 ** 20 / SECTOR);
  const raw = path.join(out, "os.img");
  await fs.writeFile(raw, "");
  await fs.truncate(raw, (PARTITION_START + partitionSectors) * SECTOR);

  // The MBR: syslinux's boot code, then one bootable FAT partition at 1 MiB.
  const mbr = Buffer.alloc(SECTOR);
  (await fs.readFile(path.join(common, "mbr", "mbr.bin"))).copy(mbr, 0, 0, 440);
  Buffer.from(mbrEntry(MBR_TYPE_FAT32_LBA, PARTITION_START, partitionSectors)).copy(mbr, mbrEntryOffset(0));
  mbr[mbrEntryOffset(0)] = 0x80; // bootable
  mbr[510] = 0x55;
  mbr[511] = 0xaa;
  const fh = await fs.open(raw, "r+");
  await fh.write(mbr, 0, SECTOR, 0);
  await fh.close();

  // The partition's file system and files (mtools: no loop device, no mount, no root).
  await run("mkfs.vfat", ["-n", "BC-OS", "--offset", String(PARTITION_START), raw, String((partitionSectors * SECTOR) / 1024)]);
  const image = `${raw}@@${PARTITION_START * SECTOR}`;
  const config = path.join(work, "syslinux.cfg");
  await fs.writeFile(
    config,
    ["DEFAULT os", "PROMPT 0", "TIMEOUT 0", "LABEL os", "  KERNEL /vmlinuz", "  INITRD /initrd.zst", `  APPEND ${cmdline}`, ""].join("\n"),
  );
  await run("mmd", ["-i", image, "::/EFI", "::/EFI/BOOT"]);
  for (const [from, to] of [
    [ramdisk.kernel, "::/vmlinuz"],
    [ramdisk.initrd, "::/initrd.zst"],
    [config, "::/syslinux.cfg"],
    [path.join(efi, "syslinux.efi"), "::/EFI/BOOT/BOOTX64.EFI"],
    [path.join(common, "modules", "efi64", "ldlinux.e64"), "::/EFI/BOOT/ldlinux.e64"],
    [config, "::/EFI/BOOT/syslinux.cfg"],
  ] as const)
    await run("mcopy", ["-i", image, from, to]);
  // BIOS: syslinux writes ldlinux.sys and its boot sector into the partition.
  await run(syslinuxBin, ["--offset", String(PARTITION_START * SECTOR), "--install", raw]);

  const zstd = path.join(out, "os.img.zst");
  await zstdFile(raw, zstd, 9);
  const manifest: OsImageManifest = {
    ...manifestHeader(OS_IMAGE_NAME, digest, OS_IMAGE_BUILDER_VERSION),
    cmdline,
    ramdisk: { digest: ramdisk.manifest.digest, bcdPackageVersion: ramdisk.manifest.bcd.packageVersion },
    packages,
    raw: await describeFile(out, "os.img"),
    zstd: await describeFile(out, "os.img.zst"),
  };
  log(`OS image: ${mib(manifest.raw.bytes)} raw, ${mib(manifest.zstd.bytes)} zstd`);
  return manifest;
}
