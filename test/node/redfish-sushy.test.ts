// The Redfish emulator (testing/redfish-emulator.ts) as OpenStack's own client sees it: Debian's
// python3-sushy, unmodified (test/support/redfish-sushy-client.py), logs in with a session and reads
// the whole tree a BMC serves, sets a boot override, inserts and ejects virtual media under the
// Manager on one machine and under the System on the other, and resets both. Also the session
// service, the account service and the manager's log over plain HTTP, and which virtual media the
// site agent's client picks when a BMC serves it in both places.
import { execFile, spawnSync } from "node:child_process";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { RedfishClient } from "../../agent/roles/redfish.ts";
import { repoRoot } from "../../local/node-store.ts";
import { startRedfishEmulator, type RedfishEmulator } from "../../testing/redfish-emulator.ts";

const USER = "ironic";
const PASS = "sushy-Pa55word-7Qm";
const IMAGE = "http://192.0.2.10/images/deploy.iso"; // simulated machines never fetch it
const running: RedfishEmulator[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

async function emulator() {
  const emu = await startRedfishEmulator({
    machines: [
      { id: "mgr-media", drives: 2, addresses: ["10.0.0.21"] },
      { id: "sys-media", drives: 1, addresses: ["10.0.0.22"], virtualMedia: "System" },
    ],
    username: USER,
    password: PASS,
  });
  running.push(emu);
  return emu;
}

async function call(emu: RedfishEmulator, method: string, path: string, headers: Record<string, string>, body?: unknown) {
  const res = await fetch(emu.url + path, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as any) : undefined, headers: res.headers };
}

const basic = { authorization: `Basic ${Buffer.from(`${USER}:${PASS}`).toString("base64")}` };
const hasSushy = spawnSync("/usr/bin/python3", ["-c", "import sushy"]).status === 0;

describe("the official Python client (Debian's python3-sushy)", () => {
  it.skipIf(!hasSushy)(
    "drives the emulator unmodified: session, system, processors, memory, NICs, storage, simple storage, managers, chassis, boot, media under the Manager and the System, resets (skipped without python3-sushy)",
    async () => {
      const emu = await emulator();
      const script = path.join(repoRoot, "test/support/redfish-sushy-client.py");
      const stdout = await new Promise<string>((resolve, reject) =>
        execFile(
          "/usr/bin/python3",
          [script, emu.url, USER, PASS, IMAGE, "mgr-media", "sys-media"],
          { timeout: 60_000 },
          (err, out, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(out)),
        ),
      );
      const seen = JSON.parse(stdout);
      const common = {
        power_state: "Off",
        manufacturer: "Better Compute (simulated)",
        memory_gib: 64,
        processors: { models: ["Simulated CPU"], cores: 32 },
        dimms_mib: [32768, 32768],
        storage_drive_protocols: ["SATA"],
        boot: { target: "Pxe", enabled: "Once" },
        after_on: "On",
        after_force_off: "Off",
        boot_after_on: "Disabled",
      };
      expect(seen.systems["mgr-media"]).toMatchObject({
        ...common,
        uuid: emu.machines.get("mgr-media")!.uuid,
        storage_drive_bytes: [480103981056, 480103981056],
        simple_storage_disk_bytes: [480103981056, 480103981056],
        managers: ["mgr-media-bmc"],
        chassis: [{ id: "mgr-media", type: "RackMount", power: "Off" }],
        media: {
          where: "Manager",
          path: "/redfish/v1/Managers/mgr-media-bmc/VirtualMedia/Cd",
          image: IMAGE,
          inserted: true,
          after_eject: false,
        },
      });
      expect(seen.systems["sys-media"]).toMatchObject({
        ...common,
        uuid: emu.machines.get("sys-media")!.uuid,
        storage_drive_bytes: [480103981056],
        media: { where: "System", path: "/redfish/v1/Systems/sys-media/VirtualMedia/Cd", image: IMAGE, inserted: true, after_eject: false },
      });
      expect(Object.keys(seen.systems["mgr-media"].nics)).toHaveLength(1);
      expect(seen).toMatchObject({
        all_managers: ["mgr-media-bmc", "sys-media-bmc"],
        all_chassis: ["mgr-media", "sys-media"],
        session_service_enabled: true,
      });
      // It logged in with a session (Ironic's default) rather than sending the password every time.
      expect(emu.requests.filter((r) => r.path === "/redfish/v1/SessionService/Sessions").map((r) => `${r.method} ${r.status}`)).toContain(
        "POST 201",
      );
      // What the BMCs were asked, in their managers' logs.
      expect(emu.machines.get("sys-media")!.log.map((e) => e.message)).toEqual([
        "Boot override set: BootSourceOverrideTarget Pxe, BootSourceOverrideEnabled Once",
        `VirtualMedia.InsertMedia ${IMAGE}`,
        "VirtualMedia.EjectMedia",
        "ComputerSystem.Reset On",
        "ComputerSystem.Reset ForceOff",
      ]);
    },
  );
});

