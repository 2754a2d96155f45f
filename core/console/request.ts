// What a console request carries, read the same way by every route (routes.tsx, operator-routes.tsx):
// a form's fields, a list's filters and the page of it the query asks for.
import type { Context } from "hono";
import { invalidArgument } from "../errors.ts";
import type { AppEnv } from "../http.ts";

/** How many rows a page of a list holds. */
const PAGE_SIZE = 25;

export type Form = Record<string, string | File>;

export const field = (form: Form, name: string) => (typeof form[name] === "string" ? (form[name] as string) : undefined);

/** A whole number typed into a field, undefined when empty; anything else goes to the API as typed, which says why it is refused. */
export function numberField(form: Form, name: string): number | string | undefined {
  const value = field(form, name)?.trim();
  if (!value) return undefined;
  return /^-?\d{1,15}$/.test(value) ? Number(value) : value;
}

/** Labels typed one key=value a line (blank lines skipped). */
export function labelsField(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const line of text.split(/\r?\n/)) {
    const trimmed = line.trim();
    if (!trimmed) continue;
    const at = trimmed.indexOf("=");
    if (at <= 0) throw invalidArgument(`a label is key=value, one a line: ${JSON.stringify(trimmed.slice(0, 60))} is not`);
    labels[trimmed.slice(0, at).trim()] = trimmed.slice(at + 1).trim();
  }
  return labels;
}

export function jsonObject(text: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalidArgument("the input is not valid JSON");
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw invalidArgument("the input must be a JSON object");
  return value as Record<string, unknown>;
}

/** A list's filters: the query's parameters of these names that are not empty, trimmed. */
export function queryFilters<K extends string>(c: Context<AppEnv>, names: readonly K[]): Partial<Record<K, string>> {
  const filters: Partial<Record<K, string>> = {};
  for (const name of names) {
    const value = c.req.query(name)?.trim();
    if (value) filters[name] = value;
  }
  return filters;
}

/** The page of a list the query asks for, as a list method's input: after its cursor (none: the first page), PAGE_SIZE rows. */
export function pageOf(c: Context<AppEnv>): { after?: string; limit: number } {
  const after = c.req.query("after") || undefined;
  return { ...(after ? { after } : {}), limit: PAGE_SIZE };
}
