// The walkthrough of docs/vms-walkthrough.md on the local stack npm start runs (PGlite, bridge,
// wrangler dev): an operator makes a host pool, a flavor and a tenant; two hosts join it; the tenant
// creates three instances. One host is a REAL `bcd start --role node` process booting REAL guests
// with the qemu-microvm runtime (TCG here); the other is a FakeDaemon in this process.
// SIMULATED: the FakeDaemon host's runtime (testing/simulated-runtime.ts: no guest boots) and
// the resources it reports. Two real guests boot in all (one after the other): keep it so, the
// machine's 2 cores are shared.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { nodeTransport } from "../../agent/node-transport.ts";
import { processesNaming } from "../../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage } from "../../agent/runtimes/microvm/image.ts";
import { netnsExists, netnsName } from "../../agent/runtimes/microvm/network.ts";
import { FakeDaemon } from "../../testing/index.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { simulatedRuntime } from "../../testing/simulated-runtime.ts";
import { startBcd, type BcdProcess } from "../../local/bcd-process.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { eventually as poll } from "../support/eventually.ts";

const POOL_LABELS = { "bc.dev/pool": "vms" };
/** What bcd reports for this machine (2 here): a guest of this many vCPUs fills a host, real or simulated. */
const HOST_CPUS = os.cpus().length;
const BOOT_MS = 180_000;

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-vms-stack-"));
const stateDir = path.join(dataDir, "agent");
const runtimeDir = path.join(dataDir, "runtime");
/** Where the qemu-microvm runtime keeps each guest's work dir (<root>/<instance id>). */
const guestsDir = path.join(runtimeDir, "qemu-microvm");
let stack: Stack;
let bcd: BcdProcess | undefined;
/** What bcd has written so far, stdout and stderr. */
const bcdOutput = () => bcd?.output() ?? "";
let fake: FakeDaemon | undefined;

beforeAll(async () => {
  // The guest image is built here when it is not cached (minutes), so bcd's first boot only boots.
  [stack] = await Promise.all([startStack({ dataDir }), ensureGuestImage()]);
}, 900_000);

