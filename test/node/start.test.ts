// `npm start` as a newcomer runs it: the embedded stack comes up, answers health and the
// OpenAPI document, the printed admin key works, its data and its key survive a restart, and a
// second stack on the same data dir or port is refused before it touches anything.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { freePort } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-start-"));
const otherDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-start-other-"));
afterAll(() => {
  for (const dir of [dataDir, otherDir]) fs.rmSync(dir, { recursive: true, force: true });
});

interface Started {
  url: string;
  key: string;
  /** Everything npm start printed so far. */
  output(): string;
  /** Ctrl-C, then resolves once npm has exited. */
  stop(): Promise<void>;
}

function spawnNpmStart(args: string[], env: { port: number; dataDir: string }): { child: ChildProcess; output: () => string } {
  // Its own process group, so Ctrl-C (SIGINT to the group) reaches npm, tsx and wrangler.
  const child = spawn("npm", ["start", ...(args.length ? ["--", ...args] : [])], {
    cwd: repoRoot,
    env: { ...process.env, PORT: String(env.port), BC_DATA_DIR: env.dataDir, DATABASE_URL: "" },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout!.on("data", (d) => (output += d));
  child.stderr!.on("data", (d) => (output += d));
  return { child, output: () => output };
}

async function npmStart(args: string[] = [], dir = dataDir): Promise<Started> {
  const port = await freePort();
  const { child, output } = spawnNpmStart(args, { port, dataDir: dir });
  const key = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm start printed no key within 120 s:\n${output()}`)), 120_000);
    const poll = setInterval(() => {
      const match = /admin API key \((?:new|reused)[^)]*\): (bck_\S+)/.exec(output());
      if (match) {
        clearInterval(poll);
        clearTimeout(timer);
        resolve(match[1]!);
      } else if (child.exitCode !== null) {
        clearInterval(poll);
        clearTimeout(timer);
        reject(new Error(`npm start exited with ${child.exitCode}:\n${output()}`));
      }
    }, 100);
  });
  expect(output()).toContain(`running at http://127.0.0.1:${port}`);
  return { url: `http://127.0.0.1:${port}`, key, output, stop: () => interrupt(child) };
}

/** npm start that is expected to refuse: resolves with its exit code and output. */
async function npmStartRefused(env: { port: number; dataDir: string }): Promise<{ code: number | null; output: string }> {
  const { child, output } = spawnNpmStart([], env);
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { code, output: output() };
}

function interrupt(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.once("exit", () => resolve());
    process.kill(-child.pid!, "SIGINT");
  });
}

/** After Ctrl-C nothing of the stack is left listening, and its lock and local.json are gone. */
async function expectStopped(url: string, dir = dataDir) {
  await expect(fetch(`${url}/v1/health`, { signal: AbortSignal.timeout(2_000) })).rejects.toThrow();
  expect(fs.existsSync(path.join(dir, "lock"))).toBe(false);
  expect(fs.existsSync(path.join(dir, "local.json"))).toBe(false);
}

const mode = (file: string) => fs.statSync(file).mode & 0o777;

const listModules = (url: string, key: string) =>
  fetch(`${url}/v1/modules.list`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: "{}",
  });

