// The guest image the microVM runtime boots ("bc-guest"): Debian's cloud kernel, a busybox
// initramfs whose /init (guest/init.sh) does the whole guest side, and a small ext4 root disk.
// Built from Debian packages taken with `apt-get download` (never installed) into a cache
// directory named by the digest of its inputs, and reused while they are unchanged.
// docs/guest-image.md describes what is in it and what the init does.
import { execFile, spawn } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { AgentError } from "../../contracts.ts";
import { cachedBuild, describeFile, sha256, sha256File, type BuiltFile } from "../../build/cache.ts";

/** Bumped whenever the build itself changes what it produces (it is part of the digest). */
export const GUEST_IMAGE_BUILDER_VERSION = "1";
export const GUEST_IMAGE_NAME = "bc-guest";

/** The metapackage that names the current cloud kernel package (linux-image-<release>). */
const KERNEL_METAPACKAGE = "linux-image-cloud-amd64";
/** busybox for the init and its tools; dropbearkey (and its libraries Debian hosts often lack) for the SSH host keys. */
const BASE_PACKAGES = ["busybox-static", "dropbear-bin", "libtomcrypt1", "libtommath1"];
/** Modules the cloud kernel builds as modules and the guest needs: virtio-mmio disks and network, the vfat seed, the ACPI power button. */
const GUEST_MODULES = [
  "virtio_mmio",
  "virtio_blk",
  "virtio_net",
  "vfat",
  "nls_cp437",
  "nls_ascii",
  "nls_utf8",
  "nls_iso8859_1",
  "button",
  "evdev",
];
const ROOTFS_BYTES = 64 * 1024 * 1024;
const INIT_SCRIPT = fileURLToPath(new URL("./guest/init.sh", import.meta.url));
const PACKAGE_NAME = /^[a-z0-9][a-z0-9+.-]+$/;
const PACKAGE_VERSION = /^[A-Za-z0-9.+~:-]+$/;
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
  packages: { name: string; version: string; debSha256: string }[];
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

/** Runs a program with an argument array (never a shell); resolves its stdout. */
export type RunProgram = (file: string, args: string[], options?: { cwd?: string; env?: NodeJS.ProcessEnv }) => Promise<string>;

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

/** Refuses a Debian package name that could be anything but a name (FC-PACKAGES-GUARD). */
export function assertPackageNames(names: readonly string[]): void {
  for (const name of names) {
    if (typeof name !== "string" || !PACKAGE_NAME.test(name))
      throw new AgentError("INVALID_ARGUMENT", `not a Debian package name: ${JSON.stringify(name)}`);
  }
}

/** The real way programs run: execFile with LC_ALL=C; a failure is a typed AgentError with the end of stderr. */
export const runProgram: RunProgram = (file, args, options = {}) =>
  new Promise((resolve, reject) => {
    execFile(
      file,
      args,
      { cwd: options.cwd, env: { ...process.env, LC_ALL: "C", ...options.env }, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        if (!err) return resolve(stdout);
        if ((err as NodeJS.ErrnoException).code === "ENOENT")
          return reject(new AgentError("FAILED_PRECONDITION", `${file} is not installed (docs/guest-image.md lists what the build needs)`));
        const detail = String(stderr).trim().split("\n").slice(-3).join(" / ");
        reject(new AgentError("DRIVER_ERROR", `${file} ${args[0] ?? ""} failed: ${detail || err.message}`));
      },
    );
  });

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

async function resolveKernelPackage(run: RunProgram): Promise<string> {
  const out = await run("apt-cache", ["depends", KERNEL_METAPACKAGE]).catch((e: unknown) => {
    if (e instanceof AgentError && e.code === "DRIVER_ERROR") return ""; // apt knows no such package
    throw e;
  });
  const name = /Depends:\s*(\S+)/.exec(out)?.[1];
  if (!name)
    throw new AgentError(
      "FAILED_PRECONDITION",
      `apt knows no ${KERNEL_METAPACKAGE} (run apt-get update with Debian's main archive configured)`,
    );
  assertPackageNames([name]); // apt's output reaches further commands only as a valid name
  return name;
}

