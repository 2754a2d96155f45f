// Walkthrough 2: a VPS provider written as a third party would (test/extensions/acme-cloud/,
// public entry points only). provider.ts is a defineProvider over Acme Cloud's HTTP API with an
// injectable fetch; cloud.ts is an in-memory emulator of that API behind a fetch function (SIMULATED:
// Acme Cloud does not exist). The provider passes the conformance cases live through the
// recording transport and again offline from the committed recording, then runs on a real
// server (workerd, Postgres) under the vps module.
//
// The recording: the live run's exchanges must equal test/extensions/acme-cloud/recording.json
// (a file snapshot, so a change of the adapter or the emulator shows). workerd writes no file of
// its own; vitest writes the snapshot for it when asked to record:
//   npx vitest run --project workers test/extensions/acme-cloud.test.ts -u
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute } from "better-compute";
import { ComputeError } from "better-compute/core";
import { runConformance } from "better-compute/conformance";
import { createTestClient, type TestClient } from "better-compute/testing";
import { providerConformanceCases, vps, type Fetch, type ProviderSubject } from "better-compute/vps";
import { recordingFetch, replayFetch, type Recording } from "better-compute/vps/record-replay";
import { AcmeCloud } from "./acme-cloud/cloud.ts";
import { acmeCloudProvider } from "./acme-cloud/provider.ts";
import committed from "./acme-cloud/recording.json";

const ENDPOINT = "https://api.acme-cloud.test";
const TOKEN = "acme_tok_5Rq8Lw2Zx7Nc4Vb1";
const WRONG_TOKEN = "acme_tok_0000000000000000";

const clientFor = (token: string, fetch: Fetch) =>
  acmeCloudProvider.client(acmeCloudProvider.manifest.parse({ endpoint: ENDPOINT, token }), { fetch });

/** Every conformance case gets fresh clients over the same transport (and so the same cloud). */
const subjectOver = (fetch: Fetch) => (): ProviderSubject => ({
  client: clientFor(TOKEN, fetch),
  wrongCredential: clientFor(WRONG_TOKEN, fetch),
  secrets: [TOKEN, WRONG_TOKEN],
});

describe("conformance", () => {
  const cases = providerConformanceCases();

  it("passes live against the emulator through the recording transport, leaving no server behind", async () => {
    const cloud = new AcmeCloud({ token: TOKEN });
    const recorder = recordingFetch(cloud.fetch, {
      secrets: [TOKEN, WRONG_TOKEN],
      about: "acme-cloud@1: providerConformanceCases() against test/extensions/acme-cloud/cloud.ts",
    });
    const report = await runConformance(cases, subjectOver(recorder.fetch));
    expect(report.failed).toEqual([]);
    expect(report.passed).toEqual(cases.map((c) => c.name));
    // Four cases create a server, each exactly one, and each deletes its own.
    expect(cloud.created).toBe(4);
    expect(cloud.liveServers()).toEqual([]);

    const text = `${JSON.stringify(recorder.recording(), null, 2)}\n`;
    expect(text).not.toContain(TOKEN);
    expect(text).not.toContain(WRONG_TOKEN);
    await expect(
      text,
      "the live run differs from the committed recording: re-record with -u (see the top of this file)",
    ).toMatchFileSnapshot("./acme-cloud/recording.json");
  });

  it("passes again offline from the committed recording, every exchange consumed", async () => {
    const replay = replayFetch(committed as Recording, { secrets: [TOKEN, WRONG_TOKEN] });
    const report = await runConformance(cases, subjectOver(replay.fetch));
    expect(report.failed).toEqual([]);
    expect(report.passed).toHaveLength(cases.length);
    replay.assertConsumed();
  });

  it("a wrong account token is a configuration error, asked once and never retried, quoting no token", async () => {
    const cloud = new AcmeCloud({ token: TOKEN });
    let requests = 0;
    const counted: Fetch = (input, init) => (requests++, cloud.fetch(input, init));
    const err = await clientFor(WRONG_TOKEN, counted)
      .offers()
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(ComputeError);
    expect(err).toMatchObject({
      code: "INVALID_CONFIG",
      details: { provider: "acme-cloud", failure: "config", status: 401, reason: "unauthorized" },
    });
    expect((err as ComputeError).message).toMatch(/^acme-cloud: /);
    expect(JSON.stringify({ message: (err as ComputeError).message, details: (err as ComputeError).details })).not.toContain(WRONG_TOKEN);
    expect(requests).toBe(1);
  });

  it("an account at its server limit is a capacity error (DRIVER_ERROR) naming the provider and the reason", async () => {
    const cloud = new AcmeCloud({ token: TOKEN, serverLimit: 0 });
    const request = { instanceId: "i-full", name: "full", flavor: "a1.small", image: "debian-13", location: "fra", sshKeys: [] };
    await expect(clientFor(TOKEN, cloud.fetch).create(request)).rejects.toMatchObject({
      code: "DRIVER_ERROR",
      message: expect.stringMatching(/^acme-cloud: .*server_limit_reached/),
      details: { provider: "acme-cloud", failure: "capacity", reason: "server_limit_reached", status: 422 },
    });
    expect(cloud.created).toBe(0);
  });
});

