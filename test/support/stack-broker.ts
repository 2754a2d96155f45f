// The node project's global setup: a small HTTP server on 127.0.0.1 whose address test files
// inject (test/support/shared-stack.ts). Its first POST /stack starts a local stack in a fresh
// data dir; every request answers that same stack; the run's teardown stops it (and a watch mode
// rerun, so that it starts with a fresh one). A run whose files never ask starts nothing
// (local/stack.ts is not even imported).
//
// POST /stack/own {"main": "test/support/….ts"} starts a stack of the caller's own, running that
// Worker entry (a deployment with a test's plugins), and answers it with its id; DELETE
// /stack/own/<id> stops it, and the run's teardown stops any left. For a file that may import only
// public entry points (test/extensions/), which cannot call startStack itself.
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import type { TestProject } from "vitest/node";
import type { SharedStack } from "./shared-stack.ts";

interface Started {
  shared: SharedStack;
  stop(): Promise<void>;
}

async function start(main?: string): Promise<Started> {
  const { startStack } = await import("../../local/stack.ts");
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), main ? "bc-own-stack-" : "bc-shared-stack-"));
  const removeDataDir = () => fs.rmSync(dataDir, { recursive: true, force: true });
  try {
    const stack = await startStack({ dataDir, ...(main ? { main } : {}) });
    return {
      shared: { url: stack.url, adminKey: stack.adminKey, dataDir: stack.dataDir, databaseUrl: stack.databaseUrl },
      async stop() {
        await stack.stop();
        removeDataDir();
      },
    };
  } catch (err) {
    removeDataDir();
    throw err;
  }
}

/** The Worker entry a caller asked its own stack to run: a repository-relative .ts file under test/. */
async function ownMain(req: http.IncomingMessage): Promise<string> {
  let body = "";
  for await (const chunk of req) body += String(chunk);
  const main = (JSON.parse(body || "{}") as { main?: unknown }).main;
  if (typeof main !== "string" || !/^test\/[\w./-]+\.ts$/.test(main) || main.includes(".."))
    throw new Error('POST /stack/own takes {"main": "test/….ts"}, a Worker entry under test/');
  return main;
}

export default async function setup(project: TestProject) {
  let started: Promise<Started> | undefined;
  const own = new Map<string, Promise<Started>>();
  const answer = (res: http.ServerResponse, stack: Promise<Started>, id?: string) =>
    stack.then(
      ({ shared }) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ...shared, ...(id ? { id } : {}) })),
      (err: unknown) => res.writeHead(500).end(err instanceof Error ? (err.stack ?? err.message) : String(err)),
    );
  const stop = async (stack: Promise<Started> | undefined) =>
    stack?.then(
      (s) => s.stop(),
      () => {}, // the files that asked have reported why it did not start
    );
  const server = http.createServer((req, res) => {
    if (req.method === "POST" && req.url === "/stack") {
      started ??= start();
      return void answer(res, started);
    }
    if (req.method === "POST" && req.url === "/stack/own") {
      const id = crypto.randomUUID();
      const stack = ownMain(req).then(start);
      own.set(id, stack);
      return void answer(res, stack, id);
    }
    const stopping = req.method === "DELETE" && /^\/stack\/own\/([\w-]+)$/.exec(req.url ?? "")?.[1];
    if (stopping && own.has(stopping)) {
      const stack = own.get(stopping)!;
      own.delete(stopping);
      return void stop(stack).then(() => res.writeHead(204).end());
    }
    res.writeHead(404).end();
  });
  const stopStack = async () => {
    const stack = started;
    started = undefined;
    await stop(stack);
  };
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  project.provide("stackBroker", `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  project.onTestsRerun(stopStack);
  return async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await Promise.all([stopStack(), ...[...own.values()].map(stop)]);
  };
}
