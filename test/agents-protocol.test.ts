// Joining and the agent protocol against the real JoinService, gateway and NodeDO, with a raw
// peer that can misbehave on purpose.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { betterCompute, definePlugin } from "../core/index.ts";
import { CloseCode, generateNodeKey, MAX_FRAME_BYTES } from "../core/protocol.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { connectRaw, joinRaw, joinWith, type RawAgent } from "./support/raw-agent.ts";

const testKinds = definePlugin({
  id: "test-kinds",
  commands: [
    { kind: "test.echo", input: z.object({ n: z.number() }) },
    { kind: "test.wipe", attested: true, destructive: true, input: z.object({ disk: z.string() }) },
  ],
});
const compute = betterCompute({ plugins: [testKinds] });
let client: TestClient;
const logs: string[] = [];

beforeAll(async () => {
  const original = console.log.bind(console);
  vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => {
    logs.push(args.map(String).join(" "));
    original(...args);
  });
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

async function siteToken(ttlSeconds?: number): Promise<string> {
  const res = await client.call("siteTokens.create", { site: "lab", ...(ttlSeconds ? { ttlSeconds } : {}) });
  expect(res.status).toBe(200);
  return res.body.token;
}

async function connectedAgent(): Promise<RawAgent> {
  const joined = await joinRaw(compute, env, await siteToken());
  expect(joined.res.status).toBe(200);
  const agent = await connectRaw(compute, env, { nodeId: joined.body.nodeId, credential: joined.body.credential, key: joined.key });
  await agent.hello({ drivers: [{ id: "redfish", version: "1.2.0" }] });
  await agent.next("welcome");
  return agent;
}

const send = (nodeId: string, kind: string, body: object) => client.call("commands.create", { node: nodeId, kind, body });
const commandState = async (id: string) => (await client.call("commands.get", { id })).body;

describe("joining", () => {
  it("joins a site agent with a site token, once", async () => {
    const token = await siteToken();
    const first = await joinRaw(compute, env, token);
    expect(first.res.status).toBe(200);
    expect(first.body).toMatchObject({ nodeId: expect.stringMatching(/^n-/), role: "site", credential: expect.any(String) });
    const node = (await client.call("nodes.get", { node: first.body.nodeId })).body;
    expect(node).toMatchObject({ role: "site", state: "joined", labels: { "bc.dev/site": "lab" }, attestor: "join-token" });

    const again = await joinRaw(compute, env, token);
    expect(again.res.status).toBe(403);
    expect(again.body.code).toBe("PERMISSION_DENIED");
  });

  it("refuses an expired token and uses it up", async () => {
    const token = await siteToken();
    const id = token.slice(4, 20);
    await client.store.db.execute(sql`UPDATE bc_join_tokens SET expires_at = compute_now() - interval '1 second' WHERE id = ${id}`);
    const expired = await joinRaw(compute, env, token);
    expect(expired.res.status).toBe(403);
    expect(expired.body.message).toContain("expired");
    const row = await client.store.db.execute(sql`SELECT consumed_at IS NOT NULL AS consumed FROM bc_join_tokens WHERE id = ${id}`);
    expect(row.rows).toEqual([{ consumed: true }]);
  });

  it("refuses a token for another role and a join not signed by its key", async () => {
    const wrongRole = await joinRaw(compute, env, await siteToken(), "node");
    expect(wrongRole.res.status).toBe(403);
    const other = await generateNodeKey();
    const res = await compute.fetch(
      new Request("http://bc.test/join/v1/join", {
        method: "POST",
        body: JSON.stringify({
          attestor: "join-token",
          evidence: { token: await siteToken() },
          publicKey: other.publicKey,
          role: "site",
          signature: "A".repeat(86),
        }),
      }),
      env,
    );
    expect(res.status).toBe(401);
  });
});

describe("the agent protocol", () => {
  it("keeps the platform's bc.dev/ labels: an agent's own report cannot set or override them", async () => {
    const joined = await joinRaw(compute, env, await siteToken());
    const agent = await connectRaw(compute, env, { nodeId: joined.body.nodeId, credential: joined.body.credential, key: joined.key });
    await agent.hello({ labels: { "bc.dev/site": "elsewhere", "bc.dev/machine": "m-stolen", rack: "r12" } });
    await agent.next("welcome");
    const node = (await client.call("nodes.get", { node: joined.body.nodeId })).body as { labels: Record<string, string> };
    expect(node.labels).toEqual({ "bc.dev/site": "lab", rack: "r12" });
    agent.ws.close(1000);
  });

  it("records the connection with driver labels, delivers a command and takes its result", async () => {
    const agent = await connectedAgent();
    const node = (await client.call("nodes.get", { node: agent.nodeId })).body;
    expect(node).toMatchObject({ state: "connected", labels: { "bc.dev/site": "lab", "bc.dev/driver.redfish": "1.2.0" } });

    const created = await send(agent.nodeId, "test.echo", { n: 7 });
    expect(created.status).toBe(200);
    const command = await agent.next("command", (c) => c.id === created.body.id);
    expect(command).toMatchObject({ kind: "test.echo", body: { n: 7 }, attested: false });
    await agent.result(command, true, { n: 7 });
    await agent.next("result-ack", (a) => a.id === command.id);
    expect(await commandState(command.id)).toMatchObject({ state: "succeeded", result: { n: 7 } });
    agent.ws.close(1000, "done");
  });

  it("refuses a body that breaks the kind's schema, and an unknown kind, before anything is sent", async () => {
    const agent = await connectedAgent();
    expect((await send(agent.nodeId, "test.echo", { n: "seven" })).status).toBe(400);
    expect((await send(agent.nodeId, "test.nope", {})).body.code).toBe("INVALID_ARGUMENT");
    const rows = await client.store.db.execute(sql`SELECT count(*)::int AS n FROM bc_commands WHERE node_id = ${agent.nodeId}`);
    expect(rows.rows).toEqual([{ n: 0 }]);
    agent.ws.close(1000, "done");
  });

  it("refuses a forged result signature, another node's command and an unknown command, and keeps serving the others", async () => {
    const a = await connectedAgent();
    const b = await connectedAgent();
    const wipe = await send(a.nodeId, "test.wipe", { disk: "/dev/sda" });
    const command = await a.next("command", (c) => c.id === wipe.body.id);
    expect(command.attested).toBe(true);

    const stranger = await generateNodeKey();
    await a.result(command, true, { wiped: true }, { signWith: stranger.privateKey });
    expect(await a.next("error", (e) => e.ref === command.id)).toMatchObject({ code: "BAD_SIGNATURE" });
    await a.result(command, true, { wiped: true }, { unsigned: true });
    expect(await a.next("error", (e) => e.ref === command.id)).toMatchObject({ code: "BAD_SIGNATURE" });
    expect((await commandState(command.id)).state).toBe("delivered");

    // B answers A's command: refused, A's command untouched.
    await b.result(command, true, { wiped: true });
    expect(await b.next("error", (e) => e.ref === command.id)).toMatchObject({ code: "NOT_YOUR_COMMAND" });
    await b.result({ id: "999999999", key: "nope" }, true, {});
    expect(await b.next("error", (e) => e.ref === "999999999")).toMatchObject({ code: "UNKNOWN_COMMAND" });

    // Both go on: A's properly signed result is recorded once, B still gets its commands.
    await a.result(command, true, { wiped: true });
    await a.next("result-ack", (x) => x.id === command.id);
    await a.result(command, true, { wiped: true });
    await a.next("result-ack", (x) => x.id === command.id);
    const recorded = await commandState(command.id);
    expect(recorded).toMatchObject({ state: "succeeded", result: { wiped: true } });
    const events = await client.store.db.execute(
      sql`SELECT count(*)::int AS n FROM bc_events WHERE type = 'command.succeeded' AND data->>'commandId' = ${command.id}`,
    );
    expect(events.rows).toEqual([{ n: 1 }]);

    const echo = await send(b.nodeId, "test.echo", { n: 1 });
    const bCommand = await b.next("command", (c) => c.id === echo.body.id);
    await b.result(bCommand, true, { n: 1 });
    await b.next("result-ack", (x) => x.id === bCommand.id);
    a.ws.close(1000, "done");
    b.ws.close(1000, "done");
  });

  it("closes a socket whose hello answers another socket's challenge (a replayed nonce)", async () => {
    const a = await connectedAgent();
    const joined = { nodeId: a.nodeId, credential: a.credential, key: a.key };
    const first = await connectRaw(compute, env, joined);
    const challenge = await first.next("challenge");
    const second = await connectRaw(compute, env, joined);
    await second.next("challenge");
    // The second socket is answered with the first socket's nonce, signed properly.
    const { helloMessage, signMessage, PROTOCOL_VERSION } = await import("../core/protocol.ts");
    second.send({
      t: "hello",
      protocol: PROTOCOL_VERSION,
      nonce: challenge.nonce,
      role: "site",
      version: "x",
      bootId: "b",
      labels: {},
      drivers: [],
      signature: await signMessage(a.key.privateKey, helloMessage(a.nodeId, challenge.nonce, "b")),
    });
    expect((await second.closed).code).toBe(CloseCode.PROOF_FAILED);
  });

  it("closes on a malformed frame, an unknown frame type, an oversized frame and a command before hello", async () => {
    const cases: Array<[string, (agent: RawAgent) => void | Promise<void>, number]> = [
      ["malformed", (x) => x.send("{not json"), CloseCode.MALFORMED_FRAME],
      ["unknown type", (x) => x.send({ t: "reboot-everything" }), CloseCode.MALFORMED_FRAME],
      ["oversized", (x) => x.send({ t: "ack", id: "1", pad: "x".repeat(MAX_FRAME_BYTES) }), CloseCode.FRAME_TOO_LARGE],
    ];
    for (const [, misbehave, code] of cases) {
      const agent = await connectedAgent();
      await misbehave(agent);
      expect((await agent.closed).code).toBe(code);
    }
    const early = await connectedAgent().then(async (a) =>
      connectRaw(compute, env, { nodeId: a.nodeId, credential: a.credential, key: a.key }),
    );
    await early.next("challenge");
    early.send({ t: "ack", id: "1" });
    expect((await early.closed).code).toBe(CloseCode.HELLO_REQUIRED);
  });

  it("keeps join tokens out of every command, event, audit row and log line", async () => {
    const token = await siteToken();
    const joined = await joinRaw(compute, env, token);
    const agent = await connectRaw(compute, env, { nodeId: joined.body.nodeId, credential: joined.body.credential, key: joined.key });
    await agent.hello();
    await agent.next("welcome");
    await send(agent.nodeId, "test.echo", { n: 3 });
    await agent.next("command");
    // The whole secret half: base64url may itself contain "_".
    const secret = /^bcj_[0-9a-f]{16}_(.{43})$/.exec(token)![1]!;
    const dump = await client.store.db.execute(sql`
      SELECT (SELECT json_agg(c) FROM bc_commands c) AS commands, (SELECT json_agg(e) FROM bc_events e) AS events,
             (SELECT json_agg(a) FROM bc_audit a) AS audit, (SELECT json_agg(n) FROM bc_nodes n) AS nodes`);
    expect(JSON.stringify(dump.rows)).not.toContain(secret);
    expect(logs.join("\n")).not.toContain(secret);
    agent.ws.close(1000, "done");
  });
});

describe("discovery, renewal and connection events", () => {
  async function site() {
    const joined = await joinRaw(compute, env, await siteToken());
    return { nodeId: joined.body.nodeId as string, key: joined.key, credential: joined.body.credential as string };
  }

  async function vouch(by: { nodeId: string; key: { privateKey: CryptoKey } }, ramdiskKey: string, issuedAt?: string) {
    const { discoveryMessage, signMessage } = await import("../core/protocol.ts");
    const now = (await client.store.db.execute(sql`SELECT compute_now() AS now`)).rows[0] as { now: string };
    const assertion = { publicKey: ramdiskKey, issuedAt: issuedAt ?? new Date(now.now).toISOString(), productUuid: "4c4c4544-0042" };
    return { siteNodeId: by.nodeId, assertion, signature: await signMessage(by.key.privateKey, discoveryMessage(by.nodeId, assertion)) };
  }

  it("joins a ramdisk on its site agent's signed assertion, and refuses forged, stale or borrowed ones", async () => {
    const lab = await site();
    const ramdisk = await generateNodeKey();
    const joined = await joinWith(compute, env, {
      attestor: "discovery",
      role: "ramdisk",
      key: ramdisk,
      evidence: await vouch(lab, ramdisk.publicKey),
    });
    expect(joined.res.status).toBe(200);
    const node = (await client.call("nodes.get", { node: joined.body.nodeId })).body;
    expect(node).toMatchObject({
      role: "ramdisk",
      attestor: "discovery",
      labels: { "bc.dev/site": "lab", "bc.dev/discovered-by": lab.nodeId, "bc.dev/product-uuid": "4c4c4544-0042" },
    });

    const impostor = { nodeId: lab.nodeId, key: await generateNodeKey() };
    const other = await generateNodeKey();
    const refusals = [
      await joinWith(compute, env, {
        attestor: "discovery",
        role: "ramdisk",
        key: other,
        evidence: await vouch(impostor, other.publicKey),
      }),
      await joinWith(compute, env, {
        attestor: "discovery",
        role: "ramdisk",
        key: other,
        evidence: await vouch(lab, other.publicKey, "2020-01-01T00:00:00Z"),
      }),
      await joinWith(compute, env, { attestor: "discovery", role: "ramdisk", key: other, evidence: await vouch(lab, ramdisk.publicKey) }),
      await joinWith(compute, env, { attestor: "discovery", role: "node", key: other, evidence: await vouch(lab, other.publicKey) }),
    ];
    expect(refusals.map((r) => [r.res.status, r.body.code])).toEqual(Array(4).fill([403, "PERMISSION_DENIED"]));
  });

  it("renews a credential signed by the node's key, and refuses a revoked node", async () => {
    const lab = await site();
    const { renewMessage, signMessage } = await import("../core/protocol.ts");
    const renew = async (credential: string, key: CryptoKey) => {
      const timestamp = new Date(
        ((await client.store.db.execute(sql`SELECT compute_now() AS now`)).rows[0] as { now: string }).now,
      ).toISOString();
      return compute.fetch(
        new Request("http://bc.test/join/v1/renew", {
          method: "POST",
          headers: { authorization: `Bearer ${credential}` },
          body: JSON.stringify({ timestamp, signature: await signMessage(key, renewMessage(lab.nodeId, timestamp)) }),
        }),
        env,
      );
    };
    const renewed = await renew(lab.credential, lab.key.privateKey);
    expect(renewed.status).toBe(200);
    const fresh = ((await renewed.json()) as { credential: string }).credential;
    expect(fresh).not.toBe(lab.credential);
    const agent = await connectRaw(compute, env, { ...lab, credential: fresh });
    await agent.hello();
    await agent.next("welcome");
    agent.ws.close(1000, "bye");
    await agent.closed;

    expect((await renew(fresh, (await generateNodeKey()).privateKey)).status).toBe(401);
    await client.call("nodes.revoke", { node: lab.nodeId });
    expect((await renew(fresh, lab.key.privateKey)).status).toBe(403);

    await expect
      .poll(async () =>
        (
          await client.store.db.execute(sql`
      SELECT type FROM bc_events WHERE subject = ${`nodes/${lab.nodeId}`} ORDER BY id`)
        ).rows.map((r) => (r as { type: string }).type),
      )
      .toEqual(["node.joined", "node.connected", "node.disconnected", "node.revoked"]);
  });
});
