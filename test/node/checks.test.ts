// The CI check scripts (scripts/check-deps.mjs, scripts/check-sql-now.mjs,
// scripts/check-cycles.mjs): each planted violation is reported with its file and
// specifier, a clean tree passes, and the CLI exits 1 on a planted tree and 0 on the
// real repository.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const depsScript = path.join(repoRoot, "scripts/check-deps.mjs");
const sqlScript = path.join(repoRoot, "scripts/check-sql-now.mjs");
const cyclesScript = path.join(repoRoot, "scripts/check-cycles.mjs");

type Result<V> = { violations: V[]; filesChecked: number };
type DepsViolation = { file: string; line: number; importer: string; specifier: string; rule: string };
type SqlViolation = { file: string; line: number; match: string; text: string };
type CycleEdge = { file: string; line: number; specifier: string };
// Loaded by URL: the scripts are plain .mjs without type declarations.
const { checkDeps } = (await import(pathToFileURL(depsScript).href)) as { checkDeps(root: string): Result<DepsViolation> };
const { checkSqlNow } = (await import(pathToFileURL(sqlScript).href)) as { checkSqlNow(root: string): Result<SqlViolation> };
const { checkCycles } = (await import(pathToFileURL(cyclesScript).href)) as {
  checkCycles(root: string): { cycles: CycleEdge[][]; filesChecked: number };
};

