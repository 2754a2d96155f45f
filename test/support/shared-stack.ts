// The node project's shared local stack, as a test file gets it: the first file to ask starts it
// (test/support/stack-broker.ts, the project's global setup, owns and stops it), the others get the
// same one. One `startStack` for docs.test.ts and cli.test.ts instead of one each. A file that
// uses it shares the database with the others, so it reads only what it made itself; a file that
// needs a fresh database, a config of its own or a stack it may stop starts its own.
import { inject } from "vitest";

declare module "vitest" {
  interface ProvidedContext {
    /** The broker's address (http://127.0.0.1:PORT): POST /stack answers the shared stack. */
    stackBroker: string;
  }
}

/** What a test file may use of the shared stack (startStack's Stack, without stop: the run stops it). */
export interface SharedStack {
  url: string;
  adminKey: string;
  dataDir: string;
  databaseUrl: string;
}

/** The shared stack, started by the first caller of the run (for a beforeAll: allow ~30 s). */
export async function sharedStack(): Promise<SharedStack> {
  const res = await fetch(`${inject("stackBroker")}/stack`, { method: "POST" });
  if (!res.ok) throw new Error(`the shared stack did not start: ${await res.text()}`);
  return (await res.json()) as SharedStack;
}
