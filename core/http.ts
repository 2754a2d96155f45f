// The HTTP shell every router of the deployment shares: a request id on every response, a store
// per request, /v1/health, the error envelope (JSON errors, every 5xx logged) and the input rules
// a request body meets before any route reads it. core/compute.ts mounts the routers on it.
import { Hono, type Context } from "hono";
import { sql } from "drizzle-orm";
import type { z } from "zod";
import type { Bindings } from "./bindings.ts";
import { clip, ComputeError, errorBody, invalidArgument, isComputeError, issuePath, MAX_ECHOED, schemaIssues } from "./errors.ts";
import { createLogger } from "./log.ts";
import { fromPostgresError, type DatabasePort, type Store } from "./store/database.ts";

// Read them with `c.get(name)`: hono's `c.var` copies every variable into a new object on each read.
export type AppEnv = { Bindings: Bindings; Variables: { store: Store; requestId: string; method?: string; longInputs?: string[] } };

/** The deepest a request body may nest (objects and arrays); deeper is refused before it is parsed. */
export const MAX_BODY_DEPTH = 32;

const log = createLogger({ component: "api" });

/** An app with the shell and no routes yet: the caller mounts them (app.route). */
export function serviceApp(deps: { database: DatabasePort; modules: readonly string[] }): Hono<AppEnv> {
  const app = new Hono<AppEnv>();

  app.use("*", async (c, next) => {
    const requestId = crypto.randomUUID();
    c.set("requestId", requestId);
    c.header("x-request-id", requestId);
    const store = deps.database.open(c.env ?? {});
    c.set("store", store);
    try {
      await next();
    } finally {
      // Pools never outlive their request; closing must not hold the response back.
      waitUntil(c, store.close());
    }
  });

  app.get("/v1/health", async (c) => {
    try {
      await c.get("store").db.execute(sql`SELECT 1`);
    } catch {
      throw new ComputeError("UNAVAILABLE", "the database is unreachable", { database: "unreachable" });
    }
    return c.json({ status: "ok", database: "reachable", modules: deps.modules });
  });

  app.notFound((c) => {
    const error = new ComputeError("NOT_FOUND", `no route for ${c.req.method} ${clip(new URL(c.req.url).pathname)}`);
    return c.json(errorBody(error, [], c.get("requestId")), 404);
  });

  app.onError((err, c) => {
    const error = toComputeError(err);
    const body = errorBody(error, c.get("longInputs") ?? [], c.get("requestId"));
    if (error.status >= 500) {
      // One line per server-side failure, with what an operator needs to find it: never the body.
      const where = c.get("method") ? { method: c.get("method") } : { path: `${c.req.method} ${clip(new URL(c.req.url).pathname)}` };
      const cause = isComputeError(err) ? { detail: body.message } : describeError(err);
      log.error("request failed", { requestId: c.get("requestId"), ...where, code: error.code, status: error.status, ...cause });
    }
    return c.json(body, error.status as 400);
  });

  return app;
}

// ---------------------------------------------------------------- the input rules (docs/api.md)

/**
 * A request's JSON body under the rules every route shares: nested at most MAX_BODY_DEPTH
 * deep, no control characters in any string or key, the schema, and no key the schema does not
 * know. Anything else is INVALID_ARGUMENT naming where. Long strings are remembered so that no
 * error of this request quotes them whole.
 */
export async function readInput<T extends z.ZodType>(c: Context<AppEnv>, schema: T): Promise<z.output<T>> {
  return checkInput(c, schema, await readJson(c.req.raw));
}

/** A body that is already parsed (the console's forms) under the same rules as readInput's. */
export function checkInput<T extends z.ZodType>(c: Context<AppEnv>, schema: T, body: unknown): z.output<T> {
  const strings = inspectStrings(body);
  c.set("longInputs", strings.long);
  if (strings.controlAt.length > 0) {
    const paths = strings.controlAt.map(issuePath);
    throw invalidArgument(
      `the request body has control characters (NUL, ESC, ...; only tab, CR and LF are allowed) at ${paths.map(shown).join(", ")}`,
      {
        issues: paths.map((path) => ({ path, message: "control characters are not allowed", code: "control_character" })),
      },
    );
  }
  return parseInput(schema, body);
}

export async function readJson(request: Request): Promise<unknown> {
  const text = await request.text();
  if (text.trim() === "") return {};
  // Before parsing: a deep body costs the parser and every walk after it.
  if (nestsDeeperThan(text, MAX_BODY_DEPTH))
    throw invalidArgument(`the request body nests deeper than ${MAX_BODY_DEPTH} levels`, { maxDepth: MAX_BODY_DEPTH });
  try {
    return JSON.parse(text);
  } catch {
    throw invalidArgument("the request body is not valid JSON");
  }
}

