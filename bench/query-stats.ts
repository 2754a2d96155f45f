// Where the database time goes, per query kind: a collector for the store's round-trip hook
// (`postgres({ onRoundTrip: stats.record })`), which any section can use, in the bench process
// (PGlite, the metal sim) or in the bench Worker (served at GET /bench/query-stats).
import type { RoundTripHook } from "../core/store/database.ts";
import type { BenchContext } from "./run.ts";

export interface QueryKindStats {
  kind: string;
  count: number;
  /** Sum of the round trips' durations, send to answer, in ms (as the driver saw them). */
  totalMs: number;
}

export class QueryStats {
  #kinds = new Map<string, { count: number; totalMs: number }>();
  // Statements repeat word for word (their values travel as parameters): classify each text once,
  // so the bench's own bookkeeping stays out of the CPU it measures.
  #kindOf = new Map<string, string>();

  /** The store's onRoundTrip hook. */
  readonly record: RoundTripHook = (statement, answeredMs) => {
    let kind = this.#kindOf.get(statement);
    if (kind === undefined) {
      kind = queryKind(statement);
      if (this.#kindOf.size < 10_000) this.#kindOf.set(statement, kind);
    }
    const stats = this.#kinds.get(kind) ?? { count: 0, totalMs: 0 };
    this.#kinds.set(kind, stats);
    stats.count++;
    void answeredMs.then((ms) => (stats.totalMs += ms));
  };

  reset(): void {
    this.#kinds.clear();
  }

  /** Every kind seen since the last reset, the most total time first. */
  snapshot(): QueryKindStats[] {
    return [...this.#kinds].map(([kind, s]) => ({ kind, ...s })).sort((a, b) => b.totalMs - a.totalMs);
  }
}

/**
 * A statement's kind: its verb and the table it works on (BEGIN, COMMIT, `SELECT bc_api_keys`,
 * `INSERT bc_audit`, `WITH bc_nodes`: a CTE by the first table it writes); statements sent
 * together in one round trip are joined with " + ".
 */
export function queryKind(statement: string): string {
  // One round trip's statements are sent one a line (sendWithCommit's, then COMMIT).
  return statement
    .split(/;\s*\n/)
    .map((part) =>
      oneKind(
        part
          .replace(/\/\*.*?\*\//gs, " ")
          .replace(/\s+/g, " ")
          .trim(),
      ),
    )
    .join(" + ");
}

function oneKind(text: string): string {
  const verb = (/^\w+/.exec(text)?.[0] ?? "?").toUpperCase();
  const table = (re: RegExp) => re.exec(text)?.[1]?.replace(/"/g, "");
  switch (verb) {
    case "WITH": {
      const written = table(/\b(?:insert into|update|delete from)\s+("?\w+"?)/i);
      return `WITH ${written ?? table(/\bfrom\s+("?\w+"?)/i) ?? "?"}${written ? "" : " (read)"}`;
    }
    case "SELECT":
      return `SELECT ${table(/\bfrom\s+("?\w+"?)/i) ?? "(no table)"}`;
    case "INSERT":
      return `INSERT ${table(/^insert into\s+("?\w+"?)/i) ?? "?"}`;
    case "UPDATE":
      return `UPDATE ${table(/^update\s+("?\w+"?)/i) ?? "?"}`;
    case "DELETE":
      return `DELETE ${table(/^delete from\s+("?\w+"?)/i) ?? "?"}`;
    default:
      return verb;
  }
}

/** One table of query kinds from several (lanes, runs): counts and times added up, the most total time first. */
export function mergeQueries(tables: QueryKindStats[][]): QueryKindStats[] {
  const kinds = new Map<string, QueryKindStats>();
  for (const row of tables.flat()) {
    const kind = kinds.get(row.kind) ?? { kind: row.kind, count: 0, totalMs: 0 };
    kinds.set(row.kind, { kind: row.kind, count: kind.count + row.count, totalMs: kind.totalMs + row.totalMs });
  }
  return [...kinds.values()].sort((a, b) => b.totalMs - a.totalMs);
}

/** The bench Worker's figures since the last reset (GET /bench/query-stats); `reset` starts them again. */
export async function readQueryStats(baseUrl: string, reset = false): Promise<QueryKindStats[]> {
  const res = await fetch(`${baseUrl}/bench/query-stats${reset ? "?reset=1" : ""}`);
  if (!res.ok) throw new Error(`GET /bench/query-stats answered ${res.status}`);
  return ((await res.json()) as { stats: QueryKindStats[] }).stats;
}

/** Prints one table: kind, count, total ms, mean ms, and per unit (per request, per command) when given. */
export function printQueryStats(
  ctx: Pick<BenchContext, "log" | "table">,
  title: string,
  stats: QueryKindStats[],
  per?: { count: number; unit: string },
): void {
  ctx.log(`${title}:`);
  if (stats.length === 0) return ctx.log("  no round trips");
  const header = ["query kind", "count", "total ms", "mean ms", ...(per ? [`per ${per.unit}`] : [])];
  const all = { kind: "all", count: stats.reduce((n, s) => n + s.count, 0), totalMs: stats.reduce((n, s) => n + s.totalMs, 0) };
  const rows = [...stats, all].map((s) => [
    s.kind,
    String(s.count),
    s.totalMs.toFixed(0),
    (s.totalMs / Math.max(1, s.count)).toFixed(2),
    ...(per ? [(s.count / Math.max(1, per.count)).toFixed(2)] : []),
  ]);
  ctx.table(header, rows);
}
