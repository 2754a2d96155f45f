// The core module: what every deployment has, registered on the same contract as any other.
import { desc, eq, sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type Module } from "./contracts.ts";
import { notFound } from "./errors.ts";
import { mintApiKey, type IamPort } from "./iam.ts";
import type { Registry } from "./registry.ts";
import { apiKeys } from "./store/schema.ts";

export function coreModule(deps: { registry: () => Registry; iam: () => IamPort }): Module {
  const modulesList = defineMethod({
    name: "modules.list",
    action: "modules.list",
    readOnly: true,
    description: "The modules and plugins this deployment registered, with their methods",
    input: z.object({}),
    output: z.object({
      modules: z.array(z.object({ id: z.string(), version: z.string(), kind: z.enum(["module", "plugin"]), methods: z.array(z.string()) })),
    }),
    handler: async () => ({
      modules: deps.registry().modules.map((m) => ({ id: m.id, version: m.version, kind: m.contract, methods: (m.api ?? []).map((x) => x.name) })),
    }),
  });

  const whoami = defineMethod({
    name: "iam.whoami",
    action: "iam.whoami",
    readOnly: true,
    description: "The caller's principal and roles",
    input: z.object({}),
    output: z.object({ principal: z.string(), roles: z.array(z.string()) }),
    handler: async (ctx) => ({ principal: ctx.principal.id, roles: ctx.principal.roles }),
  });

  const apiKey = z.object({ id: z.string(), name: z.string(), roles: z.array(z.string()), createdBy: z.string(), createdAt: z.string(), revoked: z.boolean() });

  const keysCreate = defineMethod({
    name: "iam.apiKeys.create",
    action: "iam.apiKeys.create",
    resource: (input) => `apiKeys/${input.name}`,
    description: "Mint an API key; the key is returned once and stored only as a digest",
    input: z.object({ name: z.string().min(1).max(100), roles: z.array(z.string()).min(1) }),
    output: z.object({ id: z.string(), key: z.string(), roles: z.array(z.string()) }),
    handler: async (ctx, input, tx) => {
      const { id, key } = await mintApiKey(tx, { ...input, createdBy: ctx.principal.id }, deps.iam().roles());
      await ctx.events.publish(tx, { type: "iam.apiKey.created", subject: `apiKeys/${id}`, data: { id, name: input.name, roles: input.roles } });
      return { id, key, roles: input.roles };
    },
  });

  const keysList = defineMethod({
    name: "iam.apiKeys.list",
    action: "iam.apiKeys.list",
    readOnly: true,
    input: z.object({}),
    output: z.object({ keys: z.array(apiKey) }),
    handler: async (_ctx, _input, tx) => {
      const rows = await tx.select().from(apiKeys).orderBy(desc(apiKeys.createdAt));
      return {
        keys: rows.map((r) => ({ id: r.id, name: r.name, roles: r.roles, createdBy: r.createdBy, createdAt: r.createdAt.toISOString(), revoked: r.revokedAt !== null })),
      };
    },
  });

  const keysRevoke = defineMethod({
    name: "iam.apiKeys.revoke",
    action: "iam.apiKeys.revoke",
    resource: (input) => `apiKeys/${input.id}`,
    input: z.object({ id: z.string() }),
    output: z.object({ id: z.string(), revoked: z.literal(true) }),
    handler: async (ctx, input, tx) => {
      const [row] = await tx.select({ revokedAt: apiKeys.revokedAt }).from(apiKeys).where(eq(apiKeys.id, input.id)).for("update");
      if (!row) throw notFound(`API key ${input.id} does not exist`);
      // Revoking twice is not an error, and records one event.
      if (row.revokedAt === null) {
        await tx.execute(sqlRevoke(input.id));
        await ctx.events.publish(tx, { type: "iam.apiKey.revoked", subject: `apiKeys/${input.id}`, data: { id: input.id } });
      }
      return { id: input.id, revoked: true as const };
    },
  });

  return defineModule({
    id: "core",
    description: "Modules, API keys and the caller's identity",
    iam: {
      actions: {
        "modules.list": "List registered modules and their methods",
        "iam.whoami": "Read the caller's own principal",
        "iam.apiKeys.create": "Mint API keys",
        "iam.apiKeys.list": "List API keys (never their secrets)",
        "iam.apiKeys.revoke": "Revoke API keys",
      },
    },
    api: [modulesList, whoami, keysCreate, keysList, keysRevoke],
  });
}

const sqlRevoke = (id: string) => sql`UPDATE bc_api_keys SET revoked_at = compute_now() WHERE id = ${id}`;
