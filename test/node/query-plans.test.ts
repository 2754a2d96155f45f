// The hot queries' plans: every statement the engine, the NodeDO's delivery, the reconcilers,
// the sweeps and the placer send while they work, captured at the driver and EXPLAINed with its
// own parameters against tables holding thousands of rows (ANALYZEd), must not read bc_commands,
// bc_nodes, workflows, workflow_steps, metal_nodes, vps_instances or capacity_reservations by a
// sequential scan: each must find its rows through an index, so its cost does not grow with the
// fleet's history. Real parts: the modules, the production driver, PGlite's planner (Postgres 18
// compiled to WASM). What it does not cover is in docs/decisions.md ("The hot queries' plans").
import { Pool, type PoolClient } from "@neondatabase/serverless";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-serverless";
import { z } from "zod";
import { afterAll, beforeAll, expect, it } from "vitest";
import { betterCompute, definePlugin, type Compute } from "better-compute";
import type { Store } from "better-compute/core";
import { capacity } from "better-compute/capacity";
import { metalModule } from "better-compute/metal";
import { advance, defineProfile, defineStep, provisionModule, startWorkflow, StepError } from "better-compute/provision";
import { vps } from "better-compute/vps";
import { nextDelivery, recordConnected, recordDisconnected, recordResult } from "../../core/agents/sessions.ts";
import { recordStatus } from "../../core/agents/node-specs.ts";
import { useBridge } from "../../core/store/database.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";
import { startBridge, type Bridge } from "../../local/ws-bridge.ts";

/** The tables that grow with the fleet and its history: no hot query may scan them whole. */
const WATCHED = ["bc_commands", "bc_nodes", "workflows", "workflow_steps", "metal_nodes", "vps_instances", "capacity_reservations"];

/**
 * Queries that read a watched table whole by design, each with why. Placement judges every
 * candidate host with its live reservations summed (docs/capacity.md): that read is the algorithm,
 * O(hosts + live reservations) per placement. The same query locked to one host (a nodeId, so no
 * null parameter) is not exempt.
 */
const WHOLE_BY_DESIGN = [
  {
    why: "placement reads every candidate host and sums its live reservations",
    matches: (q: Captured) => q.text.includes("LEFT JOIN capacity_hosts h ON h.node_id = n.id") && q.values.includes(null),
    tables: ["bc_nodes", "capacity_reservations"],
  },
];

interface Captured {
  phase: string;
  text: string;
  values: unknown[];
}

const HOSTS = 2000;
const WORKFLOWS = 5000;
const COMMANDS = 20000;
const METAL_NODES = 5000;
/** 600 of them live on hosts: more than one page of the host reconciler (500), which must reach the pending one after them. */
const INSTANCES = 12000;

const probes = definePlugin({
  id: "query-plans",
  commands: [{ kind: "qp.probe", input: z.object({}), roles: ["node"] }],
  extensions: [
    defineStep({ id: "qp.noop", runsOn: "control-plane", input: z.object({}), run: async () => ({ ok: true }) }),
    // Fails its first attempt (retryable, no backoff): the retry's statements run too.
    defineStep({
      id: "qp.flaky",
      runsOn: "control-plane",
      input: z.object({}),
      retry: { attempts: 2, backoffSeconds: 0 },
      run: async (ctx) => {
        if (ctx.step.attempt === 1) throw new StepError("UNAVAILABLE", "first attempt fails");
        return { ok: true };
      },
    }),
    defineStep({ id: "qp.probe", runsOn: "node", sends: ["qp.probe"], input: z.object({}), command: { kind: "qp.probe" } }),
  ],
  profiles: [
    defineProfile({
      id: "qp.agent",
      target: "node",
      steps: [{ step: "qp.noop" }, { step: "qp.flaky" }, { step: "qp.probe" }, { step: "qp.noop", name: "last", fromStep: "qp.probe" }],
    }),
  ],
});

let pglite: PgliteServer;
let bridge: Bridge;
let observer: NodeStore; // seeding and EXPLAIN, not captured
let explainer: Pool;
let captured: Store;
let compute: Compute;
let phase = "setup";
const queries = new Map<string, Captured>();

