// What an operator sets up: pools (where instances go: an account and a location, or for class
// host the deployment's own hosts, docs/vps.md "Host pools") and flavors (a provider pool's offer
// and image with the offer's sizes; a host pool's sizes). Creates are idempotent: the same fields
// again writes nothing (created: false), other fields are a CONFLICT naming them.
// vps.flavors.create checks a provider pool's offer and image with the provider in `admission`,
// before the handler's transaction opens (a provider call never runs inside a transaction).
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  createOnce,
  defineDeleteMethod,
  defineGetMethod,
  defineListMethod,
  defineMethod,
  invalidArgument,
  notFound,
  one,
  resourceId,
  rows,
  type CreateOnce,
  type Db,
  type MethodContext,
  type MethodDefinition,
  type Tx,
} from "better-compute/core";
import type { DriverDefinition } from "better-compute";
import type { ProviderOffers } from "./contracts.ts";
import { DEFAULT_IMAGE, DEFAULT_RUNTIME } from "./host-instances.ts";
import { defaultFetch, iso, loadAccount, openAccount, refuseLiveInstances, scopeOf, slug, type VpsOptions } from "./methods.ts";

const labels = z.record(z.string().min(1).max(253), z.string().max(253));
const overcommit = z.object({ cpu: z.number(), memory: z.number() });

const pool = z.object({
  id: z.string(),
  /** Provider pools: the account and its provider (null for host pools). */
  account: z.string().nullable(),
  provider: z.string().nullable(),
  class: z.enum(["provider", "host"]),
  agent: z.enum(["none", "bcd"]),
  location: z.string().nullable(),
  /** Host pools (null for provider pools): the hosts considered, the runtime, overcommit ratios, strategy and guest image. */
  hosts: z.object({ labels }).nullable(),
  runtime: z.string().nullable(),
  overcommit: overcommit.nullable(),
  strategy: z.enum(["spread", "pack"]).nullable(),
  image: z.string().nullable(),
  flavors: z.number(),
  /** Instances in the pool that are not deleted. */
  instances: z.number(),
  createdAt: z.string(),
});

const flavor = z.object({
  id: z.string(),
  pool: z.string(),
  name: z.string(),
  /** Provider pools: the provider's offer and image (null in host pools, whose image is the pool's). */
  offer: z.string().nullable(),
  image: z.string().nullable(),
  vcpus: z.number(),
  memoryMiB: z.number(),
  diskGiB: z.number(),
  createdAt: z.string(),
});

export interface PoolRow {
  id: string;
  account_id: string | null;
  provider: string | null;
  class: "provider" | "host";
  agent: "none" | "bcd";
  location: string | null;
  host_labels: Record<string, string> | null;
  runtime: string | null;
  overcommit: { cpu: number; memory: number } | null;
  strategy: "spread" | "pack" | null;
  image: string | null;
  flavors: number;
  instances: number;
  created_at: string;
}

async function findPools(tx: Tx, filter: { id?: string; account?: string }) {
  const found = await rows<PoolRow>(
    tx,
    sql`
      SELECT p.*, a.provider,
             (SELECT count(*)::int FROM vps_flavors f WHERE f.pool_id = p.id) AS flavors,
             (SELECT count(*)::int FROM vps_instances i WHERE i.pool_id = p.id AND i.state <> 'deleted') AS instances
      FROM vps_pools p LEFT JOIN vps_accounts a ON a.id = p.account_id
      WHERE (${filter.id ?? null}::text IS NULL OR p.id = ${filter.id ?? null})
        AND (${filter.account ?? null}::text IS NULL OR p.account_id = ${filter.account ?? null})
      ORDER BY p.id LIMIT 1000`,
  );
  return found.map((r) => ({
    id: r.id,
    account: r.account_id,
    provider: r.provider,
    class: r.class,
    agent: r.agent,
    location: r.location,
    hosts: r.host_labels ? { labels: r.host_labels } : null,
    runtime: r.runtime,
    overcommit: r.overcommit,
    strategy: r.strategy,
    image: r.image,
    flavors: r.flavors,
    instances: r.instances,
    createdAt: iso(r.created_at),
  }));
}

