// The emulated site end to end (testing/emulated-site.ts, docs/emulated-site.md): QEMU machines,
// SeaBIOS and OVMF, behind the Redfish emulator or an IPMI BMC (ipmi_sim, driven through the site
// agent's bcx-ipmi plugin), network-boot through the
// installed bcd site agent (DHCP by its dnsmasq on a bridge inside this run's network namespace),
// are inspected and wiped in the bcd ramdisk, take the OS image (zstd, through the site's image
// cache) with a config drive, boot it from their NVMe disk, and the installed system's own bcd
// joins as role node; undeploy wipes them and they are ready again. Every effect on a disk is
// checked from outside the guest, by reading the disk's file. The control plane is the local
// stack running examples/emulated-site's deployment. The first run builds the images (minutes).
import { spawn, spawnSync } from "node:child_process";
import { createHash, randomFillSync } from "node:crypto";
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mbrEntryOffset } from "../../agent/roles/mbr.ts";
import { openNodeStore, repoRoot, type NodeStore } from "../../local/node-store.ts";
import { startStack, type Stack } from "../../local/stack.ts";
import { destructiveTwice } from "../../testing/metal-sim.ts";
import { canMakeNetns } from "../../testing/netns.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import {
  buildForEmulatedSite,
  SITE_ADDRESS,
  startEmulatedSite,
  type EmulatedMachine,
  type EmulatedSite,
  type EmulatedSiteBuilds,
} from "../../testing/emulated-site.ts";
import { OVMF_CODE } from "../../testing/qemu-machine.ts";
import { eventually } from "../support/eventually.ts";

const MiB = 2 ** 20;
const MACHINE_MINUTES = 10;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-emulated-site-"));
const missing = [
  ...(canMakeNetns() ? [] : ["root and ip netns"]),
  ...["qemu-system-x86_64", "dnsmasq", "socat", "ipmi_sim", "ipmitool"].filter(
    (tool) => spawnSync("sh", ["-c", `command -v ${tool}`]).status !== 0,
  ),
  ...(fs.existsSync(OVMF_CODE) ? [] : ["ovmf"]),
];
if (missing.length > 0) console.warn(`emulated-site: skipped: missing ${missing.join(", ")}`);

let builds: EmulatedSiteBuilds;
let stack: Stack;
const stackOptions = () => ({
  dataDir: path.join(tmp, "stack"),
  main: "test/node/emulated-site.worker.ts",
  onOutput: (line: string) => void lines.push(`[stack] ${line}`),
});
let site: EmulatedSite;
let images: Server;
let imageUrl: string;
let installerUrl: string;
const lines: string[] = [];

beforeAll(async () => {
  if (missing.length > 0) return;
  builds = await buildForEmulatedSite((line) => console.log(line));
  stack = await startStack(stackOptions());
  // The image server an operator names in metal.deploy: on this host's loopback, relayed into the site.
  images = createServer((req, res) => {
    const [file, bytes] =
      req.url === "/images/bc-os.img.zst"
        ? [builds.os.zstd, builds.os.manifest.zstd.bytes]
        : req.url === "/images/installer.iso"
          ? [builds.installer.iso, builds.installer.manifest.iso.bytes]
          : [];
    if (!file) return void res.writeHead(404).end();
    res.writeHead(200, { "content-length": bytes });
    fs.createReadStream(file).pipe(res);
  });
  await new Promise<void>((resolve) => images.listen(0, "127.0.0.1", resolve));
  const port = (images.address() as AddressInfo).port;
  imageUrl = `http://127.0.0.1:${port}/images/bc-os.img.zst`;
  installerUrl = `http://127.0.0.1:${port}/images/installer.iso`;
  site = await startEmulatedSite({
    controlPlane: stack,
    machines: [
      { id: "bios", firmware: "bios" },
      { id: "uefi", firmware: "uefi" },
      { id: "dying", firmware: "bios", failWrites: true },
      { id: "installer", firmware: "bios" },
      { id: "lost", firmware: "bios", unplugged: true },
      { id: "ipmi", firmware: "bios", bmc: "ipmi" },
    ],
    bcd: builds.bcd.launcher,
    ramdiskDir: builds.ramdisk.dir,
    workDir: path.join(tmp, "site"),
    loopbackPorts: [port],
    print: (line) => lines.push(line),
  });
}, 1_200_000);

