// The BlobStore port (ctx.blobs) and how a site agent gets a blob: a module keeps rendered bytes
// under their sha256; GET /agent/v1/blobs/<sha256> answers them to a site agent's credential, and
// nothing else; metal.images.cache { blob } mirrors one into the site's image cache, checking its
// sha256 again. The control plane runs in this process (the simulated site's: real Postgres on
// PGlite, the real compute and agents, an in-memory BlobStore standing in for the R2 bucket).
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { memoryBlobs } from "../../core/store/blobs.ts";
import { BLOBS_PATH } from "../../core/protocol.ts";
import { createMetalSim, type MetalSim } from "../../testing/metal-sim.ts";
import { refusal } from "../support/refusal.ts";

let sim: MetalSim;
const sha256 = (bytes: Uint8Array | string) => createHash("sha256").update(bytes).digest("hex");

beforeAll(async () => {
  sim = await createMetalSim({ machines: 0 });
}, 60_000);
afterAll(() => sim?.stop());

const blobs = () => sim.control.compute!.moduleContext("metal", {}, sim.store).blobs;
const get = (path: string, credential?: string) =>
  sim.control.transport.fetch(`${sim.control.baseUrl}${path}`, credential ? { headers: { authorization: `Bearer ${credential}` } } : {});

/** A credential of a node of this role, joined with a token minted for it. */
async function credentialOf(role: "site" | "node"): Promise<string> {
  const { token } =
    role === "site"
      ? await sim.call<{ token: string }>("siteTokens.create", { site: sim.site.id })
      : await sim.call<{ token: string }>("joinTokens.create", { role: "node" });
  const { MemoryState } = await import("../../agent/state.ts");
  const { AgentClient } = await import("../../agent/client.ts");
  const agent = new AgentClient({ transport: sim.control.transport, state: new MemoryState(), baseUrl: sim.control.baseUrl });
  const identity = await agent.join({ attestor: "join-token", evidence: { token }, role, hostname: `blobs-${role}` });
  return identity.credential;
}

/** Sends a command to the site agent through the API and waits for its outcome. */
async function onSiteAgent(kind: string, body: Record<string, unknown>): Promise<{ state: string; result: any; error: any }> {
  const { id } = await sim.call<{ id: string }>("commands.create", { node: sim.site.agentNodeId!, kind, body });
  for (;;) {
    const command = await sim.call<{ state: string; result: unknown; error: unknown }>("commands.get", { id });
    if (command.state === "succeeded" || command.state === "failed") return command as never;
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("blobs", () => {
  it("are kept under their sha256, once, and answered by it", async () => {
    const store = memoryBlobs();
    const bytes = new TextEncoder().encode("an ISO, rendered for one machine");
    const first = await store.put(bytes);
    expect(first).toEqual({ sha256: sha256(bytes), bytes: bytes.length });
    expect(await store.put(bytes)).toEqual(first);
    const got = await store.get(first.sha256);
    expect(got?.bytes).toBe(bytes.length);
    expect(new Uint8Array(await new Response(got!.body).arrayBuffer())).toEqual(bytes);
    expect(await store.get("0".repeat(64))).toBeUndefined();
  });

  it("GET /agent/v1/blobs/<sha256> answers a site agent, and no one else", async () => {
    const bytes = new TextEncoder().encode("config drive bytes ".repeat(100));
    const { sha256: digest } = await blobs().put(bytes);
    const site = await credentialOf("site");
    const ok = await get(`${BLOBS_PATH}/${digest}`, site);
    expect(ok.status).toBe(200);
    expect(ok.headers.get("content-length")).toBe(String(bytes.length));
    expect(sha256(new Uint8Array(await ok.arrayBuffer()))).toBe(digest);

    expect((await get(`${BLOBS_PATH}/${digest}`)).status).toBe(401);
    expect((await get(`${BLOBS_PATH}/${digest}`, "not-a-credential")).status).toBe(401);
    const node = await get(`${BLOBS_PATH}/${digest}`, await credentialOf("node"));
    expect(node.status).toBe(403);
    expect(((await node.json()) as { code: string }).code).toBe("PERMISSION_DENIED");
    expect((await get(`${BLOBS_PATH}/${"0".repeat(64)}`, site)).status).toBe(404);
    expect((await get(`${BLOBS_PATH}/not-a-digest`, site)).status).toBe(400);
  });

  it("metal.images.cache { blob } mirrors one into the site's cache, served on the provisioning network by its sha256", async () => {
    const bytes = new TextEncoder().encode("an installer ISO ".repeat(1000));
    const { sha256: digest } = await blobs().put(bytes);
    const cached = await onSiteAgent("metal.images.cache", { blob: digest });
    expect(cached.state, JSON.stringify(cached.error)).toBe("succeeded");
    expect(cached.result).toMatchObject({
      sha256: digest,
      bytes: bytes.length,
      url: expect.stringMatching(new RegExp(`/images/${digest}$`)),
    });
    const served = await fetch(cached.result.url);
    expect(sha256(new Uint8Array(await served.arrayBuffer()))).toBe(digest);

    const missing = await onSiteAgent("metal.images.cache", { blob: "f".repeat(64) });
    expect(missing.state).toBe("failed");
    expect(missing.error).toMatchObject({ code: "DRIVER_ERROR", message: expect.stringContaining("404") });
    // Both, or a blob named otherwise than by its sha256: refused before anything is sent.
    for (const body of [{ blob: digest, url: "http://127.0.0.1:1/x" }, { blob: digest.toUpperCase() }])
      expect((await refusal(sim.call("commands.create", { node: sim.site.agentNodeId!, kind: "metal.images.cache", body }))).code).toBe(
        "INVALID_ARGUMENT",
      );
  });
});
