// FileState: the agent's key, identity and command journal on disk. Survives a restart
// (a new store and client on the same directory), files are 0600, the join token is never
// written, a torn journal line does not lose the next record.
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentClient } from "../../agent/client.ts";
import { FakeNodeServer } from "../../testing/fake-server.ts";
import { FileState } from "../../agent/file-state.ts";
import { nodeTransport } from "../../agent/node-transport.ts";
import type { CommandHandler } from "../../agent/client.ts";

let server: FakeNodeServer;
const dirs: string[] = [];
beforeAll(async () => {
  server = await FakeNodeServer.start();
});
afterAll(async () => {
  await server.close();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

function stateDir(): string {
  const d = mkdtempSync(path.join(tmpdir(), "bc-agent-state-"));
  dirs.push(d);
  return path.join(d, "state"); // not created yet: FileState makes it
}

function client(state: FileState, handlers: Record<string, CommandHandler> = {}): AgentClient {
  return new AgentClient({ transport: nodeTransport(), state, handlers, backoff: { initialMs: 10, maxMs: 50 } });
}

const mode = (file: string) => statSync(file).mode & 0o777;

describe("FileState", () => {
  it("survives a restart: same identity and key, redeliveries answered from the journal; files are 0600", async () => {
    const dir = stateDir();
    const token = server.token();
    let calls = 0;
    const handlers = { count: async () => ({ call: ++calls, at: Date.now() }) };

    const s1 = new FileState(dir);
    const a = client(s1, handlers);
    const identity = await a.join({ baseUrl: server.url, attestor: "join-token", evidence: { token }, role: "ramdisk" });
    void a.run();
    await a.waitConnected();
    const cmd = server.enqueue(identity.nodeId, { kind: "count", key: "k-durable" });
    await server.waitFor(() => !!cmd.result);
    await a.stop();
    await s1.close();

    // a new process: nothing shared but the directory
    const s2 = new FileState(dir);
    expect(await s2.loadIdentity()).toEqual(identity);
    const b = client(s2, handlers);
    expect(await b.publicKey()).toBe(server.node(identity.nodeId).publicKey);
    void b.run();
    await b.waitConnected();
    server.resend(cmd.id);
    await server.waitFor(() => cmd.results.length === 2);
    expect(cmd.results[1]!.frame).toEqual(cmd.results[0]!.frame);
    expect(calls).toBe(1);
    expect(b.counters.replayed).toBe(1);
    expect(server.hellos.filter((h) => h.nodeId === identity.nodeId).map((h) => h.verified)).toEqual([true, true]);
    await b.stop();
    await s2.close();

    expect(mode(dir)).toBe(0o700);
    const files = readdirSync(dir).sort();
    expect(files).toEqual(["identity.json", "journal.jsonl", "key.jwk"]); // no temp files left behind
    for (const f of files) expect(mode(path.join(dir, f))).toBe(0o600);
    // the join token was sent and never written
    for (const f of files) expect(readFileSync(path.join(dir, f), "utf8")).not.toContain(token);
    expect(JSON.parse(readFileSync(path.join(dir, "key.jwk"), "utf8"))).toMatchObject({
      kty: "OKP",
      crv: "Ed25519",
      d: expect.any(String),
    });
  });

  it("a command in flight when the process died is INTERRUPTED in the next one, never rerun", async () => {
    const dir = stateDir();
    const s1 = new FileState(dir);
    const a = client(s1, { flash: () => new Promise(() => {}) }); // never finishes, ignores its signal
    const { nodeId } = await a.join({ baseUrl: server.url, attestor: "join-token", evidence: { token: server.token() }, role: "node" });
    void a.run();
    await a.waitConnected();
    const cmd = server.enqueue(nodeId, { kind: "flash", key: "k-flash" });
    await server.waitFor(() => cmd.acks === 1);
    await server.waitFor(() => readFileSync(path.join(dir, "journal.jsonl"), "utf8").includes("k-flash"));
    await a.stop({ graceMs: 10 });
    await s1.close();

    let ran = 0;
    const s2 = new FileState(dir);
    expect(await s2.journal("k-flash")).toMatchObject({ state: "started", id: cmd.id, kind: "flash" });
    const b = client(s2, { flash: async () => ++ran });
    void b.run();
    await server.waitFor(() => !!cmd.result);
    expect(cmd.result).toMatchObject({ ok: false, error: { code: "INTERRUPTED" } });
    expect(cmd.results[0]!.verified).toBe(true);
    expect(ran).toBe(0);
    await b.stop();
    await s2.close();
    // recorded: a third process answers the same, still without running it
    const s3 = new FileState(dir);
    expect(await s3.journal("k-flash")).toMatchObject({ state: "done", result: { ok: false, error: { code: "INTERRUPTED" } } });
    await s3.close();
  });

  it("a torn last journal line is skipped and does not swallow the next record", async () => {
    const dir = stateDir();
    const s1 = new FileState(dir);
    await s1.journalStarted({ key: "k1", id: "c1", kind: "x" });
    await s1.close();
    const file = path.join(dir, "journal.jsonl");
    writeFileSync(file, `${readFileSync(file, "utf8")}{"key":"k2","id":"c2","sta`); // died mid-write

    const s2 = new FileState(dir);
    expect(await s2.journal("k1")).toMatchObject({ state: "started" });
    expect(s2.skippedLines).toBe(1);
    await s2.journalDone({ key: "k3", id: "c3", kind: "x", result: { t: "result", id: "c3", key: "k3", ok: true, output: 1 } });
    await s2.close();

    const s3 = new FileState(dir);
    expect((await s3.entries()).map((r) => [r.key, r.state])).toEqual([
      ["k1", "started"],
      ["k3", "done"],
    ]);
    expect(s3.skippedLines).toBe(1);
    await s3.close();
  });

  it("identity and key are replaced atomically and stay 0600 under a permissive umask", async () => {
    const dir = stateDir();
    const old = process.umask(0o000);
    try {
      const s = new FileState(dir);
      await s.saveIdentity({ nodeId: "n1", role: "site", credential: "c1", expiresAt: "2030-01-01T00:00:00.000Z" });
      await s.saveIdentity({ nodeId: "n1", role: "site", credential: "c2", expiresAt: "2030-01-02T00:00:00.000Z" });
      await s.saveKey({ kty: "OKP", crv: "Ed25519", x: "x", d: "d" });
      await s.journalStarted({ key: "k", id: "i", kind: "x" });
      await s.close();
      const again = new FileState(dir);
      expect((await again.loadIdentity())?.credential).toBe("c2");
      await again.close();
      expect(readdirSync(dir).sort()).toEqual(["identity.json", "journal.jsonl", "key.jwk"]);
      for (const f of readdirSync(dir)) expect(mode(path.join(dir, f))).toBe(0o600);
    } finally {
      process.umask(old);
    }
  });
});
