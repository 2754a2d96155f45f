// What makes the CLI answer at once, checked without an API: it runs from a prebuilt bundle that is
// never stale (cli/bundle.mjs: built when missing or when an input changed, run as it is found
// otherwise), caches the API's methods per URL and revalidates them by ETag (cli/catalog.ts), fits
// tables to the terminal (cli/format.ts) and finds the local stack for a key given alone
// (cli/connection.ts). cli.test.ts runs the CLI against the local stack.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { TRANSITIONAL_STATES } from "better-compute/metal";
import { describe, expect, it } from "vitest";
import type { Api, OpenApiDocument } from "../../cli/api.ts";
import { loadCatalog } from "../../cli/catalog.ts";
import { resolveConnection, UsageError } from "../../cli/connection.ts";
import { formatTable } from "../../cli/format.ts";
import { MACHINE_MOVING } from "../../cli/progress.ts";
import { repoRoot } from "../../local/node-store.ts";
import { tempDirs } from "../support/temp-dirs.ts";

const bundler = (await import(pathToFileURL(path.join(repoRoot, "cli/bundle.mjs")).href)) as {
  bundleDir(env?: NodeJS.ProcessEnv): string;
  currentBundle(dir?: string): string | undefined;
};

const tempDir = tempDirs();
const noStackDir = tempDir("bc-cli-nostack-");

