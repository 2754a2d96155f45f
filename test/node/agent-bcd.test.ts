// The bcd CLI as an operator runs it, in real processes against the fake control plane:
// usage errors exit 2, refusals print the server's code and message and exit 1, join keeps
// the token out of the state directory, run serves the built-in handlers and stops cleanly
// on SIGTERM, and a restarted bcd answers a redelivered key from its journal.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { main } from "../../agent/bcd.ts";
import { runBcd, spawnBcd } from "../../local/bcd-process.ts";
import { FakeNodeServer } from "../../testing/fake-server.ts";

let server: FakeNodeServer;
const temps: string[] = [];
const children: ChildProcess[] = [];

beforeAll(async () => {
  server = await FakeNodeServer.start();
});
afterAll(async () => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  await server.close();
  temps.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

function tempDir(): string {
  const d = mkdtempSync(path.join(tmpdir(), "bc-bcd-"));
  temps.push(d);
  return d;
}

interface Proc {
  child: ChildProcess;
  out: () => string;
  err: () => string;
  exited: Promise<number>;
}

/** bcd running in a process of its own; exited answers its exit code (128 when a signal ended it, as runBcd's). */
function start(args: string[], env: Record<string, string> = {}): Proc {
  const bcd = spawnBcd(args, { env });
  children.push(bcd.process);
  return {
    child: bcd.process,
    out: () => bcd.output("stdout"),
    err: () => bcd.output("stderr"),
    exited: bcd.exited.then(({ code }) => code ?? 128),
  };
}

/** main() in this process, with stdout and stderr captured. */
async function inProcess(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = "";
  let err = "";
  const o = vi.spyOn(process.stdout, "write").mockImplementation((chunk) => ((out += String(chunk)), true));
  const e = vi.spyOn(process.stderr, "write").mockImplementation((chunk) => ((err += String(chunk)), true));
  try {
    return { code: await main(args), out, err };
  } finally {
    o.mockRestore();
    e.mockRestore();
  }
}

describe("bcd", () => {
  it("usage errors exit 2; running before joining exits 1", async () => {
    const dir = tempDir();
    const none = await inProcess([]);
    expect(none.code).toBe(2);
    expect(none.err).toContain("usage:");
    expect(await inProcess(["help"])).toMatchObject({ code: 0, err: expect.stringContaining("usage:") });
    expect(await inProcess(["frobnicate", "--state-dir", dir])).toMatchObject({
      code: 2,
      err: expect.stringContaining("unknown command: frobnicate"),
    });
    expect(await inProcess(["run", "--state-dir", dir, "--bogus"])).toMatchObject({ code: 2, err: expect.stringContaining("--bogus") });
    expect(await inProcess(["run"])).toMatchObject({ code: 2, err: expect.stringContaining("--state-dir is required") });
    expect(await inProcess(["join", "--token", "t", "--role", "node", "--state-dir", dir])).toMatchObject({
      code: 2,
      err: expect.stringContaining("join needs --url"),
    });
    expect(await inProcess(["join", "--url", "ftp://x", "--token", "t", "--role", "node", "--state-dir", dir])).toMatchObject({
      code: 2,
      err: expect.stringContaining("--url must be http"),
    });
    expect(await inProcess(["join", "--url", server.url, "--token", "t", "--role", "toaster", "--state-dir", dir])).toMatchObject({
      code: 2,
      err: expect.stringContaining("--role site|node|ramdisk"),
    });
    expect(
      await inProcess(["join", "--url", server.url, "--token", "t", "--attestor", "discovery", "--role", "node", "--state-dir", dir]),
    ).toMatchObject({ code: 2, err: expect.stringContaining("--attestor wants join-token|provisioned|x509pop|cloud-iid|") });
    expect(await inProcess(["join", "--url", server.url, "--role", "node", "--state-dir", dir])).toMatchObject({
      code: 2,
      err: expect.stringContaining("needs --token"),
    });
    expect(await inProcess(["run", "--state-dir", dir, "--label", "novalue"])).toMatchObject({
      code: 2,
      err: expect.stringContaining("KEY=VALUE"),
    });
    const notJoined = await inProcess(["run", "--state-dir", path.join(dir, "empty")]);
    expect(notJoined.code).toBe(1);
    expect(notJoined.err).toContain("bcd: run failed: NOT_JOINED");
  });

  it("a refused join prints the server's code and message, not the token, and exits 1", async () => {
    const dir = tempDir();
    const r = await inProcess(["join", "--url", server.url, "--token", "bcjt_wrong-token-1234", "--role", "node", "--state-dir", dir]);
    expect(r.code).toBe(1);
    expect(r.err).toContain("bcd: join failed: UNAUTHENTICATED: the join token is invalid, expired or already used (HTTP 401)");
    expect(r.err + r.out).not.toContain("bcjt_wrong-token-1234");
    expect(readdirSync(dir).filter((f) => f !== "journal.jsonl")).toEqual(["key.jwk"]); // the key, no identity
    // the control plane unreachable: a clear error, exit 1
    const down = await inProcess(["join", "--url", "http://127.0.0.1:9", "--token", "t", "--role", "node", "--state-dir", dir]);
    expect(down.code).toBe(1);
    expect(down.err).toContain("bcd: join failed: UNAVAILABLE: join: cannot reach http://127.0.0.1:9");
  });

  it("join, run, SIGTERM, run again: the restarted agent answers a redelivered key from its journal", async () => {
    const dir = path.join(tempDir(), "state");
    const token = server.token();
    const tokenFile = path.join(tempDir(), "token");
    writeFileSync(tokenFile, `${token}\n`);
    const joined = await runBcd([
      "join",
      "--url",
      server.url,
      "--token-file",
      tokenFile,
      "--role",
      "site",
      "--state-dir",
      dir,
      "--hostname",
      "edge-7",
    ]);
    expect(joined.code).toBe(0);
    expect(joined.err).not.toContain(token);
    expect(joined.err).not.toContain('"level":"error"');
    const nodeId = /joined as (\S+) \(site\)/.exec(joined.out)?.[1];
    expect(nodeId).toBeDefined();
    expect(server.node(nodeId!)).toMatchObject({ role: "site", hostname: "edge-7" });
    for (const f of readdirSync(dir)) {
      expect(statSync(path.join(dir, f)).mode & 0o777).toBe(0o600);
      expect(readFileSync(path.join(dir, f), "utf8")).not.toContain(token);
    }

    // first run: the URL comes from the saved identity
    const first = start(["run", "--state-dir", dir, "--label", "rack=r7"]);
    await server.waitFor(() => server.node(nodeId!).socket !== undefined, 15_000, "bcd to connect");
    const ping = server.enqueue(nodeId!, { kind: "agent.ping", key: "k-ping" });
    const info = server.enqueue(nodeId!, { kind: "agent.info" });
    await server.waitFor(() => !!(ping.result && info.result), 5_000, "results");
    const hello1 = server.hellos.filter((h) => h.nodeId === nodeId).at(-1)!;
    expect(hello1.verified).toBe(true);
    expect(hello1.frame.labels).toEqual({ rack: "r7" });
    expect(ping.result).toMatchObject({ ok: true, output: { pong: true, bootId: hello1.frame.bootId } });
    expect(info.result).toMatchObject({ ok: true, output: { role: "site", version: hello1.frame.version, hostname: expect.any(String) } });
    expect(ping.results[0]!.verified && info.results[0]!.verified).toBe(true);

    first.child.kill("SIGTERM");
    expect(await first.exited).toBe(0);
    expect(server.connections.filter((c) => c.nodeId === nodeId).at(-1)).toMatchObject({ closeCode: 1000, closedBy: "agent" });
    expect(first.err()).not.toContain(token);
    expect(first.err()).not.toContain(server.node(nodeId!).credential);

    // second run: a new boot; the same key (under a new command id) is not run again
    const second = start(["run", "--state-dir", dir]);
    await server.waitFor(() => server.hellos.filter((h) => h.nodeId === nodeId).length === 2, 15_000, "bcd to reconnect");
    const hello2 = server.hellos.filter((h) => h.nodeId === nodeId).at(-1)!;
    expect(hello2.verified).toBe(true);
    expect(hello2.frame.bootId).not.toBe(hello1.frame.bootId);
    const again = server.enqueue(nodeId!, { kind: "agent.ping", key: "k-ping" });
    const fresh = server.enqueue(nodeId!, { kind: "agent.ping", key: "k-ping-2" });
    await server.waitFor(() => !!(again.result && fresh.result), 5_000, "results");
    expect(again.result).toMatchObject({ id: again.id, ok: true, output: { pong: true, bootId: hello1.frame.bootId } });
    expect(again.results[0]!.verified).toBe(true);
    expect(fresh.result).toMatchObject({ ok: true, output: { bootId: hello2.frame.bootId } });

    second.child.kill("SIGINT");
    expect(await second.exited).toBe(0);
    const journal = readFileSync(path.join(dir, "journal.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { key: string; state: string });
    expect(journal.filter((r) => r.key === "k-ping").map((r) => r.state)).toEqual(["started", "done"]);
  });

  it("start joins when there is no identity, then runs; a revoked node exits 1 with REVOKED", async () => {
    const dir = path.join(tempDir(), "state");
    const p = start(["start", "--url", server.url, "--role", "node", "--state-dir", dir, "--quiet"], { BC_JOIN_TOKEN: server.token() });
    await server.waitFor(() => /joined as (\S+)/.test(p.out()), 15_000, "the join");
    const nodeId = /joined as (\S+)/.exec(p.out())![1]!;
    await server.waitFor(() => server.node(nodeId).socket !== undefined, 15_000, "bcd to connect");
    server.revoke(nodeId);
    expect(await p.exited).toBe(1);
    expect(p.err()).toContain("REVOKED");
  });
});
