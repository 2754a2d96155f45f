// The core module: what every deployment has, registered on the same contract as any other.
import { desc, eq, sql, type SQL } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type DriverDefinition, type Module } from "./contracts.ts";
import { notFound } from "./errors.ts";
import { defineListMethod } from "./methods.ts";
import { METRICS_ACTION } from "./metrics/routes.ts";
import { nextCursor, recordPage, recordPageInput } from "./paging.ts";
import { mintApiKey, type IamPort } from "./iam.ts";
import { jsonSchema } from "./openapi.ts";
import type { Registry } from "./registry.ts";
import { resourceId } from "./schemas.ts";
import { rows } from "./store/database.ts";
import { apiKeys } from "./store/schema.ts";

export function coreModule(deps: { registry: () => Registry; iam: () => IamPort }): Module {
  const modulesList = defineListMethod({
    name: "modules.list",
    description: "The modules and plugins this deployment registered, with their methods",
    items: { modules: z.object({ id: z.string(), version: z.string(), kind: z.enum(["module", "plugin"]), methods: z.array(z.string()) }) },
    find: async () =>
      deps.registry().modules.map((m) => ({ id: m.id, version: m.version, kind: m.contract, methods: (m.api ?? []).map((x) => x.name) })),
  });

  const whoami = defineMethod({
    name: "iam.whoami",
    readOnly: true,
    description: "The caller's principal and roles",
    input: z.object({}),
    output: z.object({ principal: z.string(), roles: z.array(z.string()) }),
    handler: async (ctx) => ({ principal: ctx.principal.id, roles: ctx.principal.roles }),
  });

  const apiKey = z.object({
    id: z.string(),
    name: z.string(),
    roles: z.array(z.string()),
    createdBy: z.string(),
    createdAt: z.string(),
    revoked: z.boolean(),
  });

  const keysCreate = defineMethod({
    name: "iam.apiKeys.create",
    resource: (input) => `apiKeys/${input.name}`,
    description: "Mint an API key; the key is returned once and stored only as a digest",
    input: z.object({ name: z.string().min(1).max(100), roles: z.array(resourceId).min(1) }),
    output: z.object({ id: z.string(), key: z.string(), roles: z.array(z.string()) }),
    handler: async (ctx, input, tx) => {
      const { id, key } = await mintApiKey(tx, { ...input, createdBy: ctx.principal.id }, deps.iam().roles());
      await ctx.events.publish(tx, {
        type: "iam.apiKey.created",
        subject: `apiKeys/${id}`,
        data: { id, name: input.name, roles: input.roles },
      });
      return { id, key, roles: input.roles };
    },
  });

  const keysList = defineListMethod({
    name: "iam.apiKeys.list",
    items: { keys: apiKey },
    find: async (tx) => {
      const rows = await tx.select().from(apiKeys).orderBy(desc(apiKeys.createdAt));
      return rows.map((r) => ({
        id: r.id,
        name: r.name,
        roles: r.roles,
        createdBy: r.createdBy,
        createdAt: r.createdAt.toISOString(),
        revoked: r.revokedAt !== null,
      }));
    },
  });

  const keysRevoke = defineMethod({
    name: "iam.apiKeys.revoke",
    resource: (input) => `apiKeys/${input.id}`,
    input: z.object({ id: resourceId }),
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

  const driversList = defineListMethod({
    name: "drivers.list",
    description: "The registered drivers: what they drive, where they run, and the JSON schema of a binding (manifest)",
    items: {
      drivers: z.object({
        id: z.string(),
        version: z.string(),
        kinds: z.array(z.string()),
        runsOn: z.string(),
        secretFields: z.array(z.string()),
        manifest: z.unknown().nullable(),
        transport: z.enum(["in-process", "bcx"]),
      }),
    },
    find: async (_tx, _input, ctx) =>
      ctx.registered.extensions<DriverDefinition>("driver").map((d) => ({
        id: d.id,
        version: d.version,
        kinds: d.kinds,
        runsOn: d.runsOn,
        secretFields: d.secretFields ?? [],
        manifest: d.manifest ? jsonSchema(d.manifest, "input") : null,
        transport: d.transport ?? "in-process",
      })),
  });

  const eventsList = defineMethod({
    name: "events.list",
    readOnly: true,
    description:
      "The event record in commit order, oldest first (order: desc for newest first); page with after: the previous page's next (a position)",
    input: z.object({
      /** Exactly this subject, e.g. metal/nodes/m-1. */
      subject: resourceId.optional(),
      /** Exactly this type, or every type under a prefix: metal.node.* */
      type: eventTypeFilter.optional(),
      /** after: the next of the previous page, or an event's position: events after it, in the listing's order. */
      ...recordPageInput("an event's position (digits), e.g. the previous page's next"),
    }),
    output: z.object({ events: z.array(event), next: z.string().nullable() }),
    handler: async (_ctx, input, tx) => {
      const page = recordPage(sql`outbox_seq`, input);
      const found = await rows(
        tx,
        sql`
        SELECT * FROM bc_events
        WHERE ${eventMatches(input)}
          AND ${page.after}
        ${page.orderLimit}`,
      );
      const events = found.map(eventFromRow);
      return { events, next: nextCursor(events, input.limit, (e) => e.position) };
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
        "drivers.list": "List registered drivers",
        "events.list": "Read the event record",
        [METRICS_ACTION]: "Scrape GET /metrics (OpenMetrics, docs/metrics.md)",
      },
      // A key for Prometheus: the metrics and nothing else.
      roles: { metrics: [METRICS_ACTION] },
    },
    api: [modulesList, whoami, keysCreate, keysList, keysRevoke, driversList, eventsList],
  });
}

/** An event type filter: exactly this type, or every type under a prefix: metal.node.* (events.list, events.watch). */
export const eventTypeFilter = z
  .string()
  .max(128)
  .regex(/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?$/, "a dotted event type, or a prefix ending in .* (metal.node.*)");

/** The SQL condition a bc_events row meets under a subject and type filter (either may be absent). */
export function eventMatches(filter: { subject?: string; type?: string }): SQL {
  const prefix = filter.type?.endsWith(".*") ? filter.type.slice(0, -1) : undefined;
  const exact = prefix === undefined ? filter.type : undefined;
  return sql`(${filter.subject ?? null}::text IS NULL OR subject = ${filter.subject ?? null})
          AND (${exact ?? null}::text IS NULL OR type = ${exact ?? null})
          AND (${prefix ?? null}::text IS NULL OR starts_with(type, ${prefix ?? null}))`;
}

/** A bc_events row as the API shows it (events.list, events.watch). */
export function eventFromRow(r: Record<string, any>): z.output<typeof event> {
  return {
    id: String(r.id),
    position: String(r.outbox_seq),
    eventId: r.event_id,
    type: r.type,
    module: r.module,
    subject: r.subject,
    data: r.data,
    actor: r.actor,
    requestId: r.request_id,
    occurredAt: new Date(r.occurred_at).toISOString(),
  };
}

export const event = z.object({
  /** The event's row. */
  id: z.string(),
  /**
   * Its place in commit order (bc_events.outbox_seq, numbered as its transaction commits: migration
   * core/0010): the cursor for after and Last-Event-ID. Ids are handed out at insert, so reading
   * "after an id" could pass an event whose transaction commits later; "after a position" cannot.
   */
  position: z.string(),
  eventId: z.string(),
  type: z.string(),
  module: z.string(),
  subject: z.string().nullable(),
  data: z.record(z.string(), z.unknown()),
  actor: z.string().nullable(),
  requestId: z.string().nullable(),
  occurredAt: z.string(),
});

const sqlRevoke = (id: string) => sql`UPDATE bc_api_keys SET revoked_at = compute_now() WHERE id = ${id}`;
