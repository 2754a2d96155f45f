// The Hetzner Robot provider (plugins/hetzner-robot/provider.ts) against its emulator
// (testing/providers/hetzner-robot.ts, SIMULATED dedicated servers) over real HTTP: the emulator's
// answers have the shapes of hrobot-go's fixture bodies (Robot's official reference client is not
// in Debian: syself/hrobot-go test/response/*.json is the stand-in, PROVIDERS.md §5); the adapter
// passes providerConformanceCases() live through the recording transport and offline from
// test/recordings/hetzner-robot.json; it adopts free servers and releases them (never orders or
// cancels), finishes a create that was cut short, and keeps to Robot's limits and faults.
//
// Record again (after a change of the adapter or the emulator):
//   BC_RECORD=1 npx vitest run --project node test/node/provider-hetzner-robot.test.ts
import { readFileSync, writeFileSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { ComputeError } from "better-compute/core";
import { runConformance } from "better-compute/conformance";
import { recordingFetch, replayFetch, type Recording } from "better-compute/vps/record-replay";
import { hetznerRobotProvider, FREE_NAME, stampOf } from "better-compute/hetzner-robot";
import {
  EMULATED_PRODUCTS,
  LEGACY_RESET_TYPES,
  ROBOT_LIMITS,
  sshKeyFacts,
  startHetznerRobotEmulator,
  type HetznerRobotEmulator,
  type HetznerRobotEmulatorOptions,
  type RobotServerSpec,
} from "better-compute/testing/hetzner-robot";
import {
  failureOf,
  providerConformanceCases,
  renderUserData,
  type CreateServerRequest,
  type Fetch,
  type ProviderClient,
  type ProviderSubject,
} from "better-compute/vps";

const USER = "#ws+Bc4kQ9";
const PASSWORD = "robot-pw-7Lx2Qm9Vz4Tn";
const WRONG_PASSWORD = "robot-pw-0000000000000";
/** The rescue root password the emulator answers with, fixed so the recording can redact it. */
const RESCUE_PASSWORD = "rescue-root-pw-Zq81Hd";
const RECORDING = "test/recordings/hetzner-robot.json";

// Public keys with the MD5 fingerprints `ssh-keygen -l -E md5` gives for them.
const ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl conformance@better-compute";
const ED25519_MD5 = "65:96:2d:fc:e8:d5:a9:11:64:0c:0f:ea:00:6e:5b:bd";
const RSA =
  "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDDsUHLsSzabIohi4vyM5aPnwXZk9bop3Cju0bcj2Z5c3V112f/6u1bw+sw3IS5nQQYenZBX573IxZgJlN+Ffn5sk7QDXJAuNoeR1oJBgBKWIAxd4XsxBYssHMJ82wc3OSTvWBCC+s+AqE/5K+5tWKsfFvi94vaTVcyd9SCYuw+iiQVFx8jX5FBfDOtihfUVmv4t0D00EhSW/2djN38nKEgHk2uBE+zTYNCeQKMRdR/h88L0ZTi9KNN9Oo9Hp0hH+1iyO5Vqk6aIaxbWo1xsoKc6znnTuEL3JKi3YLYA9fiEze96MwuPVYmAGxC7yuVAp+zZjJThsh3NVPY3rSceSB84vj47kNDPHx1GCyEmMLyxPj9yDdWp4YaYwludLuN2wzyFgBjRfy7wtbY37I9vLyGkc4iGq5XmMzt2TXN2z5x25etSVbf4MpJtRy6NxaIB108w8kejOm8n8FnTsQ31ZIibwdbuheAFBgqIsuZ7sYoi9max8uIqI8lv3Sr1Yr2Am0= tenant@example";
const RSA_MD5 = "ce:57:47:a1:2b:5c:df:5a:59:14:62:00:fc:77:7e:46";
const ECDSA =
  "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBOO7cwXdzTskJnywKwSsr0a3TN2o55TF9Jk8QPtDSJAzMY4R6kYvPK4tmCxBZmKld5IEba95bvbJs1oKw+T58CSKRfflu4V4WTxbBARhmXKB/SKpFQkp3B+5CJjehZiwJQ== ops@example";
const ECDSA_MD5 = "45:6d:be:d4:19:c1:6f:d2:4d:26:b2:fb:21:87:ce:a8";

const running: HetznerRobotEmulator[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

async function start(options: HetznerRobotEmulatorOptions = {}) {
  const emu = await startHetznerRobotEmulator({ user: USER, password: PASSWORD, rescuePassword: () => RESCUE_PASSWORD, ...options });
  running.push(emu);
  return emu;
}

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;

/** A raw call to the emulator, with a form body as Robot takes it (arrays as repeated `key[]`). */
async function call(
  emu: HetznerRobotEmulator,
  method: string,
  path: string,
  form?: Record<string, string | string[]>,
  password = PASSWORD,
) {
  const body = form
    ? new URLSearchParams(Object.entries(form).flatMap(([k, v]) => (Array.isArray(v) ? v : [v]).map((x) => [k, x] as [string, string])))
    : undefined;
  const res = await fetch(emu.url + path, {
    method,
    headers: { authorization: basic(USER, password), ...(body ? { "content-type": "application/x-www-form-urlencoded" } : {}) },
    body,
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : null };
}

const account = (endpoint: string, password: string, extra: Record<string, unknown> = {}) =>
  hetznerRobotProvider.manifest.parse({ endpoint, user: USER, password, products: EMULATED_PRODUCTS, ...extra });
const clientFor = (endpoint: string, fetch: Fetch = globalThis.fetch, password = PASSWORD, extra: Record<string, unknown> = {}) =>
  hetznerRobotProvider.client(account(endpoint, password, extra), { fetch });

const request = (n: number, extra: Partial<CreateServerRequest> = {}): CreateServerRequest => ({
  instanceId: `inst-${n}`,
  name: `host-${n}`,
  flavor: "AX41-NVMe",
  image: "rescue-linux",
  sshKeys: [{ name: "tenant", publicKey: RSA }],
  ...extra,
});

/** What a provider error carries, as the reconciler reads it. */
async function failure(promise: Promise<unknown>) {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ComputeError);
  const e = err as ComputeError;
  return { code: e.code, message: e.message, details: e.details as Record<string, unknown> };
}

/** The reconciler's way with a transient failure: try again (ProviderHttp already waited inside the call). */
async function retried<T>(what: () => Promise<T>, tries = 8): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await what();
    } catch (err) {
      if (failureOf(err) !== "transient" || i >= tries) throw err;
    }
  }
}

