// The vps module's family for GET /metrics (docs/metrics.md): instances by state and pool, every
// state of every pool reported (0 included). Deleted instances are history and left out; the rest
// are read through vps_instances_live (migration vps/0004_metrics).
import { sql } from "drizzle-orm";
import { rows, type MetricFamily, type ModuleContext } from "better-compute/core";
import { INSTANCE_STATES } from "./instances.ts";

const LIVE = INSTANCE_STATES.filter((s) => s !== "deleted");

export async function instanceMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const pools = await rows<{ pool: string; class: string }>(ctx.store.db, sql`SELECT id AS pool, class FROM vps_pools ORDER BY id`);
  const counted = await rows<{ pool: string; state: string; n: number }>(
    ctx.store.db,
    sql`SELECT pool_id AS pool, state, count(*)::int AS n FROM vps_instances WHERE state <> 'deleted' GROUP BY pool_id, state`,
  );
  const count = new Map(counted.map((r) => [`${r.pool}\n${r.state}`, r.n]));
  return [
    {
      type: "gauge",
      name: "bc_vps_instances",
      help: "VPS instances not deleted, by state and pool (class: provider or host)",
      points: pools.flatMap(({ pool, class: poolClass }) =>
        LIVE.map((state) => ({ labels: { pool, class: poolClass, state }, value: count.get(`${pool}\n${state}`) ?? 0 })),
      ),
    },
  ];
}