interface FlavorRow {
  id: string;
  pool_id: string;
  name: string;
  offer: string | null;
  image: string | null;
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
  const found = await rows<FlavorRow>(
    tx,
    sql`
    SELECT f.* FROM vps_flavors f
    WHERE (${filter.id ?? null}::text IS NULL OR f.id = ${filter.id ?? null})
      AND (${filter.pool ?? null}::text IS NULL OR f.pool_id = ${filter.pool ?? null})
      AND (${filter.tenant ?? null}::text IS NULL
           OR EXISTS (SELECT 1 FROM vps_quotas q WHERE q.pool_id = f.pool_id AND q.tenant_id = ${filter.tenant ?? null}))
    ORDER BY f.pool_id, f.id LIMIT 1000`,
  );
  return found.map(toFlavor);
}

/** The pool's row; NOT_FOUND when there is none. */
export async function loadPool(db: Db | Tx, poolId: string): Promise<PoolRow> {
  const found = await one<PoolRow>(db, sql`SELECT * FROM vps_pools WHERE id = ${poolId}`);
  if (!found) throw notFound(`pool ${poolId} does not exist`);
  return found;
}

async function poolAccount(db: Db | Tx, poolId: string) {
  const found = await loadPool(db, poolId);
  return { account: await loadAccount(db, found.account_id!), location: found.location };
}

/** A host pool's fields as stored (the defaults applied). */
const hostFields = (input: HostPoolInput) => ({
  host_labels: input.hosts?.labels ?? {},
  runtime: input.runtime ?? DEFAULT_RUNTIME,
  overcommit: { cpu: input.overcommit?.cpu ?? 1, memory: input.overcommit?.memory ?? 1 },
  strategy: input.strategy ?? "spread",
  image: input.image ?? DEFAULT_IMAGE,
});

type HostPoolInput = {
  hosts?: { labels?: Record<string, string> };
  runtime?: string;
  overcommit?: { cpu?: number; memory?: number };
  strategy?: "spread" | "pack";
  image?: string;
};

/** What creating a pool or a flavor of one class writes (createOnce), and the data of its created event. */
type PoolOrFlavorWrite = Omit<CreateOnce, "event"> & { data: Record<string, unknown> };

