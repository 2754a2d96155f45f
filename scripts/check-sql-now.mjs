#!/usr/bin/env node
// Business time comes from the database through compute_now(), so tests and
// simulations can move the clock. Any other clock in SQL (now(), current_timestamp,
// clock_timestamp(), ...) bypasses that. Plain Node, no deps.
//
//   node scripts/check-sql-now.mjs [root]     exit 1 and one line per violation
//
// The single definition of compute_now() needs a real clock: a line containing the
// marker `bc:allow-now` is exempt. Comments are skipped, so docs may mention now().
import { readFileSync, realpathSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { walk } from "./check-deps.mjs";

const CODE_DIRS = ["core", "plugins", "workers", "durable-objects", "agent"];
const CODE_EXT = /\.(ts|mts|cts|tsx|js|mjs|cjs)$/;
const ALLOW = "bc:allow-now";

// Postgres clocks other than compute_now(). `\bnow` does not match inside compute_now
// (the `_` is a word character); `'now'` is the text literal Postgres also reads as now().
const CLOCK = String.raw`\bnow\s*\(\s*\)|\b(?:transaction_timestamp|statement_timestamp|clock_timestamp|timeofday)\s*\(|\b(?:current_timestamp|localtimestamp|current_time|localtime|current_date)\b`;
const SQL_CLOCK = new RegExp(`${CLOCK}|'now'`, "gi");
// In JS/TS, `Date.now()`, `performance.now()`, `x?.now()`, `this.#now()` are method calls, not SQL.
const CODE_CLOCK = new RegExp(`(?<![.#]\\s*)(?:${CLOCK})|'now'\\s*::`, "gi");

/** Each line without its comments (-- …, // …, /* … *\/), so prose about now() is fine. */
function codeLines(src) {
  let inBlock = false;
  return src.split("\n").map((line) => {
    let code = "";
    for (let i = 0; i < line.length;) {
      if (inBlock) {
        const end = line.indexOf("*/", i);
        if (end < 0) break;
        [inBlock, i] = [false, end + 2];
        continue;
      }
      const m = /--|\/\/|\/\*/.exec(line.slice(i));
      code += m ? line.slice(i, i + m.index) : line.slice(i);
      if (!m || m[0] !== "/*") break;
      [inBlock, i] = [true, i + m.index + 2];
    }
    return code;
  });
}

/**
 * Check migrations/**\/*.sql and the code directories under root.
 * @returns {{ violations: { file: string, line: number, match: string, text: string }[], filesChecked: number }}
 */
export function checkSqlNow(root) {
  const sql = walk(root, "migrations", /\.sql$/);
  const code = CODE_DIRS.flatMap((d) => walk(root, d, CODE_EXT));
  const violations = [];
  for (const file of [...sql, ...code]) {
    const re = file.endsWith(".sql") ? SQL_CLOCK : CODE_CLOCK;
    const src = readFileSync(path.join(root, file), "utf8");
    const lines = src.split("\n");
    codeLines(src).forEach((code, i) => {
      if (lines[i].includes(ALLOW)) return;
      for (const m of code.matchAll(re)) violations.push({ file, line: i + 1, match: m[0], text: lines[i].trim() });
    });
  }
  return { violations, filesChecked: sql.length + code.length };
}

const isMain = process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
if (isMain) {
  const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), ".."));
  const { violations, filesChecked } = checkSqlNow(root);
  for (const v of violations) console.log(`${v.file}:${v.line}: ${v.match} is not compute_now(): ${v.text}`);
  if (violations.length) {
    console.log(
      `check-sql-now: ${violations.length} violation(s) in ${filesChecked} files checked; use compute_now() (or mark the compute_now() definition with ${ALLOW})`,
    );
    process.exitCode = 1;
  } else console.log(`check-sql-now: OK, ${filesChecked} files checked`);
}
