// GET /metrics (docs/metrics.md) scraped as Prometheus scrapes it, from a site whose three machines
// reached ready, and read with the Prometheus project's own OpenMetrics parser (Debian's
// python3-prometheus-client, unmodified, through test/support/openmetrics-parse.py): every family
// has its TYPE and HELP, the exposition ends in # EOF, and each count is the one the API reports
// (metal.nodes.list, workflows, commands, nodes, vps.instances.list, capacity.hosts.list,
// events.sinks.list). A key without metrics.read is refused (403), a request without one too (401).
// SIMULATED: the machines and their BMCs (createMetalSim), the hosting provider (the Hetzner Cloud
// emulator) and a host's agent (FakeDaemon); the control plane is the real betterCompute on PGlite.
import { execFile, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineSink, definePlugin } from "better-compute";
import { capacity } from "better-compute/capacity";
import { hetznerCloudProvider } from "better-compute/hetzner-cloud";
import { FakeDaemon } from "better-compute/testing";
import { startHetznerCloudEmulator, type HetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";
import { vps } from "better-compute/vps";
import { eventually } from "../support/eventually.ts";
import { refusal } from "../support/refusal.ts";

const PYTHON = "/usr/bin/python3";
const PARSER = new URL("../support/openmetrics-parse.py", import.meta.url).pathname;
const HCLOUD_TOKEN = "hcloud-metrics-token-Mx4Qw8Zr2Lk6";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const MIB = 1024 ** 2;
const GIB = 1024 ** 3;

/** Whether Debian's python3-prometheus-client is there (.ci/run installs it). */
const parserInstalled = spawnSync(PYTHON, ["-c", "import prometheus_client.openmetrics.parser"]).status === 0;

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
interface Family {
  name: string;
  type: string;
  unit: string;
  help: string;
  samples: Sample[];
}

/** An events sink the simulation never drives (it has no SinkDO): its lag is every event written. */
const idleSink = definePlugin({
  id: "metrics-idle-sink",
  extensions: [defineSink({ id: "metrics-idle", kind: "events", deliver: async () => {} })],
});

let sim: MetalSim;
let emu: HetznerCloudEmulator;
let host: FakeDaemon;
const keys = { metrics: "", viewer: "", tenant: "" };

beforeAll(async () => {
  emu = await startHetznerCloudEmulator({ token: HCLOUD_TOKEN });
  sim = await createMetalSim({ machines: 3, modules: [capacity(), vps({ providers: [hetznerCloudProvider] }), idleSink] });
  const compute = sim.control.compute!;
  for (const [name, roles] of [
    ["metrics", ["metrics"]],
    ["viewer", ["viewer"]],
    ["tenant", ["vps-tenant"]],
  ] as const) {
    keys[name] = (await compute.mintApiKey(sim.store, { name: `metrics-test-${name}`, roles: [...roles] })).key;
  }

  // Three machines commissioned to ready by the site agent, through the BMCs.
  for (const [i, machine] of sim.machines.entries()) await sim.enroll(machine, { id: `m-${i}` });
  for (const i of [0, 1, 2]) expect((await sim.waitForState(`m-${i}`, ["ready", "failed"], 90_000)).state).toBe("ready");

  // A provider pool's instance, driven to running by the vps reconciler.
  await sim.call("vps.accounts.create", { id: "hc", provider: "hetzner-cloud", config: { token: HCLOUD_TOKEN, endpoint: emu.url } });
  await sim.call("vps.pools.create", { id: "hc-fsn", account: "hc", location: "fsn1" });
  await sim.call("vps.tenants.create", { id: "acme", name: "Acme" });
  await sim.call("vps.quotas.set", { tenant: "acme", pool: "hc-fsn", instances: 2, vcpus: 4, memoryMiB: 8192, diskGiB: 100 });
  await sim.call("vps.flavors.create", { id: "small", pool: "hc-fsn", offer: "cx22", image: "debian-12" });
  await sim.call("vps.sshKeys.create", { tenant: "acme", name: "alice", publicKey: KEY });
  const { id } = await sim.call<{ id: string }>("vps.instances.create", {
    tenant: "acme",
    pool: "hc-fsn",
    flavor: "small",
    name: "web-1",
    sshKeys: ["alice"],
  });
  await eventually(
    () => sim.call<{ state: string }>("vps.instances.get", { id }),
    (i) => i.state === "running",
    "the instance running",
    { ms: 60_000 },
  );

  // A host whose agent reports its resources, and a hold booked on it.
  host = new FakeDaemon({
    baseUrl: sim.control.baseUrl,
    transport: sim.control.transport,
    role: "node",
    resources: { cpus: 16, memoryMiB: 65536, diskGiB: 500, devices: [] },
  });
  await host.join((await sim.call<{ token: string }>("joinTokens.create", { role: "node" })).token);
  await host.connect();
  await sim.call("capacity.holds.create", { vcpus: 4, memoryMiB: 8192, diskGiB: 40, ttlSeconds: 3600 });
}, 240_000);

afterAll(async () => {
  await host?.stop();
  await sim?.stop();
  await emu?.stop();
});

const get = (headers: Record<string, string> = {}) => sim.control.transport.fetch(`${sim.control.baseUrl}/metrics`, { headers });
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

/** One scrape as Prometheus makes it, parsed by Prometheus' parser; the raw text beside. */
async function scrape(): Promise<{ text: string; families: Map<string, Family> }> {
  const res = await get({ ...bearer(keys.metrics), accept: "application/openmetrics-text; version=1.0.0" });
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toBe("application/openmetrics-text; version=1.0.0; charset=utf-8");
  const text = await res.text();
  const parsed = await new Promise<string>((resolve, reject) => {
    const child = execFile(PYTHON, [PARSER], { maxBuffer: 16 * MIB }, (err, stdout, stderr) =>
      err ? reject(new Error(stderr || String(err))) : resolve(stdout),
    );
    child.stdin!.end(text);
  });
  return { text, families: new Map((JSON.parse(parsed) as Family[]).map((f) => [f.name, f])) };
}

/** The family's samples named `sample` (default: the family's own) as label set → value. */
function values(families: Map<string, Family>, family: string, labels: string[], sample = family): Record<string, number> {
  const found = families.get(family);
  if (!found) throw new Error(`no family ${family} in the scrape`);
  return Object.fromEntries(found.samples.filter((s) => s.name === sample).map((s) => [labels.map((l) => s.labels[l]).join("/"), s.value]));
}

/** Counts of items by key, as a record (what an API list is compared with). */
function tally<T>(items: T[], key: (item: T) => string, weight: (item: T) => number = () => 1): Record<string, number> {
  const out: Record<string, number> = {};
  for (const item of items) out[key(item)] = (out[key(item)] ?? 0) + weight(item);
  return out;
}

const nonZero = (record: Record<string, number>) => Object.fromEntries(Object.entries(record).filter(([, v]) => v !== 0));

/**
 * The API's answer and the scrape's agree: read the API, scrape, read the API again, until both
 * API reads are the same (nothing moved meanwhile) and the scrape says what they say.
 */
async function agree(
  what: string,
  api: () => Promise<Record<string, number>>,
  metric: (families: Map<string, Family>) => Record<string, number>,
) {
  const seen = await eventually(
    async () => {
      const before = await api();
      const scraped = metric((await scrape()).families);
      return { before, scraped, after: await api() };
    },
    (r) => JSON.stringify(r.before) === JSON.stringify(r.after) && JSON.stringify(sorted(r.scraped)) === JSON.stringify(sorted(r.before)),
    `${what}: the scrape agreeing with the API`,
    { ms: 20_000 },
  );
  expect(Object.keys(seen.scraped).length, `${what} has series`).toBeGreaterThan(0);
}

const sorted = (record: Record<string, number>) => Object.fromEntries(Object.entries(record).sort(([a], [b]) => a.localeCompare(b)));

describe("who may scrape", () => {
  it("refuses a request without a key (401) and a key whose roles lack metrics.read (403), in the API's error shape", async () => {
    const anonymous = await get();
    expect(anonymous.status).toBe(401);
    expect(await anonymous.json()).toMatchObject({ code: "UNAUTHENTICATED", requestId: expect.any(String) });

    const tenant = await get(bearer(keys.tenant));
    expect(tenant.status).toBe(403);
    expect(await tenant.json()).toMatchObject({
      code: "PERMISSION_DENIED",
      details: { action: "metrics.read", resource: "*" },
      requestId: expect.any(String),
    });
  });

  it("serves a key of the metrics role and a viewer's; the metrics role reads nothing else", async () => {
    expect((await get(bearer(keys.metrics))).status).toBe(200);
    expect((await get(bearer(keys.viewer))).status).toBe(200);
    const err = await refusal(sim.control.callAs(keys.metrics, "metal.nodes.list", {}));
    expect(err.code).toBe("PERMISSION_DENIED");
  });
});

describe.skipIf(!parserInstalled)(
  "the exposition (skipped only when Debian's python3-prometheus-client is not installed: apt-get install python3-prometheus-client)",
  () => {
    it("parses as OpenMetrics, ends in # EOF, gives every family its TYPE and HELP, and docs/metrics.md lists every family", async () => {
      const { text, families } = await scrape();
      expect(text.endsWith("\n# EOF\n")).toBe(true);
      const docs = readFileSync(new URL("../../docs/metrics.md", import.meta.url), "utf8");
      const lines = text.split("\n");
      for (const family of families.values()) {
        expect(lines, family.name).toContain(`# TYPE ${family.name} ${family.type}`);
        expect(lines.some((l) => l.startsWith(`# HELP ${family.name} `)) && family.help !== "", `${family.name} has HELP`).toBe(true);
        expect(["gauge", "gaugehistogram"], family.name).toContain(family.type);
        expect(docs, `docs/metrics.md lists ${family.name}`).toContain(`\`${family.name}\``);
      }
      // Every module's collector ran; each contributed what docs/metrics.md promises.
      expect(values(families, "bc_metrics_collector_up", ["module"])).toEqual({
        agents: 1,
        sinks: 1,
        provision: 1,
        metal: 1,
        capacity: 1,
        vps: 1,
      });
      expect([...families.keys()].sort()).toEqual(
        [
          "bc_agents_connected",
          "bc_commands_open",
          "bc_command_round_trip_seconds",
          "bc_sink_lag_events",
          "bc_sink_lag_seconds",
          "bc_sink_dead_letters",
          "bc_workflows_active",
          "bc_workflows_finished",
          "bc_workflow_step_duration_seconds",
          "bc_metal_machines",
          "bc_host_cpus",
          "bc_host_cpus_used",
          "bc_host_memory_bytes",
          "bc_host_memory_used_bytes",
          "bc_host_disk_bytes",
          "bc_host_disk_used_bytes",
          "bc_vps_instances",
          "bc_metrics_collector_up",
          "bc_metrics_collector_duration_seconds",
        ].sort(),
      );
    });

    it("has docs/grafana/better-compute.json query the families scraped, every one of them", async () => {
      const dashboard = JSON.parse(readFileSync(new URL("../../docs/grafana/better-compute.json", import.meta.url), "utf8")) as {
        panels: { targets?: { expr: string }[] }[];
        templating: { list: { query?: unknown }[] };
      };
      const queries = [
        ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
        ...dashboard.templating.list.map((v) => JSON.stringify(v.query ?? "")),
      ];
      const used = new Set(queries.flatMap((q) => q.match(/\bbc_[a-z_]+/g) ?? []).map((n) => n.replace(/_(bucket|gcount|gsum)$/, "")));
      const { families } = await scrape();
      expect(
        [...used].filter((name) => !families.has(name)),
        "queried but not served",
      ).toEqual([]);
      expect(
        [...families.keys()].filter((name) => !used.has(name)),
        "served but on no panel",
      ).toEqual([]);
    });

    it("counts the machines by state, pool and site as metal.nodes.list lists them, every state of the pool reported", async () => {
      await agree(
        "machines",
        async () =>
          tally(
            (await sim.call<{ nodes: { state: string; pool: string; site: string }[] }>("metal.nodes.list")).nodes,
            (n) => `${n.site}/${n.pool}/${n.state}`,
          ),
        (f) => nonZero(values(f, "bc_metal_machines", ["site", "pool", "state"])),
      );
      const machines = values((await scrape()).families, "bc_metal_machines", ["site", "pool", "state"]);
      expect(machines[`${sim.site.id}/${sim.site.pool}/ready`]).toBe(3);
      expect(machines[`${sim.site.id}/${sim.site.pool}/failed`]).toBe(0);
    });

    it("counts the workflows and their step attempts of the window as workflows.list and workflows.get report them", async () => {
      type Workflow = { id: string; profile: string; state: string };
      const workflows = async () => (await sim.call<{ workflows: Workflow[] }>("workflows.list", { limit: 100 })).workflows;
      await agree(
        "workflows finished",
        async () =>
          tally(
            (await workflows()).filter((w) => w.state !== "running" && w.state !== "awaiting-approval"),
            (w) => `${w.profile}/${w.state}`,
          ),
        (f) => values(f, "bc_workflows_finished", ["profile", "state"]),
      );
      await agree(
        "succeeded step attempts",
        async () => {
          const found = await Promise.all(
            (await workflows()).map((w) =>
              sim.call<{ profile: string; steps: { name: string; attempts: { state: string }[] }[] }>("workflows.get", { id: w.id }),
            ),
          );
          return tally(
            found.flatMap((w) =>
              w.steps.map((s) => ({ key: `${w.profile}/${s.name}`, n: s.attempts.filter((a) => a.state === "succeeded").length })),
            ),
            (s) => s.key,
            (s) => s.n,
          );
        },
        (f) => values(f, "bc_workflow_step_duration_seconds", ["profile", "step"], "bc_workflow_step_duration_seconds_gcount"),
      );
      const { families } = await scrape();
      expect(values(families, "bc_workflows_active", ["profile", "state"])).toEqual({});
      const sums = values(families, "bc_workflow_step_duration_seconds", ["profile", "step"], "bc_workflow_step_duration_seconds_gsum");
      expect(Object.values(sums).every((s) => s >= 0)).toBe(true);
    });

    it("counts the command round trips of the window by kind, and the agents connected by role, as the API lists them", async () => {
      type Node = { id: string; role: string; state: string };
      const nodes = async () => (await sim.call<{ nodes: Node[] }>("nodes.list")).nodes;
      await agree(
        "agents connected",
        async () => ({
          node: 0,
          site: 0,
          ramdisk: 0,
          ...tally(
            (await nodes()).filter((n) => n.state === "connected"),
            (n) => n.role,
          ),
        }),
        (f) => values(f, "bc_agents_connected", ["role"]),
      );
      await agree(
        "command round trips",
        async () => {
          const lists = await Promise.all(
            (await nodes()).map((n) =>
              sim.call<{ commands: { kind: string; state: string }[] }>("commands.list", { node: n.id, limit: 1000 }),
            ),
          );
          return tally(
            lists.flatMap((l) => l.commands).filter((c) => ["succeeded", "failed", "expired"].includes(c.state)),
            (c) => `${c.kind}/${c.state}`,
          );
        },
        (f) => values(f, "bc_command_round_trip_seconds", ["kind", "state"], "bc_command_round_trip_seconds_gcount"),
      );
    });

    it("counts the VPS instances by pool and state as vps.instances.list lists them", async () => {
      await agree(
        "instances",
        async () =>
          tally(
            (await sim.call<{ instances: { pool: string; state: string }[] }>("vps.instances.list", { limit: 100 })).instances,
            (i) => `${i.pool}/${i.state}`,
          ),
        (f) => nonZero(values(f, "bc_vps_instances", ["pool", "state"])),
      );
      expect(values((await scrape()).families, "bc_vps_instances", ["pool", "class", "state"])["hc-fsn/provider/running"]).toBe(1);
    });

    it("reports each host's capacity and what its reservations use as capacity.hosts.list does, in bytes", async () => {
      type Amounts = { vcpus: number; memoryMiB: number; diskGiB: number };
      const hosts = async () =>
        (await sim.call<{ hosts: { node: string; capacity: Amounts | null; used: Amounts }[] }>("capacity.hosts.list")).hosts;
      const asMetrics = (h: { node: string; capacity: Amounts | null; used: Amounts }) => ({
        [`bc_host_cpus/${h.node}`]: h.capacity!.vcpus,
        [`bc_host_cpus_used/${h.node}`]: h.used.vcpus,
        [`bc_host_memory_bytes/${h.node}`]: h.capacity!.memoryMiB * MIB,
        [`bc_host_memory_used_bytes/${h.node}`]: h.used.memoryMiB * MIB,
        [`bc_host_disk_bytes/${h.node}`]: h.capacity!.diskGiB * GIB,
        [`bc_host_disk_used_bytes/${h.node}`]: h.used.diskGiB * GIB,
      });
      const families = [
        "bc_host_cpus",
        "bc_host_cpus_used",
        "bc_host_memory_bytes",
        "bc_host_memory_used_bytes",
        "bc_host_disk_bytes",
        "bc_host_disk_used_bytes",
      ];
      await agree(
        "host capacity",
        async () => Object.assign({}, ...(await hosts()).map(asMetrics)),
        (f) =>
          Object.fromEntries(
            families.flatMap((name) => Object.entries(values(f, name, ["node"])).map(([node, v]) => [`${name}/${node}`, v])),
          ),
      );
      const { families: scraped } = await scrape();
      expect(values(scraped, "bc_host_cpus_used", ["node"])[host.nodeId!]).toBe(4);
      expect(values(scraped, "bc_host_memory_used_bytes", ["node"])[host.nodeId!]).toBe(8192 * MIB);
    });

    it("reports each sink's lag and dead letters as events.sinks.list does", async () => {
      type Sink = { id: string; source: string; lag: { behind: number; oldestAgeSeconds: number | null }; deadLetters: number };
      const sinks = async () => (await sim.call<{ sinks: Sink[] }>("events.sinks.list")).sinks;
      await agree(
        "sinks",
        async () =>
          Object.fromEntries(
            (await sinks()).flatMap((s) => [
              [`lag/${s.id}/${s.source}`, s.lag.behind],
              [`dead/${s.id}/${s.source}`, s.deadLetters],
            ]),
          ),
        (f) => ({
          ...Object.fromEntries(Object.entries(values(f, "bc_sink_lag_events", ["sink", "source"])).map(([k, v]) => [`lag/${k}`, v])),
          ...Object.fromEntries(Object.entries(values(f, "bc_sink_dead_letters", ["sink", "source"])).map(([k, v]) => [`dead/${k}`, v])),
        }),
      );
      const { families } = await scrape();
      expect(values(families, "bc_sink_lag_events", ["sink"])["metrics-idle"]).toBeGreaterThan(0);
      expect(values(families, "bc_sink_lag_seconds", ["sink"])["metrics-idle"]).toBeGreaterThan(0);
    });
  },
);
