// VMs: the placer over a simulated fleet. 1,000 hosts are bc_nodes rows inserted directly
// (SIMULATED: no agent behind them; 32 vCPUs, 128 GiB, 2 TB and 4 GPUs each as if reported in a
// hello; one in ten cordoned, one in twenty disconnected, a label per rack), then placements are
// booked through ctx.capacity.reserve, each in its own transaction: one at a time, then 8 in
// flight, with spread and pack, and capacity.explain dry runs. Figures: placements per second,
// each placement's latency (p50/p99) and Postgres round trips per placement (the embedded
// PGlite's counter). The control plane runs in this process (inProcessControlPlane: the real
// betterCompute with capacity() on PGlite).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { processesNaming } from "../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage } from "../agent/runtimes/microvm/image.ts";
import { deleteNetns, netnsName } from "../agent/runtimes/microvm/network.ts";
import { capacity } from "../plugins/capacity/index.ts";
import { startBcd, type BcdProcess } from "../local/bcd-process.ts";
import { startStack, type Stack } from "../local/stack.ts";
import type { PlacementRequest, PlacementResult } from "better-compute/core";
import { inProcessControlPlane, type SimControlPlane } from "../testing/metal-sim-control-plane.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { benchDataDir, callApi, mapLimit } from "./stack.ts";

const HOSTS = 1000;
const PLACEMENTS = 500;
const EXPLAINS = 50;

export const vmsSection: BenchSection = {
  id: "vms",
  title: "VMs: placement over 1,000 simulated hosts; real guests on a real bcd node (create → running, memory per guest)",
  async run(ctx: BenchContext) {
    await placementBench(ctx);
    await guestsBench(ctx);
  },
};

async function placementBench(ctx: BenchContext): Promise<void> {
  ctx.log(`one process: PGlite and the control plane (capacity module); ${HOSTS} hosts inserted as rows (SIMULATED, no agents)`);
  ctx.log("PGlite runs one transaction at a time: placements in flight queue for it (a real Postgres runs them side by side)");
  const cp: SimControlPlane = await inProcessControlPlane({ modules: [capacity()] });
  try {
    await insertHosts(cp);
    const port = cp.compute!.moduleContext("capacity", {}, cp.store).capacity;
    const rows: string[][] = [];
    const phase = async (name: string, count: number, inFlight: number, request: (i: number) => PlacementRequest) => {
      const latencies: number[] = [];
      let placed = 0;
      let refused: PlacementResult | undefined;
      const trips = cp.roundTrips();
      const t0 = performance.now();
      await mapLimit(
        Array.from({ length: count }, (_, i) => i),
        inFlight,
        async (i) => {
          const started = performance.now();
          const result: PlacementResult = await cp.store.transaction((tx) => port.reserve(tx, request(i)));
          latencies.push(performance.now() - started);
          if ("placed" in result) placed++;
          else refused ??= result;
        },
      );
      const seconds = (performance.now() - t0) / 1000;
      if (placed !== count)
        throw new Error(`${name}: ${count - placed} of ${count} placements found no host, e.g. ${JSON.stringify(refused).slice(0, 300)}`);
      rows.push([
        name,
        String(count),
        String(inFlight),
        (count / seconds).toFixed(0),
        ms(percentile(latencies, 0.5)),
        ms(percentile(latencies, 0.99)),
        ((cp.roundTrips() - trips) / count).toFixed(1),
      ]);
    };
    const vm =
      (prefix: string, over: Partial<PlacementRequest> = {}) =>
      (i: number) => ({
        owner: `bench/${prefix}/${i}`,
        vcpus: 2,
        memoryMiB: 4096,
        diskGiB: 40,
        ...over,
      });
    // One per host of rack r4 (50 hosts): first, before packing fills some of them.
    await phase(
      "rack r4, anti-affinity, 8 in flight",
      50,
      8,
      vm("anti", { candidates: { labels: { rack: "r4" } }, antiAffinity: { group: "db" } }),
    );
    await phase("spread, one at a time", PLACEMENTS, 1, vm("spread-1"));
    await phase("spread, 8 in flight", PLACEMENTS, 8, vm("spread-8"));
    await phase("pack, 8 in flight", PLACEMENTS, 8, vm("pack-8", { strategy: "pack" }));
    await phase("2 GPUs, 8 in flight", PLACEMENTS, 8, vm("gpu", { devices: { kind: "gpu", count: 2 } }));
    ctx.table(["placements", "count", "in flight", "per s", "p50", "p99", "round trips each"], rows);

    const explainMs: number[] = [];
    for (let i = 0; i < EXPLAINS; i++) {
      const started = performance.now();
      await cp.store.transaction((tx) => port.explain(tx, { vcpus: 2, memoryMiB: 4096, diskGiB: 40 }));
      explainMs.push(performance.now() - started);
    }
    ctx.log(
      `capacity.explain over ${HOSTS} hosts (a verdict each), ${EXPLAINS} runs: p50 ${ms(percentile(explainMs, 0.5))}, p99 ${ms(percentile(explainMs, 0.99))}`,
    );
  } finally {
    await cp.stop();
  }
}

