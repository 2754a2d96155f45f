// The agent endpoint against an attacker on the network (issue 29): a stolen credential without
// its key, frames disguised to slip past the size limits, one socket flooding its NodeDO, a
// replayed renewal and a join whose signature does not cover its token. The real JoinService,
// gateway and NodeDO, with a raw peer that misbehaves on purpose.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { betterCompute, definePlugin } from "../core/index.ts";
import {
  CloseCode,
  generateNodeKey,
  JOIN_PATH,
  joinMessage,
  RENEW_PATH,
  renewMessage,
  resultMessage,
  signMessage,
} from "../core/protocol.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { connectRaw, fetcher, joinRaw, type RawAgent } from "./support/raw-agent.ts";
import { nodeRoundTrips } from "./support/worker.ts";

const testKinds = definePlugin({ id: "test-kinds", commands: [{ kind: "test.echo", input: z.object({ n: z.number() }) }] });
const compute = betterCompute({ plugins: [testKinds] });
let client: TestClient;
const logs: string[] = [];

beforeAll(async () => {
  for (const method of ["log", "warn", "error"] as const) {
    const original = console[method].bind(console);
    vi.spyOn(console, method).mockImplementation((...args: unknown[]) => {
      logs.push(args.map(String).join(" "));
      original(...args);
    });
  }
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

async function joined() {
  const token = (await client.call("siteTokens.create", { site: "lab" })).body.token as string;
  const res = await joinRaw(compute, env, token);
  expect(res.res.status).toBe(200);
  return { nodeId: res.body.nodeId as string, credential: res.body.credential as string, key: res.key };
}

async function welcomed(identity: Awaited<ReturnType<typeof joined>>): Promise<RawAgent> {
  const agent = await connectRaw(compute, env, identity);
  await agent.hello();
  await agent.next("welcome");
  return agent;
}

const send = (nodeId: string, body: object = { n: 1 }) => client.call("commands.create", { node: nodeId, kind: "test.echo", body });

/** A command round trip through the agent's socket: the socket is live and served. */
async function roundTrip(agent: RawAgent): Promise<void> {
  const created = await send(agent.nodeId);
  expect(created.status).toBe(200);
  const command = await agent.next("command", (c) => c.id === created.body.id);
  await agent.result(command, true, { n: 1 });
  await agent.next("result-ack", (a) => a.id === command.id);
}

const eventsOf = async (nodeId: string) =>
  (await client.store.db.execute(sql`SELECT type, data FROM bc_events WHERE subject = ${`nodes/${nodeId}`} ORDER BY id`)).rows as {
    type: string;
    data: Record<string, unknown>;
  }[];

describe("a stolen credential without its key", () => {
  it("opens sockets that displace nothing; a verified hello from the node's key replaces the old socket", async () => {
    const identity = await joined();
    const agent = await welcomed(identity);
    const sessionId = (await eventsOf(identity.nodeId)).find((e) => e.type === "node.connected")!.data.sessionId;

    // The thief has the credential and not the key: six sockets that never say hello, one whose
    // hello is signed by another key.
    const thieves: RawAgent[] = [];
    for (let i = 0; i < 6; i++) {
      const thief = await connectRaw(compute, env, identity);
      await thief.next("challenge");
      thieves.push(thief);
    }
    const forger = await connectRaw(compute, env, { ...identity, key: await generateNodeKey() });
    await forger.hello();
    expect((await forger.closed).code).toBe(CloseCode.PROOF_FAILED);
    // At most four sockets wait for a hello: the oldest went.
    expect((await thieves[0]!.closed).code).toBe(CloseCode.HELLO_REQUIRED);

    // The agent never noticed.
    await roundTrip(agent);
    expect((await client.call("nodes.get", { node: identity.nodeId })).body).toMatchObject({ state: "connected" });
    expect((await eventsOf(identity.nodeId)).map((e) => e.type)).toEqual(["node.joined", "node.connected", "command.succeeded"]);

    // A real reconnect (the agent's key) replaces the old socket, with no disconnection between.
    const reconnected = await welcomed(identity);
    expect((await agent.closed).code).toBe(CloseCode.REPLACED);
    await roundTrip(reconnected);
    const events = await eventsOf(identity.nodeId);
    expect(events.map((e) => e.type)).toEqual([
      "node.joined",
      "node.connected",
      "command.succeeded",
      "node.connected",
      "command.succeeded",
    ]);
    expect(events[3]!.data.sessionId).not.toBe(sessionId);
    for (const thief of thieves) thief.ws.close(1000);
    reconnected.ws.close(1000);
  });
});

describe("frames disguised to pass the size limit", () => {
  it("refuses results over 64 KiB with duplicated keys or a mismatched type, and stores nothing", async () => {
    const identity = await joined();
    const created = await send(identity.nodeId);
    const first = await welcomed(identity);
    const command = await first.next("command", (c) => c.id === created.body.id);
    first.ws.close(1000);
    await first.closed;

    const output = { pad: "x".repeat(200 * 1024) };
    const signed = { t: "result", id: command.id, key: command.key, ok: true, output };
    const signature = await signMessage(identity.key.privateKey, await resultMessage(identity.nodeId, signed as never));
    const body = JSON.stringify({ ...signed, signature }).slice(1); // every field after the opening brace
    const small = JSON.stringify({ id: command.id, key: command.key, ok: true, signature }).slice(1, -1);
    const disguised: [string, string, number][] = [
      ["a status prefix, a result's type", `{"t":"status","t":"result",${body.replace(`"t":"result",`, "")}`, CloseCode.FRAME_TOO_LARGE],
      ["a status with a result's fields and type after", `{"t":"status","generation":1,"sections":{},${body}`, CloseCode.FRAME_TOO_LARGE],
      ["a result's fields, a status's type last", `{${body.slice(0, -1)},"t":"status"}`, CloseCode.MALFORMED_FRAME],
      ["a result under the limit with a duplicated key", `{"t":"result",${small},"ok":false}`, CloseCode.MALFORMED_FRAME],
      ["a nested duplicated key", `{"t":"result",${small},"output":{"a":1,"\\u0061":2}}`, CloseCode.MALFORMED_FRAME],
      ["a status naming its type twice", `{"t":"status","t":"status","generation":1,"sections":{}}`, CloseCode.MALFORMED_FRAME],
    ];
    for (const [label, text, code] of disguised) {
      const agent = await welcomed(identity);
      await agent.next("command", (c) => c.id === command.id); // redelivered on every new socket
      agent.send(text);
      expect([label, (await agent.closed).code]).toEqual([label, code]);
    }
    expect((await client.call("commands.get", { id: command.id })).body).toMatchObject({ state: "delivered" });
    expect((await client.call("commands.get", { id: command.id })).body.result ?? null).toBeNull();
    expect((await eventsOf(identity.nodeId)).filter((e) => e.type.startsWith("command."))).toEqual([]);

    // The same result, honestly framed and under the limit, is taken.
    const agent = await welcomed(identity);
    const again = await agent.next("command", (c) => c.id === command.id);
    await agent.result(again, true, { n: 1 });
    await agent.next("result-ack", (a) => a.id === command.id);
    agent.ws.close(1000);
  });
});

describe("one socket flooding its NodeDO", () => {
  it("drops what is over budget, closes the socket with a policy code and an event, logs a few lines, and keeps serving others", async () => {
    const neighbour = await welcomed(await joined());
    const flooder = await welcomed(await joined());
    const linesBefore = logs.filter((l) => l.includes(flooder.nodeId)).length;
    const roundTripsBefore = nodeRoundTrips.count;

    // Acks for nothing sent, and results for commands that do not exist, as fast as it can.
    const frames = 4_000;
    for (let i = 0; i < frames; i++) {
      if (i % 2 === 0) flooder.send({ t: "ack", id: String(i) });
      else flooder.send({ t: "result", id: String(900_000_000 + i), key: `k-${i}`, ok: true, output: {} });
    }
    expect((await flooder.closed).code).toBe(CloseCode.POLICY_VIOLATION);
    const statements = nodeRoundTrips.count - roundTripsBefore;
    expect(statements).toBeLessThan(frames / 10);

    const limited = await vi.waitFor(
      async () => {
        const events = await eventsOf(flooder.nodeId);
        expect(events.map((e) => e.type)).toEqual(expect.arrayContaining(["node.rate-limited", "node.disconnected"]));
        return events.find((e) => e.type === "node.rate-limited")!;
      },
      { timeout: 10_000 },
    ); // the events are written after the close: a busy machine takes more than waitFor's default second
    expect(limited.data).toMatchObject({ code: CloseCode.POLICY_VIOLATION, sessionId: expect.any(String) });
    const summary = limited.data as { frames: Record<string, { taken: number; dropped: number }>; refused: Record<string, number> };
    expect(summary.frames.ack!.dropped).toBeGreaterThan(0);
    expect(summary.frames.ack!.taken).toBe(0);
    const lines = logs.filter((l) => l.includes(flooder.nodeId)).length - linesBefore;
    expect(lines).toBeGreaterThan(0);
    expect(lines).toBeLessThanOrEqual(4);

    // The node's next sockets are refused for a while (429), so a flood does not resume at once.
    await expect(connectRaw(compute, env, flooder)).rejects.toThrow(/^no websocket: 429 .*exceeded its frame budget/);

    // The other agent is served as before.
    await roundTrip(neighbour);
    neighbour.ws.close(1000);
  });
});

describe("JoinService", () => {
  async function renew(identity: Awaited<ReturnType<typeof joined>>, timestamp: string) {
    return fetcher(compute, env)(RENEW_PATH, {
      method: "POST",
      headers: { authorization: `Bearer ${identity.credential}` },
      body: JSON.stringify({ timestamp, signature: await signMessage(identity.key.privateKey, renewMessage(identity.nodeId, timestamp)) }),
    });
  }
  const databaseNow = async () =>
    new Date(((await client.store.db.execute(sql`SELECT compute_now() AS now`)).rows[0] as { now: string }).now).getTime();

  it("refuses a replayed renewal; a newer one is taken", async () => {
    const identity = await joined();
    const at = new Date(await databaseNow()).toISOString();
    expect((await renew(identity, at)).status).toBe(200);
    const replayed = await renew(identity, at);
    expect(replayed.status).toBe(401);
    expect(await replayed.json()).toMatchObject({ code: "UNAUTHENTICATED", message: expect.stringContaining("already used") });
    // An older one, still within the clock skew, too.
    expect((await renew(identity, new Date(Date.parse(at) - 1000).toISOString())).status).toBe(401);
    expect((await renew(identity, new Date(Date.parse(at) + 1000).toISOString())).status).toBe(200);
  });

  it("refuses a join whose signature does not cover the token it spends", async () => {
    const token = (await client.call("siteTokens.create", { site: "lab" })).body.token as string;
    const other = (await client.call("siteTokens.create", { site: "lab" })).body.token as string;
    const key = await generateNodeKey();
    const post = (evidence: Record<string, unknown>, signature: string) =>
      fetcher(compute, env)(JOIN_PATH, {
        method: "POST",
        body: JSON.stringify({ attestor: "join-token", evidence, publicKey: key.publicKey, role: "site", signature }),
      });
    // Signed over another token, and the old message that named no evidence.
    const elsewhere = await signMessage(key.privateKey, await joinMessage(key.publicKey, "join-token", { token: other }));
    const v1 = await signMessage(key.privateKey, `bc-join/v1\njoin-token\n${key.publicKey}`);
    for (const signature of [elsewhere, v1]) {
      const refused = await post({ token }, signature);
      expect(refused.status).toBe(401);
      expect(await refused.json()).toMatchObject({ code: "UNAUTHENTICATED" });
    }
    // Nothing was spent: the token joins with a signature over it.
    const signature = await signMessage(key.privateKey, await joinMessage(key.publicKey, "join-token", { token }));
    expect((await post({ token }, signature)).status).toBe(200);
  });
});
