// The vps module under provider faults, end to end: one control plane in process on PGlite (the
// real betterCompute with vps({ providers: [hetzner-cloud, hetzner-robot, proxmox] }), whose
// reconcilers run on its own one-second cron tick, one pass at a time) drives 50 instances of one
// tenant across the three providers' emulators to running and then to deleted while every emulator
// answers a seeded share of calls with 429s (with their reset), 5xx, locks and failed
// actions/tasks, under rate limits tight enough to be reached; an instance whose create meets no
// capacity fails alone with a DRIVER_ERROR. Then nothing the deployment wrote (every row of every
// table) or printed (every console line) holds a provider secret or a join token: a join token is
// in the user data of its own server and nowhere else, and each server's user data says exactly
// the hostname, the SSH keys and (agent: bcd) the join material.
// The test drives no pass of its own: a second pass beside the tick's would hold a second client
// per account, and the two do not share what they learnt of a rate-limit window.
// SIMULATED: the three providers (their emulators, over real HTTP and HTTPS on 127.0.0.1).
import { format } from "node:util";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { hetznerCloudProvider, INSTANCE_LABEL } from "better-compute/hetzner-cloud";
import { FREE_NAME, hetznerRobotProvider, stampOf } from "better-compute/hetzner-robot";
import { proxmoxProvider } from "better-compute/proxmox";
import { pinnedFetch } from "better-compute/proxmox/pinned-fetch";
import { startHetznerCloudEmulator, type HetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import {
  EMULATED_PRODUCTS,
  ROBOT_LIMITS,
  sshKeyFacts,
  startHetznerRobotEmulator,
  type HetznerRobotEmulator,
} from "better-compute/testing/hetzner-robot";
import { startProxmoxEmulator, type ProxmoxEmulator } from "better-compute/testing/proxmox";
import { vps, type Fetch } from "better-compute/vps";
import { callApi, inProcessControlPlane, type SimControlPlane } from "../../testing/metal-sim-control-plane.ts";

const AGENT_URL = "https://compute.faults.example";
const HCLOUD_TOKEN = "hcloud-faults-token-Qm81Zx0Lp3Vb7Nc2";
const ROBOT_USER = "#ws+Faults42";
const ROBOT_PASSWORD = "robot-faults-pw-7Lx2Qm9Vz4Tn";
const ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const RSA =
  "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDDsUHLsSzabIohi4vyM5aPnwXZk9bop3Cju0bcj2Z5c3V112f/6u1bw+sw3IS5nQQYenZBX573IxZgJlN+Ffn5sk7QDXJAuNoeR1oJBgBKWIAxd4XsxBYssHMJ82wc3OSTvWBCC+s+AqE/5K+5tWKsfFvi94vaTVcyd9SCYuw+iiQVFx8jX5FBfDOtihfUVmv4t0D00EhSW/2djN38nKEgHk2uBE+zTYNCeQKMRdR/h88L0ZTi9KNN9Oo9Hp0hH+1iyO5Vqk6aIaxbWo1xsoKc6znnTuEL3JKi3YLYA9fiEze96MwuPVYmAGxC7yuVAp+zZjJThsh3NVPY3rSceSB84vj47kNDPHx1GCyEmMLyxPj9yDdWp4YaYwludLuN2wzyFgBjRfy7wtbY37I9vLyGkc4iGq5XmMzt2TXN2z5x25etSVbf4MpJtRy6NxaIB108w8kejOm8n8FnTsQ31ZIibwdbuheAFBgqIsuZ7sYoi9max8uIqI8lv3Sr1Yr2Am0= ops@desk";
const KEYS = [ED25519, RSA];
/** Node's timers may fire a few milliseconds before the wall clock says they are due. */
const TIMER_SLACK_MS = 10;
const LOCK_TIMEOUT = "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout";
/** Every Robot endpoint's window, one second long and small, so the pass spends some and waits them out. */
const ROBOT_WINDOWS = Object.fromEntries(Object.keys(ROBOT_LIMITS).map((endpoint) => [endpoint, { max: 8, intervalSeconds: 1 }]));

/** How many instances go where: 50 in all, and one more that meets no capacity. */
const PLAN = { "hc-bcd": 8, "hc-none": 9, robot: 17, pve: 16 } as const;
type PoolId = keyof typeof PLAN | "robot-big";

let cp: SimControlPlane;
let hcloud: HetznerCloudEmulator;
let robot: HetznerRobotEmulator;
let pve: ProxmoxEmulator;
let tenantKey: string;

/** Every console line printed while the file runs: the reconciler's, the control plane's, the emulators'. */
const printed: string[] = [];
interface Exchange {
  provider: string;
  sentAt: number;
  answeredAt: number;
  status: number;
  headers: Headers;
  /** Robot's error body (it says the window it refused in). */
  error?: { error: { code: string; interval: number } };
}
/** Every provider exchange, as the deployment's fetch saw it. */
const exchanges: Exchange[] = [];

/**
 * The deployment's one fetch for every account: vps() takes a single fetch, so the Proxmox
 * emulator's origin is routed to the fetch that pins its certificate (a per-account fetch would be
 * cleaner). It also notes each exchange for the rate-limit assertions.
 */
function routedFetch(): Fetch {
  const pinned = pinnedFetch({ spkiSha256: pve.spkiSha256 });
  const providerOf = new Map([
    [new URL(hcloud.url).origin, "hetzner-cloud"],
    [new URL(robot.url).origin, "hetzner-robot"],
    [new URL(pve.url).origin, "proxmox"],
  ]);
  return async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const provider = providerOf.get(url.origin);
    if (!provider) throw new TypeError(`fetch failed: nothing listens at ${url.origin}`);
    const sentAt = Date.now();
    const response = await (provider === "proxmox" ? pinned : globalThis.fetch)(input, init);
    const error =
      response.status >= 400 && provider === "hetzner-robot" ? ((await response.clone().json()) as Exchange["error"]) : undefined;
    exchanges.push({ provider, sentAt, answeredAt: Date.now(), status: response.status, headers: response.headers, error });
    return response;
  };
}

