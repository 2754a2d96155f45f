// npm run bench: runs the benchmark sections in order and prints their figures. Not a test:
// nothing here asserts a timing; a section fails only when requests fail.
//
//   BENCH_ONLY          comma-separated section ids to run (api, commands, flood, agents, workflows, fleet, fleet-stack, vps, vms, metal, cli; default all)
//   BENCH_CONCURRENCY   API section: concurrent closed-loop clients (default 8)
//   BENCH_SECONDS       API section: measured window per target, seconds (default 10)
//   BENCH_WARMUP        API section: unrecorded warm-up per target, seconds (default 2)
//   BENCH_COMMANDS      commands section: measured round trips per path (default 1000)
//   BENCH_FLOOD_SECONDS flood section: each window's length, without and with the flood, seconds (default 10)
//   BENCH_FLOOD_RATE    flood section: frames a second the flooding socket sends (default 10000)
//   BENCH_AGENTS_MAX    agents section: the last step's number of agents (default 200)
//   BENCH_AGENTS_HOLD   agents section: seconds each step is held before it is checked (default 6)
//   BENCH_AGENTS_LAST_HOLD  agents section: seconds the last step (BENCH_AGENTS_MAX) is held (default BENCH_AGENTS_HOLD)
//   BENCH_AGENTS_HEARTBEAT  agents section: each agent's ping interval, seconds (default 2)
//   BENCH_WORKFLOW_BATCHES  workflows section: batch sizes started at once (default 1,10,100)
//   BENCH_FLEET         fleet section: machine counts, comma-separated (default 100,1000)
//   BENCH_FLEET_TIMEOUT fleet section: seconds a phase may take before the run is failed (default 1800)
//   BENCH_FLEET_LANES   fleet section on DATABASE_URL: processes the machines are split across, a site each (default: the CPUs)
//   BENCH_FLEET_STACK_LANES  fleet-stack section: simulating processes, a site each, beside workerd (default 1)
//   BENCH_VPS_INSTANCES vps section: instances, split across the three providers (default 30)
//   BENCH_VPS_ACTION_MS vps section: how long each emulated action, boot and task takes, ms (default 1500)
//   BENCH_VMS_GUESTS    vms section: real guests booted on a real bcd node, per phase (default 6)
//   BENCH_METAL_MACHINES  metal section: QEMU machines taken through enroll → deployed at once, after one alone (default 4)
//   BENCH_CLI_RUNS      cli section: spawns of each call, CLI and curl, whose median is shown (default 10)
//   DATABASE_URL        bench a real Postgres instead of the embedded PGlite (an empty database: see below)
//   BENCH_PROFILE=1     where the CPU goes, per module (zod, hono, drizzle-orm, pg, ours) and function: the api
//                       section profiles the Worker in one more window per target; the fleet section profiles
//                       its simulating processes through every phase (which slows them)
//   BENCH_RESET_DATABASE=1  empty DATABASE_URL's public schema first when an earlier run left its tables there
import os from "node:os";
import pg from "pg";
import { agentsSection } from "./agents.ts";
import { apiSection } from "./api.ts";
import { commandsSection } from "./commands.ts";
import { floodSection } from "./flood.ts";
import { workflowsSection } from "./workflows.ts";
import { fleetSection } from "./fleet.ts";
import { fleetStackSection } from "./fleet-stack.ts";
import { vpsSection } from "./vps.ts";
import { vmsSection } from "./vms.ts";
import { metalSection } from "./metal.ts";
import { cliSection } from "./cli.ts";
import { emptyPublicSchema } from "./stack.ts";

export interface BenchContext {
  concurrency: number;
  seconds: number;
  warmupSeconds: number;
  /** Measured round trips per path in the commands section. */
  commands: number;
  /** The flood section: each window's length, and the frames a second the flooding socket sends. */
  flood: { seconds: number; rate: number };
  workflows: {
    /** Sizes of the batches started at once (BENCH_WORKFLOW_BATCHES, comma-separated). */
    batches: number[];
  };
  /** BENCH_FLEET's sizes and timeout serve both fleet sections; lanes is the fleet section's, stackLanes the fleet-stack section's. */
  fleet: { sizes: number[]; timeoutSeconds: number; lanes: number; stackLanes: number };
  vps: {
    /** Instances, split across Hetzner Cloud, Hetzner Robot and Proxmox. */
    instances: number;
    /** How long each emulated action (hcloud), boot (Robot) and task (Proxmox) takes. */
    actionMs: number;
  };
  agents: {
    /** The ramp's last step. */
    max: number;
    holdSeconds: number;
    /** The last step's hold (the target holds 10,000 agents for 60 s). */
    lastHoldSeconds: number;
    heartbeatSeconds: number;
  };
  /** The metal section: QEMU machines deployed at once (after one alone). */
  metal: { machines: number };
  /** The cli section: spawns of each call whose median wall time is shown. */
  cli: { runs: number };
  /** BENCH_PROFILE=1: the api section profiles the Worker in an extra window per target, the fleet its processes (bench/profile.ts). */
  profile: boolean;
  /** DATABASE_URL when set; otherwise the section uses the embedded PGlite. */
  databaseUrl?: string;
  log(line: string): void;
  table(header: string[], rows: string[][]): void;
}

