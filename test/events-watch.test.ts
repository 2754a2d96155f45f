// events.watch (Server-Sent Events from the API Worker) and audit.list, through the real Worker
// in workerd against Postgres: the API key and IAM decision of events.list, the live tail, and a
// client that reconnects with Last-Event-ID missing nothing and getting nothing twice; the cursor
// under it never skips an event whose transaction commits late (that part needs a Postgres server
// with concurrent sessions: PGlite runs one transaction at a time, so it is skipped there).
import { env, exports } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { EventCursor } from "../core/events/watch.ts";
import type { Store } from "../core/store/database.ts";

let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

interface Message {
  id?: string;
  event?: string;
  data?: string;
  retry?: string;
}

/** Reads a text/event-stream body message by message, as EventSource parses it (comments dropped). */
function sseReader(res: Response) {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  return {
    async next(): Promise<Message> {
      for (;;) {
        const end = buffer.indexOf("\n\n");
        if (end >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const message: Message = {};
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const [field, ...rest] = line.split(":");
            const value = rest.join(":").replace(/^ /, "");
            if (field === "data") message.data = message.data === undefined ? value : `${message.data}\n${value}`;
            else if (field === "id" || field === "event" || field === "retry") message[field] = value;
          }
          if (Object.keys(message).length > 0) return message;
          continue;
        }
        const { value, done } = await reader.read();
        if (done) throw new Error("the stream ended");
        buffer += value;
      }
    },
    /** The next message that is an event (skips the retry advice). */
    async event(): Promise<Message & { id: string; data: string }> {
      for (;;) {
        const message = await this.next();
        if (message.data !== undefined) return message as Message & { id: string; data: string };
      }
    },
    close: () => reader.cancel(),
  };
}

/** Opens the stream through the Worker's own fetch; resolves once the server holds its position. */
async function watch(query: string, headers: Record<string, string> = {}) {
  const res = await exports.default.fetch(`http://bc.test/v1/events.watch${query}`, {
    headers: { authorization: `Bearer ${client.key}`, ...headers },
  });
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
  const stream = sseReader(res);
  // The retry advice is written once the position is taken: events after this are the stream's.
  expect((await stream.next()).retry).toMatch(/^\d+$/);
  return stream;
}

/** Mints an API key through the API: one iam.apiKey.created event each. */
async function publish(count: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    expect((await client.call("iam.apiKeys.create", { name: `watch-${i}`, roles: ["viewer"] })).status).toBe(200);
  }
}

const TYPE = "iam.apiKey.*";

