// `npm start` as a newcomer runs it: the embedded stack comes up, answers health and the
// OpenAPI document, the printed admin key works, and its data survives a restart.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { freePort } from "../../scripts/local/stack.ts";
import { repoRoot } from "../../scripts/local/node-store.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-start-"));
afterAll(() => fs.rmSync(dataDir, { recursive: true, force: true }));

interface Started {
  url: string;
  key: string;
  /** Ctrl-C, then resolves once npm has exited. */
  stop(): Promise<void>;
}

async function npmStart(args: string[] = []): Promise<Started> {
  const port = await freePort();
  // Its own process group, so Ctrl-C (SIGINT to the group) reaches npm, tsx and wrangler.
  const child = spawn("npm", ["start", ...(args.length ? ["--", ...args] : [])], { cwd: repoRoot, env: { ...process.env, PORT: String(port), BC_DATA_DIR: dataDir, DATABASE_URL: "" }, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout!.on("data", (d) => (output += d));
  child.stderr!.on("data", (d) => (output += d));
  const key = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm start printed no key within 120 s:\n${output}`)), 120_000);
    const poll = setInterval(() => {
      const match = /admin API key \(shown once\): (bck_\S+)/.exec(output);
      if (match) {
        clearInterval(poll);
        clearTimeout(timer);
        resolve(match[1]!);
      } else if (child.exitCode !== null) {
        clearInterval(poll);
        clearTimeout(timer);
        reject(new Error(`npm start exited with ${child.exitCode}:\n${output}`));
      }
    }, 100);
  });
  expect(output).toContain(`running at http://127.0.0.1:${port}`);
  return { url: `http://127.0.0.1:${port}`, key, stop: () => interrupt(child) };
}

function interrupt(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.once("exit", () => resolve());
    process.kill(-child.pid!, "SIGINT");
  });
}

/** After Ctrl-C nothing of the stack is left listening. */
async function expectStopped(url: string) {
  await expect(fetch(`${url}/v1/health`, { signal: AbortSignal.timeout(2_000) })).rejects.toThrow();
}

const listModules = (url: string, key: string) =>
  fetch(`${url}/v1/modules.list`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: "{}" });

describe("npm start", () => {
  let firstKey = "";

  it("serves health, the OpenAPI document and the modules to the printed key", async () => {
    const stack = await npmStart();
    try {
      const health = await fetch(`${stack.url}/v1/health`);
      expect(health.status).toBe(200);
      expect(await health.json()).toMatchObject({ status: "ok", database: "reachable" });

      const openapi = await fetch(`${stack.url}/openapi.json`);
      expect(openapi.status).toBe(200);
      expect(Object.keys(((await openapi.json()) as { paths: object }).paths)).toContain("/v1/modules.list");

      const modules = await listModules(stack.url, stack.key);
      expect(modules.status).toBe(200);
      expect(((await modules.json()) as { modules: { id: string }[] }).modules.map((m) => m.id)).toContain("core");
      expect((await listModules(stack.url, "bck_0000000000000000_" + "x".repeat(43))).status).toBe(401);
      firstKey = stack.key;
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
    expect(fs.existsSync(path.join(dataDir, "pglite"))).toBe(true);
  });

  it("keeps its data under the data dir across a restart, and joins simulated agents with --sim", async () => {
    expect(firstKey).not.toBe("");
    const stack = await npmStart(["--sim", "2"]);
    try {
      expect(stack.key).not.toBe(firstKey);
      expect((await listModules(stack.url, firstKey)).status).toBe(200);
      const nodes = await fetch(`${stack.url}/v1/nodes.list`, { method: "POST", headers: { authorization: `Bearer ${stack.key}`, "content-type": "application/json" }, body: JSON.stringify({ state: "connected" }) });
      const connected = ((await nodes.json()) as { nodes: { labels: Record<string, string> }[] }).nodes;
      expect(connected.filter((n) => n.labels["bc.dev/simulated"] === "true")).toHaveLength(2);
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
  });
});
