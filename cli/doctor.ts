// better-compute doctor: checks a deployment where it is configured, not over the API: the
// config loads, the database answers, every migration is applied and unchanged, BC_SECRET is
// strong, wrangler declares the Durable Objects and the cron trigger, and IAM has an admin key.
// Each finding has a severity and a fix; any error makes the exit code 1. Secrets are never
// printed (a database URL is shown without its password).
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { sql } from "drizzle-orm";
import type { Compute } from "../core/compute.ts";
import { sha256Hex } from "../core/encoding.ts";
import { one, rows } from "../core/store/database.ts";
import { coreMigrations, openNodeStore, repoRoot, type NodeStore } from "../local/node-store.ts";
import { dataDirCandidates, findRunningStack, relative, UsageError } from "./connection.ts";

export type Severity = "error" | "warning" | "ok";

export interface Finding {
  check: string;
  severity: Severity;
  message: string;
  fix?: string;
}

/** The deployment's Durable Objects as wrangler must declare them (workers/api/index.ts exports the classes). */
const DURABLE_OBJECTS = [
  { binding: "NODE", className: "NodeDO" },
  { binding: "WORKFLOW", className: "WorkflowDO" },
  { binding: "SINKS", className: "SinkDO" },
];
const MIN_SECRET_LENGTH = 32;
/** Fewer distinct characters than this in BC_SECRET reads as a pattern, not random bytes. */
const MIN_SECRET_DISTINCT = 10;
const DATABASE_TIMEOUT_MS = 10_000;

export interface DoctorOptions {
  config: string;
  wrangler: string;
  env: NodeJS.ProcessEnv;
}

export interface DoctorReport {
  ok: boolean;
  /** Where DATABASE_URL and BC_SECRET came from (never their values). */
  sources: Record<string, string>;
  findings: Finding[];
}

export async function runDoctor(argv: string[]): Promise<number> {
  let values: { config?: string; wrangler?: string; json?: boolean; help?: boolean };
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: "string" },
        wrangler: { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (err) {
    throw new UsageError(
      `${err instanceof Error ? err.message : String(err)}\nusage: better-compute doctor [--config better-compute.config.ts] [--wrangler wrangler.toml] [--json]`,
    );
  }
  if (values.help) {
    console.log(DOCTOR_HELP);
    return 0;
  }
  const report = await doctor({
    config: path.resolve(values.config ?? path.join(repoRoot, "better-compute.config.ts")),
    wrangler: path.resolve(values.wrangler ?? path.join(repoRoot, "wrangler.toml")),
    env: process.env,
  });
  console.log(values.json ? JSON.stringify(report, null, 2) : humanReport(report));
  return report.ok ? 0 : 1;
}

const DOCTOR_HELP = `better-compute doctor [--config better-compute.config.ts] [--wrangler wrangler.toml] [--json]
  Checks the deployment's configuration where it is configured (not over the API): the config
  loads, DATABASE_URL answers, every migration is applied and unchanged, BC_SECRET is set and
  strong, wrangler declares the NODE and WORKFLOW Durable Objects and a cron trigger, and an admin
  API key exists. DATABASE_URL and BC_SECRET come from the environment, else from the running
  local stack's dev.env. Exits 1 when any finding is an error.`;

export async function doctor(options: DoctorOptions): Promise<DoctorReport> {
  const findings: Finding[] = [];
  const { vars, sources } = deploymentEnv(options.env);
  const compute = await checkConfig(options.config, findings);
  checkWrangler(await readWrangler(options.wrangler, findings), findings);
  checkSecret(vars.BC_SECRET, findings);
  await checkDatabase(vars.DATABASE_URL, compute, findings);
  return { ok: findings.every((f) => f.severity !== "error"), sources, findings };
}

// ---- where DATABASE_URL and BC_SECRET come from ----

