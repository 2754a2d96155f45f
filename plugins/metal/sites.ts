// Sites and pools: created idempotently (the same fields again writes nothing; other fields are a
// CONFLICT naming them, so an operator's intent is never silently dropped), listed, read,
// updated, and deleted only once nothing uses them.
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  conflict,
  createOnce,
  defineDeleteMethod,
  defineGetMethod,
  defineListMethod,
  defineMethod,
  differingFields,
  invalidArgument,
  notFound,
  one,
  resourceId,
  rows,
  slugId,
  type MethodDefinition,
  type Tx,
} from "better-compute/core";
import { siteAgentOf } from "./steps.ts";

/** An id the operator chooses at create time. */
export const slug = slugId;

export const policy = z.object({
  hardwareProfile: z.string(),
  /** Release may reach ready without an attested wipe (agentless machines); recorded as node.release.unverified. */
  allowUnverifiedRelease: z.boolean().default(false),
  /** Networks a site agent may reach machines on over plain HTTP. */
  provisioningCidrs: z.array(z.string().regex(/^[\d.]+\/\d{1,2}$|^[0-9a-f:]+\/\d{1,3}$/i)).default([]),
});
export type Policy = z.infer<typeof policy>;

const site = z.object({
  id: z.string(),
  description: z.string().nullable(),
  /** Pools in the site. */
  pools: z.number(),
  /** Machines in the site that are not retired. */
  machines: z.number(),
  /** The site agent every BMC command goes through (connected first), or null: join one with siteTokens.create. */
  agent: z.string().nullable(),
  createdAt: z.string(),
});

const pool = z.object({
  id: z.string(),
  site: z.string(),
  class: z.literal("metal"),
  agent: z.enum(["bcd", "none"]),
  policy: z.record(z.string(), z.unknown()),
  /** Machines in the pool that are not retired. */
  machines: z.number(),
  createdAt: z.string(),
});

const iso = (v: unknown) => new Date(v as string).toISOString();

interface SiteRow {
  id: string;
  description: string | null;
  pools: number;
  machines: number;
  created_at: string;
}

interface PoolRow {
  id: string;
  site_id: string;
  class: "metal";
  agent: "bcd" | "none";
  policy: Record<string, unknown>;
  machines: number;
  created_at: string;
}

async function findSites(tx: Tx, id?: string) {
  const found = await rows<SiteRow>(
    tx,
    sql`
    SELECT s.id, s.description, s.created_at,
           (SELECT count(*)::int FROM metal_pools p WHERE p.site_id = s.id) AS pools,
           (SELECT count(*)::int FROM metal_nodes n WHERE n.site_id = s.id AND n.state <> 'retired') AS machines
    FROM metal_sites s WHERE (${id ?? null}::text IS NULL OR s.id = ${id ?? null}) ORDER BY s.id LIMIT 1000`,
  );
  const sites = [];
  for (const r of found)
    sites.push({
      id: r.id,
      description: r.description,
      pools: r.pools,
      machines: r.machines,
      agent: (await siteAgentOf(tx, r.id)) ?? null,
      createdAt: iso(r.created_at),
    });
  return sites;
}

async function findPools(tx: Tx, filter: { id?: string; site?: string }) {
  const found = await rows<PoolRow>(
    tx,
    sql`
    SELECT p.*, (SELECT count(*)::int FROM metal_nodes n WHERE n.pool_id = p.id AND n.state <> 'retired') AS machines
    FROM metal_pools p
    WHERE (${filter.id ?? null}::text IS NULL OR p.id = ${filter.id ?? null}) AND (${filter.site ?? null}::text IS NULL OR p.site_id = ${filter.site ?? null})
    ORDER BY p.id LIMIT 1000`,
  );
  return found.map((r) => ({
    id: r.id,
    site: r.site_id,
    class: r.class,
    agent: r.agent,
    policy: r.policy,
    machines: r.machines,
    createdAt: iso(r.created_at),
  }));
}

