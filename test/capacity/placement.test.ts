// The capacity module and the placer in workerd against Postgres: hosts are live nodes of role
// node whose agents reported resources. Some hosts join as FakeDaemons (the real AgentClient, the
// real JoinService and NodeDO record their hello); where a test needs several hosts in given
// states, their bc_nodes rows are inserted directly (said at each). SIMULATED: the machines'
// resources (what a FakeDaemon reports). Every test's hosts carry a label of their own and its
// requests name it as candidates, so the tests (and other files' nodes) never see each other's.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { FakeDaemon } from "../../testing/index.ts";
import { betterCompute, defineModule, defineSchedulerPlugin } from "../../core/index.ts";
import type { HostView, PlacementRequest, PlacementResult } from "../../core/public.ts";
import { createTestClient, type TestClient } from "../../testing/test-client.ts";
import { capacity } from "../../plugins/capacity/index.ts";
import { joinedDaemon } from "../support/fake-daemon.ts";

// A third party's scheduler plugin: its filter, scorer, atom picker and admission take part in
// every placement of this deployment, but only hosts and requests of the plugin test trigger them.
const rackAware = defineSchedulerPlugin({
  id: "rack-aware",
  filters: [{ name: "rack", filter: (host: HostView) => host.labels.rack !== "r1" || "rack r1 is being rewired" }],
  scorers: [{ name: "ssd", weight: 10, score: (host: HostView) => (host.labels.disk === "ssd" ? 1 : 0) }],
  // GPUs from the end of the host's list (the built-in picker takes them from the start).
  atomPickers: [
    {
      name: "last-gpus",
      kind: "gpu",
      pick(host: HostView, req: PlacementRequest) {
        const free = host.devices.filter((d) => d.kind === "gpu" && !host.usedDevices.includes(d.id)).map((d) => d.id);
        return free.length >= req.devices!.count ? free.slice(free.length - req.devices!.count) : null;
      },
    },
  ],
  admission: (req: PlacementRequest) => (req.pool === "frozen" ? "pool frozen is closed to new guests" : undefined),
});

const compute = betterCompute({ modules: [capacity()], scheduler: { plugins: [rackAware] } });
let client: TestClient;
const daemons: FakeDaemon[] = [];
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterEach(async () => {
  await Promise.all(daemons.splice(0).map((d) => d.stop()));
});
afterAll(() => client?.close());

/** Any module's context reaches the capacity module's port (here: agents'). */
const port = () => compute.moduleContext("agents", env, client.store).capacity;
const reserve = (req: PlacementRequest) => client.store.transaction((tx) => port().reserve(tx, req));
const placedOn = (result: PlacementResult) => ("placed" in result ? result.placed.nodeId : undefined);

/** A label only this test's hosts carry, and the candidates that select them. */
function scope() {
  const group = `g${crypto.randomUUID().slice(0, 8)}`;
  return { group, labels: { "capacity-test": group }, candidates: { labels: { "capacity-test": group } } };
}

interface HostSpec {
  cpus?: number;
  memoryMiB?: number;
  diskGiB?: number;
  devices?: { id: string; kind: string }[];
  labels?: Record<string, string>;
  state?: "connected" | "disconnected" | "joined";
}

/** A host as a bc_nodes row inserted directly (no agent behind it): state and resources as given. */
async function insertHost(id: string, spec: HostSpec): Promise<string> {
  const resources = { cpus: spec.cpus ?? 8, memoryMiB: spec.memoryMiB ?? 16384, diskGiB: spec.diskGiB ?? 200, devices: spec.devices ?? [] };
  await client.store.db.execute(sql`
    INSERT INTO bc_nodes (id, role, public_key, labels, attestor, state, resources)
    VALUES (${id}, 'node', 'inserted-by-test', ${JSON.stringify(spec.labels ?? {})}::jsonb, 'test', ${spec.state ?? "connected"},
            ${JSON.stringify(resources)}::jsonb)`);
  return id;
}

