// Providers and accounts: what the deployment registered, and an account's credentials (checked by
// the provider's manifest, its secret fields sealed, never shown again). Creates are idempotent:
// the same fields again writes nothing (created: false), other fields are a CONFLICT naming them.
//
// A provider call never runs inside a transaction (on PGlite an open transaction blocks every
// other connection): vps.accounts.offers asks the provider in `admission`, before the handler's
// transaction opens, and hands the answer to the handler.
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  defineDeleteMethod,
  defineGetMethod,
  defineListMethod,
  defineMethod,
  differingFields,
  invalidArgument,
  notFound,
  one,
  refuseOtherFields,
  resourceId,
  rows,
  type MethodDefinition,
  type ModuleContext,
  type Tx,
} from "better-compute/core";
import type { ProviderOffers } from "./contracts.ts";
import {
  defaultFetch,
  iso,
  isoOrNull,
  loadAccount,
  manifestRefusal,
  openAccount,
  providerOf,
  resolvedConfig,
  slug,
  type AccountRow,
  type VpsOptions,
} from "./methods.ts";

const account = z.object({
  id: z.string(),
  provider: z.string(),
  providerVersion: z.string(),
  /** False when this deployment no longer registers the account's provider: its instances are not reconciled. */
  registered: z.boolean(),
  /** As given, each secret field a secret:// reference. */
  config: z.record(z.string(), z.unknown()),
  /** The provider's rate limit is spent until then (no call for the account's instances). */
  pausedUntil: z.string().nullable(),
  pools: z.number(),
  createdAt: z.string(),
});

const offers = z.object({
  flavors: z.array(
    z.object({
      id: z.string(),
      name: z.string(),
      vcpus: z.number(),
      memoryMiB: z.number(),
      diskGiB: z.number(),
      locations: z.array(z.string()).optional(),
    }),
  ),
  images: z.array(z.object({ id: z.string(), name: z.string() })),
  locations: z.array(z.object({ id: z.string(), name: z.string() })),
});

async function findAccounts(ctx: ModuleContext, tx: Tx, id?: string) {
  const found = await rows<AccountRow & { pools: number }>(
    tx,
    sql`
      SELECT a.*, (SELECT count(*)::int FROM vps_pools p WHERE p.account_id = a.id) AS pools
      FROM vps_accounts a WHERE (${id ?? null}::text IS NULL OR a.id = ${id ?? null}) ORDER BY a.id LIMIT 1000`,
  );
  return found.map((r) => ({
    id: r.id,
    provider: r.provider,
    providerVersion: r.provider_version,
    registered: providerOf(ctx, r.provider, r.provider_version) !== undefined,
    config: r.config,
    pausedUntil: isoOrNull(r.paused_until),
    pools: r.pools,
    createdAt: iso(r.created_at),
  }));
}

