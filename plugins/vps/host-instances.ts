// Instances of pools of class host (docs/vps.md, "Host pools"): tenant VMs on the deployment's own
// hosts. A create books capacity on a host through the placer (ctx.capacity.reserve) and writes the
// instance into that host's NodeSpec `instances` section (ctx.nodeSpecs.setEntry), in the create's
// transaction; the host's node agent boots the guest with the pool's runtime and reports what it
// observes. The host reconciler (level-triggered) turns those reports into the instance's state,
// places what could not be placed yet, and finishes deletes once the host no longer runs the guest.
//
// The user data is stored once, at create, exactly as the guest gets it (the tenant's bytes,
// nothing added: FC-ENRICH-ONCE), with its sha256; every entry write sends those stored bytes.
// The guest's one name is the instance id (FC-GUEST-NAME): its entry key, the runtime's work dir,
// its NoCloud instance-id and hostname.
import { sql, type SQL } from "drizzle-orm";
import { z } from "zod";
import type { CommandKind, NodeSpecSection, Reconciler } from "better-compute";
import {
  askAgent,
  base64,
  ComputeError,
  defineMethod,
  instanceEntry,
  notFound,
  one,
  resourceId,
  rows,
  utf8,
  type MethodContext,
  type MethodDefinition,
  type InstanceEntry,
  type ModuleContext,
  type NodeSpecView,
  type PlacementRejection,
  type PlacementRequest,
  type Tx,
} from "better-compute/core";
import type { InstanceRow, InstanceState } from "./instances.ts";
import type { PoolRow } from "./pools.ts";

export const DEFAULT_RUNTIME = "qemu-microvm";
export const DEFAULT_IMAGE = "bc-guest";
/** The NodeSpec section this module owns: one entry per placed instance, keyed by its id. */
export const INSTANCES_SECTION = "instances";
/** User data is at most this many bytes (UTF-8): every entry of a host shares its 512 KiB NodeSpec. */
export const MAX_USER_DATA_BYTES = 32 * 1024;
/** vps.instances.console answers at most this many bytes of the console's tail. */
export const MAX_CONSOLE_BYTES = 16 * 1024;
export const CONSOLE_KIND = "guest.console";
/** How long vps.instances.console waits for the host's answer before answering from the last one. */
const CONSOLE_WAIT_MS = 5_000;
const BATCH = 500;

// ---------------------------------------------------------------- the NodeSpec entry and the console command

/** The `instances` section: its entries are instanceEntry (better-compute/core), which the node role runs. */
export const instancesSection: NodeSpecSection = {
  name: INSTANCES_SECTION,
  entry: instanceEntry,
  description: "Tenant VMs of vps host pools: the node agent runs each with the entry's runtime (InstanceSpec + runtime)",
  // The user data is the tenant's: operators reading the NodeSpec see its sha256, not its bytes.
  view: (entry) => ({ ...(entry as InstanceEntry), userData: "(hidden: the tenant's)" }),
};

export const consoleCommand: CommandKind = {
  kind: CONSOLE_KIND,
  description: "The tail of a guest's serial console (at most maxBytes), answered { console } by the host's node agent",
  roles: ["node"],
  input: z.strictObject({ name: z.string().regex(/^[a-z0-9-]{1,63}$/), maxBytes: z.number().int().min(1).max(MAX_CONSOLE_BYTES) }),
};

/** What a host reports for an instance (agent/runtimes/contract.ts InstanceObserved; a failed entry adds error). */
interface Observed {
  name: string;
  state: "booting" | "running" | "stopping" | "stopped" | "failed" | "absent";
  rebootCount?: number;
  report?: GuestReport;
  reason?: string;
  message?: string;
  error?: { code: string; message: string };
}

interface GuestReport {
  instanceId?: string;
  hostname?: string;
  userDataSha256?: string;
  hostKeys?: string[];
  address?: string;
  mac?: string;
}