afterAll(async () => {
  await fake?.stop();
  await bcd?.stop();
  // Whatever a failed run left: the guests' VMMs and namespaces.
  for (const pid of await processesNaming(runtimeDir)) process.kill(pid, "SIGKILL");
  for (const id of fs.existsSync(guestsDir) ? fs.readdirSync(guestsDir) : [])
    if (await netnsExists(netnsName(id))) await new Promise((r) => spawn("ip", ["netns", "del", netnsName(id)]).once("exit", r));
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

/** An API call as the admin or the holder of `key`; anything but a 200 throws with the API's code. */
const ok = (name: string, input: Record<string, unknown>, key = stack.adminKey) => callApi<any>(stack.url, key, name, input);

const eventually = <T>(read: () => Promise<T>, done: (v: T) => boolean, what: string, ms = 60_000) =>
  poll(read, done, what, { ms, intervalMs: 250, detail: () => `bcd said:\n${bcdOutput().slice(-4000)}` });

/** What a guest leaves on its host while it exists: its VMM, its work dir, its network namespace. */
async function leftovers(id: string): Promise<string[]> {
  const workDir = path.join(guestsDir, id);
  const left = (await processesNaming(workDir)).map((pid) => `VMM pid ${pid}`);
  if (fs.existsSync(workDir)) left.push(`work dir ${workDir}`);
  if (await netnsExists(netnsName(id))) left.push(`netns ${netnsName(id)}`);
  return left;
}

const script = (marker: string) => `#!/bin/sh\necho "${marker} from $(hostname)"\n`;

it("a tenant's three instances on a real bcd node and a simulated host: placed by capacity and anti-affinity, the third explained, real guests booted and removed", async () => {
  // ---- the operator: a host pool, a flavor, a tenant with a quota and its API key
  await ok("vps.pools.create", { id: "vms", class: "host", hosts: { labels: POOL_LABELS }, runtime: "qemu-microvm" });
  await ok("vps.flavors.create", { id: "vms-small", pool: "vms", vcpus: HOST_CPUS, memoryMiB: 128, diskGiB: 1 });
  await ok("vps.tenants.create", { id: "acme", name: "Acme" });
  await ok("vps.quotas.set", { tenant: "acme", pool: "vms", instances: 5, vcpus: 5 * HOST_CPUS, memoryMiB: 4096, diskGiB: 10 });
  const apiKey = await ok("iam.apiKeys.create", { name: "acme", roles: ["vps-tenant"] });
  await ok("vps.tenants.addMember", { tenant: "acme", principal: `apikey:${apiKey.id}` });
  const tenant = apiKey.key as string;

  // ---- host 1: the real bcd, joined with the pool's label; this machine's CPUs take one guest of the flavor.
  const realToken = (await ok("joinTokens.create", { role: "node", labels: POOL_LABELS })).token as string;
  bcd = startBcd({ url: stack.url, role: "node", stateDir, token: realToken, args: ["--runtime-dir", runtimeDir] });
  const real = (await eventually(
    async () => /joined as (\S+) /.exec(bcdOutput())?.[1],
    (id) => id !== undefined,
    "bcd joining",
  ))!;

  // ---- host 2: SIMULATED, a FakeDaemon reporting as many CPUs and running the simulated qemu-microvm.
  fake = new FakeDaemon({
    baseUrl: stack.url,
    transport: nodeTransport(),
    role: "node",
    resources: { cpus: HOST_CPUS, memoryMiB: 4096, diskGiB: 20, devices: [] },
    node: { runtimes: [simulatedRuntime({ id: "qemu-microvm" })] },
  });
  const { nodeId: simulated } = await fake.join((await ok("joinTokens.create", { role: "node", labels: POOL_LABELS })).token, {
    hostname: "simulated-host",
  });
  await fake.connect(30_000);

  const hosts = await eventually(
    async () => (await ok("capacity.hosts.list", { labels: POOL_LABELS })).hosts as any[],
    (list) => list.length === 2 && list.every((h) => h.schedulable && h.labels["bc.dev/driver.qemu-microvm"] !== undefined),
    "both hosts schedulable with the qemu-microvm runtime",
  );
  expect(hosts.find((h) => h.node === real).capacity).toMatchObject({ vcpus: HOST_CPUS });

  // ---- the tenant: two instances of one anti-affinity group, then a third no host has room for
  const create = (name: string, extra: object = {}) =>
    ok("vps.instances.create", { pool: "vms", flavor: "vms-small", name, userData: script(`hello-${name}`), ...extra }, tenant);
  const web1 = await create("web-1", { antiAffinityGroup: "web" });
  const web2 = await create("web-2", { antiAffinityGroup: "web" });
  expect(new Set([web1.host, web2.host])).toEqual(new Set([real, simulated]));
  const third = await create("web-3");
  expect(third).toMatchObject({ state: "pending", host: null });
  expect(third.placement.rejections).toEqual(
    expect.arrayContaining([
      { nodeId: real, filter: "fits", reason: expect.stringContaining(`needs ${HOST_CPUS} vCPUs, 0 free of ${HOST_CPUS}`) },
      { nodeId: simulated, filter: "fits", reason: expect.stringContaining(`needs ${HOST_CPUS} vCPUs, 0 free of ${HOST_CPUS}`) },
    ]),
  );
  const onReal = web1.host === real ? web1 : web2;
  const onSimulated = web1.host === real ? web2 : web1;

  // ---- both placed ones run; the one on bcd booted a real guest, whose report is shown to the tenant
  const get = async (id: string) => ok("vps.instances.get", { id }, tenant);
  await eventually(
    () => get(onSimulated.id),
    (v) => v.state === "running",
    "the simulated host's instance running",
  );
  const running = await eventually(
    () => get(onReal.id),
    (v) => v.state === "running",
    "the real guest running",
    BOOT_MS,
  );
  expect(running.guest).toMatchObject({ hostname: onReal.id, address: "10.0.2.2/30" });
  // The guest read exactly the bytes the tenant sent, and the stored sha256 says so.
  const sent = createHash("sha256")
    .update(script(`hello-${running.name}`))
    .digest("hex");
  expect(running.guest).toMatchObject({ userDataSha256: sent, storedUserDataSha256: sent });
  expect(running.guest.hostKeys.length).toBeGreaterThan(0);
  for (const key of running.guest.hostKeys) expect(key).toMatch(/^(ssh-ed25519|ecdsa-sha2-nistp\d+|ssh-rsa) \S+/);
  expect(running.guest.knownHosts).toContain(`${onReal.id} ${running.guest.hostKeys[0].split(" ").slice(0, 2).join(" ")}\n`);
  // While it runs, the host has its VMM, its work dir and its namespace (what the delete must remove).
  const present = await leftovers(onReal.id);
  expect(present).toEqual(expect.arrayContaining([`work dir ${path.join(guestsDir, onReal.id)}`, `netns ${netnsName(onReal.id)}`]));
  expect(present.some((l) => l.startsWith("VMM pid "))).toBe(true);

  // Its console is the guest's own serial output: the boot report and what the user data printed.
  const marker = `hello-${running.name} from ${onReal.id}`;
  const consoleTail = await eventually(
    async () => (await ok("vps.instances.console", { id: onReal.id, maxBytes: 16384 }, tenant)) as any,
    (c) => typeof c.console === "string" && c.console.includes(marker),
    "the user data's output on the console",
  );
  expect(consoleTail).toMatchObject({ host: real, stale: false, error: null });
  expect(consoleTail.console).toContain("bc-report ");
  // The console bytes are the tenant's: never in the host's log.
  expect(bcdOutput()).not.toContain(marker);

  // ---- deleting the real guest removes it wholly, frees the host, and the pending third takes its place
  await ok("vps.instances.delete", { id: onReal.id }, tenant);
  await eventually(
    () => get(onReal.id),
    (v) => v.state === "deleted",
    "the real guest deleted",
    BOOT_MS,
  );
  expect(await leftovers(onReal.id)).toEqual([]);
  const placed = await eventually(
    () => get(third.id),
    (v) => v.state !== "pending",
    "the third being placed",
    120_000,
  );
  expect(placed).toMatchObject({ host: real, placement: null });
  const reservations = (await ok("capacity.hosts.get", { node: real })).reservationList as any[];
  expect(reservations.map((r) => r.owner)).toEqual([`vps/instances/${third.id}`]);
  const thirdRunning = await eventually(
    () => get(third.id),
    (v) => v.state === "running",
    "the third's real guest running",
    BOOT_MS,
  );
  expect(thirdRunning.guest).toMatchObject({ hostname: third.id, userDataSha256: thirdRunning.guest.storedUserDataSha256 });

  // ---- delete everything, stop bcd: nothing is left on the host or booked
  for (const id of [onSimulated.id, third.id]) await ok("vps.instances.delete", { id }, tenant);
  for (const id of [onSimulated.id, third.id])
    await eventually(
      () => get(id),
      (v) => v.state === "deleted",
      `instance ${id} deleted`,
      BOOT_MS,
    );
  expect(await leftovers(third.id)).toEqual([]);
  expect(fs.readdirSync(guestsDir)).toEqual([]);
  expect(await processesNaming(runtimeDir)).toEqual([]);
  for (const host of [real, simulated]) expect((await ok("capacity.hosts.get", { node: host })).reservations).toBe(0);

  bcd.process.kill("SIGTERM");
  expect((await bcd.exited).code).toBe(0);
  expect(await processesNaming(runtimeDir)).toEqual([]);
}, 900_000);
