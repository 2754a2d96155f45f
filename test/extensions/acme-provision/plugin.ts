// @acme/bc-provision: a third-party plugin of steps and profiles, written as an outside
// package would (public entry points only). test/support/worker.ts registers it in the test
// deployment, the way a deployment's config would.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { definePlugin } from "better-compute";
import { defineProfile, defineStep, StepError, stepNotReady } from "better-compute/provision";

/** Control plane: hands out an address, the same one however often it runs for a workflow. */
const reserveIp = defineStep({
  id: "acme.reserveIp",
  runsOn: "control-plane",
  input: z.object({ pool: z.string().regex(/^[a-z]+$/) }),
  run: async (ctx, input) => {
    const found = await ctx.store.db.execute(sql`
      INSERT INTO acme_leases (workflow_id, pool) VALUES (${ctx.workflow.id}, ${input.pool})
      ON CONFLICT (workflow_id) DO UPDATE SET pool = excluded.pool RETURNING n`);
    // The "bogus" pool hands out an address the next step's schema refuses.
    return { ip: input.pool === "bogus" ? "nowhere" : `10.0.0.${(found.rows[0] as { n: number }).n % 250}` };
  },
});

/** On the node's agent: one command, its input from reserveIp's output. */
const configureNic = defineStep({
  id: "acme.configureNic",
  runsOn: "node",
  sends: ["acme.nic.configure"],
  input: z.object({ ip: z.string().regex(/^10\.0\.0\.\d+$/) }),
  command: { kind: "acme.nic.configure", body: (input) => ({ ip: input.ip, mtu: 9000 }) },
});

/** Waits on the world: not ready until the operator marks the target ready. */
const waitReady = defineStep({
  id: "acme.waitReady",
  runsOn: "control-plane",
  pollSeconds: 1,
  deadlineSeconds: 3,
  input: z.object({}),
  run: async (ctx) => {
    const found = await ctx.store.db.execute(sql`SELECT 1 FROM acme_ready WHERE target = ${ctx.workflow.target}`);
    if (found.rows.length === 0) stepNotReady(`${ctx.workflow.target} is not ready`);
    return { ready: true };
  },
});

/** Fails twice, then works. */
const flaky = defineStep({
  id: "acme.flaky",
  runsOn: "control-plane",
  retry: { attempts: 3, backoffSeconds: 1 },
  input: z.object({}),
  run: async (ctx) => {
    if (ctx.step.attempt < 3) throw new StepError("DRIVER_ERROR", `the widget API answered 503 (attempt ${ctx.step.attempt})`);
    return { attempts: ctx.step.attempt };
  },
});

/** Always fails; its last error is what the workflow reports. */
const doomed = defineStep({
  id: "acme.doomed",
  runsOn: "control-plane",
  retry: { attempts: 2, backoffSeconds: 1 },
  input: z.object({}),
  run: async (ctx) => {
    throw new Error(`the paint shop is on fire (attempt ${ctx.step.attempt})`);
  },
});

/**
 * Waits for a node agent in a rack (its own label acme/rack) to connect. Polled once an hour:
 * only the agent's hello, through ctx.nodes.wakeWhenConnected, finishes it in a test's time.
 */
const awaitRackAgent = defineStep({
  id: "acme.awaitRackAgent",
  runsOn: "control-plane",
  input: z.object({ rack: z.string().regex(/^[a-z0-9-]+$/) }),
  pollSeconds: 3600,
  deadlineSeconds: 7200,
  run: async (ctx, input) => {
    // Registered before looking, so an agent connecting in between still wakes the workflow.
    await ctx.store.transaction((tx) =>
      ctx.nodes.wakeWhenConnected(tx, { workflowId: ctx.workflow.id, role: "node", labels: { "acme/rack": input.rack } }),
    );
    const found = await ctx.store.db.execute(sql`
      SELECT id FROM bc_nodes WHERE role = 'node' AND state = 'connected' AND revoked_at IS NULL AND labels->>'acme/rack' = ${input.rack} LIMIT 1`);
    const agent = (found.rows[0] as { id: string } | undefined)?.id;
    if (!agent) stepNotReady(`no agent in rack ${input.rack} has connected`);
    return { agent };
  },
});

/** Sends a kind it does not declare. */
const sneaky = defineStep({
  id: "acme.sneaky",
  runsOn: "node",
  input: z.object({}),
  command: { kind: "acme.nic.configure" },
});

/** Runs on a role no agent has. */
const toaster = defineStep({ id: "acme.toaster", runsOn: "toaster" as never, input: z.object({}), command: { kind: "acme.toast" } });

export const acmeProvision = definePlugin({
  id: "acme-provision",
  migrations: [
    {
      name: "acme-provision/0001_leases",
      sql: `CREATE TABLE IF NOT EXISTS acme_leases (workflow_id text PRIMARY KEY, pool text NOT NULL, n serial);
            CREATE TABLE IF NOT EXISTS acme_ready (target text PRIMARY KEY);`,
    },
  ],
  commands: [{ kind: "acme.nic.configure", input: z.object({ ip: z.string(), mtu: z.number() }), roles: ["node"] }],
  extensions: [reserveIp, configureNic, waitReady, flaky, doomed, sneaky, toaster, awaitRackAgent],
  profiles: [
    defineProfile({
      id: "acme.bringUp",
      version: 1,
      target: "node",
      steps: [{ step: "acme.reserveIp" }, { step: "acme.configureNic", fromStep: "acme.reserveIp" }, { step: "acme.waitReady" }],
    }),
    defineProfile({ id: "acme.flaky", target: "node", steps: [{ step: "acme.flaky" }] }),
    defineProfile({ id: "acme.doomed", target: "node", steps: [{ step: "acme.doomed" }] }),
    defineProfile({ id: "acme.neverReady", target: "node", steps: [{ step: "acme.waitReady" }] }),
    defineProfile({ id: "acme.awaitRack", target: "node", steps: [{ step: "acme.awaitRackAgent" }] }),
    defineProfile({
      id: "acme.broken",
      target: "node",
      steps: [
        { step: "acme.missing" },
        { step: "acme.sneaky" },
        { step: "acme.toaster" },
        { step: "acme.configureNic", fromStep: "acme.later" },
        { step: "acme.reserveIp", name: "acme.later", input: { pool: "lab" } },
      ],
    }),
  ],
});
