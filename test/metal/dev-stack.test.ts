// Metal on the local stack (`npm start`'s wrangler dev): the real NodeDO delivers every command
// over a real WebSocket (BMC passwords resolved from their secret references at delivery), the
// real WorkflowDO drives the engine, and the metal reconciler runs when a workflow ends.
// SIMULATED: the machines, disks and BMCs (createMetalSim's site, agents over real WebSockets).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createImageCache, simulatedDiskImage } from "../../testing/image-server.ts";
import { createMetalSim, SIM_BMC_PASSWORD, type MetalSim } from "../../testing/metal-sim.ts";
import { startStack, type Stack } from "../../local/stack.ts";

let stack: Stack;
let sim: MetalSim;
let images: { url: string; stop(): Promise<void> };
const cache = createImageCache();
const image = cache.put(simulatedDiskImage("a simulated host image\n".repeat(1000)));

beforeAll(async () => {
  stack = await startStack({ dataDir: fs.mkdtempSync(path.join(os.tmpdir(), "bc-metal-stack-")) });
  images = await cache.serve();
  sim = await createMetalSim({ stack, machines: 1, siteId: "stack-site" });
}, 120_000);
afterAll(async () => {
  await sim?.stop();
  await images?.stop();
  await stack?.stop();
});

describe("metal on the dev stack", () => {
  it("commissions, deploys an image and releases one machine through the NodeDO and WorkflowDO", async () => {
    const machine = sim.machines[0]!;
    await sim.enroll(machine, { id: "m-stack" });
    const ready = await sim.waitForState("m-stack", ["ready", "failed"], 90_000);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");

    await sim.call("metal.deploy", {
      node: "m-stack",
      profile: "metal.deploy.image-stream",
      input: { image: { url: `${images.url}/images/${image}`, sha256: image } },
    });
    const deployed = await sim.waitForState("m-stack", ["deployed", "failed"], 90_000);
    expect(deployed.state, JSON.stringify(deployed.lastError)).toBe("deployed");
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBe(image);

    await sim.call("metal.undeploy", { node: "m-stack" });
    const released = await sim.waitForState("m-stack", ["ready", "failed"], 90_000);
    expect(released.state, JSON.stringify(released.lastError)).toBe("ready");
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBeNull();

    // BMC commands carried the password by reference; the agent got the value beside the body.
    const bmcCommands = await sim.store.db.execute(sql`SELECT body, secret_refs FROM bc_commands WHERE kind LIKE 'metal.bmc.%'`);
    expect(bmcCommands.rows.length).toBeGreaterThan(5);
    for (const row of bmcCommands.rows as { body: { bmc: { password: string } }; secret_refs: string[] }[]) {
      expect(row.body.bmc.password).toMatch(/^secret:\/\//);
      expect(row.secret_refs).toEqual([row.body.bmc.password]);
    }
    expect(JSON.stringify(sim.commandsSeen)).not.toContain(SIM_BMC_PASSWORD);
    expect(JSON.stringify(bmcCommands.rows)).not.toContain(SIM_BMC_PASSWORD);
  }, 300_000);
});
