// Content-addressed builds: what a builder makes (the guest image, the bcd package, the ramdisk)
// lives in <cacheDir>/<digest of its inputs>, and is reused while the inputs are unchanged.
// Concurrent builders never see a partial build: each builds in a temporary directory and renames
// it into place; the one that loses the rename uses the winner's. A build is complete when its
// manifest is there and every file it names has its recorded size.
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { constants as zlibConstants, createZstdCompress } from "node:zlib";
import { AgentError } from "../contracts.ts";

/** A file of a build, as its manifest records it. */
export interface BuiltFile {
  /** The file's path inside the build directory. */
  file: string;
  sha256: string;
  bytes: number;
}

export interface CachedBuildOptions<M> {
  cacheDir: string;
  /** sha256 of everything the build is made from: the directory's name. */
  digest: string;
  /** What is built, for the log ("guest image", "bcd"). */
  what: string;
  log: (msg: string) => void;
  /** Builds into `out` (an empty directory) and answers the manifest (written there last). */
  build: (out: string, work: string) => Promise<M>;
  /** The files a complete build has, from its manifest. */
  files: (manifest: M) => BuiltFile[];
  /** After a new build, keep this many builds in cacheDir (the newest), this one included. Default all. */
  keep?: number;
}

/** A build found or made: its directory and its manifest. */
export interface CachedBuild<M> {
  dir: string;
  manifest: M;
}

/** Build directories a killed builder left behind (a build takes minutes, not an hour). */
const ABANDONED_BUILD_MS = 60 * 60 * 1000;

export async function cachedBuild<M>(opts: CachedBuildOptions<M>): Promise<CachedBuild<M>> {
  const dir = path.join(opts.cacheDir, opts.digest);
  const short = opts.digest.slice(0, 12);
  const existing = await readBuild(dir, opts.files);
  if (existing) {
    opts.log(`${opts.what} ${short} reused (${dir})`);
    return { dir, manifest: existing };
  }
  await fs.mkdir(opts.cacheDir, { recursive: true });
  await removeAbandonedBuilds(opts.cacheDir);
  const work = path.join(opts.cacheDir, `.build-${short}-${randomBytes(4).toString("hex")}`);
  const out = path.join(work, "out");
  try {
    await fs.mkdir(out, { recursive: true });
    opts.log(`building ${opts.what} ${short}`);
    const manifest = await opts.build(out, work);
    await fs.writeFile(path.join(out, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
    await moveIntoPlace(out, dir, opts);
  } finally {
    await fs.rm(work, { recursive: true, force: true });
  }
  const built = await readBuild(dir, opts.files);
  if (!built) throw new AgentError("DRIVER_ERROR", `the ${opts.what} in ${dir} is incomplete`);
  opts.log(`${opts.what} ${short} ready (${dir})`);
  if (opts.keep !== undefined) await removeOlderBuilds(opts.cacheDir, opts.digest, opts.keep);
  return { dir, manifest: built };
}

/** The manifest of a complete build in dir, or undefined. */
async function readBuild<M>(dir: string, files: (manifest: M) => BuiltFile[]): Promise<M | undefined> {
  let manifest: M;
  try {
    manifest = JSON.parse(await fs.readFile(path.join(dir, "manifest.json"), "utf8")) as M;
  } catch {
    return undefined;
  }
  for (const expected of files(manifest)) {
    const stat = await fs.stat(path.join(dir, expected.file)).catch(() => undefined);
    if (stat?.size !== expected.bytes) return undefined;
  }
  return manifest;
}

/**
 * Renames a finished build to its digest's directory. If another builder got there first, its
 * complete build stays and ours is dropped; an incomplete one (files deleted or truncated by hand)
 * is replaced.
 */
async function moveIntoPlace<M>(built: string, dir: string, opts: CachedBuildOptions<M>): Promise<void> {
  try {
    await fs.rename(built, dir);
    return;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw e;
  }
  if (await readBuild(dir, opts.files)) {
    opts.log(`${opts.what} ${opts.digest.slice(0, 12)} was built concurrently; using that one`);
    return;
  }
  opts.log(`replacing the incomplete ${opts.what} in ${dir}`);
  const broken = `${built}-broken`;
  await fs.rename(dir, broken);
  await fs.rm(broken, { recursive: true, force: true });
  await fs.rename(built, dir);
}

/** Every build but the `keep` newest (by when each was made), never `current`. */
async function removeOlderBuilds(cacheDir: string, current: string, keep: number): Promise<void> {
  const builds = [];
  for (const entry of await fs.readdir(cacheDir)) {
    if (!/^[0-9a-f]{64}$/.test(entry) || entry === current) continue;
    const stat = await fs.stat(path.join(cacheDir, entry)).catch(() => undefined);
    if (stat) builds.push({ entry, at: stat.mtimeMs });
  }
  builds.sort((a, b) => b.at - a.at);
  for (const { entry } of builds.slice(Math.max(0, keep - 1))) await fs.rm(path.join(cacheDir, entry), { recursive: true, force: true });
}

async function removeAbandonedBuilds(cacheDir: string): Promise<void> {
  for (const entry of await fs.readdir(cacheDir)) {
    if (!entry.startsWith(".build-")) continue;
    const stat = await fs.stat(path.join(cacheDir, entry)).catch(() => undefined);
    if (stat && Date.now() - stat.mtimeMs > ABANDONED_BUILD_MS) await fs.rm(path.join(cacheDir, entry), { recursive: true, force: true });
  }
}

export const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");

export async function sha256File(file: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

/** What every build's manifest starts with: what it is, the digest naming it, the builder's version and when it was made. */
export function manifestHeader<N extends string>(name: N, digest: string, builderVersion: string) {
  return { name, digest, builderVersion, builtAt: new Date().toISOString() };
}

/** `from` compressed with zstd into `to` (Node's own zstd: nothing to install). */
export async function zstdFile(from: string, to: string, level: number): Promise<void> {
  await pipeline(
    createReadStream(from),
    createZstdCompress({ params: { [zlibConstants.ZSTD_c_compressionLevel]: level } }),
    createWriteStream(to),
  );
}

/** A file of the build directory `dir`, described for its manifest. */
export async function describeFile(dir: string, file: string): Promise<BuiltFile> {
  return { file, sha256: await sha256File(path.join(dir, file)), bytes: (await fs.stat(path.join(dir, file))).size };
}