function deploymentEnv(env: NodeJS.ProcessEnv): { vars: Record<string, string | undefined>; sources: Record<string, string> } {
  const vars: Record<string, string | undefined> = {};
  const sources: Record<string, string> = {};
  let local: { file: string; vars: Record<string, string>; note: string } | undefined;
  for (const name of ["DATABASE_URL", "BC_SECRET"]) {
    if (env[name]) {
      vars[name] = env[name];
      sources[name] = "the environment";
      continue;
    }
    local ??= localStackEnv(env);
    if (local?.vars[name]) {
      vars[name] = local.vars[name];
      sources[name] = `${relative(local.file)} ${local.note}`;
    } else {
      sources[name] = "not set";
    }
  }
  return { vars, sources };
}

/** dev.env of the running local stack (local/stack.ts writes it), else of the first data dir that has one. */
function localStackEnv(env: NodeJS.ProcessEnv): { file: string; vars: Record<string, string>; note: string } | undefined {
  const candidates = dataDirCandidates(env);
  const running = findRunningStack(candidates);
  const dirs = running ? [running.dataDir] : candidates;
  for (const dir of dirs) {
    const file = path.join(dir, "dev.env");
    if (!fs.existsSync(file)) continue;
    const vars = Object.fromEntries(
      fs
        .readFileSync(file, "utf8")
        .split("\n")
        .filter((l) => l.includes("="))
        .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1).trim()]),
    );
    return { file, vars, note: running ? `(the local stack, pid ${running.file.pid})` : "(a local stack that is not running)" };
  }
  return undefined;
}

// ---- the configuration ----

async function checkConfig(configPath: string, findings: Finding[]): Promise<Compute | undefined> {
  const name = relative(configPath);
  /** The config cannot be used: an error, and no deployment for the checks that need one. */
  const unusable = (message: string, fix: string) => {
    findings.push({ check: "config", severity: "error", message, fix });
    return undefined;
  };
  if (!fs.existsSync(configPath))
    return unusable(`${name} does not exist`, "pass --config with the deployment's config (the file that calls betterCompute({...}))");
  try {
    const mod = (await import(pathToFileURL(configPath).href)) as { compute?: Compute; default?: Compute };
    const compute = mod.compute ?? mod.default;
    if (!compute || typeof compute.migrations !== "function")
      return unusable(`${name} exports no deployment`, "export const compute = betterCompute({...}) from it");
    const { modules, methods } = compute.registry;
    findings.push({
      check: "config",
      severity: "ok",
      message: `${name} loads: modules ${modules.map((m) => m.id).join(", ")}; ${methods.size} methods`,
    });
    return compute;
  } catch (err) {
    const { code, message } = err as { code?: unknown; message?: unknown };
    return unusable(
      code === "INVALID_CONFIG"
        ? `${name} is refused: INVALID_CONFIG ${String(message)}`
        : `${name} does not load: ${err instanceof Error ? err.message : String(err)}`,
      `fix what the message names in ${name}, then run doctor again`,
    );
  }
}

interface WranglerConfig {
  durable_objects?: { bindings?: { name: string; class_name: string; script_name?: string }[] };
  migrations?: { tag: string; new_sqlite_classes?: string[]; new_classes?: string[]; deleted_classes?: string[] }[];
  triggers?: { crons?: string[] };
  r2_buckets?: { binding: string; bucket_name?: string }[];
}

/** The wrangler config as wrangler itself reads it. */
async function readWrangler(file: string, findings: Finding[]): Promise<WranglerConfig | undefined> {
  if (!fs.existsSync(file)) {
    findings.push({
      check: "wrangler",
      severity: "error",
      message: `${relative(file)} does not exist`,
      fix: "pass --wrangler with the Worker's wrangler.toml",
    });
    return undefined;
  }
  try {
    const { unstable_readConfig } = await import("wrangler");
    return unstable_readConfig({ config: file }, { hideWarnings: true }) as WranglerConfig;
  } catch (err) {
    findings.push({
      check: "wrangler",
      severity: "error",
      message: `${relative(file)} does not parse: ${err instanceof Error ? err.message : String(err)}`,
      fix: "fix the file (npx wrangler deploy --dry-run shows the same error)",
    });
    return undefined;
  }
}