/** The guest as vps.instances.get shows it: what it reported, beside what was stored. */
export const guestView = z.object({
  hostname: z.string().nullable(),
  /** sha256 of the user data the guest read from its seed... */
  userDataSha256: z.string().nullable(),
  /** ...and of what was stored at create: equal when the guest got exactly the stored bytes. */
  storedUserDataSha256: z.string(),
  hostKeys: z.array(z.string()),
  /** known_hosts lines for the guest ("<instance id> <type> <key>"). */
  knownHosts: z.string(),
  address: z.string().nullable(),
});

export function guestOf(row: InstanceRow): z.infer<typeof guestView> | null {
  if (row.user_data_sha256 === null) return null;
  const report = row.guest ?? {};
  const hostKeys = (report.hostKeys ?? []).filter((k): k is string => typeof k === "string");
  return {
    hostname: report.hostname ?? null,
    userDataSha256: report.userDataSha256 ?? null,
    storedUserDataSha256: row.user_data_sha256,
    hostKeys,
    // A key line's comment is the guest's to choose: known_hosts wants the type and the key.
    knownHosts: hostKeys.map((k) => `${row.id} ${k.trim().split(/\s+/).slice(0, 2).join(" ")}\n`).join(""),
    address: report.address ?? null,
  };
}

// ---------------------------------------------------------------- helpers

export const ownerOf = (instanceId: string) => `vps/instances/${instanceId}`;

type HostPool = Pick<PoolRow, "id" | "host_labels" | "runtime" | "overcommit" | "strategy" | "image">;

async function hostPool(db: Tx | ModuleContext["store"]["db"], poolId: string): Promise<HostPool> {
  const found = await one<HostPool>(
    db,
    sql`SELECT id, host_labels, runtime, overcommit, strategy, image FROM vps_pools WHERE id = ${poolId} AND class = 'host'`,
  );
  if (!found) throw notFound(`host pool ${poolId} does not exist`);
  return found;
}

export function placementRequest(row: InstanceRow, pool: HostPool): PlacementRequest {
  return {
    owner: ownerOf(row.id),
    candidates: { labels: pool.host_labels ?? {} },
    runtime: pool.runtime!,
    vcpus: row.vcpus,
    memoryMiB: row.memory_mib,
    diskGiB: row.disk_gib,
    overcommit: pool.overcommit ?? undefined,
    strategy: pool.strategy ?? undefined,
    pool: pool.id,
    // A tenant's group names are its own: two tenants' "web" never keep each other off a host.
    ...(row.anti_affinity_group ? { antiAffinity: { group: `${row.tenant_id}/${row.anti_affinity_group}` } } : {}),
  };
}

export function entryOf(row: InstanceRow, pool: HostPool, desired: "running" | "stopped"): InstanceEntry {
  return {
    name: row.id,
    runtime: pool.runtime!,
    desired,
    vcpus: row.vcpus,
    memory: `${row.memory_mib}M`,
    disk: `${row.disk_gib}G`,
    image: pool.image!,
    userData: base64(utf8(row.user_data!)),
    userDataSha256: row.user_data_sha256!,
    rebootCount: row.reboot_count,
  };
}

const wanted = (desired: InstanceRow["desired"]) => (desired === "stopped" ? "stopped" : "running");

/** Writes the instance's entry on its host with what the row wants; returns the generation to wait for. */
async function writeEntry(ctx: ModuleContext, tx: Tx, row: InstanceRow, desired: "running" | "stopped"): Promise<number> {
  const pool = await hostPool(tx, row.pool_id);
  return (await ctx.nodeSpecs.setEntry(tx, row.host_node_id!, INSTANCES_SECTION, row.id, entryOf(row, pool, desired))).generation;
}

async function updated(tx: Tx, id: string, set: SQL): Promise<InstanceRow> {
  return (await one<InstanceRow>(tx, sql`UPDATE vps_instances SET ${set}, updated_at = compute_now() WHERE id = ${id} RETURNING *`))!;
}

// ---------------------------------------------------------------- placement