/** A host whose FakeDaemon joined (with the scope's labels on its token) and connected, reporting these resources. */
async function daemonHost(labels: Record<string, string>, spec: HostSpec & { drivers?: { id: string; version: string }[] } = {}) {
  const d = await joinedDaemon(client, compute, env, {
    heartbeatMs: 60_000,
    drivers: spec.drivers ?? [],
    resources: { cpus: spec.cpus ?? 8, memoryMiB: spec.memoryMiB ?? 16384, diskGiB: spec.diskGiB ?? 200, devices: spec.devices ?? [] },
    tokenLabels: labels,
    connect: true,
  });
  daemons.push(d);
  await expect.poll(() => nodeState(d.nodeId!), { timeout: 10_000 }).toBe("connected");
  return d;
}

const nodeState = async (id: string) =>
  ((await client.store.db.execute(sql`SELECT state FROM bc_nodes WHERE id = ${id}`)).rows[0] as { state: string } | undefined)?.state;

const vm = (owner: string, over: Partial<PlacementRequest> = {}): PlacementRequest => ({
  owner,
  vcpus: 2,
  memoryMiB: 2048,
  diskGiB: 10,
  ...over,
});

describe("placement on hosts that joined as agents", () => {
  it("places by what the agents reported, idempotently per owner, and explains an unplaceable request per host", async () => {
    const s = scope();
    const big = await daemonHost(s.labels, { cpus: 8 });
    const small = await daemonHost(s.labels, { cpus: 2 });

    const first = await reserve(vm(`${s.group}/a`, { vcpus: 4, candidates: s.candidates }));
    expect(placedOn(first)).toBe(big.nodeId);
    // The same owner again is the same reservation, not a second one.
    expect(await reserve(vm(`${s.group}/a`, { vcpus: 4, candidates: s.candidates }))).toEqual(first);

    const tooBig = await reserve(vm(`${s.group}/b`, { vcpus: 6, candidates: s.candidates }));
    expect(tooBig).toEqual({
      unplaceable: {
        rejections: expect.arrayContaining([
          { nodeId: big.nodeId, filter: "fits", reason: "needs 6 vCPUs, 4 free of 8 (overcommit 1.0)" },
          { nodeId: small.nodeId, filter: "fits", reason: "needs 6 vCPUs, 2 free of 2 (overcommit 1.0)" },
        ]),
      },
    });
    // A pool's overcommit ratio raises what a host can take: 8 x 1.5 = 12, 4 used.
    expect(placedOn(await reserve(vm(`${s.group}/c`, { vcpus: 6, candidates: s.candidates, overcommit: { cpu: 1.5 } })))).toBe(big.nodeId);

    // Releasing frees the capacity for the next one.
    expect(await client.store.transaction((tx) => port().release(tx, `${s.group}/a`))).toBe(true);
    expect(await client.store.transaction((tx) => port().release(tx, `${s.group}/a`))).toBe(false);
    const host = await client.call("capacity.hosts.get", { node: big.nodeId });
    expect(host.body).toMatchObject({ capacity: { vcpus: 8 }, used: { vcpus: 6 }, free: { vcpus: 2 }, schedulable: true });
    expect(host.body.reservationList.map((r: { owner: string }) => r.owner)).toEqual([`${s.group}/c`]);
  });

  it("places nothing on a host whose agent disconnected, nor where the runtime it needs is not advertised", async () => {
    const s = scope();
    const gone = await daemonHost(s.labels);
    const noRuntime = await daemonHost(s.labels);
    const microvm = await daemonHost(s.labels, { drivers: [{ id: "qemu-microvm", version: "1" }] });
    await gone.stop();
    await expect.poll(() => nodeState(gone.nodeId!), { timeout: 10_000 }).toBe("disconnected");

    const result = await reserve(vm(`${s.group}/a`, { candidates: s.candidates, runtime: "firecracker" }));
    expect(result).toEqual({
      unplaceable: {
        rejections: expect.arrayContaining([
          { nodeId: gone.nodeId, filter: "connected", reason: "its agent is disconnected" },
          { nodeId: noRuntime.nodeId, filter: "runtime", reason: "does not run firecracker (no label bc.dev/driver.firecracker)" },
          { nodeId: microvm.nodeId, filter: "runtime", reason: "does not run firecracker (no label bc.dev/driver.firecracker)" },
        ]),
      },
    });
    expect(placedOn(await reserve(vm(`${s.group}/b`, { candidates: s.candidates, runtime: "qemu-microvm" })))).toBe(microvm.nodeId);
  });
});

