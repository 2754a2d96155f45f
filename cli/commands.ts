// The generated commands: every method in the live /openapi.json is a command (`metal.nodes.list`
// is `better-compute metal nodes list`), its flags come from the method's input schema, and its
// help from the method's summary. A plugin's methods appear here without any CLI code.
import type { JsonSchema, OpenApiDocument } from "./api.ts";
import { UsageError } from "./connection.ts";

export interface MethodSpec {
  name: string;
  summary: string;
  module: string;
  input: JsonSchema;
  output: JsonSchema;
}

export function methodsOf(doc: OpenApiDocument): MethodSpec[] {
  const methods: MethodSpec[] = [];
  for (const [route, item] of Object.entries(doc.paths ?? {})) {
    const op = item.post;
    if (!op || !route.startsWith("/v1/")) continue;
    methods.push({
      name: op.operationId,
      summary: op.summary && op.summary !== op.operationId ? op.summary : "",
      module: op.tags?.[0] ?? "",
      input: op.requestBody?.content?.["application/json"]?.schema ?? {},
      output: op.responses?.["200"]?.content?.["application/json"]?.schema ?? {},
    });
  }
  return methods.sort((a, b) => a.name.localeCompare(b.name));
}

/** Commands that are another method under a friendlier name; `pick` sees the flags given. */
const ALIASES: Record<string, { summary: string; pick: (flags: Set<string>) => string }> = {
  "tokens.create": {
    summary: "Mint a single-use join token (--role node|site|ramdisk; --site S for a site agent's); shown once",
    pick: (flags) => (flags.has("site") ? "siteTokens.create" : "joinTokens.create"),
  },
};

export type Resolved =
  { kind: "method"; method: MethodSpec; command: string; rest: string[] } | { kind: "group"; prefix: string; methods: MethodSpec[] };

/** `api-keys` and `apiKeys` are the same word. */
const camel = (word: string) => word.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/**
 * Finds the method named by the leading words of argv (the longest match wins), or the group
 * they name. `flagNames` are the flags given, for aliases that depend on them.
 */
export function resolveCommand(methods: MethodSpec[], words: string[], flagNames: Set<string>): Resolved {
  const byName = new Map(methods.map((m) => [m.name, m]));
  for (let n = words.length; n > 0; n--) {
    const name = words.slice(0, n).map(camel).join(".");
    const alias = ALIASES[name];
    const method = byName.get(alias ? alias.pick(flagNames) : name);
    if (method) return { kind: "method", method, command: words.slice(0, n).join(" "), rest: words.slice(n) };
  }
  const prefix = words.map(camel).join(".");
  const inGroup = methods.filter((m) => prefix === "" || m.name.startsWith(`${prefix}.`));
  if (inGroup.length && words.length) return { kind: "group", prefix, methods: inGroup };
  throw new UsageError(`unknown command: ${words.join(" ")}\n${suggest(methods, words)}run \`better-compute help\` for the list`);
}

function suggest(methods: MethodSpec[], words: string[]): string {
  const first = camel(words[0] ?? "");
  const near = methods.filter((m) => m.name.split(".").includes(first)).slice(0, 5);
  return near.length ? `did you mean: ${near.map((m) => commandName(m.name)).join(", ")}?\n` : "";
}

export const commandName = (method: string) => method.split(".").join(" ");

/** The property a first positional argument fills: node when the input has one, else id. */
export function positionalKey(input: JsonSchema): string | undefined {
  const props = input.properties ?? {};
  return "node" in props ? "node" : "id" in props ? "id" : undefined;
}

// ---- help ----

