// The `better-compute` CLI as an operator runs it (spawned, talking HTTP): commands generated
// from the live /openapi.json, flags from each method's input schema, tables or --json, typed
// errors with their request id and reasons and a non-zero exit, tokens shown once, finding a running
// local stack (for a key given alone too), the method catalog cached and revalidated by ETag, and
// metal enroll/deploy waiting on the machine with each step of its workflow shown.
// The stack is the node project's shared one (test/support/shared-stack.ts; docs.test.ts uses it
// too): this file reads only what it made (its site, pool and machine), and docs.test.ts joins no
// site agent and starts no workflow. SIMULATED: the machines, disks and BMCs (createMetalSim's
// site, its agents over real WebSockets to the stack).
import { execFile } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { z } from "zod";
import { betterCompute, definePlugin } from "better-compute";
import { defineMethod } from "better-compute/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createImageCache, simulatedDiskImage } from "../../testing/image-server.ts";
import { createMetalSim, SIM_BMC_PASSWORD, SIM_BMC_USER, type MetalSim } from "../../testing/metal-sim.ts";
import { metalModule } from "../../plugins/metal/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import type { JsonSchema } from "../../cli/api.ts";
import { buildBody, flagTakesValue, splitArgs } from "../../cli/args.ts";
import { workflowLines, type WorkflowView } from "../../cli/progress.ts";
import { openNodeStore, repoRoot, type NodeStore } from "../../local/node-store.ts";
import { sharedStack, type SharedStack } from "../support/shared-stack.ts";
import { tempDirs } from "../support/temp-dirs.ts";

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** `better-compute …` as a user types it; env replaces the connection variables. */
function cli(args: string[], env: Record<string, string> = {}, stdin?: string): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [path.join(repoRoot, "scripts/better-compute.mjs"), ...args],
      {
        cwd: os.tmpdir(),
        env: { ...process.env, BC_URL: "", BC_API_KEY: "", BC_DATA_DIR: noStackDir, XDG_CACHE_HOME: cacheHome, ...env },
        timeout: 120_000,
      },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin!.end(stdin ?? "");
  });
}

const tempDir = tempDirs();
/** A data dir without a stack: the CLI must not find some other stack's local.json. */
const noStackDir = tempDir("bc-cli-nostack-");
/** Where the CLI caches each API's methods (cli/catalog.ts), instead of the user's ~/.cache. */
const cacheHome = tempDir("bc-cli-cache-");

describe("arguments from a method's input schema", () => {
  const input: JsonSchema = {
    type: "object",
    properties: {
      node: { type: "string" },
      count: { type: "integer" },
      ratio: { type: "number" },
      force: { type: "boolean" },
      roles: { type: "array", items: { type: "string" } },
      bmc: { type: "object", properties: { address: { type: "string" }, port: { type: "integer" } }, required: ["address"] },
      input: { type: "object", additionalProperties: {} },
    },
    required: ["node"],
  };
  const body = (argv: string[], stdin = "") => {
    const { words, flags } = splitArgs(argv, (name, next) => flagTakesValue(input, name, next));
    return buildBody({ command: "demo run", input, words, flags, stdin: async () => stdin });
  };

  it("coerces by type, sets nested keys from dotted flags, and fills node from the first argument", async () => {
    expect(
      await body([
        "m-1",
        "--count",
        "3",
        "--ratio",
        "0.5",
        "--force",
        "--roles",
        "admin",
        "--roles",
        "viewer",
        "--bmc.address",
        "https://10.0.0.5",
        "--bmc.port=443",
        "--input.image.url",
        "http://x/i",
      ]),
    ).toEqual({
      node: "m-1",
      count: 3,
      ratio: 0.5,
      force: true,
      roles: ["admin", "viewer"],
      bmc: { address: "https://10.0.0.5", port: 443 },
      input: { image: { url: "http://x/i" } },
    });
    expect(await body(["--force", "false", "--node", "m-2", "--roles", '["a","b"]', "--input", '{"a":1}'])).toEqual({
      node: "m-2",
      force: false,
      roles: ["a", "b"],
      input: { a: 1 },
    });
    // --body gives the whole body (here from stdin); flags are laid over it.
    expect(await body(["--body", "-", "--count", "2"], '{"node":"m-3","count":1,"bmc":{"address":"a"}}')).toEqual({
      node: "m-3",
      count: 2,
      bmc: { address: "a" },
    });
  });

  it("refuses unknown flags with the known ones, and values of the wrong type", async () => {
    await expect(body(["--nod", "m-1"])).rejects.toThrow(
      "unknown flag --nod for demo run; its flags: --node, --count, --ratio, --force, --roles, --bmc, --bmc.address, --bmc.port, --input",
    );
    await expect(body(["--bmc.user", "x"])).rejects.toThrow("unknown flag --bmc.user");
    await expect(body(["--count", "2.5"])).rejects.toThrow('--count takes a whole number, not "2.5"');
    await expect(body(["--input", "{nope"])).rejects.toThrow("--input takes JSON");
    await expect(body(["m-1", "m-2"])).rejects.toThrow("takes at most one argument");
  });
});

