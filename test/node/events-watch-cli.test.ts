// `better-compute events watch` as an operator runs it (spawned) against the local stack (wrangler
// dev, PGlite): events printed as they are published, and across a restart of the stack the
// command reconnects with Last-Event-ID and goes on with nothing missed and nothing printed twice.
import { execFile, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { repoRoot } from "../../local/node-store.ts";
import { freePort, startStack, type Stack } from "../../local/stack.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-watch-cli-"));
let stack: Stack;
let port: number;
const connected = () => ({ ...process.env, BC_URL: stack.url, BC_API_KEY: stack.adminKey, BC_DATA_DIR: dataDir });
const bin = path.join(repoRoot, "scripts/better-compute.mjs");

beforeAll(async () => {
  port = await freePort();
  stack = await startStack({ dataDir, port });
}, 180_000);
afterAll(async () => {
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { env: connected(), timeout: 60_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

/** `events watch` in the background: its stdout lines as they come, and its exit. */
function watching(args: string[]) {
  const child = spawn(process.execPath, [bin, "events", "watch", ...args], { env: connected() });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise<number>((resolve) => child.on("close", (code) => resolve(code ?? 1)));
  return { exited, lines: () => stdout.trim().split("\n").filter(Boolean), stderr: () => stderr, kill: () => child.kill() };
}

async function mintKeys(names: string[]): Promise<void> {
  for (const name of names) expect((await cli(["iam", "apiKeys", "create", "--name", name, "--roles", "viewer"])).code).toBe(0);
}

async function lastPosition(): Promise<string> {
  const { stdout } = await cli(["events", "list", "--order", "desc", "--limit", "1", "--json"]);
  return JSON.parse(stdout).events[0]?.position ?? "0";
}

describe("better-compute events watch", () => {
  it("prints each event once, in order, and goes on across a restart of the API", async () => {
    const start = await lastPosition();
    const watch = watching(["--type", "iam.apiKey.*", "--after", start, "--count", "4", "--json"]);
    try {
      await mintKeys(["w-1", "w-2"]);
      await until(() => watch.lines().length >= 2);
      // The API goes away and comes back (same data, same port): the command reconnects on its own.
      await stack.stop();
      stack = await startStack({ dataDir, port });
      await mintKeys(["w-3", "w-4"]);
      expect(await watch.exited).toBe(0);
    } finally {
      watch.kill();
    }
    const printed = watch.lines().map((l) => JSON.parse(l));
    // In commit order, as watch prints them (the CLI lists the newest first unless told).
    const listed = JSON.parse(
      (await cli(["events", "list", "--type", "iam.apiKey.*", "--after", start, "--order", "asc", "--json"])).stdout,
    ).events;
    expect(printed).toEqual(listed.slice(0, 4));
    expect(printed.map((e: any) => e.data.name)).toEqual(["w-1", "w-2", "w-3", "w-4"]);
    expect(watch.stderr()).toMatch(/reconnecting/);
  }, 240_000);

  it("prints one line per event for a human, and a refused query as the API's error", async () => {
    const start = await lastPosition();
    await mintKeys(["w-human"]);
    const human = await cli(["events", "watch", "--type", "iam.apiKey.created", "--after", start, "--count", "1"]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(
      /^\d+ {2}\S+ {2}iam\.apiKey\.created {2}apiKeys\/[0-9a-f]{16} {2}apikey:[0-9a-f]{16} {2}id=.*name=w-human,roles=\[viewer\]\n$/,
    );

    const refused = await cli(["events", "watch", "--type", "not a type"]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /^error INVALID_ARGUMENT: the query does not match events\.watch's parameters: type: .*\(request id [0-9a-f-]+\)\n$/,
    );
    expect((await cli(["events", "watch", "--colour", "red"])).code).toBe(2);
  }, 120_000);
});

async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((r) => setTimeout(r, 100));
}