/**
 * Places a pending instance in the caller's transaction (the row locked by the caller): books
 * capacity and writes its entry, or records why no host takes it. Returns the row as it is now.
 */
export async function placeHostInstance(ctx: ModuleContext, tx: Tx, row: InstanceRow): Promise<InstanceRow> {
  const pool = await hostPool(tx, row.pool_id);
  const result = await ctx.capacity.reserve(tx, placementRequest(row, pool));
  if ("unplaceable" in result) {
    const placement = { rejections: result.unplaceable.rejections };
    if (JSON.stringify(row.placement) === JSON.stringify(placement)) return row;
    return updated(tx, row.id, sql`placement = ${JSON.stringify(placement)}::jsonb`);
  }
  const host = result.placed.nodeId;
  const desired = wanted(row.desired);
  const { generation } = await ctx.nodeSpecs.setEntry(tx, host, INSTANCES_SECTION, row.id, entryOf(row, pool, desired));
  await ctx.events.publish(tx, { type: "vps.instance.placed", subject: `vps/instances/${row.id}`, data: { host } });
  return updated(
    tx,
    row.id,
    sql`host_node_id = ${host}, spec_generation = ${generation}, placement = NULL, reason = NULL,
        state = ${desired === "running" ? "starting" : "stopping"}, state_changed_at = compute_now()`,
  );
}

// ---------------------------------------------------------------- what the methods do to a host instance

/**
 * start / stop: the entry's desired state; the host converges it and the reconciler records what it
 * reports. A tenant's start or stop during a drain's restart wins: the drain mark goes.
 */
export async function desireHost(ctx: ModuleContext, tx: Tx, row: InstanceRow, desired: "running" | "stopped"): Promise<InstanceRow> {
  if (row.host_node_id === null) return updated(tx, row.id, sql`desired = ${desired}, drain_restart_at = NULL`);
  const generation = await writeEntry(ctx, tx, { ...row, desired }, desired);
  return updated(
    tx,
    row.id,
    sql`desired = ${desired}, spec_generation = ${generation}, reason = NULL, drain_restart_at = NULL,
        state = ${desired === "running" ? "starting" : "stopping"}, state_changed_at = compute_now()`,
  );
}

/** reboot: a higher rebootCount in the entry; the host reboots the running guest once for it. */
export async function rebootHost(ctx: ModuleContext, tx: Tx, row: InstanceRow): Promise<InstanceRow> {
  // A boot (or a reboot) under way is as good as the reboot asked for.
  if (row.state === "starting" || row.state === "pending") return row;
  if (row.state !== "running")
    throw new ComputeError("FAILED_PRECONDITION", `instance ${row.id} is ${row.state}: only a running instance reboots`, {
      instance: row.id,
      state: row.state,
    });
  const next = { ...row, reboot_count: row.reboot_count + 1 };
  const generation = await writeEntry(ctx, tx, next, "running");
  return updated(
    tx,
    row.id,
    sql`reboot_count = ${next.reboot_count}, spec_generation = ${generation}, state = 'starting', state_changed_at = compute_now()`,
  );
}

/** delete: the entry goes (the host stops the guest and removes it); the reconciler releases the capacity once it is gone. */
export async function deleteHost(ctx: ModuleContext, tx: Tx, row: InstanceRow): Promise<InstanceRow> {
  if (row.host_node_id === null) {
    await ctx.capacity.release(tx, ownerOf(row.id));
    await ctx.events.publish(tx, { type: "vps.instance.deleted", subject: `vps/instances/${row.id}` });
    return updated(
      tx,
      row.id,
      sql`desired = 'deleted', state = 'deleted', placement = NULL, drain_restart_at = NULL, state_changed_at = compute_now()`,
    );
  }
  const { generation } = await ctx.nodeSpecs.setEntry(tx, row.host_node_id, INSTANCES_SECTION, row.id, null);
  return updated(
    tx,
    row.id,
    sql`desired = 'deleted', spec_generation = ${generation}, state = 'deleting', drain_restart_at = NULL, state_changed_at = compute_now()`,
  );
}

