// The CapacityPort (ctx.capacity): reads hosts, asks the placer, and books in the caller's
// transaction. The guard against overbooking is in SQL: the chosen host's capacity_hosts row is
// locked (FOR UPDATE) and its sums read again under the lock before the reservation is written;
// a host that filled up meanwhile is given up (its lock too: each attempt is a savepoint) for the
// next best. Holds expire by compute_now(), never the isolate's clock.
import { sql } from "drizzle-orm";
import type { SchedulerPluginDefinition } from "better-compute";
import {
  ComputeError,
  invalidArgument,
  type CapacityPort,
  type HostView,
  type ModuleContext,
  type PlacementRejection,
  type PlacementRequest,
  type PlacementResult,
  type Tx,
} from "better-compute/core";
import { admit, parseRequest, placer, rank, judge, type PlacerDefaults, type Placer, type Verdict } from "./placer.ts";

/** A reservation counts while active, or while its hold has not expired. */
const LIVE = sql`(r.state = 'active' OR r.expires_at > compute_now())`;

interface HostRow {
  id: string;
  hostname: string | null;
  labels: Record<string, string>;
  state: HostView["state"];
  resources: { cpus: number; memoryMiB: number; diskGiB: number; devices?: HostView["devices"] } | null;
  cordoned: boolean;
  maintenance: boolean;
  reason: string | null;
  used_vcpus: string | number;
  used_memory_mib: string | number;
  used_disk_gib: string | number;
  used_devices: string[][] | null;
  groups: string[] | null;
  reservations: string | number;
}

/** Hosts (live nodes of role node), with the operator's settings and their live reservations summed. */
export async function readHosts(tx: Tx, which: { labels?: Record<string, string>; nodeId?: string } = {}): Promise<HostView[]> {
  const rows = await tx.execute(sql`
    SELECT n.id, n.hostname, n.labels, n.state, n.resources,
           coalesce(h.cordoned, false) AS cordoned, coalesce(h.maintenance, false) AS maintenance, h.reason,
           coalesce(u.vcpus, 0) AS used_vcpus, coalesce(u.memory_mib, 0) AS used_memory_mib, coalesce(u.disk_gib, 0) AS used_disk_gib,
           u.devices AS used_devices, u.groups, coalesce(u.n, 0) AS reservations
    FROM bc_nodes n
    LEFT JOIN capacity_hosts h ON h.node_id = n.id
    LEFT JOIN (
      SELECT r.node_id, sum(r.vcpus) AS vcpus, sum(r.memory_mib) AS memory_mib, sum(r.disk_gib) AS disk_gib,
             jsonb_agg(to_jsonb(r.devices)) AS devices, count(*) AS n,
             array_remove(array_agg(DISTINCT r.anti_affinity_group), NULL) AS groups
      FROM capacity_reservations r WHERE ${LIVE} GROUP BY r.node_id
    ) u ON u.node_id = n.id
    WHERE n.role = 'node' AND n.revoked_at IS NULL
      AND n.labels @> ${JSON.stringify(which.labels ?? {})}::jsonb
      AND (${which.nodeId ?? null}::text IS NULL OR n.id = ${which.nodeId ?? null})
    ORDER BY n.id`);
  return (rows.rows as unknown as HostRow[]).map((r) => ({
    nodeId: r.id,
    hostname: r.hostname,
    labels: r.labels,
    state: r.state,
    cordoned: r.cordoned,
    maintenance: r.maintenance,
    reason: r.reason,
    capacity: r.resources ? { vcpus: r.resources.cpus, memoryMiB: r.resources.memoryMiB, diskGiB: r.resources.diskGiB } : null,
    devices: r.resources?.devices ?? [],
    used: { vcpus: Number(r.used_vcpus), memoryMiB: Number(r.used_memory_mib), diskGiB: Number(r.used_disk_gib) },
    usedDevices: (r.used_devices ?? []).flat(),
    groups: r.groups ?? [],
    reservations: Number(r.reservations),
  }));
}

interface ReservationRow {
  id: string;
  node_id: string;
  owner: string;
  state: "held" | "active";
  vcpus: number;
  memory_mib: number;
  disk_gib: number;
  devices: string[];
}

