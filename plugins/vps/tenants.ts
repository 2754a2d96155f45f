// Tenants, who acts for them (members: API keys and JWT subjects), what they may use (a quota
// per pool: the pool is offered to the tenant by giving it one) and their SSH keys. A tenant's
// member sees and acts on its own tenant only; what belongs to another tenant is NOT_FOUND.
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  conflict,
  createOnce,
  defineDeleteMethod,
  defineGetMethod,
  defineListMethod,
  defineMethod,
  notFound,
  one,
  resourceId,
  rows,
  type MethodDefinition,
  type ModuleContext,
  type Tx,
} from "better-compute/core";
import { iso, refuseLiveInstances, scopeOf, slug, tenantFor } from "./methods.ts";

const tenant = z.object({
  id: z.string(),
  name: z.string(),
  /** Principals acting for the tenant: "apikey:<id>", "jwt:<sub>". */
  members: z.array(z.string()),
  /** Instances that are not deleted. */
  instances: z.number(),
  createdAt: z.string(),
});

const sizes = z.object({ instances: z.number(), vcpus: z.number(), memoryMiB: z.number(), diskGiB: z.number() });
export type Sizes = z.infer<typeof sizes>;

const quota = z.object({ tenant: z.string(), pool: z.string(), quota: sizes, usage: sizes });

const sshKey = z.object({ id: z.string(), tenant: z.string(), name: z.string(), publicKey: z.string(), createdAt: z.string() });

const principal = z
  .string()
  .max(300)
  .regex(/^(apikey:[0-9a-f]{16}|jwt:[^\s]+)$/, 'a principal is "apikey:<16 hex id>" (iam.apiKeys.create answers the id) or "jwt:<sub>"');

async function findTenants(tx: Tx, id?: string) {
  const found = await rows<{ id: string; name: string; created_at: string; members: string[] | string; instances: number }>(
    tx,
    sql`
      SELECT t.id, t.name, t.created_at,
             coalesce((SELECT array_agg(m.principal ORDER BY m.principal) FROM vps_tenant_members m WHERE m.tenant_id = t.id), '{}') AS members,
             (SELECT count(*)::int FROM vps_instances i WHERE i.tenant_id = t.id AND i.state <> 'deleted') AS instances
      FROM vps_tenants t WHERE (${id ?? null}::text IS NULL OR t.id = ${id ?? null}) ORDER BY t.id LIMIT 1000`,
  );
  return found.map((r) => ({
    id: r.id,
    name: r.name,
    members: pgTextArray(r.members),
    instances: r.instances,
    createdAt: iso(r.created_at),
  }));
}

/** A text[] as the driver hands it back: an array, or its literal when the type is not known to it. */
export function pgTextArray(value: string[] | string | null): string[] {
  if (Array.isArray(value)) return value;
  if (!value || value === "{}") return [];
  return value
    .slice(1, -1)
    .split(",")
    .map((v) => v.replace(/^"(.*)"$/, "$1"));
}

/** What the tenant's instances in the pool hold: every instance not deleted (a failed one too, until deleted). */
export async function usageOf(tx: Tx, tenantId: string, poolId: string): Promise<Sizes> {
  const row = (await one<{ instances: number; vcpus: number; memory_mib: number; disk_gib: number }>(
    tx,
    sql`
      SELECT count(*)::int AS instances, coalesce(sum(vcpus), 0)::int AS vcpus,
             coalesce(sum(memory_mib), 0)::int AS memory_mib, coalesce(sum(disk_gib), 0)::int AS disk_gib
      FROM vps_instances WHERE tenant_id = ${tenantId} AND pool_id = ${poolId} AND state <> 'deleted'`,
  ))!;
  return { instances: row.instances, vcpus: row.vcpus, memoryMiB: row.memory_mib, diskGiB: row.disk_gib };
}

interface QuotaRow {
  tenant_id: string;
  pool_id: string;
  instances: number;
  vcpus: number;
  memory_mib: number;
  disk_gib: number;
}

export const quotaSizes = (q: QuotaRow): Sizes => ({
  instances: q.instances,
  vcpus: q.vcpus,
  memoryMiB: q.memory_mib,
  diskGiB: q.disk_gib,
});

async function findQuotas(tx: Tx, filter: { tenant?: string; pool?: string }) {
  const found = await rows<QuotaRow>(
    tx,
    sql`
      SELECT * FROM vps_quotas
      WHERE (${filter.tenant ?? null}::text IS NULL OR tenant_id = ${filter.tenant ?? null})
        AND (${filter.pool ?? null}::text IS NULL OR pool_id = ${filter.pool ?? null})
      ORDER BY tenant_id, pool_id LIMIT 1000`,
  );
  const out = [];
  for (const q of found)
    out.push({ tenant: q.tenant_id, pool: q.pool_id, quota: quotaSizes(q), usage: await usageOf(tx, q.tenant_id, q.pool_id) });
  return out;
}