function checkWrangler(config: WranglerConfig | undefined, findings: Finding[]): void {
  if (!config) return;
  const bindings = config.durable_objects?.bindings ?? [];
  const sqliteClasses = new Set((config.migrations ?? []).flatMap((m) => m.new_sqlite_classes ?? []));
  const problems: string[] = [];
  const fixes: string[] = [];
  for (const { binding, className } of DURABLE_OBJECTS) {
    const declared = bindings.find((b) => b.name === binding);
    if (!declared) {
      problems.push(`no Durable Object binding ${binding}`);
      fixes.push(`[[durable_objects.bindings]]\nname = "${binding}"\nclass_name = "${className}"`);
    } else if (declared.class_name !== className) {
      problems.push(`binding ${binding} names class ${declared.class_name}, not ${className}`);
      fixes.push(`class_name = "${className}" in the ${binding} binding`);
    }
    if (!sqliteClasses.has(className)) {
      problems.push(`no migration creates ${className} (new_sqlite_classes)`);
      fixes.push(`[[migrations]]\ntag = "<next tag>"\nnew_sqlite_classes = ["${className}"]`);
    }
  }
  findings.push(
    problems.length
      ? { check: "durable objects", severity: "error", message: problems.join("; "), fix: `add to wrangler.toml:\n${fixes.join("\n")}` }
      : {
          check: "durable objects",
          severity: "ok",
          message: DURABLE_OBJECTS.map((d) => `${d.binding} → ${d.className}`).join(", ") + " declared with their migrations",
        },
  );
  // A warning: everything but what renders ISOs and config drives (ctx.blobs) works without it.
  const blobs = config.r2_buckets?.find((b) => b.binding === "BLOBS");
  findings.push(
    blobs
      ? { check: "blobs", severity: "ok", message: `R2 bucket ${blobs.bucket_name ?? "(provisioned by wrangler)"} bound as BLOBS` }
      : {
          check: "blobs",
          severity: "warning",
          message: "no R2 bucket bound as BLOBS: steps that render ISOs or config drives (ctx.blobs) fail with FAILED_PRECONDITION",
          fix: 'add to wrangler.toml:\n[[r2_buckets]]\nbinding = "BLOBS"\nbucket_name = "better-compute-blobs"',
        },
  );
  const crons = config.triggers?.crons ?? [];
  findings.push(
    crons.length
      ? { check: "cron", severity: "ok", message: `cron trigger ${crons.join(", ")} (wakes stalled workflows, runs the reconcilers)` }
      : {
          check: "cron",
          severity: "error",
          message: "no cron trigger: a workflow whose wake-up was lost, and the module reconcilers, wait forever",
          fix: 'add to wrangler.toml:\n[triggers]\ncrons = ["* * * * *"]',
        },
  );
}

// ---- the deployment secret ----

function checkSecret(secret: string | undefined, findings: Finding[]): void {
  const fix =
    "generate one with `openssl rand -base64 32`, then `npx wrangler secret put BC_SECRET` (and export BC_SECRET here to check it); keep it: sealed secrets need it";
  if (!secret) {
    findings.push({
      check: "BC_SECRET",
      severity: "error",
      message: "BC_SECRET is not set: BMC passwords and other stored secrets cannot be sealed or opened",
      fix,
    });
  } else if (secret.length < MIN_SECRET_LENGTH) {
    findings.push({
      check: "BC_SECRET",
      severity: "error",
      message: `BC_SECRET has ${secret.length} characters; it needs at least ${MIN_SECRET_LENGTH}`,
      fix,
    });
  } else if (new Set(secret).size < MIN_SECRET_DISTINCT) {
    findings.push({
      check: "BC_SECRET",
      severity: "error",
      message: `BC_SECRET is low-entropy (only ${new Set(secret).size} distinct characters): it reads as a pattern, not random bytes`,
      fix,
    });
  } else {
    findings.push({ check: "BC_SECRET", severity: "ok", message: `BC_SECRET is set (${secret.length} characters)` });
  }
}

// ---- the database: reachable, migrated, an admin key ----

