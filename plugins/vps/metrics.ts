// The vps module's family for GET /metrics (docs/metrics.md): instances by state and pool, every
// state of every pool reported (0 included). Deleted instances are history and left out; the rest
// are read through vps_instances_live (migration vps/0004_metrics).
import { sql } from "drizzle-orm";
import { poolStateGauge, rows, type MetricFamily, type ModuleContext } from "better-compute/core";
import { INSTANCE_STATES } from "./instances.ts";

const LIVE = INSTANCE_STATES.filter((s) => s !== "deleted");

export async function instanceMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const pools = await rows<{ pool: string; class: string }>(ctx.store.db, sql`SELECT id AS pool, class FROM vps_pools ORDER BY id`);
  const counted = await rows<{ pool: string; state: string; n: number }>(
    ctx.store.db,
    sql`SELECT pool_id AS pool, state, count(*)::int AS n FROM vps_instances WHERE state <> 'deleted' GROUP BY pool_id, state`,
  );
  return [
    poolStateGauge(
      { name: "bc_vps_instances", help: "VPS instances not deleted, by state and pool (class: provider or host)" },
      pools.map(({ pool, class: poolClass }) => ({ pool, labels: { pool, class: poolClass } })),
      LIVE,
      counted,
    ),
  ];
}
