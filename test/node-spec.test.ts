// NodeSpecs end to end in workerd: a module writes its section through ctx.nodeSpecs (Postgres),
// the real NodeDO delivers the generation to a FakeDaemon running the node role's converger on a
// SIMULATED runtime (testing/simulated-runtime.ts: no guest boots), and the status the
// agent reports is recorded and shown by nodes.spec.get.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import type { FakeDaemon } from "../testing/index.ts";
import { simulatedRuntime, type SimulatedRuntime } from "../testing/simulated-runtime.ts";
import { MemoryState } from "../agent/state.ts";
import { betterCompute, definePlugin } from "../core/index.ts";
import { isComputeError } from "../core/errors.ts";
import { sha256Hex } from "../core/encoding.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { joinedDaemon } from "./support/fake-daemon.ts";

const instanceEntry = z.strictObject({
  name: z.string(),
  runtime: z.string(),
  desired: z.enum(["running", "stopped"]),
  vcpus: z.number(),
  memory: z.string(),
  disk: z.string(),
  image: z.string(),
  userData: z.string(),
  userDataSha256: z.string(),
});

const owner = definePlugin({
  id: "spec-owner",
  nodeSpecSections: [
    // Operators read the spec (nodes.spec.get); the tenant's user data is not theirs.
    { name: "instances", entry: instanceEntry, view: (entry) => ({ ...(entry as object), userData: "(hidden)" }) },
    { name: "widgets", entry: z.strictObject({ size: z.number().int().min(1) }) },
    { name: "blobs", entry: z.string() },
  ],
});
const stranger = definePlugin({ id: "spec-stranger" });
const compute = betterCompute({ plugins: [owner, stranger] });

let client: TestClient;
const daemons: FakeDaemon[] = [];
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterEach(async () => {
  await Promise.all(daemons.splice(0).map((d) => d.stop()));
});
afterAll(() => client?.close());

/** Writes one entry as `moduleId` in a transaction of its own, then wakes the NodeDO as a request would. */
async function setEntry(nodeId: string, section: string, key: string, value: unknown, moduleId = "spec-owner") {
  const ctx = compute.moduleContext(moduleId, env, client.store);
  const result = await client.store.transaction((tx) => ctx.nodeSpecs.setEntry(tx, nodeId, section, key, value));
  await ctx.afterCommit();
  return result;
}

const spec = (nodeId: string) => compute.moduleContext("spec-owner", env, client.store).nodeSpecs.get(nodeId);

async function refusal(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (err) {
    if (isComputeError(err)) return err.code;
    throw err;
  }
  throw new Error("expected a refusal");
}

async function joinedNode(opts: { runtime?: SimulatedRuntime; state?: MemoryState } = {}): Promise<FakeDaemon> {
  const d = await joinedDaemon(client, compute, env, {
    heartbeatMs: 60_000,
    ...(opts.state ? { state: opts.state } : {}),
    node: { runtimes: [opts.runtime ?? simulatedRuntime()] },
  });
  daemons.push(d);
  return d;
}

async function instance(name: string) {
  const userData = btoa(`#!/bin/sh\necho ${name}\n`);
  return {
    name,
    runtime: "simulated",
    desired: "running" as const,
    vcpus: 1,
    memory: "256MiB",
    disk: "1GiB",
    image: "bc-guest",
    userData,
    userDataSha256: await sha256Hex(atob(userData)),
  };
}

/** Waits until the node reported reaching `generation`. */
async function observedAt(nodeId: string, generation: number) {
  await expect.poll(async () => (await spec(nodeId))?.observed?.generation, { timeout: 20_000, interval: 100 }).toBe(generation);
  return (await spec(nodeId))!;
}

