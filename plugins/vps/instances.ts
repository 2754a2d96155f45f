// A tenant's instances: what the methods write is the record and the desired state; the
// vps.instances reconciler (reconciler.ts) makes the provider's servers follow it, and for pools
// of class host the instance is placed on a host and written into its NodeSpec in the same
// transaction (host-instances.ts). A create is checked against the tenant's quota in the pool,
// under the quota row's lock, before anything is written. A tenant's member sees its own
// instances only (another tenant's are NOT_FOUND).
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  conflict,
  defineGetMethod,
  defineMethod,
  invalidArgument,
  nextCursor,
  notFound,
  one,
  pageLimit,
  refuseOtherFields,
  rows,
  sha256Hex,
  resourceId,
  type MethodContext,
  type MethodDefinition,
  type Tx,
} from "better-compute/core";
import {
  consoleView,
  deleteHost,
  desireHost,
  guestOf,
  guestView,
  MAX_CONSOLE_BYTES,
  MAX_USER_DATA_BYTES,
  placeHostInstance,
  readConsole,
  rebootHost,
} from "./host-instances.ts";
import { iso, isoOrNull, scopeOf, slug, tenantFor } from "./methods.ts";
import { pgTextArray, quotaSizes, usageOf, type Sizes } from "./tenants.ts";

export const INSTANCE_STATES = [
  "pending",
  "creating",
  "starting",
  "running",
  "stopping",
  "stopped",
  "deleting",
  "deleted",
  "failed",
] as const;
export type InstanceState = (typeof INSTANCE_STATES)[number];
export type Desired = "running" | "stopped" | "deleted";

const instance = z.object({
  id: z.string(),
  tenant: z.string(),
  pool: z.string(),
  flavor: z.string(),
  name: z.string(),
  state: z.enum(INSTANCE_STATES),
  desired: z.enum(["running", "stopped", "deleted"]),
  /** The provider's id for the server, once it has one. */
  providerId: z.string().nullable(),
  addresses: z.array(z.string()),
  /** Names of the SSH keys it was created with. */
  sshKeys: z.array(z.string()),
  vcpus: z.number(),
  memoryMiB: z.number(),
  diskGiB: z.number(),
  rebootRequested: z.boolean(),
  /** The last provider failure ({ code, message, failure, ... }), cleared once a call succeeds. */
  lastError: z.record(z.string(), z.unknown()).nullable(),
  /** When the reconciler looks at it next (null: at its next pass). */
  nextAttemptAt: z.string().nullable(),
  /** Host pools: the host (node id) it is placed on. */
  host: z.string().nullable(),
  /** Host pools, while no host takes it: why, per host ({ nodeId, filter, reason }). */
  placement: z.object({ rejections: z.array(z.object({ nodeId: z.string(), filter: z.string(), reason: z.string() })) }).nullable(),
  /** Host pools: why it stopped or failed without being asked (guest_poweroff, vmm_exited, host_reboot, boot_failed...). */
  reason: z.string().nullable(),
  antiAffinityGroup: z.string().nullable(),
  /** Host pools: what the guest reported, beside the sha256 of the user data stored at create. */
  guest: guestView.nullable(),
  createdAt: z.string(),
  updatedAt: z.string(),
  stateChangedAt: z.string(),
});

export interface InstanceRow {
  id: string;
  tenant_id: string;
  pool_id: string;
  flavor_id: string;
  name: string;
  ssh_keys: { name: string; publicKey: string }[];
  state: InstanceState;
  desired: Desired;
  provider_id: string | null;
  addresses: string[] | string;
  pending_op: { id: string; call: string; startedAt: string } | null;
  reboot_requested_at: string | null;
  lease_until: string | null;
  attempts: number;
  next_attempt_at: string | null;
  last_error: Record<string, unknown> | null;
  vcpus: number;
  memory_mib: number;
  disk_gib: number;
  created_at: string;
  updated_at: string;
  state_changed_at: string;
  // Host pools (vps/0002; null for provider pools' instances).
  user_data: string | null;
  user_data_sha256: string | null;
  anti_affinity_group: string | null;
  host_node_id: string | null;
  spec_generation: string | number | null;
  placement: { rejections: { nodeId: string; filter: string; reason: string }[] } | null;
  guest: { hostname?: string; userDataSha256?: string; hostKeys?: string[]; address?: string } | null;
  reason: string | null;
  reboot_count: number;
  /** vps/0003: when vps.hosts.drain { restart } stopped it to start it on another host. */
  drain_restart_at: string | null;
  /** loadInstance's: the pool's class. */
  pool_class?: "provider" | "host";
}