/** The version apt would download of each package (its candidate). */
async function packageVersions(run: RunProgram, names: string[]): Promise<Record<string, string>> {
  const out = await run("apt-cache", ["show", "--no-all-versions", ...names]);
  const versions: Record<string, string> = {};
  for (const stanza of out.split(/\n\s*\n/)) {
    const name = /^Package: (\S+)$/m.exec(stanza)?.[1];
    const version = /^Version: (\S+)$/m.exec(stanza)?.[1];
    if (name && version && !(name in versions)) versions[name] = version;
  }
  for (const name of names) {
    const version = versions[name];
    if (!version) throw new AgentError("FAILED_PRECONDITION", `apt has no candidate for ${name} (run apt-get update)`);
    if (!PACKAGE_VERSION.test(version)) throw new AgentError("DRIVER_ERROR", `apt answered an unexpected version for ${name}`);
  }
  return versions;
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

  const packages: GuestImageManifest["packages"] = [];
  const trees: Record<string, string> = {};
  for (const name of [b.kernelPackage, ...BASE_PACKAGES, ...b.extra]) {
    const version = b.versions[name]!;
    const deb = await downloadDeb(b, name, version);
    packages.push({ name, version, debSha256: await sha256File(deb) });
    // Extra packages go straight into the root disk; the others are picked from.
    const tree = b.extra.includes(name) ? rootfsTree : path.join(work, "pkg", name);
    await fs.mkdir(tree, { recursive: true });
    await run("dpkg-deb", ["-x", deb, tree]);
    trees[name] = tree;
  }

  // The kernel and its modules, in dependency order.
  const kernelTree = trees[b.kernelPackage]!;
  const [kernelRelease] = await fs.readdir(path.join(kernelTree, "lib", "modules"));
  if (!kernelRelease) throw new AgentError("DRIVER_ERROR", `${b.kernelPackage} holds no kernel modules`);
  await run("depmod", ["-b", kernelTree, kernelRelease]);
  const modulesDir = path.join(kernelTree, "lib", "modules", kernelRelease);
  const modules = moduleLoadOrder(await fs.readFile(path.join(modulesDir, "modules.dep"), "utf8"), GUEST_MODULES);
  for (const m of modules) await copyInto(path.join(modulesDir, m), path.join(initramfs, "lib", "modules", m));
  await writeInto(path.join(initramfs, "etc", "bc-modules"), modules.map((m) => m + "\n").join(""));

  const vmlinuz = await fs.readFile(path.join(kernelTree, "boot", `vmlinuz-${kernelRelease}`));
  const elf = await decompressKernel(b, vmlinuz);
  const kernelFile = elf ? "vmlinux" : "vmlinuz";
  await fs.writeFile(path.join(out, kernelFile), elf ?? vmlinuz);
  b.log(elf ? "kernel: decompressed to an ELF with a PVH note" : "kernel: no PVH ELF found in the lz4 payload, keeping the bzImage");

  // busybox and its applets, the init, dropbearkey with the libraries it links against.
  const busybox = path.join(trees["busybox-static"]!, "bin", "busybox");
  await copyInto(busybox, path.join(initramfs, "bin", "busybox"));
  for (const applet of (await run(busybox, ["--list"])).split("\n").filter((a) => /^[a-z0-9_.[-]+$/.test(a) && a !== "busybox"))
    await fs.symlink("busybox", path.join(initramfs, "bin", applet));
  await writeInto(path.join(initramfs, "init"), b.init, 0o755);
  await writeInto(path.join(initramfs, "etc", "acpi", "PWRF", "00000080"), "#!/bin/sh\npoweroff\n", 0o755);
  await writeInto(path.join(initramfs, "etc", "hosts"), "127.0.0.1 localhost\n");
  await writeInto(path.join(initramfs, "etc", "bc-guest-image"), `${GUEST_IMAGE_NAME} ${b.digest}\n`);
  const dropbearkey = path.join(trees["dropbear-bin"]!, "usr", "bin", "dropbearkey");
  await copyInto(dropbearkey, path.join(initramfs, "usr", "bin", "dropbearkey"));
  const hostFiles = await copyLibraries(b, dropbearkey, [trees["libtomcrypt1"]!, trees["libtommath1"]!], initramfs);

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

/** The .deb of name=version, downloaded once into <cacheDir>/debs and reused by later builds. */
async function downloadDeb(b: BuildInput, name: string, version: string): Promise<string> {
  const debs = path.join(b.cacheDir, "debs");
  const cached = path.join(debs, `${name}_${version.replaceAll(":", "%3a")}.deb`);
  if (await exists(cached)) return cached;
  const into = path.join(b.work, "download", name);
  await fs.mkdir(into, { recursive: true });
  b.log(`downloading ${name} ${version}`);
  // Sandbox::User=root: apt's _apt user cannot write into a private temporary directory.
  await b.run("apt-get", ["-q", "-o", "APT::Sandbox::User=root", "download", `${name}=${version}`], { cwd: into });
  const [file] = (await fs.readdir(into)).filter((f) => f.endsWith(".deb"));
  if (!file) throw new AgentError("DRIVER_ERROR", `apt-get download ${name} produced no .deb`);
  await fs.mkdir(debs, { recursive: true });
  await fs.rename(path.join(into, file), cached);
  return cached;
}

/**
 * The order to insmod the wanted modules and everything they depend on (modules.dep of depmod:
 * `path: dep dep ...`, each module's full dependency list), dependencies first.
 */
export function moduleLoadOrder(modulesDep: string, wanted: readonly string[]): string[] {
  const deps = new Map<string, string[]>();
  const byName = new Map<string, string>();
  for (const line of modulesDep.split("\n")) {
    const [module, rest] = line.split(":");
    if (!module || rest === undefined) continue;
    deps.set(module, rest.trim().split(/\s+/).filter(Boolean));
    byName.set(
      path
        .basename(module)
        .replace(/\.ko(\.\w+)?$/, "")
        .replaceAll("-", "_"),
      module,
    );
  }
  const order: string[] = [];
  const visit = (module: string) => {
    if (order.includes(module)) return;
    for (const dep of deps.get(module) ?? []) visit(dep);
    order.push(module);
  };
  for (const name of wanted) {
    const module = byName.get(name);
    if (!module) throw new AgentError("DRIVER_ERROR", `the kernel has no module ${name}`);
    if (/\.ko\.\w+$/.test(module)) throw new AgentError("UNSUPPORTED", `${module} is compressed; busybox insmod needs plain .ko files`);
    visit(module);
  }
  return order;
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

/**
 * The shared libraries a binary needs, by ldd: those from the extracted packages, and the C
 * library and loader from this host (recorded with their sha256 in the manifest).
 */
async function copyLibraries(b: BuildInput, binary: string, trees: string[], root: string): Promise<{ path: string; sha256: string }[]> {
  const libDirs = trees.map((t) => path.join(t, "usr", "lib", "x86_64-linux-gnu"));
  const out = await b.run("ldd", [binary], { env: { LD_LIBRARY_PATH: libDirs.join(":") } });
  const hostFiles: { path: string; sha256: string }[] = [];
  for (const line of out.split("\n")) {
    const lib = /=>\s*(\/\S+)/.exec(line)?.[1] ?? /^\s*(\/\S+)\s+\(/.exec(line)?.[1];
    if (/not found/.test(line))
      throw new AgentError("DRIVER_ERROR", `${path.basename(binary)} needs a library nobody provides: ${line.trim()}`);
    if (!lib) continue;
    const fromPackage = trees.some((t) => lib.startsWith(t + path.sep));
    // The loader keeps its absolute path (it is named in the binary); libraries go to the multiarch directory.
    const target = !fromPackage && /\/ld-linux[^/]*$/.test(lib) ? lib : path.join("/lib/x86_64-linux-gnu", path.basename(lib));
    await copyInto(lib, path.join(root, target));
    if (!fromPackage) hostFiles.push({ path: lib, sha256: await sha256File(lib) });
  }
  return hostFiles;
}

/** An uncompressed newc cpio of dir (the kernel unpacks it as the initramfs), owned by root. */
async function packCpio(dir: string, outFile: string): Promise<void> {
  const entries = (await fs.readdir(dir, { recursive: true })).map(String).sort();
  const output = await fs.open(outFile, "w");
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn("cpio", ["--quiet", "-o", "-0", "-H", "newc", "-R", "0:0"], { cwd: dir, stdio: ["pipe", output.fd, "pipe"] });
      let stderr = "";
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
      child.on("error", (e: NodeJS.ErrnoException) =>
        reject(e.code === "ENOENT" ? new AgentError("FAILED_PRECONDITION", "cpio is not installed") : e),
      );
      child.on("close", (code) => (code === 0 ? resolve() : reject(new AgentError("DRIVER_ERROR", `cpio failed: ${stderr.trim()}`))));
      child.stdin!.end(entries.map((e) => e + "\0").join(""));
    });
  } finally {
    await output.close();
  }
}

async function copyInto(from: string, to: string): Promise<void> {
  await fs.mkdir(path.dirname(to), { recursive: true });
  await fs.copyFile(from, to);
}

async function writeInto(to: string, text: string, mode = 0o644): Promise<void> {
  await fs.mkdir(path.dirname(to), { recursive: true });
  await fs.writeFile(to, text, { mode });
}

async function exists(file: string): Promise<boolean> {
  return fs.access(file).then(
    () => true,
    () => false,
  );
}
