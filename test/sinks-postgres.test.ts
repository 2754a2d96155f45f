// The sink dispatcher's ordering guarantees under real concurrency (docs/sinks.md): two passes
// racing over one sink never deliver at once, never go backwards and lose nothing (the cursor row
// held FOR UPDATE SKIP LOCKED is the fence), and the outbox is numbered in commit order, so an
// event whose transaction took a smaller id but committed last is delivered after, not skipped.
// Both need a Postgres server with concurrent sessions: PGlite runs one transaction at a time, so
// they are skipped there; `npm run test:pg` (and CI, beside npm test) runs them.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it } from "vitest";
import { betterCompute, defineSink, postgres, type SinkDefinition, type SinkEvent } from "../core/index.ts";
import { dispatchOnce, type PassOutcome } from "../core/events/dispatch.ts";
import type { Store } from "../core/store/database.ts";
import { realPostgres } from "./support/real-postgres.ts";

const run = crypto.randomUUID().slice(0, 8); // the database outlives a run: sinks and event types of this one
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A receiver that takes its time (or, while `hold` is set, waits for it), and notes every batch
 * and how many deliveries overlapped.
 */
function slowSink(id: string, maxBatch: number) {
  const state = {
    batches: [] as SinkEvent[][],
    inFlight: 0,
    maxInFlight: 0,
    hold: undefined as Promise<void> | undefined,
    entered: () => {},
  };
  const sink: SinkDefinition = defineSink({
    id,
    kind: "events",
    maxBatch,
    async deliver(batch) {
      state.maxInFlight = Math.max(state.maxInFlight, ++state.inFlight);
      try {
        state.entered();
        await (state.hold ?? sleep(40));
        state.batches.push(batch);
      } finally {
        state.inFlight--;
      }
    },
  });
  return { state, sink };
}

const raceSink = slowSink(`race-${run}`, 4);
const orderSink = slowSink(`order-${run}`, 100);
const compute = betterCompute({ database: postgres(), sinks: { events: [raceSink.sink, orderSink.sink] } });
const { openStore, needsServer, closeAll } = realPostgres(compute);
let observer: Store;

beforeAll(() => {
  observer = openStore();
});

afterAll(closeAll);

/** Starts a sink at the current end of the outbox (the shared database holds other runs' events). */
async function startAtEnd(sink: SinkDefinition): Promise<string> {
  const { rows } = await observer.db.execute(sql`
    INSERT INTO bc_sink_cursors (sink, source, position)
    VALUES (${sink.id}, 'events', (SELECT coalesce(max(outbox_seq), 0) FROM bc_events))
    RETURNING position::text AS position`);
  return (rows[0] as { position: string }).position;
}

async function publish(store: Store, type: string, subject: string): Promise<string> {
  const ctx = compute.moduleContext("core", env, store);
  return store.transaction(async (tx) => {
    await ctx.events.publish(tx, { type, subject, data: {} });
    const { rows } = await tx.execute(sql`SELECT id::text AS id FROM bc_events WHERE subject = ${subject} AND type = ${type}`);
    return (rows[0] as { id: string }).id;
  });
}

/** The outbox positions of these event ids, in the order given. */
async function positions(ids: Array<string | number>): Promise<number[]> {
  if (ids.length === 0) return [];
  const { rows } = await observer.db.execute(sql`
    SELECT id::text AS id, outbox_seq::text AS seq FROM bc_events WHERE id = ANY(${`{${ids.join(",")}}`}::bigint[])`);
  const seq = new Map((rows as Array<{ id: string; seq: string }>).map((r) => [r.id, Number(r.seq)]));
  return ids.map((id) => seq.get(String(id))!);
}

/** Every position the outbox holds after `from` up to and including `to`. */
async function outboxBetween(from: string, to: number): Promise<number[]> {
  const { rows } = await observer.db.execute(sql`
    SELECT outbox_seq::text AS seq FROM bc_events WHERE outbox_seq > ${from}::bigint AND outbox_seq <= ${to} ORDER BY outbox_seq`);
  return (rows as Array<{ seq: string }>).map((r) => Number(r.seq));
}

const cursorOf = async (sink: SinkDefinition) => {
  const { rows } = await observer.db.execute(sql`SELECT position::text AS position FROM bc_sink_cursors WHERE sink = ${sink.id}`);
  return Number((rows[0] as { position: string }).position);
};

