// Event and audit sinks (docs/sinks.md) on the real betterCompute and a real Postgres (PGlite
// through the production driver and the WebSocket bridge): the dispatcher delivers the outbox in
// order after failures and across a crash at every boundary of a pass, a poisoned event goes to
// the dead letter and an operator replays it through the API, audit sinks get the audit rows, and
// events.sinks.list shows cursor, lag and errors. The sinks here are the tests' receivers.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute, defineSink, postgres, tableSink, type Compute, type SinkEvent } from "../../core/index.ts";
import { dispatchOnce, drainSinks, type DispatchContext, type PassOutcome } from "../../core/events/dispatch.ts";
import type { ComputeError } from "../../core/errors.ts";
import type { Store } from "../../core/store/database.ts";
import { createTestClient, type TestClient } from "../../testing/test-client.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";
import { startBridge, type Bridge } from "../../local/ws-bridge.ts";
import { chaos, chaosDatabase, type Boundary } from "../support/chaos.ts";

const SECRET = "sinks-test-deployment-secret-0123456789abcdef";

/** A sink that records every batch it is handed; it fails while `failing` says so. */
function recordingSink(id: string, options: { kind?: "events" | "audit"; maxBatch?: number; maxAttempts?: number } = {}) {
  const batches: SinkEvent[][] = [];
  const state = {
    batches,
    /** Failures still to come before deliveries succeed. */
    failFirst: 0,
    /** Refuse any batch holding an event with data.poison (until the receiver is fixed). */
    refusePoison: true,
    /** deliver() calls that threw. */
    failures: 0,
    received: () => batches.flat(),
    sink: defineSink({
      id,
      kind: options.kind ?? "events",
      maxBatch: options.maxBatch,
      maxAttempts: options.maxAttempts,
      async deliver(batch) {
        if (state.failFirst > 0) {
          state.failFirst--;
          state.failures++;
          throw new Error("the receiver answered 503");
        }
        const poisoned = batch.find((e) => e.data.poison === true);
        if (poisoned && state.refusePoison) {
          state.failures++;
          throw new Error(`the receiver cannot parse event ${poisoned.eventId}`);
        }
        batches.push(batch);
      },
    }),
  };
  return state;
}

let pglite: PgliteServer;
let bridge: Bridge;
let observer: NodeStore;
let env: Record<string, string>;
let compute: Compute;
let client: TestClient;
const poison = recordingSink("poison-watch", { maxAttempts: 2 });
const auditWatch = recordingSink("audit-watch", { kind: "audit" });

beforeAll(async () => {
  pglite = await startPglite();
  bridge = await startBridge();
  observer = await openNodeStore(pglite.connectionString, { bridge: bridge.url });
  env = { DATABASE_URL: pglite.connectionString, BC_DB_WS_PROXY: bridge.url, BC_SECRET: SECRET, RECEIVER_TOKEN: "s3cr3t-receiver-token" };
  compute = betterCompute({
    database: chaosDatabase(postgres()),
    sinks: { events: [poison.sink, tableSink({ id: "copy", table: "sink_copy" })], audit: [auditWatch.sink] },
  });
  await applyMigrations(observer, coreMigrations());
  client = await createTestClient(compute, env);
}, 120_000);

afterAll(async () => {
  chaos.disarm();
  await client?.close();
  await observer?.close();
  await bridge?.stop();
  await pglite?.stop();
});

/** A module context of the sinks module on a store of its own (what the SinkDO and the cron hold). */
function dispatchContext(store: Store): DispatchContext {
  return compute.moduleContext("sinks", env, store);
}

async function publish(count: number, data: (i: number) => Record<string, unknown> = () => ({})): Promise<number[]> {
  const ctx = compute.moduleContext("core", env, observer);
  for (let i = 0; i < count; i++) {
    await observer.transaction((tx) => ctx.events.publish(tx, { type: "test.sink.event", subject: `things/t-${i % 2}`, data: data(i) }));
  }
  const rows = await observer.db.execute(sql`SELECT id FROM bc_events ORDER BY outbox_seq`);
  return (rows.rows as { id: string }[]).map((r) => Number(r.id));
}