/** 1,000 hosts as one INSERT: 20 racks of 50; one in ten cordoned, one in twenty disconnected. */
async function insertHosts(cp: SimControlPlane): Promise<void> {
  const resources = {
    cpus: 32,
    memoryMiB: 131072,
    diskGiB: 2000,
    devices: [0, 1, 2, 3].map((n) => ({ id: `gpu${n}`, kind: "gpu", model: "simulated" })),
  };
  await cp.store.db.execute(sql`
    INSERT INTO bc_nodes (id, role, public_key, labels, attestor, state, resources)
    SELECT 'h-' || lpad(i::text, 4, '0'), 'node', 'bench-simulated', jsonb_build_object('rack', 'r' || (i % 20)),
           'bench', CASE WHEN i % 20 = 7 THEN 'disconnected' ELSE 'connected' END, ${JSON.stringify(resources)}::jsonb
    FROM generate_series(0, ${HOSTS - 1}) AS i`);
  await cp.store.db.execute(sql`
    INSERT INTO capacity_hosts (node_id, cordoned, reason)
    SELECT 'h-' || lpad(i::text, 4, '0'), true, 'bench: cordoned' FROM generate_series(0, ${HOSTS - 1}) AS i WHERE i % 10 = 3`);
}

const ms = (v: number) => `${v.toFixed(1)} ms`;

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0;
}

// ---------------------------------------------------------------- real guests: create → running, memory per guest
// The local stack npm start runs (startStack: PGlite, bridge, wrangler dev serving the default
// deployment, with capacity and vps) and ONE REAL `bcd start --role node` process on this machine
// booting REAL guests with the qemu-microvm runtime (KVM when a probe boot works, TCG otherwise:
// printed). A host pool of that one host, its CPUs overcommitted so it takes every guest
// (1 vCPU, 128 MiB, 1 GiB each), a tenant, and instances created through the API with the
// tenant's key: first one after another (each waited for before the next), then two at once.
// Create → running is from the create request to the first vps.instances.get that says running
// (polled every 100 ms). Memory per guest is the VmRSS of each running guest's VMM process.

const GUEST_POOL_LABELS = { "bc.dev/pool": "bench-vms" };
const GUEST_MEMORY_MIB = 128;
const GUEST_TIMEOUT_MS = 300_000;

/** A running stack with one real bcd node in a host pool. */
interface GuestWorld {
  /** The stack, with the tenant's key in place of the admin key (callApi(world.tenant, ...) calls as the tenant). */
  tenant: Stack;
  /** Where the qemu-microvm runtime keeps each guest's work dir (<dir>/<instance id>). */
  guestsDir: string;
  /** The lines bcd has written to stderr so far (its JSON log). */
  bcdLog: () => string[];
}

async function guestsBench(ctx: BenchContext): Promise<void> {
  const guests = benchVmsGuests();
  await withRealNode(ctx, guests, async (world) => {
    const rows: string[][] = [];
    const sequential = await createToRunning(world, "one after another", guests, 1, rows);
    const bcdLog = world.bcdLog();
    const vmm = bcdLog.map((l) => /"message":"microvm running".*"vmm":"([^"]+)"/.exec(l)?.[1]).find(Boolean);
    ctx.log(`guests run as ${vmm ?? "(bcd did not say)"}`);
    await memoryPerGuest(ctx, world, sequential);
    await deleteGuests(world, sequential);
    await deleteGuests(world, await createToRunning(world, "2 at once", guests, 2, rows));
    ctx.table(["create → running", "guests", "p50", "p99", "max", "of which the boot, p50"], rows);
  });
}

