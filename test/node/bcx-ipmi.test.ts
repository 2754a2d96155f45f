// The bcx-ipmi plugin as it ships (npm run build:bcd bundles it beside bcd), run by bcd's plugin
// host sandboxed (uid nobody, the seccomp filter) against a real machine behind the IPMI BMC
// (testing/ipmi-bmc.ts: ipmi_sim over a QEMU q35 SeaBIOS guest): driverConformanceCases; the BMC
// contract the site role speaks (inspect, power.set, boot.set, the console stream); and the site
// role's own handlers sending a binding that names ipmi to it, with the password by reference.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildBcd, INSTALLED } from "../../agent/build/bcd.ts";
import { checkSandbox, PluginHost } from "../../agent/bcx/host.ts";
import type { CommandContext } from "../../agent/contracts.ts";
import { siteHandlers } from "../../agent/roles/site.ts";
import { runConformance } from "better-compute/conformance";
import { bcxSubject, driverConformanceCases } from "better-compute/driver-sdk";
import { startIpmiBmc, type IpmiBmc } from "../../testing/ipmi-bmc.ts";
import { startQemuMachine, type QemuMachine } from "../../testing/qemu-machine.ts";

const USER = "admin";
const PASS = "ipmi-Pa55word";
const has = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
const missing = ["qemu-system-x86_64", "ipmi_sim", "ipmitool", "socat", "script"].filter((c) => !has(c));
const sandboxProblem = process.getuid?.() === 0 ? await checkSandbox({ user: "nobody" }) : "needs root";
const skipReason = missing.length ? `missing ${missing.join(", ")}` : sandboxProblem;
if (skipReason) console.warn(`bcx-ipmi: skipped: ${skipReason}`);

let machine: QemuMachine;
let bmc: IpmiBmc;
let pluginFile: string;
let host: PluginHost;
const logged: string[] = [];
const log = {
  info: (m: string, f?: object) => void logged.push(`${m} ${JSON.stringify(f ?? {})}`),
  warn: (m: string, f?: object) => void logged.push(`${m} ${JSON.stringify(f ?? {})}`),
  error: (m: string, f?: object) => void logged.push(`${m} ${JSON.stringify(f ?? {})}`),
};
const binding = () => ({ driver: "ipmi", address: bmc.address("m1"), username: USER, password: PASS, macs: [machine.nics[0]!.mac] });

beforeAll(async () => {
  if (skipReason) return;
  const build = await buildBcd();
  pluginFile = path.join(build.root, INSTALLED.plugins, "bcx-ipmi.mjs");
  expect(build.manifest.plugins["bcx-ipmi.mjs"]!.sha256).toBe(createHash("sha256").update(fs.readFileSync(pluginFile)).digest("hex"));
  machine = await startQemuMachine({
    name: "ipmi-plugin",
    smbios: { manufacturer: "Better Compute", product: "BC-Emulated 1", serial: "BC-IPMI-0002" },
    nics: [{ mac: "52:54:00:bc:00:02" }],
    log: () => {},
  });
  bmc = await startIpmiBmc({ machines: [{ machine, id: "m1" }], user: USER, password: PASS, log: () => {} });
  host = await PluginHost.start(
    {
      dir: path.dirname(pluginFile),
      user: "nobody",
      privileged: [],
      pins: [{ path: pluginFile, sha256: build.manifest.plugins["bcx-ipmi.mjs"]!.sha256 }],
    },
    { log, builtinDrivers: ["redfish"] },
  );
}, 300_000);

afterAll(async () => {
  await host?.close();
  await bmc?.stop();
  await machine?.stop();
}, 60_000);

