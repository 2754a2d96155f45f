// `npm run dev -- --providers` as a user runs it: the banner says what is real and what is
// simulated and prints a tenant's commands; run with the CLI as that tenant, they create an
// instance at each provider, which the reconciler (in the Worker, on the dev stack's sweeps) takes to
// running at the provider's emulator, then stops and deletes. SIMULATED: the three providers'
// APIs (emulators in the dev process) and the site's machines; the Worker, Postgres and the CLI
// are real, and the Worker reaches the Proxmox emulator over HTTPS with its certificate verified.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { pinnedFetch } from "better-compute/proxmox/pinned-fetch";
import { FREE_NAME } from "better-compute/hetzner-robot";
import { freePort } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";
import { NpmRunDev } from "../support/npm-run-dev.ts";

const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-providers-"));
const devDir = path.join(baseDir, "dev");
let dev: NpmRunDev | undefined;

afterAll(async () => {
  await dev?.interrupt();
  fs.rmSync(baseDir, { recursive: true, force: true });
});

/** A printed command (`npx better-compute …`, no quoting needed) run with the CLI, with the tenant's BC_URL and BC_API_KEY. */
async function asTenant(command: string, env: Record<string, string>): Promise<string> {
  const args = command.replace(/^npx better-compute /, "").split(" ");
  const cli = spawn(process.execPath, [path.join(repoRoot, "scripts", "better-compute.mjs"), ...args], {
    cwd: repoRoot,
    env: { ...process.env, BC_DATA_DIR: "", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let text = "";
  cli.stdout!.on("data", (d) => (text += d));
  cli.stderr!.on("data", (d) => (text += d));
  const code = await new Promise<number | null>((resolve) => cli.once("exit", resolve));
  expect(code, `${command}\n${text}`).toBe(0);
  return text;
}

const transition = (id: string, to: string) => new RegExp(`^ {2}instance ${id} {2}\\S+ → ${to}$`, "m");

interface Credentials {
  "hetzner-cloud": { endpoint: string; token: string };
  "hetzner-robot": { endpoint: string; user: string; password: string };
  proxmox: { baseUrl: string; tokenId: string; tokenSecret: string; tls: { caBundle: string } };
}

/** What each emulator holds for the instance, read over its own API as any client would. */
async function atProviders(c: Credentials) {
  const hcloud = (await (
    await fetch(`${c["hetzner-cloud"].endpoint}/servers?name=web-1`, { headers: { authorization: `Bearer ${c["hetzner-cloud"].token}` } })
  ).json()) as { servers: { name: string; status: string }[] };

  const robotAuth = {
    authorization: `Basic ${Buffer.from(`${c["hetzner-robot"].user}:${c["hetzner-robot"].password}`).toString("base64")}`,
  };
  const robot = (await (await fetch(`${c["hetzner-robot"].endpoint}/server`, { headers: robotAuth })).json()) as {
    server: { server_number: number; server_name: string };
  }[];
  const box = robot.map((s) => s.server).find((s) => s.server_name === "bc:box-1 box-1");
  const power = box
    ? ((await (await fetch(`${c["hetzner-robot"].endpoint}/reset/${box.server_number}`, { headers: robotAuth })).json()) as {
        reset: { operating_status: string };
      })
    : undefined;

  // The Proxmox emulator's certificate is self-signed: trusted here as the account's caBundle.
  const pve = await pinnedFetch({ caBundle: c.proxmox.tls.caBundle })(`${c.proxmox.baseUrl}/api2/json/cluster/resources?type=vm`, {
    headers: { authorization: `PVEAPIToken=${c.proxmox.tokenId}=${c.proxmox.tokenSecret}` },
  });
  const vms = ((await pve.json()) as { data: { name: string; status: string; template: number }[] }).data;

  return {
    web1: hcloud.servers[0]?.status,
    box1: box ? power!.reset.operating_status : undefined,
    robotNames: robot.map((s) => s.server.server_name),
    vm1: vms.find((v) => v.name === "vm-1")?.status,
  };
}

it("registers the three providers with a tenant, whose printed commands take instances to running at the emulators, stopped and deleted", async () => {
  const port = await freePort();
  dev = new NpmRunDev(["--providers", "--machines", "1"], {
    PORT: String(port),
    BC_DATA_DIR: baseDir,
    DATABASE_URL: "",
    NODE_EXTRA_CA_CERTS: "",
  });

  await dev.waitFor(/Press Ctrl-C to stop\./, 180_000, "its banner");

  // The banner: what is real (the adapters in the Worker, the Proxmox certificate trusted through
  // NODE_EXTRA_CA_CERTS) and what is simulated (the providers), the tenant and its commands.
  expect(dev.output).toContain(`running at http://127.0.0.1:${port} with a simulated site and simulated providers`);
  expect(dev.output).toMatch(/the vps module, its reconciler and the Hetzner Cloud, Hetzner Robot and Proxmox adapters \(in the Worker\)/);
  expect(dev.output).toMatch(
    /verifies the Proxmox emulator's self-signed certificate, trusted through\s+NODE_EXTRA_CA_CERTS=\S+ given to wrangler dev/,
  );
  expect(dev.output).toMatch(
    /the providers: Hetzner Cloud at http:\/\/127\.0\.0\.1:\d+\/v1, Hetzner Robot at http:\/\/127\.0\.0\.1:\d+ and Proxmox VE at https:\/\/127\.0\.0\.1:\d+:\s+emulators in this process/,
  );
  expect(dev.output).toMatch(/at each sweep: here every 5 s while one is on its way/);
  const exported = /^ {4}export BC_URL=(\S+) BC_API_KEY=(bck_\S+)$/m.exec(dev.output);
  expect(exported, dev.output).not.toBeNull();
  const tenant = { BC_URL: exported![1]!, BC_API_KEY: exported![2]! };
  expect(tenant.BC_URL).toBe(`http://127.0.0.1:${port}`);
  const creates = [...dev.output.matchAll(/^ {4}(npx better-compute vps instances create .*)$/gm)].map((m) => m[1]!);
  expect(creates).toEqual([
    "npx better-compute vps instances create --id web-1 --pool hcloud --flavor hcloud-cx22 --name web-1 --sshKeys demo",
    "npx better-compute vps instances create --id box-1 --pool robot --flavor robot-ax41 --name box-1 --sshKeys demo",
    "npx better-compute vps instances create --id vm-1 --pool proxmox --flavor proxmox-small --name vm-1 --sshKeys demo",
  ]);
  const stop = /^ {4}(npx better-compute vps instances stop web-1)$/m.exec(dev.output)![1]!;
  const remove = /^ {4}(npx better-compute vps instances delete web-1)$/m.exec(dev.output)![1]!;

  // The key is the tenant's: it sees the flavors of the pools offered to it.
  expect(await asTenant("npx better-compute vps flavors list", tenant)).toMatch(/hcloud-cx22[\s\S]*proxmox-small[\s\S]*robot-ax41/);
  for (const create of creates) expect(await asTenant(create, tenant)).toMatch(/^created: true$/m);

  // Each reaches running through the reconciler (the request's pass, then the dev sweeps), as its provider says.
  for (const id of ["web-1", "box-1", "vm-1"]) await dev.waitFor(transition(id, "running"), 240_000, `instance ${id} running`);
  const credentials = JSON.parse(fs.readFileSync(path.join(devDir, "providers.json"), "utf8")) as Credentials;
  expect(await atProviders(credentials)).toMatchObject({ web1: "running", box1: "running", vm1: "running" });

  await asTenant(stop, tenant);
  await asTenant(remove.replace("web-1", "box-1"), tenant);
  await asTenant(remove.replace("web-1", "vm-1"), tenant);
  await dev.waitFor(transition("web-1", "stopped"), 180_000, "web-1 stopped");
  await dev.waitFor(transition("box-1", "deleted"), 180_000, "box-1 deleted");
  await dev.waitFor(transition("vm-1", "deleted"), 180_000, "vm-1 deleted");
  const after = await atProviders(credentials);
  expect(after).toMatchObject({ web1: "off", box1: undefined, vm1: undefined });
  // The Robot box is released, not cancelled: still the account's, free for the next instance.
  expect(after.robotNames.filter((n) => n === FREE_NAME)).toHaveLength(1);

  await asTenant(remove, tenant);
  await dev.waitFor(transition("web-1", "deleted"), 180_000, "web-1 deleted");
  expect((await atProviders(credentials)).web1).toBeUndefined();

  // No provider credential in anything printed.
  for (const secret of [credentials["hetzner-cloud"].token, credentials["hetzner-robot"].password, credentials.proxmox.tokenSecret])
    expect(dev.output).not.toContain(secret);

  await dev.interrupt();
  for (const file of ["lock", "local.json", "providers.json"]) expect(fs.existsSync(path.join(devDir, file))).toBe(false);
}, 900_000);
