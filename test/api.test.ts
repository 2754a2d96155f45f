// The API envelope on the default deployment: authentication, IAM, validation, limits and
// the error model, through the real Worker in workerd against Postgres.
import { env, exports } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { compute } from "../better-compute.config.ts";
import { betterCompute, definePlugin } from "../core/index.ts";
import { ComputeError, defineMethod } from "../core/public.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";

let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

const post = (path: string, body: BodyInit | null, headers: Record<string, string> = {}) =>
  exports.default.fetch(`http://bc.test${path}`, { method: "POST", body, headers: { "content-type": "application/json", ...headers } });

/** Every error body is {code, message, details?, requestId} and carries no stack trace or key. */
async function expectError(res: Response, status: number, code: string) {
  expect(res.status).toBe(status);
  expect(res.headers.get("content-type")).toMatch(/application\/json/);
  const text = await res.text();
  expect(text).not.toMatch(/\n\s+at |\.ts:\d+|node_modules/);
  expect(text).not.toContain(client.key);
  const body = JSON.parse(text);
  expect(Object.keys(body).sort()).toEqual(expect.arrayContaining(["code", "message", "requestId"]));
  expect(body.code).toBe(code);
  // The id the response header carries, and the server's log line too.
  expect(body.requestId).toBe(res.headers.get("x-request-id"));
  return body;
}

describe("the default deployment's API", () => {
  it("serves an OpenAPI document generated from the registered methods", async () => {
    const res = await exports.default.fetch("http://bc.test/openapi.json");
    expect(res.status).toBe(200);
    const doc = (await res.json()) as any;
    expect(doc.openapi).toBe("3.1.0");
    const create = doc.paths["/v1/iam.apiKeys.create"].post;
    expect(create["x-iam-action"]).toBe("iam.apiKeys.create");
    expect(create.requestBody.content["application/json"].schema.required).toEqual(["name", "roles"]);
    expect(doc.paths["/v1/modules.list"]).toBeDefined();
  });

  it("lists the registered modules to an authenticated caller", async () => {
    const res = await post("/v1/modules.list", "{}", { authorization: `Bearer ${client.key}` });
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body.modules.map((m: any) => m.id)).toContain("core");
    expect(body.modules.find((m: any) => m.id === "core").methods).toContain("iam.apiKeys.create");
  });

  it("refuses a request without credentials with 401", async () => {
    await expectError(await post("/v1/modules.list", "{}"), 401, "UNAUTHENTICATED");
  });

  it("refuses an unknown, malformed or revoked key with 401", async () => {
    await expectError(
      await post("/v1/modules.list", "{}", { authorization: "Bearer bck_0123456789abcdef_" + "x".repeat(43) }),
      401,
      "UNAUTHENTICATED",
    );
    await expectError(await post("/v1/modules.list", "{}", { authorization: "Bearer nonsense" }), 401, "UNAUTHENTICATED");
    await expectError(await post("/v1/modules.list", "{}", { authorization: "Basic abc" }), 401, "UNAUTHENTICATED");

    const minted = await client.call("iam.apiKeys.create", { name: "short-lived", roles: ["viewer"] });
    expect(minted.status).toBe(200);
    expect((await post("/v1/iam.whoami", "{}", { authorization: `Bearer ${minted.body.key}` })).status).toBe(200);
    expect((await client.call("iam.apiKeys.revoke", { id: minted.body.id })).status).toBe(200);
    await expectError(await post("/v1/iam.whoami", "{}", { authorization: `Bearer ${minted.body.key}` }), 401, "UNAUTHENTICATED");
  });

  it("refuses an action the caller's roles lack with 403", async () => {
    const viewer = await client.mintKey(["viewer"]);
    expect((await client.call("modules.list", {}, { key: viewer })).status).toBe(200);
    const body = await expectError(
      await post("/v1/iam.apiKeys.create", JSON.stringify({ name: "x", roles: ["admin"] }), { authorization: `Bearer ${viewer}` }),
      403,
      "PERMISSION_DENIED",
    );
    expect(body.details).toEqual({ action: "iam.apiKeys.create", resource: "apiKeys/x" });
  });

  it("answers malformed JSON with 400 INVALID_ARGUMENT", async () => {
    await expectError(
      await post("/v1/iam.apiKeys.create", "{not json", { authorization: `Bearer ${client.key}` }),
      400,
      "INVALID_ARGUMENT",
    );
  });

  it("answers a body that breaks the schema with 400 and the issue paths", async () => {
    const res = await post("/v1/iam.apiKeys.create", JSON.stringify({ name: "", roles: [42] }), { authorization: `Bearer ${client.key}` });
    const body = await expectError(res, 400, "INVALID_ARGUMENT");
    expect(body.details.issues.map((i: any) => i.path).sort()).toEqual(["name", "roles.0"]);
  });

  it("refuses an unknown role with INVALID_ARGUMENT and creates no key", async () => {
    const before = (await client.call("iam.apiKeys.list")).body.keys.length;
    const res = await post("/v1/iam.apiKeys.create", JSON.stringify({ name: "x", roles: ["superuser"] }), {
      authorization: `Bearer ${client.key}`,
    });
    expect((await expectError(res, 400, "INVALID_ARGUMENT")).details.unknownRoles).toEqual(["superuser"]);
    expect((await client.call("iam.apiKeys.list")).body.keys.length).toBe(before);
  });

  it("answers an unknown route with a 404 JSON error", async () => {
    await expectError(await post("/v1/no.such.method", "{}", { authorization: `Bearer ${client.key}` }), 404, "NOT_FOUND");
    await expectError(await exports.default.fetch("http://bc.test/nowhere"), 404, "NOT_FOUND");
  });

  it("refuses an oversized body with 413, declared or streamed", async () => {
    const big = JSON.stringify({ name: "x".repeat(2 * 1024 * 1024), roles: ["admin"] });
    await expectError(await post("/v1/iam.apiKeys.create", big, { authorization: `Bearer ${client.key}` }), 413, "PAYLOAD_TOO_LARGE");
    const chunks = new ReadableStream({
      start(controller) {
        for (let i = 0; i < 3; i++) controller.enqueue(new TextEncoder().encode("x".repeat(512 * 1024)));
        controller.close();
      },
    });
    const streamed = await exports.default.fetch("http://bc.test/v1/iam.apiKeys.create", {
      method: "POST",
      body: chunks,
      headers: { authorization: `Bearer ${client.key}` },
      // @ts-expect-error workerd needs duplex for a streamed body
      duplex: "half",
    });
    await expectError(streamed, 413, "PAYLOAD_TOO_LARGE");
  });

  it("never stores or returns a key's secret after minting it", async () => {
    const minted = await client.call("iam.apiKeys.create", { name: "once", roles: ["viewer"] });
    const listed = JSON.stringify((await client.call("iam.apiKeys.list")).body);
    // The whole secret half: base64url may itself contain "_".
    const secret = /^bck_[0-9a-f]{16}_(.{43})$/.exec(minted.body.key)![1]!;
    expect(listed).toContain(minted.body.id);
    expect(listed).not.toContain(secret);
    const rows = await client.store.db.execute(sql`SELECT * FROM bc_api_keys WHERE id = ${minted.body.id}`);
    expect(JSON.stringify(rows.rows)).not.toContain(secret);
    const events = await client.store.db.execute(sql`SELECT data FROM bc_events WHERE subject = ${`apiKeys/${minted.body.id}`}`);
    expect(events.rows).toHaveLength(1);
    expect(JSON.stringify(events.rows)).not.toContain(secret);
  });

  it("records an audit row for a mutating call and none for a read", async () => {
    const res = await client.call("iam.apiKeys.create", { name: "audited", roles: ["viewer"] });
    const requestId = res.headers.get("x-request-id");
    const audit = await client.store.db.execute(sql`SELECT actor, action, resource FROM bc_audit WHERE request_id = ${requestId}`);
    expect(audit.rows).toEqual([{ actor: expect.stringMatching(/^apikey:/), action: "iam.apiKeys.create", resource: "apiKeys/audited" }]);
    const read = await client.call("modules.list");
    const none = await client.store.db.execute(sql`SELECT 1 FROM bc_audit WHERE request_id = ${read.headers.get("x-request-id")}`);
    expect(none.rows).toHaveLength(0);
  });
});