describe("the built-in filters and scorers (hosts inserted as rows)", () => {
  it("refuses by labels, cordon and maintenance, set through the operator's methods, and explains each", async () => {
    const s = scope();
    const [plain, gpuZone, cordoned, maintained] = await Promise.all([
      insertHost(`${s.group}-plain`, { labels: { ...s.labels, zone: "a" } }),
      insertHost(`${s.group}-zone-b`, { labels: { ...s.labels, zone: "b" } }),
      insertHost(`${s.group}-cordoned`, { labels: { ...s.labels, zone: "b" } }),
      insertHost(`${s.group}-maint`, { labels: { ...s.labels, zone: "b" } }),
    ]);
    expect((await client.call("capacity.hosts.cordon", { node: cordoned, reason: "disk errors" })).body).toMatchObject({
      cordoned: true,
      schedulable: false,
      reason: "disk errors",
    });
    expect((await client.call("capacity.hosts.maintenance", { node: maintained, on: true, reason: "BIOS update" })).status).toBe(200);
    expect((await client.call("capacity.hosts.maintenance", { node: maintained, on: true })).body.code).toBe("INVALID_ARGUMENT");

    const explained = await client.call("capacity.explain", {
      candidates: s.candidates,
      nodeLabels: { zone: "b" },
      vcpus: 1,
      memoryMiB: 512,
      diskGiB: 1,
    });
    expect(explained.status).toBe(200);
    expect(explained.body.pick).toBe(gpuZone);
    expect(explained.body.verdicts).toEqual(
      expect.arrayContaining([
        { nodeId: plain, accepted: false, filter: "labels", reason: 'label zone is "a", not "b"' },
        { nodeId: cordoned, accepted: false, filter: "cordon", reason: "cordoned: disk errors" },
        { nodeId: maintained, accepted: false, filter: "maintenance", reason: "in maintenance: BIOS update" },
        expect.objectContaining({ nodeId: gpuZone, accepted: true }),
      ]),
    );
    // explain books nothing.
    expect((await client.call("capacity.hosts.get", { node: gpuZone })).body.reservations).toBe(0);

    // A host both cordoned and in maintenance keeps its reason until neither is on.
    await client.call("capacity.hosts.cordon", { node: maintained, reason: "disk errors too" });
    expect((await client.call("capacity.hosts.uncordon", { node: maintained })).body).toMatchObject({
      cordoned: false,
      maintenance: true,
      reason: "disk errors too",
    });
    await client.call("capacity.hosts.uncordon", { node: cordoned });
    expect((await client.call("capacity.hosts.maintenance", { node: maintained, on: false })).body).toMatchObject({
      maintenance: false,
      reason: null,
    });
    const after = await client.call("capacity.hosts.list", { labels: s.labels });
    expect(after.body.hosts.filter((h: { schedulable: boolean }) => h.schedulable)).toHaveLength(4);
    expect((await client.call("capacity.hosts.get", { node: "n-nobody" })).body.code).toBe("NOT_FOUND");
  });

  it("keeps two reservations of one anti-affinity group apart, and says so when no host is left", async () => {
    const s = scope();
    const hosts = await Promise.all([insertHost(`${s.group}-1`, { labels: s.labels }), insertHost(`${s.group}-2`, { labels: s.labels })]);
    const group = { group: `${s.group}/web` };
    const a = await reserve(vm(`${s.group}/a`, { candidates: s.candidates, antiAffinity: group }));
    const b = await reserve(vm(`${s.group}/b`, { candidates: s.candidates, antiAffinity: group }));
    expect(new Set([placedOn(a), placedOn(b)])).toEqual(new Set(hosts));
    expect(await reserve(vm(`${s.group}/c`, { candidates: s.candidates, antiAffinity: group }))).toEqual({
      unplaceable: {
        rejections: hosts.map((nodeId) => ({
          nodeId,
          filter: "anti-affinity",
          reason: `already holds a reservation of anti-affinity group ${s.group}/web`,
        })),
      },
    });
    // Outside the group it still fits.
    expect(placedOn(await reserve(vm(`${s.group}/d`, { candidates: s.candidates })))).toBeDefined();
  });

  it("spreads to the least used host by default and packs onto the most used when asked", async () => {
    const s = scope();
    const [busy, idle] = await Promise.all([
      insertHost(`${s.group}-busy`, { labels: s.labels }),
      insertHost(`${s.group}-idle`, { labels: s.labels }),
    ]);
    const onBusy = await client.store.transaction(async (tx) => {
      // Pin the first reservation on `busy` by excluding `idle` through a label only `busy` has.
      await tx.execute(sql`UPDATE bc_nodes SET labels = labels || '{"first":"yes"}'::jsonb WHERE id = ${busy}`);
      return port().reserve(tx, vm(`${s.group}/first`, { candidates: s.candidates, nodeLabels: { first: "yes" }, vcpus: 4 }));
    });
    expect(placedOn(onBusy)).toBe(busy);
    expect(placedOn(await reserve(vm(`${s.group}/spread`, { candidates: s.candidates })))).toBe(idle);
    expect(placedOn(await reserve(vm(`${s.group}/pack`, { candidates: s.candidates, strategy: "pack" })))).toBe(busy);
  });

  it("refuses a malformed request with INVALID_ARGUMENT before reading anything", async () => {
    await expect(reserve(vm("x", { vcpus: -1 }))).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
    const res = await client.call("capacity.explain", { vcpus: 1, memoryMiB: 1, diskGiB: 1, strategy: "random" });
    expect(res.body.code).toBe("INVALID_ARGUMENT");
  });
});

