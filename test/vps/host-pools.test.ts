// vps pools of class host in workerd against Postgres: a tenant's instances are placed on hosts by
// the capacity module, written into the hosts' NodeSpecs, converged by each host's node role and
// followed by the vps.hostInstances reconciler from what the hosts report. The hosts are
// FakeDaemons (the real AgentClient, JoinService and NodeDO) running the node role's converger.
// SIMULATED: the machines' resources (what a FakeDaemon reports) and the runtime
// (testing/simulated-runtime.ts: no guest boots; its report is computed from the spec it was
// given, so the user data's sha256 is the one of the bytes the host received).
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { FakeDaemon } from "../../testing/index.ts";
import { simulatedRuntime, type SimulatedRuntime } from "../../testing/simulated-runtime.ts";
import { betterCompute } from "../../core/index.ts";
import { sha256Hex } from "../../core/encoding.ts";
import { createTestClient, type TestClient } from "../../testing/test-client.ts";
import { capacity } from "better-compute/capacity";
import { vps } from "../../plugins/vps/index.ts";
import { joinedDaemon } from "../support/fake-daemon.ts";

const compute = betterCompute({ modules: [capacity(), vps()] });
let client: TestClient;
const daemons: FakeDaemon[] = [];
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterEach(async () => {
  await Promise.all(daemons.splice(0).map((d) => d.stop()));
});
afterAll(() => client?.close());

async function ok<T = any>(name: string, input: unknown, key?: string): Promise<T> {
  const res = await client.call<T>(name, input, key ? { key } : {});
  expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
}

async function refused(name: string, input: unknown, code: string, key?: string) {
  const res = await client.call(name, input, key ? { key } : {});
  expect(res.body.code, `${name}: ${JSON.stringify(res.body)}`).toBe(code);
  return res.body as { code: string; message: string; details?: Record<string, any> };
}

/**
 * A host: a FakeDaemon joined with the world's label, reporting these resources, running a simulated
 * qemu-microvm. With `restart`, that host's agent again (its state and its guests kept, no join).
 */
async function host(
  labels: Record<string, string>,
  opts: {
    drivers?: { id: string; version: string }[];
    resources?: { cpus: number; memoryMiB: number; diskGiB: number };
    restart?: { daemon: FakeDaemon; runtime: SimulatedRuntime };
  } = {},
) {
  const runtime = opts.restart?.runtime ?? simulatedRuntime({ id: "qemu-microvm", bootDelayMs: 10 });
  const resources = opts.resources ?? { cpus: 4, memoryMiB: 8192, diskGiB: 100 };
  // A restart's state holds the identity: it connects without joining again.
  const d = await joinedDaemon(client, compute, env, {
    heartbeatMs: 60_000,
    drivers: opts.drivers ?? [],
    resources: { ...resources, devices: [] },
    node: { runtimes: [runtime] },
    ...(opts.restart ? { state: opts.restart.daemon.state } : {}),
    tokenLabels: labels,
    connect: true,
  });
  daemons.push(d);
  await expect
    .poll(async () => ((await client.store.db.execute(sql`SELECT state FROM bc_nodes WHERE id = ${d.nodeId!}`)).rows[0] as any)?.state)
    .toBe("connected");
  return { daemon: d, runtime, node: d.nodeId! };
}

/** A host pool on the hosts labelled for this world, a tenant with a key and a quota, and two flavors. */
async function world(name: string, pool: { strategy?: "spread" | "pack"; runtime?: string } = {}) {
  const id = `${name}-${crypto.randomUUID().slice(0, 6)}`;
  const labels = { "vps-host-test": id };
  await ok("vps.pools.create", { id, class: "host", hosts: { labels }, strategy: pool.strategy ?? "spread", runtime: pool.runtime });
  await ok("vps.flavors.create", { id: `${id}-small`, pool: id, vcpus: 2, memoryMiB: 2048, diskGiB: 10 });
  await ok("vps.flavors.create", { id: `${id}-large`, pool: id, vcpus: 4, memoryMiB: 4096, diskGiB: 20 });
  await ok("vps.tenants.create", { id, name: `Tenant ${name}` });
  await ok("vps.quotas.set", { tenant: id, pool: id, instances: 10, vcpus: 40, memoryMiB: 65536, diskGiB: 1000 });
  const apiKey = await ok<{ id: string; key: string }>("iam.apiKeys.create", { name: `tenant ${id}`, roles: ["vps-tenant"] });
  await ok("vps.tenants.addMember", { tenant: id, principal: `apikey:${apiKey.id}` });
  return { id, labels, key: apiKey.key, small: `${id}-small`, large: `${id}-large` };
}

