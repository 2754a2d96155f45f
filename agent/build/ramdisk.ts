// The provisioning ramdisk machines network-boot into ("bc-ramdisk"): Debian's cloud kernel and
// one initrd holding busybox, a small /init (ramdisk/init.sh), the kernel modules it loads, and
// bcd exactly as its build lays it out (agent/build/bcd.ts) with the shared libraries its Node
// runtime needs, taken from Debian's packages rather than from the build host. Built from
// packages fetched with `apt-get download` (never installed) and the npm registry only, into a
// cache directory named by the digest of its inputs (agent/build/cache.ts), like the guest image
// and the bcd package. docs/ramdisk.md describes what is in it and what the init does.
import fs from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { buildBcd, defaultBuildCacheDir, INSTALLED } from "./bcd.ts";
import { cachedBuild, describeFile, manifestHeader, sha256, zstdFile, type BuiltFile } from "./cache.ts";
import * as debian from "./debian.ts";

/** Bumped whenever the build itself changes what it produces (it is part of the digest). */
export const RAMDISK_BUILDER_VERSION = "1";
export const RAMDISK_NAME = "bc-ramdisk";

/** busybox for the init and the tools the ramdisk role runs (blkdiscard, blockdev, mkdosfs, mount). */
const BASE_PACKAGES = ["busybox-static"];
/** What the Node runtime links against (bcd's Depends): Debian's, so the ramdisk does not carry the build host's. */
const LIBRARY_PACKAGES = ["libc6", "libstdc++6", "libgcc-s1"];
/**
 * Modules the cloud kernel builds as modules and the ramdisk needs (NVMe is built in): virtio-pci
 * disks and network, vfat and its code pages for the config drive, the ACPI power button and evdev.
 */
export const RAMDISK_MODULES = ["virtio_pci", "virtio_net", "virtio_blk", ...debian.VFAT_MODULES, ...debian.POWER_BUTTON_MODULES];
/** zstd level 9: 37 MB for bcd's 125 MB Node binary in 2 s; level 19 saves 5 MB for 40 s of build. */
const ZSTD_LEVEL = 9;
const FILES = path.join(path.dirname(fileURLToPath(import.meta.url)), "ramdisk");
const INIT_SCRIPT = path.join(FILES, "init.sh");
const DHCP_SCRIPT = path.join(FILES, "udhcpc.script");

export interface RamdiskManifest {
  name: typeof RAMDISK_NAME;
  /** sha256 of the build's inputs (builder version, init and DHCP scripts, package versions, modules, bcd's digest); the cache directory's name. */
  digest: string;
  builderVersion: string;
  builtAt: string;
  kernelRelease: string;
  /** Every Debian package the ramdisk was made from, with the sha256 of the .deb that was unpacked. */
  packages: debian.UnpackedPackage[];
  /** Kernel modules in the initrd, in the order the init loads them. */
  modules: string[];
  /** The bcd build in the initrd (agent/build/bcd.ts's manifest, in short). */
  bcd: {
    version: string;
    packageVersion: string;
    digest: string;
    node: { package: string; version: string; sha256: string };
    bundleSha256: string;
  };
  /** The shared libraries the Node runtime loads, each from its Debian package. */
  libraries: { file: string; package: string; sha256: string }[];
  initrdCompression: "zstd";
  /** The cpio's size before compression (what the kernel unpacks into memory). */
  initrdUnpackedBytes: number;
  kernel: BuiltFile;
  initrd: BuiltFile;
}

export interface RamdiskImage {
  name: typeof RAMDISK_NAME;
  dir: string;
  /** The bzImage as Debian ships it (PXE and QEMU's -kernel boot it). */
  kernel: string;
  /** One zstd-compressed newc cpio. */
  initrd: string;
  manifest: RamdiskManifest;
}

export interface BuildRamdiskOptions {
  /** Default $BC_BUILD_CACHE/ramdisk or ~/.cache/better-compute/ramdisk. */
  cacheDir?: string;
  /** Where bcd's build is kept (buildBcd's default otherwise). */
  bcdCacheDir?: string;
  log?: (msg: string) => void;
  /** For tests: the way programs run. */
  run?: debian.RunProgram;
}

