// What the vps method files (accounts.ts, tenants.ts, instances.ts) and the reconciler share: the
// module's options, who a caller acts for (a tenant or an operator), the provider an account
// names and a client for the account, and what a delete refuses (idempotent create's comparison
// is better-compute/core's refuseOtherFields).
import { sql, type SQL } from "drizzle-orm";
import { z } from "zod";
import {
  ComputeError,
  invalidArgument,
  invalidConfig,
  isSecretRef,
  notFound,
  one,
  rows,
  schemaIssues,
  slugId,
  type MethodContext,
  type ModuleContext,
  type Db,
  type SecretRef,
  type Tx,
} from "better-compute/core";
import type { Fetch, ProviderClient, ProviderDefinition } from "./contracts.ts";

export interface VpsOptions {
  /** Provider adapters (defineProvider), registered as the module's extensions (provider:id@version). */
  providers?: ProviderDefinition[];
  /** What every provider request goes through; default globalThis.fetch. */
  fetch?: Fetch;
  /** The API URL agents on instances of `agent: bcd` pools join and dial; such pools need it. */
  agentUrl?: string;
  /**
   * TEST HOOK: called around every provider call the reconciler makes, so a test can stop a pass
   * between calls (throw from it) as a crash would. Never set in a deployment.
   */
  hooks?: CallHooks;
}

/** TEST HOOK (see VpsOptions.hooks). `call` is the client's method: find, create, get, powerOff, delete, operation... */
export interface CallHooks {
  beforeCall?(call: string, instance: string): void | Promise<void>;
  afterCall?(call: string, instance: string): void | Promise<void>;
}

/** globalThis.fetch, called as a function (workerd refuses it detached from globalThis). */
export const defaultFetch: Fetch = (input, init) => globalThis.fetch(input, init);

/** The role an operator gives tenants' keys; its actions are declared in module.ts. */
export const TENANT_ROLE = "vps-tenant";

/** An id an operator or a tenant chooses at create time. */
export const slug = slugId;

export const iso = (v: unknown) => new Date(v as string).toISOString();
export const isoOrNull = (v: unknown) => (v === null || v === undefined ? null : iso(v));

// ---------------------------------------------------------------- who a caller acts for

/** A tenant's member acts for that tenant only; anyone else IAM let through is an operator. */
export type Scope = { tenant: string } | { tenant?: undefined };

export async function scopeOf(ctx: MethodContext, tx: Tx): Promise<Scope> {
  const found = await one<{ tenant_id: string }>(tx, sql`SELECT tenant_id FROM vps_tenant_members WHERE principal = ${ctx.principal.id}`);
  if (found) return { tenant: found.tenant_id };
  // A tenant's key that was never added (or was removed) must not act as an operator.
  if (ctx.principal.roles.includes(TENANT_ROLE))
    throw new ComputeError(
      "PERMISSION_DENIED",
      `${ctx.principal.id} has the ${TENANT_ROLE} role but is not a member of any tenant: an operator adds it with vps.tenants.addMember`,
    );
  return {};
}

/** The tenant a call acts for: a tenant's own (naming another is NOT_FOUND), or the one an operator names. */
export async function tenantFor(ctx: MethodContext, tx: Tx, named: string | undefined): Promise<string> {
  const scope = await scopeOf(ctx, tx);
  if (scope.tenant !== undefined) {
    if (named !== undefined && named !== scope.tenant) throw notFound(`tenant ${named} does not exist`);
    return scope.tenant;
  }
  if (named === undefined) throw invalidArgument("an operator names the tenant the call is for (tenant)");
  if ((await tx.execute(sql`SELECT 1 FROM vps_tenants WHERE id = ${named}`)).rows.length === 0)
    throw notFound(`tenant ${named} does not exist`);
  return named;
}

// ---------------------------------------------------------------- providers and accounts

export interface AccountRow {
  id: string;
  provider: string;
  provider_version: string;
  config: Record<string, unknown>;
  paused_until: string | null;
  created_at: string;
}

