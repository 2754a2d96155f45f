// `npm run dev -- --emulated`'s site (docs/emulated-site.md): N QEMU machines that really boot,
// behind the Redfish emulator, network-booted by the installed bcd build as the site agent, on a
// bridge inside a network namespace this run makes (testing/emulated-site.ts). The builds (bcd,
// the ramdisk, the OS image) come from their caches, or are made the first time (minutes). The
// OS image is served on loopback for metal.deploy; each machine's progress is printed as it goes.
import fs from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { canMakeNetns } from "../../testing/netns.ts";
import { OVMF_CODE, type Firmware } from "../../testing/qemu-machine.ts";
import { buildForEmulatedSite, startEmulatedSite, type EmulatedSite, type EmulatedSiteBuilds } from "../../testing/emulated-site.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import type { Stack } from "../../local/stack.ts";
import { Cleanup, watchMachines } from "./common.ts";

/** The Worker the emulated site's control plane runs: examples/emulated-site's deployment (its emulated-redfish hardware profile). */
export const EMULATED_SITE_MAIN = "examples/emulated-site/worker.ts";

export interface DevEmulated {
  site: EmulatedSite;
  builds: EmulatedSiteBuilds;
  /** The OS image to deploy, served on this host's loopback (and relayed into the site). */
  image: { url: string; sha256: string };
  /** Each machine's node id, firmware and console file. */
  machines: { node: string; firmware: Firmware; console: string }[];
  watch(): void;
  stop(): Promise<void>;
}

/** Why this machine cannot run the emulated site, or undefined. */
export function devEmulatedProblem(ipmi = false): string | undefined {
  if (!canMakeNetns()) return "--emulated needs Linux and root: its machines' network lives in a network namespace it makes (ip netns)";
  for (const program of ["qemu-system-x86_64", "dnsmasq", "socat", ...(ipmi ? ["ipmi_sim", "ipmitool"] : [])])
    if (spawnSync("sh", ["-c", `command -v ${program}`]).status !== 0)
      return `--emulated needs ${program} (Debian: qemu-system-x86, dnsmasq-base, socat${ipmi ? ", openipmi, ipmitool" : ""}; docs/emulated-site.md)`;
  return undefined;
}

/** The builds, from their caches or made now (saying so: the first time takes minutes). */
export function devEmulatedBuilds(print: (line: string) => void): Promise<EmulatedSiteBuilds> {
  return buildForEmulatedSite((message) => {
    if (message.startsWith("building")) print(`  ${message}: the first time takes a few minutes, later runs reuse it`);
    else if (/reused|ready|MiB/.test(message)) print(`  ${message}`);
  });
}

export async function startDevEmulated(
  stack: Stack,
  builds: EmulatedSiteBuilds,
  options: { machines: number; ipmi?: boolean; print: (line: string) => void },
): Promise<DevEmulated> {
  const cleanup = new Cleanup();
  return cleanup.guard(async () => {
    const images = createServer((req, res) => {
      if (req.url !== "/images/bc-os.img.zst") return void res.writeHead(404).end();
      res.writeHead(200, { "content-length": builds.os.manifest.zstd.bytes });
      fs.createReadStream(builds.os.zstd).pipe(res);
    });
    await new Promise<void>((resolve) => images.listen(0, "127.0.0.1", resolve));
    cleanup.push(() => new Promise((resolve) => images.close(resolve)));
    const imagePort = (images.address() as AddressInfo).port;

    // Half BIOS, half UEFI when OVMF is installed: both firmwares boot the same way.
    const firmware = (i: number): Firmware => (i % 2 === 1 && fs.existsSync(OVMF_CODE) ? "uefi" : "bios");
    const site = await startEmulatedSite({
      controlPlane: stack,
      machines: Array.from({ length: options.machines }, (_, i) => ({
        id: `m${i + 1}`,
        firmware: firmware(i),
        bmc: options.ipmi ? ("ipmi" as const) : ("redfish" as const),
      })),
      bcd: builds.bcd.launcher,
      ramdiskDir: builds.ramdisk.dir,
      workDir: path.join(stack.dataDir, "emulated-site"),
      loopbackPorts: [imagePort],
      site: "dev",
      print: (line) => options.print(line.startsWith("qemu machine") ? `  ${line}` : line),
    });
    cleanup.push(() => site.stop());
    const enrolled = new Map<string, string>();
    for (const machine of site.machines) enrolled.set(machine.id, (await site.enroll(machine)).state);
    return {
      site,
      builds,
      image: { url: `http://127.0.0.1:${imagePort}/images/bc-os.img.zst`, sha256: builds.os.manifest.zstd.sha256 },
      machines: site.machines.map((m) => ({ node: m.id, firmware: m.qemu.firmware, console: m.consoleFile })),
      watch() {
        const call = <T>(method: string, input: Record<string, unknown>) => callApi<T>(stack.url, stack.adminKey, method, input);
        const stopWatching = watchMachines(call, enrolled, options.print, { what: "emulated", steps: true });
        cleanup.push(async () => stopWatching());
      },
      stop: cleanup.stop,
    };
  });
}
