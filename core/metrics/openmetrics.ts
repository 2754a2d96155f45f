// Metric families as modules report them (ModuleDefinition.metrics), checked and rendered in the
// OpenMetrics 1.0 text format (docs/metrics.md). Every value is computed from the record when
// Prometheus scrapes: what holds now (machines by state) is a gauge, and what happened within the
// window (the last hour's step durations) is a gaugehistogram, since it falls as rows leave the
// window: a counter or histogram there would read as resets to rate().
import { sql, type SQL } from "drizzle-orm";
import { rows, type Runner } from "../store/database.ts";

/** How far back the families of recent activity look. */
export const METRICS_WINDOW_SECONDS = 3600;

/** One series' labels: name → value. */
export type MetricLabels = Readonly<Record<string, string>>;

interface FamilyBase {
  /** [a-zA-Z_:][a-zA-Z0-9_:]*, prefixed by the deployment's namespace (bc_); ends in _<unit> when it has one. */
  name: string;
  help: string;
  /** The base unit its name ends with: "seconds", "bytes". */
  unit?: string;
}

export interface GaugeFamily extends FamilyBase {
  type: "gauge";
  points: { labels: MetricLabels; value: number }[];
}

/** A distribution that can fall (the durations of rows within the window). */
export interface GaugeHistogramFamily extends FamilyBase {
  type: "gaugehistogram";
  /** Upper bounds, finite and ascending; +Inf is implied. */
  buckets: readonly number[];
  /** counts[i]: the observations <= buckets[i] (cumulative); count: all of them; sum: their total. */
  points: { labels: MetricLabels; counts: number[]; count: number; sum: number }[];
}

export type MetricFamily = GaugeFamily | GaugeHistogramFamily;

export const OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/** `column` within the window, in database time. */
export function inMetricsWindow(column: SQL): SQL {
  return sql`${column} > compute_now() - make_interval(secs => ${METRICS_WINDOW_SECONDS})`;
}

/**
 * A gaugehistogram aggregated by the database: `observed` is a SELECT with one text column per
 * label and a `seconds` column, and only its groups come back, however many rows it reads.
 */
export async function durationHistogram(
  runner: Runner,
  family: Omit<GaugeHistogramFamily, "type" | "points" | "unit">,
  labels: readonly string[],
  observed: SQL,
): Promise<GaugeHistogramFamily> {
  const columns = sql.join(
    labels.map((l) => sql.identifier(l)),
    sql`, `,
  );
  const buckets = sql.join(
    family.buckets.map((le) => sql`count(*) FILTER (WHERE seconds <= ${le}::float8)`),
    sql`, `,
  );
  const groups = await rows<Record<string, unknown> & { n: number; total: number; counts: number[] }>(
    runner,
    sql`
    SELECT ${columns}, count(*)::int AS n, coalesce(sum(seconds), 0)::float8 AS total, ARRAY[${buckets}]::int[] AS counts
    FROM (${observed}) observed GROUP BY ${columns} ORDER BY ${columns}`,
  );
  return {
    ...family,
    type: "gaugehistogram",
    unit: "seconds",
    points: groups.map((g) => ({
      labels: Object.fromEntries(labels.map((l) => [l, String(g[l] ?? "")])),
      counts: g.counts.map(Number),
      count: Number(g.n),
      sum: Number(g.total),
    })),
  };
}

/**
 * A gauge of things counted by pool and state, with every state of every pool (0 included), so a
 * panel or an alert on one state keeps its series when nothing is in it. `pools` give each pool's
 * labels (its own first); `counted` is one GROUP BY pool, state.
 */