describe("the workflow progress view", () => {
  // workflows.get answers as a poller sees a flaky step: failed, retried, failed, retried, succeeded.
  const base = {
    id: "wf-1",
    profile: "acme.flaky",
    version: "1",
    target: "n-1",
    position: 0,
    error: null,
    createdBy: "apikey:test",
    createdAt: "2026-01-01T00:00:00.000Z",
    finishedAt: null,
  };
  const attempt = (n: number, state: string, extra: Partial<WorkflowView["steps"][number]["attempts"][number]> = {}) => ({
    attempt: n,
    state,
    error: null,
    commandId: null,
    polls: 0,
    startedAt: state === "scheduled" ? null : `2026-01-01T00:00:0${n}.000Z`,
    finishedAt: null,
    ...extra,
  });
  const answer = (state: string, attempts: ReturnType<typeof attempt>[], finishedAt: string | null = null): WorkflowView => ({
    ...base,
    state,
    finishedAt,
    steps: [{ position: 0, name: "acme.flaky", step: "acme.flaky", attempts }],
  });
  const failed = (n: number) =>
    attempt(n, "failed", {
      error: { code: "DRIVER_ERROR", message: `the widget API answered 503 (attempt ${n})` },
      finishedAt: `2026-01-01T00:00:0${n}.500Z`,
    });
  const answers = [
    answer("running", [attempt(1, "ready")]),
    answer("running", [failed(1), attempt(2, "scheduled")]),
    answer("running", [failed(1), attempt(2, "not_ready", { error: { code: "NOT_READY", message: "the widget is drying" }, polls: 1 })]),
    answer("running", [failed(1), attempt(2, "not_ready", { error: { code: "NOT_READY", message: "the widget is drying" }, polls: 2 })]),
    answer("running", [failed(1), failed(2), attempt(3, "scheduled")]),
    answer(
      "succeeded",
      [failed(1), failed(2), attempt(3, "succeeded", { finishedAt: "2026-01-01T00:00:04.000Z" })],
      "2026-01-01T00:00:04.000Z",
    ),
  ];

  it("prints each attempt and retry with its error, once, as it happens", () => {
    const lines = answers.flatMap((next, i) => workflowLines(answers[i - 1], next));
    expect(lines).toEqual([
      "workflow wf-1: acme.flaky@1 on n-1, running, created 2026-01-01T00:00:00.000Z",
      "  ▸ [1] acme.flaky started",
      "  ✖ [1] acme.flaky failed: DRIVER_ERROR the widget API answered 503 (attempt 1)",
      "  ↻ [1] acme.flaky attempt 2 scheduled (retry)",
      "  ▸ [1] acme.flaky attempt 2 started",
      "    … [1] acme.flaky not ready: the widget is drying",
      "  ✖ [1] acme.flaky attempt 2 failed: DRIVER_ERROR the widget API answered 503 (attempt 2)",
      "  ↻ [1] acme.flaky attempt 3 scheduled (retry)",
      "  ▸ [1] acme.flaky attempt 3 started",
      "  ✔ [1] acme.flaky succeeded on attempt 3 (1.0 s)",
      "✔ workflow wf-1 succeeded (4.0 s)",
    ]);
    // Seen only at its end (workflows get, or watch after the fact): the same story, without the retries' scheduling.
    expect(workflowLines(undefined, answers.at(-1)!)).toEqual([
      "workflow wf-1: acme.flaky@1 on n-1, succeeded, created 2026-01-01T00:00:00.000Z",
      "  ▸ [1] acme.flaky started",
      "  ✖ [1] acme.flaky failed: DRIVER_ERROR the widget API answered 503 (attempt 1)",
      "  ▸ [1] acme.flaky attempt 2 started",
      "  ✖ [1] acme.flaky attempt 2 failed: DRIVER_ERROR the widget API answered 503 (attempt 2)",
      "  ▸ [1] acme.flaky attempt 3 started",
      "  ✔ [1] acme.flaky succeeded on attempt 3 (1.0 s)",
      "✔ workflow wf-1 succeeded (4.0 s)",
    ]);
  });
});