export interface BenchSection {
  /** What BENCH_ONLY names it by. */
  id: string;
  title: string;
  /** Prints its figures through ctx; throws when the run is not valid (e.g. failed requests). */
  run(ctx: BenchContext): Promise<void>;
}

/** Sections in the order they run; later issues append theirs. */
const allSections: BenchSection[] = [
  apiSection,
  commandsSection,
  floodSection,
  agentsSection,
  workflowsSection,
  fleetSection,
  fleetStackSection,
  vpsSection,
  vmsSection,
  metalSection,
  cliSection,
];
const only = (process.env.BENCH_ONLY ?? "")
  .split(",")
  .map((s) => s.trim())
  .filter(Boolean);
for (const id of only) {
  if (!allSections.some((s) => s.id === id))
    throw new Error(`BENCH_ONLY: no section ${JSON.stringify(id)} (sections: ${allSections.map((s) => s.id).join(", ")})`);
}
const sections = only.length ? allSections.filter((s) => only.includes(s.id)) : allSections;

const ctx: BenchContext = {
  concurrency: positiveInt("BENCH_CONCURRENCY", 8),
  seconds: positiveNumber("BENCH_SECONDS", 10),
  warmupSeconds: positiveNumber("BENCH_WARMUP", 2, true),
  commands: positiveInt("BENCH_COMMANDS", 1000),
  flood: { seconds: positiveNumber("BENCH_FLOOD_SECONDS", 10), rate: positiveInt("BENCH_FLOOD_RATE", 10_000) },
  profile: process.env.BENCH_PROFILE === "1",
  workflows: { batches: intList("BENCH_WORKFLOW_BATCHES", "1,10,100") },
  fleet: {
    sizes: intList("BENCH_FLEET", "100,1000"),
    timeoutSeconds: positiveNumber("BENCH_FLEET_TIMEOUT", 1800),
    lanes: positiveInt("BENCH_FLEET_LANES", os.availableParallelism()),
    stackLanes: positiveInt("BENCH_FLEET_STACK_LANES", 1),
  },
  metal: { machines: positiveInt("BENCH_METAL_MACHINES", 4) },
  cli: { runs: positiveInt("BENCH_CLI_RUNS", 10) },
  vps: { instances: positiveInt("BENCH_VPS_INSTANCES", 30), actionMs: positiveNumber("BENCH_VPS_ACTION_MS", 1500, true) },
  agents: {
    max: positiveInt("BENCH_AGENTS_MAX", 200),
    holdSeconds: positiveNumber("BENCH_AGENTS_HOLD", 6),
    lastHoldSeconds: positiveNumber("BENCH_AGENTS_LAST_HOLD", positiveNumber("BENCH_AGENTS_HOLD", 6)),
    heartbeatSeconds: positiveNumber("BENCH_AGENTS_HEARTBEAT", 2),
  },
  databaseUrl: process.env.DATABASE_URL || undefined,
  log: (line) => console.log(`  ${line}`),
  table(header, rows) {
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
    const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  ");
    console.log(`  ${line(header)}`);
    for (const row of rows) console.log(`  ${line(row)}`);
  },
};

