// The Worker's cron triggers, fired locally: nothing calls a Worker's scheduled handler under
// `wrangler dev`, so the local stack reads `[triggers] crons` from the wrangler config and, on
// each matching minute (UTC, as Cloudflare does), asks wrangler dev (run with --test-scheduled)
// for GET /__scheduled?cron=<expression>.

/** A parsed 5-field expression: the allowed values of each field. */
export interface Cron {
  expression: string;
  minutes: Set<number>;
  hours: Set<number>;
  days: Set<number>;
  months: Set<number>;
  weekdays: Set<number>;
  /** Day of month and day of week both restricted: either may match (as in cron(8)). */
  eitherDay: boolean;
}

const FIELDS = [
  { name: "minute", min: 0, max: 59 },
  { name: "hour", min: 0, max: 23 },
  { name: "day of month", min: 1, max: 31 },
  { name: "month", min: 1, max: 12 },
  { name: "day of week", min: 0, max: 7 }, // 7 is Sunday too
] as const;

/** Parses `m h dom mon dow` with *, numbers, lists, ranges and steps; anything else throws naming the expression. */
export function parseCron(expression: string): Cron {
  const parts = expression.trim().split(/\s+/);
  const refuse = (why: string) =>
    new Error(`cron "${expression}": ${why} (the local stack understands 5 fields of *, numbers, lists, ranges and steps)`);
  if (parts.length !== 5) throw refuse(`${parts.length} fields, not 5`);
  const sets = parts.map((part, i) => {
    const { name, min, max } = FIELDS[i]!;
    const values = new Set<number>();
    for (const item of part.split(",")) {
      const m = /^(\*|(\d+)(?:-(\d+))?)(?:\/(\d+))?$/.exec(item);
      if (!m) throw refuse(`cannot read "${item}" in the ${name} field`);
      const from = m[1] === "*" ? min : Number(m[2]);
      const to = m[1] === "*" ? max : m[3] !== undefined ? Number(m[3]) : m[4] !== undefined ? max : from;
      const step = m[4] !== undefined ? Number(m[4]) : 1;
      if (from < min || to > max || from > to) throw refuse(`"${item}" is not within ${min}-${max} in the ${name} field`);
      if (step < 1) throw refuse(`step 0 in the ${name} field`);
      for (let v = from; v <= to; v += step) values.add(v);
    }
    return values;
  });
  const [minutes, hours, days, months, weekdays] = sets as [Set<number>, Set<number>, Set<number>, Set<number>, Set<number>];
  if (weekdays.delete(7)) weekdays.add(0);
  return { expression, minutes, hours, days, months, weekdays, eitherDay: !parts[2]!.startsWith("*") && !parts[4]!.startsWith("*") };
}

/** Whether the cron fires in the minute that holds `at` (UTC). */
export function cronMatches(cron: Cron, at: Date): boolean {
  if (!cron.minutes.has(at.getUTCMinutes()) || !cron.hours.has(at.getUTCHours()) || !cron.months.has(at.getUTCMonth() + 1)) return false;
  const day = cron.days.has(at.getUTCDate());
  const weekday = cron.weekdays.has(at.getUTCDay());
  return cron.eitherDay ? day || weekday : day && weekday;
}

/** The expressions of `[triggers] crons` in a wrangler.toml (or a wrangler.json's triggers.crons); none if there is no such table. */
export function cronsOfConfig(text: string, file: string): string[] {
  if (file.endsWith(".json")) return (JSON.parse(text) as { triggers?: { crons?: string[] } }).triggers?.crons ?? [];
  const lines = text.split("\n");
  const start = lines.findIndex((l) => /^\s*\[triggers\]\s*(#.*)?$/.test(l));
  if (start < 0) return [];
  const end = lines.findIndex((l, i) => i > start && /^\s*\[/.test(l));
  const table = lines
    .slice(start + 1, end < 0 ? undefined : end)
    .map((l) => l.replace(/#.*$/, ""))
    .join("\n");
  const crons = /(?:^|\n)\s*crons\s*=\s*\[([^\]]*)\]/.exec(table);
  if (!crons) return [];
  return [...crons[1]!.matchAll(/"([^"]*)"|'([^']*)'/g)].map((m) => m[1] ?? m[2]!);
}

/**
 * Fires each cron at the start of every minute it matches, by calling `fire(expression)`;
 * a failure goes to onError and the next minute fires as usual. Answers a stop function.
 */
export function scheduleCrons(
  crons: Cron[],
  fire: (expression: string) => Promise<void>,
  onError: (expression: string, err: unknown) => void,
): () => void {
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const next = () => {
    // A second past the minute's start, so a clock read in the handler is inside the minute.
    const wait = 60_000 - (Date.now() % 60_000) + 1_000;
    timer = setTimeout(() => {
      if (stopped) return;
      const now = new Date();
      for (const cron of crons) if (cronMatches(cron, now)) fire(cron.expression).catch((err: unknown) => onError(cron.expression, err));
      next();
    }, wait);
    timer.unref();
  };
  if (crons.length) next();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
