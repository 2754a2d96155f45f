// VPS: N instances of one tenant, split across Hetzner Cloud, Hetzner Robot and Proxmox (their
// emulators, SIMULATED, over real HTTP and HTTPS on 127.0.0.1, with a realistic action duration),
// created and taken to running by the vps.instances reconciler, then deleted. The control plane
// runs in this process (inProcessControlPlane: the real betterCompute with vps() on PGlite); its
// reconcilers run on its own cron tick, each second, one pass at a time (a pass that takes longer
// is followed at once by the next). Per phase and provider: instances per second, each instance's
// time from request to done, provider calls per instance (the emulators' own counters) and
// Postgres round trips per instance.
import { sql, type SQL } from "drizzle-orm";
import { rows } from "better-compute/core";
import { hetznerCloudProvider } from "better-compute/hetzner-cloud";
import { hetznerRobotProvider } from "better-compute/hetzner-robot";
import { proxmoxProvider } from "better-compute/proxmox";
import { pinnedFetch } from "better-compute/proxmox/pinned-fetch";
import { startHetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import { EMULATED_PRODUCTS, ROBOT_LIMITS, startHetznerRobotEmulator } from "better-compute/testing/hetzner-robot";
import { startProxmoxEmulator } from "better-compute/testing/proxmox";
import { vps, type Fetch } from "better-compute/vps";
import { inProcessControlPlane, type SimControlPlane } from "../testing/metal-sim-control-plane.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { mapLimit } from "./stack.ts";

const TENANT = "bench";
const SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl bench@vps";
const POLL_MS = 250;
const PROGRESS_MS = 30_000;
const TIMEOUT_MS = 30 * 60_000;
/** Raised so the bench never waits on them (the real ones: 3600 requests refilled 1/s; Robot's per endpoint, e.g. 50 resets an hour). */
const HCLOUD_RATE_LIMIT = { limit: 100_000, refillPerSecond: 100 };
const ROBOT_LIMIT = { max: 100_000, intervalSeconds: 3600 };

interface Target {
  provider: "hetzner-cloud" | "hetzner-robot" | "proxmox";
  /** The account, its pool and its flavor share this id. */
  pool: string;
  instances: number;
  account: Record<string, unknown>;
  location?: string;
  offer: string;
  image: string;
  /** Provider calls answered so far (faults and refusals included), from the emulator's counters. */
  calls(): number;
}

const sum = (counts: Record<string, number>) => Object.values(counts).reduce((a, b) => a + b, 0);

export const vpsSection: BenchSection = {
  id: "vps",
  title: "VPS: instances created to running and deleted at the emulated Hetzner Cloud, Hetzner Robot and Proxmox",
  async run(ctx: BenchContext) {
    const { instances: total, actionMs } = ctx.vps;
    // Split as evenly as the count allows, the remainder to the first providers.
    const share = (i: number) => Math.floor(total / 3) + (i < total % 3 ? 1 : 0);
    const [hcloudCount, robotCount, pveCount] = [share(0), share(1), share(2)];

    const hcloud = await startHetznerCloudEmulator({ actionDurationMs: actionMs, rateLimit: HCLOUD_RATE_LIMIT });
    const robot = await startHetznerRobotEmulator({
      actionDurationMs: actionMs,
      limits: Object.fromEntries(Object.keys(ROBOT_LIMITS).map((endpoint) => [endpoint, ROBOT_LIMIT])),
      // Robot adopts servers already rented: one free box per instance.
      servers: Array.from({ length: Math.max(robotCount, 1) }, () => ({ product: "AX41-NVMe", dc: "FSN1-DC14" })),
    });
    const pve = await startProxmoxEmulator({ actionDurationMs: actionMs });
    let cp: SimControlPlane | undefined;
    try {
      ctx.log(
        `${total} instances (BENCH_VPS_INSTANCES): ${hcloudCount} Hetzner Cloud, ${robotCount} Hetzner Robot, ${pveCount} Proxmox; ` +
          `every action, boot and task takes ${actionMs} ms (BENCH_VPS_ACTION_MS)`,
      );
      ctx.log(
        `rate limits, raised for the bench: Hetzner Cloud ${HCLOUD_RATE_LIMIT.limit} requests refilled ${HCLOUD_RATE_LIMIT.refillPerSecond}/s ` +
          `(real: 3600, 1/s); Hetzner Robot ${ROBOT_LIMIT.max} calls per ${ROBOT_LIMIT.intervalSeconds} s on every endpoint ` +
          `(real: e.g. POST /reset ${ROBOT_LIMITS["POST /reset/{n}"]!.max} an hour); Proxmox none (PVE has none)`,
      );
      ctx.log("one process: PGlite, the control plane (vps module, reconciler on a 1 s tick) and the three emulators");

      // One fetch for every account (vps() takes one): the Proxmox emulator's certificate is pinned.
      const pinned = pinnedFetch({ spkiSha256: pve.spkiSha256 });
      const pveOrigin = new URL(pve.url).origin;
      const fetch: Fetch = (input, init) =>
        new URL(input instanceof Request ? input.url : String(input)).origin === pveOrigin
          ? pinned(input, init)
          : globalThis.fetch(input, init);
      cp = await inProcessControlPlane({
        modules: [vps({ providers: [hetznerCloudProvider, hetznerRobotProvider, proxmoxProvider], fetch })],
      });
      const call = cp.call;

      const all: Target[] = [
        {
          provider: "hetzner-cloud",
          pool: "hcloud",
          instances: hcloudCount,
          account: { token: hcloud.token, endpoint: hcloud.url },
          location: "fsn1",
          offer: "cx22",
          image: "ubuntu-24.04",
          calls: () => sum(hcloud.counters.calls),
        },
        {
          provider: "hetzner-robot",
          pool: "robot",
          instances: robotCount,
          account: { user: robot.user, password: robot.password, endpoint: robot.url, products: EMULATED_PRODUCTS },
          offer: "AX41-NVMe",
          image: "rescue-linux",
          calls: () => sum(robot.counters.calls),
        },
        {
          provider: "proxmox",
          pool: "proxmox",
          instances: pveCount,
          account: {
            baseUrl: pve.url,
            node: pve.node,
            tokenId: pve.tokenId,
            tokenSecret: pve.tokenSecret,
            tls: { spkiSha256: pve.spkiSha256 },
          },
          location: pve.node,
          offer: "small",
          image: "9000",
          calls: () => sum(pve.counters.calls),
        },
      ];
      const targets = all.filter((t) => t.instances > 0);

      await call("vps.tenants.create", { id: TENANT });
      await call("vps.sshKeys.create", { tenant: TENANT, name: "bench", publicKey: SSH_KEY });
      for (const t of targets) {
        await call("vps.accounts.create", { id: t.pool, provider: t.provider, config: t.account });
        await call("vps.pools.create", { id: t.pool, account: t.pool, ...(t.location ? { location: t.location } : {}) });
        await call("vps.flavors.create", { id: t.pool, pool: t.pool, offer: t.offer, image: t.image });
        await call("vps.quotas.set", {
          tenant: TENANT,
          pool: t.pool,
          instances: t.instances,
          vcpus: 100_000,
          memoryMiB: 1 << 30,
          diskGiB: 1 << 30,
        });
      }
      const plan = targets.flatMap((t) => Array.from({ length: t.instances }, (_, i) => ({ id: `${t.pool}-${i + 1}`, pool: t.pool })));

      const rows: string[][] = [];
      const phases = [
        {
          name: "create → running",
          start: (i: { id: string; pool: string }) =>
            call("vps.instances.create", { tenant: TENANT, id: i.id, pool: i.pool, flavor: i.pool, name: i.id, sshKeys: ["bench"] }),
          target: "running",
        },
        { name: "delete → deleted", start: (i: { id: string }) => call("vps.instances.delete", { id: i.id }), target: "deleted" },
      ];
      for (const phase of phases) {
        const before = { calls: targets.map((t) => t.calls()), trips: cp.roundTrips(), observer: observerTrips };
        // The phase's requests at once (8 in flight), as a tenant's scripts would send them.
        await mapLimit(plan, 8, phase.start);
        await allIn(cp, total, phase.target, ctx);
        const trips = cp.roundTrips() - before.trips - (observerTrips - before.observer);
        const timings = await phaseTimings(cp, phase.target);
        for (const [i, t] of targets.entries()) {
          const calls = t.calls() - before.calls[i]!;
          rows.push(row(phase.name, t.provider, timings.get(t.pool)!, calls / t.instances));
        }
        const allCalls = targets.reduce((n, t, i) => n + t.calls() - before.calls[i]!, 0);
        rows.push(row(phase.name, "all", timings.get("all")!, allCalls / total, trips / total));
      }
      ctx.table(
        ["phase", "provider", "instances", "wall s", "instances/s", "p50 s", "max s", "provider calls/instance", "round trips/instance"],
        rows,
      );
      ctx.log(
        "wall s: from the phase's first request to its last instance done (database time); p50/max s: each instance's own request to done",
      );
      ctx.log(
        "provider calls: every HTTP request the emulator answered during the phase (task and action polls included); round trips: the embedded PGlite's, the bench's polling subtracted",
      );
    } finally {
      await cp?.stop();
      await Promise.all([hcloud.stop(), robot.stop(), pve.stop()]);
    }
  },
};

interface Timing {
  instances: number;
  wallSeconds: number;
  p50: number;
  max: number;
}

function row(phase: string, provider: string, t: Timing, callsPerInstance: number, tripsPerInstance?: number): string[] {
  return [
    phase,
    provider,
    String(t.instances),
    t.wallSeconds.toFixed(1),
    (t.instances / t.wallSeconds).toFixed(2),
    t.p50.toFixed(1),
    t.max.toFixed(1),
    callsPerInstance.toFixed(1),
    tripsPerInstance === undefined ? "-" : tripsPerInstance.toFixed(0),
  ];
}

let observerTrips = 0;

/** Runs a read of the bench's own, its round trips kept out of the figures. */
async function observe<T extends object = Record<string, unknown>>(cp: SimControlPlane, query: SQL): Promise<T[]> {
  const before = cp.roundTrips();
  const found = await rows<T>(cp.store.db, query);
  observerTrips += cp.roundTrips() - before;
  return found;
}

/**
 * Per pool and overall: from the phase's first request (the instance's created_at, or the delete's
 * requested event) to the last instance in `state` (state_changed_at), and each instance's own.
 */
async function phaseTimings(cp: SimControlPlane, state: string): Promise<Map<string, Timing>> {
  const since =
    state === "running"
      ? sql`i.created_at`
      : sql`(SELECT max(e.occurred_at) FROM bc_events e WHERE e.subject = 'vps/instances/' || i.id AND e.type = 'vps.instance.requested')`;
  const found = await observe<{ pool: string; instances: number; wall: number; p50: number; max: number }>(
    cp,
    sql`
      WITH each AS (
        SELECT i.pool_id AS pool, ${since} AS asked, i.state_changed_at AS done FROM vps_instances i WHERE i.state = ${state}
      )
      SELECT coalesce(pool, 'all') AS pool, count(*)::int AS instances,
             extract(epoch FROM max(done) - min(asked))::float8 AS wall,
             percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done - asked))::float8 AS p50,
             max(extract(epoch FROM done - asked))::float8 AS max
      FROM each GROUP BY ROLLUP (pool)`,
  );
  return new Map(found.map((r) => [r.pool, { instances: r.instances, wallSeconds: r.wall, p50: r.p50, max: r.max }]));
}

/** Waits until every instance is in `state`; a failed one fails the run, with its error. */
async function allIn(cp: SimControlPlane, total: number, state: string, ctx: BenchContext): Promise<void> {
  const started = performance.now();
  let reported = started;
  for (;;) {
    const found = await observe<{ state: string; n: number }>(cp, sql`SELECT state, count(*)::int AS n FROM vps_instances GROUP BY state`);
    const counts = Object.fromEntries(found.map((r) => [r.state, r.n]));
    if (counts[state] === total) return;
    if (counts.failed) {
      const failed = await observe(cp, sql`SELECT id, last_error FROM vps_instances WHERE state = 'failed' ORDER BY id LIMIT 3`);
      throw new Error(`${counts.failed} instance(s) failed: ${JSON.stringify(counts)}; ${failed.map((r) => JSON.stringify(r)).join("; ")}`);
    }
    if (performance.now() - reported >= PROGRESS_MS) {
      reported = performance.now();
      ctx.log(`${Math.round((reported - started) / 1000)} s: ${JSON.stringify(counts)}`);
    }
    if (performance.now() - started > TIMEOUT_MS)
      throw new Error(`not all ${total} instances reached ${state} in ${TIMEOUT_MS / 1000} s: ${JSON.stringify(counts)}`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}
