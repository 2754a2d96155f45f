// A third-party step and profile (test/extensions/acme-provision/plugin.ts, public entry
// points only) validated and run by the provision engine in its WorkflowDO, with a FakeDaemon
// as the node's agent.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute } from "better-compute";
import { provisionModule } from "better-compute/provision";
import { createTestClient, FakeDaemon, type TestClient } from "better-compute/testing";
import { acmeProvision } from "./acme-provision/plugin.ts";

// The same registrations as the deployment whose WorkflowDO runs the workflows.
const compute = betterCompute({ modules: [provisionModule()], plugins: [acmeProvision] });
let client: TestClient;
let daemon: FakeDaemon;
const configured: unknown[] = [];

beforeAll(async () => {
  client = await createTestClient(compute, env);
  daemon = new FakeDaemon({
    baseUrl: "http://bc.test",
    fetch: (url: string, init?: RequestInit) => compute.fetch(new Request(url, init), env),
    role: "node",
    handlers: { "acme.nic.configure": (body) => (configured.push(body), { configured: body.ip }) },
  });
  await daemon.join((await client.call("joinTokens.create", { role: "node" })).body.token);
  await daemon.connect();
});
afterAll(async () => {
  await daemon?.stop();
  await client?.close();
});

async function finished(id: string) {
  let wf: any;
  await expect
    .poll(async () => (wf = (await client.call("workflows.get", { id })).body).state, { timeout: 25_000, interval: 200 })
    .not.toBe("running");
  return wf;
}

const start = async (profile: string, input: object = {}, target = daemon.nodeId!) =>
  client.call("workflows.start", { profile, target, input });

describe("a third-party profile", () => {
  it("validates: the engine resolves the plugin's steps", async () => {
    const res = await client.call("profiles.validate", { id: "acme.bringUp" });
    expect(res.body).toEqual({ profile: "acme.bringUp", version: "1", valid: true, issues: [] });
  });

  it("reports every kind of issue of a broken profile", async () => {
    const res = await client.call("profiles.validate", { id: "acme.broken" });
    expect(res.body.valid).toBe(false);
    expect(res.body.issues.map((i: any) => [i.step, i.code])).toEqual([
      ["acme.missing", "UNKNOWN_STEP"],
      ["acme.sneaky", "UNDECLARED_COMMAND"],
      ["acme.toaster", "UNKNOWN_ROLE"],
      ["acme.toaster", "UNDECLARED_COMMAND"],
      ["acme.toaster", "UNKNOWN_COMMAND_KIND"],
      ["acme.configureNic", "BAD_FROM_STEP"],
    ]);
    expect((await start("acme.broken")).body.code).toBe("FAILED_PRECONDITION");
  });

  it("runs to success: a control-plane step, an agent step fed from it, and a wait", async () => {
    await client.store.db.execute(sql`INSERT INTO acme_ready (target) VALUES (${daemon.nodeId!}) ON CONFLICT DO NOTHING`);
    const started = await start("acme.bringUp", { pool: "lab" });
    expect(started.status).toBe(200);
    const wf = await finished(started.body.id);
    expect(wf).toMatchObject({ state: "succeeded", position: 3, error: null });
    expect(wf.steps.map((s: any) => [s.name, s.attempts.map((a: any) => a.state)])).toEqual([
      ["acme.reserveIp", ["succeeded"]],
      ["acme.configureNic", ["succeeded"]],
      ["acme.waitReady", ["succeeded"]],
    ]);
    const ip = wf.steps[0].attempts[0].output.ip;
    expect(wf.steps[1].attempts[0].output).toEqual({ configured: ip });
    expect(configured).toContainEqual({ ip, mtu: 9000 });
    const events = await client.store.db.execute(sql`SELECT type FROM bc_events WHERE subject = ${`workflows/${wf.id}`} ORDER BY id`);
    expect((events.rows as { type: string }[]).map((e) => e.type)).toEqual([
      "workflow.started",
      "workflow.step.started",
      "workflow.step.succeeded",
      "workflow.step.started",
      "workflow.step.sent",
      "workflow.step.succeeded",
      "workflow.step.started",
      "workflow.step.succeeded",
      "workflow.succeeded",
    ]);
  });
});