// ---------------------------------------------------------------- the host reconciler

/** What the host reported for the instance, once it reported the generation the instance's last write made. */
function observedOf(view: NodeSpecView | undefined, row: InstanceRow): { fresh: boolean; seen?: Observed; sectionError?: string } {
  const observed = view?.observed;
  if (!observed || observed.generation < Number(row.spec_generation ?? 0)) return { fresh: false };
  const section = observed.sections[INSTANCES_SECTION];
  return { fresh: true, seen: section?.entries[row.id] as Observed | undefined, sectionError: section?.error?.message };
}

/** The record's state for what the host observed; undefined: nothing to record. */
function stateFor(
  row: InstanceRow,
  seen: Observed,
): { state: InstanceState; reason: string | null; guest?: GuestReport; error?: object } | undefined {
  switch (seen.state) {
    case "booting":
      return { state: "starting", reason: drainReason(row) };
    case "running":
      // Booted before the reboot asked for: still starting.
      if ((seen.rebootCount ?? 0) < row.reboot_count) return { state: "starting", reason: drainReason(row) };
      return { state: "running", reason: drainReason(row), guest: seen.report };
    case "stopping":
      return { state: "stopping", reason: null };
    case "stopped":
      return { state: "stopped", reason: seen.reason && seen.reason !== "requested" ? seen.reason : null };
    case "failed":
      return {
        state: "failed",
        reason: seen.reason ?? seen.error?.code ?? "failed",
        error: { code: seen.error?.code ?? "DRIVER_ERROR", message: seen.message ?? seen.error?.message ?? "the host failed the guest" },
      };
    default:
      return undefined;
  }
}

/**
 * One look at one host instance; returns whether it recorded anything. Every write is guarded by
 * the state, desired state and spec generation it read: a pass that raced another changes nothing.
 * A caller outside the reconciler runs ctx.afterCommit() after it (an entry it wrote wakes the host).
 */