async function checkDatabase(url: string | undefined, compute: Compute | undefined, findings: Finding[]): Promise<void> {
  // Not errors of their own: the database finding is the one to fix.
  const skipped = (why: string) => {
    findings.push({ check: "migrations", severity: "warning", message: `not checked: ${why}`, fix: "fix the database finding first" });
    findings.push({
      check: "iam",
      severity: "warning",
      message: `the admin key is not checked: ${why}`,
      fix: "fix the database finding first",
    });
  };
  if (!url) {
    findings.push({
      check: "database",
      severity: "error",
      message: "DATABASE_URL is not set",
      fix: "export DATABASE_URL=postgres://… (Neon's connection string; `npx wrangler secret put DATABASE_URL` for the Worker), or run doctor next to a running `npm start`",
    });
    return skipped("DATABASE_URL is not set");
  }
  const shown = redactUrl(url);
  if (!shown) {
    findings.push({
      check: "database",
      severity: "error",
      message: "DATABASE_URL is not a URL",
      fix: "DATABASE_URL=postgres://user:password@host:5432/database",
    });
    return skipped("DATABASE_URL is not a URL");
  }

  let store: NodeStore | undefined;
  try {
    store = await withTimeout(openNodeStore(url), "opening the connection");
    await withTimeout(store.db.execute(sql`SELECT 1`), "SELECT 1");
  } catch (err) {
    if (store) await withTimeout(store.close(), "closing").catch(() => {});
    findings.push({
      check: "database",
      severity: "error",
      message: `the database at ${shown} is unreachable (${reason(err, url)})`,
      fix: "check DATABASE_URL's host, port and credentials and that the database is up (for the local stack: `npm start`)",
    });
    return skipped("the database is unreachable");
  }
  try {
    findings.push({ check: "database", severity: "ok", message: `${shown} answers` });
    await checkMigrations(store, compute, findings);
    await checkAdminKey(store, compute, findings);
  } finally {
    await withTimeout(store.close(), "closing").catch(() => {});
  }
}

async function checkMigrations(store: NodeStore, compute: Compute | undefined, findings: Finding[]): Promise<void> {
  const migrations = [...coreMigrations(), ...(compute?.migrations() ?? [])];
  const applied = new Map<string, string>();
  if (await tableExists(store, "bc_migrations")) {
    const found = await withTimeout(
      rows<{ name: string; sha256: string }>(store.db, sql`SELECT name, sha256 FROM bc_migrations`),
      "reading bc_migrations",
    );
    for (const row of found) applied.set(row.name, row.sha256);
  }
  const missing: string[] = [];
  const changed: string[] = [];
  for (const migration of migrations) {
    const recorded = applied.get(migration.name);
    if (recorded === undefined) missing.push(migration.name);
    else if (recorded !== (await sha256Hex(migration.sql))) changed.push(migration.name);
  }
  if (changed.length) {
    findings.push({
      check: "migrations",
      severity: "error",
      message: `changed after they were applied: ${changed.join(", ")} (npm run migrate refuses to go on)`,
      fix: "restore their applied text and put the change in a new migration",
    });
  }
  if (missing.length) {
    findings.push({
      check: "migrations",
      severity: "error",
      message: `${missing.length} not applied: ${missing.join(", ")}`,
      fix: "DATABASE_URL=… npm run migrate",
    });
  }
  const known = new Set(migrations.map((m) => m.name));
  const unknown = [...applied.keys()].filter((name) => !known.has(name));
  if (unknown.length) {
    findings.push({
      check: "migrations",
      severity: "warning",
      message: `applied but not registered by this config: ${unknown.join(", ")}`,
      fix: "register the module that owns them again, or leave them if it was removed on purpose",
    });
  }
  if (!changed.length && !missing.length) {
    findings.push({
      check: "migrations",
      severity: "ok",
      message: `all ${migrations.length} applied and unchanged${compute ? "" : " (core only: the config did not load)"}`,
    });
  }
}