interface SshKeyRow {
  id: string;
  tenant_id: string;
  name: string;
  public_key: string;
  created_at: string;
}

const toSshKey = (r: SshKeyRow) => ({ id: r.id, tenant: r.tenant_id, name: r.name, publicKey: r.public_key, createdAt: iso(r.created_at) });

const KEY_TYPES = [
  "ssh-ed25519",
  "ssh-rsa",
  "ecdsa-sha2-nistp256",
  "ecdsa-sha2-nistp384",
  "ecdsa-sha2-nistp521",
  "sk-ssh-ed25519@openssh.com",
  "sk-ecdsa-sha2-nistp256@openssh.com",
];

/**
 * An OpenSSH public key on one line: `<type> <base64> [comment]`, whose blob names the same type.
 * Returns why not, or undefined.
 */
export function sshKeyProblem(line: string): string | undefined {
  const [type, blob] = line.split(" ");
  if (!type || !KEY_TYPES.includes(type)) return `the key type must be one of ${KEY_TYPES.join(", ")}`;
  if (!blob || !/^[A-Za-z0-9+/]+={0,2}$/.test(blob)) return "the key must be <type> <base64 key> [comment] on one line";
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.from(atob(blob), (c) => c.charCodeAt(0));
  } catch {
    return "the key's base64 does not decode";
  }
  // The blob starts with the type again: uint32 length, then the name.
  const length = bytes.length >= 4 ? new DataView(bytes.buffer).getUint32(0) : -1;
  const named = length > 0 && length <= 64 && bytes.length >= 4 + length ? new TextDecoder().decode(bytes.slice(4, 4 + length)) : undefined;
  if (named !== type) return `the key's data is not a ${type} key`;
  return undefined;
}

const publicKey = z
  .string()
  .max(8192)
  .regex(/^[^\r\n\u0000]+$/, "an OpenSSH public key is one line")
  .superRefine((value, ctx) => {
    const problem = sshKeyProblem(value.trim());
    if (problem) ctx.addIssue({ code: "custom", message: problem });
  })
  .transform((v) => v.trim());

/** Publishes a change of the tenant's members (memberAdded, memberRemoved) and answers the tenant as it is now. */
async function membersChanged(ctx: ModuleContext, tx: Tx, type: string, input: { tenant: string; principal: string }) {
  await ctx.events.publish(tx, { type, subject: `vps/tenants/${input.tenant}`, data: { principal: input.principal } });
  return (await findTenants(tx, input.tenant))[0]!;
}

