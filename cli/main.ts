// better-compute <command>: every command is generated from the API's /openapi.json (see
// commands.ts; the methods are cached by catalog.ts) and sent to it. scripts/better-compute.mjs runs
// this from its bundle (cli/bundle.mjs), and start, dev, bmc-emulator and doctor elsewhere.
import { createApi, ApiError, type Api } from "./api.ts";
import { APPROVE_HELP, approveCommand, isKeyFileApproval } from "./approve.ts";
import { buildBody, flagTakesValue, splitArgs, type ParsedFlag } from "./args.ts";
import { loadCatalog, type Catalog } from "./catalog.ts";
import { groupHelp, methodHelp, overview, positionalKey, resolveCommand, type MethodSpec } from "./commands.ts";
import { resolveConnection, UsageError } from "./connection.ts";
import { formatOutput, type Layout } from "./format.ts";
import { followWorkflow, waitForMachine, workflowLines, type WorkflowView } from "./progress.ts";
import { eventsWatch } from "./watch.ts";
import { metalConsole } from "./console.ts";

/** Methods that start a machine on a way, and the state it should settle in. */
const MACHINE_WAITS: Record<string, string> = {
  "metal.enroll": "ready",
  "metal.nodes.recommission": "ready",
  "metal.deploy": "deployed",
  "metal.undeploy": "ready",
  "metal.rescue": "rescue",
  "metal.unrescue": "deployed",
};

/** What the CLI sends a method unless told otherwise (and the method takes it): events newest first, as an operator reads them. */
const CLI_DEFAULTS: Record<string, Record<string, unknown>> = {
  "events.list": { order: "desc" },
};

interface GlobalFlags {
  json: boolean;
  wait: boolean;
  help: boolean;
  wide: boolean;
  url?: string;
  apiKey?: string;
}

/** Takes the flags every command understands out of argv, wherever they are. */
function globalFlags(argv: string[]): { flags: GlobalFlags; rest: string[] } {
  const flags: GlobalFlags = { json: false, wait: true, help: false, wide: false };
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i]!;
    const [name, inline] =
      token.startsWith("--") && token.includes("=")
        ? [token.slice(0, token.indexOf("=")), token.slice(token.indexOf("=") + 1)]
        : [token, undefined];
    const value = () => {
      const v = inline ?? argv[++i];
      if (v === undefined) throw new UsageError(`${name} needs a value`);
      return v;
    };
    if (token === "--") {
      rest.push(...argv.slice(i));
      break;
    } else if (name === "--json") flags.json = true;
    else if (name === "--no-wait") flags.wait = false;
    else if (name === "--wide") flags.wide = true;
    else if (name === "--help" || name === "-h") flags.help = true;
    else if (name === "--url") flags.url = value();
    else if (name === "--api-key") flags.apiKey = value();
    else rest.push(token);
  }
  return { flags, rest };
}

