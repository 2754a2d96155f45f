// The audit module: audit.list reads bc_audit, the row every mutating API call writes in its own
// transaction (who, which action, on what, when, with the request id its events carry too).
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type Module } from "./contracts.ts";
import { invalidArgument } from "./errors.ts";
import { nextCursor, recordPage, recordPageInput } from "./paging.ts";
import { resourceId } from "./schemas.ts";
import { rows } from "./store/database.ts";

const entry = z.object({
  /** The row's place in the record: the cursor for after. */
  id: z.string(),
  actor: z.string(),
  action: z.string(),
  resource: z.string(),
  method: z.string(),
  requestId: z.string(),
  at: z.string(),
});

export function auditModule(): Module {
  const auditList = defineMethod({
    name: "audit.list",
    readOnly: true,
    description:
      "The audit record of mutating calls, oldest first (order: desc for newest first); filter by actor, action, resource and time; page with after: the previous page's next",
    input: z.object({
      /** Exactly this principal: apikey:<id>, jwt:<sub>, system:<name>. */
      actor: resourceId.optional(),
      /** Exactly this action, or every action under a prefix: metal.* */
      action: z
        .string()
        .max(128)
        .regex(/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?$/, "a dotted action, or a prefix ending in .* (metal.*)")
        .optional(),
      /** Exactly this resource, or every resource under a prefix ending in /*: metal/nodes/* */
      resource: resourceId.optional(),
      /** At or after this time (ISO 8601). */
      from: z.iso.datetime({ offset: true }).optional(),
      /** Before this time (ISO 8601). */
      to: z.iso.datetime({ offset: true }).optional(),
      /** after: the next of the previous page: rows after this one, in the listing's order. */
      ...recordPageInput("an audit row id (digits) from a previous page"),
    }),
    output: z.object({ entries: z.array(entry), next: z.string().nullable() }),
    handler: async (_ctx, input, tx) => {
      if (input.from && input.to && Date.parse(input.from) >= Date.parse(input.to)) {
        throw invalidArgument("from must be before to", { from: input.from, to: input.to });
      }
      const actionPrefix = input.action?.endsWith(".*") ? input.action.slice(0, -1) : undefined;
      const action = actionPrefix === undefined ? input.action : undefined;
      const resourcePrefix = input.resource?.endsWith("/*") ? input.resource.slice(0, -1) : undefined;
      const resource = resourcePrefix === undefined ? input.resource : undefined;
      const page = recordPage(sql`id`, input);
      const found = await rows<Record<string, any>>(
        tx,
        sql`
        SELECT * FROM bc_audit
        WHERE (${input.actor ?? null}::text IS NULL OR actor = ${input.actor ?? null})
          AND (${action ?? null}::text IS NULL OR action = ${action ?? null})
          AND (${actionPrefix ?? null}::text IS NULL OR starts_with(action, ${actionPrefix ?? null}))
          AND (${resource ?? null}::text IS NULL OR resource = ${resource ?? null})
          AND (${resourcePrefix ?? null}::text IS NULL OR starts_with(resource, ${resourcePrefix ?? null}))
          AND (${input.from ?? null}::timestamptz IS NULL OR at >= ${input.from ?? null}::timestamptz)
          AND (${input.to ?? null}::timestamptz IS NULL OR at < ${input.to ?? null}::timestamptz)
          AND ${page.after}
        ${page.orderLimit}`,
      );
      const entries = found.map((r) => ({
        id: String(r.id),
        actor: r.actor,
        action: r.action,
        resource: r.resource,
        method: r.method,
        requestId: r.request_id,
        at: new Date(r.at).toISOString(),
      }));
      return { entries, next: nextCursor(entries, input.limit, (e) => e.id) };
    },
  });

  return defineModule({
    id: "audit",
    description: "The audit record: who called which mutating method on what, and when",
    iam: { actions: { "audit.list": "Read the audit record" } },
    api: [auditList],
  });
}
