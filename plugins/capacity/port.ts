// The CapacityPort (ctx.capacity): reads hosts, asks the placer, and books in the caller's
// transaction. A reserve reads only the hosts the built-in filters let through, filtered (and,
// when the built-in score is the whole ranking, ordered and cut to the best few) in SQL; the
// placer judges and ranks them again in TypeScript, which has the last word. When none of them
// takes the request, every host is read and judged, so an unplaceable request is explained per host.
// The guard against overbooking is in SQL: the chosen host's capacity_hosts row is locked and the
// host read again under the lock before the reservation is written; a host that filled up
// meanwhile is given up (its lock too: each attempt is a savepoint) for the next best. Holds
// expire by compute_now(), never the isolate's clock.
import { sql, type SQL } from "drizzle-orm";
import type { SchedulerPluginDefinition } from "better-compute";
import {
  ComputeError,
  invalidArgument,
  one,
  rows,
  type CapacityPort,
  type HostView,
  type ModuleContext,
  type PlacementRejection,
  type PlacementRequest,
  type PlacementResult,
  type Runner,
  type Tx,
} from "better-compute/core";
import { ANY_VALUE, DRIVER_LABEL_PREFIX, strategyScorer } from "./builtins.ts";
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

/** How many of the best hosts a reserve reads when the built-in score alone ranks them (more are read when these fail). */
const BEST_FEW = 8;

interface WhichHosts {
  labels?: Record<string, string>;
  nodeId?: string;
  /** Only the hosts the built-in filters accept for this request; with `best`, only that many, best first. */
  fitting?: { req: PlacementRequest; best?: number };
}

