// Crash safety of the vps.instances reconciler against the providers' emulators (SIMULATED: no
// Hetzner account is involved). The control plane dies at every boundary of a create, a stop and a
// delete: before and after each commit (a transaction, or a write that commits by itself, like the
// lease's renewal) and before and after each provider request. Every run must end in the right
// state, with exactly one server made at the provider for the instance (a create of the Cloud
// emulator, a box claimed at the Robot emulator) and nothing of it left there after the delete.
//
// The crash model is ChaosPlan's (testing/metal-sim-control-plane.ts), with the provider's
// HTTP added: one reconciler pass (compute.reconcile, what a cron run does) is one process, with a
// store and a fetch that die together at the armed boundary. Before a commit: thrown inside the
// transaction (rolled back), or the statement is never sent; after a commit: thrown right after
// it. Before a request: thrown before it leaves; after one: the emulator answered it, then the
// process died. Every later query or request of the dead process throws too, so no catch block
// of it writes. The next pass is a fresh process, started from Postgres; the dead one's lease on
// the instance (300 s) runs out as the database clock moves on.
//
// Every boundary is covered, none sampled: each lifecycle of a lane (create, stop, delete of a new
// instance) arms boundary k in each phase that still has a k-th, and a phase is done when its
// armed run reaches no boundary k. Then each create boundary again, the instance deleted right
// after the crash: whatever the create left (a server, a claim half made, nothing) goes with it.
// One lane per provider, each with its own database, run side by side.
import { generateKeyPairSync } from "node:crypto";
import { sql, type SQL } from "drizzle-orm";
import { PgDialect } from "drizzle-orm/pg-core";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { betterCompute, type Compute } from "better-compute";
import type { Store } from "better-compute/core";
import { hetznerCloudProvider, INSTANCE_LABEL } from "better-compute/hetzner-cloud";
import { FREE_NAME, hetznerRobotProvider, RESCUE_IMAGE, stampOf } from "better-compute/hetzner-robot";
import { startHetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import { EMULATED_PRODUCTS, ROBOT_LIMITS, startHetznerRobotEmulator } from "better-compute/testing/hetzner-robot";
import { LEASE_SECONDS, vps, type Fetch } from "better-compute/vps";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startPglite } from "../../local/pglite-server.ts";
import { startBridge } from "../../local/ws-bridge.ts";
import { quietCrashReports } from "../support/quiet-crash-reports.ts";

const SECRET = "vps-chaos-deployment-secret-0123456789abcdef";
const PHASES = ["create", "stop", "delete"] as const;
type Phase = (typeof PHASES)[number];
/** What each phase asks for and ends in. */
const PHASE = {
  create: { method: "vps.instances.create", to: "running" },
  stop: { method: "vps.instances.stop", to: "stopped" },
  delete: { method: "vps.instances.delete", to: "deleted" },
} as const;
/** A clean phase takes two passes; a crashed one a pass or two more. */
const MAX_PASSES = 8;

// ---------------------------------------------------------------- the crash model

type Boundary = "before-commit" | "after-commit" | "before-call" | "after-call";

const dialect = new PgDialect();
/** A statement's first words, e.g. "UPDATE vps_instances SET lease_until": what the boundary list names. */
const statementOf = (query: SQL | string) =>
  (typeof query === "string" ? query : dialect.sqlToQuery(query.getSQL()).sql).trim().replace(/\s+/g, " ");
const isWrite = (statement: string) => /^(UPDATE|INSERT|DELETE)\b/i.test(statement);
const headOf = (statement: string) => /^(UPDATE \w+ SET \w+|INSERT INTO \w+|DELETE FROM \w+|\w+)/i.exec(statement)?.[1] ?? statement;
const NULL_BODY = new Set([101, 204, 205, 304]);

/**
 * Counts the boundaries the passes cross from arm() on, in one sequence (a commit and a request
 * are two each: before and after), and kills the pass that crosses the armed one.
 */
class CrashPlan {
  /** Boundaries crossed since arm(), the fatal one included. */
  count = 0;
  /** Where the armed boundary was reached, e.g. "7 before-call POST /servers". */
  hit: string | undefined;
  /** Every boundary crossed since arm(), named. */
  trail: string[] = [];
  #at = Number.POSITIVE_INFINITY;

  /** Kills the pass that crosses the at-th boundary from now; without it, counts only. */
  arm(at = Number.POSITIVE_INFINITY): void {
    this.count = 0;
    this.hit = undefined;
    this.trail = [];
    this.#at = at;
  }