it("two racing dispatchers never deliver one sink at once, never out of order, and lose nothing", async (test) => {
  await needsServer(test);
  const { sink, state } = raceSink;
  const start = await startAtEnd(sink);
  const type = `test.race.${run}`;
  const publisher = openStore();
  const published: string[] = [];
  for (let i = 0; i < 6; i++) published.push(await publish(publisher, type, `races/${i}`));

  // A second pass that starts while the first is inside deliver() finds the cursor held.
  const [a, b] = [openStore(), openStore()];
  const ctxA = compute.moduleContext("sinks", env, a);
  const ctxB = compute.moduleContext("sinks", env, b);
  let release!: () => void;
  state.hold = new Promise<void>((r) => (release = r));
  const delivering = new Promise<void>((r) => (state.entered = r));
  const firstPass = dispatchOnce(ctxA, sink);
  await delivering;
  expect(await dispatchOnce(ctxB, sink)).toEqual({ state: "busy" });
  release();
  expect(await firstPass).toEqual({ state: "delivered", count: 4, more: true });
  state.hold = undefined;

  // Then two dispatchers loop over the sink while more events are published, until caught up.
  let publishing = true;
  const outcomes: PassOutcome[] = [];
  const dispatcher = async (ctx: typeof ctxA) => {
    for (let pass = 0; pass < 500; pass++) {
      const outcome = await dispatchOnce(ctx, sink);
      outcomes.push(outcome);
      if (outcome.state === "caught-up" && !publishing) return;
      if (outcome.state !== "delivered") await sleep(5);
    }
    throw new Error("the dispatchers did not catch up");
  };
  const more = (async () => {
    for (let i = 6; i < 30; i++) published.push(await publish(publisher, type, `races/${i}`));
    publishing = false;
  })();
  await Promise.all([dispatcher(ctxA), dispatcher(ctxB), more]);
  // Caught up once publishing stopped: one last pass on each finds nothing new.
  expect((await dispatchOnce(ctxA, sink)).state).toBe("caught-up");

  expect(state.maxInFlight).toBe(1); // never two deliveries at once
  expect(outcomes.some((o) => o.state === "busy")).toBe(true); // and they did race

  // Never backwards, nothing twice: the delivered positions only go up. Nothing lost: they are
  // every position of the outbox from the start to the cursor, ours and any other writer's.
  const delivered = await positions(state.batches.flat().map((e) => e.id));
  const end = await cursorOf(sink);
  expect(delivered).toEqual(await outboxBetween(start, end));
  expect(delivered.every((p, i) => i === 0 || p > delivered[i - 1]!)).toBe(true);
  const ours = state.batches.flat().filter((e) => e.type === type);
  expect(ours.map((e) => String(e.id))).toEqual(published);
}, 60_000);

it("numbers the outbox in commit order: an event with a smaller id that commits last is delivered after, with no gap", async (test) => {
  await needsServer(test);
  const { sink, state } = orderSink;
  const start = await startAtEnd(sink);
  const type = `test.order.${run}`;
  const [early, late] = [openStore(), openStore()];
  const dispatch = () => dispatchOnce(compute.moduleContext("sinks", env, openStore()), sink);

  // `early` publishes first (the smaller id) and stays open while `late` publishes and commits.
  let earlyId!: string;
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let publishedEarly!: () => void;
  const hasEarlyId = new Promise<void>((r) => (publishedEarly = r));
  const earlyCtx = compute.moduleContext("core", env, early);
  const earlyTx = early.transaction(async (tx) => {
    await earlyCtx.events.publish(tx, { type, subject: "orders/early", data: {} });
    const { rows } = await tx.execute(sql`SELECT id::text AS id FROM bc_events WHERE type = ${type}`);
    earlyId = (rows[0] as { id: string }).id;
    publishedEarly();
    await held;
  });
  await hasEarlyId;
  const lateId = await publish(late, type, "orders/late");
  expect(BigInt(earlyId)).toBeLessThan(BigInt(lateId));

  // A pass now delivers `late`; `early` is not numbered yet, so the cursor moving past `late` skips nothing.
  expect((await dispatch()).state).toBe("delivered");
  release();
  await earlyTx;
  for (let pass = 0; pass < 10 && (await dispatch()).state !== "caught-up"; pass++);

  const [earlyAt, lateAt] = await positions([earlyId, lateId]);
  expect(lateAt).toBeLessThan(earlyAt!);
  const ours = state.batches.flat().filter((e) => e.type === type);
  expect(ours.map((e) => String(e.id))).toEqual([lateId, earlyId]);
  // No gap: what the sink got is every position from its start to its cursor, in order.
  const delivered = await positions(state.batches.flat().map((e) => e.id));
  expect(delivered).toEqual(await outboxBetween(start, await cursorOf(sink)));
  expect(await cursorOf(sink)).toBeGreaterThanOrEqual(earlyAt!);
}, 60_000);
