// The metal lifecycle as an operator relies on it, on the simulated site: refusals with their
// typed codes that write nothing, the BMC password sealed at enroll, the transition history of
// a deploy and release, a failed deploy taken back by recommission, a site whose agent joins
// late, and the state machine's guard (lifecycle.ts) itself.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { definePlugin } from "better-compute";
import { defineProfile } from "better-compute/provision";
import { createMetalSim, SIM_BMC_PASSWORD, SIM_BMC_USER, type MetalSim } from "better-compute/testing/metal";
import { AgentClient } from "../../agent/client.ts";
import { createImageCache, simulatedDiskImage } from "../../testing/image-server.ts";
import { MemoryState } from "../../agent/state.ts";
import { transition } from "../../plugins/metal/lifecycle.ts";
import { joinedAgent } from "../../plugins/metal/steps.ts";
import { discoveryMessage, generateNodeKey, importNodeKey, signMessage } from "../../core/protocol.ts";

/** The refusal a call ends in: its code and details (fails the test when the call succeeds). */
async function refusal(promise: Promise<unknown>): Promise<{ code: string; message: string; details?: Record<string, unknown> }> {
  const outcome = await promise.then(
    (value) => ({ ok: true as const, value }),
    (err: unknown) => ({ ok: false as const, err: err as { code: string; message: string; details?: Record<string, unknown> } }),
  );
  if (outcome.ok) throw new Error(`expected a refusal, got ${JSON.stringify(outcome.value)}`);
  return outcome.err;
}

async function rows<T = Record<string, unknown>>(sim: MetalSim, query: ReturnType<typeof sql>): Promise<T[]> {
  return (await sim.store.db.execute(query)).rows as T[];
}

async function count(sim: MetalSim, query: ReturnType<typeof sql>): Promise<number> {
  return (await rows<{ n: number }>(sim, query))[0]!.n;
}

/** What a refusal must not have left behind: nodes, pools, sealed secrets, workflows. */
async function written(sim: MetalSim) {
  const [nodes, pools, secrets, workflows] = await Promise.all([
    count(sim, sql`SELECT count(*)::int AS n FROM metal_nodes`),
    count(sim, sql`SELECT count(*)::int AS n FROM metal_pools`),
    // Not the tokens a workflow running meanwhile seals for the machine it boots (metal's <role>-token/<machine>).
    count(sim, sql`SELECT count(*)::int AS n FROM bc_secrets WHERE NOT (module = 'metal' AND name LIKE '%-token/%')`),
    count(sim, sql`SELECT count(*)::int AS n FROM workflows`),
  ]);
  return { nodes, pools, secrets, workflows };
}

async function history(sim: MetalSim, nodeId: string) {
  return rows<{ event: string; from_state: string; to_state: string; workflow_id: string | null }>(
    sim,
    sql`SELECT event, from_state, to_state, workflow_id FROM metal_transitions WHERE node_id = ${nodeId} ORDER BY id`,
  );
}