  /** One pass: a store and a fetch that die together. */
  process(store: Store, fetch: Fetch): { store: Store; fetch: Fetch; dead: () => boolean } {
    let dead = false;
    const alive = () => {
      if (dead) throw new Error("chaos: this process died");
    };
    const cross = (boundary: Boundary, what: string) => {
      alive();
      const name = `${++this.count} ${boundary} ${what}`;
      this.trail.push(name);
      if (this.count !== this.#at) return;
      dead = true;
      this.hit = name;
      throw new Error(`chaos: the process died at boundary ${name}`);
    };
    /** A statement outside a transaction: a write commits by itself. */
    const execute = (db: Store["db"]) => async (query: SQL | string) => {
      alive();
      const statement = statementOf(query);
      if (!isWrite(statement)) return db.execute(query);
      cross("before-commit", headOf(statement));
      const result = await db.execute(query);
      cross("after-commit", headOf(statement));
      return result;
    };
    const db = new Proxy(store.db, {
      get(target, key) {
        alive();
        if (key === "execute") return execute(target);
        const value: unknown = Reflect.get(target, key, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
    return {
      dead: () => dead,
      fetch: async (input, init) => {
        const request = new Request(input, init);
        const what = `${request.method} ${new URL(request.url).pathname.replace(/\/\d+(?=\/|$)/g, "/{n}")}`;
        cross("before-call", what);
        const response = await fetch(request);
        const body = await response.arrayBuffer();
        cross("after-call", what);
        return new Response(NULL_BODY.has(response.status) ? null : body, response);
      },
      store: {
        db,
        close: async () => {},
        write: (statement) => execute(store.db)(statement),
        transaction: async (fn) => {
          alive();
          let first = "transaction";
          const result = await store.transaction(async (tx) => {
            // The transaction is named after its first statement (the claim's UPDATE, the record's).
            const named = new Proxy(tx, {
              get(target, key) {
                const value: unknown = Reflect.get(target, key, target);
                if (key === "execute")
                  return (query: SQL | string) => {
                    if (first === "transaction") first = headOf(statementOf(query));
                    return target.execute(query);
                  };
                return typeof value === "function" ? value.bind(target) : value;
              },
            });
            const out = await fn(named);
            cross("before-commit", `transaction (${first})`); // thrown inside: it rolls back
            return out;
          });
          cross("after-commit", `transaction (${first})`);
          return result;
        },
      },
    };
  }
}

// ---------------------------------------------------------------- the providers

/** A provider's emulator as the checks read it. */
interface Target {
  provider: string;
  config: Record<string, unknown>;
  offer: string;
  image: string;
  location: string;
  /** The servers at the provider that carry the instance's stamp now, and their power. */
  serversOf(instance: string): { id: string; power: string }[];
  /** Every instance's server at the provider now (a lane's instances are deleted one after another: none after a delete). */
  live(): string[];
  /** Servers made for the instance so far: created (Cloud) or claimed (Robot). */
  madeFor(instance: string): number;
  /** Called before the instance's first pass and after every pass. */
  observe(instance: string): void;
  stop(): Promise<void>;
}

async function hetznerCloud(): Promise<Target> {
  const emu = await startHetznerCloudEmulator({ token: "hcloud-chaos-token-Qw3Er5Ty7Ui9" });
  // The emulator counts every server created since its start; one lifecycle runs at a time on it.
  const before = new Map<string, number>();
  return {
    provider: "hetzner-cloud",
    config: { token: emu.token, endpoint: emu.url },
    offer: "cx22",
    image: "ubuntu-24.04",
    location: "fsn1",
    serversOf: (instance) =>
      emu
        .servers()
        .filter((s) => s.labels[INSTANCE_LABEL] === instance)
        .map((s) => ({ id: String(s.id), power: s.status === "running" ? "on" : s.status })),
    live: () => emu.servers().map((s) => `${s.id} ${s.name}`),
    madeFor: (instance) => emu.counters.serversCreated - before.get(instance)!,
    observe: (instance) => void (before.has(instance) || before.set(instance, emu.counters.serversCreated)),
    stop: () => emu.stop(),
  };
}

async function hetznerRobot(): Promise<Target> {
  const user = "#ws+Chaos7Kd2";
  const password = "robot-chaos-pw-5Nb8Vc1Xz3";
  // Its hourly limits are the real ones; the chaos runs reset boxes far more often than an hour allows.
  const limits = Object.fromEntries(Object.entries(ROBOT_LIMITS).map(([endpoint, limit]) => [endpoint, { ...limit, max: 100_000 }]));
  const emu = await startHetznerRobotEmulator({ user, password, limits });
  // Boxes carrying the instance's claim, as seen after each pass: a claim is only ever released by the delete.
  const claimed = new Map<string, Set<number>>();
  const mine = (instance: string) => emu.servers().filter((s) => stampOf(s.name)?.instanceId === instance);
  return {
    provider: "hetzner-robot",
    config: { endpoint: emu.url, user, password, products: EMULATED_PRODUCTS },
    offer: "AX41-NVMe",
    image: RESCUE_IMAGE,
    location: "FSN1-DC14",
    serversOf: (instance) => mine(instance).map((s) => ({ id: String(s.number), power: s.power })),
    live: () => emu.servers().flatMap((s) => (stampOf(s.name) ? [`${s.number} ${s.name}`] : [])),
    madeFor: (instance) => claimed.get(instance)?.size ?? 0,
    observe(instance) {
      const boxes = claimed.get(instance) ?? new Set<number>();
      for (const s of mine(instance)) boxes.add(s.number);
      claimed.set(instance, boxes);
      // A released box is free again, with no rescue boot armed with the tenant's keys.
      for (const n of boxes) {
        const box = emu.servers().find((s) => s.number === n)!;
        if (box.name === FREE_NAME) expect(box.rescue.active, `box ${n} released by ${instance}`).toBe(false);
      }
    },
    stop: () => emu.stop(),
  };
}

// ---------------------------------------------------------------- a lane: a control plane on its own database

interface Lane {
  target: Target;
  compute: Compute;
  env: Record<string, unknown>;
  store: NodeStore;
  plan: CrashPlan;
  /** The fetch of the pass running now; the module's fetch forwards to it. */
  passFetch: Fetch | undefined;
  call<T = any>(method: string, input?: Record<string, unknown>): Promise<T>;
  instances: number;
  stop(): Promise<void>;
}

async function startLane(target: Target): Promise<Lane> {
  const cleanup: Array<() => Promise<unknown>> = [() => target.stop()];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
  };
  try {
    const pglite = await startPglite();
    cleanup.push(() => pglite.stop());
    const bridge = await startBridge();
    cleanup.push(() => bridge.stop());
    const store = await openNodeStore(pglite.connectionString, { bridge: bridge.url });
    cleanup.push(() => store.close());
    // The module's fetch is fixed when it is built: it is the running pass's, or (for the API's
    // calls: a flavor asks for the offers) the plain one.
    const fetch: Fetch = (input, init) => (lane.passFetch ?? globalThis.fetch)(input, init);
    const compute = betterCompute({ secret: SECRET, modules: [vps({ providers: [hetznerCloudProvider, hetznerRobotProvider], fetch })] });
    await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
    const adminKey = (await compute.mintApiKey(store, { name: "vps-chaos", roles: ["admin"] })).key;
    const env = { DATABASE_URL: pglite.connectionString, BC_DB_WS_PROXY: bridge.url, BC_SECRET: SECRET };
    const lane: Lane = {
      target,
      compute,
      env,
      store,
      plan: new CrashPlan(),
      passFetch: undefined,
      call: (method, input) => callApi("https://vps-chaos.test", adminKey, method, input, (request) => compute.fetch(request, env)),
      instances: 0,
      stop,
    };

    const { provider, config, offer, image, location } = target;
    await lane.call("vps.accounts.create", { id: "acct", provider, config });
    await lane.call("vps.pools.create", { id: "pool", account: "acct", location });
    await lane.call("vps.tenants.create", { id: "acme" });
    await lane.call("vps.quotas.set", { tenant: "acme", pool: "pool", instances: 5, vcpus: 200, memoryMiB: 1 << 20, diskGiB: 100_000 });
    await lane.call("vps.flavors.create", { id: "small", pool: "pool", offer, image });
    return lane;
  } catch (err) {
    await stop();
    throw err;
  }
}

/** One cron run of the reconcilers as a process of its own; answers whether it died. */
async function pass(lane: Lane): Promise<boolean> {
  const process = lane.plan.process(lane.store, globalThis.fetch);
  lane.passFetch = process.fetch;
  try {
    await lane.compute.reconcile(lane.env, process.store);
  } finally {
    lane.passFetch = undefined;
  }
  return process.dead();
}

/** A new OpenSSH ed25519 key line for each instance, so every create uploads its key (boundaries alike in every run). */
function newSshKey(comment: string): string {
  const raw = Buffer.from(generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" }).x!, "base64url");
  // The blob: the type and the key, each prefixed with its length (uint32).
  const field = (bytes: Buffer) => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    return Buffer.concat([length, bytes]);
  };
  return `ssh-ed25519 ${Buffer.concat([field(Buffer.from("ssh-ed25519")), field(raw)]).toString("base64")} ${comment}`;
}

const rows = async <T>(lane: Lane, query: SQL) => (await lane.store.db.execute(query)).rows as T[];

/** Passes until the instance is in the phase's end state (or failed, or `until` says so), each a process of its own. */
async function drive(lane: Lane, id: string, to: string, label: string, until = () => false) {
  for (let i = 0; i < MAX_PASSES; i++) {
    const { state } = (await rows<{ state: string }>(lane, sql`SELECT state FROM vps_instances WHERE id = ${id}`))[0]!;
    if (state === to || state === "failed" || until()) return lane.call("vps.instances.get", { id });
    const died = await pass(lane);
    lane.target.observe(id);
    // The dead pass still holds the instance: time passes until its lease runs out.
    if (died) await lane.store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${LEASE_SECONDS + 1})`);
  }
  const stood = await rows(
    lane,
    sql`SELECT state, desired, provider_id, pending_op, last_error, lease_until, next_attempt_at FROM vps_instances WHERE id = ${id}`,
  );
  throw new Error(`${label}: not ${to} after ${MAX_PASSES} passes; where it stood: ${JSON.stringify(stood)}`);
}

/** A new instance of the tenant, with an SSH key of its own. */
async function newInstance(lane: Lane): Promise<string> {
  const n = ++lane.instances;
  await lane.call("vps.sshKeys.create", { tenant: "acme", name: `key-${n}`, publicKey: newSshKey(`chaos-${n}@laptop`) });
  const input = { tenant: "acme", pool: "pool", flavor: "small", name: `web-${n}`, sshKeys: [`key-${n}`] };
  const { id } = await lane.call<{ id: string }>("vps.instances.create", input);
  lane.target.observe(id);
  return id;
}

/** The instance's history makes one server at most: never a second create that made another. */
async function checkHistory(lane: Lane, id: string, server: string | undefined, label: string) {
  const history = await rows<{ call: string; outcome: string; detail: Record<string, unknown> }>(
    lane,
    sql`SELECT call, outcome, detail FROM vps_instance_history WHERE instance_id = ${id} ORDER BY id`,
  );
  const creates = history.filter((h) => h.call === "create" && h.outcome === "ok");
  expect(creates.length, `${label}: creates in the history`).toBeLessThanOrEqual(1);
  const servers = [...new Set(history.map((h) => h.detail.providerId).filter((p) => p !== undefined))];
  if (server === undefined) expect(servers.length, `${label}: servers in the history`).toBeLessThanOrEqual(1);
  else expect(servers, `${label}: servers in the history`).toEqual([server]);
}

/**
 * A new instance through create, stop and delete, each phase crashed at its armed boundary if it
 * has one, each checked at its end. Answers, per phase, how many boundaries it crossed and where it died.
 */
async function lifecycle(lane: Lane, arms: Partial<Record<Phase, number>>) {
  const { target, plan } = lane;
  const outcome = {} as Record<Phase, { count: number; hit: string | undefined; trail: string[] }>;
  let id = "";
  let server = "";
  for (const phase of PHASES) {
    const label = `${target.provider} ${phase}, crashed at boundary ${arms[phase] ?? "none"}`;
    plan.arm(arms[phase]);
    if (phase === "create") id = await newInstance(lane);
    else await lane.call(PHASE[phase].method, { id });
    const ended = await drive(lane, id, PHASE[phase].to, label);
    outcome[phase] = { count: plan.count, hit: plan.hit, trail: plan.trail };
    plan.arm();
    const where = `${label} (${outcome[phase].hit ?? "not reached"})`;

    expect(ended, where).toMatchObject({ state: PHASE[phase].to, lastError: null });
    expect(target.madeFor(id), `${where}: servers made for the instance`).toBe(1);
    const servers = target.serversOf(id);
    if (phase === "delete") {
      expect(servers, `${where}: the instance's servers at the provider`).toEqual([]);
      expect(target.live(), `${where}: instances' servers at the provider`).toEqual([]);
    } else {
      expect(servers, `${where}: the instance's servers at the provider`).toHaveLength(1);
      server ||= servers[0]!.id;
      expect(servers[0], where).toMatchObject({ id: server, power: phase === "create" ? "on" : "off" });
      expect(ended.providerId, where).toBe(server);
    }
  }

  const label = `${target.provider} ${JSON.stringify(arms)}`;
  await checkHistory(lane, id, server, label);
  // Each state change recorded once, the last one deleted.
  const events = (
    await rows<{ type: string }>(
      lane,
      sql`SELECT type FROM bc_events WHERE subject = ${`vps/instances/${id}`} AND type NOT IN ('vps.instance.created', 'vps.instance.requested') ORDER BY id`,
    )
  ).map((e) => e.type);
  expect(events.length, `${label}: ${events.join(", ")}`).toBe(new Set(events).size);
  expect(events.at(-1), label).toBe("vps.instance.deleted");
  return outcome;
}

/**
 * A create crashed at boundary k and deleted before any pass took it up again: the instance goes,
 * whatever the crash left at the provider (a server, a claim half made, nothing), and one server
 * at most was made. Answers where it died (undefined: the create reached no boundary k).
 */
async function cutShort(lane: Lane, k: number): Promise<string | undefined> {
  const { target, plan } = lane;
  const label = `${target.provider} create cut short at boundary ${k}, then deleted`;
  plan.arm(k);
  const id = await newInstance(lane);
  await drive(lane, id, PHASE.create.to, label, () => plan.hit !== undefined);
  const hit = plan.hit;
  plan.arm();
  await lane.call("vps.instances.delete", { id });
  const where = `${label} (${hit ?? "not reached"})`;
  expect(await drive(lane, id, PHASE.delete.to, where), where).toMatchObject({ state: "deleted", lastError: null });
  expect(target.madeFor(id), `${where}: servers made for the instance`).toBeLessThanOrEqual(1);
  expect(target.live(), `${where}: instances' servers at the provider`).toEqual([]);
  await checkHistory(lane, id, undefined, where);
  return hit;
}

/** Every boundary of each phase, one crashed lifecycle after another: what was covered and each phase's boundaries. */
async function everyBoundary(lane: Lane) {
  const boundaries: Partial<Record<Phase, string[]>> = {};
  const covered: Record<Phase, string[]> = { create: [], stop: [], delete: [] };
  for (let k = 1; PHASES.some((p) => !boundaries[p]); k++) {
    if (k > 200) throw new Error(`${lane.target.provider}: more than 200 boundaries in a phase`);
    const arms = Object.fromEntries(PHASES.filter((p) => !boundaries[p]).map((p) => [p, k]));
    const outcome = await lifecycle(lane, arms);
    for (const phase of PHASES) {
      if (arms[phase] === undefined) continue;
      // An armed run that reached no boundary k ran clean: its trail is the phase's boundaries.
      if (outcome[phase].hit) covered[phase].push(outcome[phase].hit);
      else boundaries[phase] = outcome[phase].trail;
    }
  }
  const cutShortAt: string[] = [];
  for (let k = 1; ; k++) {
    const hit = await cutShort(lane, k);
    if (!hit) break;
    cutShortAt.push(hit);
  }
  return { boundaries: boundaries as Record<Phase, string[]>, covered, cutShortAt };
}

// ---------------------------------------------------------------- the runs

const lanes: Lane[] = [];

beforeAll(async () => {
  quietCrashReports();
  lanes.push(...(await Promise.all([hetznerCloud(), hetznerRobot()].map(async (target) => startLane(await target)))));
}, 60_000);

afterAll(async () => {
  await Promise.all(lanes.map((l) => l.stop()));
  vi.restoreAllMocks();
});

it("a create, a stop and a delete crashed at every boundary, before and after each commit and each provider call, end right with exactly one server", async () => {
  const started = Date.now();
  const results = await Promise.all(lanes.map(async (lane) => ({ provider: lane.target.provider, ...(await everyBoundary(lane)) })));
  for (const { provider, boundaries, covered, cutShortAt } of results) {
    for (const phase of PHASES) {
      // Each boundary k of a clean run was reached and died at, in order.
      expect(
        covered[phase].map((hit) => Number(hit.split(" ")[0])),
        `${provider} ${phase}: ${boundaries[phase].join("; ")}`,
      ).toEqual(boundaries[phase].map((_, i) => i + 1));
      // Two passes at least, each with a claim, a renewal, a provider call and a record.
      expect(boundaries[phase].length, `${provider} ${phase}`).toBeGreaterThanOrEqual(10);
    }
    // A create cut short at each of its boundaries, then deleted.
    expect(cutShortAt, provider).toEqual(covered.create);
  }
  console.info(
    `vps chaos: ${results
      .map(
        ({ provider, boundaries }) =>
          `${provider} (${PHASES.map((p) => `${p} ${boundaries[p].length}`).join(", ")} boundaries; each create boundary again, then deleted)`,
      )
      .join(" and ")}, every boundary crashed, in ${((Date.now() - started) / 1000).toFixed(0)} s`,
  );
}, 300_000);
