// A Hetzner Robot server in a metal pool (plugins/hetzner-robot/metal.ts): power and rescue come
// from the Robot webservice instead of a BMC, and the site has no agent at all. SIMULATED: the
// dedicated servers (the Robot emulator, better-compute/testing/hetzner-robot, over real HTTP).
// REAL: Postgres (PGlite), the engine, the metal module and its state machine, the Robot adapter's
// HTTP client, the secret store.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { hetznerRobotHardwareProfile, hetznerRobotMetal } from "better-compute/hetzner-robot";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";
import { sshKeyFacts, startHetznerRobotEmulator, type HetznerRobotEmulator } from "better-compute/testing/hetzner-robot";

const USER = "#ws+Metal7Qx";
const PASSWORD = "robot-metal-pw-9Tz4Lm2Qx";
const WRONG_PASSWORD = "robot-metal-pw-0000000000";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example";
const FINGERPRINT = sshKeyFacts(KEY)!.fingerprint;
const SERVER = 2451001;
const OTHER = 2451002;

let robot: HetznerRobotEmulator;
let sim: MetalSim;
const printed: string[] = [];

const box = (n: number) => robot.servers().find((s) => s.number === n)!;
const binding = (n: number, password = PASSWORD) => ({
  address: `${robot.url}/server/${n}`,
  username: USER,
  password,
  rescueKeys: [FINGERPRINT],
});
const enroll = (id: string, n: number, password?: string) =>
  sim.call<Record<string, unknown>>("metal.enroll", { id, pool: sim.site.pool, bmc: binding(n, password) });
const events = async (type: string, subject: string) =>
  (await sim.store.db.execute(sql`SELECT data FROM bc_events WHERE type = ${type} AND subject = ${subject} ORDER BY id`)).rows;
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: { code: string; message: string }) => e,
  );

beforeAll(async () => {
  for (const method of ["log", "info", "warn", "error", "debug"] as const) {
    const original = console[method].bind(console);
    vi.spyOn(console, method).mockImplementation((...args: unknown[]) => {
      printed.push(args.map(String).join(" "));
      original(...args);
    });
  }
  robot = await startHetznerRobotEmulator({ user: USER, password: PASSWORD, servers: 2 });
  // The operator's key, added in Robot's key management as an operator would.
  const added = await fetch(`${robot.url}/key`, {
    method: "POST",
    headers: { authorization: `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString("base64")}` },
    body: new URLSearchParams({ name: "ops", data: KEY }),
  });
  expect(added.status).toBe(201);
  sim = await createMetalSim({
    modules: [hetznerRobotMetal()],
    hardwareProfiles: { "hetzner-robot": hetznerRobotHardwareProfile },
    hardwareProfile: "hetzner-robot",
    agent: "none",
    machines: 0,
    joinSiteAgent: false,
    siteId: "fsn1",
  });
}, 60_000);
afterAll(async () => {
  await sim?.stop();
  await robot?.stop();
  vi.restoreAllMocks();
});

