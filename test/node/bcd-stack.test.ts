// The real bcd process joins the local stack npm start runs (PGlite, bridge, wrangler dev)
// over a real WebSocket, runs a command sent through the API, and leaves when stopped.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startBcd, type BcdProcess } from "../../local/bcd-process.ts";
import { freePort, startStack, type Stack } from "../../local/stack.ts";
import { simRamdiskDir } from "../../testing/metal-sim.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { startRedfishEmulator } from "../../testing/redfish-emulator.ts";
import { eventually as poll } from "../support/eventually.ts";

const BMC_PASSWORD = "bmc-password-never-logged";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bcd-stack-"));
const stateDir = path.join(dataDir, "agent");
let stack: Stack;
let bcd: BcdProcess | undefined;
let ramdiskDir: string | undefined;
/** Every file in bcd's state directory (its network boot's among them). */
const stateFiles = () =>
  fs
    .readdirSync(stateDir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.join(e.parentPath, e.name));
/** What bcd has written so far, stdout and stderr. */
const bcdOutput = () => bcd?.output() ?? "";

beforeAll(async () => {
  stack = await startStack({ dataDir });
}, 120_000);

afterAll(async () => {
  bcd?.process.kill("SIGKILL");
  await stack?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
  if (ramdiskDir) fs.rmSync(ramdiskDir, { recursive: true, force: true });
});

const eventually = <T>(read: () => Promise<T>, done: (v: T) => boolean, what: string) =>
  poll(read, done, what, { detail: () => `bcd said:\n${bcdOutput()}` });

/** The admin's API call; anything but a 200 throws. */
const api = (name: string, input: Record<string, unknown>) => callApi<any>(stack.url, stack.adminKey, name, input);

it("joins with a site token, connects, runs a command, drives a BMC for commissioning, and disconnects on SIGTERM", async () => {
  const token = (await api("siteTokens.create", { site: "lab" })).token as string;
  // Serving network boot (no DHCP here) with a stand-in ramdisk, so commissioning can tell the site what to boot.
  ramdiskDir = await simRamdiskDir();
  bcd = startBcd({
    url: stack.url,
    role: "site",
    stateDir,
    token,
    args: ["--netboot-address", "127.0.0.1", "--netboot-port", String(await freePort()), "--ramdisk-dir", ramdiskDir],
  });

  const site = await eventually(
    async () => (await api("nodes.list", { role: "site" })).nodes as any[],
    (nodes) => nodes.some((n) => n.state === "connected"),
    "the site agent connecting",
  );
  const node = site.find((n) => n.state === "connected");
  expect(node.labels["bc.dev/site"]).toBe("lab");

  const created = await api("commands.create", { node: node.id, kind: "agent.ping", body: {} });
  const done = await eventually(
    async () => api("commands.get", { id: created.id }),
    (c) => c.state === "succeeded",
    "the ping's result",
  );
  expect(done.result).toMatchObject({ pong: true });

  // The token reached neither the state directory nor anything bcd printed.
  // The whole secret half: base64url may itself contain "_".
  const secret = /^bcj_[0-9a-f]{16}_(.{43})$/.exec(token)![1]!;
  for (const file of stateFiles()) expect(fs.readFileSync(file, "utf8")).not.toContain(secret);
  expect(bcdOutput()).not.toContain(secret);

  // The site role: bcd drives a (simulated) BMC for commissioning, the password resolved at delivery.
  const bmc = await startRedfishEmulator({ machines: [{ nic: true }], username: "admin", password: BMC_PASSWORD });
  try {
    const system = [...bmc.machines.values()][0]!;
    await api("metal.sites.create", { id: "lab" });
    await api("metal.pools.create", { id: "lab-metal", site: "lab", policy: { hardwareProfile: "redfish-pxe" } });
    const enrolled = await api("metal.enroll", {
      id: "m-1",
      pool: "lab-metal",
      bmc: { address: `${bmc.url}/redfish/v1/Systems/${system.id}`, username: "admin", password: BMC_PASSWORD },
    });
    expect(enrolled).toMatchObject({ state: "commissioning" });
    // No ramdisk will boot here (no PXE): commissioning gets as far as the power cycle and waits.
    await eventually(
      async () => system.powerHistory,
      (h) => h.includes("On"),
      "the power cycle through bcd",
    );
    const workflow = await api("workflows.get", { id: enrolled.workflow });
    expect(workflow.steps[0]).toMatchObject({ name: "inspect", attempts: [{ state: "succeeded", output: { uuid: system.uuid } }] });
    expect(bmc.requests.some((r) => r.method === "POST" && r.path.endsWith("/Actions/ComputerSystem.Reset") && r.status === 204)).toBe(
      true,
    );
    for (const file of stateFiles()) expect(fs.readFileSync(file, "utf8")).not.toContain(BMC_PASSWORD);
    expect(bcdOutput()).not.toContain(BMC_PASSWORD);
  } finally {
    await bmc.stop();
  }

  bcd.process.kill("SIGTERM");
  const { code } = await bcd.exited;
  expect(code).toBe(0);
  await eventually(
    async () => (await api("nodes.get", { node: node.id })).state,
    (s) => s === "disconnected",
    "the disconnection being recorded",
  );
}, 120_000);
