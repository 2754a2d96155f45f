// The join Worker (workers/join) on its own: JoinService from the deployment's config, joined and
// renewed through its fetch handler alone, while the API and the agent gateway stay with the
// API Worker. The token comes from the API, the node it creates is read back through the API.
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { CONNECT_PATH, generateNodeKey, JOIN_PATH, joinMessage, RENEW_PATH, renewMessage, signMessage } from "../core/protocol.ts";
import joinWorker from "../workers/join/index.ts";

let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

/** A request to the join Worker alone, as Cloudflare would hand it one. */
async function join(path: string, init?: RequestInit): Promise<Response> {
  const ctx = createExecutionContext();
  const request = new Request(new URL(path, "https://join.example.test"), init) as Request<unknown, IncomingRequestCfProperties>;
  const res = await joinWorker.fetch(request, env, ctx);
  await waitOnExecutionContext(ctx);
  return res;
}
const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
  join(path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });

describe("the join Worker", () => {
  it("joins a site agent with a token minted on the API, and renews its credential", async () => {
    const token = (await client.call("siteTokens.create", { site: "lab" })).body.token as string;
    const key = await generateNodeKey();
    const joined = await post(JOIN_PATH, {
      attestor: "join-token",
      evidence: { token },
      publicKey: key.publicKey,
      role: "site",
      signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, "join-token", { token })),
    });
    expect(joined.status).toBe(200);
    const identity = (await joined.json()) as { nodeId: string; role: string; credential: string };
    expect(identity).toMatchObject({ nodeId: expect.stringMatching(/^n-/), role: "site", credential: expect.any(String) });
    // Written to the one record the API reads.
    expect((await client.call("nodes.get", { node: identity.nodeId })).body).toMatchObject({ role: "site", attestor: "join-token" });

    const timestamp = new Date().toISOString();
    const renewed = await post(
      RENEW_PATH,
      { timestamp, signature: await signMessage(key.privateKey, renewMessage(identity.nodeId, timestamp)) },
      { authorization: `Bearer ${identity.credential}` },
    );
    expect(renewed.status).toBe(200);
    expect(await renewed.json()).toMatchObject({ nodeId: identity.nodeId, credential: expect.any(String) });
  });

  it("answers /v1/health, and refuses a join with an unknown key as the API would, with its request id", async () => {
    const health = await join("/v1/health");
    expect(health.status).toBe(200);
    expect(await health.json()).toMatchObject({ status: "ok", database: "reachable" });

    const key = await generateNodeKey();
    const signature = await signMessage(key.privateKey, await joinMessage(key.publicKey, "join-token", { token: "bcj_unused" }));
    const refused = await post(JOIN_PATH, {
      attestor: "join-token",
      evidence: { token: "bcj_unused" },
      publicKey: key.publicKey,
      role: "site",
      signature,
      labels: { rack: "7" },
    });
    expect(refused.status).toBe(400);
    const body = (await refused.json()) as { code: string; requestId: string; details: { issues: { path: string }[] } };
    expect(body).toMatchObject({ code: "INVALID_ARGUMENT", requestId: refused.headers.get("x-request-id") });
    expect(body.details.issues.map((i) => i.path)).toEqual(["labels"]);
  });

  it("serves neither the API, nor the OpenAPI document, nor the agent gateway", async () => {
    for (const res of [
      await post("/v1/modules.list", {}, { authorization: `Bearer ${client.key}` }),
      await join("/openapi.json"),
      await join(CONNECT_PATH, { headers: { upgrade: "websocket" } }),
    ]) {
      expect(res.status).toBe(404);
      expect(((await res.json()) as { code: string }).code).toBe("NOT_FOUND");
    }
  });
});
