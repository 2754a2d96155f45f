// The guest image the microVM runtime boots ("bc-guest"): Debian's cloud kernel, a busybox
// initramfs whose /init (guest/init.sh) does the whole guest side, and a small ext4 root disk.
// Built from Debian packages taken with `apt-get download` (never installed) into a cache
// directory named by the digest of its inputs, and reused while they are unchanged.
// docs/guest-image.md describes what is in it and what the init does.
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { AgentError } from "../../contracts.ts";
import { cachedBuild, describeFile, sha256, type BuiltFile } from "../../build/cache.ts";
import {
  assertPackageNames,
  copyLibraries,
  copyInto,
  installBusybox,
  installKernelModules,
  packageVersions,
  packCpio,
  POWER_BUTTON_MODULES,
  resolveKernelPackage,
  runProgram,
  unpackPackages,
  VFAT_MODULES,
  writeInto,
  type RunProgram,
  type UnpackedPackage,
} from "../../build/debian.ts";

// The Debian helpers moved to agent/build/debian.ts (the ramdisk builds with them too); these stay importable from here.
export { assertPackageNames, runProgram, type RunProgram };

/** Bumped whenever the build itself changes what it produces (it is part of the digest). */
export const GUEST_IMAGE_BUILDER_VERSION = "1";
export const GUEST_IMAGE_NAME = "bc-guest";

/** busybox for the init and its tools; dropbearkey (and its libraries Debian hosts often lack) for the SSH host keys. */
const BASE_PACKAGES = ["busybox-static", "dropbear-bin", "libtomcrypt1", "libtommath1"];
/** Modules the cloud kernel builds as modules and the guest needs: virtio-mmio disks and network, the vfat seed, the ACPI power button. */
const GUEST_MODULES = ["virtio_mmio", "virtio_blk", "virtio_net", ...VFAT_MODULES, ...POWER_BUTTON_MODULES];
const ROOTFS_BYTES = 64 * 1024 * 1024;
const INIT_SCRIPT = fileURLToPath(new URL("./guest/init.sh", import.meta.url));
const LZ4_MAGIC = Buffer.from([0x02, 0x21, 0x4c, 0x18]);

/** A file of the image: its name inside the image directory, sha256 and size. */
export type GuestImageFile = BuiltFile;

export interface GuestImageManifest {
  name: typeof GUEST_IMAGE_NAME;
  /** sha256 of the build's inputs (builder version, init script, package versions, host libc); the cache directory's name. */
  digest: string;
  builderVersion: string;
  builtAt: string;
  kernelRelease: string;
  /** "elf-pvh": the bzImage's lz4 payload, decompressed (QEMU boots it directly, faster); "bzimage": Debian's image as shipped. */
  kernelFormat: "elf-pvh" | "bzimage";
  /** Every Debian package the image was made from, with the sha256 of the .deb that was extracted. */
  packages: UnpackedPackage[];
  /** Files copied from the build host (the C library dropbearkey links against), and the host's libc6 version. */
  hostFiles: { path: string; sha256: string }[];
  hostLibc: string;
  /** Kernel modules in the initramfs, in the order the init loads them. */
  modules: string[];
  kernel: GuestImageFile;
  initrd: GuestImageFile;
  rootfs: GuestImageFile;
}

export interface GuestImage {
  name: typeof GUEST_IMAGE_NAME;
  dir: string;
  kernel: string;
  initrd: string;
  rootfs: string;
  /** The root disk image's size: an instance disk smaller than this is refused (FC-IMAGE-ROOTFS-SIZE). */
  rootfsBytes: number;
  manifest: GuestImageManifest;
}

export interface EnsureGuestImageOptions {
  /** Where images are kept, one directory per digest. Default $BC_GUEST_IMAGE_CACHE or ~/.cache/better-compute/guest-image. */
  cacheDir?: string;
  log?: (msg: string) => void;
  /** More Debian packages to extract into the root disk (names validated before anything runs: FC-PACKAGES-GUARD). */
  packages?: string[];
  /** For tests: another init script (its text is part of the digest) and the way programs run. */
  initScript?: string;
  run?: RunProgram;
}

export function defaultGuestImageCacheDir(): string {
  return process.env.BC_GUEST_IMAGE_CACHE || path.join(os.homedir(), ".cache", "better-compute", "guest-image");
}