const temps: string[] = [];
afterAll(() => temps.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** A temp project: package.json with an exports map plus the given files. */
function tree(files: Record<string, string>): string {
  const root = mkdtempSync(path.join(tmpdir(), "bc-checks-"));
  temps.push(root);
  const pkg = {
    name: "better-compute",
    type: "module",
    exports: { ".": "./core/index.ts", "./core": "./core/public.ts", "./conformance": "./core/conformance/index.ts" },
  };
  files = { "package.json": JSON.stringify(pkg), ...files };
  for (const [rel, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
    writeFileSync(path.join(root, rel), text);
  }
  return root;
}

/** Run a script as CI would; returns exit code and output. */
function cli(script: string, root: string): { code: number; out: string } {
  try {
    return { code: 0, out: execFileSync(process.execPath, [script, root], { encoding: "utf8", stdio: "pipe" }) };
  } catch (e) {
    const err = e as { status: number; stdout: string; stderr: string };
    return { code: err.status, out: err.stdout + err.stderr };
  }
}

// A tree that follows every import rule.
const cleanDeps = {
  "core/index.ts": "export * from './public.ts';\n",
  "core/public.ts": "import { z } from 'zod';\nexport const schema = z.string();\n",
  "core/db/internal.ts": "export const table = 'x';\n",
  "core/conformance/index.ts": "export { schema } from '../public.ts';\n",
  "plugins/metal/index.ts":
    "import { schema } from 'better-compute/core';\nimport { helper } from './lib/helper.ts';\nimport type { X } from 'better-compute';\nexport default { schema, helper };\n",
  "plugins/metal/lib/helper.ts": "import '../index.ts';\nexport const helper = 1;\n",
  "plugins/providers/hetzner/index.ts":
    "import { suite } from 'better-compute/conformance';\nimport { a } from './api/client.ts';\nexport { a, suite };\n",
  "plugins/providers/hetzner/api/client.ts": "export const a = await import('../index.ts');\n",
  "workers/api/index.ts":
    "import { table } from '../../core/db/internal.ts';\nimport metal from '../../plugins/metal/index.ts';\nexport { table, metal };\n",
  "durable-objects/host.ts": "export * from '../plugins/providers/hetzner/index.ts';\n",
  "agent/main.ts":
    "import { schema } from 'better-compute/core';\nimport { readFile } from 'node:fs/promises';\nimport { table } from '../core/db/internal.ts';\n",
  "test/extensions/acme/index.ts":
    "import { schema } from 'better-compute';\nimport { Hono } from 'hono';\nimport { util } from '../shared/util.ts';\n",
  "test/extensions/shared/util.ts": "export const util = 1;\n",
  "test/node/some.test.ts": "import { table } from '../../core/db/internal.ts';\nimport metal from '../../plugins/metal/index.ts';\n",
  // The test doubles stand on the product rooms; tests, bench and scripts use them.
  "testing/index.ts":
    "import { table } from '../core/db/internal.ts';\nimport metal from '../plugins/metal/index.ts';\nexport { table, metal };\n",
  "testing/sim.ts": "import { table } from '../core/db/internal.ts';\nexport const sim = table;\n",
  "local/stack.ts": "import { table } from '../core/db/internal.ts';\nexport const start = table;\n",
  "cli/main.ts": "import { start } from '../local/stack.ts';\nimport { schema } from 'better-compute/core';\nexport { start, schema };\n",
  "bench/run.ts": "import { sim } from '../testing/sim.ts';\nimport { start } from '../local/stack.ts';\nexport { sim, start };\n",
  "scripts/start.ts":
    "import { sim } from '../testing/sim.ts';\nimport { start } from '../local/stack.ts';\nimport { main } from '../cli/main.ts';\nimport { helper } from './helper.ts';\n",
  "scripts/helper.ts": "export const helper = 1;\n",
  // Commented-out imports and imports in strings-of-docs don't count.
  "plugins/vps/index.ts":
    "// import x from '../../core/db/internal.ts';\n/*\n import y from '../metal/index.ts';\n*/\nexport const url = 'https://example.com/x';\n",
};

describe("check-deps", () => {
  it("passes a clean tree", () => {
    const result = checkDeps(tree(cleanDeps));
    expect(result.violations).toEqual([]);
    expect(result.filesChecked).toBe(Object.keys(cleanDeps).length);
  });

  // [planted file, source, specifier that must be named]
  const planted: [string, string, string][] = [
    ["core/bad.ts", "import { x } from '../plugins/metal/index.ts';", "../plugins/metal/index.ts"],
    ["core/sub/bad.ts", "export * from '../../workers/api/index.ts';", "../../workers/api/index.ts"],
    ["core/dyn.ts", "const m = await import('../durable-objects/host.ts');", "../durable-objects/host.ts"],
    ["core/agent-dep.ts", "import '../agent/main.ts';", "../agent/main.ts"],
    ["core/test-dep.ts", "import type {\n  T,\n} from '../test/node/x.ts';", "../test/node/x.ts"],
    ["plugins/metal/bad.ts", "import { table } from '../../core/db/internal.ts';", "../../core/db/internal.ts"],
    ["plugins/metal/cross.ts", "export { helper } from '../vps/index.ts';", "../vps/index.ts"],
    ["plugins/providers/hetzner/cross.ts", "import x from '../aws/index.ts';", "../aws/index.ts"],
    ["plugins/metal/subpath.ts", "import { table } from 'better-compute/core/db/internal';", "better-compute/core/db/internal"],
    ["plugins/metal/workers.ts", "const w = import('../../workers/api/index.ts');", "../../workers/api/index.ts"],
    ["test/extensions/acme/bad.ts", "import { table } from '../../../core/db/internal.ts';", "../../../core/db/internal.ts"],
    ["test/extensions/acme/plugin.ts", "import metal from '../../../plugins/metal/index.ts';", "../../../plugins/metal/index.ts"],
    ["test/extensions/acme/private.ts", "import { x } from 'better-compute/internal';", "better-compute/internal"],
    ["agent/bad.ts", "import { app } from '../workers/api/index.ts';", "../workers/api/index.ts"],
    ["agent/do.ts", "export * from '../durable-objects/host.ts';", "../durable-objects/host.ts"],
    ["agent/plugin.ts", "import metal from '../plugins/metal/index.ts';", "../plugins/metal/index.ts"],
    // No product room imports the test doubles; nothing imports scripts/.
    ["core/doubles.ts", "import { x } from '../testing/index.ts';", "../testing/index.ts"],
    ["agent/doubles.ts", "import { FakeDaemon } from '../testing/index.ts';", "../testing/index.ts"],
    ["agent/doubles-by-name.ts", "import { FakeDaemon } from 'better-compute/testing';", "better-compute/testing"],
    ["plugins/metal/emulator.ts", "import { sim } from 'better-compute/testing/metal';", "better-compute/testing/metal"],
    ["workers/api/doubles.ts", "import { x } from '../../testing/sim.ts';", "../../testing/sim.ts"],
    ["durable-objects/doubles.ts", "import '../testing/sim.ts';", "../testing/sim.ts"],
    ["local/doubles.ts", "import { x } from '../testing/index.ts';", "../testing/index.ts"],
    ["cli/doubles.ts", "export * from '../testing/index.ts';", "../testing/index.ts"],
    ["local/agent.ts", "import '../agent/main.ts';", "../agent/main.ts"],
    ["testing/scripts.ts", "import { start } from '../scripts/start.ts';", "../scripts/start.ts"],
    ["test/metal/deep/scripts.test.ts", "import { start } from '../../../scripts/start.ts';", "../../../scripts/start.ts"],
    ["bench/scripts.ts", "const s = await import('../scripts/start.ts');", "../scripts/start.ts"],
    ["agent/scripts.ts", "import { runTs } from '../scripts/run-ts.mjs';", "../scripts/run-ts.mjs"],
  ];

  it.each(planted)("reports %s", (file, source, specifier) => {
    const { violations } = checkDeps(tree({ ...cleanDeps, [file]: `// planted\n${source}\n` }));
    expect(violations).toHaveLength(1);
    expect(violations[0]).toMatchObject({ file, specifier, line: source.includes("\n") ? 4 : 2 });
    expect(violations[0]!.rule).toBeTruthy();
  });

  it("reads the exports map at run time", () => {
    const root = tree({ ...cleanDeps, "plugins/metal/new.ts": "import { x } from 'better-compute/modules';\n" });
    expect(checkDeps(root).violations.map((v) => v.specifier)).toEqual(["better-compute/modules"]);
    const exports = {
      ".": "./core/index.ts",
      "./core": "./core/public.ts",
      "./conformance": "./core/conformance/index.ts",
      "./modules": "./core/modules.ts",
      "./providers/*": "./plugins/providers/*/index.ts",
    };
    const pkg = { name: "better-compute", exports };
    writeFileSync(path.join(root, "package.json"), JSON.stringify(pkg));
    writeFileSync(path.join(root, "plugins/metal/pattern.ts"), "import h from 'better-compute/providers/hetzner';\n");
    expect(checkDeps(root).violations).toEqual([]);
  });

  it("CLI: exit 1 with file:line on a planted tree, 0 on the repository", () => {
    const bad = cli(depsScript, tree({ ...cleanDeps, "plugins/metal/bad.ts": "import { table } from '../../core/db/internal.ts';\n" }));
    expect(bad.code).toBe(1);
    expect(bad.out).toContain("plugins/metal/bad.ts:1: plugins/metal imports ../../core/db/internal.ts:");
    const ok = cli(depsScript, repoRoot);
    expect(ok.out).toMatch(/OK, \d+ files checked/);
    expect(ok.code).toBe(0);
  });
});

// Clocks that must not appear in SQL, one per planted file line.
const clocks = [
  "now()",
  "NOW ( )",
  "current_timestamp",
  "LOCALTIMESTAMP",
  "transaction_timestamp()",
  "statement_timestamp()",
  "clock_timestamp()",
];

const cleanSql = {
  "migrations/0001_clock.sql": "create function compute_now() returns timestamptz language sql as $$ select now() $$; -- bc:allow-now\n",
  "migrations/0002_hosts.sql": "create table hosts (id text primary key, created_at timestamptz not null default compute_now());\n",
  "core/db/hosts.ts": "export const q = sql`update hosts set seen_at = compute_now ( ) where id = ${id}`;\nexport const t = Date.now();\n",
  "agent/main.ts":
    "const started = performance.now();\nconst later = clock?.now();\nclass C { #now() { return 0; } t() { return this.#now(); } }\n",
  // Comments may talk about the clocks.
  "migrations/0003_docs.sql": "-- never call now() directly\n/* nor current_timestamp,\n   clock_timestamp() */ select 1; /* now() */\n",
  "plugins/metal/docs.ts": "/**\n * Uses compute_now(), not now().\n */\nexport const x = 1; // not current_timestamp\n",
  // Outside the scanned directories: never looked at.
  "scripts/x.ts": "const s = 'select now()';\n",
  "test/node/x.test.ts": "const s = 'select now()';\n",
};

describe("check-sql-now", () => {
  it("passes a clean tree", () => {
    const result = checkSqlNow(tree(cleanSql));
    expect(result.violations).toEqual([]);
    expect(result.filesChecked).toBe(6);
  });

  const places = [
    "migrations/0009_bad.sql",
    "migrations/sub/0004_bad.sql",
    "core/db/bad.ts",
    "plugins/providers/hetzner/q.ts",
    "workers/api/q.ts",
    "durable-objects/host.ts",
    "agent/q.ts",
  ];
  it.each(places)("reports every clock in %s", (file) => {
    const lines = clocks.map((c) => (file.endsWith(".sql") ? `select ${c};` : `const q = sql\`select ${c}\`;`));
    const { violations } = checkSqlNow(tree({ ...cleanSql, [file]: `-- planted\n${lines.join("\n")}\n` }));
    const name = (s: string) => s.toLowerCase().replace(/[\s()]/g, "");
    expect(violations.map((v) => [v.file, v.line, name(v.match)])).toEqual(clocks.map((c, i) => [file, i + 2, name(c)]));
  });

  it("also reports the 'now' literal, and honours bc:allow-now only on its own line", () => {
    const root = tree({
      ...cleanSql,
      "migrations/0005.sql": "alter table hosts alter column created_at set default 'now';\nselect now(); -- bc:allow-now\nselect now();\n",
      "plugins/metal/q.ts": "const q = sql`select 'now'::timestamptz`;\nconst label = 'now';\n",
    });
    expect(checkSqlNow(root).violations.map((v) => `${v.file}:${v.line}`)).toEqual([
      "migrations/0005.sql:1",
      "migrations/0005.sql:3",
      "plugins/metal/q.ts:1",
    ]);
  });

  it("CLI: exit 1 with file:line on a planted tree, 0 on the repository", () => {
    const bad = cli(sqlScript, tree({ ...cleanSql, "workers/api/q.ts": "const a = 1;\nconst q = sql`select now()`;\n" }));
    expect(bad.code).toBe(1);
    expect(bad.out).toContain("workers/api/q.ts:2: now()");
    const ok = cli(sqlScript, repoRoot);
    expect(ok.out).toMatch(/OK, \d+ files checked/);
    expect(ok.code).toBe(0);
  });
});

// Value imports that form no cycle, and cycles that exist only in types (erased at run time).
const acyclic = {
  "core/index.ts": "export * from './public.ts';\nexport { table } from './db/table.ts';\n",
  "core/public.ts": "import { z } from 'zod';\nimport { table } from './db/table.ts';\nexport const schema = z.string();\n",
  "core/db/table.ts": "import type { Schema } from '../public.ts';\nexport const table = 'x';\n",
  // context ↔ contracts: each names the other's types only (three ways of saying so).
  "core/context.ts":
    "import { type Contract, type Kind } from './contracts.ts';\nexport type { Module } from './contracts.ts';\nexport const port = 1;\n",
  "core/contracts.ts":
    "import type { Port } from './context.ts';\nimport {\n  type Other,\n} from './context.ts';\nexport const contract = 1;\n",
  "plugins/metal/index.ts":
    "import { schema } from 'better-compute/core';\nimport type { X } from '../../core/testing-only.ts';\nexport const metal = schema;\n",
  // Imports quoted in strings and comments, and dynamic imports, are no edges.
  "core/docs.ts":
    "// import { metal } from '../plugins/metal/index.ts';\nexport const example = \"import { schema } from './docs.ts';\";\nexport const later = () => import('./docs.ts');\n",
};

describe("check-cycles", () => {
  it("passes a tree whose only cycles are in types", () => {
    const result = checkCycles(tree(acyclic));
    expect(result.cycles).toEqual([]);
    expect(result.filesChecked).toBe(Object.keys(acyclic).length);
  });

  // [planted files, the cycle as "file:line" edges from its first file (by name)]
  const planted: [string, Record<string, string>, string[]][] = [
    [
      "two files importing each other",
      {
        "core/api.ts": "import { readInput } from './agents/join.ts';\nexport const api = 1;\n",
        "core/agents/join.ts": "import { api } from '../api.ts';\nexport const readInput = 1;\n",
      },
      ["core/agents/join.ts:1", "core/api.ts:1"],
    ],
    [
      "a re-export closing a loop of three",
      {
        "core/a.ts": "import { b } from './b.ts';\n",
        "core/b.ts": "export * from './c.ts';\nexport const b = 1;\n",
        "core/c.ts": "\nexport { a } from './a.ts';\n",
      },
      ["core/a.ts:1", "core/b.ts:1", "core/c.ts:2"],
    ],
    [
      "a mixed clause (a value and a type)",
      { "core/x.ts": "import { y, type Y } from './y.ts';\n", "core/y.ts": "import x from './x.ts';\n" },
      ["core/x.ts:1", "core/y.ts:1"],
    ],
    [
      "a side-effect import",
      { "core/x.ts": "import './y.ts';\n", "core/y.ts": "import * as x from './x.ts';\n" },
      ["core/x.ts:1", "core/y.ts:1"],
    ],
    [
      "the package exports map",
      {
        "plugins/metal/index.ts": "import { schema } from 'better-compute/core';\nexport const metal = schema;\n",
        "core/public.ts": "import { metal } from '../plugins/metal/index.ts';\nexport const schema = metal;\n",
      },
      ["core/public.ts:1", "plugins/metal/index.ts:1"],
    ],
    ["a file importing itself", { "core/self.ts": "export const a = 1;\nimport { a as b } from './self.ts';\n" }, ["core/self.ts:2"]],
  ];

  it.each(planted)("reports %s", (_what, files, edges) => {
    const { cycles } = checkCycles(tree({ ...acyclic, ...files }));
    expect(cycles.map((cycle) => cycle.map((e) => `${e.file}:${e.line}`))).toEqual([edges]);
  });

  it("CLI: exit 1 naming the cycle on a planted tree, 0 on the repository", () => {
    const bad = cli(
      cyclesScript,
      tree({ ...acyclic, "core/db/table.ts": "import { schema } from '../public.ts';\nexport const table = schema;\n" }),
    );
    expect(bad.code).toBe(1);
    expect(bad.out).toContain(
      "import cycle: core/db/table.ts:1 imports ../public.ts → core/public.ts:2 imports ./db/table.ts → back to core/db/table.ts",
    );
    const ok = cli(cyclesScript, repoRoot);
    expect(ok.out).toMatch(/OK, \d+ files checked/);
    expect(ok.code).toBe(0);
  });
});