async function checkAdminKey(store: NodeStore, compute: Compute | undefined, findings: Finding[]): Promise<void> {
  if (!compute) {
    findings.push({
      check: "iam",
      severity: "error",
      message: "not checked: the config did not load",
      fix: "fix the config finding first",
    });
    return;
  }
  const roles = compute.iam.roles();
  if (!(await tableExists(store, "bc_api_keys"))) {
    findings.push({
      check: "iam",
      severity: "error",
      message: "bc_api_keys does not exist (core migrations are missing)",
      fix: "DATABASE_URL=… npm run migrate",
    });
    return;
  }
  const found = await withTimeout(
    one<{ n: number }>(store.db, sql`SELECT count(*)::int AS n FROM bc_api_keys WHERE revoked_at IS NULL AND 'admin' = ANY(roles)`),
    "counting admin keys",
  );
  const admins = found!.n;
  const custom = compute.options.iam !== undefined;
  if (admins > 0) {
    findings.push({
      check: "iam",
      severity: "ok",
      message: `roles ${roles.join(", ")}; ${admins} unrevoked admin API key${admins === 1 ? "" : "s"}`,
    });
  } else {
    findings.push({
      check: "iam",
      // A deployment with its own IAM (JWTs from an identity provider) may need no API key.
      severity: custom ? "warning" : "error",
      message: `roles ${roles.join(", ")}; no unrevoked API key has the admin role, so nobody can operate the deployment over the API`,
      fix: "DATABASE_URL=… npm run mint-key -- --role admin",
    });
  }
}

async function tableExists(store: NodeStore, table: string): Promise<boolean> {
  const found = await withTimeout(
    one<{ present: boolean }>(store.db, sql`SELECT to_regclass(${table}) IS NOT NULL AS present`),
    `looking for ${table}`,
  );
  return found!.present;
}

/** The URL without its password, or undefined when it is not a URL. */
export function redactUrl(url: string): string | undefined {
  try {
    const parsed = new URL(url);
    parsed.password = "";
    parsed.search = "";
    return parsed.toString();
  } catch {
    return undefined;
  }
}

function withTimeout<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${DATABASE_TIMEOUT_MS / 1000} s`)), DATABASE_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Why a connection failed, without the URL's password should a message quote it. */
function reason(err: unknown, url: string): string {
  // The driver wraps the socket's failure (an Error, or a WebSocket ErrorEvent) as the cause.
  let inner = err as { cause?: unknown; code?: unknown; message?: unknown } | null;
  while (inner?.cause && typeof inner.cause === "object") inner = inner.cause;
  const code = inner?.code;
  const message = typeof inner?.message === "string" ? inner.message : String(inner);
  const password = decodeURIComponent(new URL(url).password);
  const text = typeof code === "string" ? `${code}: ${message}` : message;
  return password ? text.replaceAll(password, "***") : text;
}

// ---- the report ----

const MARK: Record<Severity, string> = { ok: "✔", warning: "⚠", error: "✖" };

export function humanReport(report: DoctorReport): string {
  const lines = [`better-compute doctor`, ...Object.entries(report.sources).map(([name, from]) => `  ${name}: ${from}`), ""];
  for (const f of report.findings) {
    lines.push(`${MARK[f.severity]} ${f.check}: ${f.message}`);
    if (f.fix && f.severity !== "ok") lines.push(...f.fix.split("\n").map((l, i) => `    ${i === 0 ? "fix: " : "     "}${l}`));
  }
  const errors = report.findings.filter((f) => f.severity === "error").length;
  const warnings = report.findings.filter((f) => f.severity === "warning").length;
  lines.push(
    "",
    errors
      ? `${errors} error${errors === 1 ? "" : "s"}, ${warnings} warning${warnings === 1 ? "" : "s"}`
      : `no errors${warnings ? `, ${warnings} warning${warnings === 1 ? "" : "s"}` : ""}`,
  );
  return lines.join("\n");
}

// `better-compute doctor`: scripts/better-compute.mjs runs this file with tsx, not from the CLI's
// bundle, as it imports the deployment's TypeScript config.
try {
  process.exitCode = await runDoctor(process.argv.slice(2));
} catch (err) {
  if (!(err instanceof UsageError)) throw err;
  console.error(err.message);
  process.exitCode = 2;
}