describe("events.watch", () => {
  it("a client that reconnects with Last-Event-ID gets every event published while it was away, none twice", async () => {
    const first = await watch(`?type=${TYPE}`);
    await publish(3);
    const seen: Message[] = [];
    for (let i = 0; i < 3; i++) seen.push(await first.event());
    await first.close();

    // Away: these are published with nobody listening.
    await publish(4);

    const again = await watch(`?type=${TYPE}`, { "last-event-id": seen.at(-1)!.id! });
    for (let i = 0; i < 4; i++) seen.push(await again.event());
    // And live again after the catch-up.
    await publish(1);
    seen.push(await again.event());
    await again.close();

    // Exactly the record from the first event on, in order: events.list is the reference.
    const listed = await client.call("events.list", { type: TYPE, after: String(Number(seen[0]!.id) - 1), limit: 500 });
    const ids = seen.map((m) => m.id);
    expect(new Set(ids).size).toBe(ids.length);
    const reference = (listed.body.events as { position: string }[]).filter((e) => Number(e.position) <= Number(ids.at(-1)));
    expect(ids).toEqual(reference.map((e) => e.position));
    // Each message is the event as events.list shows it, named by its type.
    for (const message of seen) {
      const event = (listed.body.events as { position: string; type: string }[]).find((e) => e.position === message.id)!;
      expect(JSON.parse(message.data!)).toEqual(event);
      expect(message.event).toBe(event.type);
    }
  });

  it("resumes after ?after= too (0: from the beginning), and a Last-Event-ID header (a reconnecting EventSource's) wins over it", async () => {
    await publish(3);
    const { body } = await client.call("events.list", { type: TYPE, order: "desc", limit: 3 });
    const [third, second, first] = (body.events as { position: string }[]).map((e) => e.position);

    const fromQuery = await watch(`?type=${TYPE}&after=${first}`);
    expect((await fromQuery.event()).id).toBe(second);
    expect((await fromQuery.event()).id).toBe(third);
    await fromQuery.close();

    const fromHeader = await watch(`?type=${TYPE}&after=${first}`, { "last-event-id": second! });
    expect((await fromHeader.event()).id).toBe(third);
    await fromHeader.close();

    // after=0 is the record's beginning, not the live tail.
    const { body: oldest } = await client.call("events.list", { type: TYPE, limit: 1 });
    const fromStart = await watch(`?type=${TYPE}&after=0`);
    expect((await fromStart.event()).id).toBe(oldest.events[0].position);
    await fromStart.close();
  });

  it("asks for the API key and the events.list permission, and refuses a malformed query with the error envelope", async () => {
    const get = (query: string, headers: Record<string, string>) =>
      exports.default.fetch(`http://bc.test/v1/events.watch${query}`, { headers });
    const refused = async (res: Response, status: number, code: string) => {
      expect(res.status).toBe(status);
      const body = (await res.json()) as { code: string; requestId: string };
      expect(body.code).toBe(code);
      expect(body.requestId).toBe(res.headers.get("x-request-id"));
    };
    const auth = { authorization: `Bearer ${client.key}` };
    await refused(await get("", {}), 401, "UNAUTHENTICATED");
    await refused(await get("", { authorization: "Bearer bck_0123456789abcdef_" + "x".repeat(43) }), 401, "UNAUTHENTICATED");
    await refused(await get("?limit=5", auth), 400, "INVALID_ARGUMENT");
    await refused(await get("?type=not%20a%20type", auth), 400, "INVALID_ARGUMENT");
    await refused(await get("?after=x", auth), 400, "INVALID_ARGUMENT");
    await refused(await get("", { ...auth, "last-event-id": "12; DROP" }), 400, "INVALID_ARGUMENT");

    // A role without events.list (the default deployment's vps tenants) may not watch either.
    const tenant = await client.mintKey(["vps-tenant"]);
    const denied = await client.request("/v1/events.watch", { headers: { authorization: `Bearer ${tenant}` } });
    await refused(denied, 403, "PERMISSION_DENIED");
    const viewer = await client.mintKey(["viewer"]);
    const allowed = await client.request("/v1/events.watch", { headers: { authorization: `Bearer ${viewer}` } });
    expect(allowed.status).toBe(200);
    await allowed.body!.cancel();
  });
});

describe("the cursor under events.watch", () => {
  const type = () => `test.watch.${crypto.randomUUID().slice(0, 8)}`;
  const publish = (store: Store, tx: Parameters<Parameters<Store["transaction"]>[0]>[0], eventType: string, n: number) =>
    compute.moduleContext("core", env, store).events.publish(tx, { type: eventType, data: { n } });

  /** Polls until `count` events came, as the stream does (a gap waits for the transactions that could fill it). */
  async function take(cursor: EventCursor, count: number) {
    const got: { type: string; data: Record<string, unknown> }[] = [];
    for (let polls = 0; got.length < count; polls++) {
      if (polls > 200) throw new Error(`only ${got.length} of ${count} events after 200 polls`);
      got.push(...(await cursor.next()).events);
      if (got.length < count) await new Promise((r) => setTimeout(r, 50));
    }
    return got;
  }

  it("passes over the ids of a rolled back transaction", async () => {
    const t = type();
    const store = client.store;
    const cursor = new EventCursor(store, { type: t }, undefined);
    await cursor.start();
    await store
      .transaction(async (tx) => {
        await publish(store, tx, t, 1);
        throw new Error("rolled back");
      })
      .catch(() => {});
    await store.transaction((tx) => publish(store, tx, t, 2));
    expect((await take(cursor, 1)).map((e) => e.data.n)).toEqual([2]);
  });

  it("hands out events in commit order: one whose transaction inserted first but commits last comes after, and is not missed", async (test) => {
    const { rows } = await client.store.db.execute(sql`SELECT version() AS v`);
    if (/emscripten|wasm/i.test(String((rows[0] as { v: string }).v))) {
      console.log("skipped: PGlite runs one transaction at a time; run it with npm run test:pg (a Postgres server)");
      test.skip();
    }
    const t = type();
    const [early, late, watcher] = [compute.openStore(env), compute.openStore(env), compute.openStore(env)];
    const cursor = new EventCursor(watcher, { type: t }, undefined);
    await cursor.start();
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let published!: () => void;
    const hasLowerId = new Promise<void>((r) => (published = r));
    // The lower id, in a transaction that stays open (its event has no position yet)...
    const slow = early.transaction(async (tx) => {
      await publish(early, tx, t, 1);
      published();
      await held;
    });
    try {
      await hasLowerId;
      // ...while a higher one commits: it is handed out at once, the open one's is not.
      await late.transaction((tx) => publish(late, tx, t, 2));
      expect((await take(cursor, 1)).map((e) => e.data.n)).toEqual([2]);
      expect((await cursor.next()).events).toEqual([]);
      release();
      await slow;
      expect((await take(cursor, 1)).map((e) => e.data.n)).toEqual([1]);
    } finally {
      release();
      await slow;
      await Promise.all([early.close(), late.close(), watcher.close()]);
    }
  });
});

