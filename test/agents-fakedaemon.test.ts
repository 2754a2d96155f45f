// The well-behaved agent (FakeDaemon: the real AgentClient with an in-memory journal) against
// the real JoinService, gateway and NodeDO: order, exactly-once execution across cut
// connections, and a NodeDO that is aborted under it.
import { env } from "cloudflare:workers";
import { abortAllDurableObjects } from "cloudflare:test";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import type { FakeDaemon } from "../testing/index.ts";
import { betterCompute, definePlugin } from "../core/index.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { joinedDaemon } from "./support/fake-daemon.ts";

const compute = betterCompute({
  plugins: [
    definePlugin({
      id: "test-kinds",
      commands: [
        { kind: "test.step", input: z.object({ i: z.number() }) },
        { kind: "test.wipe", attested: true, destructive: true },
      ],
    }),
  ],
});
let client: TestClient;
const daemons: FakeDaemon[] = [];
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterEach(async () => {
  await Promise.all(daemons.splice(0).map((d) => d.stop()));
});
afterAll(() => client?.close());

async function daemon(handlers: ConstructorParameters<typeof FakeDaemon>[0]["handlers"] = {}): Promise<FakeDaemon> {
  const d = await joinedDaemon(client, compute, env, { handlers, heartbeatMs: 60_000 });
  daemons.push(d);
  return d;
}

async function enqueue(nodeId: string, kind: string, count: number, from = 0) {
  for (let i = from; i < from + count; i++) {
    const res = await client.call("commands.create", {
      node: nodeId,
      kind,
      body: kind === "test.step" ? { i } : {},
      key: `${nodeId}:${kind}:${i}`,
    });
    expect(res.status).toBe(200);
  }
}

const recorded = async (nodeId: string) =>
  (await client.store.db.execute(sql`SELECT state, count(*)::int AS n FROM bc_commands WHERE node_id = ${nodeId} GROUP BY state`)).rows;

async function allSucceeded(nodeId: string, n: number) {
  await expect.poll(() => recorded(nodeId), { timeout: 20_000, interval: 100 }).toEqual([{ state: "succeeded", n }]);
}

describe("FakeDaemon against the real control plane", () => {
  it("runs 100 commands enqueued while it was offline, in order, each once, with every result recorded", async () => {
    const ran: number[] = [];
    const d = await daemon({ "test.step": (body) => (ran.push((body as { i: number }).i), { i: (body as { i: number }).i }) });
    await enqueue(d.nodeId!, "test.step", 100);
    await d.connect();
    await allSucceeded(d.nodeId!, 100);
    expect(ran).toEqual(Array.from({ length: 100 }, (_, i) => i));
  });

  it("survives its socket being cut mid-stream: reconnects, and every command runs exactly once", async () => {
    const ran: number[] = [];
    let d!: FakeDaemon;
    d = await daemon({
      "test.step": async (body) => {
        const { i } = body as { i: number };
        ran.push(i);
        if (i === 30 || i === 70) d.kill(); // the network drops while results are in flight
        await new Promise((r) => setTimeout(r, 2));
        return { i };
      },
    });
    await enqueue(d.nodeId!, "test.step", 100);
    await d.connect();
    await allSucceeded(d.nodeId!, 100);
    expect(d.disconnects.length).toBeGreaterThanOrEqual(2);
    expect(ran).toEqual(Array.from({ length: 100 }, (_, i) => i));
    expect(new Set(d.executed.map((e) => e.key)).size).toBe(100);
  });

  it("signs attested results so the NodeDO records them", async () => {
    const d = await daemon({ "test.wipe": () => ({ wiped: ["/dev/sda"], method: "nvme-format" }) });
    await d.connect();
    await enqueue(d.nodeId!, "test.wipe", 1);
    await allSucceeded(d.nodeId!, 1);
    const row = await client.store.db.execute(sql`SELECT signature IS NOT NULL AS signed FROM bc_commands WHERE node_id = ${d.nodeId!}`);
    expect(row.rows).toEqual([{ signed: true }]);
  });

  it("gets its commands after every NodeDO is aborted under its open socket", async () => {
    const d = await daemon({ "test.step": (body) => body });
    await d.connect();
    await enqueue(d.nodeId!, "test.step", 5);
    await allSucceeded(d.nodeId!, 5);
    await abortAllDurableObjects();
    await d.reconnected(15_000);
    await enqueue(d.nodeId!, "test.step", 5, 5);
    await allSucceeded(d.nodeId!, 10);
    expect(new Set(d.executed.map((e) => e.key)).size).toBe(10);
  });
});
