// The Redfish BMC emulator (testing/redfish-emulator.ts), simulated hardware served
// over real HTTP: the resource tree, power actions and the power hook, boot override,
// virtual media, BIOS settings staged for the next power-on, RAID volumes on the Storage
// controller, a NIC's addresses under EthernetInterfaces, Basic auth that never echoes the
// password, seeded faults, stop(), product UUIDs of its own, and the quirks of real BMCs
// (asynchronous resets, no BIOS, no volume creation, Continuous-only overrides, a failing Storage,
// CapacityBytes required).
import { afterEach, describe, expect, it } from "vitest";
import {
  startRedfishEmulator,
  type BmcQuirks,
  type MachineOptions,
  type PowerState,
  type RedfishEmulator,
  type RedfishFaults,
} from "../../testing/redfish-emulator.ts";

const USER = "root";
const PASS = "s3cret-Pa55word-xyz";
const running: RedfishEmulator[] = [];

async function start(
  machines: number | MachineOptions[] = 2,
  faults?: RedfishFaults,
  onPowerChange?: Parameters<typeof startRedfishEmulator>[0]["onPowerChange"],
) {
  const emu = await startRedfishEmulator({ machines, username: USER, password: PASS, faults, onPowerChange });
  running.push(emu);
  return emu;
}

afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

function auth(user = USER, pass = PASS) {
  return { authorization: `Basic ${Buffer.from(`${user}:${pass}`).toString("base64")}` };
}

async function call(emu: RedfishEmulator, method: string, path: string, body?: unknown, headers: Record<string, string> = auth()) {
  const res = await fetch(emu.url + path, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, text, json: text ? (JSON.parse(text) as any) : undefined, allow: res.headers.get("allow") };
}

/** An emulator of one machine "q" with these quirks. */
const quirky = (quirks: BmcQuirks, machine: Omit<MachineOptions, "id" | "quirks"> = {}) => start([{ ...machine, id: "q", quirks }]);

/** The PowerStates a machine goes through until it reports `until`, each once, in order. */
async function powerStatesUntil(emu: RedfishEmulator, until: string): Promise<string[]> {
  const seen: string[] = [];
  for (let i = 0; i < 1000 && seen.at(-1) !== until; i++) {
    const state = (await call(emu, "GET", "/redfish/v1/Systems/q")).json.PowerState as string;
    if (seen.at(-1) !== state) seen.push(state);
    await new Promise((r) => setTimeout(r, 10));
  }
  return seen;
}

