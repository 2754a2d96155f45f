// A method's body from the command line, guided by its input schema: `--key value` for a
// property, `--a.b value` for a nested one, values coerced by the schema's type (objects and
// arrays as JSON; an array also by repeating the flag), `--body JSON|-` for the whole body, and
// a first positional argument for `node` (or `id`). Unknown flags are refused here, with the
// list of known ones, before anything is sent.
import type { JsonSchema } from "./api.ts";
import { positionalKey, schemaType } from "./commands.ts";
import { UsageError } from "./connection.ts";

export interface ParsedFlag {
  name: string;
  /** undefined: the flag was given without a value (`--dry-run`). */
  value: string | undefined;
}

/** Splits argv into positional words and flags; `takesValue` says whether `--name` consumes the next token. */
export function splitArgs(
  argv: string[],
  takesValue: (name: string, next: string | undefined) => boolean,
): { words: string[]; flags: ParsedFlag[] } {
  const words: string[] = [];
  const flags: ParsedFlag[] = [];
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i]!;
    if (token === "--") {
      words.push(...argv.slice(i + 1));
      break;
    }
    if (!token.startsWith("--") || token === "-") {
      words.push(token);
      continue;
    }
    const eq = token.indexOf("=");
    const name = eq < 0 ? token.slice(2) : token.slice(2, eq);
    if (eq >= 0) flags.push({ name, value: token.slice(eq + 1) });
    else if (i + 1 < argv.length && takesValue(name, argv[i + 1])) flags.push({ name, value: argv[++i]! });
    else flags.push({ name, value: undefined });
  }
  return { words, flags };
}

/** Whether a flag of this schema takes the next token as its value (booleans take it only if it is true/false). */
export function flagTakesValue(input: JsonSchema, name: string, next?: string): boolean {
  if (name === "body") return true;
  const schema = schemaAt(input, name.split("."));
  if (!schema) return true;
  return schemaType(schema) !== "boolean" || next === "true" || next === "false";
}

/** The schema of a dotted path inside an object schema, or undefined when the path is not part of it. */
export function schemaAt(root: JsonSchema, path: string[]): JsonSchema | undefined {
  let schema: JsonSchema | undefined = root;
  for (const key of path) {
    // A schema that says nothing (any JSON) takes any nested key.
    if (schema && isAny(schema)) return {};
    schema = objectBranch(schema);
    if (!schema) return undefined;
    const prop: JsonSchema | undefined = schema.properties?.[key];
    if (prop) schema = prop;
    else if (typeof schema.additionalProperties === "object") schema = schema.additionalProperties;
    else if (schema.additionalProperties === true || (!schema.properties && schemaType(schema) === "object")) schema = {};
    else return undefined;
  }
  return schema;
}

const isAny = (schema: JsonSchema) => schemaType(schema) === undefined && !schema.properties && !schema.anyOf;

function objectBranch(schema: JsonSchema | undefined): JsonSchema | undefined {
  if (!schema) return undefined;
  if (schemaType(schema) === "object" && !schema.anyOf) return schema;
  return schema.anyOf?.find((b) => schemaType(b) === "object") ?? (schemaType(schema) === "object" ? schema : undefined);
}

/** The dotted flags a schema knows, for the "unknown flag" message. */
export function knownFlags(schema: JsonSchema, prefix = ""): string[] {
  const out: string[] = [];
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    out.push(`--${prefix}${name}`);
    if (prop.properties) out.push(...knownFlags(prop, `${prefix}${name}.`));
  }
  return out;
}

export interface BodyOptions {
  command: string;
  input: JsonSchema;
  words: string[];
  flags: ParsedFlag[];
  /** Reads the body when --body - is given. */
  stdin: () => Promise<string>;
}

export async function buildBody(opts: BodyOptions): Promise<Record<string, unknown>> {
  const { command, input } = opts;
  let body: Record<string, unknown> = {};
  const bodyFlag = opts.flags.find((f) => f.name === "body");
  if (bodyFlag) {
    const text = bodyFlag.value === "-" ? await opts.stdin() : bodyFlag.value;
    if (text === undefined) throw new UsageError("--body takes JSON, or - to read it from stdin");
    const parsed = parseJson(text, "--body");
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new UsageError("--body must be a JSON object");
    body = parsed as Record<string, unknown>;
  }

  if (opts.words.length > 1) throw new UsageError(`${command} takes at most one argument, got: ${opts.words.join(" ")}`);
  if (opts.words.length === 1) {
    const key = positionalKey(input);
    if (!key)
      throw new UsageError(`${command} takes no argument (got ${opts.words[0]}); its flags: ${knownFlags(input).join(", ") || "none"}`);
    body[key] = opts.words[0];
  }

  for (const flag of opts.flags) {
    if (flag.name === "body") continue;
    const path = flag.name.split(".");
    const schema = schemaAt(input, path);
    if (!schema || path.some((p) => p === "")) {
      const known = knownFlags(input);
      throw new UsageError(
        `unknown flag --${flag.name} for ${command}; ${known.length ? `its flags: ${known.join(", ")}` : "it takes no flags"}`,
      );
    }
    setPath(body, path, coerce(flag, schema, getPath(body, path)));
  }
  return body;
}

function coerce(flag: ParsedFlag, schema: JsonSchema, current: unknown): unknown {
  const type = schemaType(schema);
  const raw = flag.value;
  if (type === "boolean") {
    if (raw === undefined || raw === "true") return true;
    if (raw === "false") return false;
    throw new UsageError(`--${flag.name} is true or false, not ${JSON.stringify(raw)}`);
  }
  if (raw === undefined) throw new UsageError(`--${flag.name} needs a value`);
  switch (type) {
    case "number":
    case "integer": {
      const n = Number(raw);
      if (raw.trim() === "" || !Number.isFinite(n) || (type === "integer" && !Number.isInteger(n)))
        throw new UsageError(`--${flag.name} takes ${type === "integer" ? "a whole number" : "a number"}, not ${JSON.stringify(raw)}`);
      return n;
    }
    case "object":
      return parseJson(raw, `--${flag.name}`);
    case "array": {
      if (raw.trimStart().startsWith("[")) return parseJson(raw, `--${flag.name}`);
      // Repeating the flag adds an item: --roles admin --roles viewer.
      const item = schema.items ? coerce(flag, schema.items, undefined) : raw;
      return [...(Array.isArray(current) ? current : []), item];
    }
    case "string":
      return raw;
    default:
      // No type in the schema (any JSON): JSON when it parses, else the text.
      try {
        return JSON.parse(raw);
      } catch {
        return raw;
      }
  }
}

function parseJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new UsageError(`${what} takes JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}

function getPath(body: Record<string, unknown>, path: string[]): unknown {
  let at: unknown = body;
  for (const key of path) at = at && typeof at === "object" ? (at as Record<string, unknown>)[key] : undefined;
  return at;
}

function setPath(body: Record<string, unknown>, path: string[], value: unknown): void {
  let at = body;
  for (const key of path.slice(0, -1)) {
    const next = at[key];
    at = at[key] = next && typeof next === "object" && !Array.isArray(next) ? (next as Record<string, unknown>) : {};
  }
  at[path.at(-1)!] = value;
}
