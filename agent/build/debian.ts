// Building from Debian packages without installing them: what the guest image
// (agent/runtimes/microvm/image.ts) and the provisioning ramdisk (agent/build/ramdisk.ts) share.
// apt names the versions, `apt-get download` fetches the .debs into a cache, `dpkg-deb -x`
// unpacks them into trees; the builders pick files from those trees: the kernel and its modules
// in load order, busybox and its applets, a binary's shared libraries. Every program runs with an
// argument array, never through a shell, and every package name is checked before it reaches one.
import { execFile, spawn } from "node:child_process";
import fs from "node:fs/promises";
import path from "node:path";
import { AgentError } from "../contracts.ts";
import { sha256File } from "./cache.ts";

/** Runs a program with an argument array (never a shell); resolves its stdout. */
export type RunProgram = (file: string, args: string[], options?: { cwd?: string; env?: NodeJS.ProcessEnv }) => Promise<string>;

const PACKAGE_NAME = /^[a-z0-9][a-z0-9+.-]+$/;
const PACKAGE_VERSION = /^[A-Za-z0-9.+~:-]+$/;
/** The metapackage that names the current cloud kernel package (linux-image-<release>). */
export const CLOUD_KERNEL_METAPACKAGE = "linux-image-cloud-amd64";
/** Modules for a vfat drive (the guest's NoCloud seed, the ramdisk's config drive): vfat and the code pages its mounts use. */
export const VFAT_MODULES = ["vfat", "nls_cp437", "nls_ascii", "nls_utf8", "nls_iso8859_1"];
/** The ACPI power button as an input device: what a graceful power-off (QMP system_powerdown) presses. */
export const POWER_BUTTON_MODULES = ["button", "evdev"];
/** Where Debian's amd64 packages keep shared libraries (libc6 and libgcc-s1 under /lib, the rest under /usr/lib). */
const LIB_DIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"];

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
          return reject(
            new AgentError(
              "FAILED_PRECONDITION",
              `${file} is not installed (docs/guest-image.md and docs/ramdisk.md list what the builds need)`,
            ),
          );
        const detail = String(stderr).trim().split("\n").slice(-3).join(" / ");
        reject(new AgentError("DRIVER_ERROR", `${file} ${args[0] ?? ""} failed: ${detail || err.message}`));
      },
    );
  });

/** Refuses a Debian package name that could be anything but a name (FC-PACKAGES-GUARD). */
export function assertPackageNames(names: readonly string[]): void {
  for (const name of names) {
    if (typeof name !== "string" || !PACKAGE_NAME.test(name))
      throw new AgentError("INVALID_ARGUMENT", `not a Debian package name: ${JSON.stringify(name)}`);
  }
}

/** The kernel package a metapackage points at now (e.g. linux-image-6.1.0-57-cloud-amd64). */
export async function resolveKernelPackage(run: RunProgram, metapackage = CLOUD_KERNEL_METAPACKAGE): Promise<string> {
  const out = await run("apt-cache", ["depends", metapackage]).catch((e: unknown) => {
    if (e instanceof AgentError && e.code === "DRIVER_ERROR") return ""; // apt knows no such package
    throw e;
  });
  const name = /Depends:\s*(\S+)/.exec(out)?.[1];
  if (!name)
    throw new AgentError("FAILED_PRECONDITION", `apt knows no ${metapackage} (run apt-get update with Debian's main archive configured)`);
  assertPackageNames([name]); // apt's output reaches further commands only as a valid name
  return name;
}