afterAll(async () => {
  await site?.stop();
  await new Promise((resolve) => (images ? images.close(resolve) : resolve(undefined)));
  await stack?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
}, 120_000);

const api = <T = any>(method: string, input: Record<string, unknown> = {}) => callApi<T>(stack.url, stack.adminKey, method, input);

/** What explains a failure: the machine's console and the site agent's log, their ends. */
function detail(machine: EmulatedMachine): string {
  const console = fs.existsSync(machine.consoleFile) ? fs.readFileSync(machine.consoleFile, "utf8") : "";
  return `--- ${machine.id}'s console (end) ---\n${console.slice(-3000)}\n--- site agent and stack (end) ---\n${lines.slice(-60).join("\n")}`;
}

async function waitForState(machine: EmulatedMachine, states: string[]): Promise<Record<string, any>> {
  const until = Date.now() + MACHINE_MINUTES * 60_000;
  for (;;) {
    const node = await api("metal.nodes.get", { node: machine.id });
    if (states.includes(node.state)) return node;
    if (Date.now() > until)
      throw new Error(`${machine.id} is ${node.state}, not ${states.join(" or ")}: ${JSON.stringify(node.lastError)}\n${detail(machine)}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

/** Random bytes at the start of every 16 MiB of the disk: what a wipe must leave no trace of. */
function scribble(file: string): void {
  const fd = fs.openSync(file, "r+");
  for (let at = 0; at < fs.fstatSync(fd).size; at += 16 * MiB) fs.writeSync(fd, randomFillSync(Buffer.alloc(MiB)), 0, MiB, at);
  fs.closeSync(fd);
}

/** Whether every byte of the disk's file is zero (a wipe, as a later read of the disk sees it). */
function allZero(file: string): boolean {
  const fd = fs.openSync(file, "r");
  const chunk = Buffer.alloc(8 * MiB);
  try {
    for (;;) {
      const n = fs.readSync(fd, chunk, 0, chunk.length, null);
      if (n === 0) return true;
      if (chunk.subarray(0, n).some((b: number) => b !== 0)) return false;
    }
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * sha256 of the disk's first bytes, as long as the raw image, with the partition entry the config
 * drive added zeroed (the image's own table has it empty): the image's sha256 if it is on the disk.
 */
function imageOnDisk(file: string, bytes: number): string {
  const fd = fs.openSync(file, "r");
  const data = Buffer.alloc(bytes);
  fs.readSync(fd, data, 0, bytes, 0);
  fs.closeSync(fd);
  data.fill(0, mbrEntryOffset(1), mbrEntryOffset(1) + 16);
  return createHash("sha256").update(data).digest("hex");
}

/** The installed system's agent: the node-role agent that joined last for this machine (its join token's label). */
async function installedAgent(machine: EmulatedMachine): Promise<Record<string, any> | undefined> {
  const { nodes } = await api<{ nodes: Record<string, any>[] }>("nodes.list", { role: "node" });
  return nodes
    .filter((n) => n.labels?.["bc.dev/machine"] === machine.id)
    .sort((a, b) => a.joinedAt.localeCompare(b.joinedAt))
    .at(-1);
}

/** The machine as the emulated site made it. */
const machine = (id: string) => site.machines.find((m) => m.id === id)!;

const enroll = (m: EmulatedMachine) => site.enroll(m) as Promise<Record<string, any>>;

const bin = path.join(repoRoot, "scripts/better-compute.mjs");
/**
 * `better-compute metal console <node>` as an operator runs it: resolves with its output once it
 * shows `pattern`, and stops it then.
 */
function consoleShows(node: string, pattern: RegExp, seconds: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, "metal", "console", node, "--seconds", String(seconds)], {
      env: { ...process.env, BC_URL: stack.url, BC_API_KEY: stack.adminKey, BC_DATA_DIR: path.join(tmp, "cli") },
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString("latin1");
      if (pattern.test(out)) child.kill();
    });
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("close", () =>
      pattern.test(out)
        ? resolve(out)
        : reject(new Error(`${node}'s console never showed ${pattern}; stdout: ${out.slice(-1500)}; stderr: ${err.slice(-1500)}`)),
    );
  });
}

