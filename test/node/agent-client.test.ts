// AgentClient against a protocol-faithful fake of the control plane (testing/fake-server.ts):
// the hello proof, commands in order and at most once per key, the journal answering
// redeliveries, INTERRUPTED after a restart, reconnects with backoff after cuts, REVOKED,
// heartbeats, renewal, result signatures and size, and that no secret reaches the logs.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { AgentClient, AgentError, inLane, localExpiry, type AgentClientOptions, type CommandHandler } from "../../agent/client.ts";
import { FakeNodeServer } from "../../testing/fake-server.ts";
import { nodeTransport } from "../../agent/node-transport.ts";
import { MemoryState, type AgentStateStore } from "../../agent/state.ts";
import { FakeDaemon } from "../../testing/index.ts";
import { CloseCode, MAX_FRAME_BYTES, PROTOCOL_VERSION, generateNodeKey, resultMessage, verifyMessage } from "../../core/protocol.ts";

let server: FakeNodeServer;
const clients: AgentClient[] = [];

beforeAll(async () => {
  server = await FakeNodeServer.start();
});
afterAll(async () => {
  await server.close();
});
afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.stop({ graceMs: 50 })));
  Object.assign(server, {
    redeliver: true,
    ackResults: true,
    answerPings: true,
    deliver: true,
    refuse: undefined,
    unavailableResults: 0,
    credentialTtlMs: 3_600_000,
  });
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Options = Partial<Omit<AgentClientOptions, "transport" | "state">> & { state?: AgentStateStore };

function client(opts: Options = {}): AgentClient {
  const c = new AgentClient({
    transport: nodeTransport(),
    state: opts.state ?? new MemoryState(),
    baseUrl: server.url,
    backoff: { initialMs: 10, maxMs: 80, healthyAfterMs: 200 },
    ...opts,
  });
  clients.push(c);
  return c;
}

/** Join with a fresh token, start run(), wait for the welcome. */
async function joined(opts: Options = {}): Promise<{ c: AgentClient; nodeId: string; run: Promise<void> }> {
  const c = client(opts);
  const { nodeId } = await c.join({ attestor: "join-token", evidence: { token: server.token() }, role: "node" });
  const run = c.run();
  run.catch(() => {});
  await c.waitConnected(5_000);
  return { c, nodeId, run };
}

const done = (cmd: { result?: unknown }) => () => cmd.result !== undefined;

