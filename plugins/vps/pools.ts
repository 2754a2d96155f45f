// What an operator sets up on an account: pools (where instances go: an account and a location)
// and flavors (a pool's offer and image, with the offer's sizes). Creates are idempotent: the same
// fields again writes nothing (created: false), other fields are a CONFLICT naming them.
// vps.flavors.create checks the offer and image with the provider in `admission`, before the
// handler's transaction opens (a provider call never runs inside a transaction).
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  defineMethod,
  invalidArgument,
  notFound,
  resourceId,
  type Db,
  type MethodDefinition,
  type Tx,
} from "better-compute/core";
import type { ProviderOffers } from "./contracts.ts";
import {
  defaultFetch,
  iso,
  loadAccount,
  openAccount,
  refuseLiveInstances,
  refuseOtherFields,
  scopeOf,
  slug,
  type VpsOptions,
} from "./methods.ts";

const pool = z.object({
  id: z.string(),
  account: z.string(),
  provider: z.string(),
  class: z.literal("provider"),
  agent: z.enum(["none", "bcd"]),
  location: z.string().nullable(),
  flavors: z.number(),
  /** Instances in the pool that are not deleted. */
  instances: z.number(),
  createdAt: z.string(),
});

const flavor = z.object({
  id: z.string(),
  pool: z.string(),
  name: z.string(),
  offer: z.string(),
  image: z.string(),
  vcpus: z.number(),
  memoryMiB: z.number(),
  diskGiB: z.number(),
  createdAt: z.string(),
});

interface PoolRow {
  id: string;
  account_id: string;
  provider: string;
  class: "provider";
  agent: "none" | "bcd";
  location: string | null;
  flavors: number;
  instances: number;
  created_at: string;
}

async function findPools(tx: Tx, filter: { id?: string; account?: string }) {
  const rows = (
    await tx.execute(sql`
      SELECT p.*, a.provider,
             (SELECT count(*)::int FROM vps_flavors f WHERE f.pool_id = p.id) AS flavors,
             (SELECT count(*)::int FROM vps_instances i WHERE i.pool_id = p.id AND i.state <> 'deleted') AS instances
      FROM vps_pools p JOIN vps_accounts a ON a.id = p.account_id
      WHERE (${filter.id ?? null}::text IS NULL OR p.id = ${filter.id ?? null})
        AND (${filter.account ?? null}::text IS NULL OR p.account_id = ${filter.account ?? null})
      ORDER BY p.id LIMIT 1000`)
  ).rows as unknown as PoolRow[];
  return rows.map((r) => ({
    id: r.id,
    account: r.account_id,
    provider: r.provider,
    class: r.class,
    agent: r.agent,
    location: r.location,
    flavors: r.flavors,
    instances: r.instances,
    createdAt: iso(r.created_at),
  }));
}

interface FlavorRow {
  id: string;
  pool_id: string;
  name: string;
  offer: string;
  image: string;
  vcpus: number;
  memory_mib: number;
  disk_gib: number;
  created_at: string;
}

const toFlavor = (r: FlavorRow) => ({
  id: r.id,
  pool: r.pool_id,
  name: r.name,
  offer: r.offer,
  image: r.image,
  vcpus: r.vcpus,
  memoryMiB: r.memory_mib,
  diskGiB: r.disk_gib,
  createdAt: iso(r.created_at),
});

/** Flavors, of pools offered to the tenant when one is named (it has a quota there). */
async function findFlavors(tx: Tx, filter: { id?: string; pool?: string; tenant?: string }) {
  const rows = await tx.execute(sql`
    SELECT f.* FROM vps_flavors f
    WHERE (${filter.id ?? null}::text IS NULL OR f.id = ${filter.id ?? null})
      AND (${filter.pool ?? null}::text IS NULL OR f.pool_id = ${filter.pool ?? null})
      AND (${filter.tenant ?? null}::text IS NULL
           OR EXISTS (SELECT 1 FROM vps_quotas q WHERE q.pool_id = f.pool_id AND q.tenant_id = ${filter.tenant ?? null}))
    ORDER BY f.pool_id, f.id LIMIT 1000`);
  return (rows.rows as unknown as FlavorRow[]).map(toFlavor);
}

async function poolAccount(db: Db | Tx, poolId: string) {
  const found = (await db.execute(sql`SELECT account_id, location FROM vps_pools WHERE id = ${poolId}`)).rows[0] as
    { account_id: string; location: string | null } | undefined;
  if (!found) throw notFound(`pool ${poolId} does not exist`);
  return { account: await loadAccount(db, found.account_id), location: found.location };
}