/** Hosts (live nodes of role node), with the operator's settings and their live reservations summed. */
export async function readHosts(tx: Runner, which: WhichHosts = {}): Promise<HostView[]> {
  const { fitting } = which;
  const hosts = await rows<HostRow>(
    tx,
    sql`
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
      ${fitting ? sql`AND ${passesBuiltinFilters(fitting.req)}` : sql``}
    ${fitting?.best ? sql`ORDER BY ${strategyScore(fitting.req)} DESC, n.id COLLATE "C" LIMIT ${fitting.best}` : sql`ORDER BY n.id`}`,
  );
  return hosts.map((r) => ({
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

// The built-in filters and the strategy score of builtins.ts, in SQL over readHosts' columns, so a
// reserve reads only the hosts that can take the request, best first. The placer still judges
// every host read, and reads every host when none of these takes the request: a filter here that
// is stricter or looser than its twin costs only speed, but an order that differs would pick
// another host (the placement tests check reserve picks what capacity.explain, which judges every host, picks).
const capacityOf = (field: "cpus" | "memoryMiB" | "diskGiB") => sql`(n.resources->>${field})::float8`;

function passesBuiltinFilters(req: PlacementRequest): SQL {
  const nodeLabels = Object.entries(req.nodeLabels ?? {});
  const exact = Object.fromEntries(nodeLabels.filter(([, value]) => value !== ANY_VALUE));
  const present = nodeLabels.filter(([, value]) => value === ANY_VALUE).map(([key]) => key);
  if (req.runtime !== undefined) present.push(`${DRIVER_LABEL_PREFIX}${req.runtime}`);
  const cpu = req.overcommit?.cpu ?? 1;
  const memory = req.overcommit?.memory ?? 1;
  const devices = req.devices
    ? sql`AND ${req.devices.count} <= (
        SELECT count(*) FROM jsonb_array_elements(coalesce(n.resources->'devices', '[]'::jsonb)) d
        WHERE d->>'kind' = ${req.devices.kind}
          AND NOT coalesce(u.devices, '[]'::jsonb) @> jsonb_build_array(jsonb_build_array(d->'id')))`
    : sql``;
  const antiAffinity = req.antiAffinity ? sql`AND NOT coalesce(u.groups, '{}') @> ARRAY[${req.antiAffinity.group}::text]` : sql``;
  return sql`n.state = 'connected' AND NOT coalesce(h.maintenance, false) AND NOT coalesce(h.cordoned, false)
    AND n.labels @> ${JSON.stringify(exact)}::jsonb AND n.labels ?& ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(present)}::jsonb))
    AND ${req.vcpus} <= floor(${capacityOf("cpus")} * ${cpu}::float8) - coalesce(u.vcpus, 0)
    AND ${req.memoryMiB} <= floor(${capacityOf("memoryMiB")} * ${memory}::float8) - coalesce(u.memory_mib, 0)
    AND ${req.diskGiB} <= ${capacityOf("diskGiB")} - coalesce(u.disk_gib, 0)
    ${devices} ${antiAffinity}`;
}

/** strategyScorer's score: spread, 1 - utilisation; pack, utilisation (the mean of the CPU and memory shares). */
function strategyScore(req: PlacementRequest): SQL {
  const share = (used: SQL, asked: number, total: SQL) =>
    sql`CASE WHEN ${total} > 0 THEN least(1, (${used} + ${asked}::int)::float8 / (${total})) ELSE 1 END`;
  const utilisation = sql`(${share(sql`coalesce(u.vcpus, 0)`, req.vcpus, sql`${capacityOf("cpus")} * ${req.overcommit?.cpu ?? 1}::float8`)}
    + ${share(sql`coalesce(u.memory_mib, 0)`, req.memoryMiB, sql`${capacityOf("memoryMiB")} * ${req.overcommit?.memory ?? 1}::float8`)}) / 2`;
  return req.strategy === "pack" ? utilisation : sql`1 - ${utilisation}`;
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
  return one<ReservationRow>(
    tx,
    sql`
    WITH expired AS (
      DELETE FROM capacity_reservations WHERE owner = ${owner} AND state = 'held' AND expires_at <= compute_now() RETURNING id
    )
    SELECT id, node_id, owner, state, vcpus, memory_mib, disk_gib, devices FROM capacity_reservations
    WHERE owner = ${owner} AND id NOT IN (SELECT id FROM expired)`,
  );
}

/** Thrown inside an attempt's savepoint to give the host up (and its lock with the savepoint). */
class GaveUp {
  constructor(readonly rejection?: PlacementRejection) {}
}

export function capacityPort(ctx: ModuleContext, defaults: PlacerDefaults = {}): CapacityPort {
  const currentPlacer = () => placer(ctx.registered.extensions<SchedulerPluginDefinition>("scheduler-plugin"));

  /** Places and writes the reservation (active, or held until ttlSeconds from now). */
  async function book(tx: Tx, req: PlacementRequest, p: Placer, ttlSeconds?: number): Promise<PlacementResult> {
    const labels = req.candidates?.labels;
    /** Hosts given up under their lock, with why. */
    const gaveUp = new Map<string, PlacementRejection>();
    /** Tries the accepted hosts best first (skipping those given up already); the booking, or undefined. */
    const tryInOrder = async (accepted: Extract<Verdict, { accepted: true }>[]) => {
      for (const candidate of accepted) {
        if (gaveUp.has(candidate.nodeId)) continue;
        const result = await tryHost(tx, req, p, candidate.nodeId, ttlSeconds);
        if (!(result instanceof GaveUp)) return result;
        if (result.rejection) {
          gaveUp.set(candidate.nodeId, result.rejection);
          continue;
        }
        // The same owner booked in another transaction that committed first: that booking stands.
        const theirs = await liveOf(tx, req.owner);
        if (theirs) return placed(theirs);
      }
      return undefined;
    };
    // The hosts the built-in filters let through; only the best few when the built-in score is the whole ranking.
    const onlyBuiltinScore = p.scorers.every((s) => s === strategyScorer);
    const fitting = await readHosts(tx, { labels, fitting: { req, best: onlyBuiltinScore ? BEST_FEW : undefined } });
    const booked = await tryInOrder(rank(p, fitting, req).accepted);
    if (booked) return booked;
    // None of them took it: every host, judged, so the answer explains each (or books one freed meanwhile).
    const all = rank(p, await readHosts(tx, { labels }), req);
    const bookedLater = await tryInOrder(all.accepted);
    if (bookedLater) return bookedLater;
    const rejections: PlacementRejection[] = all.rejected.map(({ nodeId, filter, reason }) => ({ nodeId, filter, reason }));
    for (const { nodeId } of all.accepted) {
      const rejection = gaveUp.get(nodeId);
      if (rejection) rejections.push(rejection);
    }
    return { unplaceable: { rejections } };
  }

  /** Books on one host under its lock, or gives it up (GaveUp, the savepoint rolled back with its lock). */
  async function tryHost(tx: Tx, req: PlacementRequest, p: Placer, nodeId: string, ttlSeconds?: number): Promise<PlacementResult | GaveUp> {
    try {
      return await tx.transaction(async (attempt) => {
        // Takes the host's row lock, creating the row the first time (the no-op update is what locks it).
        await attempt.execute(sql`
          INSERT INTO capacity_hosts (node_id) VALUES (${nodeId}) ON CONFLICT (node_id) DO UPDATE SET node_id = excluded.node_id`);
        // Under the lock, the host as it is now: whoever held the lock before has committed or rolled back.
        const [now] = await readHosts(attempt, { nodeId });
        const verdict: Verdict = now ? judge(p, now, req) : { nodeId, accepted: false, filter: "connected", reason: "revoked meanwhile" };
        if (!verdict.accepted) throw new GaveUp({ nodeId, filter: verdict.filter, reason: verdict.reason });
        const id = `r-${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
        const inserted = await attempt.execute(sql`
          INSERT INTO capacity_reservations (id, node_id, owner, pool, vcpus, memory_mib, disk_gib, devices, anti_affinity_group, state, expires_at)
          VALUES (${id}, ${nodeId}, ${req.owner}, ${req.pool ?? null}, ${req.vcpus}, ${req.memoryMiB}, ${req.diskGiB},
                  ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(verdict.atoms)}::jsonb)), ${req.antiAffinity?.group ?? null},
                  ${ttlSeconds === undefined ? "active" : "held"},
                  CASE WHEN ${ttlSeconds ?? null}::float8 IS NULL THEN NULL ELSE compute_now() + make_interval(secs => ${ttlSeconds ?? 0}) END)
          ON CONFLICT (owner) DO NOTHING RETURNING id`);
        // The same owner booked in another transaction that committed first (book() returns that one).
        if (inserted.rows.length === 0) throw new GaveUp();
        await ctx.events.publish(attempt, {
          type: ttlSeconds === undefined ? "capacity.reserved" : "capacity.held",
          subject: `capacity/hosts/${nodeId}`,
          data: {
            owner: req.owner,
            reservationId: id,
            vcpus: req.vcpus,
            memoryMiB: req.memoryMiB,
            diskGiB: req.diskGiB,
            devices: verdict.atoms,
          },
        });
        return { placed: { nodeId, reservationId: id, atoms: verdict.atoms } };
      });
    } catch (err) {
      if (err instanceof GaveUp) return err;
      throw err;
    }
  }

  /** Turns a live hold into the owner's active reservation; the request must fit inside what it holds. */
  async function consumeHold(tx: Tx, req: PlacementRequest, holdId: string): Promise<PlacementResult> {
    const hold = await one<ReservationRow>(
      tx,
      sql`
      SELECT id, node_id, owner, state, vcpus, memory_mib, disk_gib, devices FROM capacity_reservations r
      WHERE id = ${holdId} AND state = 'held' AND ${LIVE} FOR UPDATE`,
    );
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
      const gone = await one<{ id: string; node_id: string; state: string }>(
        tx,
        sql`DELETE FROM capacity_reservations WHERE owner = ${owner} RETURNING id, node_id, state`,
      );
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
