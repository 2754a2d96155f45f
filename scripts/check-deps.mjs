#!/usr/bin/env node
// Import direction check: core stays independent of everything built on it, modules (plugins,
// third-party extensions) reach the platform only through the public entry points listed in
// package.json "exports", no product room imports the test doubles (testing/), and nothing imports
// scripts/ (its files are entry points). Plain Node, no deps.
//
// The floors, lowest first: core; the product rooms built on it (plugins, agent, workers,
// durable-objects, local: the embedded stack, cli: the CLI); testing/ (stand-ins for what is not
// ours, over the product rooms); then what only runs things: test/, bench/, examples/, scripts/.
//
//   node scripts/check-deps.mjs [root]     exit 1 and one line per violation
import { readFileSync, readdirSync, realpathSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const SKIP_DIRS = new Set(["node_modules", ".data", ".wrangler", ".git"]);
export const CODE_EXT = /\.(ts|mts|cts|tsx|js|mjs|cjs)$/;
// Everything core must never depend on.
const NOT_FOR_CORE = ["plugins", "workers", "durable-objects", "agent", "local", "cli", "testing", "test", "examples", "bench", "scripts"];
// Rooms that ship: none of them imports the test doubles.
const PRODUCT_ROOMS = ["core", "plugins", "agent", "workers", "durable-objects", "local", "cli"];
/** The test doubles' room, and its package entry points (better-compute/testing, better-compute/testing/...). */
const TESTING = "testing";

/** All files under dir (relative to root, '/'-separated) matching ext. */
export function walk(root, dir, ext) {
  const out = [];
  let entries;
  try {
    entries = readdirSync(path.join(root, dir), { withFileTypes: true });
  } catch {
    return out; // a missing top-level directory is simply empty
  }
  for (const e of entries) {
    const rel = dir ? `${dir}/${e.name}` : e.name;
    if (e.isDirectory()) {
      if (!SKIP_DIRS.has(e.name)) out.push(...walk(root, rel, ext));
    } else if (ext.test(e.name)) out.push(rel);
  }
  return out.sort();
}

/** Blank out comments (keeping newlines) so commented-out imports don't count. */
export function stripComments(src) {
  let out = "";
  for (let i = 0; i < src.length; i++) {
    const c = src[i];
    if (c === '"' || c === "'" || c === "`") {
      // copy a string literal verbatim; plain quotes end at a newline at the latest
      let j = i + 1;
      while (j < src.length && src[j] !== c && !(c !== "`" && src[j] === "\n")) j += src[j] === "\\" ? 2 : 1;
      out += src.slice(i, j + 1);
      i = j;
    } else if (c === "/" && src[i + 1] === "/") {
      while (i < src.length && src[i] !== "\n") i++;
      out += "\n";
    } else if (c === "/" && src[i + 1] === "*") {
      const end = src.indexOf("*/", i + 2);
      const stop = end < 0 ? src.length : end + 2;
      out += src.slice(i, stop).replace(/[^\n]/g, " ");
      i = stop - 1;
    } else out += c;
  }
  return out;
}

// import x from '…' / import type { a } from '…' / export * from '…' / export { a } from '…'
// / import '…' / import('…'). Clauses are limited to identifier-ish characters so a
// stray `from '…'` elsewhere in code is not mistaken for an import.
const IMPORT_RES = [
  /\bimport\s+(?:type\s+)?[\w$*{},\s]*?\bfrom\s*(['"])([^'"\n]+)\1/g,
  /\bexport\s+(?:type\s+)?(?:\*(?:\s+as\s+[\w$]+)?|\{[^}]*\})\s*from\s*(['"])([^'"\n]+)\1/g,
  /\bimport\s*(['"])([^'"\n]+)\1/g,
  /\bimport\s*\(\s*(['"`])([^'"`\n$]+)\1\s*[,)]/g,
];

/** [{ specifier, line }] for every static/dynamic import and re-export in src. */
export function findImports(src) {
  const code = stripComments(src);
  const found = [];
  for (const re of IMPORT_RES) {
    for (const m of code.matchAll(re)) {
      const at = m.index + m[0].lastIndexOf(m[2]);
      found.push({ specifier: m[2], line: code.slice(0, at).split("\n").length });
    }
  }
  return found.sort((a, b) => a.line - b.line);
}

/** Is `sub` ('.' or './x') exported by the package.json "exports" map? */
function isExported(exportsField, sub) {
  if (exportsField == null) return false;
  // "exports": "./x.ts" or a conditions object both mean: only the root is exported.
  if (typeof exportsField === "string" || !Object.keys(exportsField).some((k) => k.startsWith("."))) return sub === ".";
  if (sub in exportsField) return exportsField[sub] !== null;
  // Subpath patterns: "./providers/*": "./plugins/providers/*/index.ts"
  return Object.entries(exportsField).some(([key, target]) => {
    const star = key.indexOf("*");
    if (star < 0 || target === null) return false;
    const [pre, post] = [key.slice(0, star), key.slice(star + 1)];
    return sub.length > pre.length + post.length - 1 && sub.startsWith(pre) && sub.endsWith(post);
  });
}

/**
 * The module a root-relative file belongs to, if it is under plugins/: the shallowest directory
 * under plugins/ with an index file (plugins/<m>/, or plugins/<group>/<m>/ when the group has
 * none), else plugins/<first>.
 */
function pluginModule(root, file) {
  const dirs = file.split("/").slice(0, -1); // directories above the file
  if (dirs[0] !== "plugins" || dirs.length < 2) return null;
  for (let depth = 2; depth <= dirs.length; depth++) {
    const dir = dirs.slice(0, depth).join("/");
    if (hasIndex(root, dir)) return dir;
  }
  return dirs.slice(0, 2).join("/");
}

const indexCache = new Map();
function hasIndex(root, dir) {
  const key = path.join(root, dir);
  if (!indexCache.has(key)) {
    let found = false;
    try {
      found = readdirSync(key).some((name) => /^index\.(ts|mts|cts|tsx|js|mjs|cjs)$/.test(name));
    } catch {}
    indexCache.set(key, found);
  }
  return indexCache.get(key);
}

const under = (rel, dir) => rel === dir || rel.startsWith(`${dir}/`);
const isDir = (p) => {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
};

/**
 * The package.json at root ({} when there is none) and the name its files import it by.
 * @returns {{ pkg: { name?: string, exports?: unknown }, name: string }}
 */
export function ownPackage(root) {
  let pkg = {};
  try {
    pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8"));
  } catch {}
  return { pkg, name: pkg.name ?? "better-compute" };
}

/**
 * Check every code file under root.
 * @returns {{ violations: { file: string, line: number, importer: string, specifier: string, rule: string }[], filesChecked: number }}
 */
export function checkDeps(root) {
  const { pkg, name } = ownPackage(root);
  const files = walk(root, "", CODE_EXT);
  const violations = [];

  for (const file of files) {
    const mod = pluginModule(root, file);
    const room = file.split("/")[0];
    const product = PRODUCT_ROOMS.includes(room);
    const importer = under(file, "core")
      ? "core"
      : mod
        ? mod
        : under(file, "test/extensions")
          ? "test/extensions"
          : under(file, "agent")
            ? "agent"
            : file.split("/")[0];

    for (const { specifier, line } of findImports(readFileSync(path.join(root, file), "utf8"))) {
      const fail = (rule) => violations.push({ file, line, importer, specifier, rule });
      const relative = specifier.startsWith(".") || specifier.startsWith("/");
      // Root-relative target of a relative import ('..' prefix = outside the project).
      let target = relative ? path.resolve(root, path.dirname(file), specifier) : null;
      if (target && isDir(target)) target = path.join(target, "index"); // './dir' means './dir/index'
      if (target) target = path.relative(root, target).split(path.sep).join("/");

      if (!relative) {
        // Self-reference by package name: Node resolves it through "exports" only. Checked
        // where the rules send imports through the public entry points.
        const self = specifier === name || specifier.startsWith(`${name}/`);
        const sub = specifier === name ? "." : `.${specifier.slice(name.length)}`;
        if (self && product && (sub === `./${TESTING}` || sub.startsWith(`./${TESTING}/`))) {
          fail(`${room}/ ships: it must not import the test doubles (${specifier})`);
          continue;
        }
        const publicOnly = mod || importer === "test/extensions" || importer === "agent";
        if (publicOnly && self && !isExported(pkg.exports, sub)) fail(`"${sub}" is not a public entry point in package.json exports`);
        continue; // anything else is an npm package or a node: builtin
      }
      if (under(target, "scripts") && room !== "scripts") {
        fail("scripts/ holds entry points: nothing imports them (move what is shared to the room it belongs to)");
        continue;
      }
      if (product && room !== "core" && under(target, TESTING)) {
        fail(`${room}/ ships: it must not import the test doubles in ${TESTING}/`);
        continue;
      }
      if (importer === "core") {
        const bad = NOT_FOR_CORE.find((d) => under(target, d));
        if (bad) fail(`core must not import from ${bad}/`);
      } else if (mod) {
        if (pluginModule(root, target) !== mod)
          fail(`a module may import relatively only within ${mod}/; use the public entry points (${name}, ${name}/<subpath>)`);
      } else if (importer === "test/extensions") {
        if (!under(target, "test/extensions"))
          fail(`third-party extensions may import only public entry points (${name}...), npm packages and files inside test/extensions/`);
      } else if (importer === "agent") {
        const bad = ["workers", "durable-objects", "plugins", "local", "cli"].find((d) => under(target, d));
        if (bad) fail(`agent must not import ${bad}/ internals; use the public entry points`);
      } else if (room === "local") {
        const bad = ["workers", "durable-objects", "plugins", "agent", "cli"].find((d) => under(target, d));
        if (bad) fail(`local/ (the embedded stack) stands on core alone: it must not import ${bad}/`);
      }
      // workers/ and durable-objects/ are the composition root: no rule.
    }
  }
  return { violations, filesChecked: files.length };
}

const isMain = process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
if (isMain) {
  const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), ".."));
  const { violations, filesChecked } = checkDeps(root);
  for (const v of violations) console.log(`${v.file}:${v.line}: ${v.importer} imports ${v.specifier}: ${v.rule}`);
  if (violations.length) {
    console.log(`check-deps: ${violations.length} violation(s) in ${filesChecked} files checked`);
    process.exitCode = 1;
  } else console.log(`check-deps: OK, ${filesChecked} files checked`);
}