describe("NodeSpec: the port", () => {
  it("bumps the generation once per change; an equal value, or deleting what is absent, changes nothing", async () => {
    const d = await joinedNode();
    const node = d.nodeId!;
    expect(await setEntry(node, "widgets", "a", { size: 1 })).toEqual({ generation: 1, changed: true });
    expect(await setEntry(node, "widgets", "a", { size: 1 })).toEqual({ generation: 1, changed: false });
    expect(await setEntry(node, "widgets", "a", { size: 2 })).toEqual({ generation: 2, changed: true });
    expect((await spec(node))!.sections).toEqual({ widgets: { a: { size: 2 } } });
    expect(await setEntry(node, "widgets", "a", null)).toEqual({ generation: 3, changed: true });
    expect(await setEntry(node, "widgets", "a", null)).toEqual({ generation: 3, changed: false });
    // A section without entries is gone from the spec.
    expect((await spec(node))!.sections).toEqual({});
  });

  it("refuses an invalid entry with INVALID_ARGUMENT and changes nothing", async () => {
    const d = await joinedNode();
    const node = d.nodeId!;
    await setEntry(node, "widgets", "a", { size: 1 });
    expect(await refusal(setEntry(node, "widgets", "b", { size: "big" }))).toBe("INVALID_ARGUMENT");
    expect(await refusal(setEntry(node, "widgets", "b", { size: 1, colour: "red" }))).toBe("INVALID_ARGUMENT");
    expect(await refusal(setEntry(node, "widgets", "has space", { size: 1 }))).toBe("INVALID_ARGUMENT");
    expect(await refusal(setEntry(node, "gadgets", "b", { size: 1 }))).toBe("INVALID_ARGUMENT");
    // The whole spec is bounded (MAX_SPEC_BYTES): the entry that would pass it is refused.
    expect(await refusal(setEntry(node, "blobs", "big", "x".repeat(600 * 1024)))).toBe("INVALID_ARGUMENT");
    expect(await refusal(setEntry("n-nosuchnode", "widgets", "a", { size: 1 }))).toBe("NOT_FOUND");
    expect(await spec(node)).toMatchObject({ generation: 1, sections: { widgets: { a: { size: 1 } } } });
  });

  it("lets only the module that registered a section write it", async () => {
    const d = await joinedNode();
    const node = d.nodeId!;
    expect(await refusal(setEntry(node, "widgets", "a", { size: 1 }, "spec-stranger"))).toBe("FAILED_PRECONDITION");
    // access belongs to the built-in agents module.
    expect(await refusal(setEntry(node, "access", "alice", { publicKey: "ssh-ed25519 AAAA" }))).toBe("FAILED_PRECONDITION");
    expect(await spec(node)).toBeUndefined();
  });

  it("refuses a deployment where two modules register the same section (INVALID_CONFIG)", () => {
    const again = definePlugin({ id: "spec-again", nodeSpecSections: [{ name: "access", entry: z.string() }] });
    expect(() => betterCompute({ plugins: [again] })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
  });

  it("lands two transactions writing different keys of one node at once", async () => {
    const d = await joinedNode();
    const node = d.nodeId!;
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => setEntry(node, "widgets", `w${i}`, { size: i + 1 })));
    expect(results.every((r) => r.changed)).toBe(true);
    expect(results.map((r) => r.generation).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    const { generation, sections } = (await spec(node))!;
    expect(generation).toBe(8);
    expect(Object.keys(sections.widgets!).sort()).toEqual(["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"]);
  });
});