type World = Awaited<ReturnType<typeof world>>;

const script = (name: string) => `#!/bin/sh\necho "hello from ${name}" > /run/hello\n`;

const create = (w: World, name: string, extra: object = {}) =>
  ok("vps.instances.create", { pool: w.id, flavor: w.small, name, userData: script(name), ...extra }, w.key);

const get = (w: World, id: string) => ok("vps.instances.get", { id }, w.key);

/** One cron pass of the reconcilers (the NodeDO also runs vps's after each status it records). */
const pass = () => compute.reconcile(env, client.store);

async function until(w: World, id: string, state: string) {
  await expect
    .poll(
      async () => {
        await pass();
        return (await get(w, id)).state;
      },
      { timeout: 20_000, interval: 100 },
    )
    .toBe(state);
  return get(w, id);
}

/** The host's entry for the instance, as the host gets it (nodes.spec.get hides the user data). */
const entryOn = async (node: string, id: string) =>
  (await compute.moduleContext("vps", env, client.store).nodeSpecs.get(node))?.sections.instances?.[id] as any;

const reservations = async (pool: string) =>
  ((await client.store.db.execute(sql`SELECT count(*)::int AS n FROM capacity_reservations WHERE pool = ${pool}`)).rows[0] as { n: number })
    .n;

describe("host pools: the operator's setup", () => {
  it("creates a host pool idempotently, with its defaults; refuses provider fields on it and offers on its flavors", async () => {
    const id = `setup-${crypto.randomUUID().slice(0, 6)}`;
    const pool = { id, class: "host", hosts: { labels: { rack: "r1" } }, overcommit: { cpu: 4 } };
    expect(await ok("vps.pools.create", pool)).toMatchObject({
      id,
      class: "host",
      account: null,
      hosts: { labels: { rack: "r1" } },
      runtime: "qemu-microvm",
      overcommit: { cpu: 4, memory: 1 },
      strategy: "spread",
      image: "bc-guest",
      created: true,
    });
    expect(await ok("vps.pools.create", pool)).toMatchObject({ created: false });
    expect((await refused("vps.pools.create", { ...pool, strategy: "pack" }, "CONFLICT")).details!.fields).toEqual(["strategy"]);
    await refused("vps.pools.create", { ...pool, id: `${id}-x`, account: "acct" }, "INVALID_ARGUMENT");
    await refused("vps.pools.create", { id: `${id}-y`, runtime: "qemu-microvm" }, "INVALID_ARGUMENT");
    // An id names a guest on a host: a DNS label, so a trailing dash is refused here, not on the host.
    await refused("vps.pools.create", { ...pool, id: `${id}-` }, "INVALID_ARGUMENT");
    // The runtime is a registered runtime driver (the built-in ones are listed with the drivers).
    expect((await refused("vps.pools.create", { id: `${id}-k`, class: "host", runtime: "kata" }, "INVALID_ARGUMENT")).message).toContain(
      "registered: qemu-microvm, firecracker",
    );
    expect((await ok("drivers.list", {})).drivers).toEqual(
      expect.arrayContaining([expect.objectContaining({ id: "qemu-microvm", kinds: ["runtime"], runsOn: "node" })]),
    );
    await refused("vps.flavors.create", { id: `${id}-f`, pool: id, offer: "cx22", image: "debian-12" }, "INVALID_ARGUMENT");
    await refused("vps.flavors.create", { id: `${id}-f`, pool: id, vcpus: 2 }, "INVALID_ARGUMENT");
    expect(await ok("vps.flavors.create", { id: `${id}-f`, pool: id, vcpus: 2, memoryMiB: 1024, diskGiB: 5 })).toMatchObject({
      offer: null,
      image: null,
      vcpus: 2,
      created: true,
    });
  });
});