async function statusOf(client: ProviderClient, id: string) {
  return (await retried(() => client.get(id)))?.status ?? null;
}

const claims = (emu: HetznerRobotEmulator) => emu.servers().filter((s) => stampOf(s.name));
/** Every limit with a one-second window, so a test spends and waits one out quickly. */
const oneSecondLimits = (max = 1000) => Object.fromEntries(Object.keys(ROBOT_LIMITS).map((k) => [k, { max, intervalSeconds: 1 }]));

// ---------------------------------------------------------------- shapes, from hrobot-go's fixture bodies

type Shape = string | Shape[] | { [key: string]: Shape };

/** Where `value` departs from `shape` ("string", "null|array", [element], { key: shape }); extra keys are allowed. */
function shapeProblems(value: unknown, shape: Shape, at = "$"): string[] {
  if (typeof shape === "string") {
    const kind = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
    return shape.split("|").includes(kind) ? [] : [`${at}: ${kind}, not ${shape}`];
  }
  if (Array.isArray(shape)) {
    if (!Array.isArray(value)) return [`${at}: not an array`];
    return shape.length ? value.flatMap((v, i) => shapeProblems(v, shape[0]!, `${at}[${i}]`)) : [];
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return [`${at}: not an object`];
  return Object.entries(shape).flatMap(([k, s]) =>
    k in value ? shapeProblems((value as Record<string, unknown>)[k], s, `${at}.${k}`) : [`${at}.${k}: missing`],
  );
}

const ADDRESS = { server_ip: "string", server_ipv6_net: "string", server_number: "number" };
const LISTED_SERVER = {
  ...ADDRESS,
  server_name: "string",
  product: "string",
  dc: "string",
  traffic: "string",
  status: "string",
  cancelled: "boolean",
  paid_until: "string",
  ip: ["string"],
  subnet: "array|null",
};
/** syself/hrobot-go test/response/<file>: the fields and types each fixture body has. */
const FIXTURES: Record<string, Shape> = {
  "server_list.json": [{ server: LISTED_SERVER }],
  "server_get.json": {
    server: {
      ...LISTED_SERVER,
      subnet: [{ ip: "string", mask: "string" }],
      ...Object.fromEntries(["reset", "rescue", "vnc", "windows", "plesk", "cpanel", "wol", "hot_swap"].map((k) => [k, "boolean"])),
    },
  },
  "server_get_404.json": { error: { code: "string", message: "string", status: "number" } },
  "reset_get.json": { reset: { ...ADDRESS, type: ["string"], operating_status: "string" } },
  "reset_post.json": { reset: { ...ADDRESS, type: "string" } },
  "boot_rescue_get_inactive.json": {
    rescue: { ...ADDRESS, os: ["string"], arch: ["number"], active: "boolean", password: "null", authorized_key: [], host_key: [] },
  },
  "boot_rescue_set_with_key.json": {
    rescue: {
      ...ADDRESS,
      os: "string",
      arch: "number",
      active: "boolean",
      password: "string",
      authorized_key: [{ key: { fingerprint: "string", name: "string", size: "number", type: "string" } }],
      host_key: [],
    },
  },
  "key_list.json": [{ key: { name: "string", fingerprint: "string", type: "string", size: "number", data: "string" } }],
  "key_set.json": { key: { name: "string", fingerprint: "string", type: "string", size: "number", data: "string" } },
};

describe("the emulator speaks Robot", () => {
  it("answers in the shapes of hrobot-go's fixture bodies", async () => {
    const emu = await start({ servers: 2 });
    const n = emu.servers()[0]!.number;
    const emptyKeys = await call(emu, "GET", "/key");
    const key = await call(emu, "POST", "/key", { name: "tenant", data: RSA });
    const answers: Record<string, { status: number; json: unknown }> = {
      "server_list.json": await call(emu, "GET", "/server"),
      "server_get.json": await call(emu, "GET", `/server/${n}`),
      "server_get_404.json": await call(emu, "GET", "/server/999999"),
      "reset_get.json": await call(emu, "GET", `/reset/${n}`),
      "boot_rescue_get_inactive.json": await call(emu, "GET", `/boot/${n}/rescue`),
      "boot_rescue_set_with_key.json": await call(emu, "POST", `/boot/${n}/rescue`, { os: "linux", "authorized_key[]": [RSA_MD5] }),
      "reset_post.json": await call(emu, "POST", `/reset/${n}`, { type: "hw" }),
      "key_set.json": key,
      "key_list.json": await call(emu, "GET", "/key"),
    };
    for (const [fixture, shape] of Object.entries(FIXTURES)) expect(shapeProblems(answers[fixture]!.json, shape), fixture).toEqual([]);
    expect(answers["server_get_404.json"]).toMatchObject({ status: 404, json: { error: { status: 404, code: "SERVER_NOT_FOUND" } } });
    expect(key.status).toBe(201);
    // An empty list is an error, not [].
    expect(emptyKeys).toMatchObject({ status: 404, json: { error: { code: "NOT_FOUND" } } });
    expect(await call(emu, "GET", "/server", undefined, WRONG_PASSWORD)).toMatchObject({
      status: 401,
      json: { error: { status: 401, code: "UNAUTHORIZED" } },
    });
    const none = await start({ servers: [] });
    expect(await call(none, "GET", "/server")).toMatchObject({ status: 404, json: { error: { code: "SERVER_NOT_FOUND" } } });
  });

  it("fingerprints keys as ssh-keygen does, and refuses the same key under another name", async () => {
    expect(sshKeyFacts(RSA)).toMatchObject({ type: "RSA", size: 3072, fingerprint: RSA_MD5 });
    expect(sshKeyFacts(ECDSA)).toMatchObject({ type: "ECDSA", size: 384, fingerprint: ECDSA_MD5 });
    expect(sshKeyFacts(ED25519)).toMatchObject({ type: "ED25519", size: 256, fingerprint: ED25519_MD5 });
    expect(sshKeyFacts("ssh-rsa not-base64!")).toBeUndefined();

    const emu = await start();
    expect((await call(emu, "POST", "/key", { name: "a", data: ED25519 })).json.key).toMatchObject({
      fingerprint: ED25519_MD5,
      type: "ED25519",
    });
    expect(await call(emu, "POST", "/key", { name: "b", data: ED25519 })).toMatchObject({
      status: 409,
      json: { error: { code: "KEY_ALREADY_EXISTS" } },
    });
    expect(await call(emu, "POST", "/key", { name: "c", data: "ssh-ed25519 AAAA" })).toMatchObject({
      status: 400,
      json: { error: { code: "INVALID_INPUT", invalid: ["data"] } },
    });
    expect(await call(emu, "GET", `/key/${ED25519_MD5}`)).toMatchObject({ status: 200, json: { key: { name: "a" } } });
    expect(await call(emu, "DELETE", `/key/${ED25519_MD5}`)).toEqual({ status: 200, json: null });
    expect((await call(emu, "GET", `/key/${ED25519_MD5}`)).status).toBe(404);
  });

  it("boots an armed rescue system at the next reset with its keys, and then shows it inactive", async () => {
    const emu = await start({ servers: 1 });
    const n = emu.servers()[0]!.number;
    await call(emu, "POST", "/key", { name: "tenant", data: RSA });
    const armed = await call(emu, "POST", `/boot/${n}/rescue`, { os: "linux", "authorized_key[]": [RSA_MD5] });
    expect(armed.json.rescue).toMatchObject({
      active: true,
      os: "linux",
      authorized_key: [{ key: { fingerprint: RSA_MD5, name: "tenant" } }],
    });
    expect(await call(emu, "POST", `/boot/${n}/rescue`, { os: "linux" })).toMatchObject({
      status: 409,
      json: { error: { code: "BOOT_ALREADY_ENABLED" } },
    });
    expect(emu.servers()[0]!.running).toEqual({ system: "disk" });

    await call(emu, "POST", `/reset/${n}`, { type: "hw" });
    const after = await call(emu, "GET", `/boot/${n}/rescue`);
    expect(after.json.rescue).toMatchObject({ active: false, os: ["linux", "vkvm"], password: null, authorized_key: [] });
    expect(emu.servers()[0]).toMatchObject({ running: { system: "rescue", keys: [RSA_MD5] }, resets: ["hw"] });
  });

  it("keeps the box's power behind the resetter's types: power, power_long, wol; a legacy box reports none", async () => {
    const emu = await start({ servers: [{}, { resetTypes: LEGACY_RESET_TYPES }] });
    const [box, legacy] = emu.servers().map((s) => s.number);
    expect((await call(emu, "GET", `/reset/${box}`)).json.reset).toMatchObject({
      type: ["power", "power_long", "hw", "man"],
      operating_status: "running",
    });
    await call(emu, "POST", `/reset/${box}`, { type: "power_long" });
    expect((await call(emu, "GET", `/reset/${box}`)).json.reset.operating_status).toBe("off");
    await call(emu, "POST", `/reset/${box}`, { type: "hw" }); // the reset button does not start a box that is off
    expect((await call(emu, "GET", `/reset/${box}`)).json.reset.operating_status).toBe("off");
    expect((await call(emu, "POST", `/wol/${box}`)).json).toMatchObject({ wol: { server_number: box } });
    expect((await call(emu, "GET", `/reset/${box}`)).json.reset.operating_status).toBe("running");

    expect((await call(emu, "GET", `/reset/${legacy}`)).json.reset).toMatchObject({
      type: ["sw", "hw", "man"],
      operating_status: "not supported",
    });
    expect(await call(emu, "POST", `/reset/${legacy}`, { type: "power_long" })).toMatchObject({
      status: 400,
      json: { error: { code: "INVALID_INPUT", invalid: ["type"] } },
    });
  });

  it("answers 403 RATE_LIMIT_EXCEEDED past an endpoint's limit, without counting the refused call", async () => {
    const emu = await start({ limits: { "GET /server": { max: 2, intervalSeconds: 3600 } } });
    expect((await call(emu, "GET", "/server")).status).toBe(200);
    expect((await call(emu, "GET", "/server")).status).toBe(200);
    expect(await call(emu, "GET", "/server")).toEqual({
      status: 403,
      json: { error: { status: 403, code: "RATE_LIMIT_EXCEEDED", max_request: 2, interval: 3600, message: "Rate limit exceeded" } },
    });
    // Another endpoint has its own window.
    expect((await call(emu, "GET", `/server/${emu.servers()[0]!.number}`)).status).toBe(200);
    expect(emu.counters.overLimit).toEqual({ "GET /server": 1 });
    expect(emu.busiestWindow("GET /server")).toBe(2);
  });
});

// ---------------------------------------------------------------- conformance

describe("conformance", () => {
  const cases = providerConformanceCases();
  const subjectOver = (endpoint: string, fetch: Fetch) => (): ProviderSubject => ({
    client: clientFor(endpoint, fetch),
    wrongCredential: clientFor(endpoint, fetch, WRONG_PASSWORD),
    secrets: [PASSWORD, WRONG_PASSWORD],
    // Robot takes no user data; the first flavor and the first location need not go together.
    userData: false,
    offer: { flavor: "AX41-NVMe", image: "rescue-linux", location: "FSN1-DC14" },
  });

  it("passes live against the emulator through the recording transport, releasing every server it adopted", async () => {
    const emu = await start();
    const recorder = recordingFetch(globalThis.fetch, {
      secrets: [PASSWORD, WRONG_PASSWORD, RESCUE_PASSWORD],
      about: "hetzner-robot@1: providerConformanceCases() against testing/providers/hetzner-robot.ts",
    });
    const report = await runConformance(cases, subjectOver(emu.url, recorder.fetch));
    expect(report.failed).toEqual([]);
    expect(report.passed).toEqual(cases.map((c) => c.name));
    expect(claims(emu)).toEqual([]);
    // Released boxes are off and renamed free; nothing was ordered or cancelled (no such endpoint was called).
    expect(
      emu
        .servers()
        .filter((s) => s.name === FREE_NAME)
        .every((s) => s.power === "off"),
    ).toBe(true);
    expect(Object.keys(emu.counters.calls).filter((e) => /order|cancel/.test(e))).toEqual([]);

    const text = `${JSON.stringify(recorder.recording(), null, 2)}\n`;
    for (const secret of [PASSWORD, WRONG_PASSWORD, RESCUE_PASSWORD]) expect(text).not.toContain(secret);
    if (process.env.BC_RECORD === "1") writeFileSync(RECORDING, text);
  });

  it("passes offline from the committed recording, every exchange consumed", async () => {
    const recording = JSON.parse(readFileSync(RECORDING, "utf8")) as Recording;
    const replay = replayFetch(recording, { secrets: [PASSWORD, WRONG_PASSWORD] });
    const report = await runConformance(cases, subjectOver("https://robot-ws.your-server.de", replay.fetch));
    expect(report.failed).toEqual([]);
    expect(report.passed).toHaveLength(cases.length);
    replay.assertConsumed();
  });
});

// ---------------------------------------------------------------- adopting and releasing

describe("adopting rented servers", () => {
  it("claims the lowest free server of the flavor and location, boots its rescue system with the tenant's keys, and finds it by its stamp", async () => {
    const emu = await start();
    const client = clientFor(emu.url);
    const offers = await client.offers();
    expect(offers.flavors.map((f) => [f.id, f.locations])).toEqual([
      ["AX102", ["FSN1-DC14"]],
      ["AX41-NVMe", ["FSN1-DC14", "HEL1-DC7"]],
      ["EX44", ["FSN1-DC14", "NBG1-DC3"]],
    ]);
    expect(offers.flavors[1]).toMatchObject({ vcpus: 12, memoryMiB: 65536, diskGiB: 953 });
    expect(offers.images).toEqual([{ id: "rescue-linux", name: expect.stringMatching(/rescue/) }]);

    const { server, operation } = await client.create(request(1, { location: "HEL1-DC7" }));
    expect(operation).toBeUndefined();
    const box = emu.servers().find((s) => s.dc === "HEL1-DC7")!;
    expect(server).toEqual({ id: String(box.number), instanceId: "inst-1", name: "host-1", status: "starting", addresses: [box.ip] });
    expect(box).toMatchObject({ name: "bc:inst-1 host-1", power: "on", running: { system: "rescue", keys: [RSA_MD5] } });
    expect(await client.get(server.id)).toMatchObject({ status: "running", instanceId: "inst-1" });
    expect((await client.find("inst-1"))?.id).toBe(server.id);
    expect((await client.list()).map((s) => [s.id, s.status])).toEqual([[server.id, "running"]]);
    // The claimed box is no longer on offer there.
    expect((await client.offers()).flavors.find((f) => f.id === "AX41-NVMe")?.locations).toEqual(["FSN1-DC14"]);
  });

  it("uploads a key once and reuses the account's copy of it, whatever its name", async () => {
    const emu = await start();
    await call(emu, "POST", "/key", { name: "someone-elses-name", data: RSA });
    const client = clientFor(emu.url);
    await client.create(
      request(1, {
        sshKeys: [
          { name: "tenant", publicKey: RSA },
          { name: "ops", publicKey: ECDSA },
        ],
      }),
    );
    await client.create(
      request(2, { sshKeys: [{ name: "ops-again", publicKey: `${ECDSA.split(" ").slice(0, 2).join(" ")} another-comment` }] }),
    );
    expect(emu.keys().map((k) => [k.name, k.fingerprint])).toEqual([
      ["someone-elses-name", RSA_MD5],
      ["ops", ECDSA_MD5],
    ]);
    // The test's own upload, and the adapter's one for the key the account lacked.
    expect(emu.counters.calls["POST /key"]).toBe(2);
    expect(claims(emu).map((s) => s.running)).toEqual([
      { system: "rescue", keys: [RSA_MD5, ECDSA_MD5] },
      { system: "rescue", keys: [ECDSA_MD5] },
    ]);
  });

  it("takes the control plane's user data when it says no more than the hostname and the keys", async () => {
    const emu = await start();
    const client = clientFor(emu.url);
    const sshKeys = [{ name: "tenant", publicKey: RSA }];
    const { server } = await client.create(request(1, { sshKeys, userData: renderUserData({ hostname: "host-1", sshKeys }) }));
    expect(emu.servers().find((s) => String(s.number) === server.id)).toMatchObject({
      name: "bc:inst-1 host-1",
      running: { system: "rescue", keys: [RSA_MD5] },
    });
  });

  it("refuses what Robot cannot do before touching a server: a join token or other user data, another image, no key", async () => {
    const emu = await start();
    const client = clientFor(emu.url);
    const sshKeys = [{ name: "tenant", publicKey: RSA }];
    const join = renderUserData({ hostname: "host-1", sshKeys, join: { url: "https://bc.example", token: "bcj_secret-join-token" } });
    for (const userData of [join, "#cloud-config\nruncmd:\n  - echo hi\n", "#!/bin/sh\necho hi\n"]) {
      const err = await failure(client.create(request(1, { sshKeys, userData })));
      expect(err).toMatchObject({ code: "DRIVER_ERROR", details: { failure: "rejected", reason: "user_data_unsupported" } });
      expect(JSON.stringify(err)).not.toContain("bcj_secret-join-token");
    }
    expect((await failure(client.create(request(1, { image: "ubuntu-24.04" })))).details.reason).toBe("invalid_image");
    expect((await failure(client.create(request(1, { sshKeys: [] })))).details.reason).toBe("no_ssh_key");
    expect(Object.keys(emu.counters.calls)).toEqual([]);
  });

  it("says capacity when no free server of the flavor is left, and never claims a server the account does not allow", async () => {
    const emu = await start({ servers: [{ product: "EX44" }, { product: "EX44" }, { product: "EX44", cancelled: true }] });
    const [first, second] = emu.servers().map((s) => s.number);
    const client = clientFor(emu.url, fetch, PASSWORD, { servers: [second] });
    expect((await client.offers()).flavors.map((f) => f.id)).toEqual(["EX44"]);
    const { server } = await client.create(request(1, { flavor: "EX44" }));
    expect(server.id).toBe(String(second));
    const err = await failure(client.create(request(2, { flavor: "EX44" })));
    expect(err).toMatchObject({
      code: "DRIVER_ERROR",
      details: { provider: "hetzner-robot", failure: "capacity", reason: "no_free_server" },
    });
    expect(err.message).toBe("hetzner-robot: no free server of product EX44");
    expect(emu.servers().find((s) => s.number === first)).toMatchObject({ name: "", resets: [] });
  });

  it("leaves a server it did not claim alone: get is null, delete does nothing, power calls are refused", async () => {
    const emu = await start({ servers: [{ name: "production-db" }] });
    const client = clientFor(emu.url);
    const id = String(emu.servers()[0]!.number);
    expect(await client.get(id)).toBeNull();
    await client.delete(id);
    expect((await failure(client.powerOff(id))).details).toMatchObject({ failure: "rejected", reason: "not_found" });
    expect((await failure(client.reboot(id))).details.reason).toBe("not_found");
    expect(emu.servers()[0]).toMatchObject({ name: "production-db", power: "on", resets: [] });
    expect(Object.keys(emu.counters.calls).filter((e) => !e.startsWith("GET"))).toEqual([]);
  });

  it("powers off, on and reboots through the resetter; delete switches the box off and frees it, never cancels", async () => {
    const emu = await start({ servers: 1 });
    const client = clientFor(emu.url);
    const { server } = await client.create(request(1));
    expect(await client.powerOff(server.id)).toBeUndefined();
    expect(await statusOf(client, server.id)).toBe("stopped");
    await client.powerOff(server.id); // already off: nothing pressed
    await client.powerOn(server.id);
    expect(await statusOf(client, server.id)).toBe("running");
    await client.reboot(server.id);
    expect(await statusOf(client, server.id)).toBe("running");
    expect(emu.servers()[0]!.resets).toEqual(["hw", "power_long", "power", "hw"]);
    // After the rescue boot the box runs whatever its disks hold: Robot's rescue is a one-time boot.
    expect(emu.servers()[0]!.running).toEqual({ system: "disk" });

    await client.delete(server.id);
    expect(emu.servers()[0]).toMatchObject({ name: FREE_NAME, power: "off", rescue: { active: false } });
    expect(await client.get(server.id)).toBeNull();
    expect(await client.find("inst-1")).toBeNull();
    await client.delete(server.id);
    await failure(client.operation("anything")).then((e) => expect(e.details.reason).toBe("no_operations"));

    // Free again: the next instance gets it, switched on with the power button.
    const again = await client.create(request(2));
    expect(again.server.id).toBe(server.id);
    expect(emu.servers()[0]).toMatchObject({ name: "bc:inst-2 host-2", power: "on", running: { system: "rescue", keys: [RSA_MD5] } });
    expect(emu.servers()[0]!.resets.slice(-2)).toEqual(["power_long", "power"]);
  });

  it("reads a box without a power reading as running, refuses to switch it off, and restarts it from its disks on delete", async () => {
    const emu = await start({ servers: [{ resetTypes: LEGACY_RESET_TYPES }] });
    const client = clientFor(emu.url);
    const { server } = await client.create(request(1));
    expect(await client.get(server.id)).toMatchObject({ status: "running" });
    expect((await failure(client.powerOff(server.id))).details).toMatchObject({ failure: "rejected", reason: "power_off_unavailable" });
    await client.powerOn(server.id); // no reading: wake-on-LAN, harmless to a box that is on
    await client.delete(server.id);
    expect(emu.servers()[0]).toMatchObject({ name: FREE_NAME, power: "on", running: { system: "disk" }, resets: ["hw", "wol", "hw"] });
  });

  it("reports starting until the box has booted its rescue system", async () => {
    const emu = await start({ servers: 1, actionDurationMs: 60_000 });
    const client = clientFor(emu.url);
    const { server } = await client.create(request(1));
    expect(await client.get(server.id)).toMatchObject({ status: "starting" });
    emu.setActionDurationMs(0);
    await client.reboot(server.id); // a reset now replaces the slow boot
    expect(await client.get(server.id)).toMatchObject({ status: "running" });
  });

  it("finishes a create that was cut short after the claim, on the same box, instead of claiming a second", async () => {
    const emu = await start({ servers: 2, limits: { "POST /reset/{n}": { max: 0, intervalSeconds: 3600 } } });
    const err = await failure(clientFor(emu.url).create(request(1)));
    expect(err).toMatchObject({
      code: "UNAVAILABLE",
      details: { failure: "transient", reason: "RATE_LIMIT_EXCEEDED", retryAfterSeconds: 3600 },
    });
    const client = clientFor(emu.url);
    // Half made: found as incomplete (so the reconciler creates again, or deletes it), listed as creating.
    expect(await client.find("inst-1")).toMatchObject({ instanceId: "inst-1", status: "creating", incomplete: true });
    expect((await client.list()).map((s) => [s.instanceId, s.status])).toEqual([["inst-1", "creating"]]);

    emu.setLimits({ "POST /reset/{n}": ROBOT_LIMITS["POST /reset/{n}"]! });
    const { server } = await client.create(request(1));
    expect(claims(emu).map((s) => [String(s.number), s.name])).toEqual([[server.id, "bc:inst-1 host-1"]]);
    expect(await client.find("inst-1")).toMatchObject({ id: server.id, status: "running" });
    // And a create for an instance that has its server returns it.
    expect((await client.create(request(1))).server.id).toBe(server.id);
    expect(claims(emu)).toHaveLength(1);
  });
});

// ---------------------------------------------------------------- limits, faults, credentials

describe("faults", () => {
  it("a wrong password is INVALID_CONFIG after one request, quoting no password", async () => {
    const emu = await start();
    const err = await failure(clientFor(emu.url, fetch, WRONG_PASSWORD).list());
    expect(err).toMatchObject({
      code: "INVALID_CONFIG",
      details: { provider: "hetzner-robot", failure: "config", status: 401, reason: "UNAUTHORIZED" },
    });
    expect(err.message).toMatch(/^hetzner-robot: /);
    expect(JSON.stringify(err)).not.toContain(WRONG_PASSWORD);
    expect(emu.counters.unauthorized).toBe(1);
    expect(hetznerRobotProvider.secretFields).toEqual(["password"]);
  });

  it("waits out a spent window instead of hammering it: no endpoint gets more than its limit", async () => {
    const emu = await start({ limits: { "GET /server": { max: 2, intervalSeconds: 1 } } });
    const client = clientFor(emu.url);
    for (let i = 0; i < 5; i++) expect(await client.find("inst-x")).toBeNull();
    expect(emu.counters.calls["GET /server"]).toBe(5 + emu.counters.overLimit["GET /server"]!);
    // One refusal per spent window (two windows spent), then the wait; never a third call inside a window.
    expect(emu.counters.overLimit["GET /server"]).toBeGreaterThanOrEqual(2);
    expect(emu.counters.overLimit["GET /server"]).toBeLessThanOrEqual(3);
    expect(emu.busiestWindow("GET /server")).toBe(2);
  });

  it("a window longer than a call may wait is UNAVAILABLE with the window as retryAfterSeconds", async () => {
    const emu = await start({ limits: { "GET /server": { max: 1, intervalSeconds: 3600 } } });
    const client = clientFor(emu.url);
    await client.list();
    const err = await failure(client.list());
    expect(err).toMatchObject({
      code: "UNAVAILABLE",
      details: { failure: "transient", reason: "RATE_LIMIT_EXCEEDED", status: 403, retryAfterSeconds: 3600 },
    });
    // The client now knows the window is spent: it asks nothing more of Robot until it resets.
    const calls = emu.counters.calls["GET /server"];
    expect((await failure(client.find("inst-1"))).details).toMatchObject({ reason: "rate_limited", retryAfterSeconds: 3600 });
    expect(emu.counters.calls["GET /server"]).toBe(calls);
  });

  it("reads a bare 403 as the rate limit, and a 403 with another code as a configuration error", async () => {
    const answering =
      (status: number, body: string): Fetch =>
      async () =>
        new Response(body, { status });
    const bare = await failure(clientFor("https://robot-ws.your-server.de", answering(403, "Forbidden")).list());
    expect(bare).toMatchObject({ code: "UNAVAILABLE", details: { reason: "RATE_LIMIT_EXCEEDED", retryAfterSeconds: 3600 } });
    const forbidden = JSON.stringify({ error: { status: 403, code: "FORBIDDEN", message: "no access to this endpoint" } });
    const coded = await failure(clientFor("https://robot-ws.your-server.de", answering(403, forbidden)).list());
    expect(coded).toMatchObject({ code: "INVALID_CONFIG", details: { reason: "FORBIDDEN", status: 403 } });
  });

  it("retries maintenance, RESET_FAILED and RESET_MANUAL_ACTIVE, and the create still lands once", async () => {
    const emu = await start({ servers: 1, faults: { next: { maintenance: 2, resetFailed: 1, manualActive: 1 } } });
    const client = clientFor(emu.url);
    const { server } = await client.create(request(1));
    expect(emu.counters.faults).toEqual({ maintenance: 2, resetFailed: 1, manualActive: 1 });
    expect(emu.servers()[0]).toMatchObject({ name: "bc:inst-1 host-1", resets: ["hw"], running: { system: "rescue", keys: [RSA_MD5] } });
    expect(await client.get(server.id)).toMatchObject({ status: "running" });
  });

  it("with faults on a share of calls, instances still go to running, stopped and released, one box each", async () => {
    const emu = await start({
      limits: oneSecondLimits(),
      faults: { rateLimitRate: 0.05, maintenanceRate: 0.08, resetFailedRate: 0.15, manualActiveRate: 0.1, seed: 7 },
    });
    const client = clientFor(emu.url);
    const ids: string[] = [];
    for (const n of [1, 2, 3]) {
      // The reconciler's create: find first, create only when nothing carries the stamp.
      const server = (await retried(() => client.find(`inst-${n}`))) ?? (await retried(() => client.create(request(n)))).server;
      ids.push(server.id);
    }
    expect(new Set(ids).size).toBe(3);
    expect(claims(emu)).toHaveLength(3);
    for (const id of ids) {
      expect(await statusOf(client, id)).toBe("running");
      await retried(() => client.powerOff(id));
      expect(await statusOf(client, id)).toBe("stopped");
      await retried(() => client.delete(id));
      expect(await statusOf(client, id)).toBeNull();
    }
    expect(claims(emu)).toEqual([]);
    expect(Object.values(emu.counters.faults).reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    for (const [endpoint, limit] of Object.entries(oneSecondLimits())) expect(emu.busiestWindow(endpoint)).toBeLessThanOrEqual(limit.max);
  });
});