describe("the tree beyond power, boot and media", () => {
  it("sessions: a login answers X-Auth-Token and Location, the token authenticates, DELETE ends it; a wrong password is 401", async () => {
    const emu = await emulator();
    const root = await call(emu, "GET", "/redfish/v1", {});
    expect(root.json.Links.Sessions["@odata.id"]).toBe("/redfish/v1/SessionService/Sessions");
    expect(root.json.SessionService["@odata.id"]).toBe("/redfish/v1/SessionService");

    const wrong = await call(emu, "POST", "/redfish/v1/SessionService/Sessions", {}, { UserName: USER, Password: "nope" });
    expect(wrong.status).toBe(401);
    expect(JSON.stringify(wrong.json)).not.toContain("nope");

    const login = await call(emu, "POST", "/redfish/v1/SessionService/Sessions", {}, { UserName: USER, Password: PASS });
    expect(login.status).toBe(201);
    const token = login.headers.get("x-auth-token")!;
    const location = login.headers.get("location")!;
    expect(token).toMatch(/^[0-9a-f]{48}$/);
    expect(login.json).toMatchObject({ "@odata.id": location, UserName: USER });
    expect((await call(emu, "GET", "/redfish/v1/Systems/mgr-media", { "x-auth-token": token })).status).toBe(200);
    expect((await call(emu, "GET", "/redfish/v1/Systems/mgr-media", { "x-auth-token": "0".repeat(48) })).status).toBe(401);
    const sessions = await call(emu, "GET", "/redfish/v1/SessionService/Sessions", basic);
    expect(sessions.json).toMatchObject({ "Members@odata.count": 1, Members: [{ "@odata.id": location }] });
    expect((await call(emu, "DELETE", location, { "x-auth-token": token })).status).toBe(204);
    expect((await call(emu, "GET", "/redfish/v1/Systems/mgr-media", { "x-auth-token": token })).status).toBe(401);
  });

  it("accounts, chassis, processors, memory, simple storage and the manager's log, in the DMTF shapes", async () => {
    const emu = await emulator();
    const get = async (p: string) => {
      const r = await call(emu, "GET", p, basic);
      expect(r.status, p).toBe(200);
      return r.json;
    };
    const accounts = await get("/redfish/v1/AccountService/Accounts");
    expect(accounts).toMatchObject({ "@odata.type": "#ManagerAccountCollection.ManagerAccountCollection", "Members@odata.count": 1 });
    const account = await get(accounts.Members[0]["@odata.id"]);
    expect(account).toMatchObject({ UserName: USER, RoleId: "Administrator", Password: null });
    expect(await get(account.Links.Role["@odata.id"])).toMatchObject({ RoleId: "Administrator", IsPredefined: true });

    const system = await get("/redfish/v1/Systems/sys-media");
    expect(system.VirtualMedia["@odata.id"]).toBe("/redfish/v1/Systems/sys-media/VirtualMedia");
    expect(system.ProcessorSummary).toMatchObject({ Count: 2, LogicalProcessorCount: 64 });
    const chassis = await get(system.Links.Chassis[0]["@odata.id"]);
    expect(chassis).toMatchObject({
      "@odata.type": "#Chassis.v1_21_0.Chassis",
      ChassisType: "RackMount",
      Links: { ComputerSystems: [{ "@odata.id": "/redfish/v1/Systems/sys-media" }], "Drives@odata.count": 1 },
    });
    const manager = await get(system.Links.ManagedBy[0]["@odata.id"]);
    expect(manager.VirtualMedia).toBeUndefined(); // served under the System only
    expect((await call(emu, "GET", "/redfish/v1/Managers/sys-media-bmc/VirtualMedia", basic)).status).toBe(404);
    expect(manager.Links.ManagerForChassis).toEqual([{ "@odata.id": chassis["@odata.id"] }]);

    const cpu = await get((await get(system.Processors["@odata.id"])).Members[1]["@odata.id"]);
    expect(cpu).toMatchObject({ Id: "CPU.1", ProcessorType: "CPU", InstructionSet: "x86-64", TotalCores: 16, TotalThreads: 32 });
    const dimm = await get((await get(system.Memory["@odata.id"])).Members[0]["@odata.id"]);
    expect(dimm).toMatchObject({ "@odata.type": "#Memory.v1_17_0.Memory", CapacityMiB: 32768 });
    const simple = await get((await get(system.SimpleStorage["@odata.id"])).Members[0]["@odata.id"]);
    expect(simple.Devices).toEqual([{ Name: "Simulated SSD 0", CapacityBytes: 480103981056, Status: { State: "Enabled", Health: "OK" } }]);

    await call(emu, "POST", "/redfish/v1/Systems/sys-media/Actions/ComputerSystem.Reset", basic, { ResetType: "On" });
    const log = await get(manager.LogServices["@odata.id"]);
    const service = await get(log.Members[0]["@odata.id"]);
    const entries = await get(service.Entries["@odata.id"]);
    expect(entries["Members@odata.count"]).toBe(1);
    expect(await get(entries.Members[0]["@odata.id"])).toMatchObject({ EntryType: "Event", Message: "ComputerSystem.Reset On" });
    expect((await call(emu, "POST", service.Actions["#LogService.ClearLog"].target, basic, {})).status).toBe(204);
    expect((await get(service.Entries["@odata.id"]))["Members@odata.count"]).toBe(0);
  });

  it("virtual media in both places: the site agent's client takes the System's, as Ironic does", async () => {
    const emu = await startRedfishEmulator({ machines: [{ id: "both" }], username: USER, password: PASS, virtualMedia: "Both" });
    running.push(emu);
    expect((await call(emu, "GET", "/redfish/v1/Managers/both-bmc", basic)).json.VirtualMedia).toEqual({
      "@odata.id": "/redfish/v1/Managers/both-bmc/VirtualMedia",
    });
    const client = new RedfishClient({ address: `${emu.url}/redfish/v1/Systems/both`, username: USER, password: PASS });
    await client.insertMedia(IMAGE);
    expect((await client.inspect()).media).toEqual({ inserted: true, image: IMAGE });
    expect(await client.ejectMedia()).toEqual({ ejected: true });
    expect(emu.requests.filter((r) => r.path.includes("/VirtualMedia")).map((r) => `${r.method} ${r.path}`)).toEqual([
      "GET /redfish/v1/Systems/both/VirtualMedia",
      "GET /redfish/v1/Systems/both/VirtualMedia/Cd",
      "POST /redfish/v1/Systems/both/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia",
      "GET /redfish/v1/Systems/both/VirtualMedia",
      "GET /redfish/v1/Systems/both/VirtualMedia/Cd",
      "GET /redfish/v1/Systems/both/VirtualMedia",
      "GET /redfish/v1/Systems/both/VirtualMedia/Cd",
      "POST /redfish/v1/Systems/both/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia",
    ]);
  });
});