describe("joining and the hello", () => {
  it("join proves possession of the key; the hello's signature verifies against it", async () => {
    const labels = { rack: "r1", zone: "a" };
    const drivers = [{ id: "redfish", version: "1.2.0" }];
    const { c, nodeId } = await joined({ labels, drivers, version: "9.9.9" });
    const join = server.joins.at(-1)!;
    expect(join.status).toBe(200);
    expect(server.node(nodeId).publicKey).toBe(await c.publicKey());

    const hello = server.hellos.filter((h) => h.nodeId === nodeId);
    expect(hello).toHaveLength(1);
    expect(hello[0]!.verified).toBe(true);
    expect(hello[0]!.frame).toMatchObject({
      protocol: PROTOCOL_VERSION,
      role: "node",
      version: "9.9.9",
      bootId: c.bootId,
      labels,
      drivers,
    });
  });

  it("a hello signed with another key is refused with PROOF_FAILED (and the client keeps trying)", async () => {
    const state = new MemoryState();
    const c = client({ state });
    const { nodeId } = await c.join({ attestor: "join-token", evidence: { token: server.token() }, role: "node" });
    await state.saveKey((await generateNodeKey()).privateJwk); // the identity now holds a key the server never saw
    const impostor = client({ state });
    void impostor.run().catch(() => {});
    await server.waitFor(() => server.hellos.filter((h) => h.nodeId === nodeId).length >= 2, 5_000, "two hellos");
    expect(server.hellos.filter((h) => h.nodeId === nodeId).every((h) => !h.verified)).toBe(true);
    await server.waitFor(
      () => server.connections.filter((x) => x.closeCode === CloseCode.PROOF_FAILED && x.closedBy === "server").length >= 2,
      5_000,
      "two PROOF_FAILED closes",
    );
    expect(impostor.connected).toBe(false);
  });

  it("a hello the protocol would refuse (a label over 253 characters) stops the client with INVALID_CONFIG", async () => {
    const c = client({ labels: { note: "x".repeat(254) } });
    await c.join({ attestor: "join-token", evidence: { token: server.token() }, role: "node" });
    const attempts = server.attempts.length;
    await expect(c.run()).rejects.toMatchObject({ code: "INVALID_CONFIG", message: expect.stringContaining("labels.note") });
    expect(server.attempts.length).toBe(attempts + 1);
    expect(server.connections.at(-1)!.closeCode).not.toBe(CloseCode.MALFORMED_FRAME);
  });

  it("a refused join throws the server's code and message", async () => {
    const c = client();
    const err = await c
      .join({ attestor: "join-token", evidence: { token: "bcjt_not-a-real-token" }, role: "node" })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentError);
    expect(err).toMatchObject({ code: "UNAUTHENTICATED", status: 401, message: "the join token is invalid, expired or already used" });
    // and a token is single use
    const token = server.token();
    await c.join({ attestor: "join-token", evidence: { token }, role: "node" });
    await expect(client().join({ attestor: "join-token", evidence: { token }, role: "node" })).rejects.toMatchObject({
      code: "UNAUTHENTICATED",
    });
  });

  it("neither the join token nor the credential reaches the logs or the state", async () => {
    const lines: string[] = [];
    const logger = {
      info: (m: string, f?: object) => lines.push(m + JSON.stringify(f)),
      warn: (m: string, f?: object) => lines.push(m + JSON.stringify(f)),
      error: (m: string, f?: object) => lines.push(m + JSON.stringify(f)),
    };
    const state = new MemoryState();
    const token = server.token();
    const c = client({ state, logger, heartbeatMs: 20 });
    const identity = await c.join({ attestor: "join-token", evidence: { token }, role: "node" });
    void c.run().catch(() => {});
    await c.waitConnected();
    await c.renew();
    c.dropConnection();
    await server.waitFor(() => c.counters.connects >= 2, 5_000, "a reconnect");
    const cmd = server.enqueue(identity.nodeId, { kind: "nope", body: { token } });
    await server.waitFor(done(cmd));
    const everything = lines.join("\n");
    expect(lines.length).toBeGreaterThan(4);
    expect(everything).not.toContain(token);
    expect(everything).not.toContain(identity.credential);
    expect(everything).not.toContain(c.identity!.credential);
    const stored = JSON.stringify([await state.loadIdentity(), await state.loadKey(), await state.entries()]);
    expect(stored).not.toContain(token);
  });
});