/** Creates `count` instances, `atOnce` at a time, each waited for until running; adds a row of figures. Answers their ids. */
async function createToRunning(world: GuestWorld, name: string, count: number, atOnce: number, rows: string[][]): Promise<string[]> {
  const latencies: number[] = [];
  const ids: string[] = [];
  for (let first = 0; first < count; first += atOnce) {
    const batch = Array.from({ length: Math.min(atOnce, count - first) }, (_, i) => first + i);
    await Promise.all(
      batch.map(async (i) => {
        const started = performance.now();
        const { id } = await callApi<{ id: string }>(world.tenant, "vps.instances.create", {
          pool: "bench-vms",
          flavor: "bench-vms-1",
          name: `${name.replaceAll(" ", "-")}-${i}`,
          userData: `#!/bin/sh\necho bench ${i}\n`,
        });
        ids.push(id);
        await untilState(world, id, "running");
        latencies.push(performance.now() - started);
      }),
    );
  }
  const bcdLog = world.bcdLog();
  const boots = ids.map((id) => bootMs(bcdLog, id)).filter((v) => v !== undefined);
  rows.push([
    name,
    String(count),
    ms(percentile(latencies, 0.5)),
    ms(percentile(latencies, 0.99)),
    ms(Math.max(...latencies)),
    boots.length ? ms(percentile(boots, 0.5)) : "-",
  ]);
  return ids;
}

/** The guest's boot as bcd logged it: from "microvm starting" (the VMM about to start) to "microvm running" (its report read). */
function bootMs(bcdLog: string[], id: string): number | undefined {
  const entries = bcdLog.flatMap((line) => {
    try {
      return [JSON.parse(line) as { time?: string; message?: string; name?: string }];
    } catch {
      return []; // not one of its JSON log lines
    }
  });
  const at = (message: string) => {
    const entry = entries.find((e) => e.message === message && e.name === id);
    return entry?.time ? Date.parse(entry.time) : undefined;
  };
  const [started, running] = [at("microvm starting"), at("microvm running")];
  return started !== undefined && running !== undefined ? running - started : undefined;
}

/** VmRSS of each running guest's VMM process (/proc/<pid>/status), beside the memory the guest was given. */
async function memoryPerGuest(ctx: BenchContext, world: GuestWorld, ids: string[]): Promise<void> {
  const rssMiB: number[] = [];
  for (const id of ids) {
    const [pid] = await processesNaming(path.join(world.guestsDir, id));
    if (pid === undefined) throw new Error(`no VMM process names the work dir of running guest ${id}`);
    const kib = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
    if (kib === undefined) throw new Error(`/proc/${pid}/status has no VmRSS`);
    rssMiB.push(Number(kib) / 1024);
  }
  const average = rssMiB.reduce((a, b) => a + b, 0) / rssMiB.length;
  ctx.table(
    ["memory per guest (VMM VmRSS)", "guests", "configured", "average", "max"],
    [["running, idle after boot", String(ids.length), `${GUEST_MEMORY_MIB} MiB`, mib(average), mib(Math.max(...rssMiB))]],
  );
}

async function deleteGuests(world: GuestWorld, ids: string[]): Promise<void> {
  await Promise.all(ids.map((id) => callApi(world.tenant, "vps.instances.delete", { id })));
  for (const id of ids) await untilState(world, id, "deleted");
}

