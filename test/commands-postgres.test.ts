// Enqueueing commands under real concurrency (docs/agent-protocol.md, "Delivery guarantees"):
// transactions enqueueing to one node do not wait for each other (a site agent takes every BMC
// command of its site), a command whose transaction commits after a later-numbered one was sent
// is still delivered, and a revocation waits for the enqueues in progress, after which none
// lands. Needs a Postgres server with concurrent sessions: PGlite runs one transaction at a time,
// so these are skipped there; `npm run test:pg` (and CI, beside npm test) runs them.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it } from "vitest";
import { betterCompute, postgres } from "../core/index.ts";
import { nextDelivery } from "../core/agents/sessions.ts";
import type { Store, Tx } from "../core/store/database.ts";
import { realPostgres } from "./support/real-postgres.ts";

const run = crypto.randomUUID().slice(0, 8); // the database outlives a run: nodes and keys of this one
const compute = betterCompute({ database: postgres() });
const { openStore, needsServer, closeAll } = realPostgres(compute);
let observer: Store;

beforeAll(() => {
  observer = openStore();
});

afterAll(closeAll);

async function node(name: string): Promise<string> {
  const id = `cp-${run}-${name}`;
  await observer.db.execute(sql`INSERT INTO bc_nodes (id, role, public_key, attestor) VALUES (${id}, 'site', 'key', 'test')`);
  return id;
}

const enqueue = (tx: Tx, nodeId: string, key: string) =>
  compute.moduleContext("agents", env, observer).commands.enqueue(tx, { nodeId, kind: "agent.ping", key: `${run}:${key}` });

/** Enqueues in a transaction that stays open until `commit()`; `enqueued` resolves once the statement ran. */
function heldEnqueue(store: Store, nodeId: string, key: string) {
  let commit!: () => void;
  const release = new Promise<void>((r) => (commit = r));
  let enqueued!: (command: { id: string; seq: number }) => void;
  const ran = new Promise<{ id: string; seq: number }>((r) => (enqueued = r));
  const done = store.transaction(async (tx) => {
    enqueued(await enqueue(tx, nodeId, key));
    await release;
  });
  return { ran, commit, done };
}

/** Resolves with the promise's value, or "still waiting" if it has not settled within ms. */
const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([promise, new Promise<"still waiting">((r) => setTimeout(() => r("still waiting"), ms))]);

const secrets = () => compute.moduleContext("agents", env, observer).secrets;
const deliver = async (nodeId: string, afterSeq: number) =>
  (await nextDelivery(observer, nodeId, { afterSeq, specAfter: null, limit: 100 }, secrets)).frames.map((f) => ({ id: f.id, seq: f.seq }));

it("enqueues to one node do not wait for each other, and one committed after a later one was sent is still delivered", async (test) => {
  await needsServer(test);
  const site = await node("site");
  const early = heldEnqueue(openStore(), site, "early");
  const first = await early.ran;

  // Another transaction enqueues to the same node and commits while the first is still open.
  const later = openStore();
  const second = await within(
    later.transaction((tx) => enqueue(tx, site, "later")),
    10_000,
  );
  expect(second).not.toBe("still waiting");
  const late = second as { id: string; seq: number };
  expect(late.seq).toBeGreaterThan(first.seq);

  // The agent's socket is sent the later one first: the earlier is not committed yet.
  expect(await deliver(site, 0)).toEqual([{ id: late.id, seq: late.seq }]);
  early.commit();
  await early.done;
  // Its seq is below what the socket was sent, and it is delivered all the same, once.
  expect(await deliver(site, late.seq)).toEqual([{ id: first.id, seq: first.seq }]);
  expect(await deliver(site, late.seq)).toEqual([]);
  // A new socket (afterSeq 0) is sent both again, in seq order: neither has a result.
  expect(await deliver(site, 0)).toEqual([
    { id: first.id, seq: first.seq },
    { id: late.id, seq: late.seq },
  ]);
}, 60_000);

it("a revocation waits for the enqueues in progress; after it, enqueueing to the node is NOT_FOUND", async (test) => {
  await needsServer(test);
  const site = await node("revoked");
  const open = heldEnqueue(openStore(), site, "before");
  await open.ran;
  const revoking = openStore().transaction((tx) =>
    compute.moduleContext("agents", env, observer).nodes.revoke(tx, { nodeId: site }, "test"),
  );
  expect(await within(revoking, 500)).toBe("still waiting");
  open.commit();
  await open.done;
  expect(await revoking).toEqual([site]);
  await expect(observer.transaction((tx) => enqueue(tx, site, "after"))).rejects.toMatchObject({ code: "NOT_FOUND" });
}, 60_000);