export function accountMethods(options: VpsOptions): MethodDefinition<any, any>[] {
  const fetch = options.fetch ?? defaultFetch;
  /** Offers the provider gave in admission, for the handler of the same call. */
  const fetched = new WeakMap<object, ProviderOffers>();

  const providersList = defineListMethod({
    name: "vps.providers.list",
    description: "The registered VPS providers: the JSON schema of an account's config (manifest) and its secret fields",
    items: {
      providers: z.object({
        id: z.string(),
        version: z.string(),
        description: z.string().nullable(),
        secretFields: z.array(z.string()),
        manifest: z.unknown(),
      }),
    },
    find: async (_tx, _input, ctx) =>
      ctx.registered.extensions<NonNullable<ReturnType<typeof providerOf>>>("provider").map((p) => ({
        id: p.id,
        version: p.version,
        description: p.description ?? null,
        secretFields: p.secretFields,
        manifest: manifestSchema(p.manifest),
      })),
  });

  const accountsCreate = defineMethod({
    name: "vps.accounts.create",
    resource: (input) => `vps/accounts/${input.id}`,
    description:
      "Register a provider account; its config is checked by the provider's manifest and its secret fields are sealed, never shown again",
    input: z.object({
      id: slug,
      provider: resourceId,
      /** The provider's version; default the newest registered. */
      version: resourceId.optional(),
      config: z.record(z.string(), z.unknown()),
    }),
    output: account.extend({ created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const provider = providerOf(ctx, input.provider, input.version);
      if (!provider)
        throw invalidArgument(`no provider ${input.provider}${input.version ? `@${input.version}` : ""} is registered`, {
          provider: input.provider,
          registered: ctx.registered.extensions<{ contract: string; id: string }>("provider").map((p) => p.id),
        });
      const secrets = secretValues(provider.secretFields, input.config);
      const parsed = provider.manifest.safeParse(input.config);
      if (!parsed.success) throw manifestRefusal(provider, parsed.error, secrets);

      const stored = await one<AccountRow>(tx, sql`SELECT * FROM vps_accounts WHERE id = ${input.id} FOR UPDATE`);
      if (stored) {
        const storedProvider = providerOf(ctx, stored.provider, stored.provider_version);
        const storedConfig = storedProvider ? (await resolvedConfig(ctx, storedProvider, stored.config, tx)).config : stored.config;
        refuseOtherFields(
          "account",
          input.id,
          { provider: stored.provider, version: stored.provider_version, config: storedConfig },
          { provider: provider.id, version: provider.version, config: input.config },
        );
        return { ...(await findAccounts(ctx, tx, input.id))[0]!, created: false };
      }
      const config = await sealed(ctx, tx, input.id, provider.secretFields, input.config);
      await tx.execute(sql`
        INSERT INTO vps_accounts (id, provider, provider_version, config)
        VALUES (${input.id}, ${provider.id}, ${provider.version}, ${JSON.stringify(config)}::jsonb)`);
      await ctx.events.publish(tx, {
        type: "vps.account.created",
        subject: `vps/accounts/${input.id}`,
        data: { provider: provider.id, version: provider.version },
      });
      return { ...(await findAccounts(ctx, tx, input.id))[0]!, created: true };
    },
  });

  const accountsList = defineListMethod({
    name: "vps.accounts.list",
    description: "The provider accounts (secret fields by reference only)",
    items: { accounts: account },
    find: (tx, _input, ctx) => findAccounts(ctx, tx),
  });

  const accountsGet = defineGetMethod({
    name: "vps.accounts.get",
    what: "account",
    collection: "vps/accounts",
    output: account,
    find: async (tx, id, ctx) => (await findAccounts(ctx, tx, id))[0],
  });

  const accountsUpdate = defineMethod({
    name: "vps.accounts.update",
    resource: (input) => `vps/accounts/${input.id}`,
    description:
      "Replace an account's config (checked by the manifest); a secret field left out keeps its sealed value, one given is sealed anew (rotate a token). Its instances are retried at once",
    input: z.object({ id: resourceId, config: z.record(z.string(), z.unknown()) }),
    output: account,
    handler: async (ctx, input, tx) => {
      const stored = await one<AccountRow>(tx, sql`SELECT * FROM vps_accounts WHERE id = ${input.id} FOR UPDATE`);
      if (!stored) throw notFound(`account ${input.id} does not exist`);
      // The stored version, or the newest registered one when this deployment upgraded the provider.
      const provider = providerOf(ctx, stored.provider, stored.provider_version) ?? providerOf(ctx, stored.provider);
      if (!provider)
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `account ${input.id}'s provider ${stored.provider} is not registered in this deployment`,
        );
      const before = await resolvedConfig(ctx, provider, stored.config, tx);
      // Secret fields left out keep what is sealed.
      const kept = provider.secretFields.filter((f) => input.config[f] === undefined && stored.config[f] !== undefined);
      const wanted = { ...input.config, ...Object.fromEntries(kept.map((f) => [f, before.config[f]])) };
      const secrets = [...before.secrets, ...secretValues(provider.secretFields, input.config)];
      const parsed = provider.manifest.safeParse(wanted);
      if (!parsed.success) throw manifestRefusal(provider, parsed.error, secrets);
      const fields = differingFields(before.config, wanted).map((f) => `config.${f}`);
      if (provider.version !== stored.provider_version) fields.push("version");
      if (fields.length === 0) return (await findAccounts(ctx, tx, input.id))[0]!;

      const config = {
        ...(await sealed(ctx, tx, input.id, provider.secretFields, input.config)),
        ...Object.fromEntries(kept.map((f) => [f, stored.config[f]])),
      };
      await tx.execute(sql`
        UPDATE vps_accounts SET config = ${JSON.stringify(config)}::jsonb, provider_version = ${provider.version}, paused_until = NULL
        WHERE id = ${input.id}`);
      // Whatever waited on the old config (a wrong token waits an hour) is tried again now.
      await tx.execute(sql`
        UPDATE vps_instances SET next_attempt_at = compute_now(), attempts = 0, updated_at = compute_now()
        WHERE state <> 'deleted' AND pool_id IN (SELECT id FROM vps_pools WHERE account_id = ${input.id})`);
      await ctx.events.publish(tx, { type: "vps.account.updated", subject: `vps/accounts/${input.id}`, data: { fields } });
      return (await findAccounts(ctx, tx, input.id))[0]!;
    },
  });

  const accountsDelete = defineDeleteMethod({
    name: "vps.accounts.delete",
    what: "account",
    collection: "vps/accounts",
    description: "Delete an account no pool uses",
    table: "vps_accounts",
    event: "vps.account.deleted",
    refuse: async (tx, id) => {
      const pools = (await rows<{ id: string }>(tx, sql`SELECT id FROM vps_pools WHERE account_id = ${id} ORDER BY id`)).map((r) => r.id);
      if (pools.length)
        throw new ComputeError("FAILED_PRECONDITION", `account ${id} is used by pools (${pools.join(", ")}): delete them first`, {
          account: id,
          pools,
        });
    },
  });

  const accountsOffers = defineMethod({
    name: "vps.accounts.offers",
    readOnly: true,
    resource: (input) => `vps/accounts/${input.id}`,
    description: "What the account's provider offers (flavors with their sizes, images, locations), asked of the provider now",
    input: z.object({ id: resourceId }),
    output: offers,
    admission: async (ctx, input) => {
      const { client } = await openAccount(ctx, await loadAccount(ctx.store.db, input.id), fetch);
      fetched.set(input, await client.offers());
    },
    handler: async (_ctx, input) => fetched.get(input)!,
  });

  return [providersList, accountsCreate, accountsList, accountsGet, accountsUpdate, accountsDelete, accountsOffers];
}