describe.skipIf(skipReason !== undefined)("the bcx-ipmi plugin", () => {
  it("passes driverConformanceCases as bcd runs it (sandboxed)", async () => {
    const subject = () => bcxSubject({ file: pluginFile, samples: { inspect: [binding()], "power.status": [binding()] } });
    const report = await runConformance(driverConformanceCases(), subject);
    expect(report.failed).toEqual([]);
  }, 120_000);

  it("inspects the machine (its SMBIOS UUID from the System GUID, the FRU's maker and serial, the binding's MACs) and powers it, boot device honoured", async () => {
    expect(host.drivers()).toMatchObject([{ id: "ipmi", kinds: ["power", "management"], streams: ["console"] }]);
    const seen = (await host.invoke("ipmi", "inspect", [binding()])) as Record<string, any>;
    expect(seen).toMatchObject({
      uuid: machine.uuid.toLowerCase(),
      manufacturer: "Better Compute",
      model: "BC-Emulated 1",
      serialNumber: "BC-IPMI-0002",
      powerState: "Off",
      macs: ["52:54:00:bc:00:02"],
    });
    expect(seen.sensors).toContainEqual(expect.objectContaining({ name: "MB Temp", value: 40 }));

    expect(await host.invoke("ipmi", "boot.set", [binding(), "cd", true])).toEqual({ target: "cd", once: true });
    expect(machine.bootOverride).toMatchObject({ target: "Cd" });
    const from = machine.console.text.length;
    expect(await host.invoke("ipmi", "power.set", [binding(), "on"], { deadlineMs: 60_000 })).toEqual({
      previous: "Off",
      powerState: "On",
    });
    await machine.console.waitFor(/Booting from DVD\/CD/, { from, timeoutMs: 60_000 });
    expect(await host.invoke("ipmi", "power.status", [binding()])).toEqual({ powerState: "On" });
    expect(await host.invoke("ipmi", "power.set", [binding(), "off"], { deadlineMs: 60_000 })).toMatchObject({ powerState: "Off" });
    expect(await host.invoke("ipmi", "inspect", [binding()])).toMatchObject({ powerState: "Off" });
  }, 120_000);

  it("streams the machine's console over serial-over-LAN", async () => {
    const stream = host.openStream("ipmi", "console", [binding()]);
    let text = "";
    stream.onData((b) => (text += b.toString("latin1")));
    await new Promise((r) => setTimeout(r, 1000)); // the SOL session is up before the machine prints
    await host.invoke("ipmi", "power.set", [binding(), "on"], { deadlineMs: 60_000 });
    await expect.poll(() => text, { timeout: 60_000, interval: 200 }).toMatch(/SeaBIOS/);
    stream.close();
    await host.invoke("ipmi", "power.set", [binding(), "off"], { deadlineMs: 60_000 });
  }, 120_000);

  it("a wrong password is DRIVER_ERROR without the password; what IPMI cannot do is UNSUPPORTED", async () => {
    const wrong = { ...binding(), password: "not-the-Pa55" };
    const refused = await host.invoke("ipmi", "power.set", [wrong, "on"]).catch((e: Error) => e);
    expect(refused).toMatchObject({ code: "DRIVER_ERROR", message: expect.stringMatching(/authentication|refused/) });
    expect((refused as Error).message).not.toContain("not-the-Pa55");
    expect(logged.join("\n")).not.toContain(PASS);
  });

  it("is what the site role's BMC commands reach when the binding names ipmi, the password by reference", async () => {
    const handlers = siteHandlers({ hosted: host, log });
    const ctx = (kind: string): CommandContext =>
      ({ kind, commandId: "c1", secrets: { "secret://bmc-m1": PASS }, signal: new AbortController().signal }) as unknown as CommandContext;
    const bmcRef = { ...binding(), password: "secret://bmc-m1" };
    const run = async (kind: string, body: Record<string, unknown>): Promise<unknown> => handlers[kind]!(body, ctx(kind));
    expect(await run("metal.bmc.inspect", { bmc: bmcRef })).toMatchObject({
      uuid: machine.uuid.toLowerCase(),
    });
    expect(await run("metal.bmc.boot", { bmc: bmcRef, device: "pxe", once: true })).toMatchObject({
      target: "pxe",
    });
    expect(machine.bootOverride).toMatchObject({ target: "Pxe" });
    const media = await run("metal.bmc.media.insert", { bmc: bmcRef, url: "http://10.0.0.1/x.iso" }).catch((e: Error) => e);
    expect(media).toMatchObject({ code: "UNSUPPORTED", message: "BMC driver ipmi does not do media.insert (metal.bmc.media.insert)" });
    const other = await run("metal.bmc.power", { bmc: { ...bmcRef, driver: "acme" }, action: "on" }).catch((e: Error) => e);
    expect(other).toMatchObject({ code: "UNSUPPORTED", message: expect.stringContaining("hosts no BMC driver acme") });
    expect(logged.filter((l) => l.startsWith("bmc operation")).join("\n")).not.toContain(PASS);
  }, 60_000);
});
