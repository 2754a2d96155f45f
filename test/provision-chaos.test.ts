// Crash safety: a five-step workflow (two agent steps, one destructive) is stopped dead at every
// transaction boundary, before and after each commit, and resumed from Postgres. The WorkflowDO
// is aborted where it stood; the Worker's request (workflows.start) fails outright. Every run
// must complete, with the destructive command enqueued exactly once (checked in SQL) and run
// once by the agent.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it } from "vitest";
import type { FakeDaemon } from "../testing/index.ts";
import { postgres } from "../core/index.ts";
import type { Store } from "../core/store/database.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { wakeStalledWorkflows } from "../plugins/provision/module.ts";
import { chaos, type Boundary } from "./support/chaos.ts";
import { testCompute } from "./support/worker.ts";
import { joinedDaemon } from "./support/fake-daemon.ts";

let client: TestClient;
let observer: Store; // the test's own reads, outside the counted (wrapped) stores
let daemon: FakeDaemon;
const wipesRun = new Map<string, number>();

beforeAll(async () => {
  client = await createTestClient(testCompute, env);
  observer = postgres().open(env);
  daemon = await joinedDaemon(client, testCompute, env, {
    connect: true,
    handlers: {
      "chaos.inventory": () => ({ disk: "/dev/nvme0n1" }),
      "chaos.wipe": (_body, { key }) => {
        wipesRun.set(key, (wipesRun.get(key) ?? 0) + 1);
        return { wiped: "/dev/nvme0n1", method: "nvme-format" };
      },
    },
  });
});

afterAll(async () => {
  chaos.disarm();
  await daemon?.stop();
  await observer?.close();
  await client?.close();
});

async function latestWorkflow(): Promise<string | undefined> {
  const rows = await observer.db.execute(
    sql`SELECT id FROM workflows WHERE target = ${daemon.nodeId!} ORDER BY created_at DESC, id DESC LIMIT 1`,
  );
  return (rows.rows[0] as { id: string } | undefined)?.id;
}

/** The cron sweep, run now: wakes every running workflow. */
const sweep = () => wakeStalledWorkflows(testCompute.moduleContext("provision", env, observer), 0);

async function completion(id: string): Promise<string> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const row = (await observer.db.execute(sql`SELECT state FROM workflows WHERE id = ${id}`)).rows[0] as { state: string };
    if (row.state !== "running" || Date.now() > deadline) return row.state;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** One run of chaos.five, stopped at transaction `at` (counted from workflows.start) if given. */
async function run(at?: number, boundary: Boundary = "after-commit"): Promise<{ id: string; hit: boolean }> {
  const before = await latestWorkflow();
  const how = at === 1 ? "throw" : "abort"; // transaction 1 is the Worker's request; the rest are the WorkflowDO's
  chaos.arm(at ?? Number.POSITIVE_INFINITY, boundary, how);
  let started = await client.call("workflows.start", { profile: "chaos.five", target: daemon.nodeId });
  if (started.status !== 200) {
    expect(at).toBe(1);
    const committed = (await latestWorkflow()) !== before;
    // A client retries a request that failed before it committed; one that failed after
    // committed is found by the sweep.
    if (!committed) started = await client.call("workflows.start", { profile: "chaos.five", target: daemon.nodeId });
  }
  const id = (await latestWorkflow())!;
  expect(id).not.toBe(before);
  if (at !== undefined && at > 1) {
    for (let waited = 0; !chaos.hit && waited < 10_000; waited += 50) await new Promise((r) => setTimeout(r, 50));
    chaos.disarm();
  }
  if (at !== undefined) await sweep();
  const state = await completion(id);
  const hit = at !== undefined && chaos.hit;
  chaos.disarm(); // a clean run counts its transactions to the end
  expect(state, `run stopped at transaction ${at} ${boundary}`).toBe("succeeded");
  return { id, hit };
}

async function wipesEnqueued(id: string): Promise<number> {
  const rows = await observer.db.execute(sql`
    SELECT count(*)::int AS n FROM bc_commands WHERE kind = 'chaos.wipe' AND idempotency_key LIKE ${`wf:${id}:%`}`);
  return (rows.rows[0] as { n: number }).n;
}

it("completes after a crash at every boundary, and sends the destructive command exactly once", async () => {
  await run();
  const boundaries = chaos.count; // transactions of one clean run, workflows.start included
  expect(boundaries).toBeGreaterThanOrEqual(9);

  const outcomes: string[] = [];
  for (const boundary of ["before-commit", "after-commit"] as const) {
    for (let at = 1; at <= boundaries; at++) {
      const { id, hit } = await run(at, boundary);
      expect(hit, `transaction ${at} ${boundary} was reached`).toBe(true);
      expect(await wipesEnqueued(id), `wipe commands of a run stopped at ${at} ${boundary}`).toBe(1);
      const keys = [...wipesRun.keys()].filter((k) => k.startsWith(`wf:${id}:`));
      expect(keys.map((k) => wipesRun.get(k))).toEqual([1]);
      outcomes.push(`${boundary}@${at}`);
    }
  }
  expect(outcomes).toHaveLength(2 * boundaries);
}, 600_000);
