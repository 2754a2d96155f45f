// `npm run dev -- --vms` as a user runs it: this machine becomes the host of the host pool dev-vms
// (a REAL `bcd start --role node` child booting REAL QEMU guests, TCG here) and the banner prints a
// tenant's key and commands. Run as printed (bash, the CLI), they boot a guest that reports itself
// (hostname = instance id, the sha256 of the user data it read = the stored one), show its console,
// and delete it. A second guest is left running at Ctrl-C: the dev process removes it (VMM, network
// namespace, work dir). Nothing is simulated but the site's machines (--machines 1). Two guests boot,
// one after the other: the machine's cores are shared.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { processesNaming } from "../../agent/runtimes/microvm/helpers.ts";
import { netnsExists, netnsName } from "../../agent/runtimes/microvm/network.ts";
import { freePort } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";
import { NpmRunDev, pasteCommand } from "../support/npm-run-dev.ts";

const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-vms-"));
const devDir = path.join(baseDir, "dev");
/** Where the host's runtime keeps each guest's work dir (<root>/<instance id>). */
const runtimeDir = path.join(devDir, "vms-host", "runtime");
const guestsDir = path.join(runtimeDir, "qemu-microvm");
let dev: NpmRunDev | undefined;

afterAll(async () => {
  await dev?.interrupt();
  // Whatever a failed run left: the guests' VMMs and namespaces.
  for (const pid of await processesNaming(runtimeDir)) process.kill(pid, "SIGKILL");
  for (const id of ["demo-1", "demo-2"])
    if (await netnsExists(netnsName(id))) await new Promise((r) => spawn("ip", ["netns", "del", netnsName(id)]).once("exit", r));
  fs.rmSync(baseDir, { recursive: true, force: true });
});

const paste = pasteCommand(baseDir);