/** The version apt would download of each package (its candidate). */
export async function packageVersions(run: RunProgram, names: string[]): Promise<Record<string, string>> {
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

/** Where a build downloads and unpacks: .debs are kept in <cacheDir>/debs for later builds. */
export interface DebianWork {
  run: RunProgram;
  log: (msg: string) => void;
  cacheDir: string;
  /** The build's scratch directory. */
  work: string;
}

/** A package a build was made from, as its manifest records it. */
export interface UnpackedPackage {
  name: string;
  version: string;
  /** sha256 of the .deb that was unpacked. */
  debSha256: string;
}

/** The .deb of name=version, downloaded once into <cacheDir>/debs and reused by later builds. */
export async function downloadDeb(w: DebianWork, name: string, version: string): Promise<string> {
  const debs = path.join(w.cacheDir, "debs");
  const cached = path.join(debs, `${name}_${version.replaceAll(":", "%3a")}.deb`);
  if (await exists(cached)) return cached;
  const into = path.join(w.work, "download", name);
  await fs.mkdir(into, { recursive: true });
  w.log(`downloading ${name} ${version}`);
  // Sandbox::User=root: apt's _apt user cannot write into a private temporary directory.
  await w.run("apt-get", ["-q", "-o", "APT::Sandbox::User=root", "download", `${name}=${version}`], { cwd: into });
  const [file] = (await fs.readdir(into)).filter((f) => f.endsWith(".deb"));
  if (!file) throw new AgentError("DRIVER_ERROR", `apt-get download ${name} produced no .deb`);
  await fs.mkdir(debs, { recursive: true });
  await fs.rename(path.join(into, file), cached);
  return cached;
}

/**
 * Downloads and unpacks each package (dpkg-deb -x) into the tree `treeOf` names (default
 * <work>/pkg/<name>); answers the packages with their .deb's sha256, and each one's tree.
 */
export async function unpackPackages(
  w: DebianWork,
  names: readonly string[],
  versions: Record<string, string>,
  treeOf: (name: string) => string = (name) => path.join(w.work, "pkg", name),
): Promise<{ packages: UnpackedPackage[]; trees: Record<string, string> }> {
  const packages: UnpackedPackage[] = [];
  const trees: Record<string, string> = {};
  for (const name of names) {
    const version = versions[name]!;
    const deb = await downloadDeb(w, name, version);
    packages.push({ name, version, debSha256: await sha256File(deb) });
    const tree = treeOf(name);
    await fs.mkdir(tree, { recursive: true });
    await w.run("dpkg-deb", ["-x", deb, tree]);
    trees[name] = tree;
  }
  return { packages, trees };
}

/**
 * The kernel package's modules the image needs (and what they depend on), copied into
 * root/lib/modules in dependency order, the order written to root/etc/bc-modules for the init's
 * insmod loop. Answers the kernel release and the modules in that order.
 */
export async function installKernelModules(
  run: RunProgram,
  kernelTree: string,
  wanted: readonly string[],
  root: string,
): Promise<{ kernelRelease: string; modules: string[] }> {
  const [kernelRelease] = await fs.readdir(path.join(kernelTree, "lib", "modules"));
  if (!kernelRelease) throw new AgentError("DRIVER_ERROR", `${path.basename(kernelTree)} holds no kernel modules`);
  await run("depmod", ["-b", kernelTree, kernelRelease]);
  const modulesDir = path.join(kernelTree, "lib", "modules", kernelRelease);
  const modules = moduleLoadOrder(await fs.readFile(path.join(modulesDir, "modules.dep"), "utf8"), wanted);
  for (const m of modules) await copyInto(path.join(modulesDir, m), path.join(root, "lib", "modules", m));
  await writeInto(path.join(root, "etc", "bc-modules"), modules.map((m) => m + "\n").join(""));
  return { kernelRelease, modules };
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

/** busybox (from busybox-static's tree) at root/bin/busybox, with a link for each of its applets. */
export async function installBusybox(run: RunProgram, busyboxTree: string, root: string): Promise<void> {
  const busybox = path.join(busyboxTree, "bin", "busybox");
  await copyInto(busybox, path.join(root, "bin", "busybox"));
  for (const applet of (await run(busybox, ["--list"])).split("\n").filter((a) => /^[a-z0-9_.[-]+$/.test(a) && a !== "busybox"))
    await fs.symlink("busybox", path.join(root, "bin", applet));
}

/** A shared library copied into the image: where it came from and where it went. */
export interface CopiedLibrary {
  /** Its path in the image. */
  file: string;
  /** The path it was copied from. */
  source: string;
  sha256: string;
  /** The package whose tree held it; absent when it came from the build host. */
  package?: string;
}

/**
 * The shared libraries a binary needs, copied into root. They are looked up in the packages'
 * trees (name → unpacked tree) first. Without `libc` the build host's loader lists them (ldd), and
 * the C library and loader come from this host; with `libc` (the tree of a libc6 package) that
 * tree's own loader lists them, and a library found nowhere in the trees is an error: nothing of
 * the host goes in.
 */
export async function copyLibraries(
  run: RunProgram,
  binary: string,
  opts: { trees: Record<string, string>; root: string; libc?: string },
): Promise<CopiedLibrary[]> {
  const trees = Object.entries(opts.trees);
  const libraryPath = trees.flatMap(([, t]) => LIB_DIRS.map((d) => path.join(t, d))).join(":");
  const libcLoader = opts.libc && path.join(opts.libc, LIB_DIRS[0]!, "ld-linux-x86-64.so.2");
  const out = libcLoader
    ? await run(libcLoader, ["--library-path", libraryPath, "--list", binary])
    : await run("ldd", [binary], { env: { LD_LIBRARY_PATH: libraryPath } });
  const copied: CopiedLibrary[] = [];
  for (const line of out.split("\n")) {
    if (/not found/.test(line))
      throw new AgentError("DRIVER_ERROR", `${path.basename(binary)} needs a library nobody provides: ${line.trim()}`);
    // `name => path (addr)`; the loader is named by its absolute path in the binary (PT_INTERP),
    // which it keeps in the image; ldd lists it as `path (addr)`.
    const listed = /^\s*(\S+)\s+=>\s*(\/\S+)/.exec(line);
    const name = listed?.[1] ?? /^\s*(\/\S+)\s+\(/.exec(line)?.[1];
    if (!name) continue; // the vDSO
    const source = listed?.[2] ?? name;
    const file = name.startsWith("/") ? name : path.join("/lib/x86_64-linux-gnu", path.basename(source));
    const from = trees.find(([, t]) => source.startsWith(t + path.sep))?.[0];
    if (opts.libc && !from) throw new AgentError("DRIVER_ERROR", `${path.basename(binary)} would load ${source} from the build host`);
    await copyInto(source, path.join(opts.root, file));
    copied.push({ file, source, sha256: await sha256File(source), ...(from ? { package: from } : {}) });
  }
  return copied;
}

/** An uncompressed newc cpio of dir (the kernel unpacks it as the initramfs), owned by root. */
export async function packCpio(dir: string, outFile: string): Promise<void> {
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

export async function copyInto(from: string, to: string): Promise<void> {
  await fs.mkdir(path.dirname(to), { recursive: true });
  await fs.copyFile(from, to);
}

export async function writeInto(to: string, text: string, mode = 0o644): Promise<void> {
  await fs.mkdir(path.dirname(to), { recursive: true });
  await fs.writeFile(to, text, { mode });
}

async function exists(file: string): Promise<boolean> {
  return fs.access(file).then(
    () => true,
    () => false,
  );
}
