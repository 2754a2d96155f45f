// The vps module through the real API in workerd against Postgres: provider accounts (checked by
// the manifest, the token sealed and never shown), tenants and what their keys may see, quotas,
// flavors, SSH keys, and instances driven by the vps.instances reconciler to running, stopped and
// deleted. SIMULATED: the provider, "Test Cloud", an in-memory HTTP API behind the fetch the
// module is given (one cloud per account endpoint); its adapter is a real defineProvider over
// ProviderHttp, as an outside package would write it.
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { z } from "zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute } from "better-compute";
import { createTestClient, type TestClient } from "better-compute/testing";
import { defineProvider, ProviderHttp, reconcileInstance, vps, type Fetch, type ProviderServer } from "better-compute/vps";

// ---------------------------------------------------------------- Test Cloud (simulated)

interface FakeServer {
  id: string;
  stamp: string;
  name: string;
  status: "creating" | "running" | "starting" | "stopping" | "stopped" | "deleting";
  addresses: string[];
  userData: string;
  sshKeys: string[];
}

const GOOD_TOKEN = "tc-token-0123456789-good";

/**
 * One account's cloud: servers, and actions that end after `actionPolls` requests to the cloud (its clock:
 * time passes as it is asked), when their effect lands.
 */
class TestCloud {
  servers = new Map<string, FakeServer>();
  actions = new Map<string, { polls: number; effect: () => void }>();
  /** "METHOD /path" of every request, in order. */
  requests: string[] = [];
  actionPolls = 1;
  /** The next requests are answered with these failures (a 429, a 503), one each. */
  failNext: { status: number; code: string }[] = [];
  /** Creates of servers of these names (instance ids) are refused: no capacity (resource_unavailable). */
  refuseCreateOf = new Set<string>();
  /** While set, every request waits for it: a provider that does not answer yet. */
  hold: Promise<void> | undefined;
  #next = 100;

  count(what: string): number {
    return this.requests.filter((r) => r === what || r.startsWith(`${what}?`)).length;
  }