describe("NodeSpec: delivery and status", () => {
  it("delivers the spec to the node, which converges it on its runtime, and records what it reached", async () => {
    const runtime = simulatedRuntime();
    const d = await joinedNode({ runtime });
    const node = d.nodeId!;
    await d.connect();
    const wanted = await instance("i-one");
    await setEntry(node, "instances", "i-one", wanted);
    const { generation } = await setEntry(node, "widgets", "w", { size: 3 });

    const observed = await observedAt(node, generation);
    const entry = observed.observed!.sections.instances!.entries["i-one"] as Record<string, any>;
    expect(entry).toMatchObject({ name: "i-one", state: "running", report: { instanceId: "i-one", hostname: "i-one" } });
    expect(entry.report.userDataSha256).toBe(wanted.userDataSha256);
    // A section the agent has no handler for is reported, not ignored.
    expect(observed.observed!.sections.widgets!.error?.code).toBe("UNSUPPORTED");
    expect(observed.observed!.bootId).toBe(d.client.bootId);
    expect(runtime.boots).toEqual(["i-one"]);

    // The operator sees both halves.
    const got = await client.call("nodes.spec.get", { node });
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ node, generation, sections: { instances: { "i-one": { name: "i-one" } } } });
    expect(got.body.observed.sections.instances.entries["i-one"].state).toBe("running");
    expect(got.body.sections.instances["i-one"].userData).toBe("(hidden)");
    const events = await client.store.db.execute(
      sql`SELECT data FROM bc_events WHERE type = 'node.spec.observed' AND subject = ${`nodes/${node}`} ORDER BY id`,
    );
    expect(events.rows.length).toBeGreaterThan(0);

    // A guest that powers itself off is reported by the runtime's watch, without a new spec.
    runtime.powerOff("i-one");
    await expect
      .poll(async () => ((await spec(node))!.observed!.sections.instances!.entries["i-one"] as Record<string, any>).reason, {
        timeout: 20_000,
        interval: 100,
      })
      .toBe("guest_poweroff");

    // Deleting the entry removes the guest.
    const removed = await setEntry(node, "instances", "i-one", null);
    const after = await observedAt(node, removed.generation);
    expect(after.observed!.sections.instances!.entries).toEqual({});
    expect(runtime.removed).toEqual(["i-one"]);
  });

  it("converges what changed while the node was offline once it reconnects", async () => {
    const runtime = simulatedRuntime();
    const state = new MemoryState();
    const first = await joinedNode({ runtime, state });
    const node = first.nodeId!;
    await first.connect();
    const one = await setEntry(node, "instances", "i-a", await instance("i-a"));
    await observedAt(node, one.generation);
    await first.stop();

    // Offline: two changes the node has not seen.
    await setEntry(node, "instances", "i-b", await instance("i-b"));
    const latest = await setEntry(node, "instances", "i-a", null);
    expect((await spec(node))!.observed!.generation).toBe(one.generation);

    // The agent comes back (a restart: same state, and its guests kept running).
    const again = await joinedNode({ runtime, state });
    await again.connect();
    const observed = await observedAt(node, latest.generation);
    expect(Object.keys(observed.observed!.sections.instances!.entries)).toEqual(["i-b"]);
    expect(runtime.boots).toEqual(["i-a", "i-b"]);
    expect(runtime.removed).toEqual(["i-a"]);
  });

  it("puts an operator's SSH key in the access section; a node without an access file says UNSUPPORTED", async () => {
    const d = await joinedNode();
    const node = d.nodeId!;
    await d.connect();
    const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGz6Yk2c1oYQ4z4Qm0Zq0bR0bY1s7zQ6m3m8kFh3o1Zr";
    const set = await client.call("nodes.access.set", { node, name: "alice", publicKey: `${key} alice@laptop` });
    expect(set.status).toBe(200);
    expect(set.body).toEqual({ node, generation: 1, changed: true });
    expect((await client.call("nodes.access.set", { node, name: "alice", publicKey: key })).body.changed).toBe(false);
    const bad = await client.call("nodes.access.set", { node, name: "bob", publicKey: "not a key" });
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe("INVALID_ARGUMENT");

    const observed = await observedAt(node, 1);
    expect(observed.sections.access).toEqual({ alice: { publicKey: key } });
    expect(observed.observed!.sections.access!.error?.code).toBe("UNSUPPORTED");

    const removed = await client.call("nodes.access.remove", { node, name: "alice" });
    expect(removed.body).toEqual({ node, generation: 2, changed: true });
    expect((await client.call("nodes.spec.get", { node: "n-nosuchnode" })).status).toBe(404);
  });
});