describe("npm start", () => {
  let firstKey = "";

  it("serves health, the OpenAPI document and the modules to the printed key, and tells the CLI where it runs", async () => {
    const stack = await npmStart();
    try {
      expect(stack.output()).toMatch(/admin API key \(new, kept in [^)]*admin-key\)/);
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

      // While it runs: local.json (for the CLI) and the kept admin key, readable by their owner only.
      const local = path.join(dataDir, "local.json");
      expect(JSON.parse(fs.readFileSync(local, "utf8"))).toMatchObject({ url: stack.url, adminKey: stack.key, pid: expect.any(Number) });
      expect(mode(local)).toBe(0o600);
      expect(fs.readFileSync(path.join(dataDir, "admin-key"), "utf8").trim()).toBe(stack.key);
      expect(mode(path.join(dataDir, "admin-key"))).toBe(0o600);
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
    expect(fs.existsSync(path.join(dataDir, "pglite"))).toBe(true);
  });

  it("keeps its data and reuses its admin key across a restart, and joins simulated agents with --sim", async () => {
    expect(firstKey).not.toBe("");
    const stack = await npmStart(["--sim", "2"]);
    try {
      expect(stack.key).toBe(firstKey);
      expect(stack.output()).toMatch(/admin API key \(reused from [^)]*admin-key; --new-admin-key mints another\)/);
      const nodes = await fetch(`${stack.url}/v1/nodes.list`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.key}`, "content-type": "application/json" },
        body: JSON.stringify({ state: "connected" }),
      });
      const connected = ((await nodes.json()) as { nodes: { labels: Record<string, string> }[] }).nodes;
      expect(connected.filter((n) => n.labels["bc.dev/simulated"] === "true")).toHaveLength(2);
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
  });

  it("refuses a second stack on the same data dir, and a busy port, before touching anything", async () => {
    const stack = await npmStart();
    try {
      const lockBefore = fs.readFileSync(path.join(dataDir, "lock"), "utf8");
      const localBefore = fs.readFileSync(path.join(dataDir, "local.json"), "utf8");

      const second = await npmStartRefused({ port: await freePort(), dataDir });
      expect(second.code).toBe(1);
      const holder = Number(lockBefore.trim());
      expect(second.output).toContain(`another Better Compute stack (pid ${holder}) is using ${dataDir}; stop it or set BC_DATA_DIR\n`);
      expect(second.output).not.toMatch(/at .*\.ts:\d+|wrangler/); // no stack trace, nothing started
      expect(fs.readFileSync(path.join(dataDir, "lock"), "utf8")).toBe(lockBefore);
      expect(fs.readFileSync(path.join(dataDir, "local.json"), "utf8")).toBe(localBefore);
      expect((await fetch(`${stack.url}/v1/health`)).status).toBe(200);

      const port = Number(new URL(stack.url).port);
      const busy = await npmStartRefused({ port, dataDir: otherDir });
      expect(busy.code).toBe(1);
      expect(busy.output).toContain(`port ${port} on 127.0.0.1 is already in use`);
      expect(fs.readdirSync(otherDir)).toEqual([]);
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
  });

  it("reports a port held by another program the same way", async () => {
    const server = net.createServer();
    const port = await new Promise<number>((resolve) =>
      server.listen(0, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port)),
    );
    try {
      const busy = await npmStartRefused({ port, dataDir: otherDir });
      expect(busy.code).toBe(1);
      expect(busy.output).toContain(
        `port ${port} on 127.0.0.1 is already in use (another stack, or another program); stop it or choose another port`,
      );
      expect(fs.readdirSync(otherDir)).toEqual([]);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("takes over the lock of a stack that is gone, and mints a new admin key when asked", async () => {
    // A pid that existed and has exited: what a crashed stack leaves behind.
    const gone = spawn(process.execPath, ["-e", ""]);
    await new Promise((r) => gone.once("exit", r));
    fs.writeFileSync(path.join(dataDir, "lock"), `${gone.pid}\n`);

    const stack = await npmStart(["--new-admin-key"]);
    try {
      expect(stack.output()).toContain(`the stack that held it (pid ${gone.pid}) is gone`);
      expect(stack.key).not.toBe(firstKey);
      expect(stack.output()).toMatch(/admin API key \(new, kept in /);
      expect(fs.readFileSync(path.join(dataDir, "admin-key"), "utf8").trim()).toBe(stack.key);
      expect((await listModules(stack.url, stack.key)).status).toBe(200);
    } finally {
      await stack.stop();
    }
    await expectStopped(stack.url);
  });
});
