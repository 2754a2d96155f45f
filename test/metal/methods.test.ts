// The operator's everyday metal methods on the simulated site: create semantics that cannot lose
// intent (the same fields again writes nothing, other fields are CONFLICT naming them), sites and
// pools listed, read, updated and deleted only once nothing uses them, one machine per BMC and per
// product UUID, maintenance, and workflows.list.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMetalSim, SIM_BMC_PASSWORD, SIM_BMC_USER, type MetalSim } from "better-compute/testing/metal";
import { AgentClient } from "../../agent/client.ts";
import { MemoryState } from "../../agent/state.ts";
import { transition } from "../../plugins/metal/lifecycle.ts";
import { refusal } from "../support/refusal.ts";

let sim: MetalSim;
beforeAll(async () => {
  // A second hardware profile, for pools whose profile changes.
  sim = await createMetalSim({
    machines: 3,
    hardwareProfiles: { "plain-redfish": { drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" } } },
  });
}, 60_000);
afterAll(() => sim?.stop());

async function rows<T = Record<string, unknown>>(query: ReturnType<typeof sql>): Promise<T[]> {
  return (await sim.store.db.execute(query)).rows as T[];
}
const count = async (query: ReturnType<typeof sql>) => (await rows<{ n: number }>(query))[0]!.n;
const eventsOf = (subject: string) =>
  rows<{ type: string; data: Record<string, unknown> }>(sql`SELECT type, data FROM bc_events WHERE subject = ${subject} ORDER BY id`);

/**
 * What a refused call must not have written. Events are those of sites, pools, enrollments and
 * maintenance only, and secrets not the tokens sealed for a boot: a machine commissioning
 * meanwhile writes those.
 */
async function written() {
  const [sites, pools, nodes, transitions, workflows] = await Promise.all(
    ["metal_sites", "metal_pools", "metal_nodes", "metal_transitions", "workflows"].map((t) =>
      count(sql`SELECT count(*)::int AS n FROM ${sql.identifier(t)}`),
    ),
  );
  const secrets = await count(sql`SELECT count(*)::int AS n FROM bc_secrets WHERE NOT (module = 'metal' AND name LIKE '%-token/%')`);
  const events = await count(sql`
    SELECT count(*)::int AS n FROM bc_events
    WHERE type LIKE 'metal.site.%' OR type LIKE 'metal.pool.%' OR type = 'metal.node.enrolled' OR type LIKE 'metal.node.maintenance.%'`);
  return { sites, pools, nodes, transitions, secrets, workflows, events };
}

const enroll = (pool: string, address: string, id?: string) =>
  sim.call<Record<string, any>>("metal.enroll", {
    pool,
    ...(id ? { id } : {}),
    bmc: { address, username: SIM_BMC_USER, password: SIM_BMC_PASSWORD },
  });

describe("creating a site or a pool that exists", () => {
  it("metal.sites.create: the same fields again is created: false and writes nothing; other fields are CONFLICT naming them", async () => {
    expect(await sim.call("metal.sites.create", { id: "lab", description: "rack 1" })).toEqual({ id: "lab", created: true });
    const before = await written();
    expect(await sim.call("metal.sites.create", { id: "lab", description: "rack 1" })).toEqual({ id: "lab", created: false });
    expect(await written()).toEqual(before);

    for (const other of [{ id: "lab" }, { id: "lab", description: "rack 2" }]) {
      const err = await refusal(sim.call("metal.sites.create", other));
      expect(err).toMatchObject({
        code: "CONFLICT",
        message: "site lab exists with other fields: description",
        details: { site: "lab", fields: ["description"] },
      });
    }
    expect(await written()).toEqual(before);
    expect((await sim.call<{ description: string }>("metal.sites.get", { id: "lab" })).description).toBe("rack 1");
    expect((await eventsOf("metal/sites/lab")).map((e) => e.type)).toEqual(["metal.site.created"]);
  });

  it("metal.pools.create compares after defaults; a different policy is CONFLICT naming its keys, and the stored policy stays", async () => {
    const policy = { hardwareProfile: "redfish-pxe" };
    expect(await sim.call("metal.pools.create", { id: "lab-metal", site: "lab", policy })).toEqual({ id: "lab-metal", created: true });
    const before = await written();
    // The defaults spelled out are the same fields.
    expect(
      await sim.call("metal.pools.create", {
        id: "lab-metal",
        site: "lab",
        class: "metal",
        agent: "bcd",
        policy: { ...policy, allowUnverifiedRelease: false, provisioningCidrs: [] },
      }),
    ).toEqual({ id: "lab-metal", created: false });
    expect(await written()).toEqual(before);

    const opted = await refusal(
      sim.call("metal.pools.create", { id: "lab-metal", site: "lab", policy: { ...policy, allowUnverifiedRelease: true } }),
    );
    expect(opted).toMatchObject({
      code: "CONFLICT",
      message: "pool lab-metal exists with other fields: policy.allowUnverifiedRelease",
      details: { pool: "lab-metal", fields: ["policy.allowUnverifiedRelease"] },
    });
    await sim.call("metal.sites.create", { id: "lab-2" });
    const moved = await refusal(
      sim.call("metal.pools.create", {
        id: "lab-metal",
        site: "lab-2",
        policy: { hardwareProfile: "plain-redfish", provisioningCidrs: ["10.0.0.0/24"] },
      }),
    );
    expect(moved.code).toBe("CONFLICT");
    expect(moved.details!.fields).toEqual(["site", "policy.hardwareProfile", "policy.provisioningCidrs"]);
    expect(moved.message).toBe("pool lab-metal exists with other fields: site, policy.hardwareProfile, policy.provisioningCidrs");

    const stored = await sim.call<Record<string, any>>("metal.pools.get", { id: "lab-metal" });
    expect(stored).toMatchObject({
      site: "lab",
      agent: "bcd",
      policy: { hardwareProfile: "redfish-pxe", allowUnverifiedRelease: false, provisioningCidrs: [] },
    });
    expect((await eventsOf("metal/pools/lab-metal")).map((e) => e.type)).toEqual(["metal.pool.created"]);
  });
});

describe("sites and pools: list, get, update, delete", () => {
  it("metal.sites.list and get show pool and machine counts and the site's agent; update changes the description once", async () => {
    const { sites } = await sim.call<{ sites: Record<string, any>[] }>("metal.sites.list", {});
    expect(sites.find((s) => s.id === sim.site.id)).toMatchObject({ pools: 1, machines: 0, agent: sim.site.agentNodeId });
    expect(sites.find((s) => s.id === "lab")).toMatchObject({ description: "rack 1", pools: 1, machines: 0, agent: null });
    expect((await refusal(sim.call("metal.sites.get", { id: "no-such-site" }))).code).toBe("NOT_FOUND");

    expect(await sim.call("metal.sites.update", { id: "lab", description: "rack 1, row B" })).toMatchObject({
      id: "lab",
      description: "rack 1, row B",
    });
    expect(await sim.call("metal.sites.update", { id: "lab", description: "rack 1, row B" })).toMatchObject({
      description: "rack 1, row B",
    });
    expect((await eventsOf("metal/sites/lab")).map((e) => e.type)).toEqual(["metal.site.created", "metal.site.updated"]);
    expect(await sim.call("metal.sites.update", { id: "lab", description: null })).toMatchObject({ description: null });
    expect((await refusal(sim.call("metal.sites.update", { id: "no-such-site", description: "x" }))).code).toBe("NOT_FOUND");
  });

  it("metal.pools.list filters by site; update replaces the policy, checked like create", async () => {
    const { pools } = await sim.call<{ pools: Record<string, any>[] }>("metal.pools.list", { site: "lab" });
    expect(pools.map((p) => p.id)).toEqual(["lab-metal"]);
    expect((await sim.call<{ pools: { id: string }[] }>("metal.pools.list", {})).pools.map((p) => p.id)).toEqual(
      expect.arrayContaining(["lab-metal", sim.site.pool]),
    );

    const updated = await sim.call<Record<string, any>>("metal.pools.update", {
      id: "lab-metal",
      policy: { hardwareProfile: "redfish-pxe", provisioningCidrs: ["10.0.0.0/24"] },
    });
    expect(updated.policy).toEqual({ hardwareProfile: "redfish-pxe", allowUnverifiedRelease: false, provisioningCidrs: ["10.0.0.0/24"] });
    expect((await eventsOf("metal/pools/lab-metal")).at(-1)).toEqual({
      type: "metal.pool.updated",
      data: { fields: ["policy.provisioningCidrs"] },
    });

    await sim.call("metal.pools.create", {
      id: "lab-agentless",
      site: "lab",
      agent: "none",
      policy: { hardwareProfile: "redfish-pxe", allowUnverifiedRelease: true },
    });
    const before = await written();
    const badProfile = await refusal(sim.call("metal.pools.update", { id: "lab-metal", policy: { hardwareProfile: "no-such-hardware" } }));
    expect(badProfile).toMatchObject({
      code: "INVALID_ARGUMENT",
      details: { known: expect.arrayContaining(["redfish-pxe", "plain-redfish"]) },
    });
    const noOptIn = await refusal(sim.call("metal.pools.update", { id: "lab-agentless", policy: { hardwareProfile: "redfish-pxe" } }));
    expect(noOptIn.code).toBe("INVALID_ARGUMENT");
    expect(noOptIn.message).toContain("allowUnverifiedRelease");
    expect(await written()).toEqual(before);
    expect((await refusal(sim.call("metal.pools.update", { id: "no-such-pool", policy: { hardwareProfile: "redfish-pxe" } }))).code).toBe(
      "NOT_FOUND",
    );
    expect(await sim.call("metal.pools.delete", { id: "lab-agentless" })).toEqual({
      id: "lab-agentless",
      deleted: true,
      retiredMachines: [],
    });
  });

  it("a pool holding machines keeps its hardware profile and is not deleted; once they are retired it may change, and its delete takes their rows", async () => {
    // lab has no agent: the machine stays enrolled, and nothing but this test moves it.
    const machine = await enroll("lab-metal", sim.machines[0]!.address, "m-pooled");
    expect(machine.state).toBe("enrolled");
    const before = await written();

    const change = await refusal(sim.call("metal.pools.update", { id: "lab-metal", policy: { hardwareProfile: "plain-redfish" } }));
    expect(change).toMatchObject({ code: "FAILED_PRECONDITION", details: { pool: "lab-metal", machines: ["m-pooled"] } });
    expect(change.message).toContain("m-pooled");
    const del = await refusal(sim.call("metal.pools.delete", { id: "lab-metal" }));
    expect(del).toMatchObject({ code: "FAILED_PRECONDITION", details: { pool: "lab-metal", machines: ["m-pooled"] } });
    const site = await refusal(sim.call("metal.sites.delete", { id: "lab" }));
    expect(site).toMatchObject({ code: "FAILED_PRECONDITION", details: { site: "lab", pools: ["lab-metal"] } });
    expect(await written()).toEqual(before);
    expect((await sim.call<{ machines: number }>("metal.sites.get", { id: "lab" })).machines).toBe(1);

    await sim.call("metal.nodes.retire", { node: "m-pooled", reason: "sold" });
    expect((await sim.call<{ machines: number }>("metal.pools.get", { id: "lab-metal" })).machines).toBe(0);
    expect(
      (await sim.call<Record<string, any>>("metal.pools.update", { id: "lab-metal", policy: { hardwareProfile: "plain-redfish" } })).policy
        .hardwareProfile,
    ).toBe("plain-redfish");
    expect(await sim.call("metal.pools.delete", { id: "lab-metal" })).toEqual({
      id: "lab-metal",
      deleted: true,
      retiredMachines: ["m-pooled"],
    });
    expect(await count(sql`SELECT count(*)::int AS n FROM metal_nodes WHERE id = 'm-pooled'`)).toBe(0);
    expect(await count(sql`SELECT count(*)::int AS n FROM metal_transitions WHERE node_id = 'm-pooled'`)).toBe(0);
    // The record of what happened stays.
    expect((await eventsOf("metal/nodes/m-pooled")).map((e) => e.type)).toEqual(["metal.node.enrolled", "metal.node.retire"]);
    expect((await eventsOf("metal/pools/lab-metal")).at(-1)).toEqual({
      type: "metal.pool.deleted",
      data: { retiredMachines: ["m-pooled"] },
    });
    expect((await refusal(sim.call("metal.pools.get", { id: "lab-metal" }))).code).toBe("NOT_FOUND");
    expect((await refusal(sim.call("metal.pools.delete", { id: "lab-metal" }))).code).toBe("NOT_FOUND");

    expect(await sim.call("metal.sites.delete", { id: "lab" })).toEqual({ id: "lab", deleted: true });
    expect((await refusal(sim.call("metal.sites.get", { id: "lab" }))).code).toBe("NOT_FOUND");
    expect((await eventsOf("metal/sites/lab")).at(-1)!.type).toBe("metal.site.deleted");
  });

  it("a site with a live site agent is not deleted until the agent is revoked (nodes.revoke)", async () => {
    await sim.call("metal.sites.create", { id: "edge" });
    const { token } = await sim.call<{ token: string }>("siteTokens.create", { site: "edge" });
    const agent = await new AgentClient({ transport: sim.control.transport, state: new MemoryState(), baseUrl: sim.control.baseUrl }).join({
      attestor: "join-token",
      evidence: { token },
      role: "site",
    });
    expect((await sim.call<{ agent: string | null }>("metal.sites.get", { id: "edge" })).agent).toBe(agent.nodeId);
    const err = await refusal(sim.call("metal.sites.delete", { id: "edge" }));
    expect(err).toMatchObject({ code: "FAILED_PRECONDITION", details: { site: "edge", agent: agent.nodeId } });
    expect(err.message).toContain("nodes.revoke");
    expect(await sim.call("nodes.revoke", { node: agent.nodeId })).toMatchObject({ id: agent.nodeId, revoked: true });
    expect(await sim.call("metal.sites.delete", { id: "edge" })).toEqual({ id: "edge", deleted: true });
  });
});

describe("one machine per BMC and per product UUID", () => {
  it("enrolling a BMC a machine in service holds is CONFLICT naming that machine (a trailing slash aside), and writes nothing", async () => {
    const first = await sim.enroll(sim.machines[0]!, { id: "m-one" });
    expect(first.state).toBe("commissioning");
    await sim.call("metal.sites.create", { id: "far" });
    await sim.call("metal.pools.create", { id: "far-metal", site: "far", policy: { hardwareProfile: "redfish-pxe" } });
    const before = await written();
    const address = sim.machines[0]!.address;
    for (const [pool, given] of [
      [sim.site.pool, address],
      [sim.site.pool, `${address}/`],
      ["far-metal", address],
    ] as const) {
      const err = await refusal(enroll(pool, given));
      expect(err.code, given).toBe("CONFLICT");
      expect(err.details).toEqual({ node: "m-one", state: "commissioning" });
      expect(err.message).toContain("metal node m-one");
      expect(JSON.stringify(err)).not.toContain(SIM_BMC_PASSWORD);
    }
    expect(await written()).toEqual(before);
    const ready = await sim.waitForState("m-one", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    // What commissioning found: the BMC's system summary and NICs, and the disks the ramdisk listed.
    const { inventory } = await sim.call<{ inventory: Record<string, any> | null }>("metal.nodes.get", { node: "m-one" });
    expect(inventory).toEqual({
      bmc: {
        manufacturer: "Better Compute (simulated)",
        model: "Redfish emulator",
        biosVersion: "SIM-BIOS-1.0.0",
        bmcFirmwareVersion: expect.any(String),
        processors: { count: 2, model: "Simulated CPU", threads: 64 },
        memoryGiB: 64,
        macs: sim.machines[0]!.macs,
      },
      ramdisk: {
        at: expect.any(String),
        disks: [{ device: "/dev/sda", sizeBytes: 64 * 1024 * 1024, model: "Simulated disk", serial: "SIM-1" }],
      },
    });
    expect(Date.parse(inventory!.ramdisk.at)).toBeLessThanOrEqual(Date.now());
  });

  it("a second machine reporting a product UUID the first holds fails commissioning with CONFLICT naming it, in maintenance; retiring the first lets it through", async () => {
    const [, a, b] = sim.machines;
    // Two BMCs that report one SMBIOS UUID (it happens with cloned firmware).
    b!.uuid = b!.bmc.uuid = a!.uuid;
    await sim.enroll(a!, { id: "m-uuid-a" });
    expect((await sim.waitForState("m-uuid-a", ["ready", "failed"])).state).toBe("ready");
    await sim.enroll(b!, { id: "m-uuid-b" });
    const failed = await sim.waitForState("m-uuid-b", ["failed", "ready"]);
    expect(failed).toMatchObject({ state: "failed", maintenance: true, productUuid: null });
    expect(failed.lastError).toMatchObject({
      code: "CONFLICT",
      step: "metal.recordInventory",
      details: { node: "m-uuid-a", productUuid: a!.uuid.toLowerCase() },
    });
    expect((failed.lastError as { message: string }).message).toContain("metal node m-uuid-a");
    expect(failed.maintenanceReason).toContain("m-uuid-a");
    // The index stands behind the check: no write can give two machines in service one UUID.
    await expect(
      sim.store.db.execute(sql`UPDATE metal_nodes SET product_uuid = ${a!.uuid.toUpperCase()} WHERE id = 'm-uuid-b'`),
    ).rejects.toThrow();

    // A failed machine leaves maintenance only by recommission.
    const off = await refusal(sim.call("metal.nodes.maintenance", { node: "m-uuid-b", on: false }));
    expect(off.code).toBe("FAILED_PRECONDITION");
    expect(off.message).toContain("metal.nodes.recommission");

    await sim.call("metal.nodes.retire", { node: "m-uuid-a", reason: "a duplicate" });
    await sim.call("metal.nodes.recommission", { node: "m-uuid-b" });
    const ready = await sim.waitForState("m-uuid-b", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    expect(ready.productUuid).toBe(a!.uuid.toLowerCase());
  }, 90_000);
});

describe("metal.nodes.maintenance", () => {
  it("on (a reason required) keeps a ready machine from being deployed; off lets it; each change is recorded once", async () => {
    expect((await refusal(sim.call("metal.nodes.maintenance", { node: "m-one", on: true }))).code).toBe("INVALID_ARGUMENT");
    const on = await sim.call<Record<string, any>>("metal.nodes.maintenance", { node: "m-one", on: true, reason: "fan noise" });
    expect(on).toMatchObject({ state: "ready", maintenance: true, maintenanceReason: "fan noise" });
    await sim.call("metal.nodes.maintenance", { node: "m-one", on: true, reason: "fan noise" }); // again: nothing new
    const deploy = await refusal(sim.call("metal.deploy", { node: "m-one", profile: "metal.deploy.image-stream", input: {} }));
    expect(deploy.code).toBe("FAILED_PRECONDITION");
    expect(deploy.message).toContain("fan noise");
    expect(
      (await sim.call<{ nodes: { id: string }[] }>("metal.nodes.list", { maintenance: true, site: sim.site.id })).nodes.map((n) => n.id),
    ).toContain("m-one");

    const off = await sim.call<Record<string, any>>("metal.nodes.maintenance", { node: "m-one", on: false, reason: "fan replaced" });
    expect(off).toMatchObject({ state: "ready", maintenance: false, maintenanceReason: null });
    const history = await rows(
      sql`SELECT event, from_state, to_state, reason FROM metal_transitions WHERE node_id = 'm-one' AND event LIKE 'maintenance.%' ORDER BY id`,
    );
    expect(history).toEqual([
      { event: "maintenance.on", from_state: "ready", to_state: "ready", reason: "fan noise" },
      { event: "maintenance.off", from_state: "ready", to_state: "ready", reason: "fan replaced" },
    ]);
    expect((await eventsOf("metal/nodes/m-one")).filter((e) => e.type.startsWith("metal.node.maintenance"))).toEqual([
      { type: "metal.node.maintenance.on", data: { state: "ready", reason: "fan noise" } },
      { type: "metal.node.maintenance.off", data: { state: "ready", reason: "fan replaced" } },
    ]);
  });

  it("is refused while a workflow drives the machine, for a retired machine, and for an unknown one", async () => {
    // A machine held in commissioning with no workflow: nothing but this test moves it.
    await sim.call("metal.sites.create", { id: "still" });
    await sim.call("metal.pools.create", { id: "still-metal", site: "still", policy: { hardwareProfile: "redfish-pxe" } });
    await enroll("still-metal", "https://192.0.2.10/redfish/v1/Systems/1", "m-moving");
    const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
    await sim.store.transaction((tx) => transition(ctx, tx, "m-moving", "commission"));
    const before = await written();
    const moving = await refusal(sim.call("metal.nodes.maintenance", { node: "m-moving", on: true, reason: "pull it" }));
    expect(moving).toMatchObject({ code: "FAILED_PRECONDITION", details: { node: "m-moving", state: "commissioning" } });
    expect(moving.message).toContain("workflows.cancel");
    const retired = await refusal(sim.call("metal.nodes.maintenance", { node: "m-uuid-a", on: true, reason: "x" }));
    expect(retired).toMatchObject({ code: "FAILED_PRECONDITION", details: { state: "retired" } });
    expect(await written()).toEqual(before);
    expect((await refusal(sim.call("metal.nodes.maintenance", { node: "nobody", on: true, reason: "x" }))).code).toBe("NOT_FOUND");
  });

  it("an enrolled machine in maintenance is not commissioned when its site gets an agent; taking it out commissions it at once", async () => {
    await sim.call("metal.sites.create", { id: "idle" });
    await sim.call("metal.pools.create", { id: "idle-metal", site: "idle", policy: { hardwareProfile: "redfish-pxe" } });
    expect((await enroll("idle-metal", "https://192.0.2.11/redfish/v1/Systems/1", "m-idle")).state).toBe("enrolled");
    await sim.call("metal.nodes.maintenance", { node: "m-idle", on: true, reason: "waiting for cabling" });
    // The site's agent joins (it never connects: the commissioning below only has to start).
    const { token } = await sim.call<{ token: string }>("siteTokens.create", { site: "idle" });
    await new AgentClient({ transport: sim.control.transport, state: new MemoryState(), baseUrl: sim.control.baseUrl }).join({
      attestor: "join-token",
      evidence: { token },
      role: "site",
    });
    await sim.control.compute!.reconcile({}, sim.store);
    expect(await sim.call("metal.nodes.get", { node: "m-idle" })).toMatchObject({ state: "enrolled", maintenance: true, workflow: null });

    const out = await sim.call<Record<string, any>>("metal.nodes.maintenance", { node: "m-idle", on: false });
    expect(out).toMatchObject({ state: "commissioning", maintenance: false, workflow: expect.stringMatching(/^wf-/) });
    const { workflows } = await sim.call<{ workflows: Record<string, any>[] }>("workflows.list", { target: "m-idle" });
    expect(workflows).toEqual([expect.objectContaining({ id: out.workflow, profile: "metal.commission", state: "running" })]);
    expect(workflows[0]!.createdBy).not.toBe("system:metal");
  });
});

describe("workflows.list", () => {
  it("lists a target's workflows newest first without steps, filters by profile and state, and pages with after", async () => {
    const all = await sim.call<{ workflows: Record<string, any>[]; next: string | null }>("workflows.list", { target: "m-uuid-b" });
    expect(all.workflows.map((w) => [w.profile, w.state])).toEqual([
      ["metal.commission", "succeeded"],
      ["metal.commission", "failed"],
    ]);
    expect(all.workflows[0]).not.toHaveProperty("steps");
    expect(all.workflows[1]).toMatchObject({ target: "m-uuid-b", createdBy: "system:metal", error: { code: "CONFLICT" } });
    expect(all.next).toBeNull();

    const first = await sim.call<{ workflows: { id: string }[]; next: string | null }>("workflows.list", { target: "m-uuid-b", limit: 1 });
    expect(first.workflows.map((w) => w.id)).toEqual([all.workflows[0]!.id]);
    expect(first.next).toBe(all.workflows[0]!.id);
    const second = await sim.call<{ workflows: { id: string }[]; next: string | null }>("workflows.list", {
      target: "m-uuid-b",
      limit: 1,
      after: first.next,
    });
    expect(second.workflows.map((w) => w.id)).toEqual([all.workflows[1]!.id]);

    expect(
      (await sim.call<{ workflows: { id: string }[] }>("workflows.list", { target: "m-uuid-b", state: "failed" })).workflows.map(
        (w) => w.id,
      ),
    ).toEqual([all.workflows[1]!.id]);
    const commissions = await sim.call<{ workflows: { profile: string; target: string }[] }>("workflows.list", {
      profile: "metal.commission",
      state: "succeeded",
    });
    expect(new Set(commissions.workflows.map((w) => w.target))).toEqual(new Set(["m-one", "m-uuid-a", "m-uuid-b"]));
    expect(commissions.workflows.every((w) => w.profile === "metal.commission")).toBe(true);
    expect((await refusal(sim.call("workflows.list", { after: "wf-nope" }))).code).toBe("NOT_FOUND");
    expect((await refusal(sim.call("workflows.list", { target: "x".repeat(129) }))).code).toBe("INVALID_ARGUMENT");
  });
});