describe("better-compute against the local stack", () => {
  let stack: SharedStack;
  let sim: MetalSim;
  let images: { url: string; stop(): Promise<void> };
  let pluginApi: PluginApi;
  const cache = createImageCache();
  const image = cache.put(simulatedDiskImage("a simulated host image\n".repeat(1000)));
  const connected = () => ({ BC_URL: stack.url, BC_API_KEY: stack.adminKey });

  beforeAll(async () => {
    stack = await sharedStack();
    images = await cache.serve();
    sim = await createMetalSim({ stack, machines: 1, siteId: "cli-site" });
    pluginApi = await servePluginApi(stack);
  }, 180_000);
  afterAll(async () => {
    await pluginApi?.stop();
    await sim?.stop();
    await images?.stop();
  });

  it("lists the API's methods as commands, with their summaries and flags", async () => {
    const help = await cli(["help"], connected());
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/\n {2}metal deploy +Deploy a ready machine with a profile/);
    expect(help.stdout).toMatch(/\n {2}iam whoami +The caller's principal and roles/);
    expect(help.stdout).toContain("workflows watch <id>");

    const deploy = await cli(["metal", "deploy", "--help"], connected());
    expect(deploy.code).toBe(0);
    expect(deploy.stdout).toMatch(/--profile +string, required/);
    expect(deploy.stdout).toContain("The first argument is --node.");
    expect(deploy.stdout).toContain("Waits until the machine is deployed");

    const group = await cli(["metal", "nodes"], connected());
    expect(group.code).toBe(2);
    expect(group.stdout).toMatch(/metal nodes list/);
  });

  it("prints a method's answer as key: value lines or a table, and raw with --json", async () => {
    const whoami = await cli(["iam", "whoami"], connected());
    expect(whoami.code).toBe(0);
    expect(whoami.stdout).toBe(`principal: apikey:${stack.adminKey.split("_")[1]}\nroles: admin\n`);
    expect(JSON.parse((await cli(["iam", "whoami", "--json"], connected())).stdout)).toEqual({
      principal: `apikey:${stack.adminKey.split("_")[1]}`,
      roles: ["admin"],
    });

    const nodes = await cli(["nodes", "list", "--role", "site"], connected());
    expect(nodes.code).toBe(0);
    const [header, ...rows] = nodes.stdout.trim().split("\n");
    expect(header).toMatch(/^ID +ROLE +STATE +HOSTNAME/);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatch(new RegExp(`^${sim.site.agentNodeId} +site +connected +cli-site-agent`));

    const raw = await cli(["call", "modules.list", "{}"], connected());
    expect(raw.stdout).toMatch(/^ID +VERSION +KIND +METHODS/);

    // Not a terminal here, so no width to fit; --wide is understood wherever it is.
    const wide = await cli(["nodes", "list", "--wide", "--role", "site"], connected());
    expect(wide.code, wide.stderr).toBe(0);
    expect(wide.stdout).toBe(nodes.stdout);
  });

  it("events list shows the newest first, unless --order asc", async () => {
    const positions = async (...args: string[]) => {
      const run = await cli(["events", "list", "--limit", "5", "--json", ...args], connected());
      expect(run.code, run.stderr).toBe(0);
      return (JSON.parse(run.stdout) as { events: { position: string }[] }).events.map((e) => BigInt(e.position));
    };
    // More events than a page holds, whatever ran on the shared stack before: the pages then differ.
    for (let i = 0; i < 6; i++) expect((await cli(["metal", "sites", "create", "--id", `cli-order-${i}`], connected())).code).toBe(0);
    const newest = await positions();
    expect(newest.length).toBeGreaterThan(1);
    expect(newest).toEqual([...newest].sort((a, b) => (a > b ? -1 : 1)));
    const oldest = await positions("--order", "asc");
    expect(oldest).toEqual([...oldest].sort((a, b) => (a < b ? -1 : 1)));
    expect(oldest[0]!).toBeLessThan(newest.at(-1)!);
    expect((await cli(["events", "list", "--help"], connected())).stdout).toContain("The CLI sends --order desc unless given.");
  });

  it("finds a running local stack by its local.json, and says what to set when there is none", async () => {
    const found = await cli(["iam", "whoami"], { BC_DATA_DIR: stack.dataDir });
    expect(found.code, found.stderr).toBe(0);
    expect(found.stdout).toContain("roles: admin");

    const none = await cli(["nodes", "list"]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("set BC_URL and BC_API_KEY (or pass --url and --api-key)");
    expect(none.stderr).toContain("npm start");

    // A key given alone goes to the running stack too: here a viewer's, not the stack's admin key.
    const minted = await cli(["iam", "apiKeys", "create", "--name", "cli-viewer", "--roles", "viewer", "--json"], connected());
    expect(minted.code, minted.stderr).toBe(0);
    const viewerKey = (JSON.parse(minted.stdout) as { key: string }).key;
    for (const run of [
      await cli(["iam", "whoami"], { BC_DATA_DIR: stack.dataDir, BC_API_KEY: viewerKey }),
      await cli(["iam", "whoami", "--api-key", viewerKey], { BC_DATA_DIR: stack.dataDir }),
    ]) {
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toContain("roles: viewer");
    }

    // A local.json whose process is gone is not a running stack.
    const stale = tempDir("bc-cli-stale-");
    fs.writeFileSync(path.join(stale, "local.json"), JSON.stringify({ url: stack.url, adminKey: stack.adminKey, pid: 2 ** 22 + 1 }));
    expect((await cli(["iam", "whoami"], { BC_DATA_DIR: stale })).code).toBe(2);
  });

  it("reports an API error with its code and request id, and exits non-zero; refuses unknown flags before sending", async () => {
    const missing = await cli(["metal", "nodes", "get", "m-nope"], connected());
    expect(missing.code).toBe(1);
    expect(missing.stdout).toBe("");
    expect(missing.stderr).toMatch(/^error NOT_FOUND: metal node m-nope does not exist \(request id [0-9a-f-]{36}\)\n$/);

    const wrongKey = `bck_0000000000000000_${"x".repeat(43)}`;
    const refused = await cli(["iam", "whoami"], { BC_URL: stack.url, BC_API_KEY: wrongKey });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^error UNAUTHENTICATED: /);
    expect(refused.stderr).not.toContain(wrongKey);

    const typo = await cli(["metal", "deploy", "m-1", "--profil", "x"], connected());
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("unknown flag --profil for metal deploy; its flags: --node, --profile, --version, --input");
  });

  it("a refusal prints its reasons: a BMC binding its power driver's manifest refuses", async () => {
    const bmc = { address: "https://10.9.9.9/redfish/v1/Systems/1", username: "admin", password: "pw", rescueKeys: ["ssh-ed25519 AAAA"] };
    const refused = await cli(["metal", "enroll", "m-refused", "--pool", "cli-site-pool", "--body", JSON.stringify({ bmc })], connected());
    expect(refused.code).toBe(1);
    const [first, ...reasons] = refused.stderr.trimEnd().split("\n");
    expect(first).toMatch(
      /^error INVALID_ARGUMENT: the BMC binding does not match driver redfish's manifest \(request id [0-9a-f-]{36}\)$/,
    );
    expect(reasons).toContainEqual(expect.stringMatching(/^ {2}.*rescueKeys/));
    expect(refused.stderr).not.toContain("pw");
  });

  it("caches the API's methods per URL: a call revalidates them with one conditional GET beside its own request", async () => {
    const home = tempDir("bc-cli-cache-");
    const env = { BC_URL: pluginApi.url, BC_API_KEY: stack.adminKey, XDG_CACHE_HOME: home };
    const requests = async (args: string[]) => {
      pluginApi.requests.length = 0;
      const run = await cli(args, env);
      expect(run.code, run.stderr).toBe(0);
      return pluginApi.requests.sort();
    };
    expect(await requests(["iam", "whoami"])).toEqual(["GET /openapi.json 200", "POST /v1/iam.whoami 200"]);
    expect(await requests(["iam", "whoami"])).toEqual(["GET /openapi.json 304", "POST /v1/iam.whoami 200"]);

    // A cache from before the deployment had its plugin: the plugin's command is resolved again from the API's current methods.
    const dir = path.join(home, "better-compute", "cli");
    const [file] = fs.readdirSync(dir);
    const cached = JSON.parse(fs.readFileSync(path.join(dir, file!), "utf8")) as { etag: string; methods: { name: string }[] };
    const before = { ...cached, etag: '"before-the-plugin"', methods: cached.methods.filter((m) => m.name !== "widgets.paint") };
    fs.writeFileSync(path.join(dir, file!), JSON.stringify(before));
    const paint = ["widgets", "paint", "w-9", "--color", "blue", "--coats", "1", "--spec.depth", "1"];
    expect(await requests(paint)).toEqual(["GET /openapi.json 200", "POST /v1/widgets.paint 200"]);
    expect(JSON.parse(fs.readFileSync(path.join(dir, file!), "utf8")).etag).toBe(cached.etag);
  });

  it("tokens create prints the new token once", async () => {
    const join = await cli(["tokens", "create", "--role", "node", "--labels.rack", "r1"], connected());
    expect(join.code).toBe(0);
    expect(join.stdout.match(/bcj_[0-9a-f]{16}_[A-Za-z0-9_-]+/g)).toHaveLength(1);
    expect(join.stdout).toMatch(/^id: [0-9a-f]{16}\ntoken: bcj_/);

    const site = await cli(["tokens", "create", "--site", "cli-site", "--json"], connected());
    expect(site.code).toBe(0);
    expect(JSON.parse(site.stdout).token).toMatch(/^bcj_/);
    expect(site.stdout).not.toContain(stack.adminKey);
  });

  it("a plugin's method is a command without CLI code: read from the live /openapi.json", async () => {
    const env = { BC_URL: pluginApi.url, BC_API_KEY: stack.adminKey };
    const help = await cli(["widgets", "paint", "--help"], env);
    expect(help.stdout).toContain("Paint a widget");
    expect(help.stdout).toMatch(/--spec\.depth +number, required/);

    const painted = await cli(
      [
        "widgets",
        "paint",
        "w-1",
        "--color",
        "red",
        "--coats",
        "3",
        "--glossy",
        "--tags",
        "a",
        "--tags",
        "b",
        "--spec.depth",
        "2.5",
        "--json",
      ],
      env,
    );
    expect(painted.code, painted.stderr).toBe(0);
    expect(JSON.parse(painted.stdout)).toEqual({
      widget: { id: "w-1", color: "red", coats: 3, glossy: true, tags: ["a", "b"], spec: { depth: 2.5 } },
      by: `apikey:${stack.adminKey.split("_")[1]}`,
    });

    // The server refuses what the schema refuses, with its typed error.
    const wrong = await cli(["widgets", "paint", "w-2", "--color", "green", "--coats", "1", "--spec.depth", "1"], env);
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toMatch(/^error INVALID_ARGUMENT: .*color/);
  });

  it("metal enroll and deploy wait for the machine, showing each step; workflows watch replays a workflow", async () => {
    const machine = sim.machines[0]!;
    const enroll = await cli(
      [
        "metal",
        "enroll",
        "m-cli",
        "--pool",
        "cli-site-pool",
        "--bmc.address",
        machine.address,
        "--bmc.username",
        SIM_BMC_USER,
        "--bmc.password",
        SIM_BMC_PASSWORD,
      ],
      connected(),
    );
    expect(enroll.code, enroll.stdout + enroll.stderr).toBe(0);
    expect(enroll.stdout).toMatch(/workflow wf-\S+: metal\.commission@1 on m-cli/);
    expect(enroll.stdout).toMatch(/✔ \[\d+\] disk\.wipe succeeded/);
    expect(enroll.stdout.trimEnd().split("\n").at(-1)).toBe("✔ machine m-cli is ready");
    expect(enroll.stdout + enroll.stderr).not.toContain(SIM_BMC_PASSWORD);

    const url = `${images.url}/images/${image}`;
    const deploy = await cli(
      ["metal", "deploy", "m-cli", "--profile", "metal.deploy.image-stream", "--input.image.url", url, "--input.image.sha256", image],
      connected(),
    );
    expect(deploy.code, deploy.stdout + deploy.stderr).toBe(0);
    const lines = deploy.stdout.trimEnd().split("\n");
    const workflow = /^workflow: (wf-\S+)$/m.exec(deploy.stdout)![1]!;
    expect(lines).toContain("machine m-cli: deploying");
    expect(deploy.stdout).toMatch(/\n {2}▸ \[\d+\] image\.write started\n(.*\n)? {2}✔ \[\d+\] image\.write succeeded \(\d+\.\d s\)\n/);
    expect(lines.slice(-3)).toEqual([
      expect.stringMatching(`^✔ workflow ${workflow} succeeded`),
      "machine m-cli: deploying → deployed",
      "✔ machine m-cli is deployed",
    ]);
    expect(machine.disks.disks.get("/dev/sda")!.sha256).toBe(image);

    const watch = await cli(["workflows", "watch", workflow], connected());
    expect(watch.code).toBe(0);
    expect(watch.stdout).toMatch(/✔ \[\d+\] image\.write succeeded/);
    expect(watch.stdout.trimEnd().split("\n").at(-1)).toMatch(new RegExp(`^✔ workflow ${workflow} succeeded \\(\\d+\\.\\d s\\)$`));
  });

  it("a failed deploy shows the failing step's error and exits non-zero; recommission brings the machine back", async () => {
    const undeploy = await cli(["metal", "undeploy", "m-cli", "--json"], connected());
    expect(undeploy.code, undeploy.stderr).toBe(0);
    // --json: the progress goes to stderr, stdout holds the settled machine.
    expect(JSON.parse(undeploy.stdout)).toMatchObject({ id: "m-cli", state: "ready" });
    expect(undeploy.stderr).toContain("✔ machine m-cli is ready");

    const wrongDigest = "0".repeat(64);
    const deploy = await cli(
      [
        "metal",
        "deploy",
        "m-cli",
        "--profile",
        "metal.deploy.image-stream",
        "--input",
        JSON.stringify({ image: { url: `${images.url}/images/${image}`, sha256: wrongDigest } }),
      ],
      connected(),
    );
    expect(deploy.code).toBe(1);
    // The site refuses the image when it mirrors it, before the ramdisk writes a byte.
    expect(deploy.stdout).toMatch(/✖ \[\d+\] image\.cache failed: DRIVER_ERROR .*digest/);
    expect(deploy.stdout).toMatch(/✖ workflow wf-\S+ failed/);
    expect(deploy.stdout.trimEnd().split("\n").at(-1)).toMatch(/^✖ machine m-cli: failed, not deployed: /);
    const failedWorkflow = /^workflow: (wf-\S+)$/m.exec(deploy.stdout)![1]!;
    expect((await cli(["workflows", "watch", failedWorkflow], connected())).code).toBe(1);

    const noWait = await cli(["metal", "nodes", "recommission", "m-cli", "--no-wait"], connected());
    expect(noWait.code).toBe(0);
    expect(noWait.stdout).not.toContain("machine m-cli:");
    const ready = await cli(["workflows", "list", "--json"], connected());
    const commission = (JSON.parse(ready.stdout) as { workflows: { id: string; profile: string }[] }).workflows.find(
      (w) => w.profile === "metal.commission",
    )!;
    expect((await cli(["workflows", "watch", commission.id], connected())).code).toBe(0);
    expect((await cli(["metal", "nodes", "get", "m-cli", "--json"], connected())).stdout).toContain('"state": "ready"');
  });
});