export function poolMethods(options: VpsOptions): MethodDefinition<any, any>[] {
  const fetch = options.fetch ?? defaultFetch;
  /** Offers the provider gave in admission, for the handler of the same call. */
  const fetched = new WeakMap<object, { offers: ProviderOffers; provider: string }>();

  const poolsCreate = defineMethod({
    name: "vps.pools.create",
    action: "vps.pools.create",
    resource: (input) => `vps/pools/${input.id}`,
    description:
      "Create a pool of provider instances on an account (and a location); agent bcd makes each instance join as a node. Idempotent: other fields are CONFLICT naming them",
    input: z.object({
      id: slug,
      account: resourceId,
      class: z.literal("provider").default("provider"),
      agent: z.enum(["none", "bcd"]).default("none"),
      /** The provider's location id (ProviderOffers.locations); default the provider's choice. */
      location: resourceId.optional(),
    }),
    output: pool.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      await loadAccount(tx, input.account);
      if (input.agent === "bcd" && !options.agentUrl)
        throw new ComputeError(
          "FAILED_PRECONDITION",
          "an agent: bcd pool needs the URL its instances join at: set vps({ agentUrl }) in the deployment's config",
        );
      const wanted = { account_id: input.account, class: input.class, agent: input.agent, location: input.location ?? null };
      const inserted = await tx.execute(sql`
        INSERT INTO vps_pools (id, account_id, class, agent, location)
        VALUES (${input.id}, ${input.account}, ${input.class}, ${input.agent}, ${wanted.location})
        ON CONFLICT DO NOTHING RETURNING id`);
      if (inserted.rows.length === 0) {
        const stored = (await tx.execute(sql`SELECT account_id, class, agent, location FROM vps_pools WHERE id = ${input.id}`))
          .rows[0] as Record<string, unknown>;
        refuseOtherFields("pool", input.id, stored, wanted);
        return { ...(await findPools(tx, { id: input.id }))[0]!, created: false };
      }
      await ctx.events.publish(tx, {
        type: "vps.pool.created",
        subject: `vps/pools/${input.id}`,
        data: { account: input.account, agent: input.agent, location: wanted.location },
      });
      return { ...(await findPools(tx, { id: input.id }))[0]!, created: true };
    },
  });

  const poolsList = defineMethod({
    name: "vps.pools.list",
    action: "vps.pools.list",
    readOnly: true,
    description: "The provider pools (of one account)",
    input: z.object({ account: resourceId.optional() }),
    output: z.object({ pools: z.array(pool) }),
    handler: async (_ctx, input, tx) => ({ pools: await findPools(tx, { account: input.account }) }),
  });

  const poolsGet = defineMethod({
    name: "vps.pools.get",
    action: "vps.pools.get",
    readOnly: true,
    resource: (input) => `vps/pools/${input.id}`,
    input: z.object({ id: resourceId }),
    output: pool,
    handler: async (_ctx, input, tx) => {
      const [found] = await findPools(tx, { id: input.id });
      if (!found) throw notFound(`pool ${input.id} does not exist`);
      return found;
    },
  });

  const poolsDelete = defineMethod({
    name: "vps.pools.delete",
    action: "vps.pools.delete",
    resource: (input) => `vps/pools/${input.id}`,
    description: "Delete a pool with no instance left (deleted ones aside); its flavors and quotas go with it",
    input: z.object({ id: resourceId }),
    output: z.object({ id: z.string(), deleted: z.literal(true) }),
    handler: async (ctx, input, tx) => {
      const found = await tx.execute(sql`SELECT 1 FROM vps_pools WHERE id = ${input.id} FOR UPDATE`);
      if (found.rows.length === 0) throw notFound(`pool ${input.id} does not exist`);
      await refuseLiveInstances(tx, sql`pool_id = ${input.id}`, `pool ${input.id}`);
      await tx.execute(sql`DELETE FROM vps_pools WHERE id = ${input.id}`);
      await ctx.events.publish(tx, { type: "vps.pool.deleted", subject: `vps/pools/${input.id}` });
      return { id: input.id, deleted: true as const };
    },
  });

  const flavorsCreate = defineMethod({
    name: "vps.flavors.create",
    action: "vps.flavors.create",
    resource: (input) => `vps/flavors/${input.id}`,
    description:
      "Map a flavor of a pool onto the provider's offer and image (both checked against the provider's offers now); its sizes are the offer's",
    input: z.object({
      id: slug,
      pool: resourceId,
      /** What tenants see; default the id. */
      name: z.string().min(1).max(100).optional(),
      /** The provider's flavor id (vps.accounts.offers: flavors). */
      offer: resourceId,
      /** The provider's image id (vps.accounts.offers: images). */
      image: resourceId,
    }),
    output: flavor.extend({ created: z.boolean() }),
    admission: async (ctx, input) => {
      const { account } = await poolAccount(ctx.store.db, input.pool);
      const { client, provider } = await openAccount(ctx, account, fetch);
      fetched.set(input, { offers: await client.offers(), provider: provider.id });
    },
    handler: async (ctx, input, tx) => {
      const { offers, provider } = fetched.get(input)!;
      const { location } = await poolAccount(tx, input.pool);
      const offer = offers.flavors.find((f) => f.id === input.offer);
      if (!offer)
        throw invalidArgument(`offer ${input.offer} is not among ${provider}'s flavors`, {
          offer: input.offer,
          known: offers.flavors.slice(0, 50).map((f) => f.id),
        });
      if (!offers.images.some((i) => i.id === input.image))
        throw invalidArgument(`image ${input.image} is not among ${provider}'s images`, {
          image: input.image,
          known: offers.images.slice(0, 50).map((i) => i.id),
        });
      if (location && offer.locations && !offer.locations.includes(location))
        throw invalidArgument(
          `${provider} offers ${input.offer} in ${offer.locations.join(", ")}, not in pool ${input.pool}'s location ${location}`,
          {
            offer: input.offer,
            location,
            locations: offer.locations,
          },
        );
      const wanted = { pool_id: input.pool, name: input.name ?? input.id, offer: input.offer, image: input.image };
      const inserted = await tx.execute(sql`
        INSERT INTO vps_flavors (id, pool_id, name, offer, image, vcpus, memory_mib, disk_gib)
        VALUES (${input.id}, ${input.pool}, ${wanted.name}, ${input.offer}, ${input.image}, ${offer.vcpus}, ${offer.memoryMiB}, ${offer.diskGiB})
        ON CONFLICT DO NOTHING RETURNING id`);
      if (inserted.rows.length === 0) {
        const stored = (await tx.execute(sql`SELECT pool_id, name, offer, image FROM vps_flavors WHERE id = ${input.id}`))
          .rows[0] as Record<string, unknown>;
        refuseOtherFields("flavor", input.id, stored, wanted);
        return { ...(await findFlavors(tx, { id: input.id }))[0]!, created: false };
      }
      await ctx.events.publish(tx, {
        type: "vps.flavor.created",
        subject: `vps/flavors/${input.id}`,
        data: { pool: input.pool, offer: input.offer, image: input.image },
      });
      return { ...(await findFlavors(tx, { id: input.id }))[0]!, created: true };
    },
  });

  const flavorsList = defineMethod({
    name: "vps.flavors.list",
    action: "vps.flavors.list",
    readOnly: true,
    description: "The flavors (of one pool); a tenant sees those of the pools offered to it",
    input: z.object({ pool: resourceId.optional() }),
    output: z.object({ flavors: z.array(flavor) }),
    handler: async (ctx, input, tx) => {
      const scope = await scopeOf(ctx, tx);
      return { flavors: await findFlavors(tx, { pool: input.pool, tenant: scope.tenant }) };
    },
  });

  const flavorsGet = defineMethod({
    name: "vps.flavors.get",
    action: "vps.flavors.get",
    readOnly: true,
    resource: (input) => `vps/flavors/${input.id}`,
    input: z.object({ id: resourceId }),
    output: flavor,
    handler: async (ctx, input, tx) => {
      const scope = await scopeOf(ctx, tx);
      const [found] = await findFlavors(tx, { id: input.id, tenant: scope.tenant });
      if (!found) throw notFound(`flavor ${input.id} does not exist`);
      return found;
    },
  });

  const flavorsDelete = defineMethod({
    name: "vps.flavors.delete",
    action: "vps.flavors.delete",
    resource: (input) => `vps/flavors/${input.id}`,
    description: "Delete a flavor no instance uses (deleted ones aside)",
    input: z.object({ id: resourceId }),
    output: z.object({ id: z.string(), deleted: z.literal(true) }),
    handler: async (ctx, input, tx) => {
      const found = await tx.execute(sql`SELECT 1 FROM vps_flavors WHERE id = ${input.id} FOR UPDATE`);
      if (found.rows.length === 0) throw notFound(`flavor ${input.id} does not exist`);
      await refuseLiveInstances(tx, sql`flavor_id = ${input.id}`, `flavor ${input.id}`);
      await tx.execute(sql`DELETE FROM vps_flavors WHERE id = ${input.id}`);
      await ctx.events.publish(tx, { type: "vps.flavor.deleted", subject: `vps/flavors/${input.id}` });
      return { id: input.id, deleted: true as const };
    },
  });
  return [poolsCreate, poolsList, poolsGet, poolsDelete, flavorsCreate, flavorsList, flavorsGet, flavorsDelete];
}

export const poolActions = {
  "vps.pools.create": "Create provider pools",
  "vps.pools.list": "List provider pools",
  "vps.pools.get": "Read a provider pool",
  "vps.pools.delete": "Delete provider pools without instances",
  "vps.flavors.create": "Map flavors onto a provider's offers",
  "vps.flavors.list": "List flavors",
  "vps.flavors.get": "Read a flavor",
  "vps.flavors.delete": "Delete flavors no instance uses",
};