const advanceClock = (seconds: number) => observer.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${seconds})`);

/**
 * Runs passes over one sink until it is caught up, as the SinkDO's alarm would: a pass that dies
 * (throws) is simply run again, and business time moves past each backoff.
 */
async function drain(store: Store, sink: ReturnType<typeof recordingSink>["sink"]): Promise<PassOutcome[]> {
  const outcomes: PassOutcome[] = [];
  for (let pass = 0; pass < 200; pass++) {
    let outcome: PassOutcome;
    try {
      outcome = await dispatchOnce(dispatchContext(store), sink);
    } catch {
      continue; // the process died; the alarm (or the cron) runs the pass again
    }
    outcomes.push(outcome);
    if (outcome.state === "caught-up") return outcomes;
    if (outcome.state === "failed" || outcome.state === "waiting") await advanceClock(600);
  }
  throw new Error(`sink ${sink.id} did not catch up: ${JSON.stringify(outcomes.slice(-3))}`);
}

/** Every event exactly once and in order, and at-least-once without gaps: a redelivery only repeats from the cursor. */
function expectInOrder(received: SinkEvent[], expected: number[], label: string) {
  const ids = received.map((e) => e.id);
  const firsts = ids.filter((id, i) => ids.indexOf(id) === i);
  expect(firsts, label).toEqual(expected);
  let highest = -1;
  for (const id of ids) {
    const at = expected.indexOf(id);
    expect(at, `${label}: ${id} came after ${expected[highest]}, skipping some`).toBeLessThanOrEqual(highest + 1);
    highest = Math.max(highest, at);
  }
}

describe("the dispatcher", () => {
  let events: number[];
  beforeAll(async () => {
    events = await publish(7);
  });

  it("delivers every event in order after a sink fails its first 3 deliveries, backing off in between", async () => {
    const flaky = recordingSink("flaky", { maxBatch: 3 });
    flaky.failFirst = 3;
    const store = compute.openStore(env);
    try {
      const outcomes = await drain(store, flaky.sink);
      expect(outcomes.slice(0, 3).map((o) => o.state)).toEqual(["failed", "failed", "failed"]);
      // Backoff doubles: 2 s, 4 s, 8 s.
      expect(outcomes.slice(0, 3).map((o) => (o as { inMs: number }).inMs)).toEqual([2000, 4000, 8000]);
    } finally {
      await store.close();
    }
    expect(flaky.received().map((e) => e.id)).toEqual(events);
    expect(flaky.batches.map((b) => b.length)).toEqual([3, 3, 1]);
  });

  it("loses nothing and skips nothing across a crash at every transaction boundary of the dispatch", async () => {
    // A clean run counts the passes' transactions (three failures, three batches, the caught-up pass).
    const clean = recordingSink("chaos-clean", { maxBatch: 3 });
    clean.failFirst = 3;
    const store = compute.openStore(env);
    try {
      chaos.arm(Number.POSITIVE_INFINITY, "after-commit", "throw");
      await drain(store, clean.sink);
      const boundaries = chaos.count;
      chaos.disarm();
      expect(boundaries).toBe(7);
      expectInOrder(clean.received(), events, "clean run");

      let runs = 0;
      for (const boundary of ["before-commit", "after-commit"] as Boundary[]) {
        for (let at = 1; at <= boundaries; at++) {
          const sink = recordingSink(`chaos-${boundary}-${at}`, { maxBatch: 3 });
          sink.failFirst = 3;
          chaos.arm(at, boundary, "throw");
          await drain(store, sink.sink);
          expect(chaos.hit, `transaction ${at} ${boundary} was reached`).toBe(true);
          chaos.disarm();
          expectInOrder(sink.received(), events, `crash at transaction ${at} ${boundary}`);
          runs++;
        }
      }
      expect(runs).toBe(2 * boundaries);
    } finally {
      chaos.disarm();
      await store.close();
    }
  }, 120_000);

  it("delivers a batch again when the process dies after deliver() and before the cursor commits (at-least-once)", async () => {
    const sink = recordingSink("redeliver", { maxBatch: 3 });
    const store = compute.openStore(env);
    try {
      chaos.arm(1, "before-commit", "throw");
      await expect(dispatchOnce(dispatchContext(store), sink.sink)).rejects.toThrow(/chaos/);
      chaos.disarm();
      await drain(store, sink.sink);
    } finally {
      await store.close();
    }
    expect(sink.batches.map((b) => b.map((e) => e.id))).toEqual([
      events.slice(0, 3),
      events.slice(0, 3),
      events.slice(3, 6),
      events.slice(6),
    ]);
  });
});

describe("dead letters", () => {
  it("moves a poisoned event to the dead letter after its attempts, and an operator replays it once", async () => {
    await observer.db.execute(sql`TRUNCATE bc_sink_dead_letters`);
    // Deep in its batch: the records before it are retried alone once, not a round of attempts each.
    const ids = await publish(6, (i) => ({ poison: i === 4 }));
    const expected = ids.slice(-6);
    poison.failures = 0;
    const store = compute.openStore(env);
    try {
      for (let pass = 0; pass < 100; pass++) {
        const drained = await drainSinks(dispatchContext(store));
        if (drained.nextInMs === null) break;
        await advanceClock(600);
      }
    } finally {
      await store.close();
    }
    const received = poison.received().map((e) => e.id);
    // Everything but the poisoned event arrived, in order; the cursor moved past it.
    expect(received.filter((id) => expected.includes(id))).toEqual(expected.filter((_, i) => i !== 4));
    // The batch's 2 attempts, then the poisoned event's own 2.
    expect(poison.failures).toBe(4);

    const listed = await client.call("events.deadLetters.list", { sink: "poison-watch" });
    expect(listed.status).toBe(200);
    expect(listed.body.deadLetters).toHaveLength(1);
    const letter = listed.body.deadLetters[0];
    expect(letter).toMatchObject({ sink: "poison-watch", source: "events", recordId: String(expected[4]), attempts: 4, replayedAt: null });
    expect(letter.lastError).toContain("cannot parse event");

    const sinks = await client.call("events.sinks.list", {});
    const view = sinks.body.sinks.find((s: { id: string }) => s.id === "poison-watch");
    expect(view).toMatchObject({ source: "events", attempts: 0, deadLetters: 1, lag: { behind: 0, oldestAt: null } });

    // Still refused: the replay fails, nothing is marked, the operator sees why.
    const refused = await client.call("events.deadLetters.replay", { id: letter.id });
    expect(refused.status).toBe(502);
    expect(refused.body.code).toBe("DRIVER_ERROR");
    expect((await client.call("events.deadLetters.list", { sink: "poison-watch" })).body.deadLetters).toHaveLength(1);

    poison.refusePoison = false; // the receiver was fixed
    const before = poison.received().length;
    const replayed = await client.call("events.deadLetters.replay", { id: letter.id });
    expect(replayed.status).toBe(200);
    expect(replayed.body).toMatchObject({ delivered: true, deadLetter: { id: letter.id, replayedBy: expect.stringMatching(/^apikey:/) } });
    expect(
      poison
        .received()
        .slice(before)
        .map((e) => e.id),
    ).toEqual([expected[4]]);

    // Idempotent: a second replay delivers nothing.
    const again = await client.call("events.deadLetters.replay", { id: letter.id });
    expect(again.body.delivered).toBe(false);
    expect(poison.received().length).toBe(before + 1);
    expect((await client.call("events.deadLetters.list", { sink: "poison-watch" })).body.deadLetters).toHaveLength(0);
    expect((await client.call("events.deadLetters.list", { sink: "poison-watch", replayed: true })).body.deadLetters).toHaveLength(1);

    expect((await client.call("events.deadLetters.replay", { id: "999999" })).body.code).toBe("NOT_FOUND");
    expect((await client.call("events.deadLetters.list", { after: "999999" })).body.code).toBe("NOT_FOUND");
    const viewer = await client.mintKey(["viewer"]);
    expect((await client.call("events.deadLetters.list", {}, { key: viewer })).status).toBe(200);
    expect((await client.call("events.deadLetters.replay", { id: letter.id }, { key: viewer })).status).toBe(403);
  });
});

describe("audit sinks, the table sink and lag", () => {
  it("gives audit sinks the audit rows of mutating calls, and the table sink a row per event", async () => {
    const created = await client.call("iam.apiKeys.create", { name: "audited", roles: ["viewer"] });
    expect(created.status).toBe(200);

    const sinks = await client.call("events.sinks.list", {});
    const copy = sinks.body.sinks.find((s: { id: string }) => s.id === "copy");
    expect(copy.lag.behind).toBeGreaterThan(0);
    expect(copy.lag.oldestAgeSeconds).toBeGreaterThanOrEqual(0);

    const store = compute.openStore(env);
    try {
      await drainSinks(dispatchContext(store));
    } finally {
      await store.close();
    }
    const audit = auditWatch.received();
    expect(audit.at(-1)).toMatchObject({ type: "iam.apiKeys.create", module: "audit", subject: "apiKeys/audited" });
    expect(audit.at(-1)!.data).toMatchObject({ action: "iam.apiKeys.create", resource: "apiKeys/audited" });
    expect(String(audit.at(-1)!.data.actor)).toMatch(/^apikey:/);

    const copied = await observer.db.execute(sql`SELECT id FROM sink_copy ORDER BY received`);
    const all = await observer.db.execute(sql`SELECT id FROM bc_events ORDER BY outbox_seq`);
    expect((copied.rows as { id: string }[]).map((r) => Number(r.id))).toEqual((all.rows as { id: string }[]).map((r) => Number(r.id)));

    const after = (await client.call("events.sinks.list", {})).body.sinks.find((s: { id: string }) => s.id === "copy");
    expect(after.lag).toEqual({ behind: 0, oldestAt: null, oldestAgeSeconds: null });
    expect(after.lastDeliveredAt).not.toBeNull();
  });

  it("numbers the outbox as transactions commit, and delivers by that number", async () => {
    const store = compute.openStore(env);
    const sink = recordingSink("commit-order");
    sink.refusePoison = false;
    try {
      await drain(store, sink.sink); // catch up with what earlier tests wrote
      const ctx = compute.moduleContext("core", env, observer);
      let late = "";
      await observer.transaction(async (tx) => {
        late = await ctx.events.publish(tx, { type: "test.sink.late" });
        // Not numbered before it commits: no dispatcher can move past it meanwhile.
        const seq = await tx.execute(sql`SELECT outbox_seq FROM bc_events WHERE event_id = ${late}`);
        expect((seq.rows[0] as { outbox_seq: string | null }).outbox_seq).toBeNull();
      });
      const numbered = await observer.db.execute(sql`SELECT outbox_seq FROM bc_events WHERE event_id = ${late}`);
      expect((numbered.rows[0] as { outbox_seq: string | null }).outbox_seq).not.toBeNull();
      sink.batches.length = 0;
      await drain(store, sink.sink);
      expect(sink.received().map((e) => e.eventId)).toEqual([late]);
    } finally {
      await store.close();
    }
  });
});

describe("registration", () => {
  const refusal = (fn: () => unknown) => {
    try {
      fn();
    } catch (err) {
      return err as ComputeError;
    }
    throw new Error("expected the registration to be refused");
  };

  it("refuses usage sinks, two sinks with one id, and a bad table name with INVALID_CONFIG", () => {
    expect(refusal(() => betterCompute({ sinks: { usage: [{}] } })).code).toBe("INVALID_CONFIG");
    const twice = refusal(() =>
      betterCompute({
        sinks: {
          events: [tableSink({ id: "same", table: "a" })],
          audit: [{ ...tableSink({ id: "same", table: "b", kind: "audit" }), version: "2" }],
        },
      }),
    );
    expect(twice.code).toBe("INVALID_CONFIG");
    expect(refusal(() => tableSink({ id: "bad", table: "x; DROP TABLE bc_events" })).code).toBe("INVALID_CONFIG");
    expect(refusal(() => betterCompute({ sinks: { events: [tableSink({ id: "zero", table: "z", maxBatch: 0 })] } })).code).toBe(
      "INVALID_CONFIG",
    );
  });

  it("resolves env: and secret: references for a sink, and names an unknown one without a value", async () => {
    const seen: string[] = [];
    let sinks = 0;
    const secretId = await observer.transaction(async (tx) => {
      const ref = await compute
        .moduleContext("core", env, observer)
        .secrets.put(tx, { module: "core", name: "hook", value: "stored-hook-key" });
      return ref.slice("secret://".length);
    });
    const resolving = (ref: string) =>
      defineSink({
        id: `resolving-${sinks++}`,
        kind: "events",
        maxBatch: 1,
        async deliver(_batch, ctx) {
          const value = await ctx.secret(ref);
          seen.push(value);
          throw new Error(`the receiver rejected ${value}`); // a careless sink quoting its secret
        },
      });
    const store = compute.openStore(env);
    try {
      for (const ref of ["env:RECEIVER_TOKEN", `secret:${secretId}`]) {
        const outcome = await dispatchOnce(dispatchContext(store), resolving(ref));
        expect(outcome.state).toBe("failed");
        // The kept error never holds the value.
        expect((outcome as { error: string }).error).toBe("the receiver rejected [secret]");
      }
      expect(seen).toEqual(["s3cr3t-receiver-token", "stored-hook-key"]);
      for (const ref of ["env:MISSING", "secret:00000000-0000-0000-0000-000000000000", "plain-value"]) {
        const outcome = await dispatchOnce(dispatchContext(store), resolving(ref));
        expect((outcome as { error: string }).error).toContain(JSON.stringify(ref));
      }
      const cursor = await observer.db.execute(sql`SELECT last_error FROM bc_sink_cursors WHERE sink = 'resolving-0'`);
      expect(JSON.stringify(cursor.rows)).not.toContain("s3cr3t");
    } finally {
      await store.close();
    }
  });
});