describe("host pools: placement", () => {
  it("places a tenant's instances by capacity and anti-affinity, explains the one no host takes, runs the placed ones and shows their guest", async () => {
    const w = await world("place", { strategy: "pack" });
    const a = await host(w.labels);
    const b = await host(w.labels);

    // pack would put both on one host: the anti-affinity group keeps them apart.
    const one = await create(w, "one", { antiAffinityGroup: "web" });
    const two = await create(w, "two", { antiAffinityGroup: "web" });
    expect([one.state, two.state]).toEqual(["starting", "starting"]);
    expect(new Set([one.host, two.host])).toEqual(new Set([a.node, b.node]));

    // 4 vCPUs fit on neither host (2 of 4 are used on each): kept pending, with each host's reason.
    const three = await create(w, "three", { flavor: w.large });
    expect(three).toMatchObject({ state: "pending", host: null });
    expect(three.placement.rejections).toEqual(
      expect.arrayContaining([
        { nodeId: a.node, filter: "fits", reason: expect.stringContaining("needs 4 vCPUs, 2 free of 4") },
        { nodeId: b.node, filter: "fits", reason: expect.stringContaining("needs 4 vCPUs, 2 free of 4") },
      ]),
    );
    expect(await reservations(w.id)).toBe(2);

    // The entry the host got: the instance id is the one name, the stored bytes in base64 with their sha256.
    const stored = await sha256Hex(script("one"));
    expect(await entryOn(one.host, one.id)).toEqual({
      name: one.id,
      runtime: "qemu-microvm",
      desired: "running",
      vcpus: 2,
      memory: "2048M",
      disk: "10G",
      image: "bc-guest",
      userData: btoa(script("one")),
      userDataSha256: stored,
      rebootCount: 0,
    });
    // An operator reading the host's NodeSpec sees the sha256, not the tenant's bytes.
    const shown = (await ok("nodes.spec.get", { node: one.host })).sections.instances[one.id];
    expect(shown).toMatchObject({ userDataSha256: stored });
    expect(JSON.stringify(shown)).not.toContain(btoa(script("one")));

    const running = await until(w, one.id, "running");
    await until(w, two.id, "running");
    expect(running.guest).toEqual({
      hostname: one.id,
      userDataSha256: stored,
      storedUserDataSha256: stored,
      hostKeys: [expect.stringMatching(/^ssh-ed25519 /)],
      knownHosts: `${one.id} ${running.guest.hostKeys[0].split(" ").slice(0, 2).join(" ")}\n`,
      address: "10.0.2.2/30",
    });
    const onHost = one.host === a.node ? a : b;
    expect(onHost.runtime.boots).toEqual([one.id]);

    // Deleting one frees its host: the pending instance is placed there by the next pass.
    await ok("vps.instances.delete", { id: one.id }, w.key);
    await until(w, one.id, "deleted");
    expect(onHost.runtime.removed).toEqual([one.id]);
    expect(await entryOn(onHost.node, one.id)).toBeUndefined();
    const placed = await until(w, three.id, "running");
    expect(placed).toMatchObject({ host: onHost.node, placement: null });
    expect(await reservations(w.id)).toBe(2);
  });

  it("FC-USERDATA-REQUIRED: refuses a host instance without user data (or with too much) before anything is reserved or written", async () => {
    const w = await world("userdata");
    await host(w.labels);
    const before = await reservations(w.id);
    const missing = await refused("vps.instances.create", { pool: w.id, flavor: w.small, name: "bare" }, "INVALID_ARGUMENT", w.key);
    expect(missing.message).toContain("userData");
    await refused("vps.instances.create", { pool: w.id, flavor: w.small, name: "bare", userData: "" }, "INVALID_ARGUMENT", w.key);
    // The id names the guest on the host, whose runtime refuses a name ending in a dash: refused here instead.
    await refused(
      "vps.instances.create",
      { pool: w.id, flavor: w.small, name: "dash", id: "web-", userData: "x" },
      "INVALID_ARGUMENT",
      w.key,
    );
    await refused(
      "vps.instances.create",
      { pool: w.id, flavor: w.small, name: "big", userData: "x".repeat(32 * 1024 + 1) },
      "INVALID_ARGUMENT",
      w.key,
    );
    expect(await reservations(w.id)).toBe(before);
    expect((await client.store.db.execute(sql`SELECT 1 FROM vps_instances WHERE pool_id = ${w.id}`)).rows).toHaveLength(0);
  });

  it("FC-ENRICH-ONCE: the stored user data is the tenant's bytes, sent unchanged by every later entry write", async () => {
    const w = await world("enrich");
    const h = await host(w.labels);
    const userData = "#cloud-config\nruncmd:\n  - [touch, /run/ünïcode]\n";
    const created = await create(w, "once", { userData });
    const row = (await client.store.db.execute(sql`SELECT user_data, user_data_sha256 FROM vps_instances WHERE id = ${created.id}`))
      .rows[0] as { user_data: string; user_data_sha256: string };
    expect(row).toEqual({ user_data: userData, user_data_sha256: await sha256Hex(userData) });
    await until(w, created.id, "running");
    await ok("vps.instances.stop", { id: created.id }, w.key);
    await until(w, created.id, "stopped");
    const entry = await entryOn(h.node, created.id);
    expect(new TextDecoder().decode(Uint8Array.from(atob(entry.userData), (c) => c.charCodeAt(0)))).toBe(userData);
    expect((await get(w, created.id)).guest.userDataSha256).toBe(row.user_data_sha256);
  });
});