describe("on a real server", () => {
  const cloud = new AcmeCloud({ token: TOKEN });
  /** TEST HOOK: the first pass that creates a server dies after Acme answered, before its commit. */
  let dieAfterCreate = true;
  const compute = betterCompute({
    modules: [
      vps({
        providers: [acmeCloudProvider],
        fetch: cloud.fetch,
        hooks: {
          afterCall(call) {
            if (call !== "create" || !dieAfterCreate) return;
            dieAfterCreate = false;
            throw new Error("the pass died after the provider answered");
          },
        },
      }),
    ],
  });
  const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl globex@laptop";
  let client: TestClient;
  let tenantKey: string;
  /** Every body the API answered: none may carry the token. */
  const answers: unknown[] = [];

  beforeAll(async () => {
    client = await createTestClient(compute, env);
  });
  afterAll(() => client?.close());

  async function ok<T = any>(name: string, input: unknown, key?: string): Promise<T> {
    const res = await client.call<T>(name, input, key ? { key } : {});
    answers.push(res.body);
    expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
    return res.body;
  }

  const instance = (id: string) => ok("vps.instances.get", { id }, tenantKey);

  /** Runs reconciler passes until the instance is in `state` (each pass moves it one provider call on). */
  async function passUntil(id: string, state: string) {
    for (let pass = 0; pass < 30; pass++) {
      if ((await instance(id)).state === state) return instance(id);
      await compute.reconcile(env, client.store);
    }
    throw new Error(`instance ${id} did not become ${state}: ${JSON.stringify(await instance(id))}`);
  }

  it("an operator registers the account with its token sealed, offers a provider pool to a tenant with a quota, and maps a flavor onto the offer", async () => {
    const account = await ok("vps.accounts.create", { id: "acme", provider: "acme-cloud", config: { endpoint: ENDPOINT, token: TOKEN } });
    expect(account).toMatchObject({
      provider: "acme-cloud",
      providerVersion: "1",
      config: { endpoint: ENDPOINT, token: expect.stringMatching(/^secret:\/\//) },
    });

    const pool = await ok("vps.pools.create", { id: "acme-fra", account: "acme", class: "provider", agent: "none", location: "fra" });
    expect(pool).toMatchObject({ class: "provider", agent: "none", provider: "acme-cloud" });
    await ok("vps.tenants.create", { id: "globex", name: "Globex" });
    await ok("vps.quotas.set", { tenant: "globex", pool: "acme-fra", instances: 2, vcpus: 8, memoryMiB: 16384, diskGiB: 200 });
    // The flavor takes its sizes from Acme's offer.
    const flavor = await ok("vps.flavors.create", { id: "acme-small", pool: "acme-fra", offer: "a1.small", image: "debian-13" });
    expect(flavor).toMatchObject({ offer: "a1.small", image: "debian-13", vcpus: 1, memoryMiB: 2048, diskGiB: 25 });

    // The tenant's key: the vps-tenant role, and membership of the tenant.
    const minted = await ok<{ id: string; key: string }>("iam.apiKeys.create", { name: "globex", roles: ["vps-tenant"] });
    tenantKey = minted.key;
    await ok("vps.tenants.addMember", { tenant: "globex", principal: `apikey:${minted.id}` });
    await ok("vps.sshKeys.create", { name: "laptop", publicKey: KEY }, tenantKey);
    expect((await ok("vps.flavors.list", {}, tenantKey)).flavors.map((f: any) => f.id)).toEqual(["acme-small"]);
  });

  it("a wrong account token is a configuration error, quoting no token", async () => {
    await ok("vps.accounts.create", { id: "acme-wrong", provider: "acme-cloud", config: { endpoint: ENDPOINT, token: WRONG_TOKEN } });
    const res = await client.call("vps.accounts.offers", { id: "acme-wrong" });
    answers.push(res.body);
    expect(res.body).toMatchObject({
      code: "INVALID_CONFIG",
      message: expect.stringContaining("acme-cloud"),
      details: { failure: "config" },
    });
    expect(JSON.stringify(res.body)).not.toContain(WRONG_TOKEN);
    await ok("vps.accounts.delete", { id: "acme-wrong" });
  });

  let web1: string;
  let web2: string;
  let server1: number;

  it("the tenant's instance is created once: a pass that died after the create is retried and adopts the server", async () => {
    web1 = (await ok("vps.instances.create", { pool: "acme-fra", flavor: "acme-small", name: "web-1", sshKeys: ["laptop"] }, tenantKey)).id;

    await compute.reconcile(env, client.store);
    // Acme made the server, but the pass died before recording it.
    expect(cloud.created).toBe(1);
    expect(await instance(web1)).toMatchObject({ state: "pending", providerId: null });
    // The dead pass's lease runs out; the next pass finds the server by its stamp.
    await client.store.db.execute(sql`UPDATE vps_instances SET lease_until = NULL WHERE id = ${web1}`);

    const running = await passUntil(web1, "running");
    await compute.reconcile(env, client.store);
    expect(cloud.created).toBe(1);
    const [server] = cloud.liveServers();
    server1 = server!.id;
    expect(server).toMatchObject({
      name: web1, // servers are named after the instance id; the hostname is in the user data
      status: "active",
      size: "a1.small",
      image: "debian-13",
      region: "fra",
      labels: { "bc-instance": web1 },
    });
    expect(running).toMatchObject({ providerId: String(server1), addresses: [server!.ipv4], vcpus: 1, memoryMiB: 2048, diskGiB: 25 });
  });

  it("its user data carries the tenant's SSH key and no join token", async () => {
    const userData = cloud.servers.get(server1)!.userData!;
    expect(userData).toMatch(/^#cloud-config\n/);
    expect(userData).toContain(KEY);
    expect(userData).not.toMatch(/bcj_|join/i);
    expect(cloud.servers.get(server1)!.sshKeys).toEqual([KEY]);
  });

  it("a third instance over the tenant's quota is refused with the quota, the usage and the request, and nothing is written", async () => {
    web2 = (await ok("vps.instances.create", { pool: "acme-fra", flavor: "acme-small", name: "web-2", sshKeys: ["laptop"] }, tenantKey)).id;
    const res = await client.call("vps.instances.create", { pool: "acme-fra", flavor: "acme-small", name: "web-3" }, { key: tenantKey });
    expect(res.status).toBe(429);
    expect(res.body).toMatchObject({
      code: "RESOURCE_EXHAUSTED",
      details: {
        tenant: "globex",
        pool: "acme-fra",
        exceeded: ["instances"],
        quota: { instances: 2, vcpus: 8, memoryMiB: 16384, diskGiB: 200 },
        usage: { instances: 2, vcpus: 2, memoryMiB: 4096, diskGiB: 50 },
        request: { instances: 1, vcpus: 1, memoryMiB: 2048, diskGiB: 25 },
      },
    });
    expect((await ok("vps.instances.list", {}, tenantKey)).instances.map((i: any) => i.name).sort()).toEqual(["web-1", "web-2"]);
  });

  it("is followed to stopped (the server powered off) and deleted (gone at Acme)", async () => {
    await ok("vps.instances.stop", { id: web1 }, tenantKey);
    await passUntil(web1, "stopped");
    expect(cloud.servers.get(server1)!.status).toBe("off");

    await ok("vps.instances.delete", { id: web1 }, tenantKey);
    await passUntil(web1, "deleted");
    expect(cloud.servers.has(server1)).toBe(false);

    const { entries } = await ok("vps.instances.history", { instance: web1 }, tenantKey);
    const calls = entries.map((e: any) => e.call);
    // Adopted by find(), never created a second time.
    expect(calls[0]).toBe("find");
    expect(calls).not.toContain("create");
    expect(calls).toEqual(expect.arrayContaining(["powerOff", "delete"]));

    // The second instance, created meanwhile by the same passes, goes the same way: nothing is left at Acme.
    await ok("vps.instances.delete", { id: web2 }, tenantKey);
    await passUntil(web2, "deleted");
    expect(cloud.liveServers()).toEqual([]);
    expect(cloud.created).toBe(2);
  });

  it("the pool never gets a node, nor a join token for one", async () => {
    for (const table of ["bc_nodes", "bc_join_tokens"]) {
      const found = await client.store.db.execute(sql`
        SELECT count(*)::int AS n FROM ${sql.identifier(table)}
        WHERE labels->>'bc.dev/vps-pool' = 'acme-fra' OR labels->>'bc.dev/vps-instance' IN (${web1}, ${web2})`);
      expect(found.rows, table).toEqual([{ n: 0 }]);
    }
  });

  it("the account's token is in no answer, no event and no table", async () => {
    expect(JSON.stringify(answers)).not.toContain(TOKEN);
    const { events } = await ok("events.list", { subject: "vps/accounts/acme" });
    expect(events.map((e: any) => e.type)).toEqual(["vps.account.created"]);
    const tables = await client.store.db.execute(sql`
      SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1`);
    const names = (tables.rows as { table_name: string }[]).map((t) => t.table_name);
    expect(names).toEqual(expect.arrayContaining(["bc_events", "bc_secrets", "vps_accounts", "vps_instance_history"]));
    for (const table of names) {
      const found = await client.store.db.execute(
        sql`SELECT count(*)::int AS n FROM ${sql.identifier(table)} AS t WHERE t::text LIKE ${`%${TOKEN}%`} OR t::text LIKE ${`%${WRONG_TOKEN}%`}`,
      );
      expect(found.rows, table).toEqual([{ n: 0 }]);
    }
  });
});