describe("scheduler plugins", () => {
  it("a plugin's filter, scorer, atom picker and admission take part, each named in the explanation", async () => {
    const s = scope();
    const gpus = ["gpu0", "gpu1", "gpu2", "gpu3"].map((id) => ({ id, kind: "gpu" }));
    const [r1, hdd, ssd] = await Promise.all([
      insertHost(`${s.group}-r1`, { labels: { ...s.labels, rack: "r1", disk: "ssd" }, devices: gpus }),
      insertHost(`${s.group}-hdd`, { labels: { ...s.labels, rack: "r2", disk: "hdd" }, devices: gpus }),
      insertHost(`${s.group}-ssd`, { labels: { ...s.labels, rack: "r2", disk: "ssd" }, devices: gpus.slice(0, 1) }),
    ]);
    const explained = await client.call("capacity.explain", { candidates: s.candidates, vcpus: 1, memoryMiB: 512, diskGiB: 1 });
    expect(explained.body.verdicts).toContainEqual({
      nodeId: r1,
      accepted: false,
      filter: "rack-aware/rack",
      reason: "rack r1 is being rewired",
    });
    const ssdVerdict = explained.body.verdicts.find((v: { nodeId: string }) => v.nodeId === ssd);
    expect(ssdVerdict.scores).toMatchObject({ "rack-aware/ssd": 1 });
    expect(explained.body.pick).toBe(ssd); // the plugin's weighted scorer outranks spreading

    // Two GPUs: only `hdd` has two free; the plugin's picker takes them from the end of its list.
    const twoGpus = await reserve(vm(`${s.group}/ml`, { candidates: s.candidates, devices: { kind: "gpu", count: 2 } }));
    expect(twoGpus).toEqual({ placed: { nodeId: hdd, reservationId: expect.any(String), atoms: ["gpu2", "gpu3"] } });
    const next = await reserve(vm(`${s.group}/ml2`, { candidates: s.candidates, devices: { kind: "gpu", count: 2 } }));
    expect(next).toMatchObject({ placed: { nodeId: hdd, atoms: ["gpu0", "gpu1"] } });
    const none = await reserve(vm(`${s.group}/ml3`, { candidates: s.candidates, devices: { kind: "gpu", count: 2 } }));
    expect(none).toEqual({
      unplaceable: {
        rejections: expect.arrayContaining([
          { nodeId: hdd, filter: "fits", reason: "needs 2 gpu devices, 0 free of 4" },
          { nodeId: ssd, filter: "fits", reason: "needs 2 gpu devices, 1 free of 1" },
        ]),
      },
    });

    await expect(reserve(vm(`${s.group}/frozen`, { candidates: s.candidates, pool: "frozen" }))).rejects.toMatchObject({
      code: "FAILED_PRECONDITION",
      message: "scheduler plugin rack-aware refused the request: pool frozen is closed to new guests",
    });
  });

  it("the built-in picker gives devices of other kinds in the order the agent reported them", async () => {
    const s = scope();
    const host = await insertHost(`${s.group}-fpga`, { labels: s.labels, devices: ["f0", "f1", "f2"].map((id) => ({ id, kind: "fpga" })) });
    const r = await reserve(vm(`${s.group}/a`, { candidates: s.candidates, devices: { kind: "fpga", count: 2 } }));
    expect(r).toMatchObject({ placed: { nodeId: host, atoms: ["f0", "f1"] } });
    const got = await client.call("capacity.hosts.get", { node: host });
    expect(got.body.devices.map((d: { id: string; used: boolean }) => [d.id, d.used])).toEqual([
      ["f0", true],
      ["f1", true],
      ["f2", false],
    ]);
  });
});

