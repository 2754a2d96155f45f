#!/usr/bin/env node
// Runtime import cycles: two files that import each other's values (directly or through
// others) load in an order that depends on who is imported first, and a layer that needs
// the layer above it. Only edges that exist at run time count: `import type`, imports
// whose every name is `type X`, and `export type` are erased by TypeScript. Dynamic
// `import()` runs later, not at load, and is not an edge either. Relative imports are
// followed, and so are `better-compute/...` imports, through package.json "exports".
// Plain Node, no deps.
//
//   node scripts/check-cycles.mjs [root]     exit 1 and one line per cycle
import { existsSync, readFileSync, realpathSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { CODE_EXT, ownPackage, stripComments, walk } from "./check-deps.mjs";

const TRY_EXT = [".ts", ".mts", ".tsx", ".js", ".mjs", ".cjs"];

// Static imports and re-exports at the start of a line (so an import quoted inside a string
// is not one). Group 1: `type ` for a whole-clause type import; group 2: the clause.
const STATIC_RES = [
  /^[ \t]*import\s+(type\s+)?([\w$*{},\s]*?)\s*\bfrom\s*(['"])([^'"\n]+)\3/gm,
  /^[ \t]*export\s+(type\s+)?(\*(?:\s+as\s+[\w$]+)?|\{[^}]*\})\s*from\s*(['"])([^'"\n]+)\3/gm,
  /^[ \t]*import\s*()()(['"])([^'"\n]+)\3/gm, // import '…': a side effect, always a value edge
];

/** A clause that is only `{ type A, type B }` imports nothing at run time. */
function typeOnlyClause(clause) {
  const braces = /^\{([^}]*)\}$/.exec(clause.trim());
  if (!braces) return false;
  const names = braces[1]
    .split(",")
    .map((n) => n.trim())
    .filter(Boolean);
  return names.length > 0 && names.every((n) => /^type\s/.test(n));
}

/** [{ specifier, line }] of the value (run-time) imports and re-exports in src. */
export function valueImports(src) {
  const code = stripComments(src);
  const found = [];
  for (const re of STATIC_RES) {
    for (const m of code.matchAll(re)) {
      if (m[1] || typeOnlyClause(m[2])) continue;
      const at = m.index + m[0].lastIndexOf(m[4]);
      found.push({ specifier: m[4], line: code.slice(0, at).split("\n").length });
    }
  }
  return found.sort((a, b) => a.line - b.line);
}

const isFile = (p) => {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
};

/** The file a path names, the way the bundler finds it: as is, with an extension, or its index. */
function resolveFile(abs) {
  if (isFile(abs)) return abs;
  for (const ext of TRY_EXT) if (isFile(abs + ext)) return abs + ext;
  for (const ext of TRY_EXT) if (isFile(path.join(abs, `index${ext}`))) return path.join(abs, `index${ext}`);
  return null;
}

/** The target of `sub` ('.' or './x') in a package.json "exports" map, or null. */
function exportTarget(exportsField, sub) {
  const pick = (target) =>
    typeof target === "string" ? target : target && typeof target === "object" ? pick(target.import ?? target.default) : null;
  if (exportsField == null) return null;
  if (typeof exportsField === "string" || !Object.keys(exportsField).some((k) => k.startsWith(".")))
    return sub === "." ? pick(exportsField) : null;
  if (sub in exportsField) return pick(exportsField[sub]);
  for (const [key, target] of Object.entries(exportsField)) {
    const star = key.indexOf("*");
    const to = pick(target);
    if (star < 0 || !to) continue;
    const [pre, post] = [key.slice(0, star), key.slice(star + 1)];
    if (sub.length >= pre.length + post.length && sub.startsWith(pre) && sub.endsWith(post))
      return to.replaceAll("*", sub.slice(pre.length, sub.length - post.length));
  }
  return null;
}

/**
 * The run-time import graph of every code file under root, and its cycles.
 * @returns {{ cycles: { file: string, line: number, specifier: string }[][], filesChecked: number }}
 *   each cycle as its edges in order, the last one leading back to the first file
 */
export function checkCycles(root) {
  const { pkg, name } = ownPackage(root);
  const files = walk(root, "", CODE_EXT).filter((f) => !f.endsWith(".d.ts"));
  const rel = (abs) => path.relative(root, abs).split(path.sep).join("/");

  /** file → [{ to, line, specifier }] */
  const graph = new Map();
  for (const file of files) {
    const edges = [];
    for (const { specifier, line } of valueImports(readFileSync(path.join(root, file), "utf8"))) {
      let target = null;
      if (specifier.startsWith(".")) target = resolveFile(path.resolve(root, path.dirname(file), specifier));
      else if (specifier === name || specifier.startsWith(`${name}/`)) {
        const to = exportTarget(pkg.exports, specifier === name ? "." : `.${specifier.slice(name.length)}`);
        if (to) target = resolveFile(path.resolve(root, to));
      }
      if (target && existsSync(target)) edges.push({ to: rel(target), line, specifier });
    }
    graph.set(file, edges);
  }

  // Tarjan's strongly connected components: every cycle lies inside one.
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const components = [];
  let counter = 0;
  const connect = (v) => {
    index.set(v, counter);
    low.set(v, counter++);
    stack.push(v);
    onStack.add(v);
    for (const { to } of graph.get(v) ?? []) {
      if (!index.has(to)) {
        connect(to);
        low.set(v, Math.min(low.get(v), low.get(to)));
      } else if (onStack.has(to)) low.set(v, Math.min(low.get(v), index.get(to)));
    }
    if (low.get(v) === index.get(v)) {
      const component = [];
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      components.push(component);
    }
  };
  for (const file of files) if (!index.has(file)) connect(file);

  // One cycle per component, found by a breadth-first search back to its first file.
  const cycles = [];
  for (const component of components) {
    const members = new Set(component);
    const start = component.sort()[0];
    const selfLoop = (graph.get(start) ?? []).find((e) => e.to === start);
    if (members.size === 1 && !selfLoop) continue;
    const cameBy = new Map([[start, null]]);
    const queue = [start];
    let closing = selfLoop ? { from: start, edge: selfLoop } : null;
    while (queue.length && !closing) {
      const v = queue.shift();
      for (const edge of graph.get(v) ?? []) {
        if (!members.has(edge.to)) continue;
        if (edge.to === start) {
          closing = { from: v, edge };
          break;
        }
        if (!cameBy.has(edge.to)) {
          cameBy.set(edge.to, { from: v, edge });
          queue.push(edge.to);
        }
      }
    }
    const cycle = [{ file: closing.from, line: closing.edge.line, specifier: closing.edge.specifier }];
    for (let v = closing.from; cameBy.get(v); v = cameBy.get(v).from) {
      const { from, edge } = cameBy.get(v);
      cycle.unshift({ file: from, line: edge.line, specifier: edge.specifier });
    }
    cycles.push(cycle);
  }
  return { cycles: cycles.sort((a, b) => a[0].file.localeCompare(b[0].file)), filesChecked: files.length };
}

const isMain = process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
if (isMain) {
  const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), ".."));
  const { cycles, filesChecked } = checkCycles(root);
  for (const cycle of cycles) {
    console.log(`import cycle: ${cycle.map((e) => `${e.file}:${e.line} imports ${e.specifier}`).join(" → ")} → back to ${cycle[0].file}`);
  }
  if (cycles.length) {
    console.log(
      `check-cycles: ${cycles.length} run-time import cycle(s) in ${filesChecked} files checked (an \`import type\` does not count)`,
    );
    process.exitCode = 1;
  } else console.log(`check-cycles: OK, ${filesChecked} files checked`);
}