/** A Store like postgres()'s whose clients record every statement they send, by phase. */
function capturingStore(url: string): Store {
  const pool = new Pool({ connectionString: url, max: 4 });
  pool.on("error", () => {});
  pool.on("connect", (client: PoolClient) => {
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    client.query = ((...args: unknown[]) => {
      const [first, second] = args as [string | { text: string; values?: unknown[] }, unknown[] | undefined];
      const text = typeof first === "string" ? first : first.text;
      // drizzle passes (config, params); the config carries the text and, sometimes, the values.
      const values = (typeof first === "string" ? second : (first.values ?? second)) ?? [];
      // One plan per statement text and per pattern of null parameters (a null can switch a branch off).
      const key = `${text}\0${values.map((v) => v === null).join()}`;
      if (!queries.has(key)) queries.set(key, { phase, text, values });
      return query(...args);
    }) as PoolClient["query"];
  });
  const db = drizzle({ client: pool });
  return {
    db,
    transaction: (fn) => db.transaction(fn),
    write: (statement) => db.execute(statement),
    close: () => pool.end().catch(() => {}),
  };
}

beforeAll(async () => {
  pglite = await startPglite();
  bridge = await startBridge();
  observer = await openNodeStore(pglite.connectionString, { bridge: bridge.url });
  useBridge(bridge.url);
  explainer = new Pool({ connectionString: pglite.connectionString, max: 1 });
  captured = capturingStore(pglite.connectionString);
  compute = betterCompute({
    secret: "query-plans-secret-0123456789abcdef",
    modules: [provisionModule(), metalModule(), capacity(), vps()],
    plugins: [probes],
  });
  await applyMigrations(observer, [...coreMigrations(), ...compute.migrations()]);
  await seed();
}, 180_000);

afterAll(async () => {
  await captured?.close();
  await explainer?.end().catch(() => {});
  await observer?.close();
  await bridge?.stop();
  await pglite?.stop();
});