// ---------------------------------------------------------------- server-side errors

/** Fails on purpose, holding a value the log must never show. */
const failing = definePlugin({
  id: "acme-failing",
  iam: { actions: { "acme.fail": "Fail on purpose" } },
  api: [
    defineMethod({
      name: "acme.fail",
      input: z.object({ how: z.enum(["crash", "unavailable", "refuse"]), note: z.string() }),
      output: z.object({}),
      handler: async (_ctx, input) => {
        if (input.how === "crash") throw new Error("the acme store fell over");
        if (input.how === "unavailable") throw new ComputeError("UNAVAILABLE", "the acme store is down for maintenance");
        throw new ComputeError("FAILED_PRECONDITION", "the acme store refuses");
      },
    }),
  ],
});

describe("server-side errors", () => {
  const failingCompute = betterCompute({ plugins: [failing] });
  let failingClient: TestClient;
  const errors: string[] = [];
  beforeAll(async () => {
    failingClient = await createTestClient(failingCompute, env);
    vi.spyOn(console, "error").mockImplementation((...args: unknown[]) => void errors.push(args.map(String).join(" ")));
  });
  afterAll(async () => {
    vi.restoreAllMocks();
    await failingClient?.close();
  });

  it("logs every 5xx once at error level, with its request id, method and code, never the body", async () => {
    for (const [how, status, code] of [
      ["crash", 500, "INTERNAL"],
      ["unavailable", 503, "UNAVAILABLE"],
    ] as const) {
      const res = await failingClient.call("acme.fail", { how, note: "hunter2-in-the-body" });
      expect(res.status).toBe(status);
      expect(res.body).toMatchObject({ code, requestId: res.headers.get("x-request-id") });
      const lines = errors.filter((line) => line.includes(res.body.requestId));
      expect(lines).toHaveLength(1);
      expect(JSON.parse(lines[0]!)).toMatchObject({
        level: "error",
        message: "request failed",
        requestId: res.body.requestId,
        method: "acme.fail",
        code,
        status,
      });
      expect(lines[0]).not.toContain("hunter2");
    }
    // What went wrong inside reaches the log, never the caller.
    expect(errors.join("\n")).toContain("the acme store fell over");
  });

  it("does not log a 4xx as a server error", async () => {
    const res = await failingClient.call("acme.fail", { how: "refuse", note: "x" });
    expect(res.status).toBe(400);
    expect(errors.some((line) => line.includes(res.body.requestId))).toBe(false);
  });

  it("puts a request id on every response, success included", async () => {
    const ok = await client.request("/v1/health");
    expect(ok.status).toBe(200);
    expect(ok.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
  });
});
