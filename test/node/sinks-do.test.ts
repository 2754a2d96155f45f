// The SinkDO in workerd (wrangler dev, a deployment of its own: test/support/sinks-worker.ts): a
// method that publishes an event commits, the SinkDO is woken, and its alarm delivers to a table
// sink with no cron pass at all (the stack runs a copy of wrangler.toml without the cron trigger);
// a sink whose receiver is down is retried by the alarm alone, backing off 2 s then 4 s, and gets
// the event once the receiver is back.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it } from "vitest";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { openNodeStore, repoRoot, type NodeStore } from "../../local/node-store.ts";
import { startStack, type Stack } from "../../local/stack.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-sinks-do-"));
const shown: string[] = [];
let stack: Stack;
let db: NodeStore;

beforeAll(async () => {
  // No [triggers]: the cron sweep (the sinks' safety net) never runs, so only the SinkDO delivers.
  const wranglerConfig = path.join(dataDir, "wrangler.toml");
  const original = fs.readFileSync(path.join(repoRoot, "wrangler.toml"), "utf8");
  fs.writeFileSync(wranglerConfig, original.replace(/\[triggers\]\ncrons = .*\n/, ""));
  stack = await startStack({ dataDir, wranglerConfig, main: "test/support/sinks-worker.ts", onOutput: (line) => shown.push(line) });
  expect(stack.crons).toEqual([]);
  db = await openNodeStore(stack.databaseUrl);
  await db.db.execute(sql`CREATE TABLE acme_sink_gate (open boolean NOT NULL DEFAULT true)`);
}, 120_000);

afterAll(async () => {
  await db?.close();
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

/** The admin's API call; anything but a 200 throws. */
const call = <T = any>(method: string, input: Record<string, unknown>) => callApi<T>(stack.url, stack.adminKey, method, input);

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}\n${shown.join("\n")}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The rows a table sink wrote for this event (none while its table does not exist yet). */
async function copied(table: string, eventId: string): Promise<Array<{ type: string; subject: string }>> {
  const exists = await db.db.execute(sql`SELECT to_regclass(${table}) IS NOT NULL AS present`);
  if (!(exists.rows[0] as { present: boolean }).present) return [];
  const rows = await db.db.execute(sql`SELECT type, subject FROM ${sql.identifier(table)} WHERE event_id = ${eventId}`);
  return rows.rows as Array<{ type: string; subject: string }>;
}

type SinkView = { id: string; attempts: number; nextAttemptAt: string | null; lastError: string | null; lag: { behind: number } };
const sinkState = async (id: string) => (await call<{ sinks: SinkView[] }>("events.sinks.list", {})).sinks.find((s) => s.id === id)!;

it("delivers a committed event through the SinkDO's alarm, with no cron pass, and retries a failing sink with backoff", async () => {
  const { eventId } = await call<{ eventId: string }>("acme.sinks.ping", { label: "first" });

  // The table sink: the commit woke the SinkDO and its alarm delivered.
  const rows = await until("the table sink's row", async () => {
    const found = await copied("acme_sink_copy", eventId);
    return found.length ? found : undefined;
  });
  expect(rows).toEqual([{ type: "acme.pinged", subject: "pings/first" }]);

  // The receiver behind the gate is down: the alarm came back on its own after the first backoff
  // (nothing but read-only calls reach the Worker meanwhile, and they wake nothing).
  const failing = await until("a second failed attempt", async () => {
    const state = await sinkState("acme-gated");
    return state.attempts >= 2 ? state : undefined;
  });
  expect(failing.lastError).toContain("the acme receiver is down");
  expect(failing.nextAttemptAt).not.toBeNull();
  expect(failing.lag.behind).toBeGreaterThanOrEqual(1);
  expect(await copied("acme_sink_gated", eventId)).toEqual([]);
  // The backoff doubles: the dispatcher's warnings, as the operator sees them.
  const backoffs = shown.filter((line) => line.startsWith("WARN a sink's delivery failed") && line.includes("sink=acme-gated"));
  expect(backoffs[0]).toMatch(/attempts=1 .*retryInSeconds=2/);
  expect(backoffs[1]).toMatch(/attempts=2 .*retryInSeconds=4/);

  // Back up: the next alarm delivers, and the sink is healthy again.
  await db.db.execute(sql`INSERT INTO acme_sink_gate DEFAULT VALUES`);
  expect(await until("the gated sink's row", async () => ((await copied("acme_sink_gated", eventId)).length ? true : undefined))).toBe(
    true,
  );
  const healthy = await until("the gated sink caught up", async () => {
    const state = await sinkState("acme-gated");
    return state.lag.behind === 0 ? state : undefined;
  });
  expect(healthy).toMatchObject({ attempts: 0, nextAttemptAt: null, lastError: null });
}, 90_000);
