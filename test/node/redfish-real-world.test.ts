// The site agent's Redfish client (agent/roles/redfish.ts) against BMCs as they are: the Redfish
// emulator (SIMULATED hardware over real HTTP) in the modes real BMCs show (asynchronous resets,
// no BIOS resource, no volume creation, Continuous-only boot overrides, a failing Storage,
// CapacityBytes required), each with the outcome an operator expects. Then the same on the
// simulated site (real engine, metal module, agents): a permanent refusal (UNSUPPORTED,
// INVALID_ARGUMENT) fails its step at once, with the capability named in the node's lastError.
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { FetchLike } from "../../agent/client.ts";
import { RedfishClient, type RedfishClientOptions } from "../../agent/roles/redfish.ts";
import { siteHandlers } from "../../agent/roles/site.ts";
import { startRedfishEmulator, type BmcQuirks, type MachineOptions, type RedfishEmulator } from "../../testing/redfish-emulator.ts";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";
import { agentFailure } from "../support/agent-error.ts";
import { commandContext } from "../support/command-context.ts";

const USER = "root";
const PASS = "real-world-Pa55word";
const running: RedfishEmulator[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

/** One machine "q" behind a BMC with these quirks, and a client for it (power waits look every 20 ms). */
async function bmcWith(quirks: BmcQuirks, machine: Omit<MachineOptions, "id" | "quirks"> = {}, options: RedfishClientOptions = {}) {
  const emu = await startRedfishEmulator({ machines: [{ ...machine, id: "q", quirks }], username: USER, password: PASS });
  running.push(emu);
  const address = `${emu.url}/redfish/v1/Systems/q`;
  const client = new RedfishClient(
    { address, username: USER, password: PASS },
    { powerWait: { timeoutMs: 10_000, intervalMs: 20 }, ...options },
  );
  return { emu, m: emu.machines.get("q")!, address, client };
}

const writes = (emu: RedfishEmulator) =>
  emu.requests.filter((r) => r.method !== "GET").map((r) => `${r.method} ${r.path.replace(/^\/redfish\/v1\/Systems\/q/, "")} ${r.status}`);

describe("the Redfish client against BMCs as they are", () => {
  it("asynchronous resets: off then at once on ends On, each waiting until the BMC reports the state", async () => {
    const { emu, m, client } = await bmcWith({ resetDelayMs: 300 }, { power: "On" });
    expect(await client.setPower("off")).toEqual({ powerState: "Off", previous: "On" });
    expect(await client.setPower("on")).toEqual({ powerState: "On", previous: "Off" });
    expect(m.power).toBe("On");
    expect(await client.setPower("cycle")).toEqual({ powerState: "On", previous: "On" });
    expect(m.power).toBe("On");
    expect(m.powerHistory).toEqual(["Off", "On", "Off", "On"]);
    expect(writes(emu)).toEqual(Array(4).fill("POST /Actions/ComputerSystem.Reset 204"));
  });

  it("a reset already under way is let finish before deciding: on during PoweringOn sends nothing more", async () => {
    const { emu, m, client } = await bmcWith({ resetDelayMs: 400 });
    await fetch(`${emu.url}/redfish/v1/Systems/q/Actions/ComputerSystem.Reset`, {
      method: "POST",
      headers: { authorization: `Basic ${Buffer.from(`${USER}:${PASS}`).toString("base64")}`, "content-type": "application/json" },
      body: JSON.stringify({ ResetType: "On" }),
    });
    await expect.poll(() => m.transition, { interval: 5 }).toBe("PoweringOn");
    expect(await client.setPower("on")).toEqual({ powerState: "On", previous: "PoweringOn" });
    expect(m.powerHistory).toEqual(["On"]);
    expect(writes(emu)).toHaveLength(1); // only the reset sent above
  });

  it("a BMC that never reaches the state: DRIVER_ERROR naming the BMC and the state it stayed in", async () => {
    const { m, address } = await bmcWith({ resetDelayMs: 600_000 });
    const client = new RedfishClient({ address, username: USER, password: PASS }, { powerWait: { timeoutMs: 200, intervalMs: 20 } });
    const e = await agentFailure(client.setPower("on"));
    expect(e).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: false,
      message: `BMC ${address} did not reach PowerState On within 0.2 s after Reset On: it stayed Off`,
    });
    expect(m.power).toBe("Off");
  });

  it("no BIOS resource: UNSUPPORTED naming it, nothing sent", async () => {
    const { emu, address, client } = await bmcWith({ noBios: true });
    const e = await agentFailure(client.applyBiosSettings({ SriovGlobalEnable: true }));
    expect(e).toMatchObject({ code: "UNSUPPORTED", message: `BMC ${address} has no BIOS settings resource (Bios)` });
    expect(writes(emu)).toEqual([]);
  });

  it("no volume creation: UNSUPPORTED naming it, found from the Allow header before any volume is deleted", async () => {
    const { emu, m, address, client } = await bmcWith({ noVolumeCreation: true }, { drives: 2 });
    m.storage.volumes.push({ id: "Volume.7", name: "scratch", raidType: "RAID0", drives: ["Disk.Bay.0"], capacityBytes: 1 });
    const e = await agentFailure(client.configureRaid({ level: "RAID1" }));
    const volumes = "/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Volumes";
    expect(e).toMatchObject({
      code: "UNSUPPORTED",
      message: `BMC ${address} does not offer volume creation: its Volumes collection ${volumes} allows GET, not POST; no RAID1 volume can be made`,
    });
    expect(writes(emu)).toEqual([]);
    expect(m.storage.volumes.map((v) => v.id)).toEqual(["Volume.7"]);
    // A volume that already fits needs no creation.
    expect(await client.configureRaid({ level: "RAID0", drives: 1 })).toEqual({ volume: { id: "Volume.7", level: "RAID0", drives: 1 } });
  });

  it("no volume creation and no Allow header: the POST's 405 is UNSUPPORTED too", async () => {
    // The same BMC through a proxy that drops the Allow header, as some BMCs never send it.
    const withoutAllow: FetchLike = async (url, init) => {
      const res = await fetch(url, init);
      const headers = new Headers(res.headers);
      headers.delete("allow");
      return new Response(res.status === 204 ? null : await res.text(), { status: res.status, statusText: res.statusText, headers });
    };
    const { emu, address, client } = await bmcWith({ noVolumeCreation: true }, { drives: 2 }, { fetch: withoutAllow });
    const e = await agentFailure(client.configureRaid({ level: "RAID1" }));
    expect(e).toMatchObject({
      code: "UNSUPPORTED",
      message: `BMC ${address} does not offer volume creation: POST /redfish/v1/Systems/q/Storage/RAID.Integrated.1/Volumes answered 405; no RAID1 volume can be made`,
    });
    expect(writes(emu)).toEqual(["POST /Storage/RAID.Integrated.1/Volumes 405"]);
  });

  it("makes a volume with its drives under Links.Drives and its CapacityBytes, which some BMCs require", async () => {
    const { m, client } = await bmcWith({ requireVolumeCapacity: true }, { drives: 4 });
    expect(await client.configureRaid({ level: "RAID10" })).toEqual({ volume: { id: "Volume.1", level: "RAID10", drives: 4 } });
    expect(m.storage.volumes).toMatchObject([
      {
        raidType: "RAID10",
        drives: ["Disk.Bay.0", "Disk.Bay.1", "Disk.Bay.2", "Disk.Bay.3"],
        capacityBytes: 2 * m.storage.drives[0]!.capacityBytes,
      },
    ]);
  });

  it("Continuous-only boot overrides: the result says Continuous, with a warning, and the handler logs it", async () => {
    const { address, client } = await bmcWith({ continuousBootOnly: true });
    expect(await client.setBootDevice("pxe")).toEqual({
      target: "Pxe",
      enabled: "Continuous",
      warning: `BMC ${address} recorded the boot override Pxe as Continuous when asked for Once: the machine boots Pxe every time until its boot device is set again`,
    });
    expect(await client.setBootDevice("disk", false)).toEqual({ target: "Hdd", enabled: "Continuous" });

    const logged: Array<[string, Record<string, unknown> | undefined]> = [];
    const log = { info() {}, warn: (message: string, fields?: Record<string, unknown>) => void logged.push([message, fields]), error() {} };
    const ctx = commandContext("metal.bmc.boot", { "secret://q": PASS });
    await siteHandlers({ log })["metal.bmc.boot"]!({ bmc: { address, username: USER, password: "secret://q" }, device: "cd" }, ctx);
    expect(logged).toEqual([
      [
        "bmc operation warning",
        { kind: "metal.bmc.boot", bmc: address, warning: expect.stringContaining("recorded the boot override Cd as Continuous") },
      ],
    ]);
  });

  it("a boot override recorded for another target is a DRIVER_ERROR", async () => {
    // A BMC that records Hdd whatever it is asked (here: a proxy rewriting the request).
    const hddOnly: FetchLike = (url, init) =>
      fetch(url, init.method === "PATCH" ? { ...init, body: String(init.body).replace(/"Pxe"/, '"Hdd"') } : init);
    const { address, client } = await bmcWith({}, {}, { fetch: hddOnly });
    expect(await agentFailure(client.setBootDevice("pxe"))).toMatchObject({
      code: "DRIVER_ERROR",
      message: `BMC ${address} recorded the boot override target Hdd when asked for Pxe`,
    });
  });

  it("a failing Storage does not fail the inspection: it says Storage could not be read; RAID is a DRIVER_ERROR", async () => {
    const { m, address, client } = await bmcWith({ failingStorage: true }, { drives: 2, addresses: ["10.0.0.9"] });
    const found = await client.inspect();
    expect(found).toMatchObject({ systemId: "q", uuid: m.uuid, addresses: ["10.0.0.9"], media: { inserted: false, image: null } });
    expect("storage" in found).toBe(false);
    expect(found.unavailable).toEqual([
      {
        resource: "Storage",
        error: `BMC ${address} answered 500 Internal Server Error to GET /redfish/v1/Systems/q/Storage: The request failed due to an internal service error.`,
      },
    ]);
    const raid = await agentFailure(client.configureRaid({ level: "RAID1" }));
    expect(raid).toMatchObject({ code: "DRIVER_ERROR", permanent: false });
    m.quirks.failingStorage = false;
    const healed = await client.inspect();
    expect(healed.storage).toEqual({ drives: 2, volumes: [] });
    expect("unavailable" in healed).toBe(false);
  });
});