/** `better-compute …` with no API to talk to; env adds to it. */
function cli(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path.join(repoRoot, "scripts/better-compute.mjs"), ...args],
      { cwd: os.tmpdir(), env: { ...process.env, BC_URL: "", BC_API_KEY: "", BC_DATA_DIR: noStackDir, ...env }, timeout: 60_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

const sha256 = (file: string) =>
  createHash("sha256")
    .update(fs.readFileSync(path.join(repoRoot, file)))
    .digest("hex");

describe("the CLI's bundle", () => {
  it("is built by npm's prepare, and by the launcher when it is missing", async () => {
    expect(JSON.parse(fs.readFileSync(path.join(repoRoot, "package.json"), "utf8")).scripts.prepare).toBe("node cli/bundle.mjs");
    const dir = tempDir("bc-cli-bundle-");
    const run = await cli(["--help"], { BC_CLI_BUNDLE_DIR: dir });
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toBe("");
    expect(run.stdout).toMatch(/^usage: better-compute <command>/);

    expect(bundler.currentBundle(dir)).toBe(path.join(dir, "main.mjs"));
    const { inputs } = JSON.parse(fs.readFileSync(path.join(dir, "inputs.json"), "utf8")) as { inputs: Record<string, string> };
    expect(Object.keys(inputs)).toEqual(expect.arrayContaining(["cli/bundle.mjs", "cli/main.ts", "cli/catalog.ts", "cli/format.ts"]));
    for (const [file, digest] of Object.entries(inputs)) expect(digest, file).toBe(sha256(file));
    // The CLI alone: none of the control plane (core, plugins, zod, the database drivers) is loaded to talk to it.
    expect(Object.keys(inputs).filter((file) => !file.startsWith("cli/"))).toEqual([]);
  });

  it("runs the bundle it finds current as it is, and builds it again once an input changed", async () => {
    const dir = tempDir("bc-cli-bundle-");
    expect((await cli(["--help"], { BC_CLI_BUNDLE_DIR: dir })).code).toBe(0);
    const bundle = path.join(dir, "main.mjs");
    fs.writeFileSync(bundle, 'console.log("the planted bundle");\n');
    // Current by its inputs: run, not rebuilt, and not through tsx.
    expect((await cli(["--help"], { BC_CLI_BUNDLE_DIR: dir })).stdout).toBe("the planted bundle\n");

    const recorded = JSON.parse(fs.readFileSync(path.join(dir, "inputs.json"), "utf8")) as { inputs: Record<string, string> };
    recorded.inputs["cli/format.ts"] = "0".repeat(64); // as if cli/format.ts was edited since
    fs.writeFileSync(path.join(dir, "inputs.json"), JSON.stringify(recorded));
    expect(bundler.currentBundle(dir)).toBeUndefined();
    const rebuilt = await cli(["--help"], { BC_CLI_BUNDLE_DIR: dir });
    expect(rebuilt.stdout).toMatch(/^usage: better-compute <command>/);
    expect(bundler.currentBundle(dir)).toBe(bundle);
  });

  it("is kept under node_modules/.cache, out of the sources and of git", () => {
    expect(bundler.bundleDir({})).toBe(path.join(repoRoot, "node_modules", ".cache", "better-compute", "cli"));
  });
});

describe("the method catalog's cache", () => {
  const doc = (...names: string[]): OpenApiDocument => ({
    paths: Object.fromEntries(names.map((name) => [`/v1/${name}`, { post: { operationId: name, summary: `${name}'s summary` } }])),
  });
  /** An API whose /openapi.json answers `served` (304 for its ETag), recording the ETag each GET carried. */
  const fakeApi = (url: string, served: { etag?: string; document: OpenApiDocument } | Error) => {
    const asked: (string | undefined)[] = [];
    const api: Api = {
      url,
      call: async () => {
        throw new Error("not called");
      },
      async openapi(etag) {
        asked.push(etag);
        if (served instanceof Error) throw served;
        return etag !== undefined && etag === served.etag ? undefined : served;
      },
    };
    return { api, asked, serve: (next: typeof served) => (served = next) };
  };
  const names = (methods: { name: string }[]) => methods.map((m) => m.name);

  it("fetches a URL's methods once, then answers from disk while one conditional GET revalidates them", async () => {
    const dir = tempDir("bc-cli-catalog-");
    const { api, asked, serve } = fakeApi("http://127.0.0.1:1", { etag: '"v1"', document: doc("a.list") });

    const first = await loadCatalog(api, dir);
    expect(names(first.methods)).toEqual(["a.list"]);
    expect(await first.latest).toBe(first.methods);
    expect(asked).toEqual([undefined]);

    // Unchanged: the cached methods, and the API said 304.
    const second = await loadCatalog(api, dir);
    expect(names(second.methods)).toEqual(["a.list"]);
    expect(await second.latest).toBe(second.methods);
    expect(asked).toEqual([undefined, '"v1"']);

    // Changed: the call resolves from the cache; the API's current methods come with the revalidation, and are cached.
    serve({ etag: '"v2"', document: doc("a.list", "b.get") });
    const third = await loadCatalog(api, dir);
    expect(names(third.methods)).toEqual(["a.list"]);
    expect(names(await third.latest)).toEqual(["a.list", "b.get"]);
    expect(names((await loadCatalog(api, dir)).methods)).toEqual(["a.list", "b.get"]);

    // An API that cannot be asked leaves the cache as it is; with no cache, its error is the call's.
    serve(new Error("connection refused"));
    const offline = await loadCatalog(api, dir);
    expect(await offline.latest).toBe(offline.methods);
    await expect(loadCatalog(fakeApi("http://127.0.0.1:2", new Error("connection refused")).api, dir)).rejects.toThrow(
      "connection refused",
    );
  });

  it("keys the cache by URL, and caches nothing from an API without an ETag", async () => {
    const dir = tempDir("bc-cli-catalog-");
    await loadCatalog(fakeApi("http://127.0.0.1:1", { etag: '"x"', document: doc("a.list") }).api, dir);
    const other = fakeApi("http://127.0.0.1:3", { etag: '"x"', document: doc("c.run") });
    expect(names((await loadCatalog(other.api, dir)).methods)).toEqual(["c.run"]);
    expect(other.asked).toEqual([undefined]);
    expect(fs.readdirSync(dir)).toHaveLength(2);

    const noEtag = fakeApi("http://127.0.0.1:4", { document: doc("d.get") });
    await loadCatalog(noEtag.api, dir);
    await loadCatalog(noEtag.api, dir);
    expect(noEtag.asked).toEqual([undefined, undefined]);
    expect(fs.readdirSync(dir)).toHaveLength(2);

    // Stacks on passing ports (tests, npm start --port) do not pile up: the 16 last fetched are kept.
    for (let port = 5000; port < 5020; port++)
      await loadCatalog(fakeApi(`http://127.0.0.1:${port}`, { etag: '"x"', document: doc("e.get") }).api, dir);
    expect(fs.readdirSync(dir)).toHaveLength(16);
  });
});

describe("tables", () => {
  const labels = Array.from({ length: 12 }, (_, i) => `rack=r${i}`).join(",");
  const rows = [
    { id: "m-1a2b3c4d", state: "ready", labels, hostname: "node-one.lab.example.com" },
    { id: "m-5e6f7a8b", state: "deployed", labels: "rack=r2", hostname: "node-two.lab.example.com" },
  ];

  it("fit the terminal's width, the widest columns clipped first", () => {
    const lines = formatTable(rows, [], { width: 80 }).split("\n");
    expect(lines[0]).toMatch(/^ID +STATE +LABELS +HOSTNAME$/);
    for (const line of lines) expect(line.length).toBeLessThanOrEqual(80);
    expect(lines[1]).toMatch(/^m-1a2b3c4d +ready +rack=r0,rack=r1,\S*… +node-one\.lab\.example\.com$/);
    // A terminal wide enough shows every cell whole.
    expect(formatTable(rows, [], { width: 200 })).toContain(labels);
    // Too narrow for even the narrowest columns: each is down to its floor and the terminal wraps the rest.
    expect(formatTable(rows, [], { width: 20 }).split("\n")[1]).toMatch(/^m-1a2b3… +ready +rack=r0… +node-on…$/);
  });

  it("show whole cells with --wide, and clip long cells when there is no terminal", () => {
    expect(formatTable(rows, [], { width: 80, wide: true })).toContain(labels);
    const piped = formatTable([{ id: "x", note: "n".repeat(100) }]);
    expect(piped).toContain(`${"n".repeat(59)}…`);
    expect(piped).not.toContain("n".repeat(60));
  });
});

describe("finding the API", () => {
  const stackDir = tempDir("bc-cli-stack-");
  fs.writeFileSync(
    path.join(stackDir, "local.json"),
    JSON.stringify({ url: "http://127.0.0.1:8787/", adminKey: "bck_admin", pid: process.pid }),
  );

  it("takes a running local stack's URL for a key given alone, and its admin key only for its own URL", () => {
    expect(resolveConnection({ apiKey: "bck_mine" }, { BC_DATA_DIR: stackDir })).toEqual({
      url: "http://127.0.0.1:8787",
      apiKey: "bck_mine",
      source: `the local stack in ${stackDir} (pid ${process.pid}), with --api-key`,
    });
    expect(resolveConnection({}, { BC_DATA_DIR: stackDir, BC_API_KEY: "bck_env" })).toMatchObject({
      url: "http://127.0.0.1:8787",
      apiKey: "bck_env",
      source: expect.stringMatching(/, with BC_API_KEY$/),
    });
    expect(resolveConnection({}, { BC_DATA_DIR: stackDir })).toMatchObject({ apiKey: "bck_admin" });
    expect(() => resolveConnection({ url: "https://compute.example.com" }, { BC_DATA_DIR: stackDir })).toThrow(
      "no API key for https://compute.example.com",
    );
    expect(() => resolveConnection({ apiKey: "bck_mine" }, { BC_DATA_DIR: noStackDir })).toThrow(UsageError);
  });
});

it("the states the CLI waits through are metal's transitional states and enrolled", () => {
  expect([...MACHINE_MOVING].sort()).toEqual(["enrolled", ...TRANSITIONAL_STATES].sort());
});
