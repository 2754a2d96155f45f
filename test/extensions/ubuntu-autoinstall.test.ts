// Walkthrough 1: Ubuntu autoinstall, on a simulated site (better-compute/testing/metal).
// acme-autoinstall is a third-party plugin (test/extensions/acme-autoinstall/plugin.ts). The
// machines, their disks and BMCs are simulated; Postgres, the engine, the metal module,
// JoinService and the agents with their signed results are real.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMetalSim, transitionsIntoReady, type MetalSim } from "better-compute/testing/metal";
import { acmeAutoinstall, isos, tokenInIso } from "./acme-autoinstall/plugin.ts";

const PROFILE = "ubuntu-24.04-autoinstall";
let sim: MetalSim;

beforeAll(async () => {
  sim = await createMetalSim({
    modules: [acmeAutoinstall],
    machines: 2,
    // The installer boots when the mounted image is one of the plugin's ISOs.
    install: ({ image }) => {
      const token = tokenInIso(image);
      return token ? { token } : undefined;
    },
  });
}, 60_000);
afterAll(() => sim?.stop());

/** Everything the record holds that a token must never be in. */
async function recordedText(): Promise<string> {
  const parts = await Promise.all([
    sim.store.db.execute(sql`SELECT body, result FROM bc_commands`),
    sim.store.db.execute(sql`SELECT input, output, error FROM workflow_steps`),
    sim.store.db.execute(sql`SELECT input FROM workflows`),
    sim.store.db.execute(sql`SELECT data FROM bc_events`),
  ]);
  return JSON.stringify(parts.map((p) => p.rows));
}

async function deployAndRelease(machineId: string) {
  const deployed = await sim.call<{ workflow: string }>("metal.deploy", { node: machineId, profile: PROFILE });
  const node = await sim.waitForState(machineId, ["deployed", "failed"]);
  expect(node.state, JSON.stringify(node.lastError)).toBe("deployed");
  const released = await sim.call<{ workflow: string }>("metal.undeploy", { node: machineId });
  const after = await sim.waitForState(machineId, ["ready", "failed"]);
  expect(after.state, JSON.stringify(after.lastError)).toBe("ready");
  return { deployWorkflow: deployed.workflow, releaseWorkflow: released.workflow, node };
}