interface PluginApi {
  url: string;
  /** Each request as `METHOD /path STATUS`, in the order they were answered. */
  requests: string[];
  stop(): Promise<void>;
}

/**
 * The default deployment plus a third-party plugin with a method the CLI has never heard of,
 * served from this process (the real API: hono, zod, IAM, Postgres) on the stack's database.
 */
async function servePluginApi(stack: SharedStack): Promise<PluginApi> {
  const paint = defineMethod({
    name: "widgets.paint",
    readOnly: true,
    description: "Paint a widget (answers what it was asked)",
    input: z.object({
      id: z.string(),
      color: z.enum(["red", "blue"]),
      coats: z.number().int(),
      glossy: z.boolean().optional(),
      tags: z.array(z.string()).default([]),
      spec: z.object({ depth: z.number() }),
    }),
    output: z.object({ widget: z.record(z.string(), z.unknown()), by: z.string() }),
    handler: async (ctx, input) => ({ widget: input, by: ctx.principal.id }),
  });
  const widgets = definePlugin({ id: "acme-widgets", iam: { actions: { "widgets.paint": "Paint widgets" } }, api: [paint] });
  const compute = betterCompute({ modules: [provisionModule(), metalModule()], plugins: [widgets] });
  const store: NodeStore = await openNodeStore(stack.databaseUrl);
  const env = { DATABASE_URL: stack.databaseUrl, BC_DB_WS_PROXY: store.bridge };
  const requests: string[] = [];
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const request = new Request(`http://127.0.0.1${req.url}`, {
      method: req.method,
      headers: req.headers as Record<string, string>,
      ...(req.method === "POST" ? { body: Buffer.concat(chunks) } : {}),
    });
    const response = await compute.fetch(request, env);
    requests.push(`${req.method} ${req.url} ${response.status}`);
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    async stop() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await store.close();
    },
  };
}
