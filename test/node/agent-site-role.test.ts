// The site agent's role (agent/roles/site.ts, redfish.ts, boot.ts, image-cache.ts) against the
// Redfish emulator (simulated hardware over real HTTP): inspect, idempotent power, boot
// override, virtual media, BIOS settings staged for the next power-on, RAID volumes, failures as DRIVER_ERROR naming the BMC and never its credential,
// bodies and secrets refused, each operation logged without a credential; the iPXE script; the
// image cache over HTTP. BMCs that behave like real ones: redfish-real-world.test.ts; TLS: bmc-tls.test.ts.
import { createHash } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { AgentError } from "../../agent/client.ts";
import { ipxeScript } from "../../agent/roles/boot.ts";
import { createImageCache } from "../../testing/image-server.ts";
import { RedfishClient } from "../../agent/roles/redfish.ts";
import { siteHandlers } from "../../agent/roles/site.ts";
import { startRedfishEmulator, type MachineOptions, type RedfishEmulator } from "../../testing/redfish-emulator.ts";
import { agentFailure } from "../support/agent-error.ts";
import { commandContext } from "../support/command-context.ts";

const USER = "bmc-operator-7";
const PASS = "s3cret-Pa55word-xyz";
const REF = "secret://bmc-abc";
const cleanups: Array<() => Promise<void>> = [];

afterEach(async () => {
  await Promise.all(cleanups.splice(0).map((stop) => stop()));
});

async function emulator(
  faults?: Parameters<typeof startRedfishEmulator>[0]["faults"],
  machine: Omit<MachineOptions, "id"> = {},
): Promise<RedfishEmulator> {
  const emu = await startRedfishEmulator({ machines: [{ ...machine, id: "abc" }], username: USER, password: PASS, faults });
  cleanups.push(() => emu.stop());
  return emu;
}

function ctx(kind: string, secrets: Record<string, string> | undefined = { [REF]: PASS }, signal = new AbortController().signal) {
  return commandContext(kind, secrets, signal);
}

/** Run a site command kind against the emulator's machine "abc". */
function run(emu: RedfishEmulator, kind: string, extra: Record<string, unknown> = {}, context = ctx(kind)) {
  const body = { bmc: { address: `${emu.url}/redfish/v1/Systems/abc`, username: USER, password: REF }, ...extra };
  return siteHandlers({ timeoutMs: 2_000 })[kind]!(body, context) as Promise<any>;
}

const posts = (emu: RedfishEmulator, suffix: string) => emu.requests.filter((r) => r.method === "POST" && r.path.endsWith(suffix)).length;
const writes = (emu: RedfishEmulator) =>
  emu.requests
    .filter((r) => r.method !== "GET")
    .map((r) => `${r.method} ${r.path.replace(/^\/redfish\/v1\/Systems\/abc/, "")} ${r.status}`);