export function poolMethods(options: VpsOptions): MethodDefinition<any, any>[] {
  const fetch = options.fetch ?? defaultFetch;
  /** Offers the provider gave in admission, for the handler of the same call. */
  const fetched = new WeakMap<object, { offers: ProviderOffers; provider: string }>();

  const poolsCreate = defineMethod({
    name: "vps.pools.create",
    resource: (input) => `vps/pools/${input.id}`,
    description:
      "Create a pool: of provider instances on an account (and a location; agent bcd makes each instance join as a node), or with class host of tenant VMs on the deployment's hosts whose labels include hosts.labels. Idempotent: other fields are CONFLICT naming them",
    input: z.object({
      id: slug,
      class: z.enum(["provider", "host"]).default("provider"),
      /** Provider pools: the account. */
      account: resourceId.optional(),
      agent: z.enum(["none", "bcd"]).default("none"),
      /** The provider's location id (ProviderOffers.locations); default the provider's choice. */
      location: resourceId.optional(),
      /** Host pools: the hosts considered are those whose labels include these (default every host). */
      hosts: z.strictObject({ labels: labels.optional() }).optional(),
      /** Host pools: the runtime driver guests run on (hosts advertise it as bc.dev/driver.<runtime>); default qemu-microvm. */
      runtime: z
        .string()
        .regex(/^[a-z0-9][a-z0-9.-]{0,127}$/)
        .optional(),
      /** Host pools: CPU and memory overcommit ratios (default 1: none); disk is never overcommitted. */
      overcommit: z.strictObject({ cpu: z.number().min(1).max(64).optional(), memory: z.number().min(1).max(64).optional() }).optional(),
      /** Host pools: spread (least used host first, the default) or pack (most used first). */
      strategy: z.enum(["spread", "pack"]).optional(),
      /** Host pools: the guest image's name, as the hosts know it; default bc-guest. */
      image: z
        .string()
        .regex(/^[a-z0-9][a-z0-9._-]{0,127}$/)
        .optional(),
    }),
    output: pool.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const { data, ...write } = input.class === "host" ? hostPool(ctx, input) : await providerPool(input, tx);
      const event = { type: "vps.pool.created", subject: `vps/pools/${input.id}`, data };
      const created = await createOnce(ctx, tx, "pool", input.id, { ...write, event });
      return { ...(await findPools(tx, { id: input.id }))[0]!, created };
    },
  });

  /** A pool of provider instances: an account (and a location; agent bcd makes each instance join as a node). */
  async function providerPool(
    input: HostPoolInput & { id: string; class: "provider" | "host"; account?: string; agent: "none" | "bcd"; location?: string },
    tx: Tx,
  ): Promise<PoolOrFlavorWrite> {
    const hostOnly = (["hosts", "runtime", "overcommit", "strategy", "image"] as const).filter((f) => input[f] !== undefined);
    if (hostOnly.length) throw invalidArgument(`${hostOnly.join(", ")} are for pools of class host`, { fields: hostOnly });
    if (!input.account) throw invalidArgument("a provider pool names its account");
    await loadAccount(tx, input.account);
    if (input.agent === "bcd" && !options.agentUrl)
      throw new ComputeError(
        "FAILED_PRECONDITION",
        "an agent: bcd pool needs the URL its instances join at: set vps({ agentUrl }) in the deployment's config",
      );
    const wanted = { account_id: input.account, class: input.class, agent: input.agent, location: input.location ?? null };
    return {
      insert: sql`
        INSERT INTO vps_pools (id, account_id, class, agent, location)
        VALUES (${input.id}, ${input.account}, ${input.class}, ${input.agent}, ${wanted.location})
        ON CONFLICT DO NOTHING RETURNING id`,
      stored: sql`SELECT account_id, class, agent, location FROM vps_pools WHERE id = ${input.id}`,
      wanted,
      data: { account: input.account, agent: input.agent, location: wanted.location },
    };
  }

  /** A pool of class host: no account, no location, no agent (the hosts run the guests). */
  function hostPool(
    ctx: MethodContext,
    input: HostPoolInput & { id: string; account?: string; agent: string; location?: string },
  ): PoolOrFlavorWrite {
    const providerOnly: string[] = (["account", "location"] as const).filter((f) => input[f] !== undefined);
    if (input.agent !== "none") providerOnly.push("agent");
    if (providerOnly.length)
      throw invalidArgument(`${providerOnly.join(", ")} are for provider pools: a host pool's instances run on hosts`, {
        fields: providerOnly,
      });
    const wanted = { class: "host", ...hostFields(input) };
    // The runtime is a driver someone registered (the built-in ones, or a plugin's): a typo would
    // leave every instance pending on hosts that can never advertise it.
    const runtimes = ctx.registered
      .extensions<DriverDefinition>("driver")
      .filter((d) => d.kinds.includes("runtime"))
      .map((d) => d.id);
    if (!runtimes.includes(wanted.runtime))
      throw invalidArgument(`runtime ${wanted.runtime} is not a registered runtime driver (registered: ${runtimes.join(", ") || "none"})`, {
        runtime: wanted.runtime,
        registered: runtimes,
      });
    return {
      insert: sql`
        INSERT INTO vps_pools (id, account_id, class, agent, location, host_labels, runtime, overcommit, strategy, image)
        VALUES (${input.id}, NULL, 'host', 'none', NULL, ${JSON.stringify(wanted.host_labels)}::jsonb, ${wanted.runtime},
                ${JSON.stringify(wanted.overcommit)}::jsonb, ${wanted.strategy}, ${wanted.image})
        ON CONFLICT DO NOTHING RETURNING id`,
      stored: sql`SELECT class, host_labels, runtime, overcommit, strategy, image FROM vps_pools WHERE id = ${input.id}`,
      wanted,
      data: { class: "host", hosts: { labels: wanted.host_labels }, runtime: wanted.runtime, strategy: wanted.strategy },
    };
  }

  const poolsList = defineListMethod({
    name: "vps.pools.list",
    description: "The pools (of one account)",
    input: z.object({ account: resourceId.optional() }),
    items: { pools: pool },
    find: (tx, input) => findPools(tx, { account: input.account }),
  });

  const poolsGet = defineGetMethod({
    name: "vps.pools.get",
    what: "pool",
    collection: "vps/pools",
    output: pool,
    find: async (tx, id) => (await findPools(tx, { id }))[0],
  });

  const poolsDelete = defineDeleteMethod({
    name: "vps.pools.delete",
    what: "pool",
    collection: "vps/pools",
    description: "Delete a pool with no instance left (deleted ones aside); its flavors and quotas go with it",
    table: "vps_pools",
    event: "vps.pool.deleted",
    refuse: (tx, id) => refuseLiveInstances(tx, sql`pool_id = ${id}`, `pool ${id}`),
  });

  const flavorsCreate = defineMethod({
    name: "vps.flavors.create",
    resource: (input) => `vps/flavors/${input.id}`,
    description:
      "Map a flavor of a provider pool onto the provider's offer and image (both checked against the provider's offers now; its sizes are the offer's), or give a host pool's flavor its sizes (vcpus, memoryMiB, diskGiB)",
    input: z.object({
      id: slug,
      pool: resourceId,
      /** What tenants see; default the id. */
      name: z.string().min(1).max(100).optional(),
      /** Provider pools: the provider's flavor id (vps.accounts.offers: flavors). */
      offer: resourceId.optional(),
      /** Provider pools: the provider's image id (vps.accounts.offers: images). */
      image: resourceId.optional(),
      /** Host pools: the guest's sizes. */
      vcpus: z.number().int().min(1).max(1024).optional(),
      memoryMiB: z.number().int().min(64).max(4_194_304).optional(),
      diskGiB: z.number().int().min(1).max(65_536).optional(),
    }),
    output: flavor.extend({ created: z.boolean() }),
    admission: async (ctx, input) => {
      const found = await loadPool(ctx.store.db, input.pool);
      const sized = (["vcpus", "memoryMiB", "diskGiB"] as const).filter((f) => input[f] !== undefined);
      if (found.class === "host") {
        const missing = (["vcpus", "memoryMiB", "diskGiB"] as const).filter((f) => input[f] === undefined);
        const offered = (["offer", "image"] as const).filter((f) => input[f] !== undefined);
        if (offered.length)
          throw invalidArgument(
            `${offered.join(", ")} are for provider pools: a host pool's flavor is its sizes (its image is the pool's)`,
            {
              fields: offered,
            },
          );
        if (missing.length) throw invalidArgument(`a host pool's flavor gives ${missing.join(", ")}`, { fields: missing });
        return;
      }
      if (sized.length)
        throw invalidArgument(`${sized.join(", ")} are for host pools: a provider flavor's sizes are its offer's`, { fields: sized });
      if (!input.offer || !input.image) throw invalidArgument("a provider pool's flavor names the provider's offer and image");
      const { account } = await poolAccount(ctx.store.db, input.pool);
      const { client, provider } = await openAccount(ctx, account, fetch);
      fetched.set(input, { offers: await client.offers(), provider: provider.id });
    },
    handler: async (ctx, input, tx) => {
      const { data, ...write } =
        (await loadPool(tx, input.pool)).class === "host" ? hostFlavor(input as Required<typeof input>) : await providerFlavor(input, tx);
      const event = { type: "vps.flavor.created", subject: `vps/flavors/${input.id}`, data };
      const created = await createOnce(ctx, tx, "flavor", input.id, { ...write, event });
      return { ...(await findFlavors(tx, { id: input.id }))[0]!, created };
    },
  });

  /** A provider pool's flavor: the provider's offer (its sizes) and image, as the offers admission fetched have them. */
  async function providerFlavor(
    input: { id: string; pool: string; name?: string; offer?: string; image?: string },
    tx: Tx,
  ): Promise<PoolOrFlavorWrite> {
    const { offers, provider } = fetched.get(input)!;
    const { location } = await poolAccount(tx, input.pool);
    const offer = offers.flavors.find((f) => f.id === input.offer);
    if (!offer)
      throw invalidArgument(`offer ${input.offer} is not among ${provider}'s flavors`, {
        offer: input.offer,
        known: offers.flavors.slice(0, 50).map((f) => f.id),
      });
    if (!offers.images.some((i) => i.id === input.image!))
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
    return {
      insert: sql`
        INSERT INTO vps_flavors (id, pool_id, name, offer, image, vcpus, memory_mib, disk_gib)
        VALUES (${input.id}, ${input.pool}, ${wanted.name}, ${input.offer!}, ${input.image!}, ${offer.vcpus}, ${offer.memoryMiB}, ${offer.diskGiB})
        ON CONFLICT DO NOTHING RETURNING id`,
      stored: sql`SELECT pool_id, name, offer, image FROM vps_flavors WHERE id = ${input.id}`,
      wanted,
      data: { pool: input.pool, offer: input.offer, image: input.image },
    };
  }

  /** A host pool's flavor: its sizes, checked by the placer against hosts when an instance is placed. */
  function hostFlavor(input: {
    id: string;
    pool: string;
    name?: string;
    vcpus: number;
    memoryMiB: number;
    diskGiB: number;
  }): PoolOrFlavorWrite {
    const wanted = {
      pool_id: input.pool,
      name: input.name ?? input.id,
      vcpus: input.vcpus,
      memory_mib: input.memoryMiB,
      disk_gib: input.diskGiB,
    };
    return {
      insert: sql`
        INSERT INTO vps_flavors (id, pool_id, name, offer, image, vcpus, memory_mib, disk_gib)
        VALUES (${input.id}, ${input.pool}, ${wanted.name}, NULL, NULL, ${input.vcpus}, ${input.memoryMiB}, ${input.diskGiB})
        ON CONFLICT DO NOTHING RETURNING id`,
      stored: sql`SELECT pool_id, name, vcpus, memory_mib, disk_gib FROM vps_flavors WHERE id = ${input.id}`,
      wanted,
      data: { pool: input.pool, vcpus: input.vcpus, memoryMiB: input.memoryMiB, diskGiB: input.diskGiB },
    };
  }

  const flavorsList = defineListMethod({
    name: "vps.flavors.list",
    description: "The flavors (of one pool); a tenant sees those of the pools offered to it",
    input: z.object({ pool: resourceId.optional() }),
    items: { flavors: flavor },
    find: async (tx, input, ctx) => findFlavors(tx, { pool: input.pool, tenant: (await scopeOf(ctx, tx)).tenant }),
  });

  const flavorsGet = defineGetMethod({
    name: "vps.flavors.get",
    what: "flavor",
    collection: "vps/flavors",
    output: flavor,
    find: async (tx, id, ctx) => (await findFlavors(tx, { id, tenant: (await scopeOf(ctx, tx)).tenant }))[0],
  });

  const flavorsDelete = defineDeleteMethod({
    name: "vps.flavors.delete",
    what: "flavor",
    collection: "vps/flavors",
    description: "Delete a flavor no instance uses (deleted ones aside)",
    table: "vps_flavors",
    event: "vps.flavor.deleted",
    refuse: (tx, id) => refuseLiveInstances(tx, sql`flavor_id = ${id}`, `flavor ${id}`),
  });
  return [poolsCreate, poolsList, poolsGet, poolsDelete, flavorsCreate, flavorsList, flavorsGet, flavorsDelete];
}

export const poolActions = {
  "vps.pools.create": "Create pools (of provider instances, or of class host)",
  "vps.pools.list": "List pools",
  "vps.pools.get": "Read a pool",
  "vps.pools.delete": "Delete pools without instances",
  "vps.flavors.create": "Create flavors (a provider's offer, or a host pool's sizes)",
  "vps.flavors.list": "List flavors",
  "vps.flavors.get": "Read a flavor",
  "vps.flavors.delete": "Delete flavors no instance uses",
};
