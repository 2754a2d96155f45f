// @acme/bc-racks: a third-party plugin of API methods, written as an outside package would
// (public entry points only). It does nothing about malformed input beyond its schemas, and
// one of its methods forgets to bound its id and quotes it whole in its NOT_FOUND: the
// platform's input rules and error path must cover it anyway (test/api-input.test.ts).
import { sql } from "drizzle-orm";
import { z } from "zod";
import { definePlugin } from "better-compute";
import { defineMethod, notFound, resourceId } from "better-compute/core";

const rack = z.object({
  id: z.string(),
  site: z.string(),
  slots: z.number(),
  position: z.object({ row: z.string(), column: z.number() }),
  labels: z.record(z.string(), z.string()),
});

const racksCreate = defineMethod({
  name: "racks.create",
  resource: (input) => `racks/${input.id}`,
  input: z.object({
    id: resourceId,
    site: resourceId,
    slots: z.number().int().min(1).max(64),
    position: z.object({ row: z.string().min(1).max(16), column: z.number().int().min(0) }),
    labels: z.record(z.string().max(63), z.string().max(253)).default({}),
    tags: z.array(z.string().max(32)).max(16).default([]),
  }),
  output: rack,
  handler: async (ctx, input, tx) => {
    await tx.execute(sql`
      INSERT INTO acme_racks (id, site, slots, position, labels)
      VALUES (${input.id}, ${input.site}, ${input.slots}, ${JSON.stringify(input.position)}::jsonb, ${JSON.stringify(input.labels)}::jsonb)`);
    await ctx.events.publish(tx, { type: "rack.created", subject: `racks/${input.id}` });
    return input;
  },
});

const racksGet = defineMethod({
  name: "racks.get",
  readOnly: true,
  resource: (input) => `racks/${input.id}`,
  // Unbounded on purpose: the plugin forgot resourceId.
  input: z.object({ id: z.string() }),
  output: rack,
  handler: async (_ctx, input, tx) => {
    const found = await tx.execute(sql`SELECT id, site, slots, position, labels FROM acme_racks WHERE id = ${input.id}`);
    const row = found.rows[0] as z.infer<typeof rack> | undefined;
    if (!row) throw notFound(`rack ${input.id} does not exist`, { id: input.id });
    return row;
  },
});

export const acmeRacks = definePlugin({
  id: "acme-racks",
  iam: { actions: { "racks.create": "Create racks", "racks.get": "Read racks" } },
  migrations: [
    {
      name: "acme-racks/0001_racks",
      sql: `CREATE TABLE IF NOT EXISTS acme_racks (
              id text PRIMARY KEY, site text NOT NULL, slots integer NOT NULL,
              position jsonb NOT NULL, labels jsonb NOT NULL DEFAULT '{}'::jsonb);`,
    },
  ],
  api: [racksCreate, racksGet],
});