export function poolStateGauge(
  family: Omit<GaugeFamily, "type" | "points">,
  pools: readonly { pool: string; labels: MetricLabels }[],
  states: readonly string[],
  counted: readonly { pool: string; state: string; n: number }[],
): GaugeFamily {
  const count = new Map(counted.map((r) => [`${r.pool}\n${r.state}`, r.n]));
  return {
    ...family,
    type: "gauge",
    points: pools.flatMap(({ pool, labels }) =>
      states.map((state) => ({ labels: { ...labels, state }, value: count.get(`${pool}\n${state}`) ?? 0 })),
    ),
  };
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Why a family cannot be served as it is, or undefined: what Prometheus would refuse, or two series in one. */
export function familyProblem(family: MetricFamily): string | undefined {
  const { name } = family;
  if (!METRIC_NAME.test(name)) return `${JSON.stringify(name)} is not a metric name`;
  if (family.unit !== undefined && !name.endsWith(`_${family.unit}`))
    return `${name} has unit ${family.unit} but does not end in _${family.unit}`;
  const histogram = family.type === "gaugehistogram";
  const seen = new Set<string>();
  for (const { labels } of family.points as readonly { labels: MetricLabels }[]) {
    const names = Object.keys(labels).sort();
    const bad = names.find((l) => !LABEL_NAME.test(l) || l.startsWith("__") || (histogram && l === "le"));
    if (bad !== undefined) return `${name} has a label named ${JSON.stringify(bad)}`;
    const key = JSON.stringify(names.map((l) => [l, labels[l]]));
    if (seen.has(key)) return `${name} has two series with the labels ${key}`;
    seen.add(key);
  }
  return histogram ? histogramProblem(family) : undefined;
}

function histogramProblem({ name, buckets, points }: GaugeHistogramFamily): string | undefined {
  if (buckets.some((le, i) => !Number.isFinite(le) || (i > 0 && le <= buckets[i - 1]!)))
    return `${name}'s buckets are not finite and ascending`;
  const holds = ({ counts, count, sum }: GaugeHistogramFamily["points"][number]) =>
    counts.length === buckets.length &&
    [...counts, count].every((n, i, all) => Number.isInteger(n) && n >= 0 && (i === 0 || n >= all[i - 1]!)) &&
    Number.isFinite(sum);
  return points.every(holds) ? undefined : `${name}'s counts are not whole, cumulative and within its count`;
}

/** The exposition: each family's TYPE, UNIT and HELP, then its samples, and # EOF. */
export function renderOpenMetrics(families: readonly MetricFamily[]): string {
  const lines: string[] = [];
  for (const family of families) {
    const { name } = family;
    lines.push(`# TYPE ${name} ${family.type}`);
    if (family.unit !== undefined) lines.push(`# UNIT ${name} ${family.unit}`);
    lines.push(`# HELP ${name} ${escape(family.help)}`);
    if (family.type === "gauge") {
      for (const p of family.points) lines.push(`${name}${labelSet(p.labels)} ${number(p.value)}`);
      continue;
    }
    for (const p of family.points) {
      family.buckets.forEach((le, i) => lines.push(`${name}_bucket${labelSet({ ...p.labels, le: bound(le) })} ${p.counts[i]}`));
      lines.push(`${name}_bucket${labelSet({ ...p.labels, le: "+Inf" })} ${p.count}`);
      lines.push(`${name}_gcount${labelSet(p.labels)} ${p.count}`);
      lines.push(`${name}_gsum${labelSet(p.labels)} ${number(p.sum)}`);
    }
  }
  lines.push("# EOF");
  return `${lines.join("\n")}\n`;
}

/** Label values and HELP escape the backslash, the double quote and the line feed. */
const escape = (text: string) => text.replace(/[\\"\n]/g, (c) => (c === "\n" ? "\\n" : `\\${c}`));

function labelSet(labels: MetricLabels): string {
  const pairs = Object.entries(labels).map(([l, v]) => `${l}="${escape(v)}"`);
  return pairs.length === 0 ? "" : `{${pairs.join(",")}}`;
}

function number(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "+Inf" : "-Inf";
  return String(value);
}

/** A bucket's le as Prometheus' own clients write it (1.0, not 1): series keep one name across exporters. */
const bound = (le: number) => (Number.isInteger(le) ? le.toFixed(1) : String(le));
