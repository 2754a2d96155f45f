// Human output of a method's answer: a table when the answer is one list of records (nodes,
// workflows, tokens...), else `key: value` lines. Nested values are shown compactly; a table fits
// the terminal (its widest columns clipped first) unless --wide; --json bypasses all of this.
import type { JsonSchema } from "./api.ts";
import { schemaType } from "./commands.ts";

/** A cell's longest, when there is no terminal to fit (output to a pipe or a file). */
const MAX_CELL = 60;
/** Fitting a table clips no column below this (or its header, or its widest cell when narrower). */
const MIN_COLUMN = 8;
const GAP = 2;

export interface Layout {
  /** The terminal's width in columns (process.stdout.columns): a table is fitted to it. */
  width?: number;
  /** --wide: no cell clipped, however wide the table. */
  wide?: boolean;
}

export function formatOutput(value: unknown, schema: JsonSchema = {}, layout: Layout = {}): string {
  if (!value || typeof value !== "object" || Array.isArray(value)) return compact(value);
  const record = value as Record<string, unknown>;
  const list = listProperty(record, schema);
  if (!list) return keyValues(record);
  const rows = record[list] as Record<string, unknown>[];
  const rest = Object.fromEntries(Object.entries(record).filter(([k]) => k !== list));
  const table = rows.length ? formatTable(rows, Object.keys(schema.properties?.[list]?.items?.properties ?? {}), layout) : `(no ${list})`;
  return Object.keys(rest).length ? `${table}\n${keyValues(rest)}` : table;
}

/** The one property holding a list of records, by the schema when it says, else by the value. */
function listProperty(record: Record<string, unknown>, schema: JsonSchema): string | undefined {
  const props = schema.properties;
  const candidates = props
    ? Object.entries(props)
        .filter(([, p]) => schemaType(p) === "array" && p.items && schemaType(p.items) === "object")
        .map(([k]) => k)
    : Object.entries(record)
        .filter(([, v]) => Array.isArray(v) && v.length > 0 && v.every((i) => i && typeof i === "object" && !Array.isArray(i)))
        .map(([k]) => k);
  return candidates.length === 1 && Array.isArray(record[candidates[0]!]) ? candidates[0] : undefined;
}

export function formatTable(rows: Record<string, unknown>[], columnOrder: string[] = [], layout: Layout = {}): string {
  const columns = [...new Set([...columnOrder, ...rows.flatMap((r) => Object.keys(r))])].filter((c) => rows.some((r) => c in r));
  const headers = columns.map((c) => c.toUpperCase());
  const cap = layout.wide || layout.width ? Infinity : MAX_CELL;
  const cells = rows.map((r) => columns.map((c) => clip(cell(r[c]), cap)));
  let widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)));
  if (!layout.wide && layout.width) widths = fit(widths, headers, layout.width);
  const line = (values: string[]) =>
    values
      .map((v, i) => clip(v, widths[i]!))
      .map((v, i) => (i === values.length - 1 ? v : v.padEnd(widths[i]!)))
      .join(" ".repeat(GAP))
      .trimEnd();
  return [line(headers), ...cells.map(line)].join("\n");
}

/** The column widths narrowed, the widest first, until a row fits `width` or every column is at its floor. */
function fit(widths: number[], headers: string[], width: number): number[] {
  const out = [...widths];
  const floors = out.map((w, i) => Math.min(w, Math.max(MIN_COLUMN, headers[i]!.length)));
  let total = out.reduce((sum, w) => sum + w, 0) + GAP * (out.length - 1);
  while (total > width) {
    let widest = -1;
    for (let i = 0; i < out.length; i++) if (out[i]! > floors[i]! && (widest < 0 || out[i]! > out[widest]!)) widest = i;
    if (widest < 0) break; // as narrow as it gets: the terminal wraps the rest
    out[widest] = out[widest]! - 1;
    total--;
  }
  return out;
}

function keyValues(record: Record<string, unknown>): string {
  const lines: string[] = [];
  for (const [key, value] of Object.entries(record)) {
    if (Array.isArray(value) && value.some((v) => v && typeof v === "object")) {
      lines.push(`${key}:`, ...value.map((v) => `  - ${compact(v)}`));
    } else {
      lines.push(`${key}: ${cell(value)}`);
    }
  }
  return lines.join("\n");
}

function cell(value: unknown): string {
  if (value === null || value === undefined) return "-";
  if (Array.isArray(value)) return value.length ? value.map((v) => (v && typeof v === "object" ? compact(v) : String(v))).join(",") : "-";
  if (typeof value === "object") return compact(value);
  return String(value);
}

/** `{a: 1, b: {c: 2}}` as `a=1,b={c=2}`: one word, so a table's columns stay apart. */
export function compact(value: unknown): string {
  if (value === null || value === undefined) return "-";
  if (Array.isArray(value)) return `[${value.map(compact).join(",")}]`;
  if (typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>);
    return entries.length
      ? entries.map(([k, v]) => `${k}=${v && typeof v === "object" && !Array.isArray(v) ? `{${compact(v)}}` : compact(v)}`).join(",")
      : "-";
  }
  return String(value);
}

const clip = (s: string, max: number) => (s.length > max ? `${s.slice(0, max - 1)}…` : s);