const toInstance = (r: InstanceRow) => ({
  id: r.id,
  tenant: r.tenant_id,
  pool: r.pool_id,
  flavor: r.flavor_id,
  name: r.name,
  state: r.state,
  desired: r.desired,
  providerId: r.provider_id,
  addresses: pgTextArray(r.addresses),
  sshKeys: r.ssh_keys.map((k) => k.name),
  vcpus: r.vcpus,
  memoryMiB: r.memory_mib,
  diskGiB: r.disk_gib,
  rebootRequested: r.reboot_requested_at !== null,
  lastError: r.last_error,
  nextAttemptAt: isoOrNull(r.next_attempt_at),
  host: r.host_node_id,
  placement: r.placement,
  reason: r.reason,
  antiAffinityGroup: r.anti_affinity_group,
  guest: guestOf(r),
  createdAt: iso(r.created_at),
  updatedAt: iso(r.updated_at),
  stateChangedAt: iso(r.state_changed_at),
});

/** An RFC 1123 host name label. */
const hostname = z.string().regex(/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/, "a host name: lower-case letters, digits and dashes, at most 63");

/** The instance as the caller may see it: another tenant's is NOT_FOUND, as if it did not exist. */
async function loadInstance(ctx: MethodContext, tx: Tx, id: string, forUpdate = false): Promise<InstanceRow> {
  const scope = await scopeOf(ctx, tx);
  const found = await one<InstanceRow>(
    tx,
    sql`
    SELECT i.*, (SELECT p.class FROM vps_pools p WHERE p.id = i.pool_id) AS pool_class FROM vps_instances i
    WHERE i.id = ${id} AND (${scope.tenant ?? null}::text IS NULL OR i.tenant_id = ${scope.tenant ?? null})
    ${forUpdate ? sql`FOR UPDATE` : sql``}`,
  );
  if (!found) throw notFound(`instance ${id} does not exist`);
  return found;
}

const SIZE_FIELDS = ["instances", "vcpus", "memoryMiB", "diskGiB"] as const;