/**
 * The guest image, built if no complete build of the same inputs is in the cache. Concurrent
 * callers never see a partial image: each builds in its own temporary directory and renames it
 * into place; the one that loses the rename uses the winner's.
 */
export async function ensureGuestImage(opts: EnsureGuestImageOptions = {}): Promise<GuestImage> {
  const extra = opts.packages ?? [];
  assertPackageNames(extra);
  const run = opts.run ?? runProgram;
  const log = opts.log ?? (() => {});
  const cacheDir = opts.cacheDir ?? defaultGuestImageCacheDir();
  const init = opts.initScript ?? (await fs.readFile(INIT_SCRIPT, "utf8"));

  const kernelPackage = await resolveKernelPackage(run);
  const names = [kernelPackage, ...BASE_PACKAGES, ...extra];
  const versions = await packageVersions(run, names);
  const hostLibc = (await run("dpkg-query", ["-W", "-f=${Version}", "libc6"])).trim();
  const packages = names.map((name) => `${name}=${versions[name]}`);
  const digest = sha256(
    JSON.stringify({ builder: GUEST_IMAGE_BUILDER_VERSION, init, packages, extra, hostLibc, modules: GUEST_MODULES, rootfs: ROOTFS_BYTES }),
  );
  const built = await cachedBuild<GuestImageManifest>({
    cacheDir,
    digest,
    what: "guest image",
    log,
    files: (m) => [m.kernel, m.initrd, m.rootfs],
    build: (out, work) => {
      log(`the guest image's kernel: ${kernelPackage} ${versions[kernelPackage]}`);
      return build({ run, log, cacheDir, work, out, init, digest, kernelPackage, versions, extra, hostLibc });
    },
  });
  return imageIn(built.dir, built.manifest);
}

/** The image's files, where its build directory keeps them. */
function imageIn(dir: string, manifest: GuestImageManifest): GuestImage {
  return {
    name: GUEST_IMAGE_NAME,
    dir,
    kernel: path.join(dir, manifest.kernel.file),
    initrd: path.join(dir, manifest.initrd.file),
    rootfs: path.join(dir, manifest.rootfs.file),
    rootfsBytes: manifest.rootfs.bytes,
    manifest,
  };
}

interface BuildInput {
  run: RunProgram;
  log: (msg: string) => void;
  cacheDir: string;
  work: string;
  /** Where the image's files go (the build directory). */
  out: string;
  init: string;
  digest: string;
  kernelPackage: string;
  versions: Record<string, string>;
  extra: string[];
  hostLibc: string;
}