describe("what a reserve reads (the hosts filtered and ranked in SQL, judged again by the placer)", () => {
  // Without plugin scorers the built-in score is the whole ranking: a reserve reads only the best few hosts.
  const onlyBuiltins = betterCompute({ modules: [capacity()] });
  const builtinPort = () => onlyBuiltins.moduleContext("agents", env, client.store).capacity;

  /** A mixed fleet: sizes, usage, labels, devices, a runtime, and hosts every filter refuses; ids that sort differently by locale. */
  async function mixedFleet(s: ReturnType<typeof scope>) {
    const gpus = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `gpu${i}`, kind: "gpu" }));
    const zone = (z: string) => ({ ...s.labels, zone: z });
    await Promise.all([
      insertHost(`${s.group}-B`, { labels: zone("a"), cpus: 8 }),
      insertHost(`${s.group}-a`, { labels: zone("a"), cpus: 8 }),
      insertHost(`${s.group}-c`, { labels: zone("b"), cpus: 16, memoryMiB: 65536, devices: gpus(4) }),
      insertHost(`${s.group}-D`, { labels: zone("b"), cpus: 4, memoryMiB: 8192, devices: gpus(2) }),
      insertHost(`${s.group}-e`, { labels: { ...zone("a"), "bc.dev/driver.qemu-microvm": "1" }, cpus: 6, diskGiB: 50 }),
      // Alike, more than a reserve reads at first: they tie, and the tie goes by node id (by code unit, not by locale).
      ...["tie-a", "tie-B", "tie-C", "tie-D", "tie-E", "tie-F", "tie-G", "tie-H", "tie-I"].map((id) =>
        insertHost(`${s.group}-${id}`, { labels: zone("c"), cpus: 4 }),
      ),
      insertHost(`${s.group}-gone`, { labels: zone("a"), cpus: 64, state: "disconnected" }),
      insertHost(`${s.group}-new`, { labels: zone("a"), cpus: 64, state: "joined" }),
      insertHost(`${s.group}-cordoned`, { labels: zone("b"), cpus: 64 }),
      insertHost(`${s.group}-maint`, { labels: zone("b"), cpus: 64 }),
    ]);
    expect((await client.call("capacity.hosts.cordon", { node: `${s.group}-cordoned`, reason: "test" })).status).toBe(200);
    expect((await client.call("capacity.hosts.maintenance", { node: `${s.group}-maint`, on: true, reason: "test" })).status).toBe(200);
    // Some usage to begin with (and a held reservation, which counts).
    await reserve(
      vm(`${s.group}/pre-1`, { candidates: s.candidates, nodeLabels: { zone: "b" }, vcpus: 3, devices: { kind: "gpu", count: 1 } }),
    );
    await client.store.transaction((tx) =>
      port().hold(tx, { ...vm(`${s.group}/pre-2`, { candidates: s.candidates, nodeLabels: { zone: "a" }, vcpus: 5 }), ttlSeconds: 600 }),
    );
  }

  /** Requests of every kind the built-in filters and scorer look at, repeated until the fleet runs out of room. */
  const requests = (s: ReturnType<typeof scope>): Omit<PlacementRequest, "owner">[] => [
    { candidates: s.candidates, vcpus: 2, memoryMiB: 2048, diskGiB: 10 },
    { candidates: s.candidates, vcpus: 1, memoryMiB: 1024, diskGiB: 5, strategy: "pack" },
    { candidates: s.candidates, nodeLabels: { zone: "b" }, vcpus: 2, memoryMiB: 4096, diskGiB: 10, devices: { kind: "gpu", count: 2 } },
    { candidates: s.candidates, nodeLabels: { zone: "*" }, vcpus: 3, memoryMiB: 1024, diskGiB: 10, overcommit: { cpu: 1.5 } },
    { candidates: s.candidates, runtime: "qemu-microvm", vcpus: 1, memoryMiB: 512, diskGiB: 10 },
    {
      candidates: s.candidates,
      vcpus: 1,
      memoryMiB: 12000,
      diskGiB: 1,
      overcommit: { memory: 2 },
      antiAffinity: { group: `${s.group}/db` },
    },
    { candidates: s.candidates, vcpus: 4, memoryMiB: 1024, diskGiB: 40, strategy: "pack", devices: { kind: "gpu", count: 1 } },
    { candidates: s.candidates, nodeLabels: { zone: "c" }, vcpus: 1, memoryMiB: 1024, diskGiB: 10 },
  ];

  for (const [name, ports] of [
    ["the built-ins only: the best few hosts read", () => builtinPort()],
    ["with a plugin's scorer: every fitting host read", () => port()],
  ] as const) {
    it(`${name}: every reserve books the host capacity.explain (every host judged) picks, until none is left`, async () => {
      const s = scope();
      await mixedFleet(s);
      let placements = 0;
      for (let round = 0; round < 8; round++) {
        for (const [i, request] of requests(s).entries()) {
          const explained = await client.store.transaction((tx) => ports().explain(tx, request));
          const result = await client.store.transaction((tx) => ports().reserve(tx, { ...request, owner: `${s.group}/${round}/${i}` }));
          expect(placedOn(result) ?? null).toBe(explained.pick);
          if ("placed" in result) placements++;
          // An unplaceable request is explained by every host, once each, as explain explains it.
          else
            expect(result.unplaceable.rejections).toEqual(
              explained.verdicts.map((v) => (v.accepted ? expect.anything() : { nodeId: v.nodeId, filter: v.filter, reason: v.reason })),
            );
        }
      }
      // The fleet filled up on the way: both answers were seen.
      expect(placements).toBeGreaterThan(10);
      expect(placements).toBeLessThan(8 * requests(s).length);
    });
  }

  it("when a plugin's filter refuses the best few hosts, the reserve goes on to the next ones", async () => {
    const s = scope();
    const picky = betterCompute({
      modules: [capacity()],
      scheduler: {
        plugins: [
          defineSchedulerPlugin({
            id: "picky",
            filters: [{ name: "flaky", filter: (host: HostView) => host.labels.flaky !== "yes" || "flaky hardware" }],
          }),
        ],
      },
    });
    const pickyPort = () => picky.moduleContext("agents", env, client.store).capacity;
    // Twelve empty flaky hosts outrank the one half-used sound host when spreading.
    const flaky = await Promise.all(
      Array.from({ length: 12 }, (_, i) => insertHost(`${s.group}-flaky-${i}`, { labels: { ...s.labels, flaky: "yes" } })),
    );
    const sound = await insertHost(`${s.group}-sound`, { labels: s.labels, cpus: 4 });
    const first = await client.store.transaction((tx) => pickyPort().reserve(tx, vm(`${s.group}/a`, { candidates: s.candidates })));
    expect(placedOn(first)).toBe(sound);
    const second = await client.store.transaction((tx) => pickyPort().reserve(tx, vm(`${s.group}/b`, { candidates: s.candidates })));
    expect(placedOn(second)).toBe(sound);
    // Full now: every host says why not, once.
    const third = await client.store.transaction((tx) => pickyPort().reserve(tx, vm(`${s.group}/c`, { candidates: s.candidates })));
    expect(third).toEqual({
      unplaceable: {
        rejections: expect.arrayContaining([
          { nodeId: sound, filter: "fits", reason: "needs 2 vCPUs, 0 free of 4 (overcommit 1.0)" },
          ...flaky.map((nodeId) => ({ nodeId, filter: "picky/flaky", reason: "flaky hardware" })),
        ]),
      },
    });
    expect("unplaceable" in third && third.unplaceable.rejections).toHaveLength(13);
  });
});