export async function reconcileHostInstance(ctx: ModuleContext, id: string, specs = new Map<string, Promise<NodeSpecView | undefined>>()) {
  const row = await one<InstanceRow>(ctx.store.db, sql`SELECT * FROM vps_instances WHERE id = ${id}`);
  if (!row || row.state === "deleted") return false;
  const guard = sql`id = ${row.id} AND state = ${row.state} AND desired = ${row.desired}
    AND spec_generation IS NOT DISTINCT FROM ${row.spec_generation ?? null}::bigint AND host_node_id IS NOT DISTINCT FROM ${row.host_node_id}`;

  if (row.host_node_id === null) {
    if (row.desired === "deleted" || row.state !== "pending") return false;
    // Capacity may have freed up since the last try.
    return ctx.store.transaction(async (tx) => {
      const locked = await one<InstanceRow>(tx, sql`SELECT * FROM vps_instances WHERE ${guard} FOR UPDATE`);
      if (!locked) return false;
      const after = await placeHostInstance(ctx, tx, locked);
      return after !== locked;
    });
  }

  const host = row.host_node_id;
  if (!specs.has(host)) specs.set(host, ctx.nodeSpecs.get(host));
  const { fresh, seen, sectionError } = observedOf(await specs.get(host), row);

  if (row.desired === "deleted") {
    const revoked = (await ctx.store.db.execute(sql`SELECT 1 FROM bc_nodes WHERE id = ${host} AND revoked_at IS NULL`)).rows.length === 0;
    // Gone once the host reported the entry's removal (and no failure removing it), or the host is revoked and runs nothing.
    const gone = revoked || (fresh && seen === undefined && !sectionError?.includes(row.id));
    if (!gone) return false;
    return ctx.store.transaction(async (tx) => {
      const done = await tx.execute(sql`
        UPDATE vps_instances SET state = 'deleted', state_changed_at = compute_now(), updated_at = compute_now()
        WHERE ${guard} RETURNING id`);
      if (done.rows.length === 0) return false;
      await ctx.capacity.release(tx, ownerOf(row.id));
      await ctx.events.publish(tx, { type: "vps.instance.deleted", subject: `vps/instances/${row.id}`, data: { host } });
      return true;
    });
  }

  // A drain stopped it to start it on another host: now that it is stopped, it moves.
  if (row.drain_restart_at !== null && row.state === "stopped" && row.desired === "stopped") return restartDrained(ctx, row, guard);

  if (!fresh || !seen || row.state === "failed") return false;
  const next = stateFor(row, seen);
  if (!next) return false;
  const guest = next.guest ?? row.guest;
  const error = next.error ?? (next.state === "failed" ? row.last_error : null);
  if (next.state === row.state && next.reason === row.reason && JSON.stringify(guest) === JSON.stringify(row.guest)) return false;

  const recorded = await ctx.store.transaction(async (tx) => {
    const locked = await one<InstanceRow>(tx, sql`SELECT * FROM vps_instances WHERE ${guard} FOR UPDATE`);
    if (!locked) return false;
    let set = sql`state = ${next.state}, reason = ${next.reason}, guest = ${guest ? JSON.stringify(guest) : null}::jsonb,
                  last_error = ${error ? JSON.stringify(error) : null}::jsonb`;
    if (next.state !== row.state) set = sql`${set}, state_changed_at = compute_now()`;
    // The guest stopped on its own (it powered off, its VMM exited): it stays stopped until the tenant
    // starts it, so a crashing guest does not restart in a loop. A host reboot is not the guest's
    // doing: the node boots it again as its desired state says.
    if (next.state === "stopped" && row.desired === "running" && next.reason !== "host_reboot") {
      const generation = await writeEntry(ctx, tx, { ...locked, desired: "stopped" }, "stopped");
      set = sql`${set}, desired = 'stopped', spec_generation = ${generation}`;
    }
    await updated(tx, row.id, set);
    if (next.state !== row.state)
      await ctx.events.publish(tx, {
        type: "vps.instance.state",
        subject: `vps/instances/${row.id}`,
        data: { from: row.state, to: next.state, host, ...(next.reason ? { reason: next.reason } : {}) },
      });
    return true;
  });
  // Stopped for a drain's restart: it moves in this same pass (nothing else wakes the reconciler for it).
  if (recorded && next.state === "stopped" && row.drain_restart_at !== null) await reconcileHostInstance(ctx, id, specs);
  return recorded;
}

/** The reason a drain recorded when it started the instance again where it was, kept while it runs there. */
const DRAIN_REASON_PREFIX = "drain: ";
const drainReason = (row: InstanceRow) => (row.reason?.startsWith(DRAIN_REASON_PREFIX) ? row.reason : null);

/**
 * A drain's restart, once the instance is stopped: it moves to another host and starts there. If no
 * other host takes it by now, it starts again where it was, with why: a drain never leaves it stopped.
 */
async function restartDrained(ctx: ModuleContext, row: InstanceRow, guard: SQL): Promise<boolean> {
  return ctx.store.transaction(async (tx) => {
    const locked = await one<InstanceRow>(tx, sql`SELECT * FROM vps_instances WHERE ${guard} AND drain_restart_at IS NOT NULL FOR UPDATE`);
    if (!locked) return false;
    const moved = await moveStopped(ctx, tx, locked, "running");
    if (typeof moved === "string") return true;
    const reason = `${DRAIN_REASON_PREFIX}${moved.reason}`;
    await desireHost(ctx, tx, locked, "running");
    await updated(tx, row.id, sql`reason = ${reason}`);
    await ctx.events.publish(tx, {
      type: "vps.instance.notMoved",
      subject: `vps/instances/${row.id}`,
      data: { host: row.host_node_id, reason },
    });
    return true;
  });
}