async function get(tenant: Record<string, string>, id: string): Promise<any> {
  const res = await fetch(`${tenant.BC_URL}/v1/vps.instances.get`, {
    method: "POST",
    headers: { authorization: `Bearer ${tenant.BC_API_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ id }),
  });
  expect(res.status).toBe(200);
  return res.json();
}

/** What a guest leaves on this machine while it exists: its VMM, its work dir, its network namespace. */
async function leftovers(id: string): Promise<string[]> {
  const workDir = path.join(guestsDir, id);
  const left = (await processesNaming(workDir)).map((pid) => `VMM pid ${pid}`);
  if (fs.existsSync(workDir)) left.push(`work dir ${workDir}`);
  if (await netnsExists(netnsName(id))) left.push(`netns ${netnsName(id)}`);
  return left;
}

it("makes this machine a VM host whose printed tenant commands boot a real guest, show its report and console, delete it; Ctrl-C removes the guests left", async () => {
  const port = await freePort();
  dev = new NpmRunDev(["--vms", "--machines", "1"], { PORT: String(port), BC_DATA_DIR: baseDir, DATABASE_URL: "" });

  // The guest image is built first when it is not cached (minutes), then reused.
  await dev.waitFor(/Press Ctrl-C to stop\./, 900_000, "its banner");
  expect(dev.output).toMatch(/guest image \w{12} (reused|ready)/);
  expect(dev.output).toContain(`running at http://127.0.0.1:${port} with a simulated site and this machine as a VM host`);
  const host = /this machine as a host of pool dev-vms: a bcd process \(bcd start --role node, node (n-\w+),/.exec(dev.output)?.[1];
  expect(host, dev.output).toBeDefined();
  expect(dev.output).toMatch(/booting QEMU microvm guests under (TCG|KVM) \(/);
  const exported = /^ {4}export BC_URL=(\S+) BC_API_KEY=(bck_\S+)$/m.exec(dev.output);
  expect(exported, dev.output).not.toBeNull();
  const tenant = { BC_URL: exported![1]!, BC_API_KEY: exported![2]!, BC_DATA_DIR: "" };
  expect(tenant.BC_URL).toBe(`http://127.0.0.1:${port}`);
  const printed = (pattern: RegExp) => {
    const line = pattern.exec(dev!.output)?.[1];
    expect(line, `${pattern}\n${dev!.output}`).toBeDefined();
    return line!;
  };
  const create = printed(/^ {4}(npx better-compute vps instances create --id demo-1 --pool dev-vms --flavor dev-vms-small .*)$/m);
  const console_ = printed(/^ {4}(npx better-compute vps instances console demo-1)\b/m);
  const remove = printed(/^ {4}(npx better-compute vps instances delete demo-1)$/m);
  const hosts = printed(/^ {4}(env -u BC_URL -u BC_API_KEY npx better-compute capacity hosts list)\b/m);

  // The admin sees this machine as the pool's schedulable host (the CLI finds the dev stack and its admin key by itself).
  expect(await paste(hosts, { ...tenant, BC_DATA_DIR: baseDir })).toMatch(new RegExp(`${host}\\s+dev-vms-host\\s+connected\\s+true`));

  // ---- the tenant's instance: a real guest that reports itself
  expect(await paste(create, tenant)).toMatch(/^created: true$/m);
  await dev.waitFor(/^ {2}instance demo-1 {2}starting → running$/m, 180_000, "demo-1 running");
  const running = await get(tenant, "demo-1");
  // What the create sent: the file as "$(cat …)" gives it, without its trailing newline.
  const userData = fs.readFileSync(path.join(devDir, "vms-demo.sh"), "utf8").replace(/\n+$/, "");
  expect(running).toMatchObject({ state: "running", host, guest: { hostname: "demo-1", address: "10.0.2.2/30" } });
  expect(running.guest.storedUserDataSha256).toBe(createHash("sha256").update(userData).digest("hex"));
  expect(running.guest.userDataSha256).toBe(running.guest.storedUserDataSha256);
  await dev.waitFor(
    /^ {2}instance demo-1 {2}guest report: hostname demo-1, user data sha256 \w{12}… \(the one stored at create\)/m,
    30_000,
    "the guest line",
  );
  expect((await leftovers("demo-1")).length).toBe(3); // its VMM, work dir and namespace, while it runs

  // Its console: what the user data printed, from the guest's own serial dev.output.
  let consoleText = "";
  for (let i = 0; i < 60 && !consoleText.includes("hello from demo-1"); i++) {
    consoleText = await paste(console_, tenant);
    if (!consoleText.includes("hello from demo-1")) await new Promise((r) => setTimeout(r, 500));
  }
  expect(consoleText).toContain("bc-report ");
  expect(consoleText).toContain("hello from demo-1");

  // ---- deleted: the host removes the guest wholly
  await paste(remove, tenant);
  await dev.waitFor(/^ {2}instance demo-1 {2}→ deleted/m, 180_000, "demo-1 deleted");
  expect(await leftovers("demo-1")).toEqual([]);

  // ---- a guest still running at Ctrl-C is removed by the dev process
  expect(await paste(create.replaceAll("demo-1", "demo-2"), tenant)).toMatch(/^created: true$/m);
  await dev.waitFor(/^ {2}instance demo-2 {2}starting → running$/m, 180_000, "demo-2 running");
  expect((await leftovers("demo-2")).length).toBe(3);
  await dev.interrupt();
  expect(dev.output).toContain("guest demo-2 removed from this machine");
  expect(await leftovers("demo-2")).toEqual([]);
  expect(await processesNaming(devDir)).toEqual([]);
  expect(fs.readdirSync(guestsDir)).toEqual([]);
  for (const file of ["lock", "local.json"]) expect(fs.existsSync(path.join(devDir, file))).toBe(false);
  // The tenant's key is printed once, in the banner; no bcd line carries a credential.
  expect(dev.output.split(tenant.BC_API_KEY).length).toBe(3); // the summary line and the export line
}, 1_200_000);