/** The registered provider of that id (the newest version unless one is named). */
export function providerOf(ctx: ModuleContext, id: string, version?: string): ProviderDefinition | undefined {
  return ctx.registered
    .extensions<ProviderDefinition>("provider")
    .filter((p) => p.id === id && (version === undefined || p.version === version))
    .sort((a, b) => b.version.localeCompare(a.version, undefined, { numeric: true }))[0];
}

/** Replaces every secret value in a text (an error, zod issues) with [redacted]. */
export function scrub(text: string, secrets: readonly string[]): string {
  return secrets.filter((s) => s.length >= 4).reduce((out, secret) => out.split(secret).join("[redacted]"), text);
}

/** A manifest's refusal as INVALID_ARGUMENT with zod's issues, quoting none of the account's secrets. */
export function manifestRefusal(provider: ProviderDefinition, error: z.ZodError, secrets: readonly string[]): ComputeError {
  const issues = JSON.parse(scrub(JSON.stringify(schemaIssues(error)), secrets)) as unknown[];
  return invalidArgument(`the account's config does not match provider ${provider.id}'s manifest`, { provider: provider.id, issues });
}

/** The account's secret fields resolved: the config the manifest and the client read. */
export async function resolvedConfig(
  ctx: ModuleContext,
  provider: ProviderDefinition,
  config: Record<string, unknown>,
  tx?: Tx,
): Promise<{ config: Record<string, unknown>; secrets: string[] }> {
  const refs = provider.secretFields.map((f) => config[f]).filter((v): v is SecretRef => typeof v === "string" && isSecretRef(v));
  const values = await ctx.secrets.resolveAll(refs, tx);
  const resolved = { ...config };
  for (const field of provider.secretFields) {
    const ref = config[field];
    if (typeof ref === "string" && isSecretRef(ref)) resolved[field] = values.get(ref);
  }
  return { config: resolved, secrets: [...values.values()] };
}

export interface OpenAccount {
  provider: ProviderDefinition;
  client: ProviderClient;
  /** The account's secret values: scrubbed from anything recorded. */
  secrets: string[];
}

/** A client for the account, its secrets resolved; INVALID_CONFIG when its provider is gone or its config no longer fits. */
export async function openAccount(ctx: ModuleContext, account: AccountRow, fetch: Fetch, tx?: Tx): Promise<OpenAccount> {
  const provider = providerOf(ctx, account.provider, account.provider_version);
  if (!provider)
    throw invalidConfig(
      `account ${account.id}'s provider ${account.provider}@${account.provider_version} is not registered in this deployment`,
      {
        account: account.id,
        provider: account.provider,
        failure: "config",
      },
    );
  const { config, secrets } = await resolvedConfig(ctx, provider, account.config, tx);
  const parsed = provider.manifest.safeParse(config);
  if (!parsed.success)
    throw invalidConfig(
      `account ${account.id}'s config no longer matches provider ${provider.id}'s manifest: update it (vps.accounts.update)`,
      {
        account: account.id,
        provider: provider.id,
        failure: "config",
      },
    );
  return { provider, client: provider.client(parsed.data, { fetch }), secrets };
}

export async function loadAccount(db: Db | Tx, id: string): Promise<AccountRow> {
  const found = await one<AccountRow>(db, sql`SELECT * FROM vps_accounts WHERE id = ${id}`);
  if (!found) throw notFound(`account ${id} does not exist`);
  return found;
}

// ---------------------------------------------------------------- deletes

/** Refuses while instances that are not deleted match `where`. */
export async function refuseLiveInstances(tx: Tx, where: SQL, what: string): Promise<void> {
  const live = (
    await rows<{ id: string }>(tx, sql`SELECT id FROM vps_instances WHERE ${where} AND state <> 'deleted' ORDER BY id LIMIT 20`)
  ).map((r) => r.id);
  if (live.length)
    throw new ComputeError("FAILED_PRECONDITION", `${what} still has instances (${live.join(", ")}): delete them first`, {
      instances: live,
    });
}
