// The Hetzner Cloud provider (plugins/hetzner-cloud) against its emulator over real HTTP: the
// provider conformance cases live through the recording transport and offline from the committed
// recording, the official Python client driving the emulator unmodified, the emulator's fidelity
// to the real API (envelopes, pagination, label selectors, locking, rate limits, errors), and the
// adapter under injected faults. The emulator is SIMULATED (no Hetzner account is involved).
//
// Record again (after a change of the adapter or of the conformance cases):
//   BC_RECORD=1 npx vitest run --project node test/node/provider-hetzner-cloud.test.ts
import { execFile, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import * as prettier from "prettier";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { runConformance } from "better-compute/conformance";
import { ComputeError } from "better-compute/core";
import { hetznerCloudClient, hetznerCloudProvider, INSTANCE_LABEL } from "better-compute/hetzner-cloud";
import { startHetznerCloudEmulator, type HetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import { recordingFetch, replayFetch, type Recording } from "better-compute/vps/record-replay";
import {
  providerConformanceCases,
  type CreateServerRequest,
  type Fetch,
  type Operation,
  type ProviderClient,
  type ProviderSubject,
} from "better-compute/vps";
import { repoRoot } from "../../local/node-store.ts";

const TOKEN = "hcloud-test-token-Zx81Qm0Lp3Vb7Nc2";
const WRONG_TOKEN = "hcloud-wrong-token-4Kd9Tr6Ys1Wq8Ee5";
const RECORDING = path.join(repoRoot, "test/recordings/hetzner-cloud.json");
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop";

const clientFor = (endpoint: string, token: string, fetch: Fetch = globalThis.fetch) =>
  hetznerCloudProvider.client(hetznerCloudProvider.manifest.parse({ token, endpoint }), { fetch });

/** A raw call, as any client of the API would make it. */
async function api(emu: HetznerCloudEmulator, method: string, path: string, body?: unknown, token = TOKEN) {
  const response = await fetch(emu.url + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: text ? JSON.parse(text) : undefined };
}

const request = (n: number, extra: Partial<CreateServerRequest> = {}): CreateServerRequest => ({
  instanceId: `inst-${n}`,
  name: `vps-${n}`,
  flavor: "cx22",
  image: "ubuntu-24.04",
  location: "fsn1",
  sshKeys: [{ name: "laptop", publicKey: KEY }],
  userData: `#cloud-config\nhostname: vps-${n}\n`,
  ...extra,
});

/** Polls an operation to its end (the emulator's actions take 0 ms unless told otherwise). */
async function settle(client: ProviderClient, op: Operation | void) {
  for (let i = 0; op && i < 200; i++) {
    const state = await client.operation(op.id);
    if (state.state !== "running") return state;
    await new Promise((r) => setTimeout(r, 20));
  }
  return { state: "succeeded" as const };
}

const errorOf = (promise: Promise<unknown>) =>
  promise.then(
    () => undefined,
    (e: unknown) => e as ComputeError,
  );

describe("conformance", () => {
  const cases = providerConformanceCases();
  const offer = { flavor: "cx22", image: "ubuntu-24.04", location: "fsn1" };
  const subjectOver = (endpoint: string, fetch: Fetch) => (): ProviderSubject => ({
    client: clientFor(endpoint, TOKEN, fetch),
    wrongCredential: clientFor(endpoint, WRONG_TOKEN, fetch),
    secrets: [TOKEN, WRONG_TOKEN],
    offer,
  });
  const requestsOf = (recording: Recording) => recording.exchanges.map((e) => e.request);

  it("passes live against the emulator through the recording transport, asking what the committed recording asked", async () => {
    const emu = await startHetznerCloudEmulator({ token: TOKEN });
    try {
      const recorder = recordingFetch(globalThis.fetch, {
        secrets: [TOKEN, WRONG_TOKEN],
        about: "hetzner-cloud@1: providerConformanceCases() against testing/providers/hetzner-cloud.ts",
      });
      const report = await runConformance(cases, subjectOver(emu.url, recorder.fetch));
      expect(report.failed).toEqual([]);
      expect(report.passed).toEqual(cases.map((c) => c.name));
      // Four cases create a server, exactly one each (the second create adopts), and delete it.
      expect(emu.counters.serversCreated).toBe(4);
      expect(emu.servers()).toEqual([]);

      const recording = recorder.recording();
      const text = await prettier.format(JSON.stringify(recording), { ...(await prettier.resolveConfig(RECORDING)), parser: "json" });
      expect(text).not.toContain(TOKEN);
      expect(text).not.toContain(WRONG_TOKEN);
      if (process.env.BC_RECORD === "1") fs.writeFileSync(RECORDING, text);
      const committed = JSON.parse(fs.readFileSync(RECORDING, "utf8")) as Recording;
      expect(requestsOf(recording)).toEqual(requestsOf(committed));
    } finally {
      await emu.stop();
    }
  });

  it("passes again offline from the committed recording, every exchange consumed", async () => {
    const committed = JSON.parse(fs.readFileSync(RECORDING, "utf8")) as Recording;
    const replay = replayFetch(committed, { secrets: [TOKEN, WRONG_TOKEN] });
    const report = await runConformance(cases, subjectOver("https://api.hetzner.cloud/v1", replay.fetch));
    expect(report.failed).toEqual([]);
    expect(report.passed).toHaveLength(cases.length);
    replay.assertConsumed();
  });
});

const hasHcloud = spawnSync("/usr/bin/python3", ["-c", "import hcloud"]).status === 0;

describe("the official Python client (Debian's python3-hcloud)", () => {
  it.skipIf(!hasHcloud)(
    "drives the emulator unmodified: catalogue, SSH key, create and wait, power off and on, label selector, delete (skipped without python3-hcloud)",
    async () => {
      const emu = await startHetznerCloudEmulator({ token: TOKEN, actionDurationMs: 60 });
      try {
        // The client retries a rate-limited call by itself: one is injected.
        emu.setFaults({ next: { rateLimit: 1 } });
        const script = path.join(repoRoot, "test/support/hetzner-cloud-client.py");
        const stdout = await new Promise<string>((resolve, reject) =>
          execFile("/usr/bin/python3", [script, emu.url, TOKEN], { timeout: 30_000 }, (err, out, stderr) =>
            err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(out),
          ),
        );
        const seen = JSON.parse(stdout);
        expect(seen).toMatchObject({
          server_types: expect.arrayContaining(["cx22", "cpx11", "cax11"]),
          locations: ["ash", "fsn1", "hel1", "hil", "nbg1", "sin"],
          images: ["debian-12", "ubuntu-22.04", "ubuntu-24.04"],
          key_fingerprint: "python-client",
          // An SSH key was given: no root password.
          root_password: null,
          created: { status: "running", datacenter: "nbg1", server_type: "cx22", image: "ubuntu-24.04" },
          after_power_off: "off",
          after_power_on: "running",
          selected: ["py-server-1"],
          not_selected: [],
          after_delete: "not_found",
          keys_left: 0,
        });
        expect(emu.counters.serversCreated).toBe(1);
        expect(emu.counters.faults.rateLimit).toBe(1);
        expect(emu.servers()).toEqual([]);
      } finally {
        await emu.stop();
      }
    },
  );
});

describe("the emulator answers as the real API does", () => {
  let emu: HetznerCloudEmulator;
  beforeEach(async () => {
    emu = await startHetznerCloudEmulator({ token: TOKEN });
  });
  afterEach(() => emu.stop());

  const create = (name: string, labels: Record<string, string> = {}, extra: Record<string, unknown> = {}) =>
    api(emu, "POST", "/servers", { name, server_type: "cx22", image: "ubuntu-24.04", labels, ...extra });

  it("POST /servers is 201 with server, action, next_actions and root_password; user_data is never returned", async () => {
    const created = await create("web-1", { role: "web" }, { user_data: "#cloud-config\nsecret: only-for-the-server\n" });
    expect(created.status).toBe(201);
    expect(Object.keys(created.json).sort()).toEqual(["action", "next_actions", "root_password", "server"]);
    expect(created.json.server).toMatchObject({
      status: "initializing",
      public_net: {
        ipv4: { id: expect.any(Number), ip: expect.any(String), blocked: false },
        ipv6: { id: expect.any(Number) },
        floating_ips: [],
      },
      server_type: { name: "cx22", cores: 2 },
      datacenter: { location: { name: "fsn1" }, server_types: { available: expect.any(Array) } },
      image: { name: "ubuntu-24.04", architecture: "x86" },
      labels: { role: "web" },
    });
    expect(created.json.action).toMatchObject({ command: "create_server", status: "running", finished: null, error: null });
    expect(created.json.next_actions).toMatchObject([{ command: "start_server", status: "running" }]);
    // No SSH key: the root password is generated and returned once.
    expect(created.json.root_password).toEqual(expect.any(String));

    const id = created.json.server.id;
    const read = await api(emu, "GET", `/servers/${id}`);
    expect(read.json.server.status).toBe("running");
    expect(read.text).not.toContain("only-for-the-server");
    expect(emu.userData(id)).toBe("#cloud-config\nsecret: only-for-the-server\n");
    const action = await api(emu, "GET", `/actions/${created.json.action.id}`);
    expect(action.json.action).toMatchObject({ status: "success", progress: 100, finished: expect.stringMatching(/\+00:00$/) });
  });

  it("lists with exactly the six pagination keys, at most 50 a page, and a Link header", async () => {
    for (let i = 1; i <= 3; i++) await create(`s-${i}`);
    const page1 = await api(emu, "GET", "/servers?per_page=2");
    expect(page1.json.servers.map((s: { name: string }) => s.name)).toEqual(["s-1", "s-2"]);
    expect(page1.json.meta).toEqual({
      pagination: { page: 1, per_page: 2, previous_page: null, next_page: 2, last_page: 2, total_entries: 3 },
    });
    expect(page1.headers.get("link")).toContain('rel="next"');
    const page2 = await api(emu, "GET", "/servers?per_page=2&page=2");
    expect(page2.json.servers.map((s: { name: string }) => s.name)).toEqual(["s-3"]);
    expect(page2.json.meta.pagination.next_page).toBeNull();
    expect((await api(emu, "GET", "/servers?per_page=500")).json.meta.pagination.per_page).toBe(50);
  });

  it("filters by label selector with all seven operators and refuses a reserved or malformed label", async () => {
    await create("a", { env: "prod", tier: "web" });
    await create("b", { env: "dev", tier: "db" });
    await create("c", { env: "prod" });
    const select = async (selector: string) =>
      (await api(emu, "GET", `/servers?label_selector=${encodeURIComponent(selector)}`)).json.servers.map((s: { name: string }) => s.name);
    expect(await select("env=prod")).toEqual(["a", "c"]);
    expect(await select("env==dev")).toEqual(["b"]);
    expect(await select("env!=prod")).toEqual(["b"]);
    expect(await select("tier")).toEqual(["a", "b"]);
    expect(await select("!tier")).toEqual(["c"]);
    expect(await select("env in (dev, test)")).toEqual(["b"]);
    expect(await select("tier notin (web)")).toEqual(["b", "c"]);
    expect(await select("env=prod,tier")).toEqual(["a"]);
    const bad = await api(emu, "GET", `/servers?label_selector=${encodeURIComponent("env=(prod")}`);
    expect(bad.status).toBe(400);
    expect(bad.json.error).toMatchObject({ code: "invalid_input", details: { fields: [{ name: "label_selector" }] } });
    const reserved = await create("d", { "hetzner.cloud/owner": "me" });
    expect(reserved.status).toBe(400);
    expect(reserved.json.error.message).toContain("reserved");
    expect((await create("e", { note: "x".repeat(64) })).status).toBe(400);
  });

  it("answers every error with code, message and details, and a taken name with 409 uniqueness_error", async () => {
    const missing = await api(emu, "GET", "/servers/1");
    expect(missing.status).toBe(404);
    expect(missing.json).toEqual({ error: { code: "not_found", message: "server not found", details: {} } });
    await create("taken");
    const again = await create("taken");
    expect(again.status).toBe(409);
    expect(again.json.error).toEqual({
      code: "uniqueness_error",
      message: "server name is already used",
      details: { fields: [{ name: "name" }] },
    });
    const unauthorized = await api(emu, "GET", "/servers", undefined, WRONG_TOKEN);
    expect(unauthorized.status).toBe(401);
    expect(unauthorized.json.error).toMatchObject({ code: "unauthorized", details: {} });
    expect(unauthorized.text).not.toContain(WRONG_TOKEN);
    const notJson = await fetch(`${emu.url}/servers`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: "{" });
    expect(await notJson.json()).toMatchObject({ error: { code: "json_error", details: {} } });
  });

  it("is 423 locked while an action runs on the server, and runs power actions as 201 {action}", async () => {
    emu.setActionDurationMs(60_000);
    const { json } = await create("busy");
    const locked = await api(emu, "POST", `/servers/${json.server.id}/actions/poweroff`);
    expect(locked.status).toBe(423);
    expect(locked.json.error).toEqual({ code: "locked", message: "cannot perform operation because server is locked", details: {} });
    expect((await api(emu, "DELETE", `/servers/${json.server.id}`)).status).toBe(423);
    expect(emu.counters.locked).toBe(2);

    emu.setActionDurationMs(0);
    const idle = (await create("idle")).json.server.id;
    await api(emu, "GET", `/servers/${idle}`); // its actions end
    const off = await api(emu, "POST", `/servers/${idle}/actions/poweroff`);
    expect(off.status).toBe(201);
    expect(Object.keys(off.json)).toEqual(["action"]);
    expect(off.json.action).toMatchObject({ command: "stop_server", status: "running", resources: [{ id: idle, type: "server" }] });
    expect((await api(emu, "GET", `/servers/${idle}`)).json.server.status).toBe("off");
    const both = await api(emu, "GET", `/actions?id=${json.action.id}&id=${off.json.action.id}`);
    expect(both.json.actions.map((a: { status: string }) => a.status)).toEqual(["running", "success"]);
    expect((await api(emu, "GET", "/actions")).status).toBe(400);
    const deleted = await api(emu, "DELETE", `/servers/${idle}`);
    expect(deleted.status).toBe(200);
    expect(deleted.json.action.command).toBe("delete_server");
    expect((await api(emu, "GET", `/servers/${idle}`)).status).toBe(404);
  });

  it("keeps SSH keys unique by name and by key, finds them by fingerprint and deletes them with 204 and no body", async () => {
    const created = await api(emu, "POST", "/ssh_keys", { name: "laptop", public_key: KEY });
    expect(created.status).toBe(201);
    expect(created.json.ssh_key).toMatchObject({ name: "laptop", fingerprint: expect.stringMatching(/^([0-9a-f]{2}:){15}[0-9a-f]{2}$/) });
    expect(
      (await api(emu, "POST", "/ssh_keys", { name: "laptop", public_key: KEY.replace("AAAAIOM", "AAAAIOX") })).json.error.details,
    ).toEqual({
      fields: [{ name: "name" }],
    });
    expect((await api(emu, "POST", "/ssh_keys", { name: "other", public_key: KEY })).json.error.details).toEqual({
      fields: [{ name: "public_key" }],
    });
    const byFingerprint = await api(emu, "GET", `/ssh_keys?fingerprint=${encodeURIComponent(created.json.ssh_key.fingerprint)}`);
    expect(byFingerprint.json.ssh_keys.map((k: { id: number }) => k.id)).toEqual([created.json.ssh_key.id]);
    const deleted = await api(emu, "DELETE", `/ssh_keys/${created.json.ssh_key.id}`);
    expect(deleted.status).toBe(204);
    expect(deleted.text).toBe("");
  });

  it("puts the rate-limit headers on every answer and answers 429 rate_limit_exceeded once the bucket is spent", async () => {
    emu.setRateLimit({ limit: 2, refillPerSecond: 0.01 });
    const first = await api(emu, "GET", "/locations");
    expect(first.headers.get("ratelimit-limit")).toBe("2");
    expect(first.headers.get("ratelimit-remaining")).toBe("1");
    expect(Number(first.headers.get("ratelimit-reset"))).toBeGreaterThanOrEqual(Math.floor(Date.now() / 1000));
    expect((await api(emu, "GET", "/servers/1")).headers.get("ratelimit-remaining")).toBe("0");
    const spent = await api(emu, "GET", "/locations");
    expect(spent.status).toBe(429);
    expect(spent.json.error).toMatchObject({ code: "rate_limit_exceeded", details: {} });
    expect(spent.headers.get("ratelimit-remaining")).toBe("0");
    expect(emu.counters.overLimit).toBe(1);
  });
});

describe("the adapter", () => {
  let emu: HetznerCloudEmulator;
  let client: ProviderClient;
  beforeEach(async () => {
    emu = await startHetznerCloudEmulator({ token: TOKEN });
    client = clientFor(emu.url, TOKEN);
  });
  afterEach(() => emu.stop());

  it("offers the server types with their sizes and locations, system images by name, and locations", async () => {
    const offers = await client.offers();
    expect(offers.flavors).toContainEqual({
      id: "cx22",
      name: "cx22",
      vcpus: 2,
      memoryMiB: 4096,
      diskGiB: 40,
      locations: ["fsn1", "nbg1", "hel1"],
    });
    // A deprecated type is not offered.
    expect(offers.flavors.map((f) => f.id)).not.toContain("cx11");
    expect(offers.images).toContainEqual({ id: "ubuntu-24.04", name: "Ubuntu 24.04" });
    expect(new Set(offers.images.map((i) => i.id)).size).toBe(offers.images.length);
    expect(offers.locations).toContainEqual({ id: "fsn1", name: "Falkenstein DC Park 1" });
  });

  it("creates a server stamped with its instance id, its user data only in the create, its key uploaded once", async () => {
    const { server, operation } = await client.create(request(1));
    expect(server).toMatchObject({ name: "vps-1", status: "creating", instanceId: "inst-1" });
    expect(server.addresses).toEqual([expect.stringMatching(/^203\.0\.113\.\d+$/), expect.stringMatching(/^2001:db8:[0-9a-f]+::1$/)]);
    // The operation covers create_server and its start_server next action.
    expect(operation!.id).toMatch(/^\d+,\d+$/);
    expect(await settle(client, operation)).toEqual({ state: "succeeded" });
    expect(await client.get(server.id)).toMatchObject({ status: "running" });

    const [live] = emu.servers();
    expect(live).toMatchObject({ labels: { [INSTANCE_LABEL]: "inst-1" }, serverType: "cx22", image: "ubuntu-24.04", location: "fsn1" });
    expect(live!.userData).toBe("#cloud-config\nhostname: vps-1\n");

    await client.create(request(2, { sshKeys: [{ name: "laptop", publicKey: KEY }] }));
    // Same key under another name: the project's key is reused, not uploaded again.
    await client.create(request(3, { sshKeys: [{ name: "desk", publicKey: KEY }] }));
    const keys = (await api(emu, "GET", "/ssh_keys")).json.ssh_keys;
    expect(keys).toHaveLength(1);
    expect(emu.servers().every((s) => s.sshKeys.length === 1 && s.sshKeys[0] === keys[0].id)).toBe(true);
  });

  it("adopts the server of a create whose answer was lost, and refuses a name another instance's server holds", async () => {
    // The create reached the API but its answer never came back.
    const lost = await api(emu, "POST", "/servers", {
      name: "vps-7",
      server_type: "cx22",
      image: "ubuntu-24.04",
      labels: { [INSTANCE_LABEL]: "inst-7" },
    });
    const again = await client.create(request(7));
    expect(again).toEqual({ server: expect.objectContaining({ id: String(lost.json.server.id), instanceId: "inst-7" }) });
    expect(emu.counters.serversCreated).toBe(1);
    expect(emu.counters.calls["POST /servers"]).toBe(2);

    const err = await errorOf(client.create(request(8, { name: "vps-7" })));
    expect(err).toMatchObject({
      code: "DRIVER_ERROR",
      details: { provider: "hetzner-cloud", failure: "rejected", reason: "uniqueness_error" },
    });
    expect(err!.message).toBe("hetzner-cloud: a server named vps-7 already exists and is not instance inst-8's");
    expect(emu.counters.serversCreated).toBe(1);
  });

  it("finds by the stamp through a label selector, lists every page, reads a gone server as null and deletes it again", async () => {
    for (let i = 0; i < 53; i++) await api(emu, "POST", "/servers", { name: `bulk-${i}`, server_type: "cpx11", image: "debian-12" });
    await client.create(request(1));
    expect(await client.list()).toHaveLength(54);
    expect(emu.counters.calls["GET /servers"]).toBe(2);
    const found = await client.find("inst-1");
    expect(found).toMatchObject({ name: "vps-1", instanceId: "inst-1" });
    expect(await client.find("inst-2")).toBeNull();
    expect(await client.find("not a label value")).toBeNull();

    expect(await settle(client, await client.delete(found!.id))).toEqual({ state: "succeeded" });
    expect(await client.get(found!.id)).toBeNull();
    expect(await client.delete(found!.id)).toBeUndefined();
    expect(await client.get("not-a-number")).toBeNull();
  });

  it("maps the power actions onto statuses and reports a failed action with its error", async () => {
    const { server, operation } = await client.create(request(1));
    await settle(client, operation);
    expect(await settle(client, await client.powerOff(server.id))).toEqual({ state: "succeeded" });
    expect((await client.get(server.id))!.status).toBe("stopped");
    emu.setFaults({ next: { actionError: 1 } });
    expect(await settle(client, await client.powerOn(server.id))).toEqual({
      state: "failed",
      message: "start_server: action_failed: start server failed",
    });
    expect((await client.get(server.id))!.status).toBe("stopped");
    expect(await settle(client, await client.powerOn(server.id))).toEqual({ state: "succeeded" });
    expect(await settle(client, await client.reboot(server.id))).toEqual({ state: "succeeded" });
    expect((await client.get(server.id))!.status).toBe("running");
  });

  it("reports no capacity and the account's server limit as capacity failures, a bad request as rejected", async () => {
    emu.setFaults({ next: { resourceUnavailable: 1 } });
    const unavailable = await errorOf(client.create(request(1)));
    expect(unavailable).toMatchObject({
      code: "DRIVER_ERROR",
      message: "hetzner-cloud: POST /servers: resource_unavailable: error during placement",
      details: { provider: "hetzner-cloud", failure: "capacity", reason: "resource_unavailable", status: 412 },
    });
    emu.setServerLimit(0);
    const limited = await errorOf(client.create(request(1)));
    expect(limited).toMatchObject({
      code: "DRIVER_ERROR",
      details: { failure: "capacity", reason: "resource_limit_exceeded", status: 403 },
    });
    emu.setServerLimit(undefined);
    const rejected = await errorOf(client.create(request(1, { flavor: "cx999" })));
    expect(rejected).toMatchObject({ code: "DRIVER_ERROR", details: { failure: "rejected", reason: "invalid_input", status: 400 } });
    expect(emu.counters.serversCreated).toBe(0);
    for (const err of [unavailable, limited, rejected]) expect(JSON.stringify({ m: err!.message, d: err!.details })).not.toContain(TOKEN);
  });

  it("a wrong token is INVALID_CONFIG naming the provider, asked once and never retried, quoting no token", async () => {
    const err = await errorOf(clientFor(emu.url, WRONG_TOKEN).list());
    expect(err).toBeInstanceOf(ComputeError);
    expect(err).toMatchObject({
      code: "INVALID_CONFIG",
      details: { provider: "hetzner-cloud", failure: "config", status: 401, reason: "unauthorized" },
    });
    expect(err!.message).toMatch(/^hetzner-cloud: /);
    expect(JSON.stringify({ message: err!.message, details: err!.details })).not.toContain(WRONG_TOKEN);
    expect(emu.counters.calls["GET /servers"]).toBe(1);
  });

  it("declares its account: the token is its secret, the endpoint defaults to the real API", () => {
    expect(hetznerCloudProvider).toMatchObject({ contract: "provider", id: "hetzner-cloud", secretFields: ["token"] });
    expect(hetznerCloudProvider.manifest.parse({ token: "t" })).toEqual({ token: "t", endpoint: "https://api.hetzner.cloud/v1" });
    expect(hetznerCloudProvider.manifest.safeParse({ token: "" }).success).toBe(false);
  });
});

describe("the adapter under faults", () => {
  let emu: HetznerCloudEmulator;
  beforeAll(async () => {
    emu = await startHetznerCloudEmulator({ token: TOKEN });
  });
  afterAll(() => emu.stop());
  beforeEach(() => {
    emu.setFaults({});
    emu.setActionDurationMs(0);
    emu.setRateLimit({ limit: 3600, refillPerSecond: 1 });
  });

  /** ProviderHttp's waits, recorded; `real` also waits them out. */
  const sleeper = (real: boolean) => {
    const waits: number[] = [];
    return { waits, sleep: (ms: number) => (waits.push(ms), real ? new Promise<void>((r) => setTimeout(r, ms)) : Promise.resolve()) };
  };
  const account = () => hetznerCloudProvider.manifest.parse({ token: TOKEN, endpoint: emu.url });

  it("with 429, 503, 423 and failed actions on a share of calls, servers still reach running and are deleted, each created once", async () => {
    emu.setFaults({ rateLimitRate: 0.15, serverErrorRate: 0.1, lockedRate: 0.25, actionErrorRate: 0.2, seed: 7 });
    const { sleep, waits } = sleeper(false);
    const client = hetznerCloudClient(account(), { fetch: globalThis.fetch, sleep });
    const failures = new Set<string>();

    /** One level-triggered pass after another, as the reconciler makes them; every error must be transient. */
    async function converge(instanceId: string, goal: "running" | "deleted") {
      for (let pass = 0; pass < 100; pass++) {
        try {
          const server = await client.find(instanceId);
          if (goal === "deleted" && !server) return;
          if (goal === "running" && server?.status === "running") return;
          let op: Operation | void = undefined;
          if (!server)
            op = (await client.create(request(Number(instanceId.slice(5)), { instanceId, name: `vps-${instanceId}` }))).operation;
          else if (goal === "deleted") op = await client.delete(server.id);
          else if (server.status === "stopped") op = await client.powerOn(server.id);
          const state = await settle(client, op);
          if (state.state === "failed") failures.add(state.message.split(":")[0]!);
        } catch (err) {
          expect(err).toBeInstanceOf(ComputeError);
          expect((err as ComputeError).details).toMatchObject({ provider: "hetzner-cloud", failure: "transient" });
          failures.add((err as ComputeError).details!.reason as string);
        }
      }
      throw new Error(`${instanceId} did not reach ${goal}`);
    }

    const ids = Array.from({ length: 8 }, (_, i) => `inst-${100 + i}`);
    for (const id of ids) await converge(id, "running");
    expect(emu.servers().map((s) => s.status)).toEqual(ids.map(() => "running"));
    for (const id of ids) await converge(id, "deleted");

    expect(emu.counters.serversCreated).toBe(ids.length);
    expect(emu.servers()).toEqual([]);
    // Every fault was met, and ProviderHttp waited out the 429s and 423s it retried.
    expect(Object.keys(emu.counters.faults).sort()).toEqual(["actionError", "locked", "rateLimit", "serverError"]);
    expect(failures).toContain("create_server");
    expect(waits.length).toBeGreaterThan(0);
  });

  it("waits for the bucket to refill instead of calling beyond the limit", async () => {
    emu.setRateLimit({ limit: 3, refillPerSecond: 6 });
    const { sleep, waits } = sleeper(true);
    const client = hetznerCloudClient(account(), { fetch: globalThis.fetch, sleep });
    for (let i = 0; i < 9; i++) expect(await client.list()).toEqual([]);
    expect(emu.counters.overLimit).toBe(0);
    expect(waits.length).toBeGreaterThan(0);
  });

  it("a call refused 429 because others spent the bucket waits for its reset and then succeeds", async () => {
    emu.setRateLimit({ limit: 2, refillPerSecond: 4 });
    const before = emu.counters.overLimit;
    await api(emu, "GET", "/locations");
    await api(emu, "GET", "/locations");
    const { sleep, waits } = sleeper(true);
    expect(await hetznerCloudClient(account(), { fetch: globalThis.fetch, sleep }).list()).toEqual([]);
    expect(emu.counters.overLimit - before).toBe(1);
    expect(waits).toHaveLength(1);
    expect(waits[0]).toBeGreaterThan(0);
  });

  it("a mutation refused 423 while the create's actions run is sent again once they end", async () => {
    emu.setActionDurationMs(250);
    const client = hetznerCloudClient(account(), { fetch: globalThis.fetch });
    const { server } = await client.create(request(200));
    const lockedBefore = emu.counters.locked;
    const op = await client.powerOff(server.id);
    expect(emu.counters.locked).toBeGreaterThan(lockedBefore);
    expect(await settle(client, op)).toEqual({ state: "succeeded" });
    expect((await client.get(server.id))!.status).toBe("stopped");
  });

  it("gives up on a server that stays locked, or on a POST answered 503, as a transient failure with a retry time", async () => {
    const { sleep } = sleeper(false);
    const client = hetznerCloudClient(account(), { fetch: globalThis.fetch, sleep });
    const { server, operation } = await client.create(request(300));
    await settle(client, operation);
    emu.setFaults({ lockedRate: 1 });
    const locked = await errorOf(client.powerOff(server.id));
    expect(locked).toMatchObject({
      code: "UNAVAILABLE",
      details: { failure: "transient", reason: "locked", status: 423, retryAfterSeconds: expect.any(Number) },
    });
    emu.setFaults({ next: { serverError: 1 } });
    const calls = emu.counters.calls["POST /servers"] ?? 0;
    const unavailable = await errorOf(client.create(request(301, { sshKeys: [] })));
    expect(unavailable).toMatchObject({ code: "UNAVAILABLE", details: { failure: "transient", status: 503 } });
    // A POST that may have acted is not sent again by the adapter: the reconciler finds first.
    expect(emu.counters.calls["POST /servers"]).toBe(calls + 1);
    emu.setFaults({ next: { serverError: 1 } });
    expect(await client.get(server.id)).toMatchObject({ status: "running" });
  });
});