describe("site role: Redfish", () => {
  it("inspects the system, its manager's firmware, its virtual media and its storage", async () => {
    const emu = await emulator(undefined, { drives: 2 });
    const m = emu.machines.get("abc")!;
    m.bmcFirmwareVersion = "BMC-9.9.9";
    m.media = { inserted: true, image: "http://10.0.0.1/a.iso" };
    m.boot = { target: "Pxe", enabled: "Continuous" };
    expect(await run(emu, "metal.bmc.inspect")).toEqual({
      systemId: "abc",
      uuid: m.uuid,
      manufacturer: "Better Compute (simulated)",
      model: "Redfish emulator",
      powerState: "Off",
      biosVersion: "SIM-BIOS-1.0.0",
      bmcFirmwareVersion: "BMC-9.9.9",
      bootTarget: "Pxe",
      bootEnabled: "Continuous",
      processors: { count: 2, model: "Simulated CPU", threads: 64 },
      memoryGiB: 64,
      media: { inserted: true, image: "http://10.0.0.1/a.iso" },
      storage: { drives: 2, volumes: [] },
      addresses: [],
      macs: [],
    });
    m.storage.volumes.push({ id: "Volume.9", name: "os", raidType: "RAID1", drives: ["Disk.Bay.0", "Disk.Bay.1"], capacityBytes: 1 });
    expect((await run(emu, "metal.bmc.inspect")).storage).toEqual({ drives: 2, volumes: [{ id: "Volume.9", level: "RAID1" }] });
  });

  it("leaves storage out of the inspection when the BMC has no Storage", async () => {
    const emu = await emulator(); // the emulator's machines have no drives unless asked for
    const found = await run(emu, "metal.bmc.inspect");
    expect(found.systemId).toBe("abc");
    expect("storage" in found).toBe(false);
    expect(emu.requests.some((r) => r.path.includes("/Storage"))).toBe(false);
  });

  it("reads the machine's addresses from its EthernetInterfaces: IPv4, then IPv6; none without the link", async () => {
    const emu = await emulator(undefined, { addresses: ["10.0.0.5", "fd00::5"] });
    expect((await run(emu, "metal.bmc.inspect")).addresses).toEqual(["10.0.0.5", "fd00::5"]);
    expect(emu.requests.filter((r) => r.path.includes("/EthernetInterfaces")).map((r) => `${r.path} ${r.status}`)).toEqual([
      "/redfish/v1/Systems/abc/EthernetInterfaces 200",
      "/redfish/v1/Systems/abc/EthernetInterfaces/NIC.1 200",
    ]);
    // Link-local and repeated addresses are left out; IPv4 comes first whatever the NIC's order.
    emu.machines.get("abc")!.addresses = ["FD00::5", "fe80::1ff:fe23:4567:890a", "10.0.0.5", "192.168.1.7", "fd00::5", "10.0.0.5"];
    expect((await run(emu, "metal.bmc.inspect")).addresses).toEqual(["10.0.0.5", "192.168.1.7", "fd00::5"]);

    const bare = await emulator();
    expect((await run(bare, "metal.bmc.inspect")).addresses).toEqual([]);
    expect(bare.requests.some((r) => r.path.includes("/EthernetInterfaces"))).toBe(false);
  });

  it("stages BIOS settings, applied only when the machine power-cycles; idempotent by desired state", async () => {
    const emu = await emulator();
    const m = emu.machines.get("abc")!;
    await run(emu, "metal.bmc.power", { action: "on" });
    const wanted = { BootMode: "Uefi", SriovGlobalEnable: true, ProcTurboMode: "Disabled" };
    expect(await run(emu, "metal.bmc.bios", { attributes: wanted })).toEqual({
      pending: { SriovGlobalEnable: true, ProcTurboMode: "Disabled" },
      applied: false,
    });
    // Only what differs is sent; a retry does not send it again.
    expect(await run(emu, "metal.bmc.bios", { attributes: wanted })).toEqual({
      pending: { SriovGlobalEnable: true, ProcTurboMode: "Disabled" },
      applied: false,
    });
    expect(writes(emu)).toEqual(["POST /Actions/ComputerSystem.Reset 204", "PATCH /Bios/Settings 204"]);
    expect(m.biosPending).toEqual({ SriovGlobalEnable: true, ProcTurboMode: "Disabled" });
    expect(m.biosSettings).toEqual({ BootMode: "Uefi", SriovGlobalEnable: false, ProcTurboMode: "Enabled" });

    await run(emu, "metal.bmc.power", { action: "off" });
    expect(m.biosSettings.SriovGlobalEnable).toBe(false); // off is not a boot
    await run(emu, "metal.bmc.power", { action: "on" });
    expect(m.biosSettings).toEqual(wanted);
    expect(m.biosPending).toEqual({});

    const before = emu.requests.length;
    expect(await run(emu, "metal.bmc.bios", { attributes: wanted })).toEqual({ pending: {}, applied: true });
    expect(emu.requests.slice(before).every((r) => r.method === "GET")).toBe(true);
    expect(writes(emu).filter((w) => w.startsWith("PATCH"))).toHaveLength(1);

    // A value already staged by someone else is reported with what is asked.
    m.biosPending = { BootMode: "Legacy" };
    expect(await run(emu, "metal.bmc.bios", { attributes: { ProcTurboMode: "Enabled" } })).toEqual({
      pending: { BootMode: "Legacy", ProcTurboMode: "Enabled" },
      applied: false,
    });
  });

  it("reports an attribute the BIOS does not know as DRIVER_ERROR naming the BMC, and stages nothing", async () => {
    const emu = await emulator();
    const m = emu.machines.get("abc")!;
    const address = `${emu.url}/redfish/v1/Systems/abc`;
    const e = await agentFailure(run(emu, "metal.bmc.bios", { attributes: { SriovGlobalEnable: true, NoSuchKnob: "On" } }));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toBe(
      `BMC ${address} answered 400 Bad Request to PATCH /redfish/v1/Systems/abc/Bios/Settings: The property NoSuchKnob is not a known BIOS attribute.`,
    );
    expect(e.message).not.toContain(PASS);
    const typed = await agentFailure(run(emu, "metal.bmc.bios", { attributes: { SriovGlobalEnable: "yes" } }));
    expect(typed.code).toBe("DRIVER_ERROR");
    expect(typed.message).toContain(`BMC ${address} answered 400`);
    expect(m.biosPending).toEqual({});

    const before = emu.requests.length;
    for (const attributes of [{}, { BootMode: ["Uefi"] }, { BootMode: null }, "BootMode=Uefi"]) {
      expect(await agentFailure(run(emu, "metal.bmc.bios", { attributes }))).toMatchObject({
        code: "INVALID_ARGUMENT",
        message: expect.stringContaining("attributes"),
      });
    }
    const client = new RedfishClient({ address, username: USER, password: PASS });
    expect(await agentFailure(client.applyBiosSettings({}))).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(emu.requests.length).toBe(before);
  });

  it("configures RAID: creates a volume, keeps a matching one, replaces another", async () => {
    const emu = await emulator(undefined, { drives: 4 });
    const m = emu.machines.get("abc")!;
    expect(await run(emu, "metal.bmc.raid", { level: "RAID1", drives: 2 })).toEqual({
      volume: { id: "Volume.1", level: "RAID1", drives: 2 },
    });
    expect(m.storage.volumes).toMatchObject([{ id: "Volume.1", raidType: "RAID1", drives: ["Disk.Bay.0", "Disk.Bay.1"] }]);
    expect(await run(emu, "metal.bmc.raid", { level: "RAID1", drives: 2 })).toEqual({
      volume: { id: "Volume.1", level: "RAID1", drives: 2 },
    });
    expect(writes(emu)).toEqual(["POST /Storage/RAID.Integrated.1/Volumes 201"]);

    // Another level, or the same level over other drives: every volume goes, one is made.
    expect(await run(emu, "metal.bmc.raid", { level: "RAID10" })).toEqual({ volume: { id: "Volume.2", level: "RAID10", drives: 4 } });
    expect(await run(emu, "metal.bmc.raid", { level: "RAID10", drives: "all" })).toEqual({
      volume: { id: "Volume.2", level: "RAID10", drives: 4 },
    });
    expect(await run(emu, "metal.bmc.raid", { level: "RAID5", drives: 3 })).toEqual({
      volume: { id: "Volume.3", level: "RAID5", drives: 3 },
    });
    expect(m.storage.volumes).toMatchObject([{ id: "Volume.3", raidType: "RAID5", drives: ["Disk.Bay.0", "Disk.Bay.1", "Disk.Bay.2"] }]);
    expect(writes(emu)).toEqual([
      "POST /Storage/RAID.Integrated.1/Volumes 201",
      "DELETE /Storage/RAID.Integrated.1/Volumes/Volume.1 204",
      "POST /Storage/RAID.Integrated.1/Volumes 201",
      "DELETE /Storage/RAID.Integrated.1/Volumes/Volume.2 204",
      "POST /Storage/RAID.Integrated.1/Volumes 201",
    ]);

    // Two volumes (made elsewhere): one that fits is kept, and nothing else is touched.
    m.storage.volumes.push({ id: "Volume.7", name: "scratch", raidType: "RAID0", drives: ["Disk.Bay.3"], capacityBytes: 1 });
    expect(await run(emu, "metal.bmc.raid", { level: "RAID0", drives: 1 })).toEqual({
      volume: { id: "Volume.7", level: "RAID0", drives: 1 },
    });
    expect((await run(emu, "metal.bmc.inspect")).storage).toEqual({
      drives: 4,
      volumes: [
        { id: "Volume.3", level: "RAID5" },
        { id: "Volume.7", level: "RAID0" },
      ],
    });
    expect(await run(emu, "metal.bmc.raid", { level: "RAID1", drives: 2 })).toEqual({
      volume: { id: "Volume.4", level: "RAID1", drives: 2 },
    });
    expect(m.storage.volumes.map((v) => v.id)).toEqual(["Volume.4"]);
  });

  it("refuses drive counts that do not fit the level or the machine", async () => {
    const emu = await emulator(undefined, { drives: 2 });
    for (const [level, drives] of [
      ["RAID1", 3],
      ["RAID1", 1],
      ["RAID5", 2],
      ["RAID10", 3],
      ["RAID10", 5],
      ["RAID0", 0],
      ["RAID6", 2],
      ["RAID1", "some"],
    ] as const) {
      const e = await agentFailure(run(emu, "metal.bmc.raid", { level, drives }));
      expect(e.code).toBe("INVALID_ARGUMENT");
      expect(e.message).toMatch(/^metal\.bmc\.raid: (drives|level)/);
    }
    expect(emu.requests).toEqual([]); // refused before asking the BMC

    // Counts that fit the level but not this machine: refused once its drives are known, nothing written.
    for (const [level, drives] of [
      ["RAID5", "all"],
      ["RAID10", "all"],
      ["RAID10", 4],
      ["RAID10", 6],
      ["RAID0", 3],
    ] as const) {
      const e = await agentFailure(run(emu, "metal.bmc.raid", { level, drives }));
      expect(e.code).toBe("INVALID_ARGUMENT");
      expect(e.message).toContain(`BMC ${emu.url}/redfish/v1/Systems/abc has 2 drive`);
    }
    expect(writes(emu)).toEqual([]);
    expect(emu.machines.get("abc")!.storage.volumes).toEqual([]);

    const bare = await emulator(undefined, { drives: 0 });
    const none = await agentFailure(run(bare, "metal.bmc.raid", { level: "RAID1", drives: 2 }));
    expect(none).toMatchObject({
      code: "UNSUPPORTED",
      message: `BMC ${bare.url}/redfish/v1/Systems/abc has no storage resource (Storage); no RAID to configure`,
    });
  });

  it("powers on, off and cycles by desired state, resetting only when needed", async () => {
    const emu = await emulator();
    const m = emu.machines.get("abc")!;
    const resets = () => posts(emu, "/ComputerSystem.Reset");

    expect(await run(emu, "metal.bmc.power", { action: "on" })).toEqual({ powerState: "On", previous: "Off" });
    expect(await run(emu, "metal.bmc.power", { action: "on" })).toEqual({ powerState: "On", previous: "On" });
    expect(resets()).toBe(1);
    expect(await run(emu, "metal.bmc.power", { action: "cycle" })).toEqual({ powerState: "On", previous: "On" });
    expect(m.powerHistory).toEqual(["On", "Off", "On"]);
    expect(resets()).toBe(3); // a cycle is ForceOff, then On, each waited for
    expect(await run(emu, "metal.bmc.power", { action: "off" })).toEqual({ powerState: "Off", previous: "On" });
    expect(await run(emu, "metal.bmc.power", { action: "off" })).toEqual({ powerState: "Off", previous: "Off" });
    expect(resets()).toBe(4);
    expect(await run(emu, "metal.bmc.power", { action: "cycle" })).toEqual({ powerState: "On", previous: "Off" });
    expect(m.powerHistory).toEqual(["On", "Off", "On", "Off", "On"]); // a cycle of an Off machine only powers it on
  });

  it("sets the boot device once (the default) or continuously", async () => {
    const emu = await emulator();
    const m = emu.machines.get("abc")!;
    expect(await run(emu, "metal.bmc.boot", { device: "pxe" })).toEqual({ target: "Pxe", enabled: "Once" });
    expect(m.boot).toEqual({ target: "Pxe", enabled: "Once" });
    expect(await run(emu, "metal.bmc.boot", { device: "disk", once: false })).toEqual({ target: "Hdd", enabled: "Continuous" });
    expect(await run(emu, "metal.bmc.boot", { device: "cd", once: true })).toEqual({ target: "Cd", enabled: "Once" });
    expect(m.boot).toEqual({ target: "Cd", enabled: "Once" });
  });

  it("inserts media idempotently, swaps another image, and ejects only what is inserted", async () => {
    const emu = await emulator();
    const m = emu.machines.get("abc")!;
    const a = "http://10.0.0.1/images/a.iso";
    const b = "http://10.0.0.1/images/b.iso";
    expect(await run(emu, "metal.bmc.media.insert", { url: a })).toEqual({ image: a, inserted: true });
    expect(await run(emu, "metal.bmc.media.insert", { url: a })).toEqual({ image: a, inserted: true });
    expect(posts(emu, "/VirtualMedia.InsertMedia")).toBe(1);
    expect(posts(emu, "/VirtualMedia.EjectMedia")).toBe(0);

    expect(await run(emu, "metal.bmc.media.insert", { url: b })).toEqual({ image: b, inserted: true });
    expect(m.media).toEqual({ inserted: true, image: b });
    expect(posts(emu, "/VirtualMedia.EjectMedia")).toBe(1);

    expect(await run(emu, "metal.bmc.media.eject")).toEqual({ ejected: true });
    expect(m.media).toEqual({ inserted: false, image: null });
    expect(await run(emu, "metal.bmc.media.eject")).toEqual({ ejected: false });
    expect(posts(emu, "/VirtualMedia.EjectMedia")).toBe(2);
  });

  it("reports a wrong password as DRIVER_ERROR naming the BMC, never the credential", async () => {
    const emu = await emulator();
    const wrong = "Wr0ng-Pa55word-abc";
    const address = `${emu.url}/redfish/v1/Systems/abc`;
    const e = await agentFailure(run(emu, "metal.bmc.power", { action: "on" }, ctx("metal.bmc.power", { [REF]: wrong })));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toBe(`BMC ${address} answered 401 Unauthorized to GET /redfish/v1/Systems/abc: check the BMC credential`);
    expect(e.message).not.toContain(wrong);
    expect(e.message).not.toContain(USER);
    expect(emu.machines.get("abc")!.powerHistory).toEqual([]);
  });

  it("reports a 5xx, a dropped connection and a timeout as DRIVER_ERROR, without retrying", async () => {
    const emu = await emulator({ errorRate: 1 });
    const e503 = await agentFailure(run(emu, "metal.bmc.inspect"));
    expect(e503.code).toBe("DRIVER_ERROR");
    expect(e503.message).toMatch(
      /^BMC http:\/\/127\.0\.0\.1:\d+\/redfish\/v1\/Systems\/abc answered 503 Service Unavailable to GET .*temporarily unavailable/,
    );
    expect(emu.requests).toHaveLength(1);

    emu.setFaults({ dropRate: 1 });
    const dropped = await agentFailure(run(emu, "metal.bmc.inspect"));
    expect(dropped.code).toBe("DRIVER_ERROR");
    expect(dropped.message).toContain(`BMC ${emu.url}/redfish/v1/Systems/abc did not answer GET /redfish/v1/Systems/abc: `);

    emu.setFaults({ delayMs: 500 });
    const client = new RedfishClient({ address: `${emu.url}/redfish/v1/Systems/abc`, username: USER, password: PASS }, { timeoutMs: 50 });
    const slow = await agentFailure(client.inspect());
    expect(slow.code).toBe("DRIVER_ERROR");
    expect(slow.message).toContain("no answer within 50 ms");
  });

  it("ends a request when the command's signal aborts, with the signal's reason", async () => {
    const emu = await emulator({ delayMs: 500 });
    for (const reason of [
      new AgentError("DEADLINE_EXCEEDED", "the deadline passed"),
      new AgentError("INTERRUPTED", "the agent is stopping"),
    ]) {
      const controller = new AbortController();
      const t0 = performance.now();
      const pending = agentFailure(run(emu, "metal.bmc.inspect", {}, ctx("metal.bmc.inspect", undefined, controller.signal)));
      setTimeout(() => controller.abort(reason), 30);
      expect(await pending).toBe(reason);
      expect(performance.now() - t0).toBeLessThan(400);
    }
  });

  it("refuses a bad address before any request", async () => {
    const emu = await emulator();
    const handlers = siteHandlers();
    const port = new URL(emu.url).port;
    for (const address of [
      `http://${USER}:${PASS}@127.0.0.1:${port}/redfish/v1/Systems/abc`,
      `${emu.url}/redfish/v1/Managers/abc-bmc`,
      `${emu.url}/redfish/v1/Systems`,
      `ftp://127.0.0.1:${port}/redfish/v1/Systems/abc`,
      "not a url",
    ]) {
      const e = await agentFailure(
        handlers["metal.bmc.inspect"]!({ bmc: { address, username: USER, password: REF } }, ctx("metal.bmc.inspect")) as Promise<unknown>,
      );
      expect(e.code).toBe("INVALID_ARGUMENT");
      expect(e.message).not.toContain(PASS);
    }
    expect(emu.requests).toEqual([]);
  });

  it("refuses a missing secret, a password in the body and bad fields", async () => {
    const emu = await emulator();
    const missing = await agentFailure(run(emu, "metal.bmc.inspect", {}, ctx("metal.bmc.inspect", {})));
    expect(missing).toMatchObject({ code: "INVALID_ARGUMENT", message: `the command carries no value for ${REF}` });

    const plain = await agentFailure(
      siteHandlers()["metal.bmc.inspect"]!(
        { bmc: { address: `${emu.url}/redfish/v1/Systems/abc`, username: USER, password: PASS } },
        ctx("metal.bmc.inspect"),
      ) as Promise<unknown>,
    );
    expect(plain.code).toBe("INVALID_ARGUMENT");
    expect(plain.message).toContain("bmc.password");
    expect(plain.message).not.toContain(PASS);

    expect(await agentFailure(run(emu, "metal.bmc.power", { action: "reboot" }))).toMatchObject({
      code: "INVALID_ARGUMENT",
      message: expect.stringContaining("action"),
    });
    expect(await agentFailure(run(emu, "metal.bmc.boot", { device: "floppy" }))).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(await agentFailure(run(emu, "metal.bmc.media.insert", { url: "file:///etc/passwd" }))).toMatchObject({
      code: "INVALID_ARGUMENT",
    });
    expect(emu.requests).toEqual([]);
  });

  it("logs each BMC operation (kind, BMC, outcome, duration) and each failure, never the credential", async () => {
    const emu = await emulator();
    const address = `${emu.url}/redfish/v1/Systems/abc`;
    const port = new URL(emu.url).port;
    const wrong = "Wr0ng-Pa55word-abc";
    const lines: Array<Record<string, unknown>> = [];
    const at = (level: string) => (message: string, fields?: Record<string, unknown>) => void lines.push({ level, message, ...fields });
    const handlers = siteHandlers({ log: { info: at("info"), warn: at("warn"), error: at("error") }, timeoutMs: 2_000 });
    const bmc = { address, username: USER, password: REF };
    await handlers["metal.bmc.power"]!({ bmc, action: "on" }, ctx("metal.bmc.power"));
    await agentFailure(handlers["metal.bmc.inspect"]!({ bmc }, ctx("metal.bmc.inspect", { [REF]: wrong })) as Promise<unknown>);
    await agentFailure(
      handlers["metal.bmc.inspect"]!(
        { bmc: { ...bmc, address: `http://${USER}:${PASS}@127.0.0.1:${port}/redfish/v1/Systems/abc` } },
        ctx("metal.bmc.inspect"),
      ) as Promise<unknown>,
    );
    await agentFailure(handlers["metal.bmc.inspect"]!({ bmc: { ...bmc, password: PASS } }, ctx("metal.bmc.inspect")) as Promise<unknown>);

    expect(lines).toEqual([
      { level: "info", message: "bmc operation", kind: "metal.bmc.power", bmc: address, outcome: "ok", durationMs: expect.any(Number) },
      {
        level: "warn",
        message: "bmc operation failed",
        kind: "metal.bmc.inspect",
        bmc: address,
        outcome: "DRIVER_ERROR",
        durationMs: expect.any(Number),
        error: expect.stringContaining("answered 401"),
      },
      // A refused address is not logged: it may hold a credential (this one does).
      {
        level: "warn",
        message: "bmc operation failed",
        kind: "metal.bmc.inspect",
        bmc: undefined,
        outcome: "INVALID_ARGUMENT",
        durationMs: expect.any(Number),
        error: expect.stringContaining("carries a username or password"),
      },
      {
        level: "warn",
        message: "bmc operation failed",
        kind: "metal.bmc.inspect",
        bmc: undefined,
        outcome: "INVALID_ARGUMENT",
        durationMs: expect.any(Number),
        error: expect.stringContaining("bmc.password"),
      },
    ]);
    const logged = JSON.stringify(lines);
    for (const secret of [
      PASS,
      wrong,
      USER,
      Buffer.from(`${USER}:${PASS}`).toString("base64"),
      Buffer.from(`${USER}:${wrong}`).toString("base64"),
    ])
      expect(logged).not.toContain(secret);
  });

  it("sends Basic auth to the BMC only: a link to another origin is not followed", async () => {
    const seen: Array<{ url: string; authorization: string | undefined }> = [];
    const json = (body: unknown) => new Response(JSON.stringify(body), { status: 200, headers: { "content-type": "application/json" } });
    const fakeFetch = async (url: string, init: RequestInit) => {
      seen.push({ url, authorization: (init.headers as Record<string, string>).authorization });
      return json({
        Id: "abc",
        PowerState: "On",
        Links: { ManagedBy: [{ "@odata.id": "https://elsewhere.example/redfish/v1/Managers/x" }] },
      });
    };
    const client = new RedfishClient(
      { address: "https://bmc.example:8443/redfish/v1/Systems/abc/", username: USER, password: PASS },
      { fetch: fakeFetch },
    );
    expect(client.address).toBe("https://bmc.example:8443/redfish/v1/Systems/abc");
    const e = await agentFailure(client.inspect());
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toContain("outside the BMC");
    expect(seen).toEqual([
      {
        url: "https://bmc.example:8443/redfish/v1/Systems/abc",
        authorization: `Basic ${Buffer.from(`${USER}:${PASS}`).toString("base64")}`,
      },
    ]);
  });
});