describe("failures", () => {
  it("fails a step that stays not ready past its deadline, with a clear error", async () => {
    const wf = await finished((await start("acme.neverReady", {}, "nowhere-ready")).body.id);
    expect(wf.state).toBe("failed");
    expect(wf.error).toMatchObject({ code: "DEADLINE_EXCEEDED", step: "acme.waitReady" });
    expect(wf.steps[0].attempts[0].polls).toBeGreaterThanOrEqual(2);
  });

  it("fails a workflow that outlives its own deadline", async () => {
    const started = await client.call("workflows.start", { profile: "acme.neverReady", target: "slow-target", deadlineSeconds: 1 });
    const wf = await finished(started.body.id);
    expect(wf.state).toBe("failed");
    expect(wf.error).toEqual({ code: "DEADLINE_EXCEEDED", message: "the workflow did not finish before its deadline" });
  });

  it("retries a throwing step with backoff, and succeeds when it recovers", async () => {
    const wf = await finished((await start("acme.flaky")).body.id);
    expect(wf.state).toBe("succeeded");
    const attempts = wf.steps[0].attempts;
    expect(attempts.map((a: any) => a.state)).toEqual(["failed", "failed", "succeeded"]);
    expect(attempts[0].error.message).toContain("attempt 1");
    // Backoff: 1 s, then 2 s, between the attempts.
    const gap = (a: any, b: any) => Date.parse(b.startedAt) - Date.parse(a.finishedAt);
    expect(gap(attempts[0], attempts[1])).toBeGreaterThanOrEqual(900);
    expect(gap(attempts[1], attempts[2])).toBeGreaterThanOrEqual(1900);
  });

  it("fails after the last attempt with its last error recorded", async () => {
    const wf = await finished((await start("acme.doomed")).body.id);
    expect(wf.state).toBe("failed");
    expect(wf.error).toMatchObject({ code: "INTERNAL", message: expect.stringContaining("attempt 2"), step: "acme.doomed", attempt: 2 });
    expect(wf.steps[0].attempts.map((a: any) => a.state)).toEqual(["failed", "failed"]);
  });

  it("cancels a running workflow: it stops polling and stays cancelled", async () => {
    const started = await start("acme.neverReady", {}, "cancel-me");
    await expect
      .poll(async () => (await client.call("workflows.get", { id: started.body.id })).body.steps[0]?.attempts[0]?.polls ?? 0, {
        timeout: 5_000,
      })
      .toBeGreaterThanOrEqual(1);
    expect((await client.call("workflows.cancel", { id: started.body.id })).body).toEqual({ id: started.body.id, state: "cancelled" });
    const polls = (await client.call("workflows.get", { id: started.body.id })).body.steps[0].attempts[0].polls;
    await new Promise((r) => setTimeout(r, 2_500));
    const after = (await client.call("workflows.get", { id: started.body.id })).body;
    expect(after.state).toBe("cancelled");
    expect(after.steps[0].attempts[0].polls).toBe(polls);
    expect((await client.call("workflows.cancel", { id: "wf-nope" })).status).toBe(404);
  });

  it("a step waiting for an agent is woken by the agent's hello, not by its hourly poll", async () => {
    const id = (await start("acme.awaitRack", { rack: "r42" })).body.id;
    // Not ready first: no agent of rack r42 exists yet, and the next poll is an hour away.
    await expect
      .poll(async () => (await client.call("workflows.get", { id })).body.steps[0]?.attempts[0]?.state, { timeout: 10_000, interval: 100 })
      .toBe("not_ready");
    const racked = new FakeDaemon({
      baseUrl: "http://bc.test",
      fetch: (url: string, init?: RequestInit) => compute.fetch(new Request(url, init), env),
      role: "node",
      labels: { "acme/rack": "r42" },
    });
    try {
      await racked.join((await client.call("joinTokens.create", { role: "node" })).body.token);
      await racked.connect();
      const wf = await finished(id);
      expect(wf.state).toBe("succeeded");
      expect(wf.steps[0].attempts.at(-1).output).toEqual({ agent: racked.nodeId });
      // The wait is gone with the step.
      expect((await client.store.db.execute(sql`SELECT count(*)::int AS n FROM bc_agent_waits WHERE workflow_id = ${id}`)).rows).toEqual([
        { n: 0 },
      ]);
    } finally {
      await racked.stop();
    }
  });

  it("refuses an input that breaks a step's schema at start, before anything is written or sent", async () => {
    const before = await client.store.db.execute(sql`SELECT count(*)::int AS n FROM workflows`);
    const res = await start("acme.bringUp", { pool: "LAB!" });
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: "INVALID_ARGUMENT", details: { steps: [{ step: "acme.reserveIp" }] } });
    expect((await client.store.db.execute(sql`SELECT count(*)::int AS n FROM workflows`)).rows).toEqual(before.rows);
  });

  it("fails a step whose input, from an earlier step, breaks its schema, and sends nothing", async () => {
    const wf = await finished((await start("acme.bringUp", { pool: "bogus" })).body.id);
    expect(wf.state).toBe("failed");
    expect(wf.error).toMatchObject({ code: "INVALID_ARGUMENT", step: "acme.configureNic" });
    const commands = await client.store.db.execute(
      sql`SELECT count(*)::int AS n FROM bc_commands WHERE idempotency_key LIKE ${`wf:${wf.id}:%`}`,
    );
    expect(commands.rows).toEqual([{ n: 0 }]);
  });
});