async function build(b: BuildInput): Promise<GuestImageManifest> {
  const { run, work, out } = b;
  const initramfs = path.join(work, "initramfs");
  const rootfsTree = path.join(work, "rootfs");
  for (const d of [initramfs, rootfsTree]) await fs.mkdir(d, { recursive: true });

  // Extra packages go straight into the root disk; the others are picked from.
  const { packages, trees } = await unpackPackages(b, [b.kernelPackage, ...BASE_PACKAGES, ...b.extra], b.versions, (name) =>
    b.extra.includes(name) ? rootfsTree : path.join(work, "pkg", name),
  );

  // The kernel and its modules, in dependency order.
  const kernelTree = trees[b.kernelPackage]!;
  const { kernelRelease, modules } = await installKernelModules(run, kernelTree, GUEST_MODULES, initramfs);

  const vmlinuz = await fs.readFile(path.join(kernelTree, "boot", `vmlinuz-${kernelRelease}`));
  const elf = await decompressKernel(b, vmlinuz);
  const kernelFile = elf ? "vmlinux" : "vmlinuz";
  await fs.writeFile(path.join(out, kernelFile), elf ?? vmlinuz);
  b.log(elf ? "kernel: decompressed to an ELF with a PVH note" : "kernel: no PVH ELF found in the lz4 payload, keeping the bzImage");

  // busybox and its applets, the init, dropbearkey with the libraries it links against.
  await installBusybox(run, trees["busybox-static"]!, initramfs);
  await writeInto(path.join(initramfs, "init"), b.init, 0o755);
  await writeInto(path.join(initramfs, "etc", "acpi", "PWRF", "00000080"), "#!/bin/sh\npoweroff\n", 0o755);
  await writeInto(path.join(initramfs, "etc", "hosts"), "127.0.0.1 localhost\n");
  await writeInto(path.join(initramfs, "etc", "bc-guest-image"), `${GUEST_IMAGE_NAME} ${b.digest}\n`);
  const dropbearkey = path.join(trees["dropbear-bin"]!, "usr", "bin", "dropbearkey");
  await copyInto(dropbearkey, path.join(initramfs, "usr", "bin", "dropbearkey"));
  // The C library and loader come from the build host (recorded as hostFiles).
  const libraries = await copyLibraries(run, dropbearkey, {
    trees: { libtomcrypt1: trees["libtomcrypt1"]!, libtommath1: trees["libtommath1"]! },
    root: initramfs,
  });
  const hostFiles = libraries.filter((l) => !l.package).map((l) => ({ path: l.source, sha256: l.sha256 }));

  const initrdFile = "initrd.cpio";
  await packCpio(initramfs, path.join(out, initrdFile));

  // The root disk: ext4 (the cloud kernel has it built in), mounted by the init at /mnt/root.
  await writeInto(path.join(rootfsTree, "etc", "bc-guest-image"), `${GUEST_IMAGE_NAME} ${b.digest}\n`);
  const rootfsFile = "rootfs.ext4";
  await fs.writeFile(path.join(out, rootfsFile), "");
  await fs.truncate(path.join(out, rootfsFile), ROOTFS_BYTES);
  await run("mke2fs", ["-q", "-F", "-t", "ext4", "-L", "bc-root", "-E", "root_owner=0:0", "-d", rootfsTree, path.join(out, rootfsFile)]);

  const describe = (file: string): Promise<GuestImageFile> => describeFile(out, file);
  return {
    name: GUEST_IMAGE_NAME,
    digest: b.digest,
    builderVersion: GUEST_IMAGE_BUILDER_VERSION,
    builtAt: new Date().toISOString(),
    kernelRelease,
    kernelFormat: elf ? "elf-pvh" : "bzimage",
    packages,
    hostFiles,
    hostLibc: b.hostLibc,
    modules,
    kernel: await describe(kernelFile),
    initrd: await describe(initrdFile),
    rootfs: await describe(rootfsFile),
  };
}

/**
 * extract-vmlinux for lz4: the bzImage carries the kernel as an lz4 stream; decompressed, it is
 * an ELF with a PVH entry note (Xen note type 18) that QEMU boots directly. Undefined when no
 * candidate offset yields one (the bzImage is then used as it is).
 */
async function decompressKernel(b: BuildInput, vmlinuz: Buffer): Promise<Buffer | undefined> {
  const payload = path.join(b.work, "kernel.lz4");
  const elfPath = path.join(b.work, "vmlinux");
  for (let at = vmlinuz.indexOf(LZ4_MAGIC); at >= 0; at = vmlinuz.indexOf(LZ4_MAGIC, at + 1)) {
    await fs.writeFile(payload, vmlinuz.subarray(at));
    // lz4 exits non-zero on the bytes that trail the stream; what it wrote before them is the kernel.
    await b.run("lz4", ["-d", "-f", "-q", payload, elfPath]).catch((e: unknown) => {
      if (e instanceof AgentError && e.code === "FAILED_PRECONDITION") throw e;
    });
    const elf = await fs.readFile(elfPath).catch(() => undefined);
    await fs.rm(elfPath, { force: true });
    if (elf && elf.subarray(0, 4).equals(Buffer.from("\x7fELF", "latin1")) && hasPvhNote(elf)) return elf;
  }
  return undefined;
}

/** An ELF note named "Xen" of type 18 (XEN_ELFNOTE_PHYS32_ENTRY): the PVH entry point. */
function hasPvhNote(elf: Buffer): boolean {
  const note = Buffer.from([4, 0, 0, 0]); // namesz 4 ("Xen\0")
  for (let at = elf.indexOf(note); at >= 0 && at + 16 <= elf.length; at = elf.indexOf(note, at + 1)) {
    if (elf.readUInt32LE(at + 8) === 18 && elf.toString("latin1", at + 12, at + 16) === "Xen\0") return true;
  }
  return false;
}