describe("commands", () => {
  it("run in order, one at a time, each result signed", async () => {
    let running = 0;
    let most = 0;
    const seen: number[] = [];
    const work: CommandHandler = async (body) => {
      most = Math.max(most, ++running);
      await sleep(Number(body.ms));
      seen.push(Number(body.n));
      running--;
      return { n: body.n };
    };
    const { c, nodeId } = await joined({ handlers: { work } });
    const cmds = [30, 1, 20, 5, 12, 0, 8].map((ms, n) => server.enqueue(nodeId, { kind: "work", body: { ms, n } }));
    await server.waitFor(() => cmds.every((x) => x.result), 5_000, "all results");
    expect(seen).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(most).toBe(1);
    expect(c.counters.executed).toBe(7);
    for (const [n, cmd] of cmds.entries()) {
      expect(cmd.acks).toBe(1);
      expect(cmd.results).toHaveLength(1);
      expect(cmd.results[0]!.verified).toBe(true);
      expect(cmd.result).toMatchObject({ ok: true, output: { n } });
    }
    // the signature covers the output: a changed output no longer verifies
    const r = cmds[3]!.result!;
    const pk = server.node(nodeId).publicKey;
    expect(await verifyMessage(pk, await resultMessage(nodeId, r), r.signature!)).toBe(true);
    expect(await verifyMessage(pk, await resultMessage(nodeId, { ...r, output: { n: 4 } }), r.signature!)).toBe(false);
  });

  it("lanes: one lane's commands run in seq order, different lanes side by side, at most maxConcurrentCommands at once", async () => {
    let running = 0;
    let most = 0;
    const order = new Map<string, number[]>();
    // One lane per machine, as the site agent's BMC commands are: a slow machine holds up only itself.
    const work = inLane(
      (body) => String(body.machine),
      async (body) => {
        most = Math.max(most, ++running);
        await sleep(Number(body.ms));
        order.set(String(body.machine), [...(order.get(String(body.machine)) ?? []), Number(body.n)]);
        running--;
        return { n: body.n };
      },
    );
    const serial: CommandHandler = async (body) => ({ n: body.n });
    const { nodeId } = await joined({ handlers: { work, serial }, maxConcurrentCommands: 3 });
    const slow = [0, 1, 2].map((n) => server.enqueue(nodeId, { kind: "work", body: { machine: "slow", ms: 150, n } }));
    const fast = [0, 1, 2, 3, 4, 5].map((n) => server.enqueue(nodeId, { kind: "work", body: { machine: `fast-${n % 3}`, ms: 5, n } }));
    const plain = server.enqueue(nodeId, { kind: "serial", body: { n: 9 } });
    await server.waitFor(() => fast.every((x) => x.result) && plain.result !== undefined, 5_000, "the fast lanes and the default lane");
    // the fast machines and the default lane finished while the slow machine was still on its first or second command
    expect(slow.filter((x) => x.result).length).toBeLessThan(3);
    await server.waitFor(() => slow.every((x) => x.result), 5_000, "the slow lane");
    expect(order.get("slow")).toEqual([0, 1, 2]);
    for (const lane of ["fast-0", "fast-1", "fast-2"])
      expect(order.get(lane)).toEqual(fast.map((_, n) => n).filter((n) => `fast-${n % 3}` === lane));
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(3);
    for (const cmd of [...slow, ...fast, plain]) expect(cmd.results).toHaveLength(1);
  });

  it("a redelivered key is answered from the journal without running again", async () => {
    let calls = 0;
    const { c, nodeId } = await joined({ handlers: { once: async () => ({ call: ++calls }) } });
    const cmd = server.enqueue(nodeId, { kind: "once", key: "k-redeliver" });
    await server.waitFor(done(cmd));
    server.resend(cmd.id);
    await server.waitFor(() => cmd.results.length === 2);
    expect(cmd.results[1]!.frame).toEqual(cmd.results[0]!.frame);

    // the same key under another command id: the recorded outcome, re-signed for the new id
    const again = server.enqueue(nodeId, { kind: "once", key: "k-redeliver" });
    await server.waitFor(done(again));
    expect(again.result).toMatchObject({ id: again.id, ok: true, output: { call: 1 } });
    expect(again.results[0]!.verified).toBe(true);
    expect(calls).toBe(1);
    expect(c.counters.replayed).toBe(2);
    expect(c.counters.executed).toBe(1);
  });

  it("a redelivery of a command still running is acknowledged and answered when it finishes", async () => {
    let release!: () => void;
    let calls = 0;
    const { nodeId } = await joined({ handlers: { slow: () => (calls++, new Promise((r) => (release = () => r({ slow: true })))) } });
    const cmd = server.enqueue(nodeId, { kind: "slow" });
    await server.waitFor(() => cmd.acks === 1);
    server.resend(cmd.id);
    await server.waitFor(() => cmd.acks === 2);
    release();
    await server.waitFor(done(cmd));
    await sleep(30);
    expect(calls).toBe(1);
    expect(cmd.results).toHaveLength(1);
  });

  it("a command started but not finished before a restart is reported INTERRUPTED, never rerun", async () => {
    const state = new MemoryState();
    let firstCalls = 0;
    const first = await joined({ state, handlers: { hang: () => (firstCalls++, new Promise(() => {})) } });
    const cmd = server.enqueue(first.nodeId, { kind: "hang", key: "k-hang" });
    await server.waitFor(() => cmd.acks === 1);
    await first.c.stop({ graceMs: 20 }); // the handler ignores its signal: the journal still says started
    expect(await state.journal("k-hang")).toMatchObject({ state: "started" });

    let secondCalls = 0;
    const second = client({ state, handlers: { hang: async () => (secondCalls++, "ran") } });
    void second.run().catch(() => {});
    await server.waitFor(done(cmd));
    expect(cmd.result).toMatchObject({ ok: false, error: { code: "INTERRUPTED" } });
    expect(cmd.results[0]!.verified).toBe(true);
    expect(firstCalls).toBe(1);
    expect(secondCalls).toBe(0);
    expect(second.counters.interrupted).toBe(1);
    expect(await state.journal("k-hang")).toMatchObject({ state: "done", result: { error: { code: "INTERRUPTED" } } });
  });

  it("handler errors, unknown kinds and deadlines become signed failed results", async () => {
    const { nodeId } = await joined({
      handlers: {
        coded: () => {
          throw Object.assign(new Error("the disk is on fire"), { code: "DRIVER_ERROR" });
        },
        plain: async () => {
          throw new Error("no");
        },
        wait: (_b, { signal }) => new Promise((_r, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
        never: () => {
          throw new Error("must not run");
        },
      },
    });
    const coded = server.enqueue(nodeId, { kind: "coded" });
    const plain = server.enqueue(nodeId, { kind: "plain" });
    const unknown = server.enqueue(nodeId, { kind: "metal.flash" });
    const late = server.enqueue(nodeId, { kind: "wait", deadline: new Date(Date.now() + 60).toISOString() });
    const past = server.enqueue(nodeId, { kind: "never", deadline: new Date(Date.now() - 1000).toISOString() });
    await server.waitFor(() => [coded, plain, unknown, late, past].every((x) => x.result), 5_000, "results");
    expect(coded.result).toMatchObject({ ok: false, error: { code: "DRIVER_ERROR", message: "the disk is on fire" } });
    expect(plain.result).toMatchObject({ ok: false, error: { code: "HANDLER_ERROR", message: "no" } });
    expect(unknown.result).toMatchObject({ ok: false, error: { code: "UNSUPPORTED" } });
    expect(late.result).toMatchObject({ ok: false, error: { code: "DEADLINE_EXCEEDED" } });
    expect(past.result).toMatchObject({ ok: false, error: { code: "DEADLINE_EXCEEDED" } });
    expect(past.acks).toBe(0);
    for (const x of [coded, plain, unknown, late, past]) expect(x.results[0]!.verified).toBe(true);
  });

  it("a result over MAX_FRAME_BYTES is replaced by RESULT_TOO_LARGE; one just under goes as is", async () => {
    const { nodeId } = await joined({ handlers: { blob: (body) => ({ data: "x".repeat(Number(body.n)) }) } });
    const fits = server.enqueue(nodeId, { kind: "blob", body: { n: MAX_FRAME_BYTES - 400 } });
    const big = server.enqueue(nodeId, { kind: "blob", body: { n: MAX_FRAME_BYTES } });
    await server.waitFor(() => !!(fits.result && big.result), 5_000, "results");
    expect(fits.result).toMatchObject({ ok: true });
    expect((fits.result!.output as { data: string }).data).toHaveLength(MAX_FRAME_BYTES - 400);
    expect(big.result).toMatchObject({ ok: false, error: { code: "RESULT_TOO_LARGE" } });
    expect(big.results[0]!.verified).toBe(true);
    expect(server.connections.some((x) => x.closeCode === CloseCode.FRAME_TOO_LARGE)).toBe(false);
  });
});

describe("connection loss", () => {
  it("a socket cut mid-stream reconnects, and every command runs exactly once, in order", async () => {
    const runs = new Map<string, number>();
    const order: number[] = [];
    const { c, nodeId } = await joined({
      handlers: {
        step: async (body, { key }) => {
          runs.set(key, (runs.get(key) ?? 0) + 1);
          order.push(Number(body.n));
          await sleep(4);
          return { n: body.n };
        },
      },
    });
    const cmds = Array.from({ length: 40 }, (_, n) => server.enqueue(nodeId, { kind: "step", body: { n } }));
    for (let cut = 0; cut < 8 && !cmds.every((x) => x.result); cut++) {
      await sleep(15);
      if (cut % 2)
        server.kill(nodeId); // the network drops (server side)...
      else c.dropConnection(); // ...or the agent's side
    }
    await server.waitFor(() => cmds.every((x) => x.result), 10_000, "all results");
    expect(c.counters.disconnects).toBeGreaterThanOrEqual(4);
    expect(c.counters.connects).toBeGreaterThanOrEqual(4);
    expect([...runs.values()].every((n) => n === 1)).toBe(true);
    expect(runs.size).toBe(40);
    expect(order).toEqual(cmds.map((_, n) => n));
    for (const cmd of cmds) {
      expect(cmd.result).toMatchObject({ ok: true, output: { n: cmd.body.n } });
      expect(cmd.results.every((r) => r.verified && r.frame.ok)).toBe(true);
    }
  });

  it("reconnect delays are full-jitter exponential, capped, and reset after a healthy session", async () => {
    const delays: number[] = [];
    const { c } = await joined({ random: () => 1, backoff: { initialMs: 10, maxMs: 80, healthyAfterMs: 150 } });
    c.on("reconnecting", (r) => delays.push(r.delayMs));
    server.refuse = { status: 503, code: "UNAVAILABLE", message: "the node object is restarting" };
    const before = server.attempts.length;
    await sleep(200); // healthy: the next failure starts from initialMs
    c.dropConnection();
    await server.waitFor(() => delays.length >= 6, 5_000, "six retries");
    expect(delays.slice(0, 6)).toEqual([10, 20, 40, 80, 80, 80]);
    const at = server.attempts.slice(before).map((a) => a.at);
    for (let i = 1; i < 5; i++) expect(at[i]! - at[i - 1]!).toBeGreaterThanOrEqual(delays[i]! - 2);
    expect(c.counters.connectFailures).toBeGreaterThanOrEqual(5);

    // a healthy session resets the bound
    server.refuse = undefined;
    await server.waitFor(() => c.connected, 5_000, "reconnect");
    await sleep(200);
    const n = delays.length;
    c.dropConnection();
    await server.waitFor(() => delays.length > n);
    expect(delays[n]).toBe(10);

    // with real jitter the delay is anywhere below the bound
    const jittered = await joined({ random: () => 0.25, backoff: { initialMs: 40, maxMs: 80 } });
    const d2: number[] = [];
    jittered.c.on("reconnecting", (r) => d2.push(r.delayMs));
    jittered.c.dropConnection();
    await server.waitFor(() => d2.length > 0);
    expect(d2[0]).toBe(10);
  });

  it("results without result-ack are sent again after a reconnect", async () => {
    server.ackResults = false;
    server.redeliver = false;
    let calls = 0;
    const { c, nodeId } = await joined({ handlers: { one: async () => ({ call: ++calls }) } });
    const cmd = server.enqueue(nodeId, { kind: "one" });
    await server.waitFor(done(cmd));
    c.dropConnection();
    await server.waitFor(() => cmd.results.length === 2, 5_000, "the resend");
    expect(cmd.deliveries).toBe(1);
    expect(cmd.results[1]!.frame).toEqual(cmd.results[0]!.frame);
    expect(c.counters.resultsResent).toBe(1);

    server.ackResults = true;
    server.resend(cmd.id); // answered from the journal, and acknowledged this time
    await server.waitFor(() => cmd.results.length === 3 && c.counters.resultAcks === 1);
    c.dropConnection();
    await server.waitFor(() => c.counters.connects === 3);
    await sleep(30);
    expect(cmd.results).toHaveLength(3);
    expect(calls).toBe(1);
  });

  it("a result refused as UNAVAILABLE is offered again on the same socket", async () => {
    const { c, nodeId } = await joined({ random: () => 1, backoff: { initialMs: 10, maxMs: 40 } });
    server.unavailableResults = 2;
    const cmd = server.enqueue(nodeId, { kind: "unknown.kind" });
    await server.waitFor(done(cmd), 3_000, "the result to be taken");
    expect(c.counters.serverErrors).toBe(2);
    expect(c.counters.resultsResent).toBe(2);
    expect(c.counters.connects).toBe(1);
  });

  it("a silent control plane is noticed by the heartbeat and the socket replaced", async () => {
    const { c } = await joined({ heartbeatMs: 25, deadAfterMs: 80 });
    const pings = server.pings;
    await sleep(120);
    expect(server.pings - pings).toBeGreaterThanOrEqual(3);
    expect(c.counters.disconnects).toBe(0); // PONGs keep it alive
    server.answerPings = false;
    await server.waitFor(() => c.counters.disconnects >= 1, 2_000, "the drop");
    server.answerPings = true;
    await server.waitFor(() => c.connected, 2_000, "the reconnect");
    expect(c.counters.connects).toBe(2);
  });

  it("a REVOKED close stops the client for good and surfaces it", async () => {
    const state = new MemoryState();
    const { c, nodeId, run } = await joined({ state });
    const fatal: AgentError[] = [];
    c.on("fatal", (e) => fatal.push(e));
    const attempts = server.attempts.length;
    server.revoke(nodeId);
    await expect(run).rejects.toMatchObject({ code: "REVOKED" });
    expect(fatal.map((e) => e.code)).toEqual(["REVOKED"]);
    await sleep(200);
    expect(server.attempts.length).toBe(attempts);
    expect(c.running).toBe(false);

    // a restarted agent is refused at the upgrade (HTTP 403 PERMISSION_DENIED, as the gateway does) and stops too
    const again = client({ state });
    await expect(again.run()).rejects.toMatchObject({ code: "REVOKED", status: 403 });
    expect(server.attempts.length).toBe(attempts + 1);
  });

  it("stop() closes with 1000 and run() resolves", async () => {
    const { c, nodeId, run } = await joined();
    await c.stop();
    await expect(run).resolves.toBeUndefined();
    const conn = server.connections.filter((x) => x.nodeId === nodeId);
    expect(conn.map((x) => [x.closeCode, x.closedBy])).toEqual([[1000, "agent"]]);
  });
});

describe("credential renewal", () => {
  it("renews at 2/3 of the lifetime with a signed request, saves it, and connects with it", async () => {
    server.credentialTtlMs = 1_200;
    const state = new MemoryState();
    const c = client({ state });
    const first = await c.join({ attestor: "join-token", evidence: { token: server.token() }, role: "node" });
    const joinedAt = Date.now();
    void c.run().catch(() => {});
    const renewed = await new Promise<number>((resolve) => c.on("renewed", () => resolve(Date.now())));
    expect(renewed - joinedAt).toBeGreaterThanOrEqual(750); // 2/3 of 1200 ms
    expect(renewed - joinedAt).toBeLessThan(1_050);
    expect(server.renewals.at(-1)).toMatchObject({ nodeId: first.nodeId, status: 200 });
    const saved = (await state.loadIdentity())!;
    expect(saved.credential).toBe(server.node(first.nodeId).credential);
    expect(saved.credential).not.toBe(first.credential);

    // keeps renewing; after the first credential expired, a reconnect presents the new one
    await sleep(joinedAt + 1_300 - Date.now());
    expect(c.counters.renewals).toBeGreaterThanOrEqual(1);
    c.dropConnection();
    await server.waitFor(() => c.counters.connects >= 2, 3_000, "reconnect");
    expect(server.connections.at(-1)!.authorization).toBe(`Bearer ${c.identity!.credential}`);
    expect(c.fatalError).toBeUndefined();
  });
});

describe("credential renewal, refused", () => {
  it("a renewal refused because the node was revoked stops the client with REVOKED", async () => {
    server.credentialTtlMs = 300;
    const { c, nodeId, run } = await joined();
    server.node(nodeId).revoked = true; // revoked while the socket happens to stay up
    await expect(run).rejects.toMatchObject({ code: "REVOKED", status: 403 });
    expect(server.renewals.at(-1)).toMatchObject({ nodeId, status: 403, code: "PERMISSION_DENIED" });
    expect(c.connected).toBe(false);
  });

  it("renewal is timed by the credential's own lifetime (JWT iat..exp), not a skewed expiresAt", () => {
    const claims = btoa(JSON.stringify({ iat: 1_000, exp: 4_600 })).replace(/=+$/, "");
    const identity = {
      nodeId: "n",
      role: "node" as const,
      credential: `h.${claims}.s`,
      expiresAt: "2030-01-01T00:00:00.000Z",
      obtainedAt: "2026-01-01T00:00:00.000Z",
    };
    const from = Date.parse(identity.obtainedAt);
    expect(localExpiry(identity, 0)).toEqual({ from, expires: from + 3_600_000 });
    expect(localExpiry({ ...identity, credential: "opaque" }, 0)).toEqual({ from, expires: Date.parse(identity.expiresAt) });
  });
});

describe("FakeDaemon", () => {
  it("joins, connects, runs handlers, and reconnects after kill()", async () => {
    for (const transport of [undefined, nodeTransport()]) {
      const d = new FakeDaemon({
        baseUrl: server.url,
        role: "site",
        ...(transport ? { transport } : {}),
        handlers: { "agent.ping": () => ({ pong: true }) },
      });
      await d.join(server.token());
      const { nodeId } = await d.connect();
      expect(nodeId).toBe(d.nodeId);
      const a = server.enqueue(nodeId, { kind: "agent.ping", key: "a" });
      await server.waitFor(() => d.client.counters.resultAcks === 1);
      d.kill();
      await d.reconnected();
      const b = server.enqueue(nodeId, { kind: "agent.ping", key: "b" });
      await server.waitFor(done(b));
      server.resend(a.id);
      await server.waitFor(() => a.results.length === 2);
      expect(d.executed.map((e) => e.key)).toEqual(["a", "b"]);
      expect(d.results.map((r) => r.key)).toEqual(["a", "b", "a"]);
      expect(server.node(nodeId).role).toBe("site");
      await d.stop();
      expect(d.fatal).toBeUndefined();
    }
  });
});
