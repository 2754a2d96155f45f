// `better-compute doctor` as an operator runs it: it passes on the default deployment with a
// migrated database, an admin key and a strong BC_SECRET, and each planted misconfiguration (no
// BC_SECRET, a changed or missing migration, a wrangler.toml without the NODE binding or without
// a cron, an unreachable database, a config the registry refuses, no admin key) is its own
// finding with a fix, and a non-zero exit. The database is a real PGlite; the CLI is spawned.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../../better-compute.config.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, repoRoot, type NodeStore } from "../../local/node-store.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";
import { freePort } from "../../local/stack.ts";

const SECRET = "Zq8v-3LkP_x7Tn0wR5yB2mC9aD4eF6gH";
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-doctor-"));
/** An empty data dir: doctor must not find some other stack's dev.env. */
const emptyDataDir = fs.mkdtempSync(path.join(tmp, "data-"));
let pglite: PgliteServer;
let store: NodeStore;

beforeAll(async () => {
  pglite = await startPglite({ dataDir: path.join(tmp, "pglite") });
  store = await openNodeStore(pglite.connectionString);
  await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
  await compute.mintApiKey(store, { name: "doctor test", roles: ["admin"] });
}, 60_000);
afterAll(async () => {
  await store?.close();
  await pglite?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

interface Finding {
  check: string;
  severity: "error" | "warning" | "ok";
  message: string;
  fix?: string;
}

/** Runs `better-compute doctor` with the deployment's environment (overridable per case). */
function doctor(args: string[] = [], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path.join(repoRoot, "scripts/better-compute.mjs"), "doctor", ...args],
      {
        cwd: tmp,
        env: {
          ...process.env,
          DATABASE_URL: pglite.connectionString,
          BC_SECRET: SECRET,
          BC_DATA_DIR: emptyDataDir,
          BC_DB_WS_PROXY: "",
          ...env,
        },
        timeout: 60_000,
      },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

async function findings(args: string[] = [], env: Record<string, string> = {}): Promise<{ code: number; findings: Finding[] }> {
  const run = await doctor(["--json", ...args], env);
  expect(run.stderr).toBe("");
  return { code: run.code, findings: (JSON.parse(run.stdout) as { findings: Finding[] }).findings };
}

const errors = (list: Finding[]) => list.filter((f) => f.severity === "error");

/** A copy of the repository's wrangler.toml with `change` applied, written beside the test's data. */
function wranglerCopy(name: string, change: (toml: string) => string): string {
  const original = fs.readFileSync(path.join(repoRoot, "wrangler.toml"), "utf8");
  const changed = change(original);
  expect(changed).not.toBe(original);
  const file = path.join(tmp, name);
  fs.writeFileSync(
    file,
    changed.replace(/^main = "(.*)"$/m, (_, main: string) => `main = "${path.join(repoRoot, main)}"`),
  );
  return file;
}

describe("better-compute doctor", () => {
  it("passes on the default deployment, and says so for each check", async () => {
    const human = await doctor();
    expect(human.code, human.stdout + human.stderr).toBe(0);
    for (const check of ["config", "durable objects", "blobs", "cron", "BC_SECRET", "database", "migrations", "iam"])
      expect(human.stdout).toContain(`✔ ${check}:`);
    expect(human.stdout).toContain("no errors");
    // Never a secret: not BC_SECRET, not the database password.
    expect(human.stdout).not.toContain(SECRET);
    expect(human.stdout).not.toContain("postgres:postgres@");

    const json = await findings();
    expect(json.code).toBe(0);
    expect(errors(json.findings)).toEqual([]);
    expect(json.findings.find((f) => f.check === "migrations")!.message).toMatch(/^all \d+ applied and unchanged$/);
  });

  it("passes on examples/emulated-site's deployment (its config loads, its migrations are the applied ones, its wrangler.toml declares what it needs)", async () => {
    const example = path.join(repoRoot, "examples", "emulated-site");
    const { compute: emulated } = await import("../../examples/emulated-site/better-compute.config.ts");
    expect(emulated.migrations()).toEqual(compute.migrations());
    const run = await findings([
      "--config",
      path.join(example, "better-compute.config.ts"),
      "--wrangler",
      path.join(example, "wrangler.toml"),
    ]);
    expect(errors(run.findings)).toEqual([]);
    expect(run.code).toBe(0);
    expect(run.findings.find((f) => f.check === "config")!.message).toMatch(
      /emulated-site\/better-compute\.config\.ts loads: modules .*metal/,
    );
  });

  it("finds a missing, a short and a low-entropy BC_SECRET", async () => {
    const missing = await doctor([], { BC_SECRET: "" });
    expect(missing.code).toBe(1);
    expect(missing.stdout).toContain("✖ BC_SECRET: BC_SECRET is not set");
    expect(missing.stdout).toContain("fix: generate one with `openssl rand -base64 32`");

    const short = await findings([], { BC_SECRET: "too-short-0123456789" });
    expect(short.code).toBe(1);
    expect(errors(short.findings)).toMatchObject([{ check: "BC_SECRET", message: expect.stringContaining("needs at least 32") }]);

    const patterned = "abababababababababababababababab01";
    const weak = await doctor(["--json"], { BC_SECRET: patterned });
    expect(weak.code).toBe(1);
    expect(weak.stdout).not.toContain(patterned);
    expect(errors(JSON.parse(weak.stdout).findings)).toMatchObject([
      { check: "BC_SECRET", message: expect.stringContaining("low-entropy") },
    ]);
  });

  it("finds a migration changed after it was applied, and one not applied", async () => {
    const name = "provision/0001_workflows";
    const { sha256 } = (await store.db.execute(sql`SELECT sha256 FROM bc_migrations WHERE name = ${name}`)).rows[0] as { sha256: string };
    await store.db.execute(sql`UPDATE bc_migrations SET sha256 = ${"0".repeat(64)} WHERE name = ${name}`);
    try {
      const changed = await findings();
      expect(changed.code).toBe(1);
      expect(errors(changed.findings)).toMatchObject([
        { check: "migrations", message: expect.stringContaining(`changed after they were applied: ${name}`) },
      ]);
    } finally {
      await store.db.execute(sql`UPDATE bc_migrations SET sha256 = ${sha256} WHERE name = ${name}`);
    }

    const last = compute.migrations().at(-1)!.name;
    const [row] = (await store.db.execute(sql`DELETE FROM bc_migrations WHERE name = ${last} RETURNING sha256, applied_at`)).rows as {
      sha256: string;
      applied_at: string;
    }[];
    try {
      const run = await doctor();
      expect(run.code).toBe(1);
      expect(run.stdout).toContain(`✖ migrations: 1 not applied: ${last}`);
      expect(run.stdout).toContain("fix: DATABASE_URL=… npm run migrate");
    } finally {
      await store.db.execute(
        sql`INSERT INTO bc_migrations (name, sha256, applied_at) VALUES (${last}, ${row!.sha256}, ${row!.applied_at})`,
      );
    }
    expect((await findings()).code).toBe(0);
  });

  it("finds a wrangler.toml without the NODE or SINKS binding, one without a cron trigger, and one without a blob store", async () => {
    const noNode = wranglerCopy("no-node.toml", (toml) =>
      toml.replace('[[durable_objects.bindings]]\nname = "NODE"\nclass_name = "NodeDO"\n', ""),
    );
    const withoutNode = await doctor(["--wrangler", noNode]);
    expect(withoutNode.code).toBe(1);
    expect(withoutNode.stdout).toContain("✖ durable objects: no Durable Object binding NODE");
    expect(withoutNode.stdout).toContain('class_name = "NodeDO"');

    const noSinks = wranglerCopy("no-sinks.toml", (toml) =>
      toml.replace('[[durable_objects.bindings]]\nname = "SINKS"\nclass_name = "SinkDO"\n', ""),
    );
    const withoutSinks = await doctor(["--wrangler", noSinks]);
    expect(withoutSinks.code).toBe(1);
    expect(withoutSinks.stdout).toContain("✖ durable objects: no Durable Object binding SINKS");

    const noCron = wranglerCopy("no-cron.toml", (toml) => toml.replace(/\[triggers\]\ncrons = .*\n/, ""));
    const withoutCron = await findings(["--wrangler", noCron]);
    expect(withoutCron.code).toBe(1);
    expect(errors(withoutCron.findings)).toMatchObject([
      { check: "cron", message: expect.stringContaining("no cron trigger"), fix: expect.stringContaining("[triggers]") },
    ]);

    // No blob store: a warning, not an error (only what renders ISOs and config drives needs it).
    const noBlobs = wranglerCopy("no-blobs.toml", (toml) => toml.replace(/\[\[r2_buckets\]\]\nbinding = "BLOBS"\n.*\n/, ""));
    const withoutBlobs = await findings(["--wrangler", noBlobs]);
    expect(withoutBlobs.code).toBe(0);
    expect(withoutBlobs.findings.find((f) => f.check === "blobs")).toMatchObject({
      severity: "warning",
      fix: expect.stringContaining('binding = "BLOBS"'),
    });
  });

  it("finds an unreachable database without printing its password", async () => {
    const url = `postgres://postgres:hunter2-not-shown@127.0.0.1:${await freePort()}/postgres`;
    const run = await doctor([], { DATABASE_URL: url });
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(/✖ database: the database at postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres is unreachable/);
    expect(run.stdout).not.toContain("hunter2");

    const unset = await findings([], { DATABASE_URL: "" });
    expect(unset.code).toBe(1);
    expect(errors(unset.findings)).toMatchObject([{ check: "database", message: "DATABASE_URL is not set" }]);
  });

  it("finds a config the registry refuses, with its INVALID_CONFIG message", async () => {
    const config = path.join(tmp, "refused.config.ts");
    fs.writeFileSync(
      config,
      `import { betterCompute, definePlugin } from ${JSON.stringify(path.join(repoRoot, "core/index.ts"))};
export const compute = betterCompute({ plugins: [definePlugin({ id: "acme", migrations: [{ name: "metal/0001_mine", sql: "SELECT 1" }] })] });\n`,
    );
    const run = await findings(["--config", config]);
    expect(run.code).toBe(1);
    expect(errors(run.findings)).toContainEqual(
      expect.objectContaining({
        check: "config",
        message: expect.stringContaining("INVALID_CONFIG migration metal/0001_mine of module acme is named for another module"),
      }),
    );
  });

  it("finds a deployment without an unrevoked admin key", async () => {
    const revoked = (await store.db.execute(sql`UPDATE bc_api_keys SET revoked_at = compute_now() WHERE revoked_at IS NULL RETURNING id`))
      .rows as { id: string }[];
    try {
      const run = await doctor();
      expect(run.code).toBe(1);
      expect(run.stdout).toContain("✖ iam:");
      expect(run.stdout).toContain("no unrevoked API key has the admin role");
      expect(run.stdout).toContain("fix: DATABASE_URL=… npm run mint-key -- --role admin");
    } finally {
      for (const { id } of revoked) await store.db.execute(sql`UPDATE bc_api_keys SET revoked_at = NULL WHERE id = ${id}`);
    }
  });

  it("reads DATABASE_URL and BC_SECRET from the local stack's dev.env when the environment has none", async () => {
    const dataDir = fs.mkdtempSync(path.join(tmp, "stack-"));
    fs.writeFileSync(path.join(dataDir, "dev.env"), `DATABASE_URL=${pglite.connectionString}\nBC_SECRET=${SECRET}\n`, { mode: 0o600 });
    const run = await doctor([], { DATABASE_URL: "", BC_SECRET: "", BC_DATA_DIR: dataDir });
    expect(run.code, run.stdout).toBe(0);
    expect(run.stdout).toMatch(/DATABASE_URL: .*dev\.env/);
    expect(run.stdout).toMatch(/BC_SECRET: .*dev\.env/);
    expect(run.stdout).not.toContain(SECRET);
  });
});
