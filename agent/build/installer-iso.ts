// The installer ISO a BMC boots as a virtual CD (docs/ramdisk.md, "bc.mode=install"): isolinux
// boots the ramdisk's own kernel and initrd with bc.mode=install, and a second initrd,
// /bc/machine.img, a 64 KiB window of zeros here. Built once; a machine's ISO is these bytes with
// the window (at manifest.machineImage.offset) replaced by a cpio of its install config
// (plugins/metal/installer-iso.ts), so the control plane renders one without tools. isolinux comes
// from Debian's packages (apt-get download, never installed); content-addressed like the others.
import fs from "node:fs/promises";
import path from "node:path";
import { AgentError } from "../contracts.ts";
import { cachedBuild, describeFile, manifestHeader, type BuiltFile } from "./cache.ts";
import * as debian from "./debian.ts";
import { ramdiskBootInputs, type BuildOsImageOptions, type OsImageManifest } from "./os-image.ts";
import { mib } from "./ramdisk.ts";

export const INSTALLER_ISO_BUILDER_VERSION = "1";
export const INSTALLER_ISO_NAME = "bc-installer";
/** The window's size: plugins/metal/installer-iso.ts's MACHINE_IMAGE_BYTES (the agent cannot import it; a test holds them equal). */
export const MACHINE_IMAGE_BYTES = 64 * 1024;
const PACKAGES = ["isolinux", "syslinux-common"];
const ISO_FILE = "installer.iso";

/** The OS image's manifest (the ramdisk, the command line, the packages) with the ISO in place of the images. */
export interface InstallerIsoManifest extends Omit<OsImageManifest, "name" | "raw" | "zstd"> {
  name: typeof INSTALLER_ISO_NAME;
  /** The ISO, its window all zeros. */
  iso: BuiltFile;
  /** The window: /bc/machine.img's bytes inside the ISO, where a machine's image (a zero-padded cpio) goes. */
  machineImage: { offset: number; bytes: number };
}

export interface InstallerIso {
  dir: string;
  iso: string;
  manifest: InstallerIsoManifest;
}

/** As the OS image's; the cache directory's default is $BC_BUILD_CACHE/installer-iso. */
export type BuildInstallerIsoOptions = BuildOsImageOptions;

export async function buildInstallerIso(opts: BuildInstallerIsoOptions = {}): Promise<InstallerIso> {
  const { run, log, cacheDir, ramdisk, cmdline, versions, digest } = await ramdiskBootInputs(opts, {
    cache: "installer-iso",
    mode: "install",
    builderVersion: INSTALLER_ISO_BUILDER_VERSION,
    packages: PACKAGES,
  });
  const built = await cachedBuild<InstallerIsoManifest>({
    cacheDir,
    digest,
    what: "installer ISO",
    log,
    keep: 2,
    files: (m) => [m.iso],
    build: (out, work) => writeInstallerIso({ out, work, run, log, cacheDir, versions, ramdisk, cmdline, digest }),
  });
  return { dir: built.dir, iso: path.join(built.dir, built.manifest.iso.file), manifest: built.manifest };
}

type InstallerIsoBuild = Awaited<ReturnType<typeof ramdiskBootInputs>> & { out: string; work: string };

/** The ISO into `out`: its tree, genisoimage, then the window found (by its marker) and zeroed. */
async function writeInstallerIso({ out, work, run, log, cacheDir, versions, ramdisk, cmdline, digest }: InstallerIsoBuild) {
  const { packages, trees } = await debian.unpackPackages({ run, log, cacheDir, work }, PACKAGES, versions);
  const tree = path.join(work, "iso");
  const marker = placeholder(digest);
  for (const [from, to] of [
    // genisoimage writes the boot info table into isolinux.bin: a copy, never the unpacked tree's.
    [path.join(trees["isolinux"]!, "usr", "lib", "ISOLINUX", "isolinux.bin"), "isolinux/isolinux.bin"],
    [path.join(trees["syslinux-common"]!, "usr", "lib", "syslinux", "modules", "bios", "ldlinux.c32"), "isolinux/ldlinux.c32"],
    [ramdisk.kernel, "bc/vmlinuz"],
    [ramdisk.initrd, "bc/initrd"],
  ] as const)
    await debian.copyInto(from, path.join(tree, to));
  await fs.writeFile(path.join(tree, "bc", "machine.img"), marker);
  // isolinux loads the initrds one after the other; the kernel unpacks each cpio in turn (the
  // second one's files over the first's) and skips the zeros that pad them.
  await debian.writeInto(
    path.join(tree, "isolinux", "isolinux.cfg"),
    [
      "DEFAULT install",
      "PROMPT 0",
      "TIMEOUT 0",
      "LABEL install",
      "  KERNEL /bc/vmlinuz",
      `  APPEND initrd=/bc/initrd,/bc/machine.img ${cmdline}`,
      "",
    ].join("\n"),
  );

  const iso = path.join(out, ISO_FILE);
  // prettier-ignore
  await run("genisoimage", [
    "-quiet", "-o", iso, "-V", "BC-INSTALLER", "-R", "-J",
    "-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat", "-no-emul-boot", "-boot-load-size", "4", "-boot-info-table",
    tree,
  ]);

  // Where genisoimage put machine.img: its marker, found exactly once, then zeroed.
  const bytes = await fs.readFile(iso);
  const offset = bytes.indexOf(marker);
  if (offset < 0 || bytes.indexOf(marker, offset + 1) >= 0)
    throw new AgentError("DRIVER_ERROR", `the installer ISO holds /bc/machine.img's marker ${offset < 0 ? "nowhere" : "twice"}`);
  const fh = await fs.open(iso, "r+");
  try {
    await fh.write(Buffer.alloc(MACHINE_IMAGE_BYTES), 0, MACHINE_IMAGE_BYTES, offset);
  } finally {
    await fh.close();
  }

  const manifest: InstallerIsoManifest = {
    ...manifestHeader(INSTALLER_ISO_NAME, digest, INSTALLER_ISO_BUILDER_VERSION),
    cmdline,
    ramdisk: { digest: ramdisk.manifest.digest, bcdPackageVersion: ramdisk.manifest.bcd.packageVersion },
    packages,
    iso: await describeFile(out, ISO_FILE),
    machineImage: { offset, bytes: MACHINE_IMAGE_BYTES },
  };
  log(`installer ISO: ${mib(manifest.iso.bytes)}, the machine's window at byte ${offset}`);
  return manifest;
}

/** The window's stand-in while the ISO is made: numbered lines naming the build, found nowhere else. */
function placeholder(digest: string): Buffer {
  const lines: string[] = [];
  for (let n = 0, size = 0; size < MACHINE_IMAGE_BYTES; n++) {
    const line = `bc-installer machine.img window ${digest} ${String(n).padStart(6, "0")}\n`;
    lines.push(line);
    size += line.length;
  }
  return Buffer.from(lines.join("")).subarray(0, MACHINE_IMAGE_BYTES);
}