export function instanceMethods(): MethodDefinition<any, any>[] {
  const create = defineMethod({
    name: "vps.instances.create",
    reconcile: true,
    resource: (input) => `vps/pools/${input.pool}`,
    description:
      "Create an instance of a flavor in a pool offered to the tenant, within its quota (refused over it, before anything is written); the reconciler creates the server. In a host pool, userData is required and the instance is placed on a host at once (or kept pending with each host's reason). With an id, the same fields again is idempotent",
    input: z.object({
      /** The tenant it is for: an operator names it; a tenant's member acts for its own. */
      tenant: resourceId.optional(),
      pool: resourceId,
      flavor: resourceId,
      /** The server's host name. */
      name: hostname,
      /** Names of the tenant's SSH keys (vps.sshKeys.create). */
      sshKeys: z.array(slug).max(20).default([]),
      id: slug.optional(),
      /** Host pools (required there): the user data, exactly the bytes the guest gets (at most 32 KiB). */
      userData: z.string().optional(),
      /** Host pools: no two instances of the tenant's group on one host. */
      antiAffinityGroup: slug.optional(),
    }),
    output: instance.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const tenantId = await tenantFor(ctx, tx, input.tenant);
      if (input.id) {
        const stored = await one<InstanceRow>(tx, sql`SELECT * FROM vps_instances WHERE id = ${input.id}`);
        if (stored) {
          if (stored.tenant_id !== tenantId) throw conflict(`instance id ${input.id} is taken: pick another`, { id: input.id });
          refuseOtherFields(
            "instance",
            input.id,
            {
              pool: stored.pool_id,
              flavor: stored.flavor_id,
              name: stored.name,
              sshKeys: stored.ssh_keys.map((k) => k.name),
              userDataSha256: stored.user_data_sha256,
              antiAffinityGroup: stored.anti_affinity_group,
            },
            {
              pool: input.pool,
              flavor: input.flavor,
              name: input.name,
              sshKeys: input.sshKeys,
              userDataSha256: input.userData === undefined ? null : await sha256Hex(input.userData),
              antiAffinityGroup: input.antiAffinityGroup ?? null,
            },
          );
          return { ...toInstance(stored), created: false };
        }
      }
      const poolClass = await one<{ class: "provider" | "host" }>(tx, sql`SELECT class FROM vps_pools WHERE id = ${input.pool}`);
      if (!poolClass) throw notFound(`pool ${input.pool} does not exist`);
      const host = poolClass.class === "host";
      if (host) refuseUserData(input.userData);
      else {
        const hostOnly = (["userData", "antiAffinityGroup"] as const).filter((f) => input[f] !== undefined);
        if (hostOnly.length)
          throw invalidArgument(`${hostOnly.join(", ")} are for host pools: a provider pool's instance gets the cloud-init vps composes`, {
            fields: hostOnly,
          });
      }
      const flavor = await one<{ vcpus: number; memory_mib: number; disk_gib: number }>(
        tx,
        sql`SELECT * FROM vps_flavors WHERE id = ${input.flavor} AND pool_id = ${input.pool}`,
      );
      if (!flavor) throw notFound(`flavor ${input.flavor} does not exist in pool ${input.pool}`);
      const keys = input.sshKeys.length
        ? await rows<{ name: string; public_key: string }>(
            tx,
            sql`
              SELECT name, public_key FROM vps_ssh_keys WHERE tenant_id = ${tenantId} AND name = ANY(${`{${input.sshKeys.join(",")}}`}::text[])`,
          )
        : [];
      const missing = input.sshKeys.filter((n) => !keys.some((k) => k.name === n));
      if (missing.length) throw notFound(`SSH key ${missing.join(", ")} does not exist (vps.sshKeys.create)`, { sshKeys: missing });

      // The quota row's lock orders concurrent creates of the tenant in the pool: each sees the one before.
      const quotaRow = await one<Parameters<typeof quotaSizes>[0]>(
        tx,
        sql`SELECT * FROM vps_quotas WHERE tenant_id = ${tenantId} AND pool_id = ${input.pool} FOR UPDATE`,
      );
      if (!quotaRow)
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `pool ${input.pool} is not offered to tenant ${tenantId}: an operator offers it with a quota (vps.quotas.set)`,
          { tenant: tenantId, pool: input.pool },
        );
      const quota = quotaSizes(quotaRow);
      const usage = await usageOf(tx, tenantId, input.pool);
      const request: Sizes = { instances: 1, vcpus: flavor.vcpus, memoryMiB: flavor.memory_mib, diskGiB: flavor.disk_gib };
      const exceeded = SIZE_FIELDS.filter((f) => usage[f] + request[f] > quota[f]);
      if (exceeded.length)
        throw new ComputeError(
          "RESOURCE_EXHAUSTED",
          `tenant ${tenantId}'s quota in pool ${input.pool} would be exceeded (${exceeded.map((f) => `${f}: ${usage[f]} used + ${request[f]} > ${quota[f]}`).join("; ")})`,
          { tenant: tenantId, pool: input.pool, exceeded, quota, usage, request },
        );

      const id = input.id ?? `i-${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
      const sshKeys = input.sshKeys.map((name) => ({ name, publicKey: keys.find((k) => k.name === name)!.public_key }));
      // A host instance's user data is stored once, as given, with its sha256 (FC-ENRICH-ONCE): never composed again.
      const userData = host ? input.userData! : null;
      const userDataSha256 = userData === null ? null : await sha256Hex(userData);
      let row = await one<InstanceRow>(
        tx,
        sql`
        INSERT INTO vps_instances (id, tenant_id, pool_id, flavor_id, name, ssh_keys, state, desired, vcpus, memory_mib, disk_gib, next_attempt_at,
                                   user_data, user_data_sha256, anti_affinity_group)
        VALUES (${id}, ${tenantId}, ${input.pool}, ${input.flavor}, ${input.name}, ${JSON.stringify(sshKeys)}::jsonb, 'pending', 'running',
                ${flavor.vcpus}, ${flavor.memory_mib}, ${flavor.disk_gib}, ${host ? null : sql`compute_now()`},
                ${userData}, ${userDataSha256}, ${input.antiAffinityGroup ?? null})
        ON CONFLICT DO NOTHING RETURNING *`,
      );
      // Another call took the id between the look above and this insert.
      if (!row) throw conflict(`instance id ${id} is taken: pick another`, { id });
      await ctx.events.publish(tx, {
        type: "vps.instance.created",
        subject: `vps/instances/${id}`,
        data: { tenant: tenantId, pool: input.pool, flavor: input.flavor, name: input.name },
      });
      if (host) row = await placeHostInstance(ctx, tx, row);
      return { ...toInstance(row), created: true };
    },
  });

  const get = defineGetMethod({
    name: "vps.instances.get",
    what: "instance",
    collection: "vps/instances",
    /** nodeId: the node an agent: bcd pool's instance joined as (bcd's provisioned join), until it is revoked. */
    output: instance.extend({ nodeId: z.string().nullable() }),
    find: async (tx, id, ctx) => {
      const row = await loadInstance(ctx, tx, id);
      const node = await one<{ id: string }>(
        tx,
        sql`
        SELECT id FROM bc_nodes WHERE role = 'node' AND revoked_at IS NULL AND labels @> ${JSON.stringify({ "bc.dev/vps-instance": row.id })}::jsonb
        ORDER BY joined_at DESC LIMIT 1`,
      );
      return { ...toInstance(row), nodeId: node?.id ?? null };
    },
  });

  const list = defineMethod({
    name: "vps.instances.list",
    readOnly: true,
    description: "Instances by id (deleted ones only when state: deleted is asked for), paged; a tenant sees its own",
    input: z.object({
      tenant: resourceId.optional(),
      pool: resourceId.optional(),
      state: z.enum(INSTANCE_STATES).optional(),
      limit: pageLimit,
      after: resourceId.optional(),
    }),
    output: z.object({ instances: z.array(instance), next: z.string().nullable() }),
    handler: async (ctx, input, tx) => {
      const scope = await scopeOf(ctx, tx);
      if (scope.tenant !== undefined && input.tenant !== undefined && input.tenant !== scope.tenant) return { instances: [], next: null };
      const tenantId = scope.tenant ?? input.tenant ?? null;
      if (input.after) await loadInstance(ctx, tx, input.after);
      const found = await rows<InstanceRow>(
        tx,
        sql`
        SELECT * FROM vps_instances
        WHERE (${tenantId}::text IS NULL OR tenant_id = ${tenantId})
          AND (${input.pool ?? null}::text IS NULL OR pool_id = ${input.pool ?? null})
          AND (${input.state ?? null}::text IS NULL AND state <> 'deleted' OR state = ${input.state ?? null})
          AND (${input.after ?? null}::text IS NULL OR id > ${input.after ?? null})
        ORDER BY id LIMIT ${input.limit}`,
      );
      const instances = found.map(toInstance);
      return { instances, next: nextCursor(instances, input.limit, (i) => i.id) };
    },
  });

  /**
   * A request on one instance (start, stop, reboot, delete), under its row's lock: `act` answers
   * the instance as it is now and, when it asked for something new, what (the data of the
   * vps.instance.requested event). The reconciler takes it up at once (reconcile: true) or at its next pass.
   */
  const request = (
    name: string,
    description: string,
    act: (ctx: MethodContext, tx: Tx, row: InstanceRow) => Promise<{ row: InstanceRow; requested?: Record<string, unknown> }>,
  ) =>
    defineMethod({
      name,
      reconcile: true,
      resource: (input) => `vps/instances/${input.id}`,
      description,
      input: z.object({ id: resourceId }),
      output: instance,
      handler: async (ctx, input, tx) => {
        const { row, requested } = await act(ctx, tx, await loadInstance(ctx, tx, input.id, true));
        if (requested)
          await ctx.events.publish(tx, { type: "vps.instance.requested", subject: `vps/instances/${row.id}`, data: requested });
        return toInstance(row);
      },
    });

  /** Sets what the instance should be. */
  const desire = (name: "start" | "stop", desired: "running" | "stopped") =>
    request(
      `vps.instances.${name}`,
      name === "start"
        ? "Power an instance on (and keep it running); the reconciler does it"
        : "Power an instance off (and keep it off); the reconciler does it",
      async (ctx, tx, row) => {
        refuseIfGone(row, name);
        // A tenant's stop while a drain stops the instance to move it wins: it stays stopped (desireHost clears the mark).
        if (row.desired === desired && row.drain_restart_at == null) return { row };
        const after =
          row.pool_class === "host"
            ? await desireHost(ctx, tx, row, desired)
            : (await one<InstanceRow>(
                tx,
                sql`
                UPDATE vps_instances SET desired = ${desired}, reboot_requested_at = NULL, next_attempt_at = compute_now(), updated_at = compute_now()
                WHERE id = ${row.id} RETURNING *`,
              ))!;
        return { row: after, requested: { action: name, desired } };
      },
    );

  const reboot = request(
    "vps.instances.reboot",
    "Reboot a running instance once (asked again before it happened, still once)",
    async (ctx, tx, row) => {
      refuseIfGone(row, "reboot");
      if (row.desired !== "running")
        throw new ComputeError("FAILED_PRECONDITION", `instance ${row.id} is kept ${row.desired}: start it (vps.instances.start)`, {
          instance: row.id,
          desired: row.desired,
        });
      if (row.pool_class === "host") {
        const after = await rebootHost(ctx, tx, row);
        return { row: after, requested: after !== row ? { action: "reboot" } : undefined };
      }
      if (row.reboot_requested_at !== null) return { row };
      const updated = await one<InstanceRow>(
        tx,
        sql`
      UPDATE vps_instances SET reboot_requested_at = compute_now(), next_attempt_at = compute_now(), updated_at = compute_now()
      WHERE id = ${row.id} RETURNING *`,
      );
      return { row: updated!, requested: { action: "reboot" } };
    },
  );

  const remove = request(
    "vps.instances.delete",
    "Delete an instance in any state: the reconciler deletes its server (one still being created is deleted once its create ended); the quota is freed when it is deleted",
    async (ctx, tx, row) => {
      if (row.desired === "deleted" || row.state === "deleted") return { row };
      const after =
        row.pool_class === "host"
          ? await deleteHost(ctx, tx, row)
          : (await one<InstanceRow>(
              tx,
              sql`
              UPDATE vps_instances SET desired = 'deleted', reboot_requested_at = NULL, next_attempt_at = compute_now(), updated_at = compute_now()
              WHERE id = ${row.id} RETURNING *`,
            ))!;
      return { row: after, requested: { action: "delete", desired: "deleted" } };
    },
  );

  const history = defineMethod({
    name: "vps.instances.history",
    readOnly: true,
    resource: (input) => `vps/instances/${input.instance}`,
    description: "Every provider call the reconciler made for an instance and its outcome, oldest first, paged",
    input: z.object({
      instance: resourceId,
      limit: pageLimit,
      after: z
        .string()
        .regex(/^\d{1,18}$/, "a history entry's id")
        .optional(),
    }),
    output: z.object({
      entries: z.array(
        z.object({
          id: z.string(),
          at: z.string(),
          call: z.string(),
          outcome: z.enum(["ok", "error"]),
          detail: z.record(z.string(), z.unknown()),
        }),
      ),
      next: z.string().nullable(),
    }),
    handler: async (ctx, input, tx) => {
      await loadInstance(ctx, tx, input.instance);
      // Ordered by h.id, the number: a bare "id" would be the text column of the select list ("100" < "87").
      const found = await rows<{ id: string; at: string; call: string; outcome: "ok" | "error"; detail: Record<string, unknown> }>(
        tx,
        sql`
        SELECT h.id::text AS id, h.at, h.call, h.outcome, h.detail FROM vps_instance_history h
        WHERE h.instance_id = ${input.instance} AND (${input.after ?? null}::bigint IS NULL OR h.id > ${input.after ?? null}::bigint)
        ORDER BY h.id LIMIT ${input.limit}`,
      );
      const entries = found.map((r) => ({ id: r.id, at: iso(r.at), call: r.call, outcome: r.outcome, detail: r.detail }));
      return { entries, next: nextCursor(entries, input.limit, (e) => e.id) };
    },
  });

  /** Answers of the host, read in admission (no transaction open while it waits), for the handler of the same call. */
  const consoles = new WeakMap<object, z.infer<typeof consoleView>>();
  const consoleTail = defineMethod({
    name: "vps.instances.console",
    readOnly: true,
    resource: (input) => `vps/instances/${input.id}`,
    description:
      "The tail of a host pool instance's serial console (at most maxBytes, 16 KiB), asked of its host now; when the host does not answer within a few seconds, the last answer (stale: true)",
    input: z.object({ id: resourceId, maxBytes: z.number().int().min(1).max(MAX_CONSOLE_BYTES).default(MAX_CONSOLE_BYTES) }),
    output: consoleView,
    admission: async (ctx, input) => {
      const row = await ctx.store.transaction((tx) => loadInstance(ctx, tx, input.id));
      if (row.pool_class !== "host")
        throw new ComputeError("UNSUPPORTED", `instance ${row.id} is a provider's server: its console is at the provider`, {
          instance: row.id,
        });
      consoles.set(input, await readConsole(ctx, row, input.maxBytes));
    },
    handler: async (_ctx, input) => consoles.get(input)!,
  });

  return [create, get, list, desire("start", "running"), desire("stop", "stopped"), reboot, remove, history, consoleTail];
}