describe("site role: network boot", () => {
  it("renders an iPXE script that loads the kernel and initrd, and tries again every 5 s when a fetch fails", () => {
    const script = ipxeScript({
      kernelUrl: "http://10.0.0.1/vmlinuz",
      initrdUrl: "http://10.0.0.1/initrd.img",
      cmdline: "console=ttyS0 ip=dhcp",
    }).split("\n");
    expect(script.slice(0, 5)).toEqual([
      "#!ipxe",
      ":load",
      "kernel http://10.0.0.1/vmlinuz initrd=initrd console=ttyS0 ip=dhcp || goto retry",
      "initrd --name initrd http://10.0.0.1/initrd.img || goto retry",
      "boot || goto retry",
    ]);
    expect(script.slice(5)).toEqual(expect.arrayContaining([":retry", "imgfree", "sleep 5", "goto load"]));
    expect(script.at(-2)).toBe("goto load");
  });

  it("refuses values that would change the script", () => {
    const ok = { kernelUrl: "http://10.0.0.1/vmlinuz", initrdUrl: "http://10.0.0.1/initrd.img", cmdline: "ip=dhcp" };
    for (const bad of [
      { ...ok, cmdline: "ip=dhcp\nshell" },
      { ...ok, cmdline: "ip=dhcp\r\nchain http://evil/" },
      { ...ok, kernelUrl: "http://10.0.0.1/vmlinuz\nshell" },
      { ...ok, initrdUrl: "http://10.0.0.1/initrd.img extra" },
      { ...ok, kernelUrl: "tftp://10.0.0.1/vmlinuz" },
    ]) {
      expect(() => ipxeScript(bad)).toThrow(expect.objectContaining({ code: "INVALID_ARGUMENT" }));
    }
  });

  it("serves cached images by sha256 over HTTP", async () => {
    const cache = createImageCache();
    const bytes = new Uint8Array(100_000).map((_, i) => (i * 31) % 251);
    const sha = cache.put(bytes);
    expect(sha).toBe(createHash("sha256").update(bytes).digest("hex"));
    bytes[0] = 255; // the cache holds a copy
    expect(cache.has(sha)).toBe(true);
    expect(cache.get(sha)![0]).toBe(0);
    expect(cache.has("0".repeat(64))).toBe(false);

    const server = await cache.serve();
    cleanups.push(() => server.stop());
    const res = await fetch(`${server.url}/images/${sha}`);
    expect(res.status).toBe(200);
    const got = new Uint8Array(await res.arrayBuffer());
    expect(createHash("sha256").update(got).digest("hex")).toBe(sha);
    expect((await fetch(`${server.url}/images/${"0".repeat(64)}`)).status).toBe(404);
    expect((await fetch(`${server.url}/images/${sha.toUpperCase()}`)).status).toBe(404);
    expect((await fetch(`${server.url}/${sha}`)).status).toBe(404);
    expect((await fetch(`${server.url}/images/${sha}`, { method: "POST" })).status).toBe(404);

    await server.stop();
    cleanups.pop();
    await expect(fetch(`${server.url}/images/${sha}`)).rejects.toThrow();
  });
});