  async handle(request: Request): Promise<Response> {
    await this.hold;
    const url = new URL(request.url);
    const path = url.pathname;
    this.requests.push(`${request.method} ${path}${url.search}`);
    for (const action of this.actions.values()) {
      if (action.polls > 0 && --action.polls === 0) action.effect();
    }
    const failure = this.failNext.shift();
    if (failure) return json(failure.status, { error: { code: failure.code, message: `injected ${failure.code}` } });
    if (request.headers.get("authorization") !== `Bearer ${GOOD_TOKEN}`)
      return json(401, { error: { code: "unauthorized", message: "unable to authenticate" } });
    const server = /^\/servers\/(\d+)/.exec(path)?.[1];
    if (request.method === "GET" && path === "/offers")
      return json(200, {
        flavors: [
          { id: "tc-small", name: "Small", vcpus: 2, memoryMiB: 2048, diskGiB: 20, locations: ["eu-1", "us-1"] },
          { id: "tc-large", name: "Large", vcpus: 8, memoryMiB: 16384, diskGiB: 160, locations: ["us-1"] },
        ],
        images: [{ id: "debian-12", name: "Debian 12" }],
        locations: [
          { id: "eu-1", name: "Europe" },
          { id: "us-1", name: "America" },
        ],
      });
    if (request.method === "GET" && path === "/servers") {
      const stamp = url.searchParams.get("stamp");
      return json(200, { servers: [...this.servers.values()].filter((s) => stamp === null || s.stamp === stamp) });
    }
    if (request.method === "POST" && path === "/servers") {
      const body = (await request.json()) as { stamp: string; name: string; userData: string; sshKeys: string[] };
      if (this.refuseCreateOf.has(body.name))
        return json(422, { error: { code: "resource_unavailable", message: "no capacity for this server type in eu-1" } });
      const id = String(this.#next++);
      const created: FakeServer = {
        id,
        stamp: body.stamp,
        name: body.name,
        status: "creating",
        addresses: [],
        userData: body.userData,
        sshKeys: body.sshKeys,
      };
      this.servers.set(id, created);
      return json(201, {
        server: created,
        action: this.#action(() => Object.assign(created, { status: "running", addresses: [`203.0.113.${id.slice(-2)}`] })),
      });
    }
    if (server && !this.servers.has(server)) return json(404, { error: { code: "not_found", message: `server ${server} not found` } });
    const found = server ? this.servers.get(server)! : undefined;
    if (request.method === "GET" && found && path === `/servers/${server}`) return json(200, { server: found });
    if (request.method === "DELETE" && found) {
      found.status = "deleting";
      return json(200, { action: this.#action(() => this.servers.delete(found.id)) });
    }
    const action = /^\/servers\/\d+\/actions\/(poweron|poweroff|reboot)$/.exec(path)?.[1];
    if (request.method === "POST" && found && action) {
      found.status = action === "poweroff" ? "stopping" : "starting";
      return json(201, { action: this.#action(() => (found.status = action === "poweroff" ? "stopped" : "running")) });
    }
    const polled = /^\/actions\/(\w+)$/.exec(path)?.[1];
    if (request.method === "GET" && polled && this.actions.has(polled)) {
      const status = this.actions.get(polled)!.polls > 0 ? "running" : "success";
      return json(200, { action: { id: polled, status } });
    }
    return json(404, { error: { code: "not_found", message: `${request.method} ${path}` } });
  }

  #action(effect: () => void): { id: string } {
    const id = `a${this.#next++}`;
    this.actions.set(id, { polls: this.actionPolls, effect });
    return { id };
  }
}

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

/** Every cloud, by the host of the endpoint its account names. */
const clouds = new Map<string, TestCloud>();
const cloudFetch: Fetch = async (input, init) => {
  const request = new Request(input, init);
  const cloud = clouds.get(new URL(request.url).host);
  if (!cloud) throw new TypeError(`fetch failed: no cloud at ${request.url}`);
  return cloud.handle(request);
};

const toServer = (s: FakeServer): ProviderServer => ({
  id: s.id,
  instanceId: s.stamp,
  name: s.name,
  status: s.status,
  addresses: s.addresses,
});

const testCloud = defineProvider({
  id: "vps-test-cloud",
  description: "Test Cloud (an in-memory HTTP API)",
  manifest: z.object({ endpoint: z.url(), token: z.string().min(16), region: z.enum(["eu", "us"]).default("eu") }),
  secretFields: ["token"],
  client(account, { fetch }) {
    const http = new ProviderHttp({
      provider: "vps-test-cloud",
      baseUrl: account.endpoint,
      fetch,
      headers: { authorization: `Bearer ${account.token}` },
      secrets: [account.token],
      maxAttempts: 1,
      classify: (response, body) => {
        const error = (body as { error?: { code: string; message: string } })?.error ?? {
          code: "unknown",
          message: String(response.status),
        };
        if (response.status === 401) return { failure: "config", reason: error.code, message: error.message };
        if (error.code === "resource_unavailable") return { failure: "capacity", reason: error.code, message: error.message };
        if (response.status === 429)
          return { failure: "transient", reason: "rate_limit_exceeded", message: error.message, retryAfterSeconds: 30, refused: true };
        return { failure: response.status >= 500 ? "transient" : "rejected", reason: error.code, message: error.message };
      },
    });
    return {
      offers: async () => (await http.request("GET", "/offers")).body,
      async create(request) {
        const { body } = await http.request("POST", "/servers", {
          json: {
            stamp: request.instanceId,
            name: request.name,
            flavor: request.flavor,
            image: request.image,
            userData: request.userData,
            sshKeys: request.sshKeys.map((k) => k.publicKey),
          },
        });
        return { server: toServer(body.server), operation: body.action };
      },
      async get(id) {
        const { status, body } = await http.request("GET", `/servers/${id}`, { accept: [404] });
        return status === 404 ? null : toServer(body.server);
      },
      async find(instanceId) {
        const { body } = await http.request("GET", "/servers", { query: { stamp: instanceId } });
        return body.servers[0] ? toServer(body.servers[0]) : null;
      },
      list: async () => (await http.request("GET", "/servers")).body.servers.map(toServer),
      powerOn: async (id) => (await http.request("POST", `/servers/${id}/actions/poweron`)).body.action,
      powerOff: async (id) => (await http.request("POST", `/servers/${id}/actions/poweroff`)).body.action,
      reboot: async (id) => (await http.request("POST", `/servers/${id}/actions/reboot`)).body.action,
      async delete(id) {
        const { status, body } = await http.request("DELETE", `/servers/${id}`, { accept: [404] });
        return status === 404 ? undefined : body.action;
      },
      async operation(id) {
        const { body } = await http.request("GET", `/actions/${id}`);
        return body.action.status === "running"
          ? { state: "running" }
          : body.action.status === "success"
            ? { state: "succeeded" }
            : { state: "failed", message: String(body.action.error) };
      },
    };
  },
});

// ---------------------------------------------------------------- the deployment

const AGENT_URL = "https://bc.example.test";
const compute = betterCompute({ modules: [vps({ providers: [testCloud], fetch: cloudFetch, agentUrl: AGENT_URL })] });
let client: TestClient;
/** Unique per run, so a database kept between runs (BC_TEST_DATABASE_URL) sees new ids. */
const run = crypto.randomUUID().slice(0, 6);
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

async function ok<T = any>(name: string, input: unknown, key?: string): Promise<T> {
  const res = await client.call<T>(name, input, key ? { key } : {});
  expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
}

async function refused(name: string, input: unknown, code: string, key?: string) {
  const res = await client.call(name, input, key ? { key } : {});
  expect(res.body.code, `${name}: ${JSON.stringify(res.body)}`).toBe(code);
  return res.body as { code: string; message: string; details?: Record<string, any> };
}

/** A fresh cloud, an account on it, a pool, a tenant offered the pool with a quota, a flavor and an SSH key. */
async function world(
  name: string,
  options: { token?: string; quota?: Partial<Record<"instances" | "vcpus", number>>; agent?: "bcd" | "none" } = {},
) {
  const id = `${name}-${run}`;
  const cloud = new TestCloud();
  clouds.set(`${id}.cloud.test`, cloud);
  await ok("vps.accounts.create", {
    id,
    provider: "vps-test-cloud",
    config: { endpoint: `https://${id}.cloud.test`, token: options.token ?? GOOD_TOKEN },
  });
  await ok("vps.pools.create", { id, account: id, agent: options.agent ?? "none", location: "eu-1" });
  await ok("vps.tenants.create", { id, name: `Tenant ${name}` });
  await ok("vps.quotas.set", { tenant: id, pool: id, instances: 10, vcpus: 20, memoryMiB: 65536, diskGiB: 1000, ...options.quota });
  // Flavors ask the provider; a wrong token cannot, so those worlds get theirs written as a good account would have.
  if (options.token === undefined) await ok("vps.flavors.create", { id, pool: id, offer: "tc-small", image: "debian-12" });
  else
    await client.store.db.execute(sql`
      INSERT INTO vps_flavors (id, pool_id, name, offer, image, vcpus, memory_mib, disk_gib) VALUES (${id}, ${id}, ${id}, 'tc-small', 'debian-12', 2, 2048, 20)`);
  await ok("vps.sshKeys.create", { tenant: id, name: "alice", publicKey: KEY });
  return { id, cloud };
}

const createInstance = (w: { id: string }, name: string, extra: object = {}) =>
  ok("vps.instances.create", { tenant: w.id, pool: w.id, flavor: w.id, name, sshKeys: ["alice"], ...extra });

/** One cron pass of the deployment's reconcilers. */
const pass = () => compute.reconcile(env, client.store);

const instance = async (id: string) => ok("vps.instances.get", { id });

/** Passes until the instance is in `state` (at most `max`). */
async function passUntil(id: string, state: string, max = 10) {
  for (let i = 0; i < max; i++) {
    if ((await instance(id)).state === state) return instance(id);
    await pass();
  }
  expect((await instance(id)).state).toBe(state);
  return instance(id);
}

const historyOf = async (id: string) =>
  (await ok<{ entries: { call: string; outcome: string; detail: Record<string, any> }[] }>("vps.instances.history", { instance: id }))
    .entries;

// ---------------------------------------------------------------- accounts

describe("vps.accounts", () => {
  it("refuses a config the provider's manifest does not take, naming the fields and quoting no secret", async () => {
    const secret = `tc-token-${run}-refused-secret`;
    const err = await refused(
      "vps.accounts.create",
      { id: `refused-${run}`, provider: "vps-test-cloud", config: { endpoint: "not a url", token: secret, region: "mars" } },
      "INVALID_ARGUMENT",
    );
    expect(err.details!.issues.map((i: { path: string }) => i.path).sort()).toEqual(["endpoint", "region"]);
    expect(JSON.stringify(err)).not.toContain(secret);
    expect(
      (await refused("vps.accounts.create", { id: `nope-${run}`, provider: "no-such-cloud", config: {} }, "INVALID_ARGUMENT")).message,
    ).toContain("no-such-cloud");
    expect((await client.store.db.execute(sql`SELECT 1 FROM vps_accounts WHERE id = ${`refused-${run}`}`)).rows).toHaveLength(0);
  });

  it("seals the token: no answer, event, audit row or table of the module holds it; create again is idempotent, other fields a CONFLICT", async () => {
    const id = `sealed-${run}`;
    clouds.set(`${id}.cloud.test`, new TestCloud());
    const token = `${GOOD_TOKEN}`;
    const config = { endpoint: `https://${id}.cloud.test`, token };
    const created = await ok("vps.accounts.create", { id, provider: "vps-test-cloud", config });
    expect(created).toMatchObject({ id, provider: "vps-test-cloud", providerVersion: "1", registered: true, created: true, pools: 0 });
    expect(created.config.token).toMatch(/^secret:\/\/[\w-]+$/);
    expect(created.config.endpoint).toBe(config.endpoint);

    expect(await ok("vps.accounts.create", { id, provider: "vps-test-cloud", config })).toMatchObject({ created: false });
    const other = await refused("vps.accounts.create", { id, provider: "vps-test-cloud", config: { ...config, region: "us" } }, "CONFLICT");
    expect(other.details!.fields).toEqual(["config.region"]);
    const otherToken = `tc-token-${run}-another-one`;
    const rotated = await refused(
      "vps.accounts.create",
      { id, provider: "vps-test-cloud", config: { ...config, token: otherToken } },
      "CONFLICT",
    );
    expect(rotated.details!.fields).toEqual(["config.token"]);
    expect(JSON.stringify(rotated)).not.toContain(otherToken);

    const offers = await ok("vps.accounts.offers", { id });
    expect(offers.flavors.map((f: { id: string }) => f.id)).toEqual(["tc-small", "tc-large"]);

    const shown = JSON.stringify([created, await ok("vps.accounts.get", { id }), await ok("vps.accounts.list", {}), offers]);
    expect(shown).not.toContain(token);
    const stored = await client.store.db.execute(sql`
      SELECT (SELECT coalesce(string_agg(data::text, ' '), '') FROM bc_events) AS events,
             (SELECT coalesce(string_agg(resource || method, ' '), '') FROM bc_audit) AS audit,
             (SELECT coalesce(string_agg(config::text, ' '), '') FROM vps_accounts) AS accounts,
             (SELECT coalesce(string_agg(sealed, ' '), '') FROM bc_secrets) AS secrets`);
    expect(JSON.stringify(stored.rows)).not.toContain(token);
  });

  it("update rotates the token (sealed anew, the old reference stays unused); delete waits until no pool uses the account", async () => {
    const w = await world("rotate");
    const before = (await ok("vps.accounts.get", { id: w.id })).config.token;
    const updated = await ok("vps.accounts.update", {
      id: w.id,
      config: { endpoint: `https://${w.id}.cloud.test`, token: `${GOOD_TOKEN}-x` },
    });
    expect(updated.config.token).not.toBe(before);
    expect(
      (await refused("vps.accounts.update", { id: w.id, config: { endpoint: "not a url" } }, "INVALID_ARGUMENT")).details!.issues,
    ).toBeDefined();
    // Left out, the token keeps its sealed value.
    const kept = await ok("vps.accounts.update", { id: w.id, config: { endpoint: `https://${w.id}.cloud.test`, region: "us" } });
    expect(kept.config).toEqual({ endpoint: `https://${w.id}.cloud.test`, region: "us", token: updated.config.token });
    const inUse = await refused("vps.accounts.delete", { id: w.id }, "FAILED_PRECONDITION");
    expect(inUse.details).toEqual({ account: w.id, pools: [w.id] });
  });
});

// ---------------------------------------------------------------- tenants, quotas, flavors, keys

describe("tenants and what their keys see", () => {
  it("a tenant's key sees and acts on its own tenant only: another's instances are NOT_FOUND", async () => {
    const a = await world("tenant-a");
    const b = await world("tenant-b");
    const keyA = await ok<{ id: string; key: string }>("iam.apiKeys.create", { name: "tenant a", roles: ["vps-tenant"] });
    expect(await ok("vps.tenants.addMember", { tenant: a.id, principal: `apikey:${keyA.id}` })).toMatchObject({
      members: [`apikey:${keyA.id}`],
    });
    await refused("vps.tenants.addMember", { tenant: b.id, principal: `apikey:${keyA.id}` }, "CONFLICT");

    const mine = await ok("vps.instances.create", { pool: a.id, flavor: a.id, name: "web-1", sshKeys: ["alice"] }, keyA.key);
    expect(mine).toMatchObject({ tenant: a.id, state: "pending", desired: "running", created: true });
    const theirs = await createInstance(b, "web-1");

    const listed = await ok("vps.instances.list", {}, keyA.key);
    expect(listed.instances.map((i: { id: string }) => i.id)).toEqual([mine.id]);
    expect((await ok("vps.instances.list", { tenant: b.id }, keyA.key)).instances).toEqual([]);
    for (const method of ["vps.instances.get", "vps.instances.stop", "vps.instances.delete"])
      expect((await refused(method, { id: theirs.id }, "NOT_FOUND", keyA.key)).message).toBe(`instance ${theirs.id} does not exist`);
    await refused("vps.instances.history", { instance: theirs.id }, "NOT_FOUND", keyA.key);
    await refused("vps.instances.create", { tenant: b.id, pool: b.id, flavor: b.id, name: "sneaky" }, "NOT_FOUND", keyA.key);
    await refused("vps.sshKeys.delete", { tenant: b.id, name: "alice" }, "NOT_FOUND", keyA.key);
    expect((await ok("vps.flavors.list", {}, keyA.key)).flavors.map((f: { id: string }) => f.id)).toEqual([a.id]);
    expect((await ok("vps.quotas.list", {}, keyA.key)).quotas.map((q: { tenant: string }) => q.tenant)).toEqual([a.id]);
    expect((await ok("vps.sshKeys.list", {}, keyA.key)).sshKeys.map((k: { tenant: string }) => k.tenant)).toEqual([a.id]);
    // The operator's methods are not the tenant's (IAM).
    await refused("vps.tenants.create", { id: `x-${run}` }, "PERMISSION_DENIED", keyA.key);
    await refused("vps.accounts.list", {}, "PERMISSION_DENIED", keyA.key);

    // Removed, the key keeps its role and sees nothing.
    await ok("vps.tenants.removeMember", { tenant: a.id, principal: `apikey:${keyA.id}` });
    expect((await refused("vps.instances.list", {}, "PERMISSION_DENIED", keyA.key)).message).toContain("not a member of any tenant");
    // An operator names the tenant.
    await refused("vps.instances.create", { pool: a.id, flavor: a.id, name: "web-2" }, "INVALID_ARGUMENT");
  });

  it("a create over the quota is refused with the quota, the usage and the request, and writes nothing", async () => {
    const w = await world("quota", { quota: { instances: 2 } });
    await createInstance(w, "one");
    await createInstance(w, "two");
    const count = async () =>
      (
        await client.store.db.execute(sql`
        SELECT (SELECT count(*)::int FROM vps_instances WHERE tenant_id = ${w.id}) AS instances,
               (SELECT count(*)::int FROM bc_events WHERE module = 'vps') AS events`)
      ).rows[0];
    const before = await count();
    const err = await refused("vps.instances.create", { tenant: w.id, pool: w.id, flavor: w.id, name: "three" }, "RESOURCE_EXHAUSTED");
    expect(err.details).toEqual({
      tenant: w.id,
      pool: w.id,
      exceeded: ["instances"],
      quota: { instances: 2, vcpus: 20, memoryMiB: 65536, diskGiB: 1000 },
      usage: { instances: 2, vcpus: 4, memoryMiB: 4096, diskGiB: 40 },
      request: { instances: 1, vcpus: 2, memoryMiB: 2048, diskGiB: 20 },
    });
    expect(await count()).toEqual(before);
    const [quota] = (await ok("vps.quotas.list", { tenant: w.id })).quotas;
    expect(quota.usage).toEqual({ instances: 2, vcpus: 4, memoryMiB: 4096, diskGiB: 40 });

    // vCPUs run out the same way; a pool without a quota is not offered.
    await ok("vps.quotas.set", { tenant: w.id, pool: w.id, instances: 10, vcpus: 5, memoryMiB: 65536, diskGiB: 1000 });
    expect(
      (await refused("vps.instances.create", { tenant: w.id, pool: w.id, flavor: w.id, name: "three" }, "RESOURCE_EXHAUSTED")).details!
        .exceeded,
    ).toEqual(["vcpus"]);
    const other = await world("quota-other");
    expect(
      (await refused("vps.instances.create", { tenant: w.id, pool: other.id, flavor: other.id, name: "x" }, "FAILED_PRECONDITION")).message,
    ).toContain("vps.quotas.set");
  });

  it("a flavor maps onto an offer and image the provider has, with the offer's sizes; anything else is refused by name", async () => {
    const w = await world("flavors");
    expect(await ok("vps.flavors.get", { id: w.id })).toMatchObject({
      offer: "tc-small",
      image: "debian-12",
      vcpus: 2,
      memoryMiB: 2048,
      diskGiB: 20,
    });
    const offer = await refused(
      "vps.flavors.create",
      { id: `xl-${run}`, pool: w.id, offer: "tc-huge", image: "debian-12" },
      "INVALID_ARGUMENT",
    );
    expect(offer.message).toBe("offer tc-huge is not among vps-test-cloud's flavors");
    expect(offer.details!.known).toEqual(["tc-small", "tc-large"]);
    expect(
      (await refused("vps.flavors.create", { id: `xl-${run}`, pool: w.id, offer: "tc-small", image: "windows" }, "INVALID_ARGUMENT"))
        .message,
    ).toContain("image windows");
    // tc-large is sold in us-1 only; the pool is in eu-1.
    expect(
      (await refused("vps.flavors.create", { id: `xl-${run}`, pool: w.id, offer: "tc-large", image: "debian-12" }, "INVALID_ARGUMENT"))
        .message,
    ).toContain("eu-1");
    expect((await client.store.db.execute(sql`SELECT 1 FROM vps_flavors WHERE id = ${`xl-${run}`}`)).rows).toHaveLength(0);
    await createInstance(w, "uses-it");
    await refused("vps.flavors.delete", { id: w.id }, "FAILED_PRECONDITION");
  });

  it("SSH keys are OpenSSH one-liners whose data matches their type", async () => {
    const w = await world("keys");
    await refused("vps.sshKeys.create", { tenant: w.id, name: "bad", publicKey: "ssh-ed25519 not-base64!" }, "INVALID_ARGUMENT");
    await refused(
      "vps.sshKeys.create",
      { tenant: w.id, name: "bad", publicKey: KEY.replace("ssh-ed25519", "ssh-rsa") },
      "INVALID_ARGUMENT",
    );
    await refused("vps.sshKeys.create", { tenant: w.id, name: "bad", publicKey: `${KEY}\nssh-ed25519 AAAA` }, "INVALID_ARGUMENT");
    expect(await ok("vps.sshKeys.create", { tenant: w.id, name: "alice", publicKey: KEY })).toMatchObject({ created: false });
    await refused("vps.sshKeys.create", { tenant: w.id, name: "alice", publicKey: KEY.replace("alice@laptop", "bob@desk") }, "CONFLICT");
  });
});

// ---------------------------------------------------------------- instances through the reconciler

describe("instances through the vps.instances reconciler", () => {
  it("a Worker request that creates or stops an instance runs the reconciler in its waitUntil, not at the next sweep", async () => {
    const w = await world("wake");
    // As the Worker's fetch handler is called: with an execution context.
    const asWorker = async (name: string, input: unknown) => {
      const ctx = createExecutionContext();
      const res = await compute.fetch(
        new Request(`https://bc.test/v1/${name}`, {
          method: "POST",
          headers: { authorization: `Bearer ${client.key}`, "content-type": "application/json" },
          body: JSON.stringify(input),
        }),
        env,
        ctx,
      );
      expect(res.status).toBe(200);
      await waitOnExecutionContext(ctx);
      return (await res.json()) as { id: string };
    };
    const { id } = await asWorker("vps.instances.create", { tenant: w.id, pool: w.id, flavor: w.id, name: "web", sshKeys: ["alice"] });
    // No pass was run here: the request's own reached the provider.
    expect(w.cloud.count("POST /servers")).toBe(1);
    expect((await instance(id)).state).not.toBe("pending");
    await passUntil(id, "running");
    await asWorker("vps.instances.stop", { id });
    expect(w.cloud.count(`POST /servers/${[...w.cloud.servers.keys()][0]}/actions/poweroff`)).toBe(1);
  });

  it("an instance's history is in the order the calls were made, across a change in the number of digits of its ids", async () => {
    const w = await world("history-order");
    const { id } = await createInstance(w, "web");
    // The next history ids end just below a power of ten (…98, …99, then …100): text order would differ.
    await client.store.db.execute(sql`
      SELECT setval('vps_instance_history_id_seq', (10 ^ ceil(log(greatest(nextval('vps_instance_history_id_seq'), 10) + 10)))::bigint - 3)`);
    await passUntil(id, "running");
    const entries = await historyOf(id);
    expect(entries.length).toBeGreaterThanOrEqual(3);
    const ids = entries.map((e: any) => Number(e.id));
    expect(ids).toEqual([...ids].sort((a, b) => a - b));
    expect(entries[0]).toMatchObject({ call: "find" });
  });

  it("creates the server once, with the SSH key and no join token, follows it to running, stopped, running, and deletes it", async () => {
    const w = await world("life");
    const { id } = await createInstance(w, "web");
    await pass();
    await pass();
    const running = await passUntil(id, "running");
    expect(w.cloud.count("POST /servers")).toBe(1);
    const [server] = [...w.cloud.servers.values()];
    expect(running).toMatchObject({ providerId: server!.id, addresses: server!.addresses, lastError: null });
    expect(server!.stamp).toBe(id);
    expect(server!.userData).toContain(JSON.stringify(KEY));
    expect(server!.userData).not.toMatch(/bcj_|join/);

    // Settled, it is left alone until it is due again.
    const requests = w.cloud.requests.length;
    await pass();
    expect(w.cloud.requests.length).toBe(requests);

    await ok("vps.instances.stop", { id });
    await passUntil(id, "stopped");
    expect(server!.status).toBe("stopped");
    await ok("vps.instances.start", { id });
    await passUntil(id, "running");
    // Asked twice before it happened: one reboot.
    await ok("vps.instances.reboot", { id });
    await ok("vps.instances.reboot", { id });
    await pass();
    await passUntil(id, "running");
    expect(w.cloud.count(`POST /servers/${server!.id}/actions/reboot`)).toBe(1);

    await ok("vps.instances.delete", { id });
    const deleted = await passUntil(id, "deleted");
    expect(deleted.addresses).toEqual([]);
    expect(w.cloud.servers.size).toBe(0);
    expect(w.cloud.count(`DELETE /servers/${server!.id}`)).toBe(1);
    expect(w.cloud.count("POST /servers")).toBe(1);

    const calls = (await historyOf(id)).map((e) => `${e.call}:${e.outcome}`);
    expect(calls.slice(0, 3)).toEqual(["find:ok", "create:ok", "operation:ok"]);
    expect(calls).toEqual(expect.arrayContaining(["powerOff:ok", "powerOn:ok", "reboot:ok", "delete:ok"]));
    const { events } = await ok("events.list", { subject: `vps/instances/${id}`, limit: 100 });
    expect(events.map((e: { type: string }) => e.type)).toEqual([
      "vps.instance.created",
      "vps.instance.creating",
      "vps.instance.running",
      "vps.instance.requested",
      "vps.instance.stopping",
      "vps.instance.stopped",
      "vps.instance.requested",
      "vps.instance.starting",
      "vps.instance.running",
      "vps.instance.requested",
      "vps.instance.requested",
      "vps.instance.deleting",
      "vps.instance.deleted",
    ]);
    expect((await ok("vps.quotas.list", { tenant: w.id })).quotas[0].usage.instances).toBe(0);
  });

  it("a step that dies after the provider created the server creates nothing more: the next one finds and adopts it", async () => {
    const w = await world("crash");
    const { id } = await createInstance(w, "crashy");
    const ctx = compute.moduleContext("vps", env, client.store);
    const died = reconcileInstance(ctx, id, {
      fetch: cloudFetch,
      hooks: {
        afterCall: (call) => {
          if (call === "create") throw new Error("the pass died here");
        },
      },
    });
    await expect(died).rejects.toThrow("the pass died here");
    expect(w.cloud.servers.size).toBe(1);
    expect(await instance(id)).toMatchObject({ state: "pending", providerId: null });
    // Its lease runs out.
    await pass();
    expect(w.cloud.count("GET /servers")).toBe(1);
    await client.store.db.execute(sql`UPDATE vps_instances SET lease_until = compute_now() - interval '1 second' WHERE id = ${id}`);

    // A step whose lease was taken over while it called writes nothing.
    await reconcileInstance(ctx, id, {
      fetch: cloudFetch,
      hooks: {
        afterCall: async () => {
          await client.store.db.execute(sql`UPDATE vps_instances SET lease_until = NULL WHERE id = ${id}`);
        },
      },
    });
    expect(await instance(id)).toMatchObject({ state: "pending", providerId: null });
    expect(await historyOf(id)).toEqual([]);

    await passUntil(id, "running");
    expect(w.cloud.count("POST /servers")).toBe(1);
    expect((await historyOf(id))[0]).toMatchObject({ call: "find", outcome: "ok", detail: { providerId: [...w.cloud.servers.keys()][0] } });
  });

  it("deleting an instance still being created waits for the create, then deletes it", async () => {
    const w = await world("early-delete");
    w.cloud.actionPolls = 3;
    const { id } = await createInstance(w, "early");
    await pass();
    expect(await instance(id)).toMatchObject({ state: "creating" });
    await ok("vps.instances.delete", { id });
    await pass();
    const [server] = [...w.cloud.servers.values()];
    expect(w.cloud.count(`DELETE /servers/${server!.id}`)).toBe(0);
    await passUntil(id, "deleted");
    expect(w.cloud.count(`DELETE /servers/${server!.id}`)).toBe(1);
    expect(w.cloud.servers.size).toBe(0);
    // It never ran, so it never was running.
    const { events } = await ok("events.list", { subject: `vps/instances/${id}`, type: "vps.instance.running" });
    expect(events).toEqual([]);
  });

  it("a capacity refusal fails only its instance, with a DRIVER_ERROR naming the provider and the reason", async () => {
    const w = await world("capacity");
    const full = await createInstance(w, "full");
    const fine = await createInstance(w, "fine");
    w.cloud.refuseCreateOf.add(full.id); // servers are named after their instance
    await pass();
    const failed = await instance(full.id);
    expect(failed.state).toBe("failed");
    expect(failed.lastError).toMatchObject({
      code: "DRIVER_ERROR",
      failure: "capacity",
      reason: "resource_unavailable",
      provider: "vps-test-cloud",
    });
    expect(failed.lastError.message).toContain("vps-test-cloud");
    await passUntil(fine.id, "running");
    const { events } = await ok("events.list", { subject: `vps/instances/${full.id}`, type: "vps.instance.failed" });
    expect(events[0].data.error).toMatchObject({ code: "DRIVER_ERROR" });
    // A failed instance is left alone until it is deleted; then it goes (it has no server).
    const requests = w.cloud.requests.length;
    await pass();
    expect(w.cloud.requests.length).toBe(requests);
    await refused("vps.instances.start", { id: full.id }, "FAILED_PRECONDITION");
    await ok("vps.instances.delete", { id: full.id });
    await passUntil(full.id, "deleted");
    expect(w.cloud.count("POST /servers")).toBe(2);
  });

  it("a wrong token is INVALID_CONFIG, recorded and not retried for an hour; updating the account retries at once", async () => {
    const wrong = "tc-token-wrong-wrong-wrong";
    const w = await world("wrong-token", { token: wrong });
    const { id } = await createInstance(w, "nope");
    await pass();
    const waiting = await instance(id);
    expect(waiting).toMatchObject({ state: "pending", lastError: { code: "INVALID_CONFIG", failure: "config", call: "find" } });
    const wait = (
      await client.store.db.execute(sql`
      SELECT extract(epoch FROM next_attempt_at - compute_now())::int AS seconds FROM vps_instances WHERE id = ${id}`)
    ).rows[0] as { seconds: number };
    expect(wait.seconds).toBeGreaterThan(3000);
    await pass();
    await pass();
    expect(w.cloud.requests).toHaveLength(1);
    const recorded = JSON.stringify([waiting, await historyOf(id)]);
    expect(recorded).not.toContain(wrong);

    await ok("vps.accounts.update", { id: w.id, config: { endpoint: `https://${w.id}.cloud.test`, token: GOOD_TOKEN } });
    await passUntil(id, "running");
    expect(w.cloud.count("POST /servers")).toBe(1);
  });

  it("a rate limit pauses every instance of the account until it resets; a 5xx backs off by attempts", async () => {
    const w = await world("rate-limit");
    // Ids that sort in this order: a pass takes due instances by id.
    const first = await createInstance(w, "first", { id: `${w.id}-1` });
    const second = await createInstance(w, "second", { id: `${w.id}-2` });
    w.cloud.requests = [];
    w.cloud.failNext.push({ status: 429, code: "rate_limit_exceeded" });
    await pass();
    // One call was made (the first instance's find); the second did not call into the spent window.
    expect(w.cloud.requests).toHaveLength(1);
    expect(await instance(first.id)).toMatchObject({
      state: "pending",
      lastError: { code: "UNAVAILABLE", failure: "transient", reason: "rate_limit_exceeded" },
    });
    const waits = await client.store.db.execute(sql`
      SELECT i.id, extract(epoch FROM i.next_attempt_at - compute_now())::int AS instance, extract(epoch FROM a.paused_until - compute_now())::int AS account
      FROM vps_instances i JOIN vps_accounts a ON a.id = ${w.id} WHERE i.id IN (${first.id}, ${second.id}) ORDER BY i.id`);
    for (const row of waits.rows as { instance: number; account: number }[]) {
      expect(row.account).toBeGreaterThan(25);
      expect(row.instance).toBeGreaterThan(25);
    }
    expect((await ok("vps.accounts.get", { id: w.id })).pausedUntil).not.toBeNull();
    await pass();
    expect(w.cloud.requests).toHaveLength(1);

    // The window resets (time passes); then a 503 backs off, and the next attempts go through.
    await client.store.db.execute(sql`UPDATE vps_accounts SET paused_until = compute_now() - interval '1 second' WHERE id = ${w.id}`);
    await client.store.db.execute(sql`UPDATE vps_instances SET next_attempt_at = compute_now() WHERE id IN (${first.id}, ${second.id})`);
    w.cloud.failNext.push({ status: 503, code: "unavailable" });
    await reconcileInstance(compute.moduleContext("vps", env, client.store), first.id, { fetch: cloudFetch });
    const backingOff = await client.store.db.execute(sql`
      SELECT attempts, extract(epoch FROM next_attempt_at - compute_now())::int AS seconds FROM vps_instances WHERE id = ${first.id}`);
    // The second failure in a row: 2^2 s.
    expect(backingOff.rows[0]).toMatchObject({ attempts: 2 });
    expect((backingOff.rows[0] as { seconds: number }).seconds).toBeGreaterThanOrEqual(3);
    expect((backingOff.rows[0] as { seconds: number }).seconds).toBeLessThanOrEqual(4);
    await client.store.db.execute(sql`UPDATE vps_instances SET next_attempt_at = compute_now() WHERE id = ${first.id}`);
    await passUntil(first.id, "running");
    await passUntil(second.id, "running");
    expect(w.cloud.count("POST /servers")).toBe(2);
    expect((await historyOf(first.id)).slice(0, 2).map((e) => `${e.call}:${e.outcome}:${e.detail.status ?? ""}`)).toEqual([
      "find:error:429",
      "find:error:503",
    ]);
  });

  it("a provider that does not answer holds up its own account's instances only, not another account's", async () => {
    const slow = await world("slow");
    const fast = await world("fast");
    let answer!: () => void;
    slow.cloud.hold = new Promise((resolve) => (answer = resolve));
    // The slow account's instance sorts first: one after another, the fast one would wait behind it.
    await createInstance(slow, "a", { id: `${slow.id}-a` });
    const { id } = await createInstance(fast, "b", { id: `${fast.id}-b` });
    const passing = pass();
    // The fast account's server is made while the slow provider has answered nothing.
    for (let i = 0; i < 200 && fast.cloud.count("POST /servers") === 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(fast.cloud.count("POST /servers")).toBe(1);
    expect(slow.cloud.count("POST /servers")).toBe(0);
    answer();
    await passing;
    await passUntil(id, "running");
  });

  it("an agent: bcd pool's instance gets a single-use join token in its user data and nowhere else", async () => {
    const w = await world("bcd", { agent: "bcd" });
    const { id } = await createInstance(w, "node-1");
    await passUntil(id, "running");
    const [server] = [...w.cloud.servers.values()];
    const token = /bcj_[0-9a-f]{16}_[A-Za-z0-9_-]{43}/.exec(server!.userData)?.[0];
    expect(token).toBeDefined();
    expect(server!.userData).toContain(JSON.stringify(KEY));
    expect(server!.userData).toContain(AGENT_URL);
    const minted = (
      await client.store.db.execute(sql`
      SELECT attestor, role, labels FROM bc_join_tokens WHERE id = ${token!.slice(4, 20)}`)
    ).rows[0];
    expect(minted).toEqual({ attestor: "provisioned", role: "node", labels: { "bc.dev/vps-instance": id, "bc.dev/vps-pool": w.id } });
    const everywhere = await client.store.db.execute(sql`
      SELECT (SELECT coalesce(string_agg(data::text, ' '), '') FROM bc_events) AS events,
             (SELECT coalesce(string_agg(detail::text, ' '), '') FROM vps_instance_history) AS history,
             (SELECT coalesce(string_agg(row_to_json(i)::text, ' '), '') FROM vps_instances i) AS instances`);
    expect(JSON.stringify(everywhere.rows)).not.toContain(token!.slice(21));
    expect(JSON.stringify(await ok("vps.instances.get", { id }))).not.toContain(token!.slice(21));
  });
});
