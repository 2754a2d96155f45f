// The node project's global setup: a small HTTP server on 127.0.0.1 whose address test files
// inject (test/support/shared-stack.ts). Its first POST /stack starts a local stack in a fresh
// data dir; every request answers that same stack; the run's teardown stops it (and a watch mode
// rerun, so that it starts with a fresh one). A run whose files never ask starts nothing
// (local/stack.ts is not even imported).
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

async function start(): Promise<Started> {
  const { startStack } = await import("../../local/stack.ts");
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-shared-stack-"));
  const removeDataDir = () => fs.rmSync(dataDir, { recursive: true, force: true });
  try {
    const stack = await startStack({ dataDir });
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

export default async function setup(project: TestProject) {
  let started: Promise<Started> | undefined;
  const server = http.createServer((req, res) => {
    if (req.method !== "POST" || req.url !== "/stack") {
      res.writeHead(404).end();
      return;
    }
    started ??= start();
    started.then(
      ({ shared }) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(shared)),
      (err: unknown) => res.writeHead(500).end(err instanceof Error ? (err.stack ?? err.message) : String(err)),
    );
  });
  const stopStack = async () => {
    const stack = started;
    started = undefined;
    await stack?.then(
      (s) => s.stop(),
      () => {}, // the files that asked have reported why it did not start
    );
  };
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  project.provide("stackBroker", `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  project.onTestsRerun(stopStack);
  return async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await stopStack();
  };
}
