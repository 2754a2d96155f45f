// What the local stack shows an operator of wrangler dev's output: a server error reaches it as
// one line carrying the request id the response carried; info logs and request lines do not.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startStack, type Stack } from "../../local/stack.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-stack-logs-"));
const shown: string[] = [];
let stack: Stack;

beforeAll(async () => {
  stack = await startStack({ dataDir, main: "test/support/failing-worker.ts", onOutput: (line) => shown.push(line) });
}, 120_000);
afterAll(async () => {
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

it("shows every 5xx as one line with its request id, and keeps info logs and request lines out", async () => {
  const res = await fetch(`${stack.url}/v1/acme.explode`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.adminKey}`, "content-type": "application/json" },
    body: "{}",
  });
  expect(res.status).toBe(500);
  const requestId = res.headers.get("x-request-id");
  expect(requestId).toBeTruthy();

  const deadline = Date.now() + 15_000;
  while (!shown.some((line) => line.includes(requestId!)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  const lines = shown.filter((line) => line.includes(requestId!));
  expect(lines, shown.join("\n")).toHaveLength(1);
  expect(lines[0]).toMatch(/^ERROR /);
  expect(lines[0]).toContain(`requestId=${requestId}`);
  expect(lines[0]).toContain("the acme widget store fell over");

  // The method's info line and wrangler's request lines ("POST /v1/acme.explode 500") stay out.
  expect(shown.join("\n")).not.toContain("about to fail");
  expect(shown.join("\n")).not.toContain("/v1/acme.explode");
  expect(shown.join("\n")).not.toMatch(/\[wrangler:info\]|Ready on/);
});
