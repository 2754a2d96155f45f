// Roles (agent/roles/*.ts) implement the contract in agent/contracts.ts and never load the client
// (agent/client.ts): each role is imported in a fresh Node that records every module it loads,
// and the import graph from every role (type-only imports, relative paths and better-compute/...
// through package.json "exports" included) never reaches agent/client.ts.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
// Loaded by URL: the script is plain .mjs without type declarations.
const { findImports } = (await import(pathToFileURL(path.join(repoRoot, "scripts/check-deps.mjs")).href)) as {
  findImports(src: string): { specifier: string; line: number }[];
};

const roles = readdirSync(path.join(repoRoot, "agent/roles"))
  .filter((f) => f.endsWith(".ts"))
  .map((f) => `agent/roles/${f}`);

/** Every project file reachable from `from` (root-relative), following relative and package self-imports. */
function reachable(root: string, from: string): Set<string> {
  const pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8")) as { name: string; exports: Record<string, string> };
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const { specifier } of findImports(readFileSync(path.join(root, file), "utf8"))) {
      let target: string | undefined;
      if (specifier.startsWith(".")) target = path.posix.normalize(path.posix.join(path.posix.dirname(file), specifier));
      else if (specifier === pkg.name || specifier.startsWith(`${pkg.name}/`)) {
        const sub = `.${specifier.slice(pkg.name.length)}`;
        const entry = pkg.exports[sub];
        if (!entry) throw new Error(`${file} imports ${specifier}, which package.json does not export`);
        target = path.posix.normalize(entry);
      }
      if (target) visit(target); // anything else is an npm package or a node: builtin
    }
  };
  visit(from);
  return seen;
}

/** The project files a fresh Node loads to import `file` (value imports only: TypeScript drops the type-only ones). */
function loadedBy(file: string): string[] {
  const script = `
    import { registerHooks } from "node:module";
    const loaded = new Set();
    registerHooks({ resolve(specifier, context, next) { const r = next(specifier, context); loaded.add(r.url); return r; } });
    await import(${JSON.stringify(pathToFileURL(path.join(repoRoot, file)).href)});
    console.log(JSON.stringify([...loaded]));`;
  const out = execFileSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: repoRoot, encoding: "utf8" });
  return (JSON.parse(out.trim().split("\n").at(-1)!) as string[])
    .filter((u) => u.startsWith("file:"))
    .map((u) => path.relative(repoRoot, fileURLToPath(u)).split(path.sep).join("/"));
}

const temps: string[] = [];
afterAll(() => temps.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe("a role loads only the contract module", () => {
  it("there are roles to check", () => {
    expect(roles).toEqual(
      expect.arrayContaining(["agent/roles/site.ts", "agent/roles/boot.ts", "agent/roles/ramdisk.ts", "agent/roles/http-proxy.ts"]),
    );
  });

  // The roles that implement handlers (the others are helpers: tls-pin, image-cache).
  it.each(["agent/roles/site.ts", "agent/roles/boot.ts", "agent/roles/ramdisk.ts", "agent/roles/http-proxy.ts", "agent/roles/redfish.ts"])(
    "importing %s loads agent/contracts.ts and not agent/client.ts",
    (role) => {
      const loaded = loadedBy(role);
      expect(loaded).toContain(role);
      expect(loaded).toContain("agent/contracts.ts");
      expect(loaded).not.toContain("agent/client.ts");
    },
  );

  it.each(roles)("no import of %s, type-only ones included, reaches agent/client.ts", (role) => {
    const files = reachable(repoRoot, role);
    expect(files.has("agent/client.ts")).toBe(false);
  });

  it("the walk follows package self-imports: a role that reaches the client through better-compute/testing is caught", () => {
    const root = mkdtempSync(path.join(tmpdir(), "bc-roles-"));
    temps.push(root);
    const files: Record<string, string> = {
      "package.json": JSON.stringify({ name: "better-compute", exports: { "./testing": "./agent/testing.ts" } }),
      "agent/contracts.ts": "export class AgentError extends Error {}\n",
      "agent/client.ts": "export { AgentError } from './contracts.ts';\n",
      "agent/testing.ts": "import type { AgentError } from './client.ts';\nexport type E = AgentError;\n",
      "agent/roles/clean.ts": "import { z } from 'zod';\nimport { AgentError } from '../contracts.ts';\n",
      "agent/roles/leaky.ts": "import { AgentError } from '../contracts.ts';\nimport type { E } from 'better-compute/testing';\n",
    };
    for (const [rel, text] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
      writeFileSync(path.join(root, rel), text);
    }
    expect(reachable(root, "agent/roles/clean.ts").has("agent/client.ts")).toBe(false);
    expect([...reachable(root, "agent/roles/leaky.ts")]).toEqual([
      "agent/roles/leaky.ts",
      "agent/contracts.ts",
      "agent/testing.ts",
      "agent/client.ts",
    ]);
  });
});