describe("on the simulated site: what the operator sees", () => {
  let sim: MetalSim;
  beforeAll(async () => {
    sim = await createMetalSim({
      machines: 3,
      drives: 2,
      hardwareProfiles: {
        tuned: {
          drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" },
          bios: { SriovGlobalEnable: true },
          raid: { level: "RAID1" },
        },
      },
      hardwareProfile: "tuned",
    });
  }, 60_000);
  afterAll(() => sim?.stop());

  /** The machine's failed commissioning: its lastError and how many attempts each failed step took. */
  async function failure(id: string) {
    const node = await sim.waitForState(id, ["failed", "ready"]);
    const lastError = node.lastError as Record<string, unknown>;
    const workflow = await sim.call<{ steps: { name: string; attempts: { state: string; error: { code: string } | null }[] }[] }>(
      "workflows.get",
      { id: lastError.workflow as string },
    );
    const failed = workflow.steps
      .filter((s) => s.attempts.some((a) => a.state === "failed"))
      .map((s) => ({ step: s.name, attempts: s.attempts.map((a) => a.error?.code ?? a.state) }));
    return { state: node.state, lastError, failed };
  }

  it("a BMC without BIOS settings: bios.apply fails at once with UNSUPPORTED naming the resource", async () => {
    const machine = sim.machines[0]!;
    machine.bmc.quirks.noBios = true;
    await sim.enroll(machine, { id: "m-nobios" });
    const { state, lastError, failed } = await failure("m-nobios");
    expect(state).toBe("failed");
    expect(lastError).toMatchObject({
      code: "UNSUPPORTED",
      step: "bios.apply",
      message: `metal.bmc.bios failed on the agent: BMC ${machine.address} has no BIOS settings resource (Bios)`,
    });
    expect(failed).toEqual([{ step: "bios.apply", attempts: ["UNSUPPORTED"] }]);
  }, 60_000);

  it("a BMC without volume creation: raid.apply fails at once with UNSUPPORTED naming it", async () => {
    const machine = sim.machines[1]!;
    machine.bmc.quirks.noVolumeCreation = true;
    await sim.enroll(machine, { id: "m-novolumes" });
    const { lastError, failed } = await failure("m-novolumes");
    expect(lastError).toMatchObject({
      code: "UNSUPPORTED",
      step: "raid.apply",
      message: expect.stringContaining(`BMC ${machine.address} does not offer volume creation`),
    });
    expect(failed).toEqual([{ step: "raid.apply", attempts: ["UNSUPPORTED"] }]);
  }, 60_000);

  it("a refusal by the agent (INVALID_ARGUMENT: RAID1 over one drive) is not retried either", async () => {
    const machine = sim.machines[2]!;
    machine.bmc.storage.drives.pop();
    await sim.enroll(machine, { id: "m-onedrive" });
    const { lastError, failed } = await failure("m-onedrive");
    expect(lastError).toMatchObject({
      code: "INVALID_ARGUMENT",
      step: "raid.apply",
      message: expect.stringContaining("RAID1 takes exactly 2 drives, not 1"),
    });
    expect(failed).toEqual([{ step: "raid.apply", attempts: ["INVALID_ARGUMENT"] }]);
    expect(machine.bmc.storage.volumes).toEqual([]);
  }, 60_000);
});