describe("a Robot server in a metal pool", () => {
  it("enrolls without a Redfish address and commissions to ready with Robot's facts, with no site agent", async () => {
    expect(box(SERVER)).toMatchObject({ power: "on", running: { system: "disk" } });
    const enrolled = await enroll("rb-1", SERVER);
    expect(enrolled).toMatchObject({ state: "commissioning", bmc: { driver: "hetzner-robot", address: `${robot.url}/server/${SERVER}` } });

    const ready = await sim.waitForState("rb-1", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    expect(ready.addresses).toEqual([box(SERVER).ip]);
    expect(ready.productUuid).toBeNull(); // Robot reports no SMBIOS UUID: the server number names it
    const inventory = (await sim.store.db.execute(sql`SELECT inventory FROM metal_nodes WHERE id = 'rb-1'`)).rows[0] as {
      inventory: Record<string, unknown>;
    };
    expect(inventory.inventory).toMatchObject({
      manufacturer: "Hetzner",
      model: "AX41-NVMe",
      serverNumber: SERVER,
      datacenter: "FSN1-DC14",
      power: "on",
    });
    // Commissioning switched it off (power_long), and no site agent was ever needed.
    expect(box(SERVER)).toMatchObject({ power: "off", resets: ["power_long"] });
    expect(sim.site.agentNodeId).toBeUndefined();
    expect((await sim.store.db.execute(sql`SELECT count(*)::int AS n FROM bc_nodes`)).rows).toEqual([{ n: 0 }]);
    // No wipe anyone could attest: ready only because the agentless pool opted in, and said so.
    expect(await events("node.release.unverified", "metal/nodes/rb-1")).toEqual([
      { data: expect.objectContaining({ event: "commissioned", attestedWipes: 0 }) },
    ]);
    const profiles = await sim.store.db.execute(sql`SELECT profile_id FROM workflows WHERE target = 'rb-1'`);
    expect(profiles.rows).toEqual([{ profile_id: "hetzner-robot.commission" }]);
  });

  it("a binding Robot's driver does not take is refused before anything is written", async () => {
    const redfishAddress = await refusal(
      sim.call("metal.enroll", {
        id: "rb-x",
        pool: sim.site.pool,
        bmc: { ...binding(OTHER), address: "https://10.0.0.5/redfish/v1/Systems/1" },
      }),
    );
    expect(redfishAddress).toMatchObject({ code: "INVALID_ARGUMENT" });
    const noKeys = await refusal(sim.call("metal.enroll", { id: "rb-x", pool: sim.site.pool, bmc: { ...binding(OTHER), rescueKeys: [] } }));
    expect(noKeys).toMatchObject({ code: "INVALID_ARGUMENT" });
    // A Redfish binding takes no rescue keys: refused, not silently dropped.
    await sim.call("metal.pools.create", { id: "fsn1-redfish", site: "fsn1", policy: { hardwareProfile: "redfish-pxe" } });
    const stray = await refusal(
      sim.call("metal.enroll", {
        id: "rb-x",
        pool: "fsn1-redfish",
        bmc: { address: "https://10.0.0.5/redfish/v1/Systems/1", username: "admin", password: "x", rescueKeys: [FINGERPRINT] },
      }),
    );
    expect(stray).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect((await sim.store.db.execute(sql`SELECT id FROM metal_nodes WHERE id = 'rb-x'`)).rows).toEqual([]);
    expect(box(OTHER).resets).toEqual([]);
  });

  it("metal.deploy boots the disks; rescue boots Hetzner's rescue system with the keys; unrescue the disks again; undeploy switches off", async () => {
    const deploy = await sim.call<{ workflow: string }>("metal.deploy", { node: "rb-1", profile: "hetzner-robot.deploy.disk" });
    const deployed = await sim.waitForState("rb-1", ["deployed", "failed"]);
    expect(deployed.state, JSON.stringify(deployed.lastError)).toBe("deployed");
    expect(deployed.role).toBe("host");
    expect(deployed.workflow).toBe(deploy.workflow);
    // Off, with the power button: it boots its disks.
    expect(box(SERVER)).toMatchObject({ power: "on", running: { system: "disk" }, resets: ["power_long", "power"] });

    await sim.call("metal.rescue", { node: "rb-1" });
    const rescued = await sim.waitForState("rb-1", ["rescue", "failed"]);
    expect(rescued.state, JSON.stringify(rescued.lastError)).toBe("rescue");
    expect(box(SERVER)).toMatchObject({
      power: "on",
      running: { system: "rescue", keys: [FINGERPRINT] },
      rescue: { active: false },
      resets: ["power_long", "power", "hw"],
    });
    expect(robot.counters.calls["POST /boot/{n}/rescue"]).toBe(1);

    await sim.call("metal.unrescue", { node: "rb-1" });
    const back = await sim.waitForState("rb-1", ["deployed", "failed"]);
    expect(back.state, JSON.stringify(back.lastError)).toBe("deployed");
    expect(box(SERVER)).toMatchObject({ running: { system: "disk" }, resets: ["power_long", "power", "hw", "hw"] });

    await sim.call("metal.undeploy", { node: "rb-1" });
    const released = await sim.waitForState("rb-1", ["ready", "failed"]);
    expect(released.state, JSON.stringify(released.lastError)).toBe("ready");
    expect(box(SERVER)).toMatchObject({ power: "off", running: null, resets: ["power_long", "power", "hw", "hw", "power_long"] });
    // The disks are not wiped: nothing on the box can attest it, and the record says so.
    expect(await events("node.release.unverified", "metal/nodes/rb-1")).toEqual([
      { data: expect.objectContaining({ event: "commissioned" }) },
      { data: expect.objectContaining({ event: "released", attestedWipes: 0 }) },
    ]);
    const steps = await sim.store.db.execute(sql`
      SELECT w.profile_id, s.name FROM workflow_steps s JOIN workflows w ON w.id = s.workflow_id
      WHERE w.target = 'rb-1' AND s.state = 'succeeded' ORDER BY w.created_at, s.position`);
    expect(steps.rows).toEqual([
      { profile_id: "hetzner-robot.commission", name: "inspect" },
      { profile_id: "hetzner-robot.commission", name: "metal.recordInventory" },
      { profile_id: "hetzner-robot.commission", name: "rescue.disarm" },
      { profile_id: "hetzner-robot.commission", name: "power.off" },
      { profile_id: "hetzner-robot.deploy.disk", name: "rescue.disarm" },
      { profile_id: "hetzner-robot.deploy.disk", name: "power.on" },
      { profile_id: "hetzner-robot.rescue", name: "rescue.arm" },
      { profile_id: "hetzner-robot.rescue", name: "power.cycle" },
      { profile_id: "hetzner-robot.rescue", name: "robot.rescue.booted" },
      { profile_id: "hetzner-robot.unrescue", name: "rescue.disarm" },
      { profile_id: "hetzner-robot.unrescue", name: "power.reboot" },
      { profile_id: "hetzner-robot.release", name: "rescue.disarm" },
      { profile_id: "hetzner-robot.release", name: "power.off" },
    ]);
  });

  it("a wrong password fails commissioning with INVALID_CONFIG at the first answer: Robot blocks an IP after three failed logins", async () => {
    const before = robot.counters.unauthorized;
    await enroll("rb-2", OTHER, WRONG_PASSWORD);
    const failed = await sim.waitForState("rb-2", ["ready", "failed"]);
    expect(failed).toMatchObject({ state: "failed", maintenance: true, lastError: { code: "INVALID_CONFIG" } });
    expect(robot.counters.unauthorized - before).toBe(1);
    expect(box(OTHER)).toMatchObject({ power: "on", resets: [] });
  });

  it("the Robot password is in no row of any table (events, steps, commands, workflows) and no console line", async () => {
    const tables = (
      await sim.store.db.execute(sql`
        SELECT table_schema AS schema, table_name AS name FROM information_schema.tables
        WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2`)
    ).rows as { schema: string; name: string }[];
    const dumped = new Map<string, string[]>();
    for (const t of tables) {
      const rows = await sim.store.db.execute(sql.raw(`SELECT t::text AS row FROM "${t.schema}"."${t.name}" t`));
      dumped.set(
        `${t.schema}.${t.name}`,
        (rows.rows as { row: string }[]).map((r) => r.row),
      );
    }
    for (const table of ["public.bc_events", "public.workflow_steps", "public.workflows", "public.metal_nodes", "public.bc_secrets"])
      expect(dumped.get(table)?.length, table).toBeGreaterThan(0);
    expect(dumped.has("public.bc_commands")).toBe(true);
    // The binding holds the password by reference only.
    expect(dumped.get("public.metal_nodes")!.join("\n")).toMatch(/secret:\/\//);
    const basic = (password: string) => Buffer.from(`${USER}:${password}`).toString("base64");
    for (const secret of [PASSWORD, WRONG_PASSWORD, basic(PASSWORD), basic(WRONG_PASSWORD)]) {
      for (const [table, rows] of dumped)
        expect(
          rows.filter((r) => r.includes(secret)),
          `${table}`,
        ).toEqual([]);
      expect(printed.filter((line) => line.includes(secret))).toEqual([]);
    }
  });
});