export function tenantMethods(): MethodDefinition<any, any>[] {
  const tenantsCreate = defineMethod({
    name: "vps.tenants.create",
    resource: (input) => `vps/tenants/${input.id}`,
    description: "Create a tenant; the same fields again is idempotent (created: false), other fields are CONFLICT naming them",
    input: z.object({ id: slug, name: z.string().min(1).max(200).optional() }),
    output: tenant.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const name = input.name ?? input.id;
      const created = await createOnce(ctx, tx, "tenant", input.id, {
        insert: sql`INSERT INTO vps_tenants (id, name) VALUES (${input.id}, ${name}) ON CONFLICT DO NOTHING RETURNING id`,
        stored: sql`SELECT name FROM vps_tenants WHERE id = ${input.id}`,
        wanted: { name },
        event: { type: "vps.tenant.created", subject: `vps/tenants/${input.id}` },
      });
      return { ...(await findTenants(tx, input.id))[0]!, created };
    },
  });

  const tenantsList = defineListMethod({
    name: "vps.tenants.list",
    description: "The tenants, with their members and instance counts",
    items: { tenants: tenant },
    find: (tx) => findTenants(tx),
  });

  const tenantsGet = defineGetMethod({
    name: "vps.tenants.get",
    what: "tenant",
    collection: "vps/tenants",
    output: tenant,
    find: async (tx, id) => (await findTenants(tx, id))[0],
  });

  const tenantsDelete = defineDeleteMethod({
    name: "vps.tenants.delete",
    what: "tenant",
    collection: "vps/tenants",
    description: "Delete a tenant with no instance left (deleted ones aside); its members, quotas and SSH keys go with it",
    table: "vps_tenants",
    event: "vps.tenant.deleted",
    refuse: (tx, id) => refuseLiveInstances(tx, sql`tenant_id = ${id}`, `tenant ${id}`),
  });

  const addMember = defineMethod({
    name: "vps.tenants.addMember",
    resource: (input) => `vps/tenants/${input.tenant}`,
    description:
      "Let a principal act for a tenant (an API key with the vps-tenant role: iam.apiKeys.create, then this); a principal is in one tenant at most",
    input: z.object({ tenant: resourceId, principal }),
    output: tenant,
    handler: async (ctx, input, tx) => {
      if ((await tx.execute(sql`SELECT 1 FROM vps_tenants WHERE id = ${input.tenant}`)).rows.length === 0)
        throw notFound(`tenant ${input.tenant} does not exist`);
      const inserted = await tx.execute(sql`
        INSERT INTO vps_tenant_members (principal, tenant_id) VALUES (${input.principal}, ${input.tenant})
        ON CONFLICT DO NOTHING RETURNING principal`);
      if (inserted.rows.length > 0) return membersChanged(ctx, tx, "vps.tenant.memberAdded", input);
      const other = (await one<{ tenant_id: string }>(
        tx,
        sql`SELECT tenant_id FROM vps_tenant_members WHERE principal = ${input.principal}`,
      ))!;
      if (other.tenant_id !== input.tenant)
        throw conflict(`${input.principal} is a member of tenant ${other.tenant_id}: remove it there first`, {
          principal: input.principal,
          tenant: other.tenant_id,
        });
      return (await findTenants(tx, input.tenant))[0]!;
    },
  });

  const removeMember = defineMethod({
    name: "vps.tenants.removeMember",
    resource: (input) => `vps/tenants/${input.tenant}`,
    description: "Stop a principal acting for a tenant (a key that keeps the vps-tenant role then sees nothing)",
    input: z.object({ tenant: resourceId, principal }),
    output: tenant,
    handler: async (ctx, input, tx) => {
      const [found] = await findTenants(tx, input.tenant);
      if (!found) throw notFound(`tenant ${input.tenant} does not exist`);
      const removed = await tx.execute(sql`
        DELETE FROM vps_tenant_members WHERE principal = ${input.principal} AND tenant_id = ${input.tenant} RETURNING principal`);
      if (removed.rows.length === 0) return found;
      return membersChanged(ctx, tx, "vps.tenant.memberRemoved", input);
    },
  });

  const quotasSet = defineMethod({
    name: "vps.quotas.set",
    resource: (input) => `vps/tenants/${input.tenant}`,
    description:
      "Set what a tenant may hold in a pool (instances, vCPUs, memory, disk): this offers the pool to the tenant. A quota below the usage stops new instances only",
    input: z.object({
      tenant: resourceId,
      pool: resourceId,
      instances: z.number().int().min(0).max(1_000_000),
      vcpus: z.number().int().min(0).max(100_000_000),
      memoryMiB: z.number().int().min(0).max(2_000_000_000),
      diskGiB: z.number().int().min(0).max(2_000_000_000),
    }),
    output: quota,
    handler: async (ctx, input, tx) => {
      if ((await tx.execute(sql`SELECT 1 FROM vps_tenants WHERE id = ${input.tenant}`)).rows.length === 0)
        throw notFound(`tenant ${input.tenant} does not exist`);
      if ((await tx.execute(sql`SELECT 1 FROM vps_pools WHERE id = ${input.pool}`)).rows.length === 0)
        throw notFound(`pool ${input.pool} does not exist`);
      await tx.execute(sql`
        INSERT INTO vps_quotas (tenant_id, pool_id, instances, vcpus, memory_mib, disk_gib)
        VALUES (${input.tenant}, ${input.pool}, ${input.instances}, ${input.vcpus}, ${input.memoryMiB}, ${input.diskGiB})
        ON CONFLICT (tenant_id, pool_id) DO UPDATE SET instances = excluded.instances, vcpus = excluded.vcpus,
          memory_mib = excluded.memory_mib, disk_gib = excluded.disk_gib`);
      const quota = { instances: input.instances, vcpus: input.vcpus, memoryMiB: input.memoryMiB, diskGiB: input.diskGiB };
      await ctx.events.publish(tx, { type: "vps.quota.set", subject: `vps/tenants/${input.tenant}`, data: { pool: input.pool, quota } });
      return (await findQuotas(tx, { tenant: input.tenant, pool: input.pool }))[0]!;
    },
  });

  const quotasList = defineListMethod({
    name: "vps.quotas.list",
    description: "Quotas with their current usage; a tenant sees its own (the pools offered to it)",
    input: z.object({ tenant: resourceId.optional(), pool: resourceId.optional() }),
    items: { quotas: quota },
    find: async (tx, input, ctx) => {
      const scope = await scopeOf(ctx, tx);
      if (scope.tenant !== undefined && input.tenant !== undefined && input.tenant !== scope.tenant) return [];
      return findQuotas(tx, { tenant: scope.tenant ?? input.tenant, pool: input.pool });
    },
  });

  const sshKeysCreate = defineMethod({
    name: "vps.sshKeys.create",
    description:
      "Add an OpenSSH public key to a tenant under a name instances are created with; the same key again is idempotent, another key under the name is CONFLICT",
    input: z.object({ tenant: resourceId.optional(), name: slug, publicKey }),
    output: sshKey.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const tenantId = await tenantFor(ctx, tx, input.tenant);
      const id = `k-${crypto.randomUUID().slice(0, 8)}`;
      const row = await one<SshKeyRow>(
        tx,
        sql`
        INSERT INTO vps_ssh_keys (id, tenant_id, name, public_key) VALUES (${id}, ${tenantId}, ${input.name}, ${input.publicKey})
        ON CONFLICT (tenant_id, name) DO NOTHING RETURNING *`,
      );
      if (row) {
        await ctx.events.publish(tx, { type: "vps.sshKey.created", subject: `vps/tenants/${tenantId}`, data: { name: input.name } });
        return { ...toSshKey(row), created: true };
      }
      const stored = (await one<SshKeyRow>(tx, sql`SELECT * FROM vps_ssh_keys WHERE tenant_id = ${tenantId} AND name = ${input.name}`))!;
      if (stored.public_key !== input.publicKey)
        throw conflict(`SSH key ${input.name} exists with another public key: delete it first, or pick another name`, { name: input.name });
      return { ...toSshKey(stored), created: false };
    },
  });

  const sshKeysList = defineListMethod({
    name: "vps.sshKeys.list",
    description: "SSH keys; a tenant sees its own, an operator every tenant's (or one's)",
    input: z.object({ tenant: resourceId.optional() }),
    items: { sshKeys: sshKey },
    find: async (tx, input, ctx) => {
      const scope = await scopeOf(ctx, tx);
      if (scope.tenant !== undefined && input.tenant !== undefined && input.tenant !== scope.tenant) return [];
      const tenantId = scope.tenant ?? input.tenant ?? null;
      const found = await rows<SshKeyRow>(
        tx,
        sql`
        SELECT * FROM vps_ssh_keys WHERE (${tenantId}::text IS NULL OR tenant_id = ${tenantId}) ORDER BY tenant_id, name LIMIT 1000`,
      );
      return found.map(toSshKey);
    },
  });

  const sshKeysDelete = defineMethod({
    name: "vps.sshKeys.delete",
    description: "Remove a tenant's SSH key by name (instances created with it keep it)",
    input: z.object({ tenant: resourceId.optional(), name: resourceId }),
    output: z.object({ name: z.string(), deleted: z.literal(true) }),
    handler: async (ctx, input, tx) => {
      const tenantId = await tenantFor(ctx, tx, input.tenant);
      const removed = await tx.execute(sql`DELETE FROM vps_ssh_keys WHERE tenant_id = ${tenantId} AND name = ${input.name} RETURNING id`);
      if (removed.rows.length === 0) throw notFound(`SSH key ${input.name} does not exist`);
      await ctx.events.publish(tx, { type: "vps.sshKey.deleted", subject: `vps/tenants/${tenantId}`, data: { name: input.name } });
      return { name: input.name, deleted: true as const };
    },
  });

  return [
    tenantsCreate,
    tenantsList,
    tenantsGet,
    tenantsDelete,
    addMember,
    removeMember,
    quotasSet,
    quotasList,
    sshKeysCreate,
    sshKeysList,
    sshKeysDelete,
  ];
}

export const tenantActions = {
  "vps.tenants.create": "Create tenants",
  "vps.tenants.list": "List tenants",
  "vps.tenants.get": "Read a tenant",
  "vps.tenants.delete": "Delete tenants without instances",
  "vps.tenants.addMember": "Let a principal act for a tenant",
  "vps.tenants.removeMember": "Stop a principal acting for a tenant",
  "vps.quotas.set": "Offer pools to tenants with a quota",
  "vps.quotas.list": "List quotas and their usage",
  "vps.sshKeys.create": "Add SSH keys",
  "vps.sshKeys.list": "List SSH keys",
  "vps.sshKeys.delete": "Remove SSH keys",
};