const cpus = os.cpus();
const models = [...new Set(cpus.map((c) => c.model.trim()))].join(" / ") || "unknown model";
console.log("Better Compute bench");
console.log(`  node ${process.version} on ${os.platform()} ${os.arch()} (${os.release()})`);
console.log(`  ${os.availableParallelism()} CPUs: ${models}; ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB RAM`);
console.log(`  database: ${ctx.databaseUrl ? `DATABASE_URL host ${databaseHost(ctx.databaseUrl)}` : "PGlite (embedded, in this process)"}`);
console.log(`  sections: ${sections.map((s) => s.id).join(", ")}${only.length ? " (BENCH_ONLY)" : ""}`);
console.log(
  `  api: ${ctx.concurrency} concurrent clients (BENCH_CONCURRENCY), ${ctx.warmupSeconds} s warm-up (BENCH_WARMUP) + ${ctx.seconds} s measured (BENCH_SECONDS) per target`,
);
console.log(
  `  fleet: ${ctx.fleet.sizes.join(", ")} simulated machines (BENCH_FLEET)${ctx.databaseUrl ? ` in ${ctx.fleet.lanes} lane(s) (BENCH_FLEET_LANES)` : ""}; fleet-stack: the same sizes through workerd, ${ctx.fleet.stackLanes} simulating process(es) (BENCH_FLEET_STACK_LANES)`,
);
console.log(
  `  vps: ${ctx.vps.instances} instances (BENCH_VPS_INSTANCES), emulated actions of ${ctx.vps.actionMs} ms (BENCH_VPS_ACTION_MS)`,
);
console.log(`  commands: ${ctx.commands} sequential round trips per path (BENCH_COMMANDS)`);
console.log(`  metal: 1 QEMU machine, then ${ctx.metal.machines} at once (BENCH_METAL_MACHINES), on the emulated site`);
console.log(`  cli: each call spawned ${ctx.cli.runs} times, CLI and curl (BENCH_CLI_RUNS)`);
console.log(
  `  flood: two windows of ${ctx.flood.seconds} s (BENCH_FLOOD_SECONDS), the second with one socket sending ${ctx.flood.rate} frames/s (BENCH_FLOOD_RATE)`,
);
console.log(
  `  agents: up to ${ctx.agents.max} (BENCH_AGENTS_MAX), each step held ${ctx.agents.holdSeconds} s (BENCH_AGENTS_HOLD), the last ${ctx.agents.lastHoldSeconds} s (BENCH_AGENTS_LAST_HOLD), a ping every ${ctx.agents.heartbeatSeconds} s (BENCH_AGENTS_HEARTBEAT)`,
);
console.log(
  `  note: the load generator and the agents share this machine's ${os.availableParallelism()} CPUs with wrangler dev (workerd) and the WebSocket bridge` +
    (ctx.databaseUrl ? "" : " and PGlite") +
    "; compare figures within one run, not as capacity.",
);

/** Sections that run the Worker's stack on DATABASE_URL's public schema (the others make a schema of their own, or use none). */
const onPublicSchema = new Set(["api", "commands", "flood", "agents", "workflows", "fleet-stack", "vms", "cli"]);
if (ctx.databaseUrl && sections.some((s) => onPublicSchema.has(s.id))) await claimDatabase(ctx.databaseUrl);

let failures = 0;
for (const [i, section] of sections.entries()) {
  console.log(`\n[${i + 1}/${sections.length}] ${section.title}`);
  const started = performance.now();
  try {
    await section.run(ctx);
  } catch (err) {
    failures++;
    console.log(`  FAILED: ${err instanceof Error ? err.message : String(err)}`);
  }
  console.log(`  (${((performance.now() - started) / 1000).toFixed(1)} s)`);
}
if (failures) {
  console.log(`\n${failures} of ${sections.length} section(s) failed`);
  process.exitCode = 1;
}

/**
 * The sections' stacks seal secrets (the credential-signing key) under this run's deployment
 * secret: an earlier run's rows in DATABASE_URL were sealed under another and would fail every
 * join. So the run takes an empty database, or empties its public schema when asked to.
 */
async function claimDatabase(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query("SELECT to_regclass('public.bc_migrations') IS NOT NULL AS used");
    if (!rows[0].used) return;
    if (process.env.BENCH_RESET_DATABASE !== "1") {
      console.error(
        "DATABASE_URL holds an earlier run's tables, with secrets sealed under that run's deployment secret.\n" +
          "Give the bench an empty database, or set BENCH_RESET_DATABASE=1 to drop its public schema first (everything in it is lost).",
      );
      process.exit(2);
    }
  } finally {
    await client.end();
  }
  await emptyPublicSchema(url);
  console.log("  BENCH_RESET_DATABASE=1: emptied DATABASE_URL's public schema (an earlier run's tables)");
}

function databaseHost(url: string): string {
  try {
    return new URL(url).host || "(none)";
  } catch {
    return "(unparsable URL)";
  }
}

function positiveNumber(name: string, fallback: number, allowZero = false): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0 || (!allowZero && value === 0))
    throw new Error(`${name} must be a ${allowZero ? "non-negative" : "positive"} number, got ${JSON.stringify(raw)}`);
  return value;
}

function positiveInt(name: string, fallback: number): number {
  const value = positiveNumber(name, fallback);
  if (!Number.isInteger(value)) throw new Error(`${name} must be a whole number, got ${JSON.stringify(process.env[name])}`);
  return value;
}

function intList(name: string, fallback: string): number[] {
  return (process.env[name] ?? fallback)
    .split(",")
    .map((n) => Number(n.trim()))
    .filter((n) => Number.isInteger(n) && n > 0);
}