/** A site with a pool and, until one joins, no agent. */
async function agentlessSite(sim: MetalSim, site: string) {
  await sim.call("metal.sites.create", { id: site });
  await sim.call("metal.pools.create", { id: `${site}-pool`, site, policy: { hardwareProfile: "redfish-pxe" } });
  return `${site}-pool`;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// A third-party profile for another kind of target: metal must not run it on a machine.
const vpsPlugin = definePlugin({
  id: "tiny-vps",
  profiles: [defineProfile({ id: "vps.tiny", target: "vps", steps: [{ step: "power.setPower", input: { action: "off" } }] })],
});

describe("metal refusals: a typed code, and nothing written", () => {
  let sim: MetalSim;
  beforeAll(async () => {
    sim = await createMetalSim({ machines: 2, modules: [vpsPlugin] });
  }, 60_000);
  afterAll(() => sim?.stop());

  it("metal.enroll refuses a BMC address that is not http(s)://host/redfish/v1/Systems/<id>, or carries credentials", async () => {
    const host = new URL(sim.machines[0]!.address).host;
    const before = await written(sim);
    for (const address of [
      `https://admin:hunter2@${host}/redfish/v1/Systems/1`,
      `ftp://${host}/redfish/v1/Systems/1`,
      `https://${host}/redfish/v1/Managers/1`,
      `https://${host}/redfish/v1/Systems/`,
      `https://${host}/redfish/v1/Systems/1/Actions`,
      "not a url",
    ]) {
      const err = await refusal(
        sim.call("metal.enroll", {
          id: "m-badaddr",
          pool: sim.site.pool,
          bmc: { address, username: SIM_BMC_USER, password: "pw-bad-address" },
        }),
      );
      expect(err.code, address).toBe("INVALID_ARGUMENT");
      const issues = (err.details as { issues?: { path: string; message: string }[] } | undefined)?.issues;
      expect(
        issues?.some((i) => i.path === "address" && /redfish\/v1\/Systems/.test(i.message)),
        `${address}: ${JSON.stringify(err.details)}`,
      ).toBe(true);
      expect(JSON.stringify(err)).not.toContain("hunter2");
    }
    expect(await written(sim)).toEqual(before);
    expect(await count(sim, sql`SELECT count(*)::int AS n FROM bc_events WHERE subject = 'metal/nodes/m-badaddr'`)).toBe(0);
  });

  it("metal.enroll into an unknown pool is NOT_FOUND", async () => {
    const before = await written(sim);
    const err = await refusal(
      sim.call("metal.enroll", {
        id: "m-nopool",
        pool: "no-such-pool",
        bmc: { address: sim.machines[1]!.address, username: SIM_BMC_USER, password: SIM_BMC_PASSWORD },
      }),
    );
    expect(err.code).toBe("NOT_FOUND");
    expect(await written(sim)).toEqual(before);
  });

  it("metal.enroll of an id that exists is CONFLICT and leaves the first machine as it was", async () => {
    const first = await sim.enroll(sim.machines[0]!, { id: "m-dup" });
    expect(first.state).toBe("commissioning");
    const bmcBefore = (await rows<{ bmc: unknown }>(sim, sql`SELECT bmc FROM metal_nodes WHERE id = 'm-dup'`))[0]!.bmc;
    const before = await written(sim);
    const err = await refusal(sim.enroll(sim.machines[1]!, { id: "m-dup", password: "another-password" }));
    expect(err.code).toBe("CONFLICT");
    expect(await written(sim)).toEqual(before);
    expect((await rows<{ bmc: unknown }>(sim, sql`SELECT bmc FROM metal_nodes WHERE id = 'm-dup'`))[0]!.bmc).toEqual(bmcBefore);
    expect(await count(sim, sql`SELECT count(*)::int AS n FROM workflows WHERE target = 'm-dup'`)).toBe(1);
  });

  it("metal.pools.create refuses an unknown hardware profile (INVALID_ARGUMENT) and an unknown site (NOT_FOUND)", async () => {
    const before = await written(sim);
    const badProfile = await refusal(
      sim.call("metal.pools.create", { id: "p-badhw", site: sim.site.id, policy: { hardwareProfile: "no-such-hardware" } }),
    );
    expect(badProfile.code).toBe("INVALID_ARGUMENT");
    expect(badProfile.details).toMatchObject({ known: expect.arrayContaining(["redfish-pxe"]) });
    const badSite = await refusal(
      sim.call("metal.pools.create", { id: "p-nosite", site: "no-such-site", policy: { hardwareProfile: "redfish-pxe" } }),
    );
    expect(badSite.code).toBe("NOT_FOUND");
    expect(await written(sim)).toEqual(before);
    expect(await count(sim, sql`SELECT count(*)::int AS n FROM metal_pools WHERE id IN ('p-badhw', 'p-nosite')`)).toBe(0);
  });

  it("metal.deploy of a machine that is not ready is FAILED_PRECONDITION, and starts nothing", async () => {
    // A machine in a site without an agent stays enrolled: never ready.
    const pool = await agentlessSite(sim, "quiet-site");
    const enrolled = await sim.call<{ state: string }>("metal.enroll", {
      id: "m-quiet",
      pool,
      bmc: { address: sim.machines[1]!.address, username: SIM_BMC_USER, password: SIM_BMC_PASSWORD },
    });
    expect(enrolled.state).toBe("enrolled");
    const err = await refusal(sim.call("metal.deploy", { node: "m-quiet", profile: "metal.deploy.image-stream", input: {} }));
    expect(err.code).toBe("FAILED_PRECONDITION");
    expect(await count(sim, sql`SELECT count(*)::int AS n FROM workflows WHERE target = 'm-quiet'`)).toBe(0);
    expect(await history(sim, "m-quiet")).toEqual([]);
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "m-quiet" })).state).toBe("enrolled");
    // An unknown machine is NOT_FOUND.
    expect((await refusal(sim.call("metal.deploy", { node: "m-nobody", profile: "metal.deploy.image-stream" }))).code).toBe("NOT_FOUND");
  });

  it("on a ready machine: a profile for another target is INVALID_ARGUMENT, an unknown profile NOT_FOUND, undeploy FAILED_PRECONDITION", async () => {
    const ready = await sim.waitForState("m-dup", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    const before = await written(sim);

    const vps = await refusal(sim.call("metal.deploy", { node: "m-dup", profile: "vps.tiny" }));
    expect(vps.code).toBe("INVALID_ARGUMENT");
    expect(vps.message).toContain("vps");
    expect((await refusal(sim.call("metal.deploy", { node: "m-dup", profile: "no.such.profile" }))).code).toBe("NOT_FOUND");
    expect((await refusal(sim.call("metal.undeploy", { node: "m-dup" }))).code).toBe("FAILED_PRECONDITION");
    // Only a failed machine can be recommissioned.
    expect((await refusal(sim.call("metal.nodes.recommission", { node: "m-dup" }))).code).toBe("FAILED_PRECONDITION");

    expect(await written(sim)).toEqual(before);
    expect((await history(sim, "m-dup")).map((h) => h.event)).toEqual(["commission", "commissioned"]);
    const node = await sim.call<{ state: string; workflow: string; role: string | null }>("metal.nodes.get", { node: "m-dup" });
    expect(node).toMatchObject({ state: "ready", workflow: ready.workflow, role: null });
  }, 60_000);
});

