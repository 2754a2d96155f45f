// `npm run dev`'s simulated site, beside the local stack: a real site agent (the `bcd` process,
// joined with a site token minted over the API), N simulated machines behind emulated Redfish
// BMCs (createMetalSim's, booted when their BMC powers them on), enrolled into a pool, and a
// demo disk image served over HTTP for metal.deploy. Once watched, each machine's state change
// is printed as it happens, and one line when all of them are ready.
import fs from "node:fs";
import path from "node:path";
import { createImageCache, simulatedDiskImage } from "../../testing/image-server.ts";
import { createMetalSim, joinedSiteAgent, simRamdiskDir, type MetalSim } from "../../testing/metal-sim.ts";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { startBcd } from "../../local/bcd-process.ts";
import { freePort, type Stack } from "../../local/stack.ts";
import { Cleanup, watchMachines } from "./common.ts";

export interface DevSiteOptions {
  /** Simulated machines to enroll. */
  machines: number;
  /** Writes one line to the terminal. */
  print: (line: string) => void;
}

export interface DevSite {
  site: string;
  pool: string;
  siteAgent: { nodeId: string; stateDir: string };
  /** The Redfish emulator serving every simulated BMC. */
  bmcUrl: string;
  /** The enrolled machines: metal node id and BMC address. */
  machines: { node: string; bmc: string }[];
  /** A small disk image to deploy, served over HTTP. */
  image: { url: string; sha256: string; bytes: number };
  /** Starts printing the machines' state changes (polled every second) and the line once all are ready. */
  watch(): void;
  stop(): Promise<void>;
}

const SITE = "dev";
/** A few KiB that say what they are: the demo image metal.deploy streams onto a simulated disk. */
const DEMO_IMAGE = simulatedDiskImage("Better Compute demo disk image (npm run dev)\n".repeat(100));

export async function startDevSite(stack: Stack, options: DevSiteOptions): Promise<DevSite> {
  const cleanup = new Cleanup();
  const call = <T = Record<string, unknown>>(method: string, input: Record<string, unknown> = {}) =>
    callApi<T>(stack.url, stack.adminKey, method, input);
  return cleanup.guard(async () => {
    const cache = createImageCache();
    const sha256 = cache.put(DEMO_IMAGE);
    const images = await cache.serve();
    cleanup.push(() => images.stop());

    const stateDir = path.join(stack.dataDir, "site-agent");
    const { token } = await call<{ token: string }>("siteTokens.create", { site: SITE });
    // The real site agent: `bcd start --role site`, serving network boot on loopback (no DHCP: the
    // simulated machines ask it directly) with a stand-in ramdisk the simulated machines never run.
    const ramdiskDir = await simRamdiskDir();
    cleanup.push(async () => fs.rmSync(ramdiskDir, { recursive: true, force: true }));
    const netbootPort = await freePort();
    const bcd = startBcd({
      url: stack.url,
      role: "site",
      stateDir,
      hostname: `${SITE}-site-agent`,
      token,
      args: ["--netboot-address", "127.0.0.1", "--netboot-port", String(netbootPort), "--ramdisk-dir", ramdiskDir],
      tag: "site-agent",
      print: options.print,
      stopGraceMs: 5_000,
    });
    cleanup.push(() => bcd.stop());
    const siteAgent = await joinedSiteAgent(stateDir, `http://127.0.0.1:${netbootPort}`, bcd.process, call);

    const sim = await createMetalSim({ stack, machines: options.machines, siteId: SITE, siteAgent });
    cleanup.push(() => sim.stop());
    const enrolled = new Map<string, string>();
    const machines: DevSite["machines"] = [];
    for (const machine of sim.machines) {
      const node = await sim.enroll(machine);
      enrolled.set(node.id, node.state);
      machines.push({ node: node.id, bmc: machine.address });
    }

    return {
      site: SITE,
      pool: sim.site.pool,
      siteAgent: { nodeId: siteAgent.nodeId, stateDir },
      bmcUrl: sim.bmc.url,
      machines,
      image: { url: `${images.url}/images/${sha256}`, sha256, bytes: DEMO_IMAGE.byteLength },
      watch() {
        const stopWatching = watchMachines((method, input) => sim.call(method, input), enrolled, options.print, { what: "simulated" });
        cleanup.push(async () => stopWatching());
      },
      stop: cleanup.stop,
    };
  });
}