describe("redfish emulator", () => {
  it("serves the service root and the systems collection, linked to managers", async () => {
    const emu = await start([{ id: "a", uuid: "11111111-2222-4333-8444-555555555555" }, { id: "b" }]);
    const root = await call(emu, "GET", "/redfish/v1", undefined, {});
    expect(root.status).toBe(200);
    expect(root.json.Systems["@odata.id"]).toBe("/redfish/v1/Systems");
    expect(root.json.Managers["@odata.id"]).toBe("/redfish/v1/Managers");

    const systems = await call(emu, "GET", "/redfish/v1/Systems");
    expect(systems.status).toBe(200);
    expect(systems.json["Members@odata.count"]).toBe(2);
    expect(systems.json.Members.map((m: any) => m["@odata.id"])).toEqual(["/redfish/v1/Systems/a", "/redfish/v1/Systems/b"]);

    const a = await call(emu, "GET", "/redfish/v1/Systems/a/");
    expect(a.json).toMatchObject({
      Id: "a",
      UUID: "11111111-2222-4333-8444-555555555555",
      PowerState: "Off",
      BiosVersion: emu.machines.get("a")!.biosVersion,
    });
    expect(a.json.Boot["BootSourceOverrideTarget@Redfish.AllowableValues"]).toEqual(["None", "Pxe", "Cd", "Hdd"]);
    const mgrPath = a.json.Links.ManagedBy[0]["@odata.id"];
    const mgr = await call(emu, "GET", mgrPath);
    expect(mgr.status).toBe(200);
    expect(mgr.json.Links.ManagerForServers).toEqual([{ "@odata.id": "/redfish/v1/Systems/a" }]);
    const managers = await call(emu, "GET", "/redfish/v1/Managers");
    expect(managers.json["Members@odata.count"]).toBe(2);

    expect((await call(emu, "GET", "/redfish/v1/Systems/nope")).status).toBe(404);
    expect(emu.requests.at(-1)).toEqual({ method: "GET", path: "/redfish/v1/Systems/nope", status: 404 });
  });

  it("powers on, off and cycles through Reset, calling the hook", async () => {
    const seen: Array<[string, PowerState, PowerState, PowerState]> = [];
    const emu = await start(1, undefined, (m, from, to) => {
      seen.push([m.id, from, to, m.power]);
    });
    const reset = (t: string) => call(emu, "POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", { ResetType: t });
    const power = async () => (await call(emu, "GET", "/redfish/v1/Systems/node-1")).json.PowerState;

    expect((await reset("On")).status).toBe(204);
    expect(await power()).toBe("On");
    expect((await reset("ForceOff")).status).toBe(204);
    expect(await power()).toBe("Off");
    await reset("On");
    expect((await reset("PowerCycle")).status).toBe(204);
    expect(await power()).toBe("On");
    expect((await reset("GracefulShutdown")).status).toBe(204);
    expect(emu.machines.get("node-1")!.power).toBe("Off");
    expect(seen).toEqual([
      ["node-1", "Off", "On", "On"],
      ["node-1", "On", "Off", "Off"],
      ["node-1", "Off", "On", "On"],
      ["node-1", "On", "Off", "Off"],
      ["node-1", "Off", "On", "On"],
      ["node-1", "On", "Off", "Off"],
    ]);
  });

  it("answers a bad or missing ResetType with a Redfish 400 and leaves power alone", async () => {
    const emu = await start(1);
    const bad = await call(emu, "POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", { ResetType: "Explode" });
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe("Base.1.8.ActionParameterValueNotInList");
    expect(bad.json.error["@Message.ExtendedInfo"][0].MessageArgs).toContain("Explode");
    const missing = await call(emu, "POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", {});
    expect(missing.status).toBe(400);
    expect(missing.json.error.code).toBe("Base.1.8.ActionParameterMissing");
    expect(emu.machines.get("node-1")!.power).toBe("Off");
    expect(emu.machines.get("node-1")!.powerHistory).toEqual([]);
  });

  it("sets the boot override by PATCH; Once is consumed by the next boot", async () => {
    const bootTargets: string[] = [];
    const emu = await start(1, undefined, (m, _from, to) => {
      if (to === "On") bootTargets.push(m.boot.target);
    });
    const sys = "/redfish/v1/Systems/node-1";
    const p = await call(emu, "PATCH", sys, { Boot: { BootSourceOverrideTarget: "Pxe", BootSourceOverrideEnabled: "Once" } });
    expect(p.status).toBe(200);
    expect(p.json.Boot).toMatchObject({ BootSourceOverrideTarget: "Pxe", BootSourceOverrideEnabled: "Once" });
    expect(emu.machines.get("node-1")!.boot).toEqual({ target: "Pxe", enabled: "Once" });

    const bad = await call(emu, "PATCH", sys, { Boot: { BootSourceOverrideTarget: "Floppy" } });
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe("Base.1.8.PropertyValueNotInList");
    expect((await call(emu, "PATCH", sys, { PowerState: "On" })).status).toBe(400);
    expect(emu.machines.get("node-1")!.boot).toEqual({ target: "Pxe", enabled: "Once" });

    await call(emu, "POST", `${sys}/Actions/ComputerSystem.Reset`, { ResetType: "On" });
    expect(bootTargets).toEqual(["Pxe"]);
    expect((await call(emu, "GET", sys)).json.Boot.BootSourceOverrideEnabled).toBe("Disabled");
  });

  it("inserts and ejects virtual media on the manager", async () => {
    const emu = await start(1);
    const cd = "/redfish/v1/Managers/node-1-bmc/VirtualMedia/Cd";
    const col = await call(emu, "GET", "/redfish/v1/Managers/node-1-bmc/VirtualMedia");
    expect(col.json.Members).toEqual([{ "@odata.id": cd }]);
    expect((await call(emu, "GET", cd)).json).toMatchObject({ Inserted: false, Image: null });

    const image = "http://10.0.0.1/images/installer.iso";
    expect((await call(emu, "POST", `${cd}/Actions/VirtualMedia.InsertMedia`, { Image: image })).status).toBe(204);
    expect((await call(emu, "GET", cd)).json).toMatchObject({ Inserted: true, Image: image, ImageName: "installer.iso" });
    expect(emu.machines.get("node-1")!.media).toEqual({ inserted: true, image });
    expect((await call(emu, "POST", `${cd}/Actions/VirtualMedia.InsertMedia`, { Image: image })).status).toBe(409);
    expect((await call(emu, "POST", `${cd}/Actions/VirtualMedia.EjectMedia`, {})).status).toBe(204);
    expect((await call(emu, "GET", cd)).json).toMatchObject({ Inserted: false, Image: null });
    expect((await call(emu, "POST", `${cd}/Actions/VirtualMedia.InsertMedia`, { Image: "file:///etc/passwd" })).status).toBe(400);
    expect(emu.machines.get("node-1")!.media.inserted).toBe(false);
  });

  it("stages BIOS attributes in Bios/Settings and applies them at the next power-on only", async () => {
    const applied: Array<Record<string, unknown>> = [];
    const emu = await start(1, undefined, (m, _from, to) => {
      if (to === "On") applied.push({ ...m.biosSettings, pending: Object.keys(m.biosPending).length });
    });
    const m = emu.machines.get("node-1")!;
    const bios = "/redfish/v1/Systems/node-1/Bios";
    const settings = `${bios}/Settings`;
    const sys = "/redfish/v1/Systems/node-1";
    expect((await call(emu, "GET", sys)).json.Bios["@odata.id"]).toBe(bios);
    const b = await call(emu, "GET", bios);
    expect(b.json.Attributes).toEqual({ BootMode: "Uefi", SriovGlobalEnable: false, ProcTurboMode: "Enabled" });
    expect(b.json["@Redfish.Settings"].SettingsObject["@odata.id"]).toBe(settings);
    expect((await call(emu, "GET", settings)).json.Attributes).toEqual({});
    expect((await call(emu, "PATCH", bios, { Attributes: { SriovGlobalEnable: true } })).status).toBe(405); // Bios itself is read-only

    await call(emu, "POST", `${sys}/Actions/ComputerSystem.Reset`, { ResetType: "On" });
    expect((await call(emu, "PATCH", settings, { Attributes: { SriovGlobalEnable: true } })).status).toBe(204);
    expect(
      (
        await call(emu, "PATCH", settings, {
          Attributes: { ProcTurboMode: "Disabled" },
          "@Redfish.SettingsApplyTime": { ApplyTime: "OnReset" },
        })
      ).status,
    ).toBe(204);
    expect((await call(emu, "GET", settings)).json.Attributes).toEqual({ SriovGlobalEnable: true, ProcTurboMode: "Disabled" });
    expect(m.biosPending).toEqual({ SriovGlobalEnable: true, ProcTurboMode: "Disabled" });
    expect((await call(emu, "GET", bios)).json.Attributes.SriovGlobalEnable).toBe(false); // not yet: the machine has not restarted

    // Unknown names and wrong types: a Redfish 400, and nothing of that request staged.
    const unknown = await call(emu, "PATCH", settings, { Attributes: { BootMode: "Legacy", NoSuchKnob: "On" } });
    expect(unknown.status).toBe(400);
    expect(unknown.json.error.code).toBe("Base.1.8.PropertyUnknown");
    expect(unknown.json.error["@Message.ExtendedInfo"][0].MessageArgs).toEqual(["NoSuchKnob"]);
    const wrongType = await call(emu, "PATCH", settings, { Attributes: { SriovGlobalEnable: "yes" } });
    expect(wrongType.status).toBe(400);
    expect(wrongType.json.error.code).toBe("Base.1.8.PropertyValueTypeError");
    expect(
      (await call(emu, "PATCH", settings, { Attributes: { BootMode: "Legacy" }, "@Redfish.SettingsApplyTime": { ApplyTime: "Immediate" } }))
        .status,
    ).toBe(400);
    expect((await call(emu, "PATCH", settings, { Attrs: {} })).status).toBe(400);
    expect((await call(emu, "PATCH", settings, { Attributes: [] })).status).toBe(400);
    expect(m.biosPending).toEqual({ SriovGlobalEnable: true, ProcTurboMode: "Disabled" });

    await call(emu, "POST", `${sys}/Actions/ComputerSystem.Reset`, { ResetType: "ForceOff" });
    expect(m.biosSettings.SriovGlobalEnable).toBe(false); // powering off applies nothing
    await call(emu, "POST", `${sys}/Actions/ComputerSystem.Reset`, { ResetType: "On" });
    expect(m.biosSettings).toEqual({ BootMode: "Uefi", SriovGlobalEnable: true, ProcTurboMode: "Disabled" });
    expect(m.biosPending).toEqual({});
    expect((await call(emu, "GET", settings)).json.Attributes).toEqual({});
    expect((await call(emu, "GET", bios)).json.Attributes).toEqual(m.biosSettings);
    // The hook (the simulated boot) already sees the settings the BIOS applied while starting.
    expect(applied).toEqual([
      { BootMode: "Uefi", SriovGlobalEnable: false, ProcTurboMode: "Enabled", pending: 0 },
      { BootMode: "Uefi", SriovGlobalEnable: true, ProcTurboMode: "Disabled", pending: 0 },
    ]);
  });

  it("serves a RAID controller's drives and creates and deletes volumes", async () => {
    const emu = await start([{ id: "r", drives: 4 }, { id: "bare", drives: 0 }, { id: "default" }]);
    const m = emu.machines.get("r")!;
    const storage = "/redfish/v1/Systems/r/Storage";
    const ctrl = `${storage}/RAID.Integrated.1`;
    const vols = `${ctrl}/Volumes`;
    expect((await call(emu, "GET", "/redfish/v1/Systems/r")).json.Storage).toEqual({ "@odata.id": storage });
    expect((await call(emu, "GET", storage)).json.Members).toEqual([{ "@odata.id": ctrl }]);
    const c = (await call(emu, "GET", ctrl)).json;
    const drives: string[] = c.Drives.map((d: any) => d["@odata.id"]);
    expect(drives).toEqual([0, 1, 2, 3].map((i) => `${ctrl}/Drives/Disk.Bay.${i}`));
    expect(c.StorageControllers[0].SupportedRAIDTypes).toEqual(["RAID0", "RAID1", "RAID5", "RAID10"]);
    expect(c.Volumes["@odata.id"]).toBe(vols);
    expect((await call(emu, "GET", drives[0]!)).json).toMatchObject({ Id: "Disk.Bay.0", MediaType: "SSD", Links: { Volumes: [] } });
    expect((await call(emu, "GET", vols)).json.Members).toEqual([]);
    for (const id of ["bare", "default"]) {
      expect(emu.machines.get(id)!.storage.drives).toEqual([]); // no drives unless asked for: no Storage
      expect((await call(emu, "GET", `/redfish/v1/Systems/${id}`)).json.Storage).toBeUndefined();
      expect((await call(emu, "GET", `/redfish/v1/Systems/${id}/Storage`)).status).toBe(404);
    }
    const fleet = await startRedfishEmulator({ machines: [{}, { drives: 3 }], drives: 2 });
    running.push(fleet);
    expect([...fleet.machines.values()].map((x) => x.storage.drives.length)).toEqual([2, 3]);
    await expect(startRedfishEmulator({ machines: [{ drives: 2.5 }] })).rejects.toThrow(/drives must be an integer/);

    const link = (i: number) => ({ "@odata.id": drives[i] });
    const created = await fetch(emu.url + vols, {
      method: "POST",
      headers: { ...auth(), "content-type": "application/json" },
      body: JSON.stringify({ RAIDType: "RAID1", Drives: [link(0), link(1)], Name: "boot" }),
    });
    expect(created.status).toBe(201);
    const v1 = (await created.json()) as any;
    expect(created.headers.get("location")).toBe(`${vols}/Volume.1`);
    expect(v1).toMatchObject({
      Id: "Volume.1",
      Name: "boot",
      RAIDType: "RAID1",
      CapacityBytes: m.storage.drives[0]!.capacityBytes,
      Links: { Drives: [link(0), link(1)] },
    });
    expect(m.storage.volumes).toEqual([
      {
        id: "Volume.1",
        name: "boot",
        raidType: "RAID1",
        drives: ["Disk.Bay.0", "Disk.Bay.1"],
        capacityBytes: m.storage.drives[0]!.capacityBytes,
      },
    ]);
    expect((await call(emu, "GET", drives[1]!)).json.Links.Volumes).toEqual([{ "@odata.id": `${vols}/Volume.1` }]);
    expect((await call(emu, "GET", vols)).json.Members).toEqual([{ "@odata.id": `${vols}/Volume.1` }]);

    // Refused, each with a Redfish 400, and nothing created.
    const refused = async (body: unknown, code: string) => {
      const r = await call(emu, "POST", vols, body);
      expect(r.status).toBe(400);
      expect(r.json.error.code).toBe(`Base.1.8.${code}`);
    };
    await refused({ RAIDType: "RAID1", Drives: [link(2)] }, "PropertyValueConflict"); // RAID1 takes exactly 2
    await refused({ RAIDType: "RAID1", Drives: [link(0), link(2), link(3)] }, "ResourceInUse");
    await refused({ RAIDType: "RAID5", Drives: [link(2), link(3)] }, "PropertyValueConflict");
    await refused({ RAIDType: "RAID10", Drives: [link(2), link(3)] }, "PropertyValueConflict");
    await refused({ RAIDType: "RAID0", Drives: [link(1)] }, "ResourceInUse");
    await refused({ RAIDType: "RAID0", Drives: [link(2), link(2)] }, "PropertyValueConflict");
    await refused({ RAIDType: "RAID0", Drives: [] }, "PropertyValueConflict");
    await refused({ RAIDType: "RAID6", Drives: [link(2), link(3)] }, "PropertyValueNotInList");
    await refused(
      { RAIDType: "RAID0", Drives: [{ "@odata.id": "/redfish/v1/Systems/default/Storage/RAID.Integrated.1/Drives/Disk.Bay.0" }] },
      "PropertyValueNotInList",
    );
    await refused({ Drives: [link(2)] }, "PropertyMissing");
    await refused({ RAIDType: "RAID0", Drives: [link(2)], Colour: "red" }, "PropertyUnknown");
    expect(m.storage.volumes).toHaveLength(1);

    expect((await call(emu, "DELETE", `${vols}/Volume.1`)).status).toBe(204);
    expect((await call(emu, "GET", `${vols}/Volume.1`)).status).toBe(404);
    expect((await call(emu, "DELETE", `${vols}/Volume.1`)).status).toBe(404);
    expect(m.storage.volumes).toEqual([]);
    const r10 = await call(emu, "POST", vols, { RAIDType: "RAID10", Drives: [0, 1, 2, 3].map(link) });
    expect(r10.status).toBe(201);
    expect(r10.json).toMatchObject({ Id: "Volume.2", RAIDType: "RAID10", CapacityBytes: 2 * m.storage.drives[0]!.capacityBytes });
    expect((await call(emu, "DELETE", ctrl)).status).toBe(405);
  });

  it("serves a NIC's addresses under EthernetInterfaces, only for machines given addresses", async () => {
    const emu = await start([{ id: "n", addresses: ["10.0.0.5", "fd00::5"] }, { id: "bare" }]);
    const sys = "/redfish/v1/Systems/n";
    const nics = `${sys}/EthernetInterfaces`;
    expect((await call(emu, "GET", sys)).json.EthernetInterfaces).toEqual({ "@odata.id": nics });
    expect((await call(emu, "GET", nics)).json.Members).toEqual([{ "@odata.id": `${nics}/NIC.1` }]);
    const nic = (await call(emu, "GET", `${nics}/NIC.1`)).json;
    expect(nic).toMatchObject({
      Id: "NIC.1",
      IPv4Addresses: [{ Address: "10.0.0.5", SubnetMask: "255.255.255.0", AddressOrigin: "DHCP" }],
      IPv6Addresses: [{ Address: "fd00::5", PrefixLength: 64, AddressOrigin: "SLAAC" }],
    });
    expect(nic.MACAddress).toMatch(/^([0-9A-F]{2}:){5}[0-9A-F]{2}$/);
    // The same machine id, the same MAC, in another emulator too.
    const again = await start([{ id: "n", addresses: ["10.0.0.6"] }]);
    expect((await call(again, "GET", `${nics}/NIC.1`)).json.MACAddress).toBe(nic.MACAddress);
    expect((await call(emu, "POST", nics, {})).status).toBe(405);
    expect((await call(emu, "GET", `${nics}/NIC.2`)).status).toBe(404);

    expect((await call(emu, "GET", "/redfish/v1/Systems/bare")).json.EthernetInterfaces).toBeUndefined();
    expect((await call(emu, "GET", "/redfish/v1/Systems/bare/EthernetInterfaces")).status).toBe(404);
    await expect(startRedfishEmulator({ machines: [{ addresses: ["node-1.example"] }] })).rejects.toThrow(/not an IP address/);
  });

  it("answers wrong credentials with 401 and never echoes the password", async () => {
    const emu = await start(1);
    const wrong = "Wr0ng-Pa55word-abc";
    for (const headers of [auth(USER, wrong), auth("mallory", PASS), {}]) {
      const r = await call(emu, "GET", "/redfish/v1/Systems", undefined, headers);
      expect(r.status).toBe(401);
      expect(r.text).not.toContain(wrong);
      expect(r.text).not.toContain(PASS);
      expect(r.text).not.toContain("mallory");
    }
    const r = await call(emu, "POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", { ResetType: "On" }, auth(USER, wrong));
    expect(r.status).toBe(401);
    expect(emu.machines.get("node-1")!.power).toBe("Off");
    expect((await call(emu, "GET", "/redfish/v1/Systems")).status).toBe(200);
  });

  it("answers every call 503 with errorRate 1", async () => {
    const emu = await start(1, { errorRate: 1 });
    for (const [m, p, b] of [
      ["GET", "/redfish/v1"],
      ["GET", "/redfish/v1/Systems"],
      ["POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", { ResetType: "On" }],
    ] as const) {
      const r = await call(emu, m, p, b);
      expect(r.status).toBe(503);
      expect(r.json.error.code).toBe("Base.1.8.ServiceTemporarilyUnavailable");
    }
    expect(emu.machines.get("node-1")!.power).toBe("Off");
    emu.setFaults({});
    expect((await call(emu, "GET", "/redfish/v1/Systems")).status).toBe(200);
  });

  it("drops the same requests for the same seed", async () => {
    const pattern = async (emu: RedfishEmulator) => {
      const out: string[] = [];
      for (let i = 0; i < 24; i++) {
        try {
          out.push(String((await call(emu, "GET", "/redfish/v1/Systems")).status));
        } catch {
          out.push("drop");
        }
      }
      return out;
    };
    const a = await start(1, { dropRate: 0.5, seed: 42 });
    const b = await start(1, { dropRate: 0.5, seed: 42 });
    const pa = await pattern(a);
    expect(pa).toContain("drop");
    expect(pa).toContain("200");
    expect(await pattern(b)).toEqual(pa);
    a.setFaults({ dropRate: 0.5, seed: 42 }); // re-seeding replays the sequence
    expect(await pattern(a)).toEqual(pa);
    expect(a.requests.filter((r) => r.status === 0).length).toBe(2 * pa.filter((s) => s === "drop").length);
  });

  it("delays answers by delayMs", async () => {
    const emu = await start(1, { delayMs: 60 });
    const t0 = performance.now();
    expect((await call(emu, "GET", "/redfish/v1")).status).toBe(200);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(55);
  });

  it("gives every machine a product UUID of its own, different in every emulator, unless one is given", async () => {
    const a = await start(2);
    const b = await start([{}, { uuid: "11111111-2222-4333-8444-555555555555" }]);
    const uuids = [...a.machines.values(), ...b.machines.values()].map((m) => m.uuid);
    expect(uuids[3]).toBe("11111111-2222-4333-8444-555555555555");
    expect(new Set(uuids).size).toBe(4);
    for (const u of uuids) expect(u).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  });

  it("resetDelayMs: a reset is answered at once and applied later, through PoweringOn/PoweringOff", async () => {
    const hooked: string[] = [];
    const emu = await startRedfishEmulator({
      machines: [{ id: "q" }],
      username: USER,
      password: PASS,
      quirks: { resetDelayMs: 1000 },
      onPowerChange: (m, from, to) => void hooked.push(`${from}>${to}`),
    });
    running.push(emu);
    const m = emu.machines.get("q")!;
    const reset = (t: string) => call(emu, "POST", "/redfish/v1/Systems/q/Actions/ComputerSystem.Reset", { ResetType: t });
    expect((await reset("On")).status).toBe(204);
    expect(await powerStatesUntil(emu, "On")).toEqual(["Off", "PoweringOn", "On"]);
    expect((await reset("ForceRestart")).status).toBe(204);
    expect(await powerStatesUntil(emu, "PoweringOn")).toEqual(["On", "PoweringOff", "Off", "PoweringOn"]);
    expect(await powerStatesUntil(emu, "On")).toEqual(["PoweringOn", "On"]);
    // Resets sent together are applied one after another.
    await reset("ForceOff");
    await reset("On");
    expect(await powerStatesUntil(emu, "Off")).toEqual(["On", "PoweringOff", "Off"]);
    expect(await powerStatesUntil(emu, "On")).toEqual(["Off", "PoweringOn", "On"]);
    expect(m.powerHistory).toEqual(["On", "Off", "On", "Off", "On"]);
    expect(hooked).toEqual(["Off>On", "On>Off", "Off>On", "On>Off", "Off>On"]);
  });

  it("noBios: the system links no Bios, and Bios answers 404", async () => {
    const emu = await quirky({ noBios: true });
    expect((await call(emu, "GET", "/redfish/v1/Systems/q")).json.Bios).toBeUndefined();
    expect((await call(emu, "GET", "/redfish/v1/Systems/q/Bios")).status).toBe(404);
    expect((await call(emu, "PATCH", "/redfish/v1/Systems/q/Bios/Settings", { Attributes: { SriovGlobalEnable: true } })).status).toBe(404);
    expect(emu.machines.get("q")!.biosPending).toEqual({});
  });

  it("noVolumeCreation: the Volumes collection allows GET only and answers a POST 405", async () => {
    const vols = "/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Volumes";
    const drive = { "@odata.id": "/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Drives/Disk.Bay.0" };
    const normal = await quirky({}, { drives: 1 });
    expect((await call(normal, "GET", vols)).allow).toBe("GET, POST");
    const emu = await quirky({ noVolumeCreation: true }, { drives: 1 });
    const listed = await call(emu, "GET", vols);
    expect([listed.status, listed.allow]).toEqual([200, "GET"]);
    const refused = await call(emu, "POST", vols, { RAIDType: "RAID0", Links: { Drives: [drive] } });
    expect([refused.status, refused.allow, refused.json.error.code]).toEqual([405, "GET", "Base.1.8.ActionNotSupported"]);
    expect(emu.machines.get("q")!.storage.volumes).toEqual([]);
  });

  it("continuousBootOnly: a Once override is accepted and recorded as Continuous", async () => {
    const emu = await quirky({ continuousBootOnly: true });
    const p = await call(emu, "PATCH", "/redfish/v1/Systems/q", {
      Boot: { BootSourceOverrideTarget: "Pxe", BootSourceOverrideEnabled: "Once" },
    });
    expect(p.status).toBe(200);
    expect(p.json.Boot).toMatchObject({
      BootSourceOverrideTarget: "Pxe",
      BootSourceOverrideEnabled: "Continuous",
      "BootSourceOverrideEnabled@Redfish.AllowableValues": ["Disabled", "Continuous"],
    });
    await call(emu, "POST", "/redfish/v1/Systems/q/Actions/ComputerSystem.Reset", { ResetType: "On" });
    expect(emu.machines.get("q")!.boot).toEqual({ target: "Pxe", enabled: "Continuous" }); // not consumed by the boot
  });

  it("failingStorage: everything under Storage answers 500; the system still links it", async () => {
    const emu = await quirky({ failingStorage: true }, { drives: 2 });
    expect((await call(emu, "GET", "/redfish/v1/Systems/q")).json.Storage).toEqual({ "@odata.id": "/redfish/v1/Systems/q/Storage" });
    for (const path of [
      "/redfish/v1/Systems/q/Storage",
      "/redfish/v1/Systems/q/Storage/RAID.Integrated.1",
      "/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Volumes",
    ]) {
      const r = await call(emu, "GET", path);
      expect([r.status, r.json.error.code]).toEqual([500, "Base.1.8.InternalError"]);
    }
    emu.machines.get("q")!.quirks.failingStorage = false; // quirks can change at any time
    expect((await call(emu, "GET", "/redfish/v1/Systems/q/Storage")).status).toBe(200);
  });

  it("creates volumes with the drives under Links.Drives; requireVolumeCapacity wants CapacityBytes", async () => {
    const emu = await quirky({ requireVolumeCapacity: true }, { drives: 2 });
    const m = emu.machines.get("q")!;
    const vols = "/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Volumes";
    const drives = [0, 1].map((i) => ({ "@odata.id": `/redfish/v1/Systems/q/Storage/RAID.Integrated.1/Drives/Disk.Bay.${i}` }));
    const missing = await call(emu, "POST", vols, { RAIDType: "RAID1", Links: { Drives: drives } });
    expect([missing.status, missing.json.error.code, missing.json.error["@Message.ExtendedInfo"][0].MessageArgs]).toEqual([
      400,
      "Base.1.8.PropertyMissing",
      ["CapacityBytes"],
    ]);
    const both = await call(emu, "POST", vols, { RAIDType: "RAID1", Drives: drives, Links: { Drives: drives }, CapacityBytes: 1 });
    expect([both.status, both.json.error.code]).toEqual([400, "Base.1.8.PropertyValueConflict"]);
    expect((await call(emu, "POST", vols, { RAIDType: "RAID1", Links: { Drives: drives, Chassis: [] }, CapacityBytes: 1 })).status).toBe(
      400,
    );
    const size = m.storage.drives[0]!.capacityBytes;
    const made = await call(emu, "POST", vols, { Name: "os", RAIDType: "RAID1", Links: { Drives: drives }, CapacityBytes: size });
    expect(made.status).toBe(201);
    expect(made.json).toMatchObject({ Name: "os", RAIDType: "RAID1", CapacityBytes: size, Links: { Drives: drives } });
    expect(m.storage.volumes).toMatchObject([{ raidType: "RAID1", drives: ["Disk.Bay.0", "Disk.Bay.1"], capacityBytes: size }]);
  });

  it("stop() closes the port", async () => {
    const emu = await startRedfishEmulator({ machines: 1 });
    expect((await call(emu, "GET", "/redfish/v1", undefined, {})).status).toBe(200);
    await emu.stop();
    await expect(fetch(emu.url + "/redfish/v1")).rejects.toThrow();
  });
});
