// GET /metrics: every module's families (ModuleDefinition.metrics) in the OpenMetrics text format,
// for Prometheus (docs/metrics.md). The same API key and IAM as the API, for the action
// metrics.read (the built-in role `metrics` holds only it). Core renders and serves; each module
// reads its own tables. A module whose collector fails or reports a family that does not check is
// left out of that scrape and reported down, so one module never costs the others their metrics.
import { Hono } from "hono";
import type { Bindings } from "../bindings.ts";
import type { ModuleContext } from "../context.ts";
import type { Module } from "../contracts.ts";
import { ComputeError } from "../errors.ts";
import { describeError, type AppEnv } from "../http.ts";
import type { IamPort } from "../iam.ts";
import type { Store } from "../store/database.ts";
import { familyProblem, OPENMETRICS_CONTENT_TYPE, renderOpenMetrics, type GaugeFamily, type MetricFamily } from "./openmetrics.ts";

export const METRICS_ACTION = "metrics.read";

export function metricsRoutes(deps: {
  iam: IamPort;
  modules: readonly Module[];
  moduleContext: (mod: Module, env: Bindings, store: Store) => ModuleContext;
}): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  app.get("/metrics", async (c) => {
    c.set("method", "metrics");
    const store = c.get("store");
    const principal = await deps.iam.authenticate(c.req.raw, store);
    if (!principal) throw new ComputeError("UNAUTHENTICATED", "credentials are required: send 'Authorization: Bearer <API key>'");
    if (!(await deps.iam.authorize(principal, METRICS_ACTION, "*"))) {
      throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not ${METRICS_ACTION} on *`, {
        action: METRICS_ACTION,
        resource: "*",
      });
    }
    const families = await collect(deps, c.env ?? {}, store);
    return c.body(renderOpenMetrics(families), 200, { "content-type": OPENMETRICS_CONTENT_TYPE, "cache-control": "no-store" });
  });
  return app;
}

/**
 * Each module's collector in turn, on the request's one connection (a scrape opens no more).
 * Collectors read current state and the window through indexes, so a scrape costs what the fleet
 * holds now, not its history.
 */
async function collect(deps: Parameters<typeof metricsRoutes>[0], env: Bindings, store: Store): Promise<MetricFamily[]> {
  const families: MetricFamily[] = [];
  const served = new Set<string>();
  const up: GaugeFamily = {
    type: "gauge",
    name: "bc_metrics_collector_up",
    help: "1 if the module's metrics were collected in this scrape, 0 if they failed (see the log)",
    points: [],
  };
  const took: GaugeFamily = {
    type: "gauge",
    name: "bc_metrics_collector_duration_seconds",
    unit: "seconds",
    help: "How long the module's metrics took to collect in this scrape",
    points: [],
  };
  for (const mod of deps.modules) {
    if (!mod.metrics) continue;
    const ctx = deps.moduleContext(mod, env, store);
    const started = Date.now();
    let ok = true;
    try {
      const own = await mod.metrics(ctx);
      const problem = own
        .map((f) => (served.has(f.name) ? `${f.name} is already reported by another module` : familyProblem(f)))
        .find(Boolean);
      if (problem) throw new ComputeError("INVALID_CONFIG", problem);
      for (const f of own) served.add(f.name);
      families.push(...own);
    } catch (err) {
      ok = false;
      ctx.log.warn("a module's metrics failed; its families are left out of this scrape", describeError(err));
    }
    up.points.push({ labels: { module: mod.id }, value: ok ? 1 : 0 });
    took.points.push({ labels: { module: mod.id }, value: (Date.now() - started) / 1000 });
  }
  return [...families, up, took];
}
