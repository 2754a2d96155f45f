// ctx.blobs on the Worker: the R2 bucket wrangler.toml binds as BLOBS (miniflare's R2 here), and
// the agent route that answers a blob by its sha256 to a site agent's credential.
import { env } from "cloudflare:workers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { BLOBS_PATH, generateNodeKey, JOIN_PATH, joinMessage, signMessage } from "../core/protocol.ts";
import { r2Blobs } from "../core/store/blobs.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";

let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

const digest = async (bytes: Uint8Array) =>
  Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)), (b) => b.toString(16).padStart(2, "0")).join("");

describe("blobs in R2", () => {
  it("are kept under their sha256 once, and read back whole", async () => {
    const blobs = r2Blobs(env.BLOBS);
    const bytes = new Uint8Array(200_000).map((_, i) => (i * 7919) % 251);
    const stored = await blobs.put(bytes);
    expect(stored).toEqual({ sha256: await digest(bytes), bytes: bytes.length });
    expect(await blobs.put(bytes)).toEqual(stored);
    expect((await env.BLOBS.head(`blobs/${stored.sha256}`))?.size).toBe(bytes.length);
    const got = await blobs.get(stored.sha256);
    expect(new Uint8Array(await new Response(got!.body).arrayBuffer())).toEqual(bytes);
    expect(await blobs.get("0".repeat(64))).toBeUndefined();
    expect(await blobs.get("../../etc")).toBeUndefined();
  });

  it("a module's ctx.blobs is that bucket, and a site agent gets a blob through the Worker with its credential", async () => {
    const bytes = new TextEncoder().encode("an ISO rendered for one machine ".repeat(500));
    const { sha256 } = await compute.moduleContext("metal", env, client.store).blobs.put(bytes);

    const token = (await client.call("siteTokens.create", { site: "blobs" })).body.token as string;
    const key = await generateNodeKey();
    const joined = await client.request(JOIN_PATH, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        attestor: "join-token",
        evidence: { token },
        publicKey: key.publicKey,
        role: "site",
        signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, "join-token", { token })),
      }),
    });
    const { credential } = (await joined.json()) as { credential: string };
    const res = await client.request(`${BLOBS_PATH}/${sha256}`, { headers: { authorization: `Bearer ${credential}` } });
    expect(res.status).toBe(200);
    expect(await digest(new Uint8Array(await res.arrayBuffer()))).toBe(sha256);
    expect((await client.request(`${BLOBS_PATH}/${sha256}`)).status).toBe(401);
  });
});