export async function main(argv: string[]): Promise<number> {
  const { flags, rest } = globalFlags(argv);
  const leading = rest.findIndex((t) => t.startsWith("-"));
  const words = leading < 0 ? rest : rest.slice(0, leading);
  const tail = leading < 0 ? [] : rest.slice(leading);

  if (words[0] === "doctor")
    throw new UsageError("doctor takes its flags after it: better-compute doctor [--config F] [--wrangler F] [--json]");
  if (words.length === 0 || words[0] === "help") return help(flags, words.slice(1));

  if (words[0] === "events" && words[1] === "watch") return eventsWatch(flags, words.slice(2), tail);
  if (words[0] === "workflows" && words[1] === "watch" && flags.help) {
    console.log(WATCH_HELP);
    return 0;
  }

  if (words[0] === "workflows" && words[1] === "approve" && isKeyFileApproval(tail)) {
    if (flags.help) {
      console.log(APPROVE_HELP);
      return 0;
    }
    const connect = () => createApi(resolveConnection(flags));
    return approveCommand(connect, [...words.slice(2), ...tail], (line) => console.log(line), flags.json);
  }

  const api = createApi(resolveConnection(flags));
  if (words[0] === "call") return call(api, flags, words.slice(1), tail);
  if (words[0] === "metal" && words[1] === "console") return metalConsole(api, words.slice(2), tail, flags.help);
  if (words[0] === "workflows" && words[1] === "watch") return watch(api, flags, words.slice(2), tail);

  const flagNames = new Set(tail.filter((t) => t.startsWith("--")).map((t) => t.slice(2).split("=")[0]!));
  const command = await fromCatalog(await loadCatalog(api), async (methods): Promise<Command> => {
    const resolved = resolveCommand(methods, words, flagNames);
    if (resolved.kind === "group") return { help: groupHelp(resolved.prefix, resolved.methods), code: flags.help ? 0 : 2 };
    const { method } = resolved;
    if (flags.help) return { help: methodHelp(method, methodNote(method)), code: 0 };
    const split = splitArgs(tail, (name, next) => flagTakesValue(method.input, name, next));
    const body = await buildBody({
      command: resolved.command,
      input: method.input,
      words: [...resolved.rest, ...split.words],
      flags: split.flags,
      stdin: readStdin,
    });
    return { methods, method, body: { ...cliDefaults(method), ...body } };
  });
  if (command.help !== undefined) {
    console.log(command.help);
    return command.code;
  }
  const { methods, method, body } = command;
  const output = await api.call(method.name, body);

  const expect = MACHINE_WAITS[method.name];
  const nodeId = typeof output.node === "string" ? output.node : typeof output.id === "string" ? output.id : undefined;
  if (!expect || !flags.wait || !nodeId) {
    print(flags, output, method);
    return 0;
  }
  // The answer first (the workflow's id), then the machine's way there, line by line.
  if (!flags.json) console.log(formatOutput(output, method.output, layout(flags)));
  const nodeParam = positionalKey(methods.find((m) => m.name === "metal.nodes.get")?.input ?? {}) ?? "node";
  const { node, ok } = await interruptible(`machine ${nodeId} goes on; see it with: better-compute metal nodes get ${nodeId}`, (signal) =>
    waitForMachine(api, { id: nodeId, nodeParam, expect }, { out: progress(flags), signal }),
  );
  if (flags.json) console.log(JSON.stringify(node, null, 2));
  return ok ? 0 : 1;
}

type Command =
  { help: string; code: number } | { help?: undefined; methods: MethodSpec[]; method: MethodSpec; body: Record<string, unknown> };

/**
 * A command resolved from the cached methods when they know it and all its flags; help (--help, a
 * group) and what they do not know (a command or flag added since) from the API's current ones,
 * which the revalidation fetched meanwhile.
 */
async function fromCatalog(catalog: Catalog, resolve: (methods: MethodSpec[]) => Promise<Command>): Promise<Command> {
  try {
    const command = await resolve(catalog.methods);
    if (command.help === undefined) return command;
  } catch (err) {
    if (!(err instanceof UsageError) || (await catalog.latest) === catalog.methods) throw err;
  }
  return resolve(await catalog.latest);
}

const cliDefaults = (method: MethodSpec) =>
  Object.fromEntries(Object.entries(CLI_DEFAULTS[method.name] ?? {}).filter(([key]) => key in (method.input.properties ?? {})));

/** The lines methodHelp adds: how the CLI waits on the method, what it sends unless told. */
function methodNote(method: MethodSpec): string | undefined {
  const expect = MACHINE_WAITS[method.name];
  const defaults = Object.entries(cliDefaults(method)).map(([key, value]) => `--${key} ${String(value)}`);
  const notes = [
    ...(expect ? [`Waits until the machine is ${expect} (or failed), showing each step of its workflow; --no-wait returns at once.`] : []),
    ...(defaults.length ? [`The CLI sends ${defaults.join(" ")} unless given.`] : []),
  ];
  return notes.length ? notes.join("\n") : undefined;
}

/** `call <method> [json]`: any method, a raw JSON body, no schema in between. */
async function call(api: Api, flags: GlobalFlags, words: string[], tail: string[]): Promise<number> {
  const [method, json, ...extra] = words;
  const split = splitArgs(tail, (name) => name === "body");
  if (!method || extra.length || split.words.length || split.flags.some((f) => f.name !== "body")) {
    throw new UsageError("usage: better-compute call <method> [json]   (or --body JSON, --body - for stdin)");
  }
  const body = await buildBody({
    command: `call ${method}`,
    input: {},
    words: [],
    flags: json === undefined ? split.flags : [{ name: "body", value: json }],
    stdin: readStdin,
  });
  print(flags, await api.call(method, body));
  return 0;
}

const WATCH_HELP = `better-compute workflows watch <id>
  Follows a workflow step by step (each attempt and retry, with its error) until it ends.
  Exits 0 when it succeeded, 1 when it failed or was cancelled; Ctrl-C stops watching, not the workflow.`;

