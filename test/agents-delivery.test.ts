// Command delivery across offline periods, cut connections and evictions of the NodeDO,
// with a raw protocol peer (the agent's own exactly-once journal is tested with FakeDaemon).
import { env } from "cloudflare:workers";
import { evictDurableObject, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { betterCompute, definePlugin } from "../core/index.ts";
import type { CommandFrame } from "../core/protocol.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { connectRaw, joinRaw, type RawAgent } from "./support/raw-agent.ts";

const compute = betterCompute({
  plugins: [definePlugin({ id: "test-kinds", commands: [{ kind: "test.step", input: z.object({ i: z.number() }) }] })],
});
let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

async function joined() {
  const token = (await client.call("siteTokens.create", { site: "lab" })).body.token;
  const { body, key } = await joinRaw(compute, env, token);
  return { nodeId: body.nodeId as string, credential: body.credential as string, key };
}

async function online(identity: Awaited<ReturnType<typeof joined>>): Promise<RawAgent> {
  const agent = await connectRaw(compute, env, identity);
  await agent.hello();
  await agent.next("welcome");
  return agent;
}

async function enqueue(nodeId: string, count: number, from = 0) {
  const ids: string[] = [];
  for (let i = from; i < from + count; i++)
    ids.push((await client.call("commands.create", { node: nodeId, kind: "test.step", body: { i }, key: `${nodeId}:${i}` })).body.id);
  return ids;
}

async function receive(agent: RawAgent, count: number): Promise<CommandFrame[]> {
  const got: CommandFrame[] = [];
  while (got.length < count) got.push(await agent.next("command"));
  return got;
}

const states = async (nodeId: string) =>
  (
    await client.store.db.execute(
      sql`SELECT state, count(*)::int AS n FROM bc_commands WHERE node_id = ${nodeId} GROUP BY state ORDER BY state`,
    )
  ).rows;

describe("delivery", () => {
  it("delivers 100 commands enqueued while the agent was offline, in order, when it connects", async () => {
    const identity = await joined();
    await enqueue(identity.nodeId, 100);
    const agent = await online(identity);
    const commands = await receive(agent, 100);
    expect(commands.map((c) => c.body.i)).toEqual(Array.from({ length: 100 }, (_, i) => i));
    expect(commands.map((c) => c.seq)).toEqual([...commands.map((c) => c.seq)].sort((a, b) => a - b));
    for (const c of commands) await agent.result(c, true, { i: c.body.i });
    for (const c of commands) await agent.next("result-ack", (a) => a.id === c.id);
    expect(await states(identity.nodeId)).toEqual([{ state: "succeeded", n: 100 }]);
    agent.ws.close(1000, "done");
  });

  it("redelivers, after a cut connection, exactly the commands whose results it has not recorded", async () => {
    const identity = await joined();
    await enqueue(identity.nodeId, 20);
    const first = await online(identity);
    const commands = await receive(first, 20);
    for (const c of commands.slice(0, 8)) await first.result(c, true, { i: c.body.i });
    for (const c of commands.slice(0, 8)) await first.next("result-ack", (a) => a.id === c.id);
    first.ws.close(4000, "network cut"); // no results for the other 12

    const second = await online(identity);
    const redelivered = await receive(second, 12);
    expect(redelivered.map((c) => c.body.i)).toEqual(Array.from({ length: 12 }, (_, i) => i + 8));
    for (const c of redelivered) await second.result(c, true, { i: c.body.i });
    for (const c of redelivered) await second.next("result-ack", (a) => a.id === c.id);
    expect(await states(identity.nodeId)).toEqual([{ state: "succeeded", n: 20 }]);
    const events = await client.store.db.execute(sql`
      SELECT count(*)::int AS n FROM bc_events WHERE type = 'command.succeeded' AND subject = ${`nodes/${identity.nodeId}`}`);
    expect(events.rows).toEqual([{ n: 20 }]);
    second.ws.close(1000, "done");
  });

  it("keeps delivering to an open socket after the NodeDO is evicted", async () => {
    const identity = await joined();
    const agent = await online(identity);
    const stub = env.NODE.get(env.NODE.idFromName(identity.nodeId));
    const before = await runInDurableObject(stub, (instance) => instance);
    await evictDurableObject(stub);
    const [id] = await enqueue(identity.nodeId, 1);
    const command = await agent.next("command", (c) => c.id === id);
    // The command came through a new instance: the old one (and its memory) is gone.
    expect(await runInDurableObject(stub, (instance) => instance)).not.toBe(before);
    await agent.result(command, true, { after: "eviction" });
    await agent.next("result-ack", (a) => a.id === id);
    expect(await states(identity.nodeId)).toEqual([{ state: "succeeded", n: 1 }]);
    const node = (await client.call("nodes.get", { node: identity.nodeId })).body;
    expect(node.state).toBe("connected");
    agent.ws.close(1000, "done");
  });

  it("records a disconnection, and a newer connection replaces an older one", async () => {
    const identity = await joined();
    const older = await online(identity);
    const newer = await online(identity);
    expect((await older.closed).code).toBe(4409);
    expect((await client.call("nodes.get", { node: identity.nodeId })).body.state).toBe("connected");
    newer.ws.close(1000, "bye");
    await newer.closed;
    await expect.poll(async () => (await client.call("nodes.get", { node: identity.nodeId })).body.state).toBe("disconnected");
  });

  it("records a disconnection the runtime never reported, at the next sweep", async () => {
    const identity = await joined();
    await online(identity);
    const stub = env.NODE.get(env.NODE.idFromName(identity.nodeId));
    // Sockets are lost with no close event, as when the runtime restarts; simulate by wiping the
    // socket list while the recorded session stays.
    await runInDurableObject(stub, (_instance, state) => {
      for (const ws of state.getWebSockets())
        ws.serializeAttachment({ ...(ws.deserializeAttachment() as object), sessionId: "a-lost-session" });
    });
    expect((await client.call("nodes.get", { node: identity.nodeId })).body.state).toBe("connected");
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    expect((await client.call("nodes.get", { node: identity.nodeId })).body.state).toBe("disconnected");
    const events = await client.store.db.execute(
      sql`SELECT data->>'code' AS code FROM bc_events WHERE type = 'node.disconnected' AND subject = ${`nodes/${identity.nodeId}`}`,
    );
    expect(events.rows).toEqual([{ code: "1006" }]);
  });

  it("closes a revoked node's socket and refuses it afterwards", async () => {
    const identity = await joined();
    const agent = await online(identity);
    expect((await client.call("nodes.revoke", { node: identity.nodeId })).status).toBe(200);
    expect((await agent.closed).code).toBe(4403);
    const again = await compute.fetch(
      new Request("http://bc.test/agent/v1/connect", { headers: { upgrade: "websocket", authorization: `Bearer ${identity.credential}` } }),
      env,
    );
    expect(again.status).toBe(403);
  });
});
