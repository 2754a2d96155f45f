// The store over a Hyperdrive binding: node-postgres over TCP. In Node (the driver's node:net socket)
// it passes the same store conformance cases as the WebSocket driver; under `wrangler dev` the local
// stack binds HYPERDRIVE (wrangler's emulation, cloudflare:sockets in workerd) and gives the Worker no
// bridge, so every request the API answers went through the binding.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { postgres, sendWithCommit } from "../../core/store/database.ts";
import { runConformance, storeConformanceCases } from "../../core/conformance/index.ts";
import { LOCAL_CONNECTION_STRING_VAR, localHyperdrive } from "../../local/hyperdrive.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations } from "../../local/node-store.ts";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-hyperdrive-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe("the store on a HYPERDRIVE binding (node-postgres over TCP)", () => {
  let pglite: PgliteServer;
  beforeAll(async () => {
    pglite = await startPglite({ dataDir: path.join(tmp, "pglite") });
    const store = postgres({ hyperdrive: { connectionString: pglite.connectionString } }).open({});
    try {
      await applyMigrations(store, coreMigrations());
    } finally {
      await store.close();
    }
  }, 60_000);
  afterAll(() => pglite?.stop());

  it("passes every store conformance case", async () => {
    const port = postgres();
    const env = { HYPERDRIVE: { connectionString: pglite.connectionString } as Hyperdrive };
    const report = await runConformance(storeConformanceCases(), () => port.open(env), { dispose: (store) => store.close() });
    expect(report.failed).toEqual([]);
    expect(report.passed).toHaveLength(storeConformanceCases().length);
  });

  it("is used rather than DATABASE_URL when both are set", async () => {
    // Nothing listens on port 9: a store that went to DATABASE_URL could not answer.
    const env = {
      HYPERDRIVE: { connectionString: pglite.connectionString } as Hyperdrive,
      DATABASE_URL: "postgres://x:y@127.0.0.1:9/none",
    };
    const store = postgres().open(env);
    try {
      const { rows } = await store.db.execute(sql`SELECT 1::int AS one, 2::bigint AS big, '{"a":[1]}'::jsonb AS doc`);
      // The WebSocket driver's shapes: int4 a number, int8 a string, jsonb parsed.
      expect(rows).toEqual([{ one: 1, big: "2", doc: { a: [1] } }]);
    } finally {
      await store.close();
    }
  });

  it("writes a transaction's BEGIN with its first statement (one round trip); with pipeline off, as the WebSocket driver does", async () => {
    const held = "/* sent with commit */ select 2";
    for (const [pipeline, expected] of [
      [undefined, ["begin;\nselect 1", `${held};\ncommit`]],
      // Without pipelining a held statement with no parameters still rides in the COMMIT's simple query.
      [false, ["begin", "select 1", `${held};\ncommit`]],
    ] as const) {
      const statements: string[] = [];
      const store = postgres({
        hyperdrive: { connectionString: pglite.connectionString },
        pipeline,
        onRoundTrip: (s) => statements.push(s),
      }).open({});
      try {
        const rows = await store.transaction(async (tx) => {
          const { rows } = await tx.execute(sql`SELECT 1 AS one`);
          await sendWithCommit(tx, "SELECT 2");
          return rows;
        });
        expect(rows).toEqual([{ one: 1 }]);
        expect(statements.map((s) => s.trim().toLowerCase().replace(" as one", ""))).toEqual(expected);
      } finally {
        await store.close();
      }
    }
  });

  it("with preparedStatements, parses a statement with parameters once per connection and binds it after", async () => {
    // One connection: the local PGlite server shares one session between its connections.
    const store = postgres({ hyperdrive: { connectionString: pglite.connectionString }, maxConnections: 1, preparedStatements: true }).open(
      {},
    );
    try {
      const doubled = [];
      for (const n of [1, 2, 3]) doubled.push((await store.db.execute(sql`SELECT ${n}::int * 2 AS doubled`)).rows[0]);
      expect(doubled).toEqual([{ doubled: 2 }, { doubled: 4 }, { doubled: 6 }]);
      await store.db.execute(sql`SELECT 1 AS unnamed`); // no parameters: nothing to reuse, not named
      const { rows } = await store.db.execute(
        sql`SELECT name, statement, generic_plans + custom_plans AS runs FROM pg_prepared_statements WHERE name LIKE 'bc\\_%'`,
      );
      expect(rows).toEqual([{ name: expect.stringMatching(/^bc_[0-9a-z]+$/), statement: "SELECT $1::int * 2 AS doubled", runs: "3" }]);
      await store.db.execute(sql`DEALLOCATE ALL`); // the next connection to this PGlite may reuse the name
    } finally {
      await store.close();
    }
  });

  it("refuses a binding with no connection string with INVALID_CONFIG", () => {
    expect(() => postgres().open({ HYPERDRIVE: {} as Hyperdrive })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
  });
});

describe("the local stack's HYPERDRIVE binding", () => {
  it("runs a copy of a config that does not declare it, with main made absolute and the binding added", () => {
    const dir = fs.mkdtempSync(path.join(tmp, "config-"));
    const original = path.join(dir, "wrangler.toml");
    fs.writeFileSync(original, 'name = "w"\nmain = "src/index.ts"\n\n[observability]\nenabled = true\n');
    const local = localHyperdrive(original, dir, "postgres://u:p@127.0.0.1:5/db");
    expect(local.config).not.toBe(original);
    const copy = fs.readFileSync(local.config, "utf8");
    expect(copy).toContain(`main = ${JSON.stringify(path.join(dir, "src", "index.ts"))}`);
    expect(copy).toContain("[observability]\nenabled = true\n");
    expect(copy).toMatch(/\[\[hyperdrive\]\]\nbinding = "HYPERDRIVE"\nid = "local"\n$/);
    // The database's URL (its password) is handed over in the environment, not written into the copy.
    expect(copy).not.toContain("u:p@");
    expect(local.env).toEqual({ [LOCAL_CONNECTION_STRING_VAR]: "postgres://u:p@127.0.0.1:5/db" });

    const declared = path.join(dir, "declared.toml");
    fs.writeFileSync(declared, 'name = "w"\nmain = "src/index.ts"\n\n[[hyperdrive]]\nbinding = "HYPERDRIVE"\nid = "abc"\n');
    expect(localHyperdrive(declared, dir, "postgres://u:p@127.0.0.1:5/db").config).toBe(declared);
  });

  describe("npm start's stack", () => {
    let stack: Stack;
    beforeAll(async () => {
      stack = await startStack({ dataDir: path.join(tmp, "stack") });
    }, 120_000);
    afterAll(() => stack?.stop());

    it("reaches the database only through the binding: the Worker has no bridge, and reads and writes answer", async () => {
      expect(stack.databasePath).toBe("hyperdrive");
      const devEnv = fs.readFileSync(path.join(stack.dataDir, "dev.env"), "utf8");
      expect(devEnv).not.toContain("BC_DB_WS_PROXY");
      // Each throws unless the API answers 200.
      await callApi(stack.url, stack.adminKey, "iam.whoami");
      await callApi(stack.url, stack.adminKey, "joinTokens.create", { role: "node" });
      expect((await fetch(`${stack.url}/v1/health`)).status).toBe(200);
    });
  });
});