export function hostInstancesReconciler(): Reconciler {
  return {
    id: "vps.hostInstances",
    async run(ctx) {
      const specs = new Map<string, Promise<NodeSpecView | undefined>>();
      let changed = 0;
      // Every live host instance, oldest first (one waiting for capacity gets it before a newer one),
      // a page at a time: a pass reaches all of them however many there are.
      let after: { created_at: string; id: string } | undefined;
      for (;;) {
        const page = await rows<{ id: string; created_at: string }>(
          ctx.store.db,
          sql`
            SELECT i.id, i.created_at::text AS created_at FROM vps_instances i JOIN vps_pools p ON p.id = i.pool_id
            WHERE p.class = 'host' AND i.state NOT IN ('deleted', 'failed')
              ${after ? sql`AND (i.created_at, i.id) > (${after.created_at}::timestamptz, ${after.id})` : sql``}
            ORDER BY i.created_at, i.id LIMIT ${BATCH}`,
        );
        for (const { id } of page) {
          try {
            if (await reconcileHostInstance(ctx, id, specs)) changed++;
          } catch (err) {
            ctx.log.warn("reconciling a host instance failed; a later pass retries", {
              instance: id,
              error: err instanceof Error ? err.message : String(err),
            });
          }
        }
        if (page.length < BATCH) break;
        after = page.at(-1)!;
      }
      return changed;
    },
  };
}

// ---------------------------------------------------------------- console

export const consoleView = z.object({
  id: z.string(),
  host: z.string(),
  /** The console's tail, at most maxBytes. */
  console: z.string().nullable(),
  /** When the host answered it: now, or an earlier request's answer when this one did not come in time. */
  at: z.string().nullable(),
  /** true: the host did not answer in time; console is the last answer (or null: none yet). */
  stale: z.boolean(),
  /** Why there is no fresh answer, if there is none. */
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
});

/**
 * Asks the instance's host for its console tail and waits a few seconds for the answer, with no
 * transaction open (it runs in the method's admission). Bytes of the tenant's console stay in the
 * command's result: never logged, never in an event.
 */
export async function readConsole(ctx: MethodContext, row: InstanceRow, maxBytes: number): Promise<z.infer<typeof consoleView>> {
  if (row.host_node_id === null || row.state === "deleted")
    throw new ComputeError("FAILED_PRECONDITION", `instance ${row.id} is not on a host (${row.state})`, {
      instance: row.id,
      state: row.state,
    });
  const host = row.host_node_id;
  const now = await askAgent<{ console?: unknown }>(
    ctx,
    {
      nodeId: host,
      kind: CONSOLE_KIND,
      key: `${CONSOLE_KIND}/${row.id}/${crypto.randomUUID()}`,
      body: { name: row.id, maxBytes },
      deadlineSeconds: 60,
    },
    CONSOLE_WAIT_MS,
  );
  const tail = (r: { result: { console?: unknown } | null }) =>
    typeof r.result?.console === "string" ? r.result.console.slice(-maxBytes) : "";
  if (now.state === "succeeded") return { id: row.id, host, console: tail(now), at: now.at, stale: false, error: null };
  if (now.state !== "pending")
    return {
      id: row.id,
      host,
      console: null,
      at: null,
      stale: false,
      error: now.error ?? { code: "DEADLINE_EXCEEDED", message: "no answer" },
    };

  type Answer = { result: { console?: unknown } | null; at: string | null };
  const last = await one<Answer>(
    ctx.store.db,
    sql`
      SELECT result, completed_at AS at FROM bc_commands
      WHERE node_id = ${host} AND kind = ${CONSOLE_KIND} AND body ->> 'name' = ${row.id} AND state = 'succeeded' AND id <> ${now.id}::bigint
      ORDER BY completed_at DESC LIMIT 1`,
  );
  return {
    id: row.id,
    host,
    console: last ? tail(last) : null,
    at: last?.at ? new Date(last.at).toISOString() : null,
    stale: true,
    error: {
      code: "DEADLINE_EXCEEDED",
      message: `host ${host} did not answer within ${CONSOLE_WAIT_MS / 1000} s${last ? ": the last answer is shown" : ""}`,
    },
  };
}

// ---------------------------------------------------------------- drain

