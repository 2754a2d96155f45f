// bcd as one installable artifact (agent/build/bcd.ts, docs/install.md): the Debian package
// installs on a clean root (dpkg --root, maintainer scripts run chrootless: no container), its
// `bcd version` runs there, the unit's ExecStartPre check passes on its configuration and refuses a
// bad one, its ExecStart (the installed bundle on the packaged Node) joins a real local stack and
// connects, hosting a pinned bcx plugin under the sandbox installed beside it (the control plane
// labels the node with its driver), an upgrade keeps the node's identity and the operator's configuration, and a purge
// removes everything.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildBcd, INSTALLED, type BcdBuild } from "../../agent/build/bcd.ts";
import { spawnBcd, type BcdProcess } from "../../local/bcd-process.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { eventually } from "../support/eventually.ts";

const exec = promisify(execFile);
const work = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bcd-package-"));
const root = path.join(work, "root");
let built: BcdBuild;
let stack: Stack | undefined;
let bcd: BcdProcess | undefined;

/** dpkg on the scratch root: its own database, maintainer scripts run with DPKG_ROOT instead of a chroot. */
const dpkg = (...args: string[]) =>
  exec("dpkg", [`--root=${root}`, "--force-script-chrootless", "--force-depends", "--log=/dev/null", ...args]);

beforeAll(async () => {
  built = await buildBcd();
  for (const dir of ["var/lib/dpkg/info", "var/lib/dpkg/updates"]) fs.mkdirSync(path.join(root, dir), { recursive: true });
  for (const file of ["var/lib/dpkg/status", "var/lib/dpkg/available"]) fs.writeFileSync(path.join(root, file), "");
}, 300_000);

