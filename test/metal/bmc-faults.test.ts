// A flaky BMC and a wrong BMC password, on the simulated site. The BMC emulator's faults are
// seeded, so a run sees the same drops and 5xx answers every time.
import { sql } from "drizzle-orm";
import { afterEach, describe, expect, it } from "vitest";
import { createMetalSim, SIM_BMC_PASSWORD, type MetalSim } from "better-compute/testing/metal";

let sim: MetalSim | undefined;
afterEach(async () => {
  await sim?.stop();
  sim = undefined;
});

/** Skips retry backoffs: database time moves on until the machine is in one of the states. */
async function fastForwardUntil(s: MetalSim, nodeId: string, states: string[], timeoutMs = 60_000) {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    const node = await s.call<{ state: string }>("metal.nodes.get", { node: nodeId });
    if (states.includes(node.state)) return node as Record<string, unknown>;
    await s.advanceClock(10);
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${nodeId} did not reach ${states.join(" or ")} in time`);
}

describe("metal against a misbehaving BMC", () => {
  it("a flaky BMC (drops, 503s, delays) still ends ready, with the retries in the workflow's steps", async () => {
    // More than half the requests fail until two step attempts have failed, then the BMC settles
    // down: the retries are certain to show, and no step can use up its six attempts.
    sim = await createMetalSim({ machines: 1, faults: { dropRate: 0.25, errorRate: 0.35, delayMs: 5, seed: 11 } });
    const s = sim;
    const failedAttempts = async () =>
      ((await s.store.db.execute(sql`SELECT count(*)::int AS n FROM workflow_steps WHERE state = 'failed'`)).rows[0] as { n: number }).n;
    let healed = false;
    const healer = setInterval(async () => {
      if (!healed && (await failedAttempts()) >= 2) ((healed = true), s.bmc.setFaults({ delayMs: 5 }));
    }, 20);
    try {
      const node = await sim.enroll(sim.machines[0]!, { id: "m-flaky" });
      const ready = await fastForwardUntil(sim, "m-flaky", ["ready", "failed"]);
      expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");

      const retried = await sim.store.db.execute(sql`
        SELECT s.name, s.attempt, s.error->>'code' AS code, s.error->>'message' AS message
        FROM workflow_steps s JOIN metal_transitions t ON t.node_id = ${node.id} AND t.event = 'commission' AND t.workflow_id = s.workflow_id
        WHERE s.state = 'failed' ORDER BY s.position, s.attempt`);
      const failures = retried.rows as { name: string; attempt: number; code: string; message: string }[];
      expect(healed).toBe(true);
      expect(sim.bmc.requests.some((r) => r.status === 0 || r.status === 503)).toBe(true);
      expect(failures.length).toBeGreaterThan(0);
      for (const f of failures) {
        expect(f.code).toBe("DRIVER_ERROR");
        expect(f.message).toContain(sim.machines[0]!.address);
      }
    } finally {
      clearInterval(healer);
    }
  }, 90_000);

  it("a wrong BMC password ends failed with a DRIVER_ERROR that names the BMC, never the password", async () => {
    sim = await createMetalSim({ machines: 1 });
    const wrong = "not-the-password-42";
    await sim.enroll(sim.machines[0]!, { id: "m-locked", password: wrong });
    const failed = await fastForwardUntil(sim, "m-locked", ["failed", "ready"]);
    expect(failed.state).toBe("failed");
    expect(failed.maintenance).toBe(true);
    const error = failed.lastError as { code: string; message: string; step: string };
    expect(error.code).toBe("DRIVER_ERROR");
    expect(error.step).toBe("inspect");
    expect(error.message).toContain(sim.machines[0]!.address);
    expect(error.message).toMatch(/401/);

    // Neither password reaches a command, a step, an event or an error.
    const record = JSON.stringify(
      await Promise.all([
        sim.store.db.execute(sql`SELECT body, result, error FROM bc_commands`),
        sim.store.db.execute(sql`SELECT input, output, error FROM workflow_steps`),
        sim.store.db.execute(sql`SELECT data FROM bc_events`),
        sim.store.db.execute(sql`SELECT bmc, last_error, maintenance_reason FROM metal_nodes`),
      ]).then((parts) => parts.map((p) => p.rows)),
    );
    expect(record).not.toContain(wrong);
    expect(record).not.toContain(SIM_BMC_PASSWORD);
    expect(JSON.stringify(sim.commandsSeen)).not.toContain(wrong);
  }, 90_000);
});
