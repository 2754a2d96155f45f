// The agents module's families for GET /metrics (docs/metrics.md): agents connected by role, the
// commands waiting for their agent, and the last hour's command round trips. Each reads through an
// index (migrations/core/0019_metrics_indexes.sql, bc_commands_open), never the command history.
import { sql } from "drizzle-orm";
import type { ModuleContext } from "../context.ts";
import { durationHistogram, inMetricsWindow, METRICS_WINDOW_SECONDS, type MetricFamily } from "../metrics/openmetrics.ts";
import { rows } from "../store/database.ts";

const ROLES = ["node", "site", "ramdisk"] as const;

/** From a BMC call relayed by a site agent (tens of ms) to an image written by a ramdisk (minutes). */
const ROUND_TRIP_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900];

export async function agentMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const db = ctx.store.db;
  const connected = await rows<{ role: string; n: number }>(
    db,
    sql`SELECT role, count(*)::int AS n FROM bc_nodes WHERE state = 'connected' GROUP BY role`,
  );
  const open = await rows<{ kind: string; state: string; n: number }>(
    db,
    sql`SELECT kind, state, count(*)::int AS n FROM bc_commands WHERE state IN ('pending', 'delivered') GROUP BY kind, state ORDER BY kind, state`,
  );
  const roundTrips = await durationHistogram(
    db,
    {
      name: "bc_command_round_trip_seconds",
      help: `Commands completed in the last ${METRICS_WINDOW_SECONDS / 60} min, from enqueue to the agent's result (or expiry), by kind and outcome`,
      buckets: ROUND_TRIP_BUCKETS,
    },
    ["kind", "state"],
    sql`SELECT kind, state, extract(epoch FROM completed_at - created_at)::float8 AS seconds
        FROM bc_commands WHERE ${inMetricsWindow(sql`completed_at`)}`,
  );
  return [
    {
      type: "gauge",
      name: "bc_agents_connected",
      help: "Agents with a live session to the control plane, by role",
      // Every role, 0 included: an alert on a site agent gone needs the series to stay.
      points: ROLES.map((role) => ({ labels: { role }, value: connected.find((r) => r.role === role)?.n ?? 0 })),
    },
    {
      type: "gauge",
      name: "bc_commands_open",
      help: "Commands waiting for their agent's result: pending (not sent yet) or delivered, by kind",
      points: open.map((r) => ({ labels: { kind: r.kind, state: r.state }, value: r.n })),
    },
    roundTrips,
  ];
}