afterAll(async () => {
  await bcd?.stop();
  await stack?.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

/**
 * A unit's command line as systemd runs it: `${VAR}` is the variable's value as one word, `$VAR`
 * its value split at whitespace, with the installed tree's absolute paths moved under the root.
 */
function unitCommand(key: "ExecStart" | "ExecStartPre", env: Record<string, string>): string[] {
  const unit = fs.readFileSync(path.join(root, INSTALLED.unit), "utf8");
  const line = new RegExp(`^${key}=(.*)$`, "m").exec(unit)?.[1];
  if (!line) throw new Error(`the unit has no ${key}`);
  const words = line.split(/\s+/).flatMap((word) => {
    const whole = /^\$\{(\w+)\}$/.exec(word);
    if (whole) return [env[whole[1]!] ?? ""];
    const split = /^\$(\w+)$/.exec(word);
    if (split) return (env[split[1]!] ?? "").split(/\s+/).filter(Boolean);
    return [word];
  });
  return words.map((word) => (/^\/(usr|var|etc)\//.test(word) ? path.join(root, word) : word));
}

/** The EnvironmentFile the unit reads, as systemd reads it (KEY=value lines). */
const environmentFile = () =>
  Object.fromEntries(
    fs
      .readFileSync(path.join(root, INSTALLED.defaults), "utf8")
      .split("\n")
      .filter((line) => /^\w+=/.test(line))
      .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
  );

describe("the bcd Debian package", () => {
  it("installs on a clean root, with its state directory private", async () => {
    await dpkg("--install", built.deb);
    const { stdout } = await exec("dpkg-query", [`--admindir=${path.join(root, "var/lib/dpkg")}`, "-W", "-f=${Status} ${Version}", "bcd"]);
    expect(stdout).toBe(`install ok installed ${built.manifest.packageVersion}`);
    for (const file of [INSTALLED.launcher, INSTALLED.bundle, INSTALLED.node, INSTALLED.sandbox, INSTALLED.unit, INSTALLED.defaults])
      expect(fs.existsSync(path.join(root, file)), file).toBe(true);
    // The bcx plugin sandbox runs on Debian's python3 with libseccomp's binding.
    const depends = await exec("dpkg-query", [`--admindir=${path.join(root, "var/lib/dpkg")}`, "-W", "-f=${Depends}", "bcd"]);
    expect(depends.stdout.split(", ")).toEqual(expect.arrayContaining(["python3", "python3-seccomp"]));
    expect(fs.statSync(path.join(root, INSTALLED.stateDir)).mode & 0o777).toBe(0o700);
  });

  it("runs bcd version (and bcd --version) from the installed tree, on the packaged Node", async () => {
    for (const command of ["version", "--version"]) {
      const { stdout } = await exec(path.join(root, INSTALLED.launcher), [command]);
      expect(stdout.trim(), command).toBe(`bcd ${built.manifest.version} (node v${built.manifest.node.version})`);
    }
  });

  it("the unit's ExecStartPre check passes on a configured node and refuses a bad configuration", async () => {
    const pre = async (env: Record<string, string>) => {
      const [program, ...args] = unitCommand("ExecStartPre", env);
      return exec(program!, args).then(
        (r) => ({ code: 0, out: r.stdout + r.stderr }),
        (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, out: e.stdout + e.stderr }),
      );
    };
    // As shipped, BCD_URL is empty: the check says so instead of starting.
    expect(await pre(environmentFile())).toMatchObject({ code: 2, out: expect.stringContaining("--url is empty") });
    expect(await pre({ ...environmentFile(), BCD_URL: "ftp://nowhere" })).toMatchObject({ code: 2 });
    expect(await pre({ ...environmentFile(), BCD_URL: "http://127.0.0.1:9", BCD_ARGS: "--label rack=r1" })).toEqual({
      code: 0,
      out: "bcd: configuration OK: not joined yet; will join http://127.0.0.1:9 as site (join-token)\n",
    });
  });

  it("its ExecStart joins the control plane with the token file and connects as a site agent, hosting a pinned plugin", async () => {
    stack = await startStack({ dataDir: path.join(work, "stack") });
    const api = (name: string, input: Record<string, unknown>) => callApi<any>(stack!.url, stack!.adminKey, name, input);
    const token = (await api("siteTokens.create", { site: "lab" })).token as string;
    fs.writeFileSync(path.join(root, "etc/bcd/join-token"), token, { mode: 0o600 });
    // A bcx plugin (test/fixtures/bcx/well.ts, bundled), pinned in a config next to it and run under the installed sandbox.
    const plugins = path.join(work, "plugins");
    await build({
      entryPoints: [path.join(repoRoot, "test/fixtures/bcx/well.ts")],
      bundle: true,
      platform: "node",
      format: "esm",
      outfile: path.join(plugins, "well.mjs"),
      logLevel: "warning",
    });
    const digest = createHash("sha256")
      .update(fs.readFileSync(path.join(plugins, "well.mjs")))
      .digest("hex");
    fs.writeFileSync(path.join(plugins, "bcd.toml"), `[plugins]\n[[plugins.pin]]\npath = "well.mjs"\nsha256 = "${digest}"\n`);
    const config = `--config ${path.join(plugins, "bcd.toml")}`;
    const [check, ...checkArgs] = unitCommand("ExecStartPre", { ...environmentFile(), BCD_URL: stack.url, BCD_ARGS: config });
    expect((await exec(check!, checkArgs)).stdout).toContain("bcd: plugins OK: 1 pinned, each file's sha256 checked\n");
    const env = { ...environmentFile(), BCD_URL: stack.url, BCD_ARGS: `--hostname site-from-deb ${config}` };
    const [program, ...args] = unitCommand("ExecStart", env);
    bcd = spawnBcd(args, { bcd: program! });
    const nodes = await eventually(
      async () => (await api("nodes.list", { role: "site" })).nodes as any[],
      (list) => list.some((n) => n.state === "connected"),
      "the installed bcd connecting",
      { detail: () => bcd!.output() },
    );
    expect(nodes[0]).toMatchObject({ hostname: "site-from-deb", labels: { "bc.dev/site": "lab", "bc.dev/driver.well": "1.2.3" } });
    await bcd.stop();
    expect((await bcd.exited).code).toBe(0);
    // Joined once: the key and credential are in the state directory, the token nowhere in it.
    const state = fs.readdirSync(path.join(root, INSTALLED.stateDir), { recursive: true, withFileTypes: true }).filter((e) => e.isFile());
    expect(state.length).toBeGreaterThan(0);
    for (const file of state) expect(fs.readFileSync(path.join(file.parentPath, file.name), "utf8")).not.toContain(token);
  }, 120_000);

  it("an upgrade keeps the node's identity and the operator's configuration; a purge removes everything", async () => {
    fs.appendFileSync(path.join(root, INSTALLED.defaults), "# edited by the operator\n");
    const identity = fs.readdirSync(path.join(root, INSTALLED.stateDir));
    await dpkg("--install", built.deb); // the same version again: what an upgrade runs
    expect(fs.readFileSync(path.join(root, INSTALLED.defaults), "utf8")).toContain("# edited by the operator");
    expect(fs.readdirSync(path.join(root, INSTALLED.stateDir))).toEqual(identity);
    const [program, ...args] = unitCommand("ExecStartPre", { ...environmentFile(), BCD_URL: "http://127.0.0.1:9" });
    expect((await exec(program!, args)).stdout).toMatch(/^bcd: configuration OK: joined as n-/);

    await dpkg("--purge", "bcd");
    for (const gone of [INSTALLED.launcher, INSTALLED.lib, INSTALLED.unit, INSTALLED.defaults, INSTALLED.stateDir, "etc/bcd"])
      expect(fs.existsSync(path.join(root, gone)), gone).toBe(false);
  });
});