describe("host pools: lifecycle", () => {
  it("stop, start and reboot move the entry and the state; a guest that powers off stays stopped with its reason; the console is the host's", async () => {
    const w = await world("life");
    const h = await host(w.labels);
    const vm = await create(w, "life");
    await until(w, vm.id, "running");

    expect(await ok("vps.instances.stop", { id: vm.id }, w.key)).toMatchObject({ state: "stopping", desired: "stopped" });
    expect(await entryOn(h.node, vm.id)).toMatchObject({ desired: "stopped" });
    expect(await until(w, vm.id, "stopped")).toMatchObject({ reason: null });

    expect(await ok("vps.instances.start", { id: vm.id }, w.key)).toMatchObject({ state: "starting", desired: "running" });
    expect(await entryOn(h.node, vm.id)).toMatchObject({ desired: "running" });
    await until(w, vm.id, "running");

    expect(await ok("vps.instances.reboot", { id: vm.id }, w.key)).toMatchObject({ state: "starting" });
    expect(await entryOn(h.node, vm.id)).toMatchObject({ desired: "running", rebootCount: 1 });
    await until(w, vm.id, "running");
    // Booted at create, at start and once for the reboot: never twice for one ask.
    expect(h.runtime.boots).toEqual([vm.id, vm.id, vm.id]);

    const tail = await ok("vps.instances.console", { id: vm.id, maxBytes: 4096 }, w.key);
    expect(tail).toMatchObject({ id: vm.id, host: h.node, stale: false, error: null });
    expect(tail.console).toContain(`SIMULATED console of ${vm.id}`);
    await refused("vps.instances.console", { id: vm.id, maxBytes: 16 * 1024 + 1 }, "INVALID_ARGUMENT", w.key);

    // The guest powers itself off: noticed, kept off (not booted again), with why.
    h.runtime.powerOff(vm.id);
    expect(await until(w, vm.id, "stopped")).toMatchObject({ reason: "guest_poweroff", desired: "stopped" });
    expect(await entryOn(h.node, vm.id)).toMatchObject({ desired: "stopped" });
    await h.daemon.node!.idle();
    expect(h.runtime.boots).toHaveLength(3);

    await ok("vps.instances.delete", { id: vm.id }, w.key);
    expect(await entryOn(h.node, vm.id)).toBeUndefined();
    await until(w, vm.id, "deleted");
    expect(h.runtime.removed).toEqual([vm.id]);
    expect(await reservations(w.id)).toBe(0);
  });
});