describe("metal lifecycle on a simulated site", () => {
  let sim: MetalSim;
  let images: { url: string; stop(): Promise<void> };
  const cache = createImageCache();
  const image = cache.put(simulatedDiskImage("a simulated host image\n".repeat(2000)));
  const otherImage = cache.put(simulatedDiskImage("some other image\n".repeat(100)));
  let enrolled: Record<string, unknown> | undefined;

  beforeAll(async () => {
    images = await cache.serve();
    sim = await createMetalSim({ machines: 2 });
  }, 60_000);
  afterAll(async () => {
    await sim?.stop();
    await images?.stop();
  });

  it("enroll, ready, deploy, deployed, undeploy, ready: the history holds each event with its workflow, the disk was written then wiped", async () => {
    const machine = sim.machines[0]!;
    enrolled = await sim.enroll(machine, { id: "m-life" });
    expect(enrolled.state).toBe("commissioning");
    const ready = await sim.waitForState("m-life", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    const disk = machine.disks.disks.get("/dev/sda")!;
    expect(disk.wipes).toBe(1); // commissioning wiped it

    const deploy = await sim.call<{ workflow: string }>("metal.deploy", {
      node: "m-life",
      profile: "metal.deploy.image-stream",
      input: { image: { url: `${images.url}/images/${image}`, sha256: image } },
    });
    const deployed = await sim.waitForState("m-life", ["deployed", "failed"]);
    expect(deployed.state, JSON.stringify(deployed.lastError)).toBe("deployed");
    expect(deployed).toMatchObject({ role: "host", workflow: deploy.workflow, maintenance: false });
    expect(disk.sha256).toBe(image);
    expect(disk.wipes).toBe(1);

    const undeploy = await sim.call<{ workflow: string }>("metal.undeploy", { node: "m-life" });
    const released = await sim.waitForState("m-life", ["ready", "failed"]);
    expect(released.state, JSON.stringify(released.lastError)).toBe("ready");
    expect(released).toMatchObject({ role: null, workflow: undeploy.workflow, maintenance: false });
    expect(disk.sha256).toBeNull();
    expect(disk.data).toBeNull();
    expect(disk.wipes).toBe(2);

    const commission = (
      await rows<{ id: string }>(sim, sql`SELECT id FROM workflows WHERE target = 'm-life' AND profile_id = 'metal.commission'`)
    ).map((r) => r.id);
    expect(commission).toHaveLength(1);
    expect(await history(sim, "m-life")).toEqual([
      { event: "commission", from_state: "enrolled", to_state: "commissioning", workflow_id: commission[0] },
      { event: "commissioned", from_state: "commissioning", to_state: "ready", workflow_id: commission[0] },
      { event: "deploy", from_state: "ready", to_state: "deploying", workflow_id: deploy.workflow },
      { event: "deployed", from_state: "deploying", to_state: "deployed", workflow_id: deploy.workflow },
      { event: "undeploy", from_state: "deployed", to_state: "releasing", workflow_id: undeploy.workflow },
      { event: "released", from_state: "releasing", to_state: "ready", workflow_id: undeploy.workflow },
    ]);
    const profiles = await rows<{ id: string; profile_id: string; state: string }>(
      sim,
      sql`SELECT id, profile_id, state FROM workflows WHERE target = 'm-life' ORDER BY created_at, id`,
    );
    expect(profiles.map((w) => [w.profile_id, w.state])).toEqual([
      ["metal.commission", "succeeded"],
      ["metal.deploy.image-stream", "succeeded"],
      ["metal.release", "succeeded"],
    ]);
  }, 90_000);

  it("the BMC password given at enroll is sealed: a secret:// reference, in no answer, workflow input, event or audit row", async () => {
    expect(enrolled, "the previous test enrolled m-life").toBeDefined();
    const stored = (
      await rows<{ bmc: { password: string; username: string; address: string } }>(
        sim,
        sql`SELECT bmc FROM metal_nodes WHERE id = 'm-life'`,
      )
    )[0]!.bmc;
    expect(stored.password).toMatch(/^secret:\/\/[\w-]+$/);
    expect(stored).toMatchObject({ username: SIM_BMC_USER, address: sim.machines[0]!.address });
    // The reference is the password, sealed (not a copy of it).
    const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
    expect(await ctx.secrets.resolve(stored.password as `secret://${string}`)).toBe(SIM_BMC_PASSWORD);

    const answers = JSON.stringify([
      enrolled,
      await sim.call("metal.nodes.get", { node: "m-life" }),
      await sim.call("metal.nodes.list", {}),
      await sim.call("metal.nodes.list", { pool: sim.site.pool }),
    ]);
    expect(answers).toContain("m-life");
    expect(answers).not.toContain(SIM_BMC_PASSWORD);
    const record = JSON.stringify(
      await Promise.all([
        rows(sim, sql`SELECT bmc FROM metal_nodes`),
        rows(sim, sql`SELECT input FROM workflows`),
        rows(sim, sql`SELECT type, subject, data FROM bc_events`),
        rows(sim, sql`SELECT * FROM bc_audit`),
        rows(sim, sql`SELECT sealed FROM bc_secrets`),
      ]),
    );
    expect(record).toContain("metal.enroll"); // the audit row is there
    expect(record).toContain(stored.password); // workflows carry the reference
    expect(record).not.toContain(SIM_BMC_PASSWORD);
  });

  it("an image whose sha256 does not match fails the deploy: failed from deploying, maintenance on; recommission brings it back to ready", async () => {
    const machine = sim.machines[1]!;
    await sim.enroll(machine, { id: "m-digest" });
    const ready = await sim.waitForState("m-digest", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");

    // The URL serves `image`; the operator asked for otherImage's digest.
    const deploy = await sim.call<{ workflow: string }>("metal.deploy", {
      node: "m-digest",
      profile: "metal.deploy.image-stream",
      input: { image: { url: `${images.url}/images/${image}`, sha256: otherImage } },
    });
    const failed = await sim.waitForState("m-digest", ["failed", "deployed"]);
    expect(failed.state).toBe("failed");
    expect(failed.maintenance).toBe(true);
    expect(failed.maintenanceReason).toMatch(/^deploying failed: .*digest mismatch/);
    const error = failed.lastError as { code: string; message: string; step: string; workflow: string };
    // Caught where the site mirrors the image, before the ramdisk writes a byte.
    expect(error).toMatchObject({ code: "DRIVER_ERROR", step: "image.cache", workflow: deploy.workflow });
    expect(error.message).toContain("digest mismatch");
    expect(error.message).toContain(otherImage);
    expect((await history(sim, "m-digest")).at(-1)).toEqual({
      event: "fail",
      from_state: "deploying",
      to_state: "failed",
      workflow_id: deploy.workflow,
    });
    // A failed machine in maintenance is not deployed again.
    expect((await refusal(sim.call("metal.deploy", { node: "m-digest", profile: "metal.deploy.image-stream", input: {} }))).code).toBe(
      "FAILED_PRECONDITION",
    );

    const recommissioned = await sim.call<{ state: string; maintenance: boolean }>("metal.nodes.recommission", { node: "m-digest" });
    expect(recommissioned).toMatchObject({ state: "commissioning", maintenance: false, maintenanceReason: null, lastError: null });
    const back = await sim.waitForState("m-digest", ["ready", "failed"]);
    expect(back.state, JSON.stringify(back.lastError)).toBe("ready");
    expect(back).toMatchObject({ maintenance: false, maintenanceReason: null, lastError: null, role: null });
    const commissions = (
      await rows<{ id: string }>(
        sim,
        sql`SELECT id FROM workflows WHERE target = 'm-digest' AND profile_id = 'metal.commission' ORDER BY created_at, id`,
      )
    ).map((r) => r.id);
    expect(commissions).toHaveLength(2);
    expect((await history(sim, "m-digest")).slice(-4)).toEqual([
      { event: "fail", from_state: "deploying", to_state: "failed", workflow_id: deploy.workflow },
      { event: "recommission", from_state: "failed", to_state: "enrolled", workflow_id: null },
      { event: "commission", from_state: "enrolled", to_state: "commissioning", workflow_id: commissions[1] },
      { event: "commissioned", from_state: "commissioning", to_state: "ready", workflow_id: commissions[1] },
    ]);
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBeNull(); // recommissioning wiped what was written
  }, 90_000);

  it("rescue boots a deployed machine into the ramdisk with its disk untouched; unrescue revokes that ramdisk and boots the disk: deployed again", async () => {
    const machine = sim.machines[0]!;
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "m-life" })).state).toBe("ready");
    expect((await refusal(sim.call("metal.rescue", { node: "m-life" }))).code).toBe("FAILED_PRECONDITION");
    await sim.call("metal.deploy", {
      node: "m-life",
      profile: "metal.deploy.image-stream",
      input: { image: { url: `${images.url}/images/${image}`, sha256: image } },
    });
    expect((await sim.waitForState("m-life", ["deployed", "failed"])).state).toBe("deployed");
    expect((await refusal(sim.call("metal.unrescue", { node: "m-life" }))).code).toBe("FAILED_PRECONDITION");

    const rescue = await sim.call<{ workflow: string }>("metal.rescue", { node: "m-life" });
    const rescued = await sim.waitForState("m-life", ["rescue", "failed"]);
    expect(rescued.state, JSON.stringify(rescued.lastError)).toBe("rescue");
    expect(rescued.role).toBe("host");
    expect(machine.boots.at(-1)).toBe("pxe");
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBe(image); // nothing was wiped or written
    const ramdisk = await rows<{ id: string; state: string; revoked: boolean }>(
      sim,
      sql`
      SELECT id, state, revoked_at IS NOT NULL AS revoked FROM bc_nodes
      WHERE role = 'ramdisk' AND labels->>'bc.dev/product-uuid' = ${machine.uuid.toLowerCase()} AND revoked_at IS NULL`,
    );
    expect(ramdisk).toEqual([{ id: expect.any(String), state: "connected", revoked: false }]);

    const unrescue = await sim.call<{ workflow: string }>("metal.unrescue", { node: "m-life" });
    const back = await sim.waitForState("m-life", ["deployed", "failed"]);
    expect(back.state, JSON.stringify(back.lastError)).toBe("deployed");
    expect(machine.boots.at(-1)).not.toBe("pxe");
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBe(image);
    const after = await rows<{ revoked: boolean }>(
      sim,
      sql`SELECT revoked_at IS NOT NULL AS revoked FROM bc_nodes WHERE id = ${ramdisk[0]!.id}`,
    );
    expect(after).toEqual([{ revoked: true }]);
    expect((await history(sim, "m-life")).slice(-4)).toEqual([
      { event: "rescue", from_state: "deployed", to_state: "rescuing", workflow_id: rescue.workflow },
      { event: "rescued", from_state: "rescuing", to_state: "rescue", workflow_id: rescue.workflow },
      { event: "unrescue", from_state: "rescue", to_state: "unrescuing", workflow_id: unrescue.workflow },
      { event: "unrescued", from_state: "unrescuing", to_state: "deployed", workflow_id: unrescue.workflow },
    ]);
    await sim.call("metal.undeploy", { node: "m-life" });
    expect((await sim.waitForState("m-life", ["ready", "failed"])).state).toBe("ready");
  }, 90_000);

  it("retire takes a ready machine out of service for good; its BMC can be enrolled again as a new machine, which cannot be retired mid-workflow", async () => {
    const machine = sim.machines[1]!;
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "m-digest" })).state).toBe("ready");
    const retired = await sim.call<Record<string, unknown>>("metal.nodes.retire", { node: "m-digest", reason: "motherboard replaced" });
    expect(retired).toMatchObject({ state: "retired", maintenance: false, workflow: null, role: null });
    expect((await history(sim, "m-digest")).at(-1)).toEqual({
      event: "retire",
      from_state: "ready",
      to_state: "retired",
      workflow_id: null,
    });
    const events = await rows<{ data: { reason: string } }>(
      sim,
      sql`SELECT data FROM bc_events WHERE type = 'metal.node.retire' AND subject = 'metal/nodes/m-digest'`,
    );
    expect(events.map((e) => e.data.reason)).toEqual(["motherboard replaced"]);
    const live = await rows<{ id: string }>(
      sim,
      sql`SELECT id FROM bc_nodes WHERE labels->>'bc.dev/product-uuid' = ${machine.uuid.toLowerCase()} AND revoked_at IS NULL`,
    );
    expect(live).toEqual([]);
    // Retired is the end: no deploy, no second retire, no recommission.
    expect((await refusal(sim.call("metal.deploy", { node: "m-digest", profile: "metal.deploy.image-stream", input: {} }))).code).toBe(
      "FAILED_PRECONDITION",
    );
    expect((await refusal(sim.call("metal.nodes.retire", { node: "m-digest" }))).code).toBe("FAILED_PRECONDITION");
    expect((await refusal(sim.call("metal.nodes.recommission", { node: "m-digest" }))).code).toBe("FAILED_PRECONDITION");

    // The same BMC enrolls again under a new id; while it commissions, it cannot be retired and nothing is written.
    const again = await sim.enroll(machine, { id: "m-digest-2" });
    expect(again.state).toBe("commissioning");
    const before = await history(sim, "m-digest-2");
    const midway = await refusal(sim.call("metal.nodes.retire", { node: "m-digest-2" }));
    expect(midway.code).toBe("FAILED_PRECONDITION");
    expect(midway.message).toMatch(/commissioning/);
    expect(await history(sim, "m-digest-2")).toEqual(before);
    const ready = await sim.waitForState("m-digest-2", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    expect((await refusal(sim.call("metal.nodes.retire", { node: "nobody" }))).code).toBe("NOT_FOUND");
  }, 90_000);
});

