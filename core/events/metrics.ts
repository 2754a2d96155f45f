// The sinks module's families for GET /metrics (docs/metrics.md): how far each sink is behind its
// outbox and its open dead letters. One statement per sink, each part through an index (the
// outbox_seq indexes, bc_sink_dead_letters_open): its cost grows neither with the outbox's history
// nor with a stalled sink's backlog (events.sinks.list counts that backlog row by row instead).
import { sql } from "drizzle-orm";
import type { ModuleContext } from "../context.ts";
import type { GaugeFamily, MetricFamily } from "../metrics/openmetrics.ts";
import { one } from "../store/database.ts";
import { registeredSinks } from "./dispatch.ts";

export async function sinkMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const lag: GaugeFamily = {
    type: "gauge",
    name: "bc_sink_lag_events",
    help: "Outbox positions after the sink's cursor: the events (or audit rows) it has yet to receive",
    points: [],
  };
  const age: GaugeFamily = {
    type: "gauge",
    name: "bc_sink_lag_seconds",
    unit: "seconds",
    help: "Age of the oldest event (or audit row) the sink has yet to receive; 0 when it is caught up",
    points: [],
  };
  const dead: GaugeFamily = {
    type: "gauge",
    name: "bc_sink_dead_letters",
    help: "Events (or audit rows) the sink refused for good and no operator has replayed yet",
    points: [],
  };
  for (const sink of registeredSinks(ctx)) {
    const table = sink.kind === "events" ? sql`bc_events` : sql`bc_audit`;
    const at = sink.kind === "events" ? sql`occurred_at` : sql`at`;
    const row = (await one<{ behind: number; age: number; dead: number }>(
      ctx.store.db,
      sql`
      WITH c AS (SELECT coalesce((SELECT position FROM bc_sink_cursors WHERE sink = ${sink.id}), 0) AS position)
      SELECT greatest(coalesce((SELECT max(outbox_seq) FROM ${table}), 0) - c.position, 0)::float8 AS behind,
             coalesce(extract(epoch FROM compute_now() - (
               SELECT ${at} FROM ${table} WHERE outbox_seq > c.position ORDER BY outbox_seq LIMIT 1)), 0)::float8 AS age,
             (SELECT count(*) FROM bc_sink_dead_letters WHERE sink = ${sink.id} AND replayed_at IS NULL)::int AS dead
      FROM c`,
    ))!;
    const labels = { sink: sink.id, source: sink.kind };
    lag.points.push({ labels, value: row.behind });
    age.points.push({ labels, value: row.age });
    dead.points.push({ labels, value: row.dead });
  }
  return [lag, age, dead];
}