/** A fleet with history: hosts and old ramdisks, finished workflows and their commands, machines, instances mostly deleted, reservations. */
async function seed() {
  const run = (query: ReturnType<typeof sql>) => observer.db.execute(query);
  await run(sql`
    INSERT INTO bc_nodes (id, role, public_key, attestor, state, session_id, labels, resources)
    SELECT 'qp-h-' || i, 'node', 'key', 'test', 'connected', 'session-' || i,
           jsonb_build_object('qp', 'host', 'bc.dev/driver.qemu-microvm', '1'),
           '{"cpus": 64, "memoryMiB": 262144, "diskGiB": 4000, "devices": []}'::jsonb
    FROM generate_series(1, ${HOSTS}) i`);
  // Every machine's ramdisk joined once; most were revoked when their workflow ended.
  await run(sql`
    INSERT INTO bc_nodes (id, role, public_key, attestor, state, labels, revoked_at)
    SELECT 'qp-r-' || i, 'ramdisk', 'key', 'test', 'disconnected',
           jsonb_build_object('bc.dev/product-uuid', 'uuid-' || i, 'bc.dev/site', 'qp-site'),
           CASE WHEN i % 10 = 1 THEN NULL ELSE compute_now() END
    FROM generate_series(1, ${METAL_NODES}) i`);
  await run(sql`
    INSERT INTO workflows (id, profile_id, profile_version, target, state, position, created_by, finished_at)
    SELECT 'seed-wf-' || i, 'qp.agent', '1', 'qp-h-' || (1 + i % ${HOSTS}), CASE WHEN i % 100 = 0 THEN 'running' ELSE 'succeeded' END,
           CASE WHEN i % 100 = 0 THEN 1 ELSE 4 END, 'seed', CASE WHEN i % 100 = 0 THEN NULL ELSE compute_now() END
    FROM generate_series(1, ${WORKFLOWS}) i`);
  await run(sql`
    INSERT INTO workflow_steps (workflow_id, position, attempt, name, step_id, state, input, input_digest, output, finished_at)
    SELECT 'seed-wf-' || w, p, 1, 'step-' || p, 'qp.noop', 'succeeded', '{}'::jsonb, 'digest', '{"ok": true}'::jsonb, compute_now()
    FROM generate_series(1, ${WORKFLOWS}) w, generate_series(0, 3) p`);
  await run(sql`
    INSERT INTO bc_commands (node_id, seq, kind, idempotency_key, module, body, state, origin, delivered_at, completed_at)
    SELECT 'qp-h-' || (1 + i % ${HOSTS}), i, 'qp.probe', 'seed-' || i, 'query-plans', '{}'::jsonb,
           CASE WHEN i % 500 = 0 THEN 'delivered' ELSE 'succeeded' END, 'workflow:seed-wf-' || (1 + i % ${WORKFLOWS}),
           compute_now(), CASE WHEN i % 500 = 0 THEN NULL ELSE compute_now() END
    FROM generate_series(1, ${COMMANDS}) i`);
  await run(sql`SELECT setval('bc_command_seq', ${COMMANDS + 1})`);
  await run(sql`INSERT INTO metal_sites (id) VALUES ('qp-site')`);
  await run(sql`INSERT INTO metal_pools (id, site_id, class, agent, policy) VALUES ('qp-pool', 'qp-site', 'metal', 'bcd', '{}'::jsonb)`);
  await run(sql`
    INSERT INTO metal_nodes (id, pool_id, site_id, bmc, state, workflow_id, product_uuid)
    SELECT 'qp-m-' || i, 'qp-pool', 'qp-site', jsonb_build_object('address', 'https://10.1.' || (i / 250) || '.' || (i % 250) || '/redfish/v1/Systems/1'),
           CASE WHEN i % 2 = 0 THEN 'ready' ELSE 'deployed' END, 'seed-wf-' || i, 'uuid-' || i
    FROM generate_series(1, ${METAL_NODES}) i`);
  // One machine deploying whose workflow succeeded: the lifecycle reconciler settles it (and revokes its ramdisk).
  await run(sql`UPDATE metal_nodes SET state = 'deploying' WHERE id = 'qp-m-1'`);
  await run(sql`INSERT INTO vps_accounts (id, provider, provider_version, config) VALUES ('qp-acc', 'qp-cloud', '1', '{}'::jsonb)`);
  await run(sql`INSERT INTO vps_pools (id, account_id, class, agent) VALUES ('qp-prov', 'qp-acc', 'provider', 'none')`);
  await run(sql`
    INSERT INTO vps_pools (id, class, agent, host_labels, runtime, overcommit, strategy, image)
    VALUES ('qp-host', 'host', 'none', '{"qp": "host"}'::jsonb, 'qemu-microvm', '{"cpu": 1, "memory": 1}'::jsonb, 'spread', 'qp-image')`);
  await run(sql`INSERT INTO vps_tenants (id, name) VALUES ('qp-t', 'Query plans')`);
  await run(
    sql`INSERT INTO vps_flavors (id, pool_id, name, vcpus, memory_mib, disk_gib) VALUES ('qp-small', 'qp-host', 'small', 1, 512, 5)`,
  );
  // Half in the provider pool, half on hosts; nine in ten deleted (history); the live provider ones not due for an hour.
  await run(sql`
    INSERT INTO vps_instances (id, tenant_id, pool_id, flavor_id, name, ssh_keys, state, desired, vcpus, memory_mib, disk_gib,
                               next_attempt_at, host_node_id, spec_generation, user_data, user_data_sha256)
    SELECT 'qp-i-' || i, 'qp-t', CASE WHEN i % 2 = 0 THEN 'qp-prov' ELSE 'qp-host' END, 'qp-small', 'vm-' || i, '[]'::jsonb,
           CASE WHEN (i / 2) % 10 = 0 THEN 'running' ELSE 'deleted' END, CASE WHEN (i / 2) % 10 = 0 THEN 'running' ELSE 'deleted' END,
           1, 512, 5, compute_now() + interval '1 hour', CASE WHEN i % 2 = 1 THEN 'qp-h-' || (1 + i % ${HOSTS}) END, 1, '#!/bin/sh', 'x'
    FROM generate_series(1, ${INSTANCES}) i`);
  // One host instance waiting for a place: the host reconciler places it (capacity) and writes its entry (NodeSpec).
  await run(sql`
    INSERT INTO vps_instances (id, tenant_id, pool_id, flavor_id, name, ssh_keys, state, desired, vcpus, memory_mib, disk_gib, user_data, user_data_sha256)
    VALUES ('qp-i-pending', 'qp-t', 'qp-host', 'qp-small', 'pending', '[]'::jsonb, 'pending', 'running', 1, 512, 5, '#!/bin/sh',
            encode(sha256(convert_to('#!/bin/sh', 'UTF8')), 'hex'))`);
  await run(sql`
    INSERT INTO capacity_reservations (id, node_id, owner, pool, vcpus, memory_mib, disk_gib, state)
    SELECT 'r-' || id, host_node_id, 'vps/instances/' || id, pool_id, vcpus, memory_mib, disk_gib, 'active'
    FROM vps_instances WHERE host_node_id IS NOT NULL AND state <> 'deleted'`);
  await run(sql`
    INSERT INTO capacity_reservations (id, node_id, owner, vcpus, memory_mib, disk_gib, state, expires_at)
    SELECT 'r-h-' || i, 'qp-h-' || (1 + i % ${HOSTS}), 'hold-' || i, 1, 512, 5, 'held',
           compute_now() + CASE WHEN i % 2 = 0 THEN interval '1 hour' ELSE interval '-1 hour' END
    FROM generate_series(1, 600) i`);
  await run(sql`ANALYZE`);
}

