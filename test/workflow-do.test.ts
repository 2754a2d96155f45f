// The WorkflowDO takes its workflow id from its name (ctx.id.name). An object created before it
// did kept the id in an `identity` table of its SQLite; it must keep advancing its workflow when
// the runtime gives no name (an alarm scheduled by an older runtime). An object built by
// newUniqueId() has no name, so it stands in for one.
import { env } from "cloudflare:workers";
import { runInDurableObject } from "cloudflare:test";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { testCompute } from "./support/worker.ts";

let client: TestClient;

beforeAll(async () => {
  // No WORKFLOW binding: workflows.start wakes no object, the workflow waits for the test's.
  const { WORKFLOW: _, ...withoutWorkflows } = env;
  client = await createTestClient(testCompute, withoutWorkflows);
});
afterAll(() => client?.close());

it("advances, through wake-ups and its alarm, the workflow an unnamed object remembers in its legacy identity table", async () => {
  const started = await client.call("workflows.start", { profile: "acme.doomed", target: "n-legacy" });
  expect(started.status).toBe(200);
  const id: string = started.body.id;
  expect((await client.call("workflows.get", { id })).body.state).toBe("running");

  const stub = env.WORKFLOW.get(env.WORKFLOW.newUniqueId());
  await runInDurableObject(stub, (_instance, state) => {
    expect(state.id.name).toBeUndefined();
    state.storage.sql.exec("CREATE TABLE identity (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    state.storage.sql.exec("INSERT INTO identity (key, value) VALUES ('workflow', ?)", id);
  });
  await stub.wake();
  // acme.doomed fails twice, the second attempt after a backoff the object waits out on its alarm.
  await expect.poll(async () => (await client.call("workflows.get", { id })).body.state, { timeout: 20_000, interval: 200 }).toBe("failed");
  const wf = (await client.call("workflows.get", { id })).body;
  expect(wf.steps[0].attempts.map((a: { state: string }) => a.state)).toEqual(["failed", "failed"]);
});
