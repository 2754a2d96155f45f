// The metal module's family for GET /metrics (docs/metrics.md): machines in service by state, pool
// and site, every state of every pool reported (0 included) so that a panel or an alert on failed
// machines keeps its series. Retired machines are history and left out; the rest are read through
// metal_nodes_in_service (migration metal/0006_metrics).
import { sql } from "drizzle-orm";
import { poolStateGauge, rows, type MetricFamily, type ModuleContext } from "better-compute/core";
import { METAL_STATES } from "./lifecycle.ts";

const IN_SERVICE = METAL_STATES.filter((s) => s !== "retired");

export async function machineMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const pools = await rows<{ pool: string; site: string }>(
    ctx.store.db,
    sql`SELECT id AS pool, site_id AS site FROM metal_pools ORDER BY id`,
  );
  const counted = await rows<{ pool: string; state: string; n: number }>(
    ctx.store.db,
    sql`SELECT pool_id AS pool, state, count(*)::int AS n FROM metal_nodes WHERE state <> 'retired' GROUP BY pool_id, state`,
  );
  return [
    poolStateGauge(
      { name: "bc_metal_machines", help: "Machines enrolled and not retired, by lifecycle state, pool and site" },
      pools.map(({ pool, site }) => ({ pool, labels: { site, pool } })),
      IN_SERVICE,
      counted,
    ),
  ];
}
