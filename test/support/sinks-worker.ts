// A deployment for test/node/sinks-do.test.ts: the default modules, a method that publishes an
// event, and two events sinks: a table sink, and a table sink behind a receiver that is down
// while the table acme_sink_gate is empty (the test opens it). Run by `wrangler dev`
// (startStack's main), so the SinkDO, its wake-up and its alarm are the real ones.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { betterCompute, definePlugin, defineSink, tableSink } from "../../core/index.ts";
import { sinkTransaction } from "../../core/events/dispatch.ts";
import { defineMethod } from "../../core/public.ts";
import { metalModule } from "../../plugins/metal/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";

const ping = defineMethod({
  name: "acme.sinks.ping",
  input: z.object({ label: z.string().regex(/^[a-z0-9-]{1,40}$/) }),
  output: z.object({ eventId: z.string() }),
  handler: async (ctx, input, tx) => ({
    eventId: await ctx.events.publish(tx, { type: "acme.pinged", subject: `pings/${input.label}`, data: { label: input.label } }),
  }),
});

const acmeSinks = definePlugin({ id: "acme-sinks", iam: { actions: { "acme.sinks.ping": "Publish an event" } }, api: [ping] });

const behindGate = tableSink({ id: "acme-gated", table: "acme_sink_gated" });
const gated = defineSink({
  id: "acme-gated",
  kind: "events",
  async deliver(batch, ctx) {
    const tx = sinkTransaction(ctx)!;
    const open = await tx.execute(sql`SELECT count(*)::int AS n FROM acme_sink_gate`);
    if ((open.rows[0] as { n: number }).n === 0) throw new Error("the acme receiver is down (its gate is closed)");
    await behindGate.deliver(batch, ctx);
  },
});

const entry = deploymentEntry(
  betterCompute({
    modules: [provisionModule(), metalModule()],
    plugins: [acmeSinks],
    sinks: { events: [tableSink({ id: "acme-copy", table: "acme_sink_copy" }), gated] },
  }),
);
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