describe("a site whose agent joins after its machines were enrolled", () => {
  let sim: MetalSim;
  beforeAll(async () => {
    sim = await createMetalSim({ machines: 1, joinSiteAgent: false });
  }, 60_000);
  afterAll(() => sim?.stop());

  it("the machine stays enrolled while the site has no agent; once one joins, the reconciler commissions it to ready", async () => {
    const enrolled = await sim.enroll(sim.machines[0]!, { id: "m-late" });
    expect(enrolled).toMatchObject({ state: "enrolled", site: sim.site.id });
    await sleep(2500); // the reconciler passes at least twice meanwhile
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "m-late" })).state).toBe("enrolled");
    expect(await count(sim, sql`SELECT count(*)::int AS n FROM workflows WHERE target = 'm-late'`)).toBe(0);
    expect(await history(sim, "m-late")).toEqual([]);

    // The site's agent joins with a site token, as an operator's bcd would; nobody calls anything else.
    const siteAgent = await sim.joinSiteAgent();
    const ready = await sim.waitForState("m-late", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    const events = await history(sim, "m-late");
    expect(events.map((e) => e.event)).toEqual(["commission", "commissioned"]);
    const targets = await rows<{ node_id: string }>(
      sim,
      sql`
      SELECT DISTINCT c.node_id FROM bc_commands c JOIN workflow_steps s ON s.command_id = c.id
      WHERE s.workflow_id = ${events[0]!.workflow_id} AND c.kind LIKE 'metal.bmc.%'`,
    );
    expect(targets).toEqual([{ node_id: siteAgent }]);
  }, 60_000);

  it("a ramdisk vouched for by another site's agent is never taken for this site's machine", async () => {
    // Another site's agent vouches for a ramdisk claiming m-late's product UUID; it joins and connects.
    const other = await sim.call<{ token: string }>("siteTokens.create", { site: "other-site" });
    const otherState = new MemoryState();
    const otherSite = await new AgentClient({ transport: sim.control.transport, state: otherState, baseUrl: sim.control.baseUrl }).join({
      attestor: "join-token",
      evidence: { token: other.token },
      role: "site",
    });
    const otherKey = await importNodeKey((await otherState.loadKey())!);
    const machine = await sim.call<{ productUuid: string }>("metal.nodes.get", { node: "m-late" });
    const ramdiskKey = await generateNodeKey();
    const ramdiskState = new MemoryState();
    await ramdiskState.saveKey(ramdiskKey.privateJwk);
    const now = ((await sim.store.db.execute(sql`SELECT compute_now() AS now`)).rows[0] as { now: string }).now;
    const assertion = { publicKey: ramdiskKey.publicKey, issuedAt: new Date(now).toISOString(), productUuid: machine.productUuid };
    const foreign = new AgentClient({ transport: sim.control.transport, state: ramdiskState, baseUrl: sim.control.baseUrl });
    const joined = await foreign.join({
      attestor: "discovery",
      role: "ramdisk",
      evidence: {
        siteNodeId: otherSite.nodeId,
        assertion,
        signature: await signMessage(otherKey.privateKey, discoveryMessage(otherSite.nodeId, assertion)),
      },
    });
    void foreign.run().catch(() => {});
    await foreign.waitConnected(10_000);
    try {
      const workflow = (await history(sim, "m-late"))[0]!.workflow_id!;
      const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
      expect(joined.nodeId).toMatch(/^n-/);
      expect(await joinedAgent(ctx, workflow, "m-late", "ramdisk")).toBeUndefined();
    } finally {
      await foreign.stop();
    }
  });
});