async function getSite(tx: Tx, id: string) {
  const [found] = await findSites(tx, id);
  if (!found) throw notFound(`site ${id} does not exist`);
  return found;
}

async function getPool(tx: Tx, id: string) {
  const [found] = await findPools(tx, { id });
  if (!found) throw notFound(`pool ${id} does not exist`);
  return found;
}

/** A stored policy as create would have written it today (defaults applied), so older rows compare fairly. */
const normalisedPolicy = (stored: unknown): Record<string, unknown> => {
  const parsed = policy.safeParse(stored);
  return parsed.success ? parsed.data : (stored as Record<string, unknown>);
};

/**
 * Create of a pool that exists: the same fields is idempotent, other fields a CONFLICT naming them
 * in the order the create gives them (site, class, agent, then the policy by its keys).
 */
function refuseOtherPool(id: string, stored: Record<string, unknown>, wanted: Record<string, unknown>): void {
  const fields = Object.keys(wanted).flatMap((key) => differingFields({ [key]: stored[key] }, { [key]: wanted[key] }));
  if (fields.length > 0) throw conflict(`pool ${id} exists with other fields: ${fields.join(", ")}`, { pool: id, fields });
}

export function siteAndPoolMethods(hardwareProfiles: Record<string, unknown>): MethodDefinition<any, any>[] {
  /** What create and update both check about a pool's policy. */
  const checkPolicy = (agent: "bcd" | "none", value: Policy) => {
    if (!hardwareProfiles[value.hardwareProfile])
      throw invalidArgument(`no hardware profile ${value.hardwareProfile} is configured`, { known: Object.keys(hardwareProfiles) });
    // No agent boots on an agentless machine, so none can attest a wipe: ready needs the pool's opt-in.
    if (agent === "none" && !value.allowUnverifiedRelease) {
      throw invalidArgument(
        "an agentless pool (agent: none) cannot attest a wipe: set policy.allowUnverifiedRelease to true to accept its machines as ready without one",
      );
    }
  };

  const sitesCreate = defineMethod({
    name: "metal.sites.create",
    resource: (input) => `metal/sites/${input.id}`,
    description: "Create a site; the same fields again is idempotent (created: false), other fields are CONFLICT naming them",
    input: z.object({ id: slug, description: z.string().max(500).optional() }),
    output: z.object({ id: z.string(), created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const description = input.description ?? null;
      const created = await createOnce(ctx, tx, "site", input.id, {
        insert: sql`INSERT INTO metal_sites (id, description) VALUES (${input.id}, ${description}) ON CONFLICT DO NOTHING RETURNING id`,
        stored: sql`SELECT description FROM metal_sites WHERE id = ${input.id}`,
        wanted: { description },
        event: { type: "metal.site.created", subject: `metal/sites/${input.id}` },
      });
      return { id: input.id, created };
    },
  });

  const sitesList = defineListMethod({
    name: "metal.sites.list",
    description: "The sites, with their pool and machine counts and their agent",
    items: { sites: site },
    find: (tx) => findSites(tx),
  });

  const sitesGet = defineGetMethod({
    name: "metal.sites.get",
    what: "site",
    collection: "metal/sites",
    output: site,
    find: async (tx, id) => (await findSites(tx, id))[0],
  });

  const sitesUpdate = defineMethod({
    name: "metal.sites.update",
    resource: (input) => `metal/sites/${input.id}`,
    description: "Change a site's description (null clears it)",
    input: z.object({ id: resourceId, description: z.string().max(500).nullable() }),
    output: site,
    handler: async (ctx, input, tx) => {
      const stored = await one<{ description: string | null }>(
        tx,
        sql`SELECT description FROM metal_sites WHERE id = ${input.id} FOR UPDATE`,
      );
      if (!stored) throw notFound(`site ${input.id} does not exist`);
      if (stored.description !== input.description) {
        await tx.execute(sql`UPDATE metal_sites SET description = ${input.description} WHERE id = ${input.id}`);
        await ctx.events.publish(tx, { type: "metal.site.updated", subject: `metal/sites/${input.id}`, data: { fields: ["description"] } });
      }
      return getSite(tx, input.id);
    },
  });

  const sitesDelete = defineDeleteMethod({
    name: "metal.sites.delete",
    what: "site",
    collection: "metal/sites",
    description: "Delete a site that has no pools and no live site agent",
    table: "metal_sites",
    event: "metal.site.deleted",
    refuse: async (tx, id) => {
      const pools = (await rows<{ id: string }>(tx, sql`SELECT id FROM metal_pools WHERE site_id = ${id} ORDER BY id`)).map((r) => r.id);
      if (pools.length)
        throw new ComputeError("FAILED_PRECONDITION", `site ${id} still has pools (${pools.join(", ")}): delete them first`, {
          site: id,
          pools,
        });
      // Its agent would keep serving a site that no longer exists (and serve a new one of the same name).
      const agent = await siteAgentOf(tx, id);
      if (agent)
        throw new ComputeError("FAILED_PRECONDITION", `site ${id} still has a site agent (${agent}): revoke it first (nodes.revoke)`, {
          site: id,
          agent,
        });
    },
  });

  const poolsCreate = defineMethod({
    name: "metal.pools.create",
    resource: (input) => `metal/pools/${input.id}`,
    description:
      "Create a pool of machines in a site; the same fields again is idempotent (created: false), other fields are CONFLICT naming them",
    input: z.object({
      id: slug,
      site: resourceId,
      class: z.literal("metal").default("metal"),
      agent: z.enum(["bcd", "none"]).default("bcd"),
      policy,
    }),
    output: z.object({ id: z.string(), created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      checkPolicy(input.agent, input.policy);
      const found = await tx.execute(sql`SELECT 1 FROM metal_sites WHERE id = ${input.site}`);
      if (found.rows.length === 0) throw notFound(`site ${input.site} does not exist`);
      const inserted = await tx.execute(sql`
        INSERT INTO metal_pools (id, site_id, class, agent, policy) VALUES (${input.id}, ${input.site}, ${input.class}, ${input.agent}, ${JSON.stringify(input.policy)}::jsonb)
        ON CONFLICT DO NOTHING RETURNING id`);
      if (inserted.rows.length === 0) {
        const stored = (await one(tx, sql`SELECT site_id AS site, class, agent, policy FROM metal_pools WHERE id = ${input.id}`))!;
        refuseOtherPool(
          input.id,
          { ...stored, policy: normalisedPolicy(stored.policy) },
          { site: input.site, class: input.class, agent: input.agent, policy: input.policy },
        );
        return { id: input.id, created: false };
      }
      await ctx.events.publish(tx, {
        type: "metal.pool.created",
        subject: `metal/pools/${input.id}`,
        data: { site: input.site, hardwareProfile: input.policy.hardwareProfile },
      });
      return { id: input.id, created: true };
    },
  });

  const poolsList = defineListMethod({
    name: "metal.pools.list",
    description: "The pools (of one site), with their policy and machine counts",
    input: z.object({ site: resourceId.optional() }),
    items: { pools: pool },
    find: (tx, input) => findPools(tx, { site: input.site }),
  });

  const poolsGet = defineGetMethod({
    name: "metal.pools.get",
    what: "pool",
    collection: "metal/pools",
    output: pool,
    find: async (tx, id) => (await findPools(tx, { id }))[0],
  });

  const poolsUpdate = defineMethod({
    name: "metal.pools.update",
    resource: (input) => `metal/pools/${input.id}`,
    description:
      "Replace a pool's policy (checked like create); its hardware profile changes only while it holds no machine that is not retired",
    input: z.object({ id: resourceId, policy }),
    output: pool,
    handler: async (ctx, input, tx) => {
      const stored = await one<{ agent: "bcd" | "none"; policy: Record<string, unknown> }>(
        tx,
        sql`SELECT agent, policy FROM metal_pools WHERE id = ${input.id} FOR UPDATE`,
      );
      if (!stored) throw notFound(`pool ${input.id} does not exist`);
      checkPolicy(stored.agent, input.policy);
      const changed = differingFields(normalisedPolicy(stored.policy), input.policy);
      if (changed.length === 0) return getPool(tx, input.id);
      if (changed.includes("hardwareProfile")) {
        // Its machines were commissioned (BIOS, RAID) and their BMC bindings checked under the old profile.
        const held = (
          await rows<{ id: string }>(
            tx,
            sql`SELECT id FROM metal_nodes WHERE pool_id = ${input.id} AND state <> 'retired' ORDER BY id LIMIT 20`,
          )
        ).map((r) => r.id);
        if (held.length) {
          throw new ComputeError(
            "FAILED_PRECONDITION",
            `pool ${input.id} holds machines (${held.join(", ")}) commissioned under hardware profile ${String(stored.policy.hardwareProfile)}: retire them, or make another pool`,
            { pool: input.id, machines: held },
          );
        }
      }
      await tx.execute(sql`UPDATE metal_pools SET policy = ${JSON.stringify(input.policy)}::jsonb WHERE id = ${input.id}`);
      await ctx.events.publish(tx, {
        type: "metal.pool.updated",
        subject: `metal/pools/${input.id}`,
        data: { fields: changed.map((k) => `policy.${k}`) },
      });
      return getPool(tx, input.id);
    },
  });

  const poolsDelete = defineMethod({
    name: "metal.pools.delete",
    resource: (input) => `metal/pools/${input.id}`,
    description: "Delete a pool that holds no machine other than retired ones (whose rows go with it; their events stay)",
    input: z.object({ id: resourceId }),
    output: z.object({ id: z.string(), deleted: z.literal(true), retiredMachines: z.array(z.string()) }),
    handler: async (ctx, input, tx) => {
      const found = await tx.execute(sql`SELECT id FROM metal_pools WHERE id = ${input.id} FOR UPDATE`);
      if (found.rows.length === 0) throw notFound(`pool ${input.id} does not exist`);
      const machines = await rows<{ id: string; state: string }>(
        tx,
        sql`SELECT id, state FROM metal_nodes WHERE pool_id = ${input.id} ORDER BY id FOR UPDATE`,
      );
      const live = machines.filter((m) => m.state !== "retired").map((m) => m.id);
      if (live.length)
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `pool ${input.id} still holds machines (${live.slice(0, 20).join(", ")}${live.length > 20 ? ", ..." : ""}): retire them first`,
          { pool: input.id, machines: live.slice(0, 100), count: live.length },
        );
      // A retired machine is history; its record (transitions) goes with the pool, its events stay.
      const retired = machines.map((m) => m.id);
      await tx.execute(sql`DELETE FROM metal_transitions WHERE node_id IN (SELECT id FROM metal_nodes WHERE pool_id = ${input.id})`);
      await tx.execute(sql`DELETE FROM metal_nodes WHERE pool_id = ${input.id}`);
      await tx.execute(sql`DELETE FROM metal_pools WHERE id = ${input.id}`);
      await ctx.events.publish(tx, { type: "metal.pool.deleted", subject: `metal/pools/${input.id}`, data: { retiredMachines: retired } });
      return { id: input.id, deleted: true as const, retiredMachines: retired };
    },
  });

  return [sitesCreate, sitesList, sitesGet, sitesUpdate, sitesDelete, poolsCreate, poolsList, poolsGet, poolsUpdate, poolsDelete];
}

/** The IAM actions of the methods above. */
export const siteAndPoolActions = {
  "metal.sites.create": "Create sites",
  "metal.sites.list": "List sites",
  "metal.sites.get": "Read a site",
  "metal.sites.update": "Change sites",
  "metal.sites.delete": "Delete sites that nothing uses",
  "metal.pools.create": "Create machine pools",
  "metal.pools.list": "List machine pools",
  "metal.pools.get": "Read a machine pool",
  "metal.pools.update": "Change machine pools' policy",
  "metal.pools.delete": "Delete machine pools that hold no machines",
};
