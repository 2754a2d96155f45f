// A hardware profile's BIOS settings and RAID layout are applied during commissioning, through
// its own commissioning profile, before the ramdisk boots. The BMC's BIOS and storage are
// simulated (the Redfish emulator); the steps, the site agent's Redfish client and the engine are real.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";

let sim: MetalSim;
beforeAll(async () => {
  sim = await createMetalSim({
    machines: 1,
    drives: 2,
    hardwareProfiles: {
      "mirrored-uefi": {
        description: "two drives mirrored, SR-IOV on",
        drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" },
        bios: { SriovGlobalEnable: true, ProcTurboMode: "Disabled" },
        raid: { level: "RAID1" },
      },
    },
    hardwareProfile: "mirrored-uefi",
  });
}, 60_000);
afterAll(() => sim?.stop());

describe("a hardware profile with BIOS settings and a RAID layout", () => {
  it("validates as its own commissioning profile", async () => {
    const report = await sim.call<{ valid: boolean; issues: unknown[] }>("profiles.validate", { id: "metal.commission.mirrored-uefi" });
    expect(report).toMatchObject({ valid: true, issues: [] });
  });

  it("commissions with the BIOS settings applied at the ramdisk's boot and the RAID volume made", async () => {
    const machine = sim.machines[0]!;
    expect(machine.bmc.biosSettings).toMatchObject({ SriovGlobalEnable: false, ProcTurboMode: "Enabled" });
    await sim.enroll(machine, { id: "m-hw" });
    const ready = await sim.waitForState("m-hw", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");

    expect(machine.bmc.biosSettings).toMatchObject({ SriovGlobalEnable: true, ProcTurboMode: "Disabled" });
    expect(machine.bmc.biosPending).toEqual({});
    expect(machine.bmc.storage.volumes.map((v) => ({ level: v.raidType, drives: v.drives.length }))).toEqual([
      { level: "RAID1", drives: 2 },
    ]);

    const steps = await sim.store.db.execute(sql`
      SELECT s.name FROM workflow_steps s JOIN metal_nodes n ON n.workflow_id = s.workflow_id
      WHERE n.id = 'm-hw' AND s.state = 'succeeded' ORDER BY s.position`);
    expect((steps.rows as { name: string }[]).map((r) => r.name)).toEqual([
      "inspect",
      "metal.recordInventory",
      "bios.apply",
      "raid.apply",
      "ramdisk.token",
      "netboot.ramdisk",
      "boot.pxe",
      "power.cycle",
      "wait.ramdisk",
      "inventory.ramdisk",
      "disk.wipe",
      "netboot.disk",
      "power.off",
    ]);
  }, 60_000);
});