async function untilState(world: GuestWorld, id: string, state: string): Promise<void> {
  const deadline = Date.now() + GUEST_TIMEOUT_MS;
  for (;;) {
    const got = await callApi<{ state: string; lastError?: unknown }>(world.tenant, "vps.instances.get", {
      id,
    });
    if (got.state === state) return;
    if (got.state === "failed")
      throw new Error(`instance ${id} failed: ${JSON.stringify(got.lastError)}\nbcd said:\n${world.bcdLog().slice(-10).join("\n")}`);
    if (Date.now() > deadline) throw new Error(`instance ${id} not ${state} after ${GUEST_TIMEOUT_MS / 1000} s (${got.state})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The local stack, the guest image, one real bcd node joined to a host pool that takes `guests` guests, and a tenant. */
async function withRealNode(ctx: BenchContext, guests: number, fn: (world: GuestWorld) => Promise<void>): Promise<void> {
  const imageStarted = performance.now();
  const image = await ensureGuestImage();
  ctx.log(
    `guest image ready in ${((performance.now() - imageStarted) / 1000).toFixed(1)} s (${image.manifest.digest.slice(0, 12)}; built when not cached)`,
  );
  const dataDir = benchDataDir("vms");
  const runtimeDir = path.join(dataDir, "runtime");
  const guestsDir = path.join(runtimeDir, "qemu-microvm");
  let stack: Stack | undefined;
  let bcd: BcdProcess | undefined;
  try {
    const started = performance.now();
    stack = await startStack({ dataDir, databaseUrl: ctx.databaseUrl });
    ctx.log(
      `stack up in ${((performance.now() - started) / 1000).toFixed(1)} s (the default deployment at ${stack.url}); one real bcd node`,
    );
    const cpus = os.cpus().length;
    await callApi(stack, "vps.pools.create", {
      id: "bench-vms",
      class: "host",
      hosts: { labels: GUEST_POOL_LABELS },
      runtime: "qemu-microvm",
      overcommit: { cpu: Math.max(1, Math.ceil(guests / cpus)) },
    });
    await callApi(stack, "vps.flavors.create", { id: "bench-vms-1", pool: "bench-vms", vcpus: 1, memoryMiB: GUEST_MEMORY_MIB, diskGiB: 1 });
    await callApi(stack, "vps.tenants.create", { id: "bench", name: "Bench" });
    await callApi(stack, "vps.quotas.set", {
      tenant: "bench",
      pool: "bench-vms",
      instances: guests,
      vcpus: guests,
      memoryMiB: guests * GUEST_MEMORY_MIB,
      diskGiB: guests,
    });
    const key = await callApi<{ id: string; key: string }>(stack, "iam.apiKeys.create", { name: "bench tenant", roles: ["vps-tenant"] });
    await callApi(stack, "vps.tenants.addMember", { tenant: "bench", principal: `apikey:${key.id}` });

    const { token } = await callApi<{ token: string }>(stack, "joinTokens.create", { role: "node", labels: GUEST_POOL_LABELS });
    bcd = startBcd({
      url: stack.url,
      role: "node",
      stateDir: path.join(dataDir, "agent"),
      token,
      args: ["--runtime-dir", runtimeDir],
    });
    const bcdLog = () => bcd!.output("stderr").split("\n").filter(Boolean);
    const deadline = Date.now() + 60_000;
    for (;;) {
      const { hosts } = await callApi<{ hosts: { schedulable: boolean }[] }>(stack, "capacity.hosts.list", { labels: GUEST_POOL_LABELS });
      if (hosts.some((h) => h.schedulable)) break;
      if (Date.now() > deadline) throw new Error(`bcd did not connect within 60 s:\n${bcdLog().slice(-10).join("\n")}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    await fn({ tenant: { ...stack, adminKey: key.key }, guestsDir, bcdLog });
  } finally {
    await bcd?.stop();
    // Guests outlive bcd: a failed run's are killed here, with their namespaces.
    for (const pid of await processesNaming(runtimeDir)) process.kill(pid, "SIGKILL");
    for (const id of fs.existsSync(guestsDir) ? fs.readdirSync(guestsDir) : []) await deleteNetns(netnsName(id)).catch(() => {});
    await stack?.stop();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

function benchVmsGuests(): number {
  const raw = process.env.BENCH_VMS_GUESTS;
  const value = raw === undefined || raw === "" ? 6 : Number(raw);
  if (!Number.isInteger(value) || value < 1) throw new Error(`BENCH_VMS_GUESTS must be a whole number above 0, got ${JSON.stringify(raw)}`);
  return value;
}

const mib = (v: number) => `${v.toFixed(0)} MiB`;
