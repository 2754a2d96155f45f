// `npm run dev` as a user runs it: a banner saying what is real and what is simulated, three
// simulated machines shown going to ready, then the banner's deploy command, run with the CLI,
// taking one of them to deployed with its progress shown. SIMULATED: the machines, their disks
// and BMCs; the site agent is the real bcd process.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { SIM_BMC_PASSWORD } from "../../testing/metal-sim.ts";
import { freePort } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";
import { NpmRunDev } from "../support/npm-run-dev.ts";

const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-site-"));
const devDir = path.join(baseDir, "dev");
let dev: NpmRunDev | undefined;

afterAll(async () => {
  await dev?.interrupt();
  fs.rmSync(baseDir, { recursive: true, force: true });
});

it("shows three simulated machines ready, and the banner's deploy command takes one to deployed", async () => {
  const port = await freePort();
  dev = new NpmRunDev([], { PORT: String(port), BC_DATA_DIR: baseDir, DATABASE_URL: "" });

  await dev.waitFor(/Press Ctrl-C to stop\./, 120_000, "its banner");
  await dev.waitFor(/^ {2}3 simulated machines ready$/m, 60_000, "3 simulated machines ready");

  // The banner: where it runs, the key, what is real and what is simulated, the commands to try.
  expect(dev.output).toContain(`running at http://127.0.0.1:${port} with a simulated site`);
  const key = /admin API key \(new, kept in [^)]*\): (bck_\S+)/.exec(dev.output)![1]!;
  expect(dev.output).toMatch(/REAL {7}the control plane: .*wrangler dev's workerd, Postgres \(PGlite\)/);
  expect(dev.output).toMatch(/the site agent \(a bcd process, node n-\S+, state in /);
  expect(dev.output).toMatch(
    /SIMULATED {2}3 machines and their disks \(in memory\), their BMCs \(a Redfish emulator at http:\/\/127\.0\.0\.1:\d+\)/,
  );
  expect(dev.output).toContain("DHCP: each machine asks the site agent's network boot (real, HTTP) for its iPXE script");
  expect(dev.output).toContain("npx better-compute metal nodes list");
  const machines = /^ {2}machines in pool dev-pool: (.*) \(enrolled/m.exec(dev.output)![1]!.split(", ");
  expect(machines).toHaveLength(3);
  const node = machines[0]!;
  // Each machine's way to ready, one line per change, as it happened; the site agent's own lines.
  for (const id of machines) expect(dev.output).toMatch(new RegExp(`^ {2}${id} +commissioning → ready \\(\\d+ s\\)$`, "m"));
  expect(dev.output).toMatch(/^ {2}\[site-agent\] INFO connected {2}nodeId=n-/m);
  expect(fs.existsSync(path.join(devDir, "local.json"))).toBe(true);

  // The deploy command exactly as printed, run with the CLI (which finds the stack through local.json).
  const printed = new RegExp(`npx better-compute metal deploy (${node}) --profile (\\S+) --input '([^']+)'`).exec(dev.output);
  expect(printed, dev.output).not.toBeNull();
  expect(dev.output).toContain(`npx better-compute metal undeploy ${node}`);
  const cli = spawn(
    process.execPath,
    [
      path.join(repoRoot, "scripts", "better-compute.mjs"),
      "metal",
      "deploy",
      printed![1]!,
      "--profile",
      printed![2]!,
      "--input",
      printed![3]!,
    ],
    {
      cwd: repoRoot,
      env: { ...process.env, BC_DATA_DIR: devDir, BC_URL: "", BC_API_KEY: "" },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let cliOutput = "";
  cli.stdout!.on("data", (d) => (cliOutput += d));
  cli.stderr!.on("data", (d) => (cliOutput += d));
  const code = await new Promise<number | null>((resolve) => cli.once("exit", resolve));
  expect(code, cliOutput).toBe(0);
  expect(cliOutput).toMatch(/image\.write/); // its progress, step by step
  expect(cliOutput).toMatch(/deployed/);

  await dev.waitFor(new RegExp(`^ {2}${node} +deploying → deployed \\(\\d+ s\\)$`, "m"), 30_000, "the machine deployed");
  const res = await fetch(`http://127.0.0.1:${port}/v1/metal.nodes.list`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ pool: "dev-pool" }),
  });
  const nodes = ((await res.json()) as { nodes: { id: string; state: string }[] }).nodes;
  expect(nodes.find((n) => n.id === node)?.state).toBe("deployed");

  // No BMC password in anything printed (the site agent's lines included).
  expect(dev.output).not.toContain(SIM_BMC_PASSWORD);
  expect(cliOutput).not.toContain(SIM_BMC_PASSWORD);

  await dev.interrupt();
  expect(fs.existsSync(path.join(devDir, "lock"))).toBe(false);
  expect(fs.existsSync(path.join(devDir, "local.json"))).toBe(false);
}, 300_000);
