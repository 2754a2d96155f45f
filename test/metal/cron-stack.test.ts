// The cron sweep under the local stack: a machine enrolled while its site has no agent stays
// enrolled; once a site agent joins, the Worker's scheduled handler (fired by the stack on
// wrangler.toml's schedule, nothing else) starts its commissioning and it reaches ready.
// SIMULATED: the machine, its disk and BMC (createMetalSim's site on the running stack).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createMetalSim, type MetalSim } from "../../testing/metal-sim.ts";
import { startStack, type Stack } from "../../local/stack.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-cron-stack-"));
let stack: Stack;
let sim: MetalSim;

beforeAll(async () => {
  stack = await startStack({ dataDir });
  sim = await createMetalSim({ stack, machines: 1, siteId: "cron-site", joinSiteAgent: false });
}, 120_000);
afterAll(async () => {
  await sim?.stop();
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

it("commissions a machine enrolled before its site agent joined, by the local cron alone", async () => {
  expect(stack.crons).toEqual(["* * * * *"]);
  const enrolled = await sim.enroll(sim.machines[0]!, { id: "m-early" });
  expect(enrolled.state).toBe("enrolled");

  await sim.joinSiteAgent();
  // Joining starts nothing by itself: the next minute's sweep (at most a minute away) starts commissioning.
  const ready = await sim.waitForState("m-early", ["ready", "failed"], 150_000);
  expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
}, 240_000);
