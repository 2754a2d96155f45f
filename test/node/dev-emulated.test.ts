// `npm run dev -- --emulated` as a user runs it: a banner saying what is real (the site agent, the
// QEMU machine, its network boot) and what is emulated (the BMC), the machine's progress step by
// step to ready, the banner's deploy command pasted into a shell taking it to deployed, and
// Ctrl-C leaving no network namespace or QEMU behind. The builds come from their caches
// (test/node/emulated-site.test.ts makes them the first time: minutes).
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { freePort } from "../../local/stack.ts";
import { canMakeNetns } from "../../testing/netns.ts";
import { EMULATED_BMC_PASSWORD } from "../../testing/emulated-site.ts";
import { NpmRunDev, pasteCommand } from "../support/npm-run-dev.ts";

const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-emulated-"));
const devDir = path.join(baseDir, "dev");
const paste = pasteCommand(baseDir);
const missing = [
  ...(canMakeNetns() ? [] : ["root and ip netns"]),
  ...["qemu-system-x86_64", "dnsmasq", "socat"].filter((tool) => spawnSync("sh", ["-c", `command -v ${tool}`]).status !== 0),
];
let dev: NpmRunDev | undefined;

afterAll(async () => {
  await dev?.interrupt();
  fs.rmSync(baseDir, { recursive: true, force: true });
});

it.skipIf(missing.length > 0)(
  "shows a QEMU machine network-booting to ready; the banner's deploy command deploys it; Ctrl-C leaves nothing behind",
  async () => {
    const port = await freePort();
    dev = new NpmRunDev(["--emulated", "--machines", "1"], { PORT: String(port), BC_DATA_DIR: baseDir, DATABASE_URL: "" });
    await dev.waitFor(/Press Ctrl-C to stop\./, 900_000, "its banner");
    expect(dev.output).toContain(`running at http://127.0.0.1:${port} with an emulated site`);
    expect(dev.output).toMatch(/the site agent: the installed bcd build \(\S+\)/);
    const netns = /inside network namespace (bc-es\d+-\d+): DHCP \(dnsmasq\) on br0 only/.exec(dev.output)?.[1];
    expect(netns, dev.output).toBeDefined();
    expect(dev.output).toMatch(/1 QEMU machines \(under (TCG|KVM)/);
    expect(dev.output).toMatch(/EMULATED {3}their BMCs: a Redfish emulator at http:\/\/127\.0\.0\.1:\d+ working each machine over QMP/);
    expect(dev.output).toContain("machines in pool dev-pool: m1 (bios)");

    // Its way to ready, step by step: into the ramdisk over the network, wiped, off.
    await dev.waitFor(/^ {2}1 emulated machine ready$/m, 300_000, "the machine ready");
    for (const step of ["power.cycle", "wait.ramdisk", "inventory.ramdisk", "disk.wipe", "power.off"])
      expect(dev.output).toMatch(new RegExp(`^ {2}m1 {4}commissioning: ${step.replace(".", "\\.")}$`, "m"));
    expect(dev.output).toMatch(/^ {2}m1 {2}commissioning → ready \(\d+ s\)$/m);
    expect(dev.output).toMatch(/\[site-agent\] INFO served an iPXE script {2}machine=m1 {2}action=ramdisk/);

    const deploy = /^ {4}(npx better-compute metal deploy m1 .*)$/m.exec(dev.output)![1]!;
    const out = await paste(deploy, { BC_DATA_DIR: baseDir, BC_URL: "", BC_API_KEY: "" });
    expect(out).toMatch(/image\.write/);
    expect(out).toContain("machine m1 is deployed");
    await dev.waitFor(/^ {2}m1 {2}deploying → deployed \(\d+ s\)$/m, 60_000, "the machine deployed");
    expect(dev.output).not.toContain(EMULATED_BMC_PASSWORD);

    await dev.interrupt();
    expect(execFileSync("ip", ["netns", "list"], { encoding: "utf8" })).not.toContain(netns!);
    expect(fs.existsSync(path.join(devDir, "lock"))).toBe(false);
  },
  1_200_000,
);
