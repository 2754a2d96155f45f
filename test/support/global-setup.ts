// Starts the database the workers project tests against (PGlite, or the server named by
// BC_TEST_DATABASE_URL), the WebSocket bridge the Worker's driver reaches it through, and
// applies the core migrations. Tests read the addresses through inject().
import type { TestProject } from "vitest/node";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore } from "../../scripts/local/node-store.ts";
import { startPglite } from "../../scripts/local/pglite-server.ts";
import { startBridge } from "../../scripts/local/ws-bridge.ts";

declare module "vitest" {
  interface ProvidedContext {
    databaseUrl: string;
    bridge: string;
  }
}

export default async function setup(project: TestProject) {
  const external = process.env.BC_TEST_DATABASE_URL;
  const pglite = external ? undefined : await startPglite();
  const databaseUrl = external ?? pglite!.connectionString;
  const bridge = await startBridge();
  const store = await openNodeStore(databaseUrl, { bridge: bridge.url });
  try {
    await applyMigrations(store, coreMigrations());
  } finally {
    await store.close();
  }
  project.provide("databaseUrl", databaseUrl);
  project.provide("bridge", bridge.url);
  return async () => {
    await bridge.stop();
    await pglite?.stop();
  };
}