/** The statements one workload sends, under a phase name for the failure message. */
async function during(name: string, work: () => Promise<unknown>) {
  phase = name;
  try {
    await work();
  } finally {
    phase = "after";
  }
}

/** advance() until the workflow waits for something (a retry's zero backoff asks to go on at once). */
async function advanceWhileBusy(ctx: Parameters<typeof advance>[0], id: string) {
  for (let pass = 0; pass < 5; pass++) if ((await advance(ctx, id)).wakeInMs !== 0) return;
}

type PlanNode = { "Node Type": string; "Relation Name"?: string; Filter?: string; Plans?: PlanNode[] };

/** The watched tables a plan reads by a sequential scan. */
function scannedWhole(plan: PlanNode): string[] {
  const own = plan["Node Type"] === "Seq Scan" && WATCHED.includes(plan["Relation Name"]!) ? [plan["Relation Name"]!] : [];
  return [...own, ...(plan.Plans ?? []).flatMap(scannedWhole)];
}

/** The plan as EXPLAIN's text shows it, roughly: one line per node, indented. */
function outline(plan: PlanNode, depth = 0): string {
  const on = plan["Relation Name"] ? ` on ${plan["Relation Name"]}` : "";
  const filter = plan.Filter ? ` (Filter: ${plan.Filter})` : "";
  return [`${"  ".repeat(depth)}${plan["Node Type"]}${on}${filter}`, ...(plan.Plans ?? []).map((p) => outline(p, depth + 1))].join("\n");
}

const TRANSACTION_CONTROL = /^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b/i;