beforeAll(async () => {
  for (const method of ["log", "info", "warn", "error", "debug"] as const)
    vi.spyOn(console, method).mockImplementation((...args: unknown[]) => void printed.push(format(...args)));

  hcloud = await startHetznerCloudEmulator({ token: HCLOUD_TOKEN, actionDurationMs: 40, rateLimit: { limit: 6, refillPerSecond: 20 } });
  robot = await startHetznerRobotEmulator({
    user: ROBOT_USER,
    password: ROBOT_PASSWORD,
    actionDurationMs: 40,
    limits: ROBOT_WINDOWS,
    // The tenant's 17 boxes, and one AX102 the operator takes out of the pool once its flavor exists.
    servers: [
      ...Array.from({ length: PLAN.robot }, () => ({ product: "AX41-NVMe", dc: "FSN1-DC14" })),
      { product: "AX102", dc: "FSN1-DC14" },
    ],
  });
  pve = await startProxmoxEmulator({ actionDurationMs: 0, rateLimit: { limit: 18, windowMs: 1000 }, seed: 12 });

  cp = await inProcessControlPlane({
    modules: [vps({ providers: [hetznerCloudProvider, hetznerRobotProvider, proxmoxProvider], fetch: routedFetch(), agentUrl: AGENT_URL })],
  });

  await cp.call("vps.accounts.create", { id: "hc", provider: "hetzner-cloud", config: { token: HCLOUD_TOKEN, endpoint: hcloud.url } });
  const robotConfig = { endpoint: robot.url, user: ROBOT_USER, products: EMULATED_PRODUCTS };
  await cp.call("vps.accounts.create", { id: "robot", provider: "hetzner-robot", config: { ...robotConfig, password: ROBOT_PASSWORD } });
  await cp.call("vps.accounts.create", {
    id: "pve",
    provider: "proxmox",
    config: { baseUrl: pve.url, node: pve.node, tokenId: pve.tokenId, tokenSecret: pve.tokenSecret, tls: { spkiSha256: pve.spkiSha256 } },
  });
  const pools: [PoolId, string, object][] = [
    ["hc-bcd", "hc", { agent: "bcd", location: "fsn1" }],
    ["hc-none", "hc", { location: "fsn1" }],
    ["robot", "robot", {}],
    ["robot-big", "robot", {}],
    ["pve", "pve", {}],
  ];
  await cp.call("vps.tenants.create", { id: "acme", name: "Acme Corp" });
  for (const [id, account, extra] of pools) {
    await cp.call("vps.pools.create", { id, account, ...extra });
    await cp.call("vps.quotas.set", { tenant: "acme", pool: id, instances: 20, vcpus: 1000, memoryMiB: 4_000_000, diskGiB: 100_000 });
  }
  for (const [id, pool, offer, image] of [
    ["hc-bcd", "hc-bcd", "cx22", "debian-12"],
    ["hc-none", "hc-none", "cx22", "debian-12"],
    ["robot", "robot", "AX41-NVMe", "rescue-linux"],
    ["robot-big", "robot-big", "AX102", "rescue-linux"],
    ["pve", "pve", "small", "9000"],
  ])
    await cp.call("vps.flavors.create", { id, pool, offer, image });
  // The operator takes the AX102 out of the pool: its flavor stays, no box of it is free.
  const ax41 = robot.servers().filter((s) => s.product === "AX41-NVMe");
  await cp.call("vps.accounts.update", { id: "robot", config: { ...robotConfig, servers: ax41.map((s) => s.number) } });

  const key = await cp.call<{ id: string; key: string }>("iam.apiKeys.create", { name: "acme", roles: ["vps-tenant"] });
  await cp.call("vps.tenants.addMember", { tenant: "acme", principal: `apikey:${key.id}` });
  tenantKey = key.key;
  await tenant("vps.sshKeys.create", { name: "alice", publicKey: ED25519 });
  await tenant("vps.sshKeys.create", { name: "ops", publicKey: RSA });
}, 60_000);