describe("host pools: a guest the host cannot run", () => {
  it("is failed with the host's reason and message, and deleted once the host no longer has it", async () => {
    // The host advertises firecracker (a label) without having the runtime: it reports the entry failed.
    const w = await world("fail", { runtime: "firecracker" });
    const h = await host(w.labels, { drivers: [{ id: "firecracker", version: "1" }] });
    const vm = await create(w, "nope");
    expect(vm).toMatchObject({ host: h.node, state: "starting" });
    const failed = await until(w, vm.id, "failed");
    expect(failed).toMatchObject({
      reason: "UNSUPPORTED",
      lastError: { code: "UNSUPPORTED", message: expect.stringContaining("firecracker") },
    });
    await refused("vps.instances.start", { id: vm.id }, "FAILED_PRECONDITION", w.key);
    await ok("vps.instances.delete", { id: vm.id }, w.key);
    await until(w, vm.id, "deleted");
    expect(await reservations(w.id)).toBe(0);
  });
});

describe("host pools: drain", () => {
  it("moves a cordoned host's stopped instance to another host and says why a running one cannot move", async () => {
    const w = await world("drain", { strategy: "pack" });
    const a = await host(w.labels);
    const stopped = await create(w, "parked");
    const running = await create(w, "busy");
    // pack: both on the first host; the second host joins afterwards.
    expect(running.host).toBe(stopped.host);
    expect(stopped.host).toBe(a.node);
    const b = await host(w.labels);
    await until(w, running.id, "running");
    await until(w, stopped.id, "running");
    await ok("vps.instances.stop", { id: stopped.id }, w.key);
    await until(w, stopped.id, "stopped");

    // A tenant may not drain; an operator must cordon first, or a moved instance could land on the same host.
    await refused("vps.hosts.drain", { node: a.node }, "PERMISSION_DENIED", w.key);
    await refused("vps.hosts.drain", { node: a.node }, "FAILED_PRECONDITION");
    await ok("capacity.hosts.cordon", { node: a.node, reason: "disk replacement" });

    const drained = await ok("vps.hosts.drain", { node: a.node });
    expect(drained).toEqual({
      node: a.node,
      moved: [{ id: stopped.id, to: b.node }],
      notMoved: [{ id: running.id, state: "running", reason: expect.stringContaining("cannot move live") }],
    });
    expect(await entryOn(a.node, stopped.id)).toBeUndefined();
    expect(await entryOn(b.node, stopped.id)).toMatchObject({ desired: "stopped" });
    expect(await get(w, stopped.id)).toMatchObject({ host: b.node, state: "stopped" });

    await ok("vps.instances.start", { id: stopped.id }, w.key);
    expect(await until(w, stopped.id, "running")).toMatchObject({ host: b.node });
    expect(b.runtime.boots).toEqual([stopped.id]);
    await expect.poll(() => a.runtime.removed, { timeout: 10_000 }).toEqual([stopped.id]);
  });
});

