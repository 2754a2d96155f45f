// `npm run test:pg [-- vitest args]`: the workers test project against a real Postgres
// server instead of PGlite. test/support/global-setup.ts does the work (bridge, core
// migrations) when BC_TEST_DATABASE_URL is set; this only refuses early and clearly when
// it is missing or can't work, then runs `vitest run --project workers`.
//
//   BC_TEST_DATABASE_URL=postgres://user:password@127.0.0.1:5432/db npm run test:pg
//
// Use a database made for the run: the tests write to it (they pass again on the same
// database, but leave their rows behind).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";
import { isLoopbackHost } from "../local/ws-bridge.ts";

const USAGE = "usage: BC_TEST_DATABASE_URL=postgres://user:password@127.0.0.1:5432/db npm run test:pg [-- vitest args]";

function refuse(reason: string): never {
  console.error(`test:pg: ${reason}\n${USAGE}`);
  process.exit(2);
}

const raw = process.env.BC_TEST_DATABASE_URL?.trim();
if (!raw) refuse("BC_TEST_DATABASE_URL is not set; this suite runs against a Postgres server you name (`npm test` uses PGlite)");

let url: URL;
try {
  url = new URL(raw);
} catch {
  refuse("BC_TEST_DATABASE_URL is not a URL");
}
if (url.protocol !== "postgres:" && url.protocol !== "postgresql:")
  refuse(`BC_TEST_DATABASE_URL must be a postgres:// URL, not ${url.protocol}//`);
const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
// The Worker reaches the database through local/ws-bridge.ts, which only relays to loopback.
if (!isLoopbackHost(host)) refuse(`the test bridge only reaches this machine (127.0.0.1, ::1, localhost), not ${url.hostname}`);
if (!url.pathname.replace(/^\//, "")) refuse("BC_TEST_DATABASE_URL names no database");
const port = Number(url.port || 5432);

// A server that isn't there otherwise shows up as a connection error deep in the global setup.
await new Promise<void>((resolve) => {
  const socket = net.connect({ host, port });
  socket.setTimeout(5000);
  const fail = (why: string) => {
    socket.destroy();
    refuse(`nothing answers at ${url.hostname}:${port} (${why}); is the Postgres server running?`);
  };
  socket.once("connect", () => {
    socket.end();
    resolve();
  });
  socket.once("timeout", () => fail("timed out"));
  socket.once("error", (err: NodeJS.ErrnoException) => fail(err.code ?? err.message));
});

const vitestPackage = createRequire(import.meta.url).resolve("vitest/package.json");
const vitest = path.join(path.dirname(vitestPackage), "vitest.mjs");
const shown = new URL(url);
if (shown.password) shown.password = "***";
console.log(`test:pg: workers project against ${shown.href}`);

const child = spawn(process.execPath, [vitest, "run", "--project", "workers", ...process.argv.slice(2)], {
  stdio: "inherit",
  env: process.env,
});
// Ctrl-C reaches vitest directly (same process group); wait for it to finish its teardown.
process.on("SIGINT", () => {});
process.on("SIGTERM", () => child.kill("SIGTERM"));
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