describe("on the simulated site: BMCs that behave like real ones still commission", () => {
  let sim: MetalSim;
  beforeAll(async () => {
    sim = await createMetalSim({ machines: 3, drives: 2 });
  }, 60_000);
  afterAll(() => sim?.stop());

  it("asynchronous resets, Continuous-only overrides and a failing Storage each end ready, saying what they met", async () => {
    const [slow, continuous, storage] = sim.machines as [(typeof sim.machines)[0], (typeof sim.machines)[0], (typeof sim.machines)[0]];
    slow.bmc.quirks.resetDelayMs = 300;
    continuous.bmc.quirks.continuousBootOnly = true;
    storage.bmc.quirks.failingStorage = true;
    await Promise.all([
      sim.enroll(slow, { id: "m-async" }),
      sim.enroll(continuous, { id: "m-continuous" }),
      sim.enroll(storage, { id: "m-storage" }),
    ]);
    for (const id of ["m-async", "m-continuous", "m-storage"]) {
      const node = await sim.waitForState(id, ["ready", "failed"], 90_000);
      expect(node.state, `${id}: ${JSON.stringify(node.lastError)}`).toBe("ready");
    }
    expect(slow.boots).toEqual(["pxe"]);

    const outputs = async (id: string) => {
      const [row] = (
        await sim.store.db.execute(sql`SELECT workflow_id FROM metal_transitions WHERE node_id = ${id} AND event = 'commission'`)
      ).rows as { workflow_id: string }[];
      const wf = await sim.call<{ steps: { name: string; attempts: { output: any }[] }[] }>("workflows.get", { id: row!.workflow_id });
      return Object.fromEntries(wf.steps.map((s) => [s.name, s.attempts.at(-1)?.output]));
    };
    // The power steps answered once the BMC reported the state, not the state it had before.
    const slowSteps = await outputs("m-async");
    expect([slowSteps["power.cycle"], slowSteps["power.off"]]).toEqual([
      { powerState: "On", previous: "Off" },
      { powerState: "Off", previous: "On" },
    ]);
    expect(slow.bmc.power).toBe("Off");
    expect((await outputs("m-continuous"))["boot.pxe"]).toMatchObject({
      target: "Pxe",
      enabled: "Continuous",
      warning: expect.stringContaining("as Continuous when asked for Once"),
    });
    const inspected = (await outputs("m-storage")).inspect;
    expect(inspected.unavailable).toEqual([{ resource: "Storage", error: expect.stringContaining("answered 500") }]);
    expect(inspected.storage).toBeUndefined();
  }, 120_000);
});