/** The ramdisk, built if no complete build of the same inputs is in the cache. */
export async function buildRamdisk(opts: BuildRamdiskOptions = {}): Promise<RamdiskImage> {
  const run = opts.run ?? debian.runProgram;
  const log = opts.log ?? (() => {});
  const cacheDir = opts.cacheDir ?? defaultBuildCacheDir("ramdisk");
  const [init, dhcpScript] = await Promise.all([fs.readFile(INIT_SCRIPT, "utf8"), fs.readFile(DHCP_SCRIPT, "utf8")]);
  const bcd = await buildBcd({ ...(opts.bcdCacheDir ? { cacheDir: opts.bcdCacheDir } : {}), log });

  const kernelPackage = await debian.resolveKernelPackage(run);
  const names = [kernelPackage, ...BASE_PACKAGES, ...LIBRARY_PACKAGES];
  const versions = await debian.packageVersions(run, names);
  const digest = sha256(
    JSON.stringify({
      builder: RAMDISK_BUILDER_VERSION,
      init: sha256(init),
      dhcpScript: sha256(dhcpScript),
      packages: names.map((name) => `${name}=${versions[name]}`),
      modules: RAMDISK_MODULES,
      bcd: bcd.manifest.digest,
      zstd: ZSTD_LEVEL,
    }),
  );
  const built = await cachedBuild<RamdiskManifest>({
    cacheDir,
    digest,
    what: "ramdisk",
    log,
    // Each is ~45 MB: a developer's cache keeps the last few.
    keep: 3,
    files: (m) => [m.kernel, m.initrd],
    build: async (out, work) => {
      const w = { run, log, cacheDir, work };
      const root = path.join(work, "initramfs");
      const { packages, trees } = await debian.unpackPackages(w, names, versions);

      const kernelTree = trees[kernelPackage]!;
      const { kernelRelease, modules } = await debian.installKernelModules(run, kernelTree, RAMDISK_MODULES, root);
      await fs.copyFile(path.join(kernelTree, "boot", `vmlinuz-${kernelRelease}`), path.join(out, "vmlinuz"));

      await debian.installBusybox(run, trees["busybox-static"]!, root);
      await debian.writeInto(path.join(root, "init"), init, 0o755);
      await debian.writeInto(path.join(root, "usr", "share", "udhcpc", "default.script"), dhcpScript, 0o755);
      await debian.writeInto(path.join(root, "etc", "hosts"), "127.0.0.1 localhost\n");
      await debian.writeInto(path.join(root, "etc", "bc-ramdisk"), `${RAMDISK_NAME} ${digest} (bcd ${bcd.manifest.packageVersion})\n`);

      // bcd as installed: the launcher and /usr/lib/bcd (the runtime, the bundle).
      for (const rel of [INSTALLED.launcher, INSTALLED.lib])
        await fs.cp(path.join(bcd.root, rel), path.join(root, rel), { recursive: true });
      const libraries = await debian.copyLibraries(run, path.join(root, INSTALLED.node), {
        trees: Object.fromEntries(LIBRARY_PACKAGES.map((name) => [name, trees[name]!])),
        root,
        libc: trees["libc6"]!,
      });

      const cpio = path.join(work, "initrd.cpio");
      await debian.packCpio(root, cpio);
      const initrdFile = "initrd.zst";
      await zstdFile(cpio, path.join(out, initrdFile), ZSTD_LEVEL);
      const manifest: RamdiskManifest = {
        ...manifestHeader(RAMDISK_NAME, digest, RAMDISK_BUILDER_VERSION),
        kernelRelease,
        packages,
        modules,
        bcd: {
          version: bcd.manifest.version,
          packageVersion: bcd.manifest.packageVersion,
          digest: bcd.manifest.digest,
          node: bcd.manifest.node,
          bundleSha256: bcd.manifest.bundle.sha256,
        },
        libraries: libraries.map((l) => ({ file: l.file, package: l.package!, sha256: l.sha256 })),
        initrdCompression: "zstd",
        initrdUnpackedBytes: (await fs.stat(cpio)).size,
        kernel: await describeFile(out, "vmlinuz"),
        initrd: await describeFile(out, initrdFile),
      };
      log(
        `ramdisk initrd: ${mib(manifest.initrd.bytes)} (${mib(manifest.initrdUnpackedBytes)} unpacked), kernel ${mib(manifest.kernel.bytes)}`,
      );
      return manifest;
    },
  });
  return {
    name: RAMDISK_NAME,
    dir: built.dir,
    kernel: path.join(built.dir, built.manifest.kernel.file),
    initrd: path.join(built.dir, built.manifest.initrd.file),
    manifest: built.manifest,
  };
}

export const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
