// `npm run dev` as a user runs it: a banner saying what is real and what is simulated, three
// simulated machines shown going to ready, then the banner's deploy command, run with the CLI,
// taking one of them to deployed with its progress shown. SIMULATED: the machines, their disks
// and BMCs; the site agent is the real bcd process.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { SIM_BMC_PASSWORD } from "../../agent/testing/metal-sim.ts";
import { repoRoot } from "../../scripts/local/node-store.ts";
import { freePort } from "../../scripts/local/stack.ts";

const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-site-"));
const devDir = path.join(baseDir, "dev");
let dev: ChildProcess | undefined;
let output = "";

afterAll(async () => {
  if (dev && dev.exitCode === null && dev.signalCode === null) await interrupt(dev);
  fs.rmSync(baseDir, { recursive: true, force: true });
});

function interrupt(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.once("exit", () => resolve());
    process.kill(-child.pid!, "SIGINT");
  });
}

/** Resolves with the match once the output shows it; rejects after ms or if npm run dev exits. */
function waitFor(pattern: RegExp, ms: number, what: string): Promise<RegExpExecArray> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      clearInterval(poll);
      reject(new Error(`npm run dev did not show ${what} within ${ms / 1000} s:\n${output}`));
    }, ms);
    const poll = setInterval(() => {
      const match = pattern.exec(output);
      const exited = dev!.exitCode !== null || dev!.signalCode !== null;
      if (match || exited) {
        clearInterval(poll);
        clearTimeout(timer);
        if (match) resolve(match);
        else reject(new Error(`npm run dev exited with ${dev!.exitCode ?? dev!.signalCode}:\n${output}`));
      }
    }, 100);
  });
}

it("shows three simulated machines ready, and the banner's deploy command takes one to deployed", async () => {
  const port = await freePort();
  // Its own process group, so Ctrl-C (SIGINT to the group) reaches npm, tsx, wrangler and bcd.
  dev = spawn("npm", ["run", "dev"], {
    cwd: repoRoot,
    env: { ...process.env, PORT: String(port), BC_DATA_DIR: baseDir, DATABASE_URL: "" },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  dev.stdout!.on("data", (d) => (output += d));
  dev.stderr!.on("data", (d) => (output += d));

  await waitFor(/Press Ctrl-C to stop\./, 120_000, "its banner");
  await waitFor(/^ {2}3 simulated machines ready$/m, 60_000, "3 simulated machines ready");

  // The banner: where it runs, the key, what is real and what is simulated, the commands to try.
  expect(output).toContain(`running at http://127.0.0.1:${port} with a simulated site`);
  const key = /admin API key \(new, kept in [^)]*\): (bck_\S+)/.exec(output)![1]!;
  expect(output).toMatch(/REAL {7}the control plane: .*wrangler dev's workerd, Postgres \(PGlite\)/);
  expect(output).toMatch(/the site agent \(a bcd process, node n-\S+, state in /);
  expect(output).toMatch(
    /SIMULATED {2}3 machines and their disks \(in memory\), their BMCs \(a Redfish emulator at http:\/\/127\.0\.0\.1:\d+\)/,
  );
  expect(output).toContain("PXE/DHCP: a ramdisk's discovery join is vouched for with the site agent's key");
  expect(output).toContain("npx better-compute metal nodes list");
  const machines = /^ {2}machines in pool dev-pool: (.*) \(enrolled/m.exec(output)![1]!.split(", ");
  expect(machines).toHaveLength(3);
  const node = machines[0]!;
  // Each machine's way to ready, one line per change, as it happened; the site agent's own lines.
  for (const id of machines) expect(output).toMatch(new RegExp(`^ {2}${id} {2}commissioning → ready$`, "m"));
  expect(output).toMatch(/^ {2}\[site-agent\] INFO connected {2}nodeId=n-/m);
  expect(fs.existsSync(path.join(devDir, "local.json"))).toBe(true);

  // The deploy command exactly as printed, run with the CLI (which finds the stack through local.json).
  const printed = new RegExp(`npx better-compute metal deploy (${node}) --profile (\\S+) --input '([^']+)'`).exec(output);
  expect(printed, output).not.toBeNull();
  expect(output).toContain(`npx better-compute metal undeploy ${node}`);
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

  await waitFor(new RegExp(`^ {2}${node} {2}deploying → deployed$`, "m"), 30_000, "the machine deployed");
  const res = await fetch(`http://127.0.0.1:${port}/v1/metal.nodes.list`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ pool: "dev-pool" }),
  });
  const nodes = ((await res.json()) as { nodes: { id: string; state: string }[] }).nodes;
  expect(nodes.find((n) => n.id === node)?.state).toBe("deployed");

  // No BMC password in anything printed (the site agent's lines included).
  expect(output).not.toContain(SIM_BMC_PASSWORD);
  expect(cliOutput).not.toContain(SIM_BMC_PASSWORD);

  await interrupt(dev);
  expect(fs.existsSync(path.join(devDir, "lock"))).toBe(false);
  expect(fs.existsSync(path.join(devDir, "local.json"))).toBe(false);
}, 300_000);