/** FC-USERDATA-REQUIRED: a host instance without user data is refused before anything is reserved or written. */
function refuseUserData(userData: string | undefined): void {
  if (userData === undefined || userData.length === 0)
    throw invalidArgument("a host pool's instance needs userData: it is all the guest gets (FC-USERDATA-REQUIRED)", { field: "userData" });
  const bytes = new TextEncoder().encode(userData).byteLength;
  if (bytes > MAX_USER_DATA_BYTES)
    throw invalidArgument(`userData is ${bytes} bytes, more than ${MAX_USER_DATA_BYTES}`, {
      field: "userData",
      bytes,
      maxBytes: MAX_USER_DATA_BYTES,
    });
}

/** A deleted, being-deleted or failed instance takes no power request. */
function refuseIfGone(row: InstanceRow, what: string): void {
  if (row.desired === "deleted" || row.state === "deleted")
    throw new ComputeError(
      "FAILED_PRECONDITION",
      `instance ${row.id} is ${row.state === "deleted" ? "deleted" : "being deleted"}: it cannot ${what}`,
      {
        instance: row.id,
        state: row.state,
      },
    );
  if (row.state === "failed")
    throw new ComputeError(
      "FAILED_PRECONDITION",
      `instance ${row.id} failed (${String(row.last_error?.message ?? "no reason recorded")}): delete it and create another`,
      { instance: row.id, state: row.state },
    );
}

export const instanceActions = {
  "vps.instances.create": "Create instances",
  "vps.instances.get": "Read an instance",
  "vps.instances.list": "List instances",
  "vps.instances.start": "Power instances on",
  "vps.instances.stop": "Power instances off",
  "vps.instances.reboot": "Reboot instances",
  "vps.instances.delete": "Delete instances",
  "vps.instances.history": "Read an instance's provider calls",
  "vps.instances.console": "Read the tail of a host pool instance's console",
};
