// The platform's everyday methods an operator reaches for, through the real API in workerd against
// Postgres: joinTokens.list/revoke (never a secret; a revoked token cannot join), drivers.list,
// events.list (filtered by subject and type, paged both ways), and one parameter name, node, for
// the methods that take a node.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { joinRaw } from "./support/raw-agent.ts";

let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

/** A successful call's body (fails the test with the API's answer otherwise). */
async function ok<T = any>(name: string, input: unknown): Promise<T> {
  const res = await client.call<T>(name, input);
  expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
}

async function refused(name: string, input: unknown, code: string) {
  const res = await client.call(name, input);
  expect(res.body.code, `${name}: ${JSON.stringify(res.body)}`).toBe(code);
  return res.body as { code: string; message: string; details?: Record<string, any> };
}

describe("joinTokens.list and joinTokens.revoke", () => {
  it("lists tokens newest first with their state, paged, and never the token or its digest", async () => {
    // Ramdisk join tokens: no other suite mints them, so the newest are these.
    const minted = [];
    for (const n of [1, 2, 3])
      minted.push(await ok<{ id: string; token: string }>("joinTokens.create", { role: "ramdisk", labels: { batch: `list-${n}` } }));
    const [oldest, middle, newest] = minted.map((m) => m.id);

    const first = await ok<{ tokens: Record<string, any>[]; next: string | null }>("joinTokens.list", {
      role: "ramdisk",
      state: "active",
      limit: 2,
    });
    expect(first.tokens.map((t) => t.id)).toEqual([newest, middle]);
    expect(first.tokens[0]).toMatchObject({
      attestor: "join-token",
      role: "ramdisk",
      labels: { batch: "list-3" },
      node: null,
      state: "active",
      usedAt: null,
      usedBy: null,
      revokedAt: null,
    });
    expect(first.next).toBe(middle);
    const second = await ok<{ tokens: { id: string }[] }>("joinTokens.list", {
      role: "ramdisk",
      state: "active",
      limit: 2,
      after: first.next,
    });
    expect(second.tokens[0]!.id).toBe(oldest);

    const digests = await client.store.db.execute(
      sql`SELECT secret_sha256 FROM bc_join_tokens WHERE id IN (${oldest}, ${middle}, ${newest})`,
    );
    const shown = JSON.stringify([first, second]);
    // The secret is what follows bcj_<id>_ (it may itself hold underscores).
    for (const m of minted) expect(shown).not.toContain(m.token.slice(`bcj_${m.id}_`.length));
    for (const row of digests.rows as { secret_sha256: string }[]) expect(shown).not.toContain(row.secret_sha256);
    await refused("joinTokens.list", { after: "0000000000000000" }, "NOT_FOUND");
  });

  it("a revoked token can no longer join; revoking twice is not an error and records one event", async () => {
    const { token, id } = await ok<{ id: string; token: string }>("siteTokens.create", { site: "revoked-site" });
    const revoked = await ok("joinTokens.revoke", { id });
    expect(revoked).toMatchObject({ id, state: "revoked", usedAt: null, revokedAt: expect.any(String) });
    expect(await ok("joinTokens.revoke", { id })).toMatchObject({ id, state: "revoked", revokedAt: revoked.revokedAt });
    const joined = await joinRaw(compute, env, token);
    expect(joined.res.status).toBe(403);
    expect(joined.body.code).toBe("PERMISSION_DENIED");
    const { events } = await ok<{ events: { type: string }[] }>("events.list", { subject: `joinTokens/${id}` });
    expect(events.map((e) => e.type)).toEqual(["joinToken.created", "joinToken.revoked"]);
    expect((await ok<{ tokens: { id: string }[] }>("joinTokens.list", { state: "revoked", limit: 500 })).tokens.map((t) => t.id)).toContain(
      id,
    );
  });

  it("a used token is not revoked: the refusal names the node that joined with it; an unknown one is NOT_FOUND", async () => {
    const { token, id } = await ok<{ id: string; token: string }>("siteTokens.create", { site: "used-site" });
    const joined = await joinRaw(compute, env, token);
    expect(joined.res.status).toBe(200);
    const err = await refused("joinTokens.revoke", { id }, "FAILED_PRECONDITION");
    expect(err.details).toEqual({ token: id, node: joined.body.nodeId });
    expect(err.message).toContain("nodes.revoke");
    const listed = (
      await ok<{ tokens: Record<string, any>[] }>("joinTokens.list", { role: "site", state: "used", limit: 500 })
    ).tokens.find((t) => t.id === id);
    expect(listed).toMatchObject({
      state: "used",
      usedBy: joined.body.nodeId,
      usedAt: expect.any(String),
      labels: { "bc.dev/site": "used-site" },
    });
    await refused("joinTokens.revoke", { id: "0000000000000000" }, "NOT_FOUND");
  });
});

