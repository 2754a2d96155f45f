// The provision module's families for GET /metrics (docs/metrics.md): workflows under way and those
// that finished within the window, by profile and state, and how long each profile's steps took.
// Each reads through an index of migration provision/0004_metrics: a scrape reads the running
// workflows and the window's rows, never the workflow history.
import { sql } from "drizzle-orm";
import {
  durationHistogram,
  inMetricsWindow,
  METRICS_WINDOW_SECONDS,
  rows,
  type MetricFamily,
  type ModuleContext,
} from "better-compute/core";

export const METRICS_SQL = `
CREATE INDEX IF NOT EXISTS workflows_active ON workflows (profile_id, state) WHERE state IN ('running', 'awaiting-approval');
CREATE INDEX IF NOT EXISTS workflows_finished ON workflows (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS workflow_steps_finished ON workflow_steps (finished_at) WHERE finished_at IS NOT NULL;`;

/** From a power call answered at once to an image streamed to disk or an install that reboots. */
const STEP_BUCKETS = [0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600];

export async function workflowMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const db = ctx.store.db;
  const window = `${METRICS_WINDOW_SECONDS / 60} min`;
  const active = await rows<{ profile: string; state: string; n: number }>(
    db,
    sql`SELECT profile_id AS profile, state, count(*)::int AS n FROM workflows
        WHERE state IN ('running', 'awaiting-approval') GROUP BY profile_id, state ORDER BY profile_id, state`,
  );
  const finished = await rows<{ profile: string; state: string; n: number }>(
    db,
    sql`SELECT profile_id AS profile, state, count(*)::int AS n FROM workflows
        WHERE ${inMetricsWindow(sql`finished_at`)} GROUP BY profile_id, state ORDER BY profile_id, state`,
  );
  const steps = await durationHistogram(
    db,
    {
      name: "bc_workflow_step_duration_seconds",
      help: `Step attempts that succeeded in the last ${window}, from start to finish (waits and polls included), by profile and step`,
      buckets: STEP_BUCKETS,
    },
    ["profile", "step"],
    // The profile by the workflow's key, row by row: a join would let the planner hash every workflow.
    sql`SELECT (SELECT profile_id FROM workflows w WHERE w.id = s.workflow_id) AS profile, s.name AS step,
               extract(epoch FROM s.finished_at - coalesce(s.started_at, s.created_at))::float8 AS seconds
        FROM workflow_steps s WHERE ${inMetricsWindow(sql`s.finished_at`)} AND s.state = 'succeeded'`,
  );
  const byProfile = (found: typeof active) => found.map((r) => ({ labels: { profile: r.profile, state: r.state }, value: r.n }));
  return [
    {
      type: "gauge",
      name: "bc_workflows_active",
      help: "Workflows running or awaiting approval, by profile",
      points: byProfile(active),
    },
    {
      type: "gauge",
      name: "bc_workflows_finished",
      help: `Workflows that ended in the last ${window}, by profile and outcome (succeeded, failed, cancelled)`,
      points: byProfile(finished),
    },
    steps,
  ];
}