const drainResult = z.object({
  node: z.string(),
  /** Stopped instances re-placed on other hosts: [{ id, to }]. */
  moved: z.array(z.object({ id: z.string(), to: z.string() })),
  /** Instances left on the host, and why. */
  notMoved: z.array(z.object({ id: z.string(), state: z.string(), reason: z.string() })),
  /** With restart: running instances asked to stop; each moves and starts on another host once stopped. */
  stopping: z.array(z.object({ id: z.string() })).optional(),
});

export const hostActions = {
  "vps.hosts.drain":
    "Move a cordoned host's stopped instances to other hosts (with restart, its running ones too), and say which cannot move",
};

export function hostMethods(): MethodDefinition<any, any>[] {
  const drain = defineMethod({
    name: "vps.hosts.drain",
    resource: (input) => `nodes/${input.node}`,
    description:
      "Re-place a host's stopped vps instances on other hosts (their root disk starts afresh from the image); running ones cannot move live and are listed with why. With restart: true, each running one another host takes is stopped, moved and started there (a fresh root disk from the image: what was on its disk is lost); if no host takes it by then it starts again where it was. The host must be cordoned first (capacity.hosts.cordon) or in maintenance",
    input: z.object({
      node: resourceId,
      /** Stop the running instances another host can take, move them and start them there. */
      restart: z.boolean().default(false),
    }),
    output: drainResult,
    handler: async (ctx, input, tx) => {
      const node = input.node;
      if ((await tx.execute(sql`SELECT 1 FROM bc_nodes WHERE id = ${node} AND role = 'node'`)).rows.length === 0)
        throw notFound(`host ${node} does not exist`);
      // Nothing may land on the host while it is drained: it must not be schedulable (the placer's verdict on it).
      const verdict = (await ctx.capacity.explain(tx, { vcpus: 0, memoryMiB: 0, diskGiB: 0 })).verdicts.find((v) => v.nodeId === node);
      if (verdict && (verdict.accepted || !UNSCHEDULABLE.includes(verdict.filter)))
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `host ${node} is schedulable: cordon it first (capacity.hosts.cordon), or a moved instance could land on it again`,
          { node },
        );
      const hosted = await rows<InstanceRow>(
        tx,
        sql`
          SELECT * FROM vps_instances WHERE host_node_id = ${node} AND state NOT IN ('deleted', 'deleting') ORDER BY id FOR UPDATE`,
      );
      const moved: { id: string; to: string }[] = [];
      const notMoved: { id: string; state: string; reason: string }[] = [];
      const stopping: { id: string }[] = [];
      for (const row of hosted) {
        if (row.drain_restart_at !== null && row.state !== "failed") {
          // An earlier drain's restart is under way: the reconciler moves it once it is stopped.
          if (input.restart) stopping.push({ id: row.id });
          else
            notMoved.push({
              id: row.id,
              state: row.state,
              reason: "a drain (restart) moves it and starts it elsewhere once it is stopped",
            });
          continue;
        }
        if (input.restart && row.desired === "running" && (row.state === "running" || row.state === "starting")) {
          const refused = await noOtherHostFor(ctx, tx, row);
          if (refused) {
            notMoved.push({ id: row.id, state: row.state, reason: refused });
            continue;
          }
          await desireHost(ctx, tx, row, "stopped");
          await updated(tx, row.id, sql`drain_restart_at = compute_now()`);
          await ctx.events.publish(tx, {
            type: "vps.instance.requested",
            subject: `vps/instances/${row.id}`,
            data: { action: "stop", desired: "stopped", drain: node },
          });
          stopping.push({ id: row.id });
          continue;
        }
        if (row.state !== "stopped" || row.desired !== "stopped") {
          notMoved.push({ id: row.id, state: row.state, reason: whyNotMoved(row) });
          continue;
        }
        const to = await moveStopped(ctx, tx, row, "stopped");
        if (typeof to === "string") moved.push({ id: row.id, to });
        else notMoved.push({ id: row.id, state: row.state, reason: to.reason });
      }
      const ids = (list: { id: string }[]) => list.map((m) => m.id);
      await ctx.events.publish(tx, {
        type: "vps.host.drained",
        subject: `nodes/${node}`,
        data: { moved: ids(moved), notMoved: ids(notMoved), ...(input.restart ? { stopping: ids(stopping) } : {}) },
      });
      return { node, moved, notMoved, ...(input.restart ? { stopping } : {}) };
    },
  });
  return [drain];
}