describe("holds", () => {
  it("a hold books capacity ahead of an instance, a reserve naming it takes it over, a release frees it", async () => {
    const s = scope();
    const host = await insertHost(`${s.group}-h`, { labels: s.labels, cpus: 4 });
    const held = await client.call("capacity.holds.create", {
      candidates: s.candidates,
      vcpus: 3,
      memoryMiB: 2048,
      diskGiB: 10,
      ttlSeconds: 600,
    });
    expect(held.body).toMatchObject({ placed: { nodeId: host } });
    const holdId = held.body.placed.reservationId as string;
    // Held capacity is not free for others.
    expect(await reserve(vm(`${s.group}/other`, { candidates: s.candidates }))).toEqual({
      unplaceable: { rejections: [{ nodeId: host, filter: "fits", reason: "needs 2 vCPUs, 1 free of 4 (overcommit 1.0)" }] },
    });
    // More than the hold holds is refused; what fits in it takes it over.
    await expect(reserve(vm(`${s.group}/vm`, { candidates: s.candidates, vcpus: 4, holdId }))).rejects.toMatchObject({
      code: "FAILED_PRECONDITION",
    });
    expect(await reserve(vm(`${s.group}/vm`, { candidates: s.candidates, vcpus: 3, holdId }))).toEqual({
      placed: { nodeId: host, reservationId: holdId, atoms: [] },
    });
    const after = (await client.call("capacity.hosts.get", { node: host })).body.reservationList;
    expect(after).toMatchObject([{ id: holdId, owner: `${s.group}/vm`, state: "active", expiresAt: null }]);
    // Consumed: it is no longer a hold.
    expect((await client.call("capacity.holds.release", { id: holdId })).body.code).toBe("NOT_FOUND");

    const second = await client.call("capacity.holds.create", {
      candidates: s.candidates,
      vcpus: 1,
      memoryMiB: 1024,
      diskGiB: 10,
      ttlSeconds: 600,
    });
    expect((await client.call("capacity.holds.release", { id: second.body.placed.reservationId })).body).toEqual({
      id: second.body.placed.reservationId,
      released: true,
    });
    expect((await client.call("capacity.hosts.get", { node: host })).body.used.vcpus).toBe(3);
  });

  it("an expired hold counts for nothing (by the database's clock)", async () => {
    const s = scope();
    const host = await insertHost(`${s.group}-h`, { labels: s.labels, cpus: 2 });
    const held = await client.store.transaction((tx) =>
      port().hold(tx, { ...vm(`${s.group}/hold`, { candidates: s.candidates }), ttlSeconds: 1 }),
    );
    expect(placedOn(held)).toBe(host);
    await expect
      .poll(async () => placedOn(await reserve(vm(`${s.group}/vm`, { candidates: s.candidates }))), { timeout: 10_000, interval: 250 })
      .toBe(host);
  });
});

