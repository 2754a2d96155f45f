// The harness of the suites that need a Postgres server with concurrent sessions (they race
// transactions): stores opened on the test database, all closed after, and a check that skips a
// test on PGlite, which runs one transaction at a time. `npm run test:pg` (and CI) runs them.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import type { TestContext } from "vitest";
import type { Compute } from "../../core/compute.ts";
import type { Store } from "../../core/store/database.ts";

export function realPostgres(compute: Compute) {
  const stores: Store[] = [];
  let isServer: boolean | undefined;
  const openStore = () => {
    const store = compute.openStore(env);
    stores.push(store);
    return store;
  };
  return {
    openStore,
    /** Call first in a test that races transactions: skips it on PGlite. */
    async needsServer(test: TestContext) {
      if (isServer === undefined) {
        const { rows } = await openStore().db.execute(sql`SELECT version() AS v`);
        isServer = !/emscripten|wasm/i.test(String((rows[0] as { v: string }).v));
      }
      if (isServer) return;
      console.log("skipped: PGlite runs one transaction at a time, so nothing races; run it with npm run test:pg (a Postgres server)");
      test.skip();
    },
    closeAll: () => Promise.all(stores.map((s) => s.close())),
  };
}