/** The placer's filters that make a host unschedulable whatever the request (plugins/capacity builtins). */
const UNSCHEDULABLE = ["connected", "maintenance", "cordon"];

function whyNotMoved(row: InstanceRow): string {
  if (row.state === "running" || row.state === "starting")
    return `${row.state}: a running guest cannot move live; stop it (vps.instances.stop) and drain again, or drain with restart: true`;
  if (row.state === "stopping") return "stopping: drain again once it is stopped";
  if (row.state === "failed") return "failed: delete it (vps.instances.delete)";
  return `${row.state}: only a stopped instance moves`;
}

/** Why no host but the instance's own would take it (a dry run of its placement), or null when one would. */
async function noOtherHostFor(ctx: ModuleContext, tx: Tx, row: InstanceRow): Promise<string | null> {
  const { owner: _owner, ...request } = placementRequest(row, await hostPool(tx, row.pool_id));
  const others = (await ctx.capacity.explain(tx, request)).verdicts.filter((v) => v.nodeId !== row.host_node_id);
  if (others.some((v) => v.accepted)) return null;
  return noOtherHost(others.flatMap((v) => (v.accepted ? [] : [v])));
}

const noOtherHost = (rejections: Pick<PlacementRejection, "nodeId" | "reason">[]) => {
  const why = rejections.map((r) => `${r.nodeId}: ${r.reason}`).join("; ");
  return `no other host takes it${why ? ` (${why})` : ""}`;
};

/**
 * Re-places one stopped instance in a savepoint: its reservation released, booked elsewhere, its
 * entry moved, kept stopped or (a drain's restart) started there. When no other host takes it, the
 * savepoint rolls back and it stays where it is.
 */
async function moveStopped(
  ctx: ModuleContext,
  tx: Tx,
  row: InstanceRow,
  then: "running" | "stopped",
): Promise<string | { reason: string }> {
  class NotMoved {
    constructor(readonly reason: string) {}
  }
  const from = row.host_node_id!;
  const pool = await hostPool(tx, row.pool_id);
  try {
    return await tx.transaction(async (attempt) => {
      await ctx.capacity.release(attempt, ownerOf(row.id));
      const result = await ctx.capacity.reserve(attempt, placementRequest(row, pool));
      if ("unplaceable" in result) throw new NotMoved(noOtherHost(result.unplaceable.rejections.filter((r) => r.nodeId !== from)));
      const to = result.placed.nodeId;
      // Only a host uncordoned since the drain takes it back.
      if (to === from) throw new NotMoved(`no other host takes it (${from} is schedulable again and was picked)`);
      await ctx.nodeSpecs.setEntry(attempt, from, INSTANCES_SECTION, row.id, null);
      const { generation } = await ctx.nodeSpecs.setEntry(attempt, to, INSTANCES_SECTION, row.id, entryOf(row, pool, then));
      const started = then === "running" ? sql`, desired = 'running', state = 'starting', state_changed_at = compute_now()` : sql``;
      await attempt.execute(sql`
        UPDATE vps_instances SET host_node_id = ${to}, spec_generation = ${generation}, reason = NULL, guest = NULL,
          drain_restart_at = NULL, updated_at = compute_now() ${started}
        WHERE id = ${row.id}`);
      await ctx.events.publish(attempt, {
        type: "vps.instance.moved",
        subject: `vps/instances/${row.id}`,
        data: { from: row.host_node_id, to },
      });
      return to;
    });
  } catch (err) {
    if (!(err instanceof NotMoved)) throw err;
    return { reason: err.reason };
  }
}