afterAll(async () => {
  await cp?.stop();
  await Promise.all([hcloud?.stop(), robot?.stop(), pve?.stop()]);
  vi.restoreAllMocks();
});

/** A call with the tenant's key; every answer is kept for the secrets scan. */
const answers: unknown[] = [];
async function tenant<T = any>(method: string, input: Record<string, unknown>): Promise<T> {
  const answer = await callApi<T>(cp.baseUrl, tenantKey, method, input, (request) => cp.transport.fetch(request.url, request));
  answers.push(answer);
  return answer;
}

interface Row {
  id: string;
  pool_id: PoolId;
  name: string;
  state: string;
  provider_id: string | null;
  last_error: Record<string, any> | null;
}

const textArray = (ids: string[]) => `{${ids.join(",")}}`;
const rowsOf = async (ids: string[]) =>
  (await cp.store.db.execute(sql`SELECT * FROM vps_instances WHERE id = ANY(${textArray(ids)}::text[]) ORDER BY id`))
    .rows as unknown as Row[];

/**
 * Waits for the control plane's reconcile passes (its cron tick: one pass at a time, each
 * compute.reconcile) to bring every instance to its goal state, within a bound. When none of them
 * is due before a backoff ends and no account waits out a provider's rate limit (wall-clock time at
 * the provider), business time moves on to the earliest one.
 */
