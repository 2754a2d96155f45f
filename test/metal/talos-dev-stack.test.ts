// Walkthrough 3 on the local stack: the acme-talos plugin registered in a deployment
// (test/support/talos-worker.ts) under `wrangler dev`. The real WorkflowDO runs wait.talosReady,
// whose httpViaSite requests the real NodeDO delivers over a real WebSocket to the site agent,
// which makes them over real TLS to the machine's address. SIMULATED: the machines, their BMCs
// and Talos (test/extensions/acme-talos/emulator.ts).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMetalSim, selfSignedCertificate, type MetalSim } from "../../testing/metal-sim.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { talosEmulator } from "../extensions/acme-talos/emulator.ts";
import { TALOS_API_PORT } from "../extensions/acme-talos/plugin.ts";

const TALOS_ISO = "https://images.example.test/talos/v1.8.0/metal-amd64.iso";
const ADDRESS = "127.0.0.40";
const tls = selfSignedCertificate("talos");
const talos = talosEmulator(tls, { bootMs: 1000 });

let stack: Stack;
let sim: MetalSim;

beforeAll(async () => {
  stack = await startStack({ dataDir: fs.mkdtempSync(path.join(os.tmpdir(), "bc-talos-stack-")), main: "test/support/talos-worker.ts" });
  sim = await createMetalSim({
    stack,
    machines: 1,
    siteId: "talos-stack-site",
    agent: "none",
    machineAddresses: () => [ADDRESS],
    install: ({ image }) => (image === TALOS_ISO ? { os: talos.os } : undefined),
  });
}, 120_000);
afterAll(async () => {
  await sim?.stop();
  await stack?.stop();
});

describe("Talos on an agentless pool, on the dev stack", () => {
  it("commissions out of band, deploys Talos by polling its API through the NodeDO and the site agent, releases unverified", async () => {
    await sim.enroll(sim.machines[0]!, { id: "talos-1" });
    const ready = await sim.waitForState("talos-1", ["ready", "failed"], 90_000);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    expect(ready.addresses).toEqual([ADDRESS]);

    const { workflow } = await sim.call<{ workflow: string }>("metal.deploy", {
      node: "talos-1",
      profile: "talos-1.8",
      input: { url: TALOS_ISO, tlsSpkiSha256: tls.spkiSha256 },
    });
    const deployed = await sim.waitForState("talos-1", ["deployed", "failed"], 90_000);
    expect(deployed.state, JSON.stringify(deployed.lastError)).toBe("deployed");
    expect(deployed.role).toBe("host");

    const relayed = await sim.store.db.execute(sql`
      SELECT c.node_id, c.state, c.body->>'url' AS url, c.result->>'status' AS status FROM bc_commands c
      WHERE c.origin = ${`workflow:${workflow}`} AND c.kind = 'site.httpProxy' ORDER BY c.id`);
    const rows = relayed.rows as { node_id: string; state: string; url: string; status: string | null }[];
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.every((r) => r.node_id === sim.site.agentNodeId && r.url === `https://${ADDRESS}:${TALOS_API_PORT}/machine/version`)).toBe(
      true,
    );
    expect(rows.at(-1)).toMatchObject({ state: "succeeded", status: "200" });
    // The requests reached Talos on the machine's own address, with the pin checked by the site agent.
    expect(talos.seen.filter((r) => r.machine === sim.machines[0]!.id && r.url === "/machine/version").length).toBeGreaterThan(0);

    await sim.call("metal.undeploy", { node: "talos-1" });
    const released = await sim.waitForState("talos-1", ["ready", "failed"], 90_000);
    expect(released.state, JSON.stringify(released.lastError)).toBe("ready");
    const unverified = await sim.store.db.execute(
      sql`SELECT data->>'event' AS event FROM bc_events WHERE type = 'node.release.unverified' AND subject = 'metal/nodes/talos-1' ORDER BY id`,
    );
    expect(unverified.rows).toEqual([{ event: "commissioned" }, { event: "released" }]);
  }, 300_000);
});