export function overview(methods: MethodSpec[] | undefined, apiUrl: string | undefined, unreachable?: string): string {
  const lines = [
    "usage: better-compute <command> [args] [--json | --wide] [--url URL] [--api-key KEY]",
    "",
    "Local commands:",
    "  dev [--sim N] [--port P]            the whole control plane on this machine (as npm start)",
    "  doctor [--config F] [--wrangler F]  check a deployment's configuration, database and secrets",
    "  bmc-emulator …                      a simulated Redfish BMC (see its --help)",
    "",
    "API commands:",
    "  call <method> [json]                call any method with a raw JSON body (or --body JSON|-)",
    "  tokens create --role R | --site S   mint a single-use join token (shown once)",
    "  workflows watch <id>                follow a workflow step by step until it ends",
    "  events watch [--type T] [--after ID]  print events as they are published (Server-Sent Events)",
    "  workflows approve <id> --key-file K  sign a workflow's batch of destructive commands (quorum)",
  ];
  if (methods) {
    lines.push("", `Methods of ${apiUrl} (each is a command; \`better-compute <command> --help\` for its flags):`);
    const width = Math.max(...methods.map((m) => commandName(m.name).length)) + 2;
    for (const m of methods) lines.push(`  ${commandName(m.name).padEnd(width)}${m.summary}`.trimEnd());
  } else {
    lines.push("", `The API's methods are commands too; they are read from its /openapi.json, ${unreachable ?? "which needs BC_URL"}.`);
  }
  lines.push(
    "",
    "Connection: --url/--api-key, else BC_URL/BC_API_KEY, else the running local stack (npm start; its URL for a key given alone).",
    "Output: a table (as wide as the terminal; --wide for whole cells) or key: value lines; --json prints the API's JSON. Errors exit non-zero.",
  );
  return lines.join("\n");
}

export function groupHelp(prefix: string, methods: MethodSpec[]): string {
  const width = Math.max(...methods.map((m) => commandName(m.name).length)) + 2;
  return [
    `better-compute ${commandName(prefix)} …`,
    "",
    ...methods.map((m) => `  ${commandName(m.name).padEnd(width)}${m.summary}`.trimEnd()),
    "",
    "`better-compute <command> --help` shows a command's flags.",
  ].join("\n");
}

/** A method's usage and flags; `note`: what the CLI adds to it (a wait, a default), a line each. */
export function methodHelp(method: MethodSpec, note?: string): string {
  const key = positionalKey(method.input);
  const flags = flagList(method.input);
  const lines = [
    `better-compute ${commandName(method.name)}${key ? ` [<${key}>]` : ""} [flags]`,
    ...(method.summary ? [`  ${method.summary}`] : []),
    `  POST /v1/${method.name}${method.module ? ` (module ${method.module})` : ""}`,
    "",
    flags.length ? "flags:" : "no flags (the method takes an empty body)",
    ...flags.map((f) => `  ${f}`),
  ];
  if (key) lines.push("", `The first argument is --${key}.`);
  lines.push("--body JSON (or --body - for stdin) gives the whole body; flags are laid over it. --json prints the raw answer.");
  if (note) lines.push(note);
  return lines.join("\n");
}

function flagList(schema: JsonSchema, prefix = ""): string[] {
  const out: string[] = [];
  const required = new Set(schema.required ?? []);
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    const flag = `--${prefix}${name}`;
    const notes = [
      describeType(prop),
      ...(required.has(name) ? ["required"] : []),
      ...(prop.default !== undefined ? [`default ${JSON.stringify(prop.default)}`] : []),
    ];
    out.push(`${flag.padEnd(24)}${notes.join(", ")}${prop.description ? `: ${prop.description}` : ""}`);
    if (prop.properties) out.push(...flagList(prop, `${prefix}${name}.`));
  }
  return out;
}

export function describeType(schema: JsonSchema): string {
  if (schema.enum) return `one of ${schema.enum.map(String).join("|")}`;
  if (schema.const !== undefined) return `always ${JSON.stringify(schema.const)}`;
  const type = schemaType(schema);
  if (type === "array") return `list (repeat the flag, or JSON)${schema.items ? ` of ${describeType(schema.items)}` : ""}`;
  if (type === "object") return schema.properties ? "object (JSON, or the dotted flags below)" : "object (JSON, or --flag.<key> value)";
  return type ?? "JSON";
}

/** The schema's type, ignoring a nullable branch. */
export function schemaType(schema: JsonSchema): string | undefined {
  if (typeof schema.type === "string") return schema.type;
  if (Array.isArray(schema.type)) return schema.type.find((t) => t !== "null");
  if (schema.anyOf) {
    for (const branch of schema.anyOf) {
      const type = schemaType(branch);
      if (type && type !== "null") return type;
    }
  }
  if (schema.enum?.length) return typeof schema.enum[0];
  if (schema.const !== undefined) return typeof schema.const;
  return undefined;
}