const placed = (r: ReservationRow): PlacementResult => ({ placed: { nodeId: r.node_id, reservationId: r.id, atoms: r.devices } });

/** The owner's live reservation; an expired hold of the owner's is deleted on the way (it counts for nothing). */
async function liveOf(tx: Tx, owner: string): Promise<ReservationRow | undefined> {
  await tx.execute(sql`DELETE FROM capacity_reservations WHERE owner = ${owner} AND state = 'held' AND expires_at <= compute_now()`);
  const rows = await tx.execute(sql`
    SELECT id, node_id, owner, state, vcpus, memory_mib, disk_gib, devices FROM capacity_reservations WHERE owner = ${owner}`);
  return rows.rows[0] as ReservationRow | undefined;
}

/** Thrown inside an attempt's savepoint to give the host up (and its lock with the savepoint). */
class GaveUp {
  constructor(readonly rejection?: PlacementRejection) {}
}

export function capacityPort(ctx: ModuleContext, defaults: PlacerDefaults = {}): CapacityPort {
  const currentPlacer = () => placer(ctx.registered.extensions<SchedulerPluginDefinition>("scheduler-plugin"));

  /** Places and writes the reservation (active, or held until ttlSeconds from now). */
  async function book(tx: Tx, req: PlacementRequest, p: Placer, ttlSeconds?: number): Promise<PlacementResult> {
    const { accepted, rejected } = rank(p, await readHosts(tx, { labels: req.candidates?.labels }), req);
    const rejections: PlacementRejection[] = rejected.map(({ nodeId, filter, reason }) => ({ nodeId, filter, reason }));
    for (const candidate of accepted) {
      try {
        return await tx.transaction(async (attempt) => {
          await attempt.execute(sql`INSERT INTO capacity_hosts (node_id) VALUES (${candidate.nodeId}) ON CONFLICT (node_id) DO NOTHING`);
          await attempt.execute(sql`SELECT 1 FROM capacity_hosts WHERE node_id = ${candidate.nodeId} FOR UPDATE`);
          // Under the lock, the host as it is now: whoever held the lock before has committed or rolled back.
          const [now] = await readHosts(attempt, { nodeId: candidate.nodeId });
          const verdict: Verdict = now
            ? judge(p, now, req)
            : { nodeId: candidate.nodeId, accepted: false, filter: "connected", reason: "revoked meanwhile" };
          if (!verdict.accepted) throw new GaveUp({ nodeId: verdict.nodeId, filter: verdict.filter, reason: verdict.reason });
          const id = `r-${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
          const inserted = await attempt.execute(sql`
            INSERT INTO capacity_reservations (id, node_id, owner, pool, vcpus, memory_mib, disk_gib, devices, anti_affinity_group, state, expires_at)
            VALUES (${id}, ${candidate.nodeId}, ${req.owner}, ${req.pool ?? null}, ${req.vcpus}, ${req.memoryMiB}, ${req.diskGiB},
                    ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(verdict.atoms)}::jsonb)), ${req.antiAffinity?.group ?? null},
                    ${ttlSeconds === undefined ? "active" : "held"},
                    CASE WHEN ${ttlSeconds ?? null}::float8 IS NULL THEN NULL ELSE compute_now() + make_interval(secs => ${ttlSeconds ?? 0}) END)
            ON CONFLICT (owner) DO NOTHING RETURNING id`);
          // The same owner booked in another transaction that committed first: that booking stands.
          if (inserted.rows.length === 0) throw new GaveUp();
          await ctx.events.publish(attempt, {
            type: ttlSeconds === undefined ? "capacity.reserved" : "capacity.held",
            subject: `capacity/hosts/${candidate.nodeId}`,
            data: {
              owner: req.owner,
              reservationId: id,
              vcpus: req.vcpus,
              memoryMiB: req.memoryMiB,
              diskGiB: req.diskGiB,
              devices: verdict.atoms,
            },
          });
          return { placed: { nodeId: candidate.nodeId, reservationId: id, atoms: verdict.atoms } };
        });
      } catch (err) {
        if (!(err instanceof GaveUp)) throw err;
        if (!err.rejection) {
          const theirs = await liveOf(tx, req.owner);
          if (theirs) return placed(theirs);
          continue;
        }
        rejections.push(err.rejection);
      }
    }
    return { unplaceable: { rejections } };
  }

  /** Turns a live hold into the owner's active reservation; the request must fit inside what it holds. */
  async function consumeHold(tx: Tx, req: PlacementRequest, holdId: string): Promise<PlacementResult> {
    const rows = await tx.execute(sql`
      SELECT id, node_id, owner, state, vcpus, memory_mib, disk_gib, devices FROM capacity_reservations r
      WHERE id = ${holdId} AND state = 'held' AND ${LIVE} FOR UPDATE`);
    const hold = rows.rows[0] as ReservationRow | undefined;
    if (!hold) throw new ComputeError("FAILED_PRECONDITION", `hold ${holdId} does not exist or has expired`, { holdId });
    if (
      req.vcpus > hold.vcpus ||
      req.memoryMiB > hold.memory_mib ||
      req.diskGiB > hold.disk_gib ||
      (req.devices?.count ?? 0) > hold.devices.length
    )
      throw new ComputeError("FAILED_PRECONDITION", `the request asks for more than hold ${holdId} holds`, { holdId });
    await tx.execute(sql`
      UPDATE capacity_reservations SET state = 'active', expires_at = NULL, owner = ${req.owner},
             anti_affinity_group = coalesce(${req.antiAffinity?.group ?? null}, anti_affinity_group), pool = coalesce(${req.pool ?? null}, pool)
      WHERE id = ${holdId}`);
    await ctx.events.publish(tx, {
      type: "capacity.reserved",
      subject: `capacity/hosts/${hold.node_id}`,
      data: { owner: req.owner, reservationId: hold.id, fromHold: true },
    });
    return placed(hold);
  }

  /** What reserve and hold share: checks, admission, the owner's existing booking. */
  async function prepare(tx: Tx, input: PlacementRequest) {
    const req = parseRequest(input, defaults);
    const p = currentPlacer();
    admit(p, req);
    return { req, p, existing: await liveOf(tx, req.owner) };
  }

  return {
    async reserve(tx, input) {
      const { req, p, existing } = await prepare(tx, input);
      if (existing?.state === "active") return placed(existing);
      // The owner's own hold, or the one named, becomes the reservation.
      if (existing) return consumeHold(tx, req, existing.id);
      if (req.holdId) return consumeHold(tx, req, req.holdId);
      return book(tx, req, p);
    },
    async hold(tx, input) {
      const { ttlSeconds, ...request } = input;
      if (!Number.isInteger(ttlSeconds) || ttlSeconds < 1 || ttlSeconds > 7 * 86_400)
        throw invalidArgument("a hold's ttlSeconds is a whole number of seconds, 1 to 604800 (7 days)");
      const { req, p, existing } = await prepare(tx, request);
      if (existing) return placed(existing);
      return book(tx, req, p, ttlSeconds);
    },
    async release(tx, owner) {
      const rows = await tx.execute(sql`DELETE FROM capacity_reservations WHERE owner = ${owner} RETURNING id, node_id, state`);
      const gone = rows.rows[0] as { id: string; node_id: string; state: string } | undefined;
      if (!gone) return false;
      await ctx.events.publish(tx, {
        type: "capacity.released",
        subject: `capacity/hosts/${gone.node_id}`,
        data: { owner, reservationId: gone.id, state: gone.state },
      });
      return true;
    },
    async explain(tx, input) {
      const req = parseRequest({ ...input, owner: "explain" }, defaults);
      const p = currentPlacer();
      admit(p, req);
      const { verdicts, accepted } = rank(p, await readHosts(tx, { labels: req.candidates?.labels }), req);
      return {
        verdicts: verdicts.map((v) =>
          v.accepted
            ? { nodeId: v.nodeId, accepted: true as const, score: v.score, scores: v.scores }
            : { nodeId: v.nodeId, accepted: false as const, filter: v.filter, reason: v.reason },
        ),
        pick: accepted[0]?.nodeId ?? null,
      };
    },
  };
}