/** The body through the schema; a key the schema does not know is refused rather than dropped. */
export function parseInput<T extends z.ZodType>(schema: T, body: unknown): z.output<T> {
  const parsed = schema.safeParse(body);
  if (!parsed.success) {
    const issues = schemaIssues(parsed.error);
    throw invalidArgument(
      `the request body does not match the method's input: ${issues.map((i) => `${shown(i.path)}: ${i.message}`).join("; ")}`,
      { issues },
    );
  }
  const unknown = unknownKeys(body, parsed.data, [], []).map(issuePath);
  if (unknown.length > 0) {
    throw invalidArgument(`the request body has unknown keys: ${unknown.map(shown).join(", ")}`, {
      issues: unknown.map((path) => ({ path, message: "unknown key", code: "unrecognized_keys" })),
    });
  }
  return parsed.data;
}

/** How many offending places an error names; the first ones tell the caller enough. */
const MAX_REPORTED = 10;
// C0 controls and DEL, except tab, LF and CR. Postgres cannot store NUL at all.
const CONTROL_CHARACTER = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/;

const shown = (path: string) => path || "(root)";

/** Scans the text, skipping strings, for [ and { opened deeper than `max`. */
function nestsDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (inString) {
      if (ch === 0x5c)
        i++; // a backslash escapes the next character
      else if (ch === 0x22) inString = false;
    } else if (ch === 0x22) inString = true;
    else if (ch === 0x7b || ch === 0x5b) {
      if (++depth > max) return true;
    } else if (ch === 0x7d || ch === 0x5d) depth--;
  }
  return false;
}

/** Where the body has control characters (in a value or a key), and its strings too long to quote. */
function inspectStrings(body: unknown): { controlAt: string[][]; long: string[] } {
  const controlAt: string[][] = [];
  const long: string[] = [];
  const check = (text: string, path: string[]) => {
    if (text.length > MAX_ECHOED) long.push(text);
    if (controlAt.length < MAX_REPORTED && CONTROL_CHARACTER.test(text)) controlAt.push(path);
  };
  const walk = (value: unknown, path: string[]) => {
    if (typeof value === "string") check(value, path);
    else if (Array.isArray(value)) value.forEach((item, i) => walk(item, [...path, String(i)]));
    else if (value !== null && typeof value === "object") {
      for (const [key, item] of Object.entries(value)) {
        check(key, [...path, key]);
        walk(item, [...path, key]);
      }
    }
  };
  walk(body, []);
  return { controlAt, long };
}

/**
 * Keys of the input that the parsed output dropped: zod's objects strip unknown keys silently.
 * Records and loose objects keep their keys, so they pass; where the output is not a plain
 * object (a transform, a date), there is nothing to compare and the walk stops.
 */
function unknownKeys(input: unknown, output: unknown, path: string[], found: string[][]): string[][] {
  if (input === output || found.length >= MAX_REPORTED) return found;
  if (Array.isArray(input)) {
    if (Array.isArray(output) && output.length === input.length)
      input.forEach((item, i) => unknownKeys(item, output[i], [...path, String(i)], found));
    return found;
  }
  if (!isPlainObject(input) || !isPlainObject(output)) return found;
  for (const key of Object.keys(input)) {
    if (!Object.hasOwn(output, key)) {
      if (found.length < MAX_REPORTED) found.push([...path, key]);
    } else unknownKeys(input[key], output[key], [...path, key], found);
  }
  return found;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

// ---------------------------------------------------------------- errors

export function toComputeError(err: unknown): ComputeError {
  if (isComputeError(err)) return err;
  const fromPg = fromPostgresError(err);
  if (fromPg) return fromPg;
  return new ComputeError("INTERNAL", "internal error");
}

/**
 * What the log may say about an unexpected error: its name, SQLSTATE and innermost message with
 * quoted values elided. Never a wrapped driver error's text, which carries the query's parameters.
 */
export function describeError(err: unknown): Record<string, string | undefined> {
  let inner = err;
  while (inner instanceof Error && inner.cause instanceof Error) inner = inner.cause;
  const sqlstate = (inner as { code?: unknown } | null)?.code;
  return {
    error: err instanceof Error ? err.name : typeof err,
    sqlstate: typeof sqlstate === "string" && /^[0-9A-Z]{5}$/.test(sqlstate) ? sqlstate : undefined,
    detail: inner instanceof Error ? clip(inner.message.replace(/"[^"]*"|'[^']*'/g, "…"), 300) : undefined,
  };
}

/** Whether the runtime gave this request an execution context (a Worker's fetch does; a bare app.fetch does not). */
export function hasExecutionContext(c: Context<AppEnv>): boolean {
  try {
    return c.executionCtx !== undefined;
  } catch {
    return false;
  }
}

/** Lets the runtime finish `promise` after the response (Workers); in Node it settles on its own. */
export function waitUntil(c: Context<AppEnv>, promise: Promise<unknown>): void {
  try {
    c.executionCtx.waitUntil(promise);
  } catch {
    // No execution context (called from Node): the promise settles on its own.
  }
}