/** Waits until the workflow's step has begun (or, with `sent`, until its command went out); answers the workflow. */
async function stepReached(workflow: string, step: string, sent = false): Promise<Record<string, any>> {
  const until = Date.now() + MACHINE_MINUTES * 60_000;
  for (;;) {
    const wf = await api("workflows.get", { id: workflow });
    const attempts = wf.steps.find((s: { name: string }) => s.name === step)?.attempts ?? [];
    if (attempts.some((a: { commandId: string | null }) => !sent || a.commandId)) return wf;
    if (wf.state !== "running" || Date.now() > until) throw new Error(`workflow ${workflow} never reached ${step}: ${JSON.stringify(wf)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Runs `check` on a connection of its own to the control plane's database. */
async function inDatabase<T>(check: (store: NodeStore) => Promise<T>): Promise<T> {
  const store = await openNodeStore(stack.databaseUrl);
  try {
    return await check(store);
  } finally {
    await store.close();
  }
}

async function lifecycle(machine: EmulatedMachine, opts: { console?: boolean } = {}): Promise<void> {
  scribble(machine.disk);
  expect(allZero(machine.disk)).toBe(false);

  const enrolled = await enroll(machine);
  expect(enrolled.state).toBe("commissioning");
  // What an operator sees when commissioning hangs: the machine's console, live, through the site agent.
  const shown = opts.console ? consoleShows(machine.id, /bc-ramdisk: [^]*bc-ramdisk: /, MACHINE_MINUTES * 60) : undefined;
  const ready = await waitForState(machine, ["ready", "failed"]);
  if (shown) expect(await shown).toMatch(/bc-ramdisk: /);
  expect(ready.state, `${JSON.stringify(ready.lastError)}\n${detail(machine)}`).toBe("ready");
  expect(allZero(machine.disk), "commissioning wiped the disk").toBe(true);
  expect(ready.productUuid).toBe(machine.qemu.uuid.toLowerCase());

  const deploy = await api("metal.deploy", {
    node: machine.id,
    profile: "metal.deploy.image-stream",
    input: { image: { url: imageUrl, sha256: builds.os.manifest.zstd.sha256 } },
  });
  const deployed = await waitForState(machine, ["deployed", "failed"]);
  expect(deployed.state, `${JSON.stringify(deployed.lastError)}\n${detail(machine)}`).toBe("deployed");
  expect(deployed).toMatchObject({ role: "host", workflow: deploy.workflow });
  expect(imageOnDisk(machine.disk, builds.os.manifest.raw.bytes)).toBe(builds.os.manifest.raw.sha256);
  const agent = await installedAgent(machine);
  expect(agent, "the installed system's bcd joined").toMatchObject({ role: "node", state: "connected", revoked: false });

  const undeploy = await api("metal.undeploy", { node: machine.id });
  const released = await waitForState(machine, ["ready", "failed"]);
  expect(released.state, `${JSON.stringify(released.lastError)}\n${detail(machine)}`).toBe("ready");
  expect(released.workflow).toBe(undeploy.workflow);
  expect(allZero(machine.disk), "undeploy wiped the disk").toBe(true);
  expect(await installedAgent(machine), "the installed system's agent went with its disk").toMatchObject({ id: agent!.id, revoked: true });
}

describe.skipIf(missing.length > 0)("the emulated site", () => {
  it(
    "a BIOS, a UEFI and an IPMI machine: enroll → ready (wiped) → deploy → deployed (the image on the disk, its agent joined) → undeploy → ready (wiped); the console shows the ramdisk booting",
    async () => {
      await Promise.all([
        lifecycle(machine("bios"), { console: true }),
        lifecycle(machine("uefi")),
        lifecycle(machine("ipmi"), { console: true }),
      ]);

      // The IPMI machine was driven by the bcx-ipmi plugin the site agent hosts, every BMC operation of it.
      const ipmi = machine("ipmi");
      const commands = await inDatabase((store) =>
        store.db.execute(
          sql`SELECT kind, state, body->'bmc'->>'driver' AS driver FROM bc_commands WHERE kind LIKE 'metal.bmc.%' AND body->'bmc'->>'address' = ${ipmi.bmcAddress}`,
        ),
      );
      const rows = commands.rows as { kind: string; state: string; driver: string }[];
      expect(new Set(rows.map((r) => r.kind))).toEqual(
        new Set(["metal.bmc.inspect", "metal.bmc.power", "metal.bmc.boot", "metal.bmc.console"]),
      );
      expect(rows.filter((r) => r.driver !== "ipmi" || r.state !== "succeeded")).toEqual([]);
      expect(site.bmc.machines.has(ipmi.id), "the Redfish emulator never knew it").toBe(false);
      const { nodes } = await api<{ nodes: Record<string, any>[] }>("nodes.list", { role: "site" });
      expect(nodes.find((n) => n.id === site.siteAgentNodeId)?.labels).toMatchObject({ "bc.dev/driver.ipmi": "1.0.0" });
      // Each console session an operator opened is an audit row.
      const audit = await api<{ entries: { action: string; resource: string }[] }>("audit.list", { action: "metal.nodes.console" });
      expect(audit.entries.map((e) => e.resource).sort()).toEqual(["metal/nodes/bios", "metal/nodes/ipmi"]);
    },
    2 * MACHINE_MINUTES * 60_000,
  );

  it(
    "a disk that fails every write: commissioning's wipe fails, the machine ends failed with maintenance on, never ready",
    async () => {
      const dying = machine("dying");
      await enroll(dying);
      const failed = await waitForState(dying, ["failed", "ready"]);
      expect(failed.state, detail(dying)).toBe("failed");
      expect(failed.maintenance).toBe(true);
      expect(JSON.stringify(failed.lastError)).toMatch(/disk\.wipe/);
      await dying.qemu.forceOff();
    },
    MACHINE_MINUTES * 60_000,
  );

  it(
    "an image whose sha256 does not match is refused by the site's cache before a byte is written: never deployed",
    async () => {
      const bios = machine("bios");
      const wrong = createHash("sha256").update("not the OS image").digest("hex");
      await api("metal.deploy", {
        node: bios.id,
        profile: "metal.deploy.image-stream",
        input: { image: { url: imageUrl, sha256: wrong } },
      });
      const failed = await waitForState(bios, ["failed", "deployed"]);
      expect(failed.state, detail(bios)).toBe("failed");
      expect(JSON.stringify(failed.lastError)).toMatch(/image\.cache.*digest mismatch|digest mismatch.*image\.cache/);
      expect(allZero(bios.disk), "nothing was written").toBe(true);
      await bios.qemu.forceOff();
    },
    MACHINE_MINUTES * 60_000,
  );

  it(
    "the site agent restarted while the ramdisk boots from it, the control plane while the image is written: deployed, nothing sent twice; rescue leaves the disk alone",
    async () => {
      const uefi = machine("uefi");
      const { workflow } = await api("metal.deploy", {
        node: uefi.id,
        profile: "metal.deploy.image-stream",
        input: { image: { url: imageUrl, sha256: builds.os.manifest.zstd.sha256 } },
      });
      await stepReached(workflow, "wait.ramdisk");
      await site.restartSiteAgent();
      await stepReached(workflow, "image.write", true);
      const port = Number(new URL(stack.url).port);
      await stack.stop();
      stack = await startStack({ ...stackOptions(), port });

      const deployed = await waitForState(uefi, ["deployed", "failed"]);
      expect(deployed.state, `${JSON.stringify(deployed.lastError)}\n${detail(uefi)}`).toBe("deployed");
      expect(imageOnDisk(uefi.disk, builds.os.manifest.raw.bytes)).toBe(builds.os.manifest.raw.sha256);
      const agent = await installedAgent(uefi);
      expect(agent).toMatchObject({ state: "connected", revoked: false });
      expect(await inDatabase((store) => destructiveTwice(store))).toEqual([]);
      const wf = await api("workflows.get", { id: workflow });
      expect(wf.steps.filter((step: { attempts: unknown[] }) => step.attempts.length !== 1)).toEqual([]);

      // Rescue boots the ramdisk and leaves the disk alone; unrescue boots the disk again.
      await api("metal.rescue", { node: uefi.id });
      const rescued = await waitForState(uefi, ["rescue", "failed"]);
      expect(rescued.state, `${JSON.stringify(rescued.lastError)}\n${detail(uefi)}`).toBe("rescue");
      await api("metal.unrescue", { node: uefi.id });
      const back = await waitForState(uefi, ["deployed", "failed"]);
      expect(back.state, `${JSON.stringify(back.lastError)}\n${detail(uefi)}`).toBe("deployed");
      expect(imageOnDisk(uefi.disk, builds.os.manifest.raw.bytes)).toBe(builds.os.manifest.raw.sha256);
      // The same installed system, its identity on its config drive: it reconnects as the node it was.
      const again = await eventually(
        () => installedAgent(uefi),
        (n) => n?.state === "connected",
        "the installed system reconnected",
        {
          ms: 120_000,
          detail: () => detail(uefi),
        },
      );
      expect(again).toMatchObject({ id: agent!.id, revoked: false });
    },
    MACHINE_MINUTES * 60_000,
  );

  it(
    "Walkthrough 1 for real: an installer ISO rendered with the machine's token, kept as a blob, mirrored by the site by its digest, booted from the BMC's virtual CD; the installed system joins",
    async () => {
      const m = machine("installer");
      await enroll(m);
      const ready = await waitForState(m, ["ready", "failed"]);
      expect(ready.state, detail(m)).toBe("ready");
      const { workflow } = await api("metal.deploy", {
        node: m.id,
        profile: "bc-os.autoinstall",
        input: {
          image: { url: imageUrl, sha256: builds.os.manifest.zstd.sha256 },
          installer: {
            url: installerUrl,
            sha256: builds.installer.manifest.iso.sha256,
            machineImage: builds.installer.manifest.machineImage,
          },
          joinUrl: `http://${SITE_ADDRESS}:${new URL(stack.url).port}`,
          hostname: "installed-1",
        },
      });
      const deployed = await waitForState(m, ["deployed", "failed"]);
      expect(deployed.state, `${JSON.stringify(deployed.lastError)}\n${detail(m)}`).toBe("deployed");
      expect(imageOnDisk(m.disk, builds.os.manifest.raw.bytes)).toBe(builds.os.manifest.raw.sha256);
      expect(await installedAgent(m)).toMatchObject({ role: "node", state: "connected", hostname: "installed-1" });

      // The CD the BMC booted: the site's copy of the blob the control plane rendered, ejected since.
      const steps = (await api("workflows.get", { id: workflow })).steps as { name: string; attempts: { output: any }[] }[];
      const rendered = steps.find((s) => s.name === "autoinstall.renderInstallerIso")!.attempts.at(-1)!.output.image.blob as string;
      const mirrored = steps.find((s) => s.name === "iso.cache")!.attempts.at(-1)!.output;
      expect(mirrored).toMatchObject({ sha256: rendered, url: `http://${SITE_ADDRESS}:8780/images/${rendered}` });
      expect(rendered).not.toBe(builds.installer.manifest.iso.sha256); // its window holds this machine's config
      expect(site.bmc.machines.get(m.id)!.media).toMatchObject({ inserted: false });
      // The token is in the ISO alone: no command, step or event carries one.
      const recorded = await inDatabase(async (store) =>
        JSON.stringify(
          await Promise.all([
            store.db.execute(sql`SELECT body, result FROM bc_commands`),
            store.db.execute(sql`SELECT input, output, error FROM workflow_steps`),
            store.db.execute(sql`SELECT data FROM bc_events`),
          ]),
        ),
      );
      expect(recorded).not.toMatch(/bcj_[0-9a-f]{16}_/);
    },
    MACHINE_MINUTES * 60_000,
  );

  // Last: it moves the control plane's clock half an hour on.
  it(
    "a machine that never network-boots fails commissioning at wait.ramdisk once its deadline passes",
    async () => {
      const lost = machine("lost");
      const enrolled = await enroll(lost);
      expect(enrolled.workflow, "commissioning started at enrollment").toBeTruthy();
      await stepReached(enrolled.workflow, "wait.ramdisk");
      await inDatabase((store) => store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => 1830)`));
      const failed = await waitForState(lost, ["failed", "ready"]);
      expect(failed.state).toBe("failed");
      expect(failed.maintenance).toBe(true);
      expect(JSON.stringify(failed.lastError)).toContain("step wait.ramdisk was still not ready at its deadline");
    },
    MACHINE_MINUTES * 60_000,
  );
});