describe("drivers.list", () => {
  it("lists the registered drivers with their kinds, where they run, secret fields and the manifest's JSON schema", async () => {
    const { drivers } = await ok<{ drivers: Record<string, any>[] }>("drivers.list", {});
    const redfish = drivers.find((d) => d.id === "redfish")!;
    expect(redfish).toMatchObject({ version: "1", kinds: ["power", "management", "media"], runsOn: "site", secretFields: ["password"] });
    expect(redfish.manifest.type).toBe("object");
    expect(redfish.manifest.required).toEqual(expect.arrayContaining(["driver", "address", "username", "password"]));
    expect(drivers.find((d) => d.id === "ipxe")).toMatchObject({ kinds: ["boot"], runsOn: "site", secretFields: [], manifest: null });
  });
});

describe("events.list", () => {
  it("filters by subject and by type or type prefix, oldest first, paged; order desc pages newest first", async () => {
    await ok("metal.sites.create", { id: "events-site" });
    await ok("metal.sites.update", { id: "events-site", description: "one" });
    await ok("metal.sites.update", { id: "events-site", description: "two" });
    const subject = "metal/sites/events-site";

    const all = await ok<{ events: Record<string, any>[]; next: string | null }>("events.list", { subject });
    expect(all.events.map((e) => e.type)).toEqual(["metal.site.created", "metal.site.updated", "metal.site.updated"]);
    expect(all.events[0]).toMatchObject({
      module: "metal",
      subject,
      actor: expect.any(String),
      requestId: expect.any(String),
      occurredAt: expect.any(String),
    });
    expect(all.next).toBeNull();

    const page1 = await ok<{ events: { id: string }[]; next: string | null }>("events.list", { subject, limit: 2 });
    expect(page1.events.map((e) => e.id)).toEqual(all.events.slice(0, 2).map((e) => e.id));
    const page2 = await ok<{ events: { id: string }[]; next: string | null }>("events.list", { subject, limit: 2, after: page1.next });
    expect(page2.events.map((e) => e.id)).toEqual([all.events[2]!.id]);
    expect(page2.next).toBeNull();

    const newest = await ok<{ events: { id: string }[]; next: string | null }>("events.list", { subject, order: "desc", limit: 2 });
    expect(newest.events.map((e) => e.id)).toEqual([all.events[2]!.id, all.events[1]!.id]);
    const older = await ok<{ events: { id: string }[] }>("events.list", { subject, order: "desc", limit: 2, after: newest.next });
    expect(older.events.map((e) => e.id)).toEqual([all.events[0]!.id]);

    expect((await ok<{ events: { type: string }[] }>("events.list", { subject, type: "metal.site.updated" })).events).toHaveLength(2);
    expect((await ok<{ events: { type: string }[] }>("events.list", { subject, type: "metal.site.*" })).events).toHaveLength(3);
    expect((await ok<{ events: unknown[] }>("events.list", { subject, type: "metal.pool.*" })).events).toEqual([]);
    const byPrefix = await ok<{ events: { type: string }[] }>("events.list", { type: "metal.*", order: "desc", limit: 50 });
    expect(byPrefix.events.length).toBeGreaterThan(0);
    expect(byPrefix.events.every((e) => e.type.startsWith("metal."))).toBe(true);
  });

  it("refuses a malformed type, cursor or limit", async () => {
    for (const input of [
      { type: "metal.*.node" },
      { type: "metal.node%" },
      { after: "12abc" },
      { limit: 501 },
      { limit: 0 },
      { subject: "a\u0000b" },
    ]) {
      await refused("events.list", input, "INVALID_ARGUMENT");
    }
  });
});

describe("one parameter name for a node", () => {
  it("nodes.get, nodes.revoke, commands.create and commands.list take node; the old names and bad ids are INVALID_ARGUMENT", async () => {
    const { token } = await ok<{ token: string }>("siteTokens.create", { site: "param-site" });
    const joined = await joinRaw(compute, env, token);
    const node = joined.body.nodeId as string;
    expect(await ok("nodes.get", { node })).toMatchObject({ id: node, role: "site" });
    const command = await ok<{ id: string; created: boolean }>("commands.create", { node, kind: "agent.ping", key: `param:${node}` });
    expect(command.created).toBe(true);
    expect((await ok<{ commands: { id: string }[] }>("commands.list", { node })).commands.map((c) => c.id)).toEqual([command.id]);

    await refused("nodes.get", { id: node }, "INVALID_ARGUMENT");
    await refused("commands.create", { nodeId: node, kind: "agent.ping" }, "INVALID_ARGUMENT");
    await refused("nodes.get", { node: "n".repeat(129) }, "INVALID_ARGUMENT");
    await refused("nodes.get", { node: "n-\u0001" }, "INVALID_ARGUMENT");
    await refused("metal.nodes.get", { id: "m-1" }, "INVALID_ARGUMENT");
    await refused("metal.nodes.get", { node: "m-nobody" }, "NOT_FOUND");

    expect(await ok("nodes.revoke", { node })).toMatchObject({ id: node, revoked: true });
  });
});