async function converge(goals: Map<string, string>, budgetMs: number): Promise<Row[]> {
  const ids = [...goals.keys()];
  const deadline = Date.now() + budgetMs;
  for (;;) {
    const rows = await rowsOf(ids);
    const behind = rows.filter((r) => r.state !== goals.get(r.id));
    if (behind.length === 0) return rows;
    // Failed is for good: an instance that fails on its way elsewhere will not get there.
    const lost = behind.filter((r) => r.state === "failed" && goals.get(r.id) !== "deleted");
    if (lost.length || Date.now() > deadline)
      throw new Error(`not there: ${JSON.stringify((lost.length ? lost : behind).map((r) => [r.id, r.pool_id, r.state, r.last_error]))}`);
    const idle = (
      await cp.store.db.execute(sql`
        SELECT extract(epoch FROM min(next_attempt_at) - compute_now())::float AS wait,
               coalesce(bool_or(lease_until > compute_now()), false) AS leased,
               (SELECT count(*)::int FROM vps_accounts WHERE paused_until > compute_now()) AS paused
        FROM vps_instances WHERE id = ANY(${textArray(behind.map((r) => r.id))}::text[])`)
    ).rows[0] as { wait: number; leased: boolean; paused: number };
    if (!idle.leased && idle.paused === 0 && idle.wait > 0.5) await cp.advanceClock(Math.ceil(idle.wait));
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

const created: { id: string; pool: PoolId; name: string }[] = [];
/** Each bcd instance's join token, as its server's user data holds it. */
const joinTokens = new Map<string, string>();
let big: { id: string; name: string };
/** The tests after the first look at what it made: without it they are skipped, not failed again. */
let allRunning = false;

describe("50 instances across hetzner-cloud, hetzner-robot and proxmox under provider faults", () => {
  it("all reach running, each with exactly one server; the instance that meets no capacity fails alone with a DRIVER_ERROR", async () => {
    // Seeded shares of calls, and one of each kind whatever the draws: failed create actions of Hetzner
    // Cloud and failed start tasks of Proxmox included (a failed create job starts over from find, which
    // adopts the server it left); a failed clone inside Proxmox's create is tried again.
    hcloud.setFaults({
      rateLimitRate: 0.08,
      serverErrorRate: 0.04,
      lockedRate: 0.05,
      actionErrorRate: 0.1,
      next: { rateLimit: 1, serverError: 1, locked: 1, actionError: 1 },
      seed: 12,
    });
    robot.setFaults({
      rateLimitRate: 0.005,
      maintenanceRate: 0.015,
      resetFailedRate: 0.05,
      manualActiveRate: 0.03,
      next: { rateLimit: 1, maintenance: 1, resetFailed: 1 },
      seed: 12,
    });
    pve.faults.share(0.04, ["bad-gateway", "timeout", "locked", "lost-answer"]);
    pve.faults.next(1, "lost-answer", (method, path) => method === "POST" && path.endsWith("/clone"));
    pve.faults.failTasks(1, LOCK_TIMEOUT, ["qmclone"]);
    pve.faults.failTaskShare(0.2, LOCK_TIMEOUT, ["qmclone", "qmstart"]);

    for (const [pool, count] of Object.entries(PLAN) as [keyof typeof PLAN, number][]) {
      for (let n = 1; n <= count; n++) {
        const name = `${pool}-${n}`;
        const instance = await tenant<{ id: string }>("vps.instances.create", {
          pool,
          flavor: pool,
          name,
          sshKeys: ["alice", "ops"],
        });
        created.push({ id: instance.id, pool, name });
      }
    }
    big = await tenant<{ id: string; name: string }>("vps.instances.create", {
      pool: "robot-big",
      flavor: "robot-big",
      name: "big-1",
      sshKeys: ["alice"],
    });
    expect(created).toHaveLength(50);

    const goals = new Map([...created.map((c) => [c.id, "running"] as const), [big.id, "failed"]]);
    const rows = await converge(goals, 75_000);
    allRunning = true;
    const byId = new Map(rows.map((r) => [r.id, r]));

    // The capacity error: only its instance, a DRIVER_ERROR naming the provider and its reason.
    expect(byId.get(big.id)!.last_error).toEqual({
      code: "DRIVER_ERROR",
      message: "hetzner-robot: no free server of product AX102",
      failure: "capacity",
      provider: "hetzner-robot",
      call: "create",
      reason: "no_free_server",
    });
    const failedEvents = await cp.call<{ events: { data: any }[] }>("events.list", {
      subject: `vps/instances/${big.id}`,
      type: "vps.instance.failed",
    });
    answers.push(failedEvents);
    expect(failedEvents.events.map((e) => e.data.error)).toEqual([
      { code: "DRIVER_ERROR", message: "hetzner-robot: no free server of product AX102" },
    ]);

    // Exactly one server per instance at each provider, and it is the one the instance records.
    const idsIn = (...pools: PoolId[]) =>
      created
        .filter((c) => pools.includes(c.pool))
        .map((c) => c.id)
        .sort();
    const hcServers = hcloud.servers();
    expect(hcloud.counters.serversCreated).toBe(idsIn("hc-bcd", "hc-none").length);
    expect(hcServers.map((s) => s.labels[INSTANCE_LABEL]).sort()).toEqual(idsIn("hc-bcd", "hc-none"));
    for (const s of hcServers) expect(byId.get(s.labels[INSTANCE_LABEL]!)!.provider_id).toBe(String(s.id));

    const claims = robot.servers().filter((s) => stampOf(s.name)?.finished);
    expect(claims.map((s) => stampOf(s.name)!.instanceId).sort()).toEqual(idsIn("robot"));
    for (const s of claims) expect(byId.get(stampOf(s.name)!.instanceId)!.provider_id).toBe(String(s.number));
    expect(robot.servers().filter((s) => stampOf(s.name) && !stampOf(s.name)!.finished)).toEqual([]);
    expect(robot.servers().find((s) => s.product === "AX102")).toMatchObject({ name: "", resets: [] });

    const vms = [...pve.vms.values()].filter((vm) => vm.config.template !== "1");
    const instanceOf = (vm: (typeof vms)[number]) => /(?:^|;)bc-instance\.([\w-]+)/.exec(vm.config.tags ?? "")?.[1];
    expect(vms.map(instanceOf).sort()).toEqual(idsIn("pve"));
    for (const vm of vms) expect(byId.get(instanceOf(vm)!)!.provider_id).toBe(String(vm.vmid));
    // Every VM PVE ever made is an instance's one VM or a clone that failed (and that PVE removed again).
    const failedClones = [...pve.tasks.values()].filter((t) => t.type === "qmclone" && t.exitstatus !== "OK").length;
    expect(pve.counters.serversCreated).toBe(idsIn("pve").length + failedClones);

    // The faults were met, and the instances lived through them.
    expect(hcloud.counters.faults).toMatchObject({
      rateLimit: expect.any(Number),
      serverError: expect.any(Number),
      locked: expect.any(Number),
      actionError: expect.any(Number),
    });
    // Create jobs failed (Cloud's create_server actions, Proxmox's start tasks) and their instances still run.
    const failedStarts = [...pve.tasks.values()].filter((t) => t.type === "qmstart" && t.exitstatus !== "OK").length;
    const failedCreateJobs = await cp.store.db.execute(sql`
      SELECT count(*)::int AS n FROM vps_instance_history WHERE call = 'operation' AND detail->>'of' = 'create' AND detail->>'state' = 'failed'`);
    expect((failedCreateJobs.rows[0] as { n: number }).n).toBeGreaterThan(0);
    expect(failedStarts).toBeGreaterThan(0);
    expect(robot.counters.faults).toMatchObject({
      rateLimit: expect.any(Number),
      maintenance: expect.any(Number),
      resetFailed: expect.any(Number),
    });
    expect(pve.counters.faults.task).toBeGreaterThan(0);
    expect(pve.counters.faults["lost-answer"]).toBeGreaterThan(0);
    // What reached the reconciler was transient and tried again, but for the one capacity error.
    const recorded = (
      await cp.store.db.execute(
        sql`SELECT instance_id AS id, detail->>'failure' AS failure FROM vps_instance_history WHERE outcome = 'error'`,
      )
    ).rows as { id: string; failure: string }[];
    expect(recorded.filter((e) => e.failure !== "transient")).toEqual([{ id: big.id, failure: "capacity" }]);
    expect(recorded.length).toBeGreaterThan(1);
  }, 100_000);

  it("each server carries exactly what its user data should: the hostname, the SSH keys and, in a bcd pool, its own join token", async ({
    skip,
  }) => {
    if (!allRunning) skip();
    const rows = new Map((await rowsOf(created.map((c) => c.id))).map((r) => [r.id, r]));
    const quoted = KEYS.map((k) => `  - ${JSON.stringify(k)}`);
    for (const c of created.filter((c) => c.pool.startsWith("hc-"))) {
      const userData = hcloud.userData(Number(rows.get(c.id)!.provider_id))!;
      const lines = [`#cloud-config`, `hostname: ${JSON.stringify(c.name)}`, `ssh_authorized_keys:`, ...quoted];
      if (c.pool === "hc-bcd") {
        const token = /bcj_[0-9a-f]{16}_[A-Za-z0-9_-]{43}/.exec(userData)?.[0];
        expect(token, userData).toBeDefined();
        joinTokens.set(c.id, token!);
        lines.push(
          `write_files:`,
          `  - path: "/etc/bcd/join-token"`,
          `    permissions: "0600"`,
          `    content: ${JSON.stringify(token)}`,
          `runcmd:`,
          `  - ["bcd","join","--url","${AGENT_URL}","--attestor","provisioned","--token-file","/etc/bcd/join-token","--role","node","--state-dir","/var/lib/bcd"]`,
          `  - ["rm","-f","/etc/bcd/join-token"]`,
          `  - ["systemctl","enable","--now","bcd.service"]`,
        );
        // A single-use token for this instance's node, not yet used.
        const minted = (
          await cp.store.db.execute(sql`SELECT attestor, role, labels, consumed_at FROM bc_join_tokens WHERE id = ${token!.slice(4, 20)}`)
        ).rows[0];
        expect(minted).toEqual({
          attestor: "provisioned",
          role: "node",
          labels: { "bc.dev/vps-instance": c.id, "bc.dev/vps-pool": "hc-bcd" },
          consumed_at: null,
        });
      }
      expect(userData).toBe(`${lines.join("\n")}\n`);
    }
    expect(new Set(joinTokens.values()).size).toBe(PLAN["hc-bcd"]);
    // Each token is in its own server's user data and in nothing else the provider holds.
    for (const [id, token] of joinTokens) {
      const holders = hcloud.servers().filter((s) => JSON.stringify(s).includes(token.slice(21)));
      expect(holders.map((s) => s.labels[INSTANCE_LABEL])).toEqual([id]);
      expect(JSON.stringify({ ...holders[0], userData: undefined })).not.toContain(token.slice(21));
    }

    // Robot takes no user data: the hostname goes into the claimed box's name, the keys into its rescue system.
    const fingerprints = KEYS.map((k) => sshKeyFacts(k)!.fingerprint);
    for (const c of created.filter((c) => c.pool === "robot")) {
      const box = robot.servers().find((s) => String(s.number) === rows.get(c.id)!.provider_id)!;
      expect(box).toMatchObject({ name: `bc:${c.id} ${c.name}`, running: { system: "rescue", keys: fingerprints } });
    }
    expect(
      robot
        .keys()
        .map((k) => k.fingerprint)
        .sort(),
    ).toEqual([...fingerprints].sort());

    // Proxmox takes them through PVE's cloud-init keys: the VM's name is its hostname, the keys URL-encoded, nothing else.
    for (const c of created.filter((c) => c.pool === "pve")) {
      const vm = pve.vms.get(Number(rows.get(c.id)!.provider_id))!;
      expect(vm.config).toMatchObject({ name: c.name, tags: `bc-instance.${c.id}`, sshkeys: encodeURIComponent(KEYS.join("\n")) });
      expect(vm.config.cicustom).toBeUndefined();
    }
  });

  it("all are deleted, with failed delete actions and tasks on a share of calls: nothing is left at any provider", async ({ skip }) => {
    if (!allRunning) skip();
    hcloud.setFaults({
      rateLimitRate: 0.08,
      serverErrorRate: 0.04,
      lockedRate: 0.1,
      actionErrorRate: 0.25,
      next: { locked: 1, actionError: 1 },
      seed: 13,
    });
    pve.faults.clear();
    pve.faults.share(0.04, ["bad-gateway", "timeout", "locked", "lost-answer"]);
    pve.faults.failTasks(1, LOCK_TIMEOUT, ["qmdestroy"]);
    pve.faults.failTaskShare(0.25, LOCK_TIMEOUT, ["qmstop", "qmdestroy"]);
    const before = { hcloud: { ...hcloud.counters.faults }, pveTasks: pve.counters.faults.task, pveCreated: pve.counters.serversCreated };

    const all = [...created.map((c) => c.id), big.id];
    for (const id of all) await tenant("vps.instances.delete", { id });
    await converge(new Map(all.map((id) => [id, "deleted"])), 60_000);

    expect(hcloud.servers()).toEqual([]);
    expect(hcloud.counters.serversCreated).toBe(PLAN["hc-bcd"] + PLAN["hc-none"]);
    expect(robot.servers().filter((s) => stampOf(s.name))).toEqual([]);
    expect(
      robot
        .servers()
        .filter((s) => s.product === "AX41-NVMe")
        .map((s) => [s.name, s.power]),
    ).toEqual(Array.from({ length: PLAN.robot }, () => [FREE_NAME, "off"]));
    expect(pve.counters.liveServers()).toBe(0);
    expect(pve.counters.serversCreated).toBe(before.pveCreated);
    // Deletes met failed actions and tasks too, and were tried again.
    expect(hcloud.counters.faults.actionError ?? 0).toBeGreaterThan(before.hcloud.actionError ?? 0);
    expect(hcloud.counters.faults.locked ?? 0).toBeGreaterThan(before.hcloud.locked ?? 0);
    expect(pve.counters.faults.task).toBeGreaterThan(before.pveTasks);
    const usage = (await tenant<{ quotas: { usage: { instances: number } }[] }>("vps.quotas.list", {})).quotas.map(
      (q) => q.usage.instances,
    );
    expect(usage).toEqual([0, 0, 0, 0, 0]);
  }, 80_000);

  it("rate limits were reached and waited out: no call beyond a limit, none before a reset", ({ skip }) => {
    if (!allRunning) skip();
    const of = (provider: string) => exchanges.filter((e) => e.provider === provider);
    /** When the next call after this answer was sent (Infinity: none was). */
    const nextAfter = (e: Exchange, list: Exchange[]) =>
      Math.min(...list.filter((x) => x.sentAt >= e.answeredAt && x !== e).map((x) => x.sentAt));

    // Hetzner Cloud: its bucket ran empty (an answer said 0 left) and no call came while it was; a 429's reset was waited for.
    const hc = of("hetzner-cloud");
    expect(hc.some((e) => e.status < 400 && e.headers.get("ratelimit-remaining") === "0")).toBe(true);
    expect(hcloud.counters.overLimit).toBe(0);
    const hc429 = hc.filter((e) => e.status === 429);
    expect(hc429.length).toBeGreaterThan(0);
    for (const e of hc429) {
      const [limit, reset] = [Number(e.headers.get("ratelimit-limit")), Number(e.headers.get("ratelimit-reset")) * 1000];
      expect(nextAfter(e, hc)).toBeGreaterThanOrEqual(e.answeredAt + (reset - e.answeredAt) / limit - TIMER_SLACK_MS);
    }

    // Robot says only how long its window is: after a refusal, nothing is sent until a whole window has passed.
    const rb = of("hetzner-robot");
    const refused = rb.filter((e) => e.status === 403 && e.error?.error.code === "RATE_LIMIT_EXCEEDED");
    expect(refused.length).toBeGreaterThan(0);
    for (const e of refused) {
      expect(nextAfter(e, rb)).toBeGreaterThanOrEqual(e.answeredAt + e.error!.error.interval * 1000 - TIMER_SLACK_MS);
    }
    for (const [endpoint, limit] of Object.entries(ROBOT_WINDOWS)) expect(robot.busiestWindow(endpoint)).toBeLessThanOrEqual(limit.max);

    // Proxmox (a proxy's limit in front of it): reached, and no call came inside a window after its 429.
    expect(pve.counters.rateLimited).toBeGreaterThan(0);
    expect(pve.counters.callsWhileLimited).toBe(0);
  });

  it("no provider secret or join token is in any row of any table, any console line or any answer", async ({ skip }) => {
    if (!allRunning) skip();
    // Accounts whose credential is wrong: asking them for offers fails, and the failure is logged (a 500).
    const wrong = {
      hc: { provider: "hetzner-cloud", config: { token: "hcloud-wrong-token-4Kd9Tr6Ys1Wq8Ee5", endpoint: hcloud.url } },
      robot: {
        provider: "hetzner-robot",
        config: { endpoint: robot.url, user: ROBOT_USER, password: "robot-wrong-pw-0Zk3Pq8Rt5", products: EMULATED_PRODUCTS },
      },
      pve: {
        provider: "proxmox",
        config: {
          baseUrl: pve.url,
          node: pve.node,
          tokenId: pve.tokenId,
          tokenSecret: "0c0ffee0-dead-beef-0000-000000000000",
          tls: { spkiSha256: pve.spkiSha256 },
        },
      },
    };
    for (const [id, account] of Object.entries(wrong)) {
      await cp.call("vps.accounts.create", { id: `${id}-wrong`, ...account });
      const refused = await cp.call("vps.accounts.offers", { id: `${id}-wrong` }).catch((err: Error & { code: string }) => err);
      expect(refused).toMatchObject({ code: "INVALID_CONFIG", message: expect.stringContaining(account.provider) });
      answers.push({ message: (refused as Error).message, details: (refused as { details: unknown }).details });
    }
    const logged = printed.filter((line) => line.includes('"request failed"') && line.includes('"vps.accounts.offers"'));
    expect(logged).toHaveLength(3);

    const tables = (
      await cp.store.db.execute(sql`
        SELECT table_schema AS schema, table_name AS name FROM information_schema.tables
        WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2`)
    ).rows as { schema: string; name: string }[];
    const dumped = new Map<string, string>();
    for (const t of tables) {
      const rows = await cp.store.db.execute(sql.raw(`SELECT t::text AS row FROM "${t.schema}"."${t.name}" t`));
      dumped.set(`${t.schema}.${t.name}`, (rows.rows as { row: string }[]).map((r) => r.row).join("\n"));
    }
    // The scan covers the record of everything above: events, sealed secrets, join tokens, history, commands...
    for (const table of ["bc_events", "bc_secrets", "bc_join_tokens", "vps_instance_history", "vps_instances", "vps_accounts"])
      expect(dumped.get(`public.${table}`), table).not.toBe("");
    expect(dumped.has("public.bc_commands")).toBe(true);

    expect(joinTokens.size).toBe(PLAN["hc-bcd"]);
    const secrets = {
      "the Hetzner Cloud token": HCLOUD_TOKEN,
      "the Robot password": ROBOT_PASSWORD,
      "the Robot credentials as Basic auth": Buffer.from(`${ROBOT_USER}:${ROBOT_PASSWORD}`).toString("base64"),
      "the Proxmox token secret": pve.tokenSecret,
      "a wrong Hetzner Cloud token": wrong.hc.config.token,
      "a wrong Robot password": wrong.robot.config.password,
      "a wrong Proxmox token secret": wrong.pve.config.tokenSecret,
      "the tenant's API key": tenantKey,
      ...Object.fromEntries(
        [...joinTokens].flatMap(([id, token]) => [
          [`${id}'s join token`, token],
          [`${id}'s join token's secret`, token.slice(21)],
        ]),
      ),
    };
    const places = {
      ...Object.fromEntries(dumped),
      "the console": printed.join("\n"),
      "the API's answers": JSON.stringify(answers),
      // Join tokens went to Hetzner Cloud alone (checked above): the other providers never saw one.
      "the Robot account": JSON.stringify([robot.servers(), robot.keys()]),
      "the Proxmox node": JSON.stringify([...pve.vms.values()]),
    };
    const found = Object.entries(secrets).flatMap(([what, secret]) =>
      Object.entries(places)
        .filter(([, text]) => text.includes(secret))
        .map(([where]) => `${what} in ${where}`),
    );
    expect(found).toEqual([]);
  });
});