describe("audit.list", () => {
  it("lists the audit rows of mutating calls, filtered by actor, action, resource and time, paged", async () => {
    const operator = await client.mintKey(["admin"]);
    const { body: me } = await client.call("iam.whoami", {}, { key: operator });
    const before = new Date(Date.now() - 60_000).toISOString();
    for (const name of ["audit-a", "audit-b", "audit-c"]) {
      expect((await client.call("iam.apiKeys.create", { name, roles: ["viewer"] }, { key: operator })).status).toBe(200);
    }
    // Read-only calls leave no row.
    const mine = await client.call("audit.list", { actor: me.principal });
    expect(mine.status).toBe(200);
    expect(mine.body.entries.map((e: any) => [e.action, e.resource])).toEqual([
      ["iam.apiKeys.create", "apiKeys/audit-a"],
      ["iam.apiKeys.create", "apiKeys/audit-b"],
      ["iam.apiKeys.create", "apiKeys/audit-c"],
    ]);
    expect(mine.body.entries[0]).toMatchObject({ actor: me.principal, method: "iam.apiKeys.create", requestId: expect.any(String) });

    const byResource = await client.call("audit.list", { actor: me.principal, resource: "apiKeys/audit-b" });
    expect(byResource.body.entries.map((e: any) => e.resource)).toEqual(["apiKeys/audit-b"]);
    const byPrefix = await client.call("audit.list", { actor: me.principal, action: "iam.*", resource: "apiKeys/*", order: "desc" });
    expect(byPrefix.body.entries.map((e: any) => e.resource)).toEqual(["apiKeys/audit-c", "apiKeys/audit-b", "apiKeys/audit-a"]);
    expect((await client.call("audit.list", { actor: me.principal, action: "metal.*" })).body.entries).toEqual([]);

    const page1 = await client.call("audit.list", { actor: me.principal, limit: 2 });
    expect(page1.body.next).toBe(page1.body.entries[1].id);
    const page2 = await client.call("audit.list", { actor: me.principal, limit: 2, after: page1.body.next });
    expect(page2.body.entries.map((e: any) => e.resource)).toEqual(["apiKeys/audit-c"]);
    expect(page2.body.next).toBeNull();

    const at = mine.body.entries[1].at;
    const window = await client.call("audit.list", { actor: me.principal, from: at, to: new Date(Date.now() + 3_600_000).toISOString() });
    expect(window.body.entries.map((e: any) => e.resource)).toContain("apiKeys/audit-b");
    expect((await client.call("audit.list", { actor: me.principal, to: before })).body.entries).toEqual([]);
    const backwards = await client.call("audit.list", { from: at, to: before });
    expect(backwards.status).toBe(400);
    expect(backwards.body.code).toBe("INVALID_ARGUMENT");
  });
});
