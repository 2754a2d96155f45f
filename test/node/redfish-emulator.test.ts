// The Redfish BMC emulator (agent/testing/redfish-emulator.ts), simulated hardware served
// over real HTTP: the resource tree, power actions and the power hook, boot override,
// virtual media, Basic auth that never echoes the password, seeded faults, and stop().
import { afterEach, describe, expect, it } from "vitest";
import { startRedfishEmulator, type PowerState, type RedfishEmulator, type RedfishFaults } from "../../agent/testing/redfish-emulator.ts";

const USER = "root";
const PASS = "s3cret-Pa55word-xyz";
const running: RedfishEmulator[] = [];

async function start(machines: number | Array<{ id?: string; uuid?: string }> = 2, faults?: RedfishFaults, onPowerChange?: Parameters<typeof startRedfishEmulator>[0]["onPowerChange"]) {
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
  return { status: res.status, text, json: text ? (JSON.parse(text) as any) : undefined };
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
    expect(a.json).toMatchObject({ Id: "a", UUID: "11111111-2222-4333-8444-555555555555", PowerState: "Off", BiosVersion: emu.machines.get("a")!.biosVersion });
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
    for (const [m, p, b] of [["GET", "/redfish/v1"], ["GET", "/redfish/v1/Systems"], ["POST", "/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", { ResetType: "On" }]] as const) {
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

  it("stop() closes the port", async () => {
    const emu = await startRedfishEmulator({ machines: 1 });
    expect((await call(emu, "GET", "/redfish/v1", undefined, {})).status).toBe(200);
    await emu.stop();
    await expect(fetch(emu.url + "/redfish/v1")).rejects.toThrow();
  });
});