it("no hot query scans a whole table of commands, nodes, workflows, steps, machines, instances or reservations", async () => {
  const provision = compute.moduleContext("provision", {}, captured);
  const host = "qp-h-7";
  const session = { nodeId: host, sessionId: "session-7", publicKey: "key" };

  // The NodeDO: an agent connects and reports its NodeSpec status.
  await during("NodeDO: hello", () =>
    recordConnected(captured, session, {
      t: "hello",
      protocol: 1,
      nonce: "n",
      signature: "s",
      role: "node",
      version: "test",
      bootId: "boot-7",
      labels: { qp: "host" },
      drivers: [{ id: "qemu-microvm", version: "1" }],
      resources: { cpus: 64, memoryMiB: 262144, diskGiB: 4000, devices: [] },
    } as Parameters<typeof recordConnected>[2]),
  );
  await during("NodeDO: status", () => recordStatus(captured, { ...session, bootId: "boot-7" }, { generation: 0, sections: {} }));

  // The engine runs a workflow: control-plane steps, a retry, an agent step whose command the NodeDO delivers and whose result it records.
  const { id } = await captured.transaction((tx) =>
    startWorkflow(provision, tx, { profile: "qp.agent", target: host, createdBy: "query-plans" }),
  );
  await during("engine", () => advanceWhileBusy(provision, id));
  const delivered = await (async () => {
    let frames: Awaited<ReturnType<typeof nextDelivery>>["frames"] = [];
    await during("NodeDO: delivery", async () => {
      ({ frames } = await nextDelivery(captured, host, { afterSeq: 0, specAfter: 0, limit: 64 }, () => provision.secrets));
    });
    return frames;
  })();
  const probe = delivered.find((f) => f.kind === "qp.probe" && f.key.startsWith(`wf:${id}:`));
  expect(probe, "the workflow's command was delivered").toBeDefined();
  await during("NodeDO: result", () =>
    recordResult(captured, session, { t: "result", id: probe!.id, key: probe!.key, ok: true, output: {} }),
  );
  await during("engine", () => advanceWhileBusy(provision, id));
  const wf = await observer.db.execute(sql`SELECT state FROM workflows WHERE id = ${id}`);
  expect(wf.rows).toEqual([{ state: "succeeded" }]);

  // The cron: every module's sweeps and reconcilers (metal settles its machine, vps places its instance, capacity drops expired holds).
  await during("cron: sweeps and reconcilers", () => compute.sweep({}, captured));
  const settled = await observer.db.execute(sql`SELECT state FROM metal_nodes WHERE id = 'qp-m-1'`);
  expect(settled.rows).toEqual([{ state: "deployed" }]);
  const placed = await observer.db.execute(sql`SELECT host_node_id FROM vps_instances WHERE id = 'qp-i-pending'`);
  expect((placed.rows[0] as { host_node_id: string | null }).host_node_id).not.toBeNull();

  // The placer's other calls: a hold, a reserve that consumes it, a dry run, a release.
  const vpsCtx = compute.moduleContext("vps", {}, captured);
  const request = {
    owner: "qp-owner",
    candidates: { labels: { qp: "host" } },
    runtime: "qemu-microvm",
    vcpus: 2,
    memoryMiB: 1024,
    diskGiB: 10,
  };
  await during("capacity", () =>
    captured.transaction(async (tx) => {
      const held = await vpsCtx.capacity.hold(tx, { ...request, owner: "qp-hold", ttlSeconds: 60 });
      if (!("placed" in held)) throw new Error(`hold not placed: ${JSON.stringify(held)}`);
      await vpsCtx.capacity.reserve(tx, { ...request, holdId: held.placed.reservationId });
      await vpsCtx.capacity.explain(tx, request);
      await vpsCtx.capacity.release(tx, "qp-owner");
    }),
  );

  // Every statement, EXPLAINed with its own parameters (bound, as the driver binds them).
  const failures: string[] = [];
  let explained = 0;
  for (const q of queries.values()) {
    if (q.phase === "setup" || q.phase === "after" || TRANSACTION_CONTROL.test(q.text)) continue;
    const result = await explainer.query(`EXPLAIN (FORMAT JSON) ${q.text}`, q.values).catch((err) => {
      throw new Error(`EXPLAIN failed (${err.message}) for ${q.phase}: ${q.text} ${JSON.stringify(q.values)}`);
    });
    const plan = (result.rows[0] as { "QUERY PLAN": [{ Plan: PlanNode }] })["QUERY PLAN"][0].Plan;
    explained++;
    const allowed = WHOLE_BY_DESIGN.filter((w) => w.matches(q)).flatMap((w) => w.tables);
    const scanned = scannedWhole(plan).filter((t) => !allowed.includes(t));
    if (scanned.length > 0)
      failures.push(`${q.phase}: a sequential scan on ${[...new Set(scanned)].join(", ")} in\n${q.text.trim()}\n${outline(plan)}`);
  }
  console.log(`query plans: ${explained} statements explained`);
  expect(explained).toBeGreaterThan(40);
  expect(failures, failures.join("\n\n")).toEqual([]);
}, 300_000);