export const accountActions = {
  "vps.providers.list": "List the registered VPS providers",
  "vps.accounts.create": "Register provider accounts (their secrets are sealed)",
  "vps.accounts.list": "List provider accounts",
  "vps.accounts.get": "Read a provider account",
  "vps.accounts.update": "Replace a provider account's config (rotate its token)",
  "vps.accounts.delete": "Delete provider accounts no pool uses",
  "vps.accounts.offers": "Ask a provider what it offers",
};

/** The secret values a config gives (strings only: a secret is text). */
function secretValues(fields: readonly string[], config: Record<string, unknown>): string[] {
  for (const field of fields) {
    const value = config[field];
    if (value !== undefined && typeof value !== "string") throw invalidArgument(`config.${field} is a secret field: give it as a string`);
  }
  return fields.map((f) => config[f]).filter((v): v is string => typeof v === "string");
}

/** The config with each secret field it gives sealed (a secret:// reference in its place). */
async function sealed(
  ctx: ModuleContext,
  tx: Tx,
  account: string,
  fields: readonly string[],
  config: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  const out = { ...config };
  for (const field of fields) {
    const value = config[field];
    if (typeof value === "string") out[field] = await ctx.secrets.put(tx, { module: "vps", name: `accounts/${account}/${field}`, value });
  }
  return out;
}

function manifestSchema(manifest: z.ZodType): unknown {
  try {
    const { $schema: _, ...rest } = z.toJSONSchema(manifest, { io: "input", unrepresentable: "any" }) as Record<string, unknown>;
    return rest;
  } catch {
    return {};
  }
}
