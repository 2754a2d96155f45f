// The docs smoke test: every shell block in README.md and docs/**/*.md runs here, against a started
// stack, as a reader would paste it (the blocks of one file in order, in one shell, so a variable
// or function one block defines serves the next). A block that cannot run here says why on its
// first line, `# not run here: <reason>`, and the reason names the test that runs it instead
// (a path under test/) or is one this file accepts (DEPLOYS).
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { repoRoot } from "../../local/node-store.ts";
import { sharedStack, type SharedStack } from "../support/shared-stack.ts";

const DOCUMENTED_URL = "http://127.0.0.1:8787";
/** Reasons accepted without a test: what needs a Cloudflare account or a machine this is not. */
const ACCEPTED_REASONS = [/^needs a Cloudflare account/, /^runs on the machine being managed/];
const SHELL = /^```(sh|bash|shell|console)\b/;
/** What a runnable block must never do here: reinstall this checkout, start a second stack, deploy. */
const NEVER_RUN =
  /\bnpm (ci|install|start|test)\b|\bnpm run (dev|bcd|migrate|mint-key|deploy)\b|\bwrangler (deploy|secret)\b|\bbcd (start|run|join)\b/;

interface Block {
  file: string;
  line: number;
  text: string;
  skipped?: string;
}

function shellBlocks(file: string): Block[] {
  const lines = fs.readFileSync(path.join(repoRoot, file), "utf8").split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = lines[i]!.match(/^(\s*)```/);
    if (!open) continue;
    const shell = SHELL.test(lines[i]!.trim());
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]!); i++) body.push(lines[i]!.slice(open[1]!.length));
    if (!shell) continue;
    const skipped = /^#\s*not run here:\s*(.+)$/.exec(body[0] ?? "")?.[1];
    blocks.push({ file, line: start + 1, text: body.join("\n"), ...(skipped ? { skipped } : {}) });
  }
  return blocks;
}

const files = [
  "README.md",
  ...fs
    .readdirSync(path.join(repoRoot, "docs"), { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => `docs/${f.split(path.sep).join("/")}`),
];
const blocksByFile = new Map(files.map((f) => [f, shellBlocks(f)]));

describe("every shell block in the docs", () => {
  it("is run here, or says which test runs it", () => {
    for (const block of [...blocksByFile.values()].flat()) {
      const where = `${block.file}:${block.line}`;
      if (!block.skipped) {
        const commands = block.text.replace(/(^|\s)#.*$/gm, ""); // what a comment mentions is not run
        expect(
          NEVER_RUN.exec(commands)?.[0],
          `${where} would run this in the checkout: mark it "# not run here: <the test that runs it>"`,
        ).toBeUndefined();
        continue;
      }
      const named = /\btest\/[\w./-]+\.test\.ts\b/.exec(block.skipped)?.[0];
      if (named) expect(fs.existsSync(path.join(repoRoot, named)), `${where} names ${named}, which does not exist`).toBe(true);
      else
        expect(
          ACCEPTED_REASONS.some((r) => r.test(block.skipped!)),
          `${where}: "${block.skipped}" names no test that runs it`,
        ).toBe(true);
    }
  });

  // The node project's shared stack (cli.test.ts uses it too): the blocks make what they read.
  describe("runs against a started stack", () => {
    let stack: SharedStack;

    beforeAll(async () => {
      stack = await sharedStack();
    }, 120_000);

    for (const [file, blocks] of blocksByFile) {
      const runnable = blocks.filter((b) => !b.skipped);
      if (runnable.length === 0) continue;
      it(`${file} (${runnable.length} blocks)`, async () => {
        const script = [
          "set -euo pipefail",
          // A reader sees an HTTP error; the test must too.
          'curl() { command curl --fail-with-body -sS "$@"; echo; }',
          // What `npx better-compute` runs, without npm's start-up for every line.
          `better-compute() { node ${JSON.stringify(path.join(repoRoot, "scripts", "better-compute.mjs"))} "$@"; }`,
          ...runnable.map((b) => `echo "::block ${b.file}:${b.line}" >&2\n${b.text.replaceAll(DOCUMENTED_URL, stack.url)}`),
        ].join("\n");
        const result = await runBash(script, {
          KEY: stack.adminKey,
          BC_URL: stack.url,
          BC_API_KEY: stack.adminKey,
          BC_DATA_DIR: stack.dataDir,
        });
        const failedAt = [...result.stderr.matchAll(/::block (\S+)/g)].pop()?.[1];
        expect(
          result.code,
          `${file} failed in the block at ${failedAt}:\n${result.stdout.slice(-3000)}\n${result.stderr.slice(-3000)}`,
        ).toBe(0);
      }, 300_000);
    }
  });
});

function runBash(script: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn("bash", ["-c", script], { cwd: repoRoot, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}
