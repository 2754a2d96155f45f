// The store contract: what every module relies on from the system of record. Each case
// works in tables of its own (bc_conf_<random>) and drops them, so it runs beside live data.
import { sql } from "drizzle-orm";
import { databaseClock, databaseEvents, databaseSecrets, databaseWork } from "../store/ports.ts";
import { isComputeError } from "../errors.ts";
import { fromPostgresError, one, rows, type Store, type Tx } from "../store/database.ts";
import { applyMigrations } from "../store/migrate.ts";
import type { ConformanceCase } from "./index.ts";

class Rollback extends Error {}

function check(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

/** Runs fn with a private table (id text primary key, n integer, doc jsonb), dropped afterwards. */
async function withTable(store: Store, fn: (table: string) => Promise<void>): Promise<void> {
  const table = `bc_conf_${crypto.randomUUID().replace(/-/g, "").slice(0, 12)}`;
  await store.db.execute(sql.raw(`CREATE TABLE ${table} (id text PRIMARY KEY, n integer NOT NULL DEFAULT 0, doc jsonb)`));
  try {
    await fn(table);
  } finally {
    await store.db.execute(sql.raw(`DROP TABLE IF EXISTS ${table}`));
  }
}

async function rolledBack(store: Store, fn: (tx: Tx) => Promise<void>): Promise<void> {
  try {
    await store.transaction(async (tx) => {
      await fn(tx);
      throw new Rollback();
    });
  } catch (err) {
    if (!(err instanceof Rollback)) throw err;
  }
}

export function storeConformanceCases(): ConformanceCase<Store>[] {
  return [
    {
      name: "a committed transaction is visible to later queries",
      run: (store) =>
        withTable(store, async (t) => {
          await store.transaction(async (tx) => {
            await tx.execute(sql.raw(`INSERT INTO ${t} (id) VALUES ('a')`));
          });
          check((await rows(store.db, sql.raw(`SELECT id FROM ${t}`))).length === 1, "the committed row is missing");
        }),
    },
    {
      name: "a transaction that throws leaves neither its state nor its events behind",
      run: (store) =>
        withTable(store, async (t) => {
          const subject = `conformance/${t}`;
          await rolledBack(store, async (tx) => {
            await tx.execute(sql.raw(`INSERT INTO ${t} (id) VALUES ('a')`));
            await databaseEvents("conformance", undefined, undefined).publish(tx, { type: "conformance.rolledBack", subject });
            await databaseWork("conformance").enqueue(tx, { queue: "conformance", key: subject });
          });
          check((await rows(store.db, sql.raw(`SELECT id FROM ${t}`))).length === 0, "the state survived the rollback");
          const events = await store.db.execute(sql`SELECT id FROM bc_events WHERE subject = ${subject}`);
          check(events.rows.length === 0, "the event survived the rollback");
          const work = await store.db.execute(sql`SELECT id FROM bc_work_items WHERE key = ${subject}`);
          check(work.rows.length === 0, "the work item survived the rollback");
        }),
    },
    {
      name: "an interactive transaction reads its own writes, others do not until it commits",
      run: (store) =>
        withTable(store, async (t) => {
          await store.transaction(async (tx) => {
            await tx.execute(sql.raw(`INSERT INTO ${t} (id, n) VALUES ('a', 41)`));
            await tx.execute(sql.raw(`UPDATE ${t} SET n = n + 1 WHERE id = 'a'`));
            const [row] = await rows(tx, sql.raw(`SELECT n FROM ${t} WHERE id = 'a'`));
            check(row?.n === 42, `read ${JSON.stringify(row)} inside the transaction, expected n = 42`);
          });
        }),
    },
    {
      name: "compute_now() is fixed within a transaction and never moves backwards",
      run: async (store) => {
        const clock = databaseClock(store);
        let first!: Date;
        await store.transaction(async (tx) => {
          first = await clock.now(tx);
          await tx.execute(sql`SELECT pg_sleep(0.01)`);
          const again = await clock.now(tx);
          check(first.getTime() === again.getTime(), "compute_now() moved inside one transaction");
        });
        const later = await clock.now();
        check(later.getTime() >= first.getTime(), "compute_now() went backwards");
      },
    },
    {
      name: "compute_now() follows the database clock's skew",
      run: async (store) => {
        const clock = databaseClock(store);
        await rolledBack(store, async (tx) => {
          const before = await clock.now(tx);
          await tx.execute(sql`UPDATE bc_clock SET skew = skew + interval '1 hour'`);
          const after = await clock.now(tx);
          check(
            after.getTime() - before.getTime() === 3_600_000,
            `skew of one hour moved compute_now() by ${after.getTime() - before.getTime()} ms`,
          );
        });
      },
    },
    {
      name: "jsonb, text[], timestamptz, bigint and unicode text round-trip",
      run: async (store) => {
        const doc = { a: [1, 2.5, null], b: { c: "ünïcode ✓" }, d: true };
        const row = (await one<{ doc: unknown; tags: unknown; at: unknown; big: unknown; s: unknown }>(
          store.db,
          sql`
          SELECT ${JSON.stringify(doc)}::jsonb AS doc, ARRAY['x', 'y z']::text[] AS tags,
                 '2026-01-02T03:04:05.678Z'::timestamptz AS at, 9007199254740993::bigint AS big, ${"ünïcode ✓"}::text AS s`,
        ))!;
        check(JSON.stringify(row.doc) === JSON.stringify(doc), `jsonb came back as ${JSON.stringify(row.doc)}`);
        check(JSON.stringify(row.tags) === JSON.stringify(["x", "y z"]), `text[] came back as ${JSON.stringify(row.tags)}`);
        check(new Date(row.at as string).toISOString() === "2026-01-02T03:04:05.678Z", `timestamptz came back as ${String(row.at)}`);
        check(String(row.big) === "9007199254740993", `bigint came back as ${String(row.big)} (precision lost)`);
        check(row.s === "ünïcode ✓", "unicode text was mangled");
      },
    },
    {
      name: "a unique violation is a CONFLICT that quotes no row values",
      run: (store) =>
        withTable(store, async (t) => {
          await store.db.execute(sql.raw(`INSERT INTO ${t} (id) VALUES ('hunter2')`));
          try {
            await store.db.execute(sql.raw(`INSERT INTO ${t} (id) VALUES ('hunter2')`));
          } catch (err) {
            const mapped = fromPostgresError(err);
            check(mapped?.code === "CONFLICT", `mapped to ${mapped?.code}`);
            check(!JSON.stringify(mapped.toJSON()).includes("hunter2"), "the error quotes the row's value");
            return;
          }
          throw new Error("the duplicate insert succeeded");
        }),
    },
    {
      name: "concurrent increments under SELECT ... FOR UPDATE lose no update",
      run: (store) =>
        withTable(store, async (t) => {
          await store.db.execute(sql.raw(`INSERT INTO ${t} (id, n) VALUES ('counter', 0)`));
          const increment = () =>
            store.transaction(async (tx) => {
              const [row] = await rows(tx, sql.raw(`SELECT n FROM ${t} WHERE id = 'counter' FOR UPDATE`));
              await tx.execute(sql.raw(`UPDATE ${t} SET n = ${Number(row?.n) + 1} WHERE id = 'counter'`));
            });
          await Promise.all(Array.from({ length: 8 }, increment));
          const [row] = await rows(store.db, sql.raw(`SELECT n FROM ${t} WHERE id = 'counter'`));
          check(row?.n === 8, `8 increments left n = ${String(row?.n)}`);
        }),
    },
    {
      name: "events publish in the caller's transaction with database time",
      run: async (store) => {
        const subject = `conformance/${crypto.randomUUID()}`;
        let eventId = "";
        await store.transaction(async (tx) => {
          eventId = await databaseEvents("conformance", "system:conformance", "req-1").publish(tx, {
            type: "conformance.happened",
            subject,
            data: { n: 1 },
          });
        });
        const row = await one<{ type: string; module: string; actor: string; data: { n: number }; past: boolean }>(
          store.db,
          sql`SELECT type, module, actor, data, occurred_at <= compute_now() AS past FROM bc_events WHERE event_id = ${eventId}`,
        );
        check(
          row?.type === "conformance.happened" && row.module === "conformance" && row.actor === "system:conformance",
          `event row ${JSON.stringify(row)}`,
        );
        check(row.data.n === 1 && row.past, "event data or time is wrong");
      },
    },
    {
      name: "enqueueing the same work key twice leaves one pending item",
      run: async (store) => {
        const key = `conformance/${crypto.randomUUID()}`;
        const work = databaseWork("conformance");
        for (let i = 0; i < 2; i++) {
          await store.transaction((tx) => work.enqueue(tx, { queue: "conformance", key, payload: { i } }));
        }
        const items = await rows<{ state: string; payload: { i: number } }>(
          store.db,
          sql`SELECT state, payload FROM bc_work_items WHERE queue = 'conformance' AND key = ${key}`,
        );
        check(items.length === 1, `${items.length} items for one key`);
        const row = items[0]!;
        check(row.state === "pending" && row.payload.i === 0, `the second enqueue changed the pending item: ${JSON.stringify(row)}`);
        await store.db.execute(sql`DELETE FROM bc_work_items WHERE queue = 'conformance' AND key = ${key}`);
      },
    },
    {
      name: "secrets are sealed at rest and resolve by reference",
      run: async (store) => {
        const secrets = databaseSecrets(store, "conformance-deployment-secret-0123456789");
        const value = `s3cr3t-${crypto.randomUUID()}`;
        const ref = await store.transaction((tx) => secrets.put(tx, { module: "conformance", name: "password", value }));
        check(/^secret:\/\/[0-9a-f-]{36}$/.test(ref), `reference ${ref} is not secret://<id>`);
        const stored = await store.db.execute(sql`SELECT sealed FROM bc_secrets WHERE id = ${ref.slice(9)}`);
        check(!JSON.stringify(stored.rows).includes(value), "the secret is stored in the clear");
        check((await secrets.resolve(ref)) === value, "the secret did not resolve to its value");
        const other = databaseSecrets(store, "another-deployment-secret-0123456789abc");
        const opened = await other.resolve(ref).then(
          () => true,
          () => false,
        );
        check(!opened, "a different deployment secret opened the sealed value");
        await store.db.execute(sql`DELETE FROM bc_secrets WHERE id = ${ref.slice(9)}`);
      },
    },
    {
      name: "migrations apply once, skip when run again, and refuse a changed text",
      run: async (store) => {
        const id = crypto.randomUUID().replace(/-/g, "").slice(0, 12);
        const migration = {
          name: `conformance/${id}`,
          sql: `CREATE TABLE bc_conf_m${id} (id int); INSERT INTO bc_conf_m${id} VALUES (1);`,
        };
        try {
          const first = await applyMigrations(store, [migration]);
          const second = await applyMigrations(store, [migration]);
          check(
            first.applied.length === 1 && second.skipped.length === 1 && second.applied.length === 0,
            "the migration did not apply exactly once",
          );
          const refused = await applyMigrations(store, [{ ...migration, sql: migration.sql + " -- edited" }]).then(
            () => undefined,
            (err: unknown) => err,
          );
          check(isComputeError(refused) && refused.code === "INVALID_CONFIG", "a changed migration was not refused with INVALID_CONFIG");
          const [row] = await rows(store.db, sql.raw(`SELECT count(*)::int AS n FROM bc_conf_m${id}`));
          check(row?.n === 1, "the migration's statements ran more than once");
        } finally {
          await store.db.execute(sql.raw(`DROP TABLE IF EXISTS bc_conf_m${id}`));
          await store.db.execute(sql`DELETE FROM bc_migrations WHERE name = ${migration.name}`);
        }
      },
    },
  ];
}