/** `workflows watch <id>`: the live view of any workflow; exit 0 only when it succeeded. */
async function watch(api: Api, flags: GlobalFlags, words: string[], tail: string[]): Promise<number> {
  const split = splitArgs(tail, () => true);
  const id = words[0] ?? split.flags.find((f: ParsedFlag) => f.name === "id")?.value;
  if (!id || words.length > 1 || split.words.length || split.flags.some((f) => f.name !== "id"))
    throw new UsageError("usage: better-compute workflows watch <workflow id>");
  const last = await interruptible(`workflow ${id} goes on`, (signal) => followWorkflow(api, id, { out: progress(flags), signal }));
  if (flags.json) console.log(JSON.stringify(last, null, 2));
  return last.state === "succeeded" ? 0 : 1;
}

async function help(flags: GlobalFlags, words: string[]): Promise<number> {
  let connection;
  try {
    connection = resolveConnection(flags);
  } catch {
    console.log(overview(undefined, undefined));
    return 0;
  }
  const api = createApi(connection);
  let methods: MethodSpec[];
  try {
    methods = await (await loadCatalog(api)).latest;
  } catch (err) {
    console.log(overview(undefined, undefined, `but ${api.url} did not answer (${err instanceof Error ? err.message : String(err)})`));
    return 0;
  }
  if (words.length === 0) {
    console.log(overview(methods, api.url));
    return 0;
  }
  const resolved = resolveCommand(methods, words, new Set());
  console.log(
    resolved.kind === "group" ? groupHelp(resolved.prefix, resolved.methods) : methodHelp(resolved.method, methodNote(resolved.method)),
  );
  return 0;
}

function print(flags: GlobalFlags, output: Record<string, unknown>, method?: MethodSpec): void {
  if (flags.json) console.log(JSON.stringify(output, null, 2));
  else if (method?.name === "workflows.get" && typeof output.state === "string")
    console.log(workflowLines(undefined, output as unknown as WorkflowView).join("\n"));
  else console.log(formatOutput(output, method?.output, layout(flags)));
}

/** Tables as wide as the terminal (none when output goes to a pipe or a file), or unclipped with --wide. */
const layout = (flags: GlobalFlags): Layout => ({ width: process.stdout.isTTY ? process.stdout.columns : undefined, wide: flags.wide });

/** A refusal's reasons (details.issues: a manifest's, a schema's), one a line, unless its message already quotes them. */
function reasons(err: ApiError): string[] {
  const issues = (err.details as { issues?: unknown } | undefined)?.issues;
  if (!Array.isArray(issues)) return [];
  return issues.flatMap((issue: { path?: unknown; message?: unknown } | null) => {
    if (typeof issue?.message !== "string") return [];
    const path = typeof issue.path === "string" ? issue.path : "";
    return err.message.includes(`${path || "(root)"}: ${issue.message}`) ? [] : [`  ${path ? `${path}: ` : ""}${issue.message}`];
  });
}

/** Progress lines: stdout for a human, stderr under --json (stdout then holds only the JSON). */
const progress = (flags: GlobalFlags) => (line: string) => (flags.json ? console.error(line) : console.log(line));

/** Runs a wait that Ctrl-C ends without ending what it waits for. */
async function interruptible<T>(goesOn: string, wait: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const controller = new AbortController();
  const stop = () => controller.abort(new Interrupted(`stopped watching; ${goesOn}`));
  process.once("SIGINT", stop);
  try {
    return await wait(controller.signal);
  } finally {
    process.off("SIGINT", stop);
  }
}

class Interrupted extends Error {}

let stdin: Promise<string> | undefined;
/** Read once: a command resolved again (fromCatalog) reads the same text. */
function readStdin(): Promise<string> {
  return (stdin ??= (async () => {
    const chunks: Buffer[] = [];
    for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks).toString("utf8");
  })());
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (err) {
  if (err instanceof ApiError) {
    console.error(
      [`error ${err.code}: ${err.message}${err.requestId ? ` (request id ${err.requestId})` : ""}`, ...reasons(err)].join("\n"),
    );
    process.exitCode = 1;
  } else if (err instanceof UsageError) {
    console.error(err.message);
    process.exitCode = 2;
  } else if (err instanceof Interrupted) {
    console.error(err.message);
    process.exitCode = 130;
  } else {
    throw err;
  }
}
