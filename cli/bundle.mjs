// The CLI as one prebuilt ES module: cli/main.ts and what it imports, bundled by esbuild into
// node_modules/.cache/better-compute/cli/ ($BC_CLI_BUNDLE_DIR when set), so a call starts in plain
// Node instead of compiling TypeScript through tsx every time (docs/decisions.md). npm's prepare
// (npm ci, npm install) builds it; scripts/better-compute.mjs runs it while every file it was built
// from has the digest it had then, and builds it again first otherwise (an edit, a checkout, a
// pull), so it is never stale. Plain JavaScript: it runs before any TypeScript can.
//
//   node cli/bundle.mjs     build it now (npm's prepare)
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = fileURLToPath(import.meta.url);
const root = path.resolve(path.dirname(here), "..");
const ENTRY = "cli/main.ts";
const LOADERS = { ".ts": "ts", ".mts": "ts", ".js": "js", ".mjs": "js", ".cjs": "js", ".json": "json" };

export function bundleDir(env = process.env) {
  return env.BC_CLI_BUNDLE_DIR ? path.resolve(env.BC_CLI_BUNDLE_DIR) : path.join(root, "node_modules", ".cache", "better-compute", "cli");
}

/** The bundle's path when it is current (every input, this file too, has the digest it was built from), else undefined. */
export function currentBundle(dir = bundleDir()) {
  let inputs;
  try {
    ({ inputs } = JSON.parse(fs.readFileSync(path.join(dir, "inputs.json"), "utf8")));
  } catch {
    return undefined; // never built, or by a build that did not finish
  }
  for (const [file, digest] of Object.entries(inputs)) if (digestOf(path.join(root, file)) !== digest) return undefined;
  const bundle = path.join(dir, "main.mjs");
  return fs.existsSync(bundle) ? bundle : undefined;
}

/** Builds the bundle into dir; resolves with its path. Rejects when esbuild (a devDependency) is missing or the sources do not build. */
export async function buildBundle(dir = bundleDir()) {
  const { build } = await import("esbuild");
  // Each input's digest is taken of the very bytes bundled: an edit made during the build leaves the bundle stale, not wrongly current.
  const inputs = { [path.relative(root, here)]: digestOf(here) };
  const recordInputs = {
    name: "record-inputs",
    setup(b) {
      b.onLoad({ filter: /\.(m?ts|[mc]?js|json)$/ }, (args) => {
        const source = fs.readFileSync(args.path);
        inputs[path.relative(root, args.path)] = sha256(source);
        // Each module keeps its own import.meta.url (connection.ts finds the repository's .data from cli/).
        const url = JSON.stringify(pathToFileURL(args.path).href);
        return { contents: source.toString("utf8").replace(/\bimport\.meta\.url\b/g, url), loader: LOADERS[path.extname(args.path)] };
      });
    },
  };
  const result = await build({
    absWorkingDir: root,
    entryPoints: [ENTRY],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node22",
    write: false,
    logLevel: "silent",
    plugins: [recordInputs],
  });
  fs.mkdirSync(dir, { recursive: true });
  // The bundle, then what it was built from, each renamed into place whole: a CLI started meanwhile sees an old pair, a new one, or a stale one.
  const bundle = path.join(dir, "main.mjs");
  writeWhole(bundle, result.outputFiles[0].contents);
  writeWhole(path.join(dir, "inputs.json"), JSON.stringify({ entry: ENTRY, inputs }, null, 2));
  return bundle;
}

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

function digestOf(file) {
  try {
    return sha256(fs.readFileSync(file));
  } catch {
    return "missing";
  }
}

function writeWhole(file, contents) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, contents);
  fs.renameSync(tmp, file);
}

if (process.argv[1] && fs.realpathSync(process.argv[1]) === here) {
  const bundle = await buildBundle();
  console.log(`the CLI's bundle: ${path.relative(process.cwd(), bundle)} (${(fs.statSync(bundle).size / 1024).toFixed(0)} KiB)`);
}