describe("host pools: drain with restart", () => {
  const events = async (type: string, subject: string) =>
    (await client.store.db.execute(sql`SELECT data FROM bc_events WHERE type = ${type} AND subject = ${subject} ORDER BY id`)).rows.map(
      (r) => (r as { data: unknown }).data,
    );

  it("stops a running instance another host takes, moves it there and starts it; one no host takes stays running, with each host's reason", async () => {
    const w = await world("restart", { strategy: "pack" });
    const a = await host(w.labels, { resources: { cpus: 8, memoryMiB: 8192, diskGiB: 100 } });
    const busy = await create(w, "busy");
    const big = await create(w, "big", { flavor: w.large });
    expect([busy.host, big.host]).toEqual([a.node, a.node]);
    await until(w, busy.id, "running");
    await until(w, big.id, "running");
    // The second host has room for the small instance only.
    const b = await host(w.labels, { resources: { cpus: 2, memoryMiB: 8192, diskGiB: 100 } });
    await ok("capacity.hosts.cordon", { node: a.node, reason: "firmware update" });

    const drained = await ok("vps.hosts.drain", { node: a.node, restart: true });
    expect(drained).toEqual({
      node: a.node,
      moved: [],
      notMoved: [{ id: big.id, state: "running", reason: expect.stringContaining(`no other host takes it (${b.node}: `) }],
      stopping: [{ id: busy.id }],
    });
    expect(drained.notMoved[0].reason).toContain("needs 4 vCPUs");

    // Stopped on the drained host, moved, booted once on the other: its entry and its reservation went with it.
    expect(await until(w, busy.id, "running")).toMatchObject({ host: b.node, desired: "running", reason: null });
    expect(await entryOn(a.node, busy.id)).toBeUndefined();
    expect(await entryOn(b.node, busy.id)).toMatchObject({ desired: "running" });
    expect(b.runtime.boots).toEqual([busy.id]);
    await expect.poll(() => a.runtime.removed, { timeout: 10_000 }).toEqual([busy.id]);
    expect(await events("vps.instance.moved", `vps/instances/${busy.id}`)).toEqual([{ from: a.node, to: b.node }]);
    const booked = await client.store.db.execute(
      sql`SELECT node_id FROM capacity_reservations WHERE owner = ${`vps/instances/${busy.id}`}`,
    );
    expect(booked.rows).toEqual([{ node_id: b.node }]);

    // The one no other host takes was left alone: still running on the drained host, booted once.
    expect(await get(w, big.id)).toMatchObject({ host: a.node, state: "running", desired: "running" });
    expect(await entryOn(a.node, big.id)).toMatchObject({ desired: "running" });
    expect(a.runtime.boots).toEqual([busy.id, big.id]);

    // Without restart the answer is as before: a running instance cannot move live.
    expect(await ok("vps.hosts.drain", { node: a.node })).toEqual({
      node: a.node,
      moved: [],
      notMoved: [{ id: big.id, state: "running", reason: expect.stringContaining("cannot move live") }],
    });
  });

  it("starts an instance again where it was when no other host takes it by the time it stopped; a tenant's stop meanwhile keeps it stopped", async () => {
    const w = await world("restart-back", { strategy: "pack" });
    const a = await host(w.labels);
    const back = await create(w, "back");
    const kept = await create(w, "kept");
    await until(w, back.id, "running");
    await until(w, kept.id, "running");
    const b = await host(w.labels);
    await ok("capacity.hosts.cordon", { node: a.node, reason: "memory test" });

    // The drained host is offline: its guests stop once it is back, by which time the other host is cordoned too.
    await a.daemon.stop();
    daemons.splice(daemons.indexOf(a.daemon), 1);
    const first = await ok("vps.hosts.drain", { node: a.node, restart: true });
    expect(first).toMatchObject({ moved: [], notMoved: [] });
    expect(first.stopping).toHaveLength(2);
    expect(first.stopping).toEqual(expect.arrayContaining([{ id: back.id }, { id: kept.id }]));
    // The tenant stops one while the drain stops it: the tenant's stop wins (it is not started anywhere).
    expect(await ok("vps.instances.stop", { id: kept.id }, w.key)).toMatchObject({ desired: "stopped", state: "stopping" });
    await ok("capacity.hosts.cordon", { node: b.node, reason: "full" });
    // Drained again meanwhile: the restart under way is reported, the tenant's stopped one is not.
    expect(await ok("vps.hosts.drain", { node: a.node, restart: true })).toMatchObject({
      stopping: [{ id: back.id }],
      notMoved: [{ id: kept.id, state: "stopping", reason: expect.stringContaining("stopping") }],
    });
    await host(w.labels, { restart: a });

    const again = await until(w, back.id, "running");
    expect(again).toMatchObject({ host: a.node, desired: "running", reason: expect.stringMatching(/^drain: no other host takes it \(/) });
    expect(again.reason).toContain(b.node);
    expect(await events("vps.instance.notMoved", `vps/instances/${back.id}`)).toEqual([{ host: a.node, reason: again.reason }]);
    expect(await until(w, kept.id, "stopped")).toMatchObject({ host: a.node, desired: "stopped" });
    await a.daemon.node!.idle();
    expect(await get(w, kept.id)).toMatchObject({ state: "stopped", desired: "stopped" });
    expect(await entryOn(a.node, kept.id)).toMatchObject({ desired: "stopped" });
    // Booted at create, and once more where it was (back); never again (kept).
    expect(a.runtime.boots.filter((n) => n === back.id)).toHaveLength(2);
    expect(a.runtime.boots.filter((n) => n === kept.id)).toHaveLength(1);
    expect(b.runtime.boots).toEqual([]);
  });
});

describe("host pools: racing creates", () => {
  it("100 racing creates (40 in flight) from two tenants for 10 slots place exactly 10 and overbook no host", async () => {
    const w = await world("race");
    const drivers = [{ id: "qemu-microvm", version: "1" }];
    // 2 hosts of 10 vCPUs: 5 small (2-vCPU) instances each.
    const hosts = [
      await host(w.labels, { drivers, resources: { cpus: 10, memoryMiB: 65536, diskGiB: 1000 } }),
      await host(w.labels, { drivers, resources: { cpus: 10, memoryMiB: 65536, diskGiB: 1000 } }),
    ];
    await ok("vps.quotas.set", { tenant: w.id, pool: w.id, instances: 100, vcpus: 400, memoryMiB: 1 << 20, diskGiB: 10_000 });
    const other = `${w.id}-b`;
    await ok("vps.tenants.create", { id: other, name: "Tenant race b" });
    await ok("vps.quotas.set", { tenant: other, pool: w.id, instances: 100, vcpus: 400, memoryMiB: 1 << 20, diskGiB: 10_000 });
    const otherKey = await ok<{ id: string; key: string }>("iam.apiKeys.create", { name: `tenant ${other}`, roles: ["vps-tenant"] });
    await ok("vps.tenants.addMember", { tenant: other, principal: `apikey:${otherKey.id}` });

    // Every create is its own API request with its own database connection: 40 in flight at a time
    // keeps a real Postgres under its default max_connections (100) while they still race.
    const created: { id: string; host: string | null; state: string }[] = [];
    const requests = Array.from(
      { length: 100 },
      (_, i) => () =>
        ok<{ id: string; host: string | null; state: string }>(
          "vps.instances.create",
          { pool: w.id, flavor: w.small, name: `race-${i}`, userData: script(`race-${i}`) },
          i % 2 ? otherKey.key : w.key,
        ),
    );
    await Promise.all(
      Array.from({ length: 40 }, async () => {
        for (let next = requests.shift(); next; next = requests.shift()) created.push(await next());
      }),
    );
    const placed = created.filter((c) => c.host !== null);
    expect(placed).toHaveLength(10);
    expect(created.filter((c) => c.host === null && c.state === "pending")).toHaveLength(90);
    // What the capacity module booked, per host: never more than the host has.
    const booked = (
      await client.store.db.execute(sql`
        SELECT node_id, sum(vcpus)::int AS vcpus, count(*)::int AS n FROM capacity_reservations WHERE pool = ${w.id} GROUP BY node_id`)
    ).rows as { node_id: string; vcpus: number; n: number }[];
    expect(booked.map((b) => b.vcpus).sort()).toEqual([10, 10]);
    expect(new Set(booked.map((b) => b.node_id))).toEqual(new Set(hosts.map((h) => h.node)));
    // A reconciler pass retries the pending ones: still no room, nothing more is placed.
    await pass();
    expect(await reservations(w.id)).toBe(10);
  });
});