describe("the lifecycle state machine (transition)", () => {
  let sim: MetalSim;
  beforeAll(async () => {
    sim = await createMetalSim({ machines: 1 });
  }, 60_000);
  afterAll(() => sim?.stop());

  const state = async (id: string) =>
    (
      await rows<{ state: string; maintenance: boolean; maintenance_reason: string | null; workflow_id: string | null }>(
        sim,
        sql`SELECT state, maintenance, maintenance_reason, workflow_id FROM metal_nodes WHERE id = ${id}`,
      )
    )[0]!;
  const events = (id: string) =>
    count(sim, sql`SELECT count(*)::int AS n FROM bc_events WHERE subject = ${`metal/nodes/${id}`} AND type LIKE 'metal.node.%'`);

  it("the same event twice changes the state once; an event from a state it does not leave from writes nothing", async () => {
    // No agent at this site: nothing but this test moves the machine.
    const pool = await agentlessSite(sim, "sm-site");
    await sim.call("metal.enroll", {
      id: "m-sm",
      pool,
      bmc: { address: sim.machines[0]!.address, username: SIM_BMC_USER, password: SIM_BMC_PASSWORD },
    });
    const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
    const apply = (event: Parameters<typeof transition>[3], patch: Parameters<typeof transition>[4] = {}) =>
      sim.store.transaction((tx) => transition(ctx, tx, "m-sm", event, patch));
    const eventsAtEnroll = await events("m-sm"); // metal.node.enrolled

    expect(await apply("commission")).toBe("enrolled");
    expect(await apply("commission")).toBeUndefined();
    expect((await state("m-sm")).state).toBe("commissioning");
    expect(await history(sim, "m-sm")).toEqual([
      { event: "commission", from_state: "enrolled", to_state: "commissioning", workflow_id: null },
    ]);
    expect(await events("m-sm")).toBe(eventsAtEnroll + 1);

    // Events that do not leave from commissioning: nothing written, their patch not applied.
    for (const event of ["deploy", "deployed", "undeploy", "released", "recommission", "retire", "commission"] as const) {
      expect(await apply(event, { maintenance: true, reason: `bogus ${event}`, workflowId: "wf-bogus" }), event).toBeUndefined();
    }
    expect(await state("m-sm")).toEqual({ state: "commissioning", maintenance: false, maintenance_reason: null, workflow_id: null });
    expect(await history(sim, "m-sm")).toHaveLength(1);
    expect(await events("m-sm")).toBe(eventsAtEnroll + 1);

    // fail applies its patch once; a second fail neither moves nor rewrites it.
    expect(await apply("fail", { maintenance: true, reason: "first failure", lastError: { code: "DRIVER_ERROR", message: "first" } })).toBe(
      "commissioning",
    );
    expect(
      await apply("fail", { maintenance: true, reason: "second failure", lastError: { code: "DRIVER_ERROR", message: "second" } }),
    ).toBeUndefined();
    expect(await state("m-sm")).toMatchObject({ state: "failed", maintenance: true, maintenance_reason: "first failure" });
    const failed = await sim.call<{ lastError: { message: string } }>("metal.nodes.get", { node: "m-sm" });
    expect(failed.lastError.message).toBe("first");
    expect((await history(sim, "m-sm")).map((h) => h.event)).toEqual(["commission", "fail"]);
  });

  it("two concurrent runners of the same event: exactly one moves the machine", async () => {
    const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
    expect((await state("m-sm")).state).toBe("failed");
    const results = await Promise.all(
      [0, 1, 2].map(() => sim.store.transaction((tx) => transition(ctx, tx, "m-sm", "recommission", { maintenance: false, reason: null }))),
    );
    expect(results.filter((r) => r !== undefined)).toEqual(["failed"]);
    expect((await history(sim, "m-sm")).map((h) => h.event)).toEqual(["commission", "fail", "recommission"]);
    expect((await state("m-sm")).state).toBe("enrolled");
  });
});