describe("racing reserves", () => {
  it("100 concurrent reserves for 10 slots: exactly 10 placed, no host over its capacity", async () => {
    const s = scope();
    // 5 hosts of 4 vCPUs, 2 vCPUs each: 10 slots (rows inserted directly).
    const hosts = await Promise.all(Array.from({ length: 5 }, (_, i) => insertHost(`${s.group}-${i}`, { labels: s.labels, cpus: 4 })));
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        client.store.transaction((tx) => port().reserve(tx, vm(`${s.group}/vm-${i}`, { candidates: s.candidates }))),
      ),
    );
    expect(results.filter((r) => "placed" in r)).toHaveLength(10);
    const perHost = await client.store.db.execute(sql`
      SELECT node_id, sum(vcpus)::int AS vcpus, count(*)::int AS n FROM capacity_reservations
      WHERE node_id = ANY(${`{${hosts.join(",")}}`}::text[]) AND state = 'active' GROUP BY node_id ORDER BY node_id`);
    expect(perHost.rows).toEqual(hosts.sort().map((node_id) => ({ node_id, vcpus: 4, n: 2 })));
  });
});

describe("the port's wiring", () => {
  it("without a capacity module ctx.capacity says so; two modules providing it are refused at betterCompute()", async () => {
    const bare = betterCompute({});
    await expect(
      client.store.transaction((tx) => bare.moduleContext("agents", env, client.store).capacity.reserve(tx, vm("x"))),
    ).rejects.toMatchObject({ code: "FAILED_PRECONDITION", message: expect.stringContaining("no capacity module is registered") });
    const another = defineModule({
      id: "other-capacity",
      ports: { capacity: () => bare.moduleContext("agents", env, client.store).capacity },
    });
    const refusal = (() => {
      try {
        betterCompute({ modules: [capacity(), another] });
      } catch (err) {
        return err;
      }
    })();
    expect(refusal).toMatchObject({
      code: "INVALID_CONFIG",
      message: "capacity is provided by more than one module: capacity, other-capacity",
    });
  });
});