describe("Walkthrough 1: Ubuntu autoinstall", () => {
  it("profiles.validate resolves every step of the plugin's profile", async () => {
    const report = await sim.call<{ valid: boolean; issues: unknown[] }>("profiles.validate", { id: PROFILE });
    expect(report.issues).toEqual([]);
    expect(report.valid).toBe(true);
  });

  it("one machine goes enroll, ready, deployed as a host, undeploy, ready; the ISO is ejected and its token is in no command", async () => {
    const machine = sim.machines[0]!;
    const enrolled = await sim.enroll(machine, { id: "m-first" });
    expect(enrolled.state).toBe("commissioning"); // the reconciler's work starts at once
    const ready = await sim.waitForState("m-first", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    expect(ready.productUuid).toBe(machine.uuid.toLowerCase());

    const { node, deployWorkflow } = await deployAndRelease("m-first");
    expect(node.role).toBe("host");
    expect(machine.bmc.media).toEqual({ inserted: false, image: null });
    expect(machine.boots).toEqual(["pxe", "cd", "pxe"]);

    // The token is in the ISO the deploy rendered, and nowhere an agent or the record saw it.
    const iso = (
      await sim.call<{ steps: { name: string; attempts: { output: { url: string } | null }[] }[] }>("workflows.get", { id: deployWorkflow })
    ).steps
      .find((s) => s.name === "autoinstall.renderIso")!
      .attempts.at(-1)!.output!;
    const token = tokenInIso(iso.url)!;
    expect(token).toMatch(/^bcj_/);
    expect(isos.size).toBeGreaterThan(0);
    expect(JSON.stringify(sim.commandsSeen)).not.toContain(token);
    expect(await recordedText()).not.toContain(token);
    // Released: the installed system's agent and the ramdisks are revoked; none can act for the machine again.
    const agents = await sim.store.db.execute(sql`
      SELECT role, revoked_at IS NOT NULL AS revoked FROM bc_nodes
      WHERE labels->>'bc.dev/machine' = 'm-first' OR labels->>'bc.dev/product-uuid' = ${machine.uuid.toLowerCase()}`);
    expect(agents.rows.length).toBe(3); // the installed system, and the ramdisks of commissioning and release
    expect(agents.rows).toEqual(
      expect.arrayContaining([
        { role: "node", revoked: true },
        { role: "ramdisk", revoked: true },
      ]),
    );
    expect(agents.rows.every((r) => (r as { revoked: boolean }).revoked)).toBe(true);
    // The installed system joined with it once: the token is used up.
    const used = await sim.store.db.execute(sql`SELECT consumed_at FROM bc_join_tokens WHERE id = ${token.split("_")[1]!}`);
    expect((used.rows[0] as { consumed_at: string | null }).consumed_at).not.toBeNull();
  }, 60_000);

  it("20 unattended deploy and release loops: a fresh token per install, every ready preceded by exactly one attested wipe", async () => {
    const machine = sim.machines[1]!;
    await sim.enroll(machine, { id: "m-loops" });
    await sim.waitForState("m-loops", "ready");
    const tokens = new Set<string>();
    for (let i = 0; i < 20; i++) {
      const { deployWorkflow } = await deployAndRelease("m-loops");
      const out = (
        await sim.store.db.execute(sql`
        SELECT output->>'url' AS url FROM workflow_steps WHERE workflow_id = ${deployWorkflow} AND name = 'autoinstall.renderIso' AND state = 'succeeded'`)
      ).rows[0] as { url: string };
      tokens.add(tokenInIso(out.url)!);
    }
    expect(tokens.size).toBe(20);

    // Every transition into ready (commissioning, then 20 releases), with its workflow's attested wipes.
    const rows = await transitionsIntoReady(sim.store, "m-loops");
    expect(rows.length).toBe(21);
    expect(rows.filter((r) => r.event === "released").length).toBe(20);
    for (const row of rows) expect(row.attested_wipes, `${row.event} in ${row.workflow_id}`).toBe(1);
  }, 600_000);

  it("a release whose wipe is not attested ends failed from releasing, maintenance on, never ready", async () => {
    const machine = sim.machines[0]!;
    await sim.call("metal.deploy", { node: "m-first", profile: PROFILE });
    await sim.waitForState("m-first", "deployed");
    machine.unsignedRamdisk = true; // its ramdisk's results arrive without the node's signature
    const { workflow } = await sim.call<{ workflow: string }>("metal.undeploy", { node: "m-first" });
    // The unsigned wipe result is refused; the step waits for a signed one until its deadline.
    await waitFor(async () => {
      const wipe = await sim.store.db.execute(
        sql`SELECT state FROM workflow_steps WHERE workflow_id = ${workflow} AND step_id = 'disk.wipe'`,
      );
      return (wipe.rows[0] as { state: string } | undefined)?.state === "waiting" && machine.disks.disks.get("/dev/sda")!.wipes > 0;
    });
    await sim.advanceClock(3700);
    const failed = await sim.waitForState("m-first", ["failed", "ready"]);
    expect(failed.state).toBe("failed");
    expect(failed.maintenance).toBe(true);
    expect(failed.lastError).toMatchObject({ code: "DEADLINE_EXCEEDED", step: "disk.wipe" });
    const history = await sim.store.db.execute(
      sql`SELECT from_state, to_state FROM metal_transitions WHERE node_id = 'm-first' ORDER BY id DESC LIMIT 1`,
    );
    expect(history.rows[0]).toEqual({ from_state: "releasing", to_state: "failed" });
    await expect(sim.call("metal.deploy", { node: "m-first", profile: PROFILE })).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
  }, 60_000);
});

async function waitFor(check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("condition not met in time");
}
