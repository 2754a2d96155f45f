// Starts the database the workers project tests against (PGlite, or the server named by
// BC_TEST_DATABASE_URL), the WebSocket bridge the Worker's driver reaches it through, and
// applies the core migrations. Tests read the addresses through inject().
import type { TestProject } from "vitest/node";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore } from "../../local/node-store.ts";
import { startPglite } from "../../local/pglite-server.ts";
import { startBridge, type Bridge } from "../../local/ws-bridge.ts";

declare module "vitest" {
  interface ProvidedContext {
    databaseUrl: string;
    bridge: string;
  }
}

export default async function setup(project: TestProject) {
  const external = process.env.BC_TEST_DATABASE_URL;
  const pglite = external ? undefined : await startPglite();
  let bridge: Bridge | undefined;
  const teardown = async () => {
    await bridge?.stop();
    await pglite?.stop();
  };
  try {
    const databaseUrl = external ?? pglite!.connectionString;
    bridge = await startBridge();
    const store = await openNodeStore(databaseUrl, { bridge: bridge.url });
    try {
      await applyMigrations(store, coreMigrations());
    } catch (err) {
      // The driver's own message (e.g. "password authentication failed") is in the cause.
      throw new Error(`could not apply the core migrations to ${redacted(databaseUrl)}: ${innermost(err)}`, { cause: err });
    } finally {
      await store.close();
    }
    project.provide("databaseUrl", databaseUrl);
    project.provide("bridge", bridge.url);
  } catch (err) {
    // Vitest runs no teardown for a setup that throws: stop what was started, or the
    // bridge's listening socket keeps the run from exiting.
    await teardown();
    throw err;
  }
  return teardown;
}

function redacted(url: string): string {
  const shown = new URL(url);
  if (shown.password) shown.password = "***";
  return shown.href;
}

function innermost(err: unknown): string {
  while (err instanceof Error && err.cause !== undefined) err = err.cause;
  return err instanceof Error ? err.message : String(err);
}
