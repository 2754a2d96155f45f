// Metal on the emulated site (testing/emulated-site.ts, docs/emulated-site.md): QEMU machines that
// really network-boot through the installed bcd site agent, are inspected and wiped in the bcd
// ramdisk, take the OS image and boot it. One machine alone, then BENCH_METAL_MACHINES (4) at
// once, each through enroll → ready → deploy → deployed; each phase's seconds are read from its
// workflows' steps (when each began and finished, as the control plane recorded them):
//
//   power-on → ramdisk joined   commissioning's power.cycle began → wait.ramdisk finished
//   inventory                   inventory.ramdisk
//   wipe                        disk.wipe
//   image write                 the deploy's image.write (fetch from the site's cache, zstd, sha256, config drive, fsync)
//   first boot → joined         the deploy's power.reboot began → wait.node finished
//
// The image write's MB/s (raw bytes written over its seconds) is shown beside a raw dd write in
// the same guest: the ramdisk is booted with bc.dd=<MiB>, which writes that many MiB of zeros
// to the disk (conv=fsync) before bcd starts and prints the time on the console (target: the
// image write at 0.8 of it or better). Under TCG (no working KVM) every figure is the emulation's.
import fs from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { startStack } from "../local/stack.ts";
import { buildForEmulatedSite, startEmulatedSite, type EmulatedMachine, type EmulatedSite } from "../testing/emulated-site.ts";
import { callApi } from "../testing/metal-sim-control-plane.ts";
import { canMakeNetns } from "../testing/netns.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { benchDataDir, target } from "./stack.ts";

const DD_MIB = 64;
const MACHINE_MINUTES = 15;

interface Step {
  name: string;
  attempts: { startedAt: string | null; finishedAt: string | null }[];
}

interface Figures {
  ramdisk: number;
  inventory: number;
  wipe: number;
  write: number;
  firstBoot: number;
  /** The image write's raw MB/s, and dd's in the same guest (from its console). */
  writeMBps: number;
  ddMBps: number | undefined;
}

export const metalSection: BenchSection = {
  id: "metal",
  title: `Metal: QEMU machines on the emulated site, each phase's seconds for 1 machine, then for BENCH_METAL_MACHINES at once; the image write beside dd`,
  async run(ctx: BenchContext) {
    if (!canMakeNetns()) throw new Error("needs Linux and root (the emulated site's network namespace)");
    const many = ctx.metal.machines;
    const builds = await buildForEmulatedSite((line) => /reused|ready|building/.test(line) && ctx.log(line));
    const dataDir = benchDataDir("metal");
    const stack = await startStack({ dataDir, main: "examples/emulated-site/worker.ts" });
    const images = createServer((req, res) => {
      res.writeHead(200, { "content-length": builds.os.manifest.zstd.bytes });
      fs.createReadStream(builds.os.zstd).pipe(res);
    });
    await new Promise<void>((resolve) => images.listen(0, "127.0.0.1", resolve));
    const imagePort = (images.address() as AddressInfo).port;
    let site: EmulatedSite | undefined;
    try {
      site = await startEmulatedSite({
        controlPlane: stack,
        machines: Array.from({ length: 1 + many }, (_, i) => ({ id: `b${i + 1}` })),
        bcd: builds.bcd.launcher,
        ramdiskDir: builds.ramdisk.dir,
        workDir: path.join(dataDir, "site"),
        loopbackPorts: [imagePort],
        ramdiskCmdline: `bc.dd=${DD_MIB}`,
      });
      const accel = site.machines[0]!.qemu.accel;
      ctx.log(
        `${1 + many} machines (SeaBIOS, 1 vCPU, 1 GiB, a 256 MiB NVMe disk) under ${accel.toUpperCase()}${accel === "tcg" ? " (no working KVM here)" : ""}; ` +
          `the OS image: ${(builds.os.manifest.raw.bytes / 1e6).toFixed(1)} MB raw, ${(builds.os.manifest.zstd.bytes / 1e6).toFixed(1)} MB zstd`,
      );
      const url = `http://127.0.0.1:${imagePort}/bc-os.img.zst`;
      const run = (m: EmulatedMachine) =>
        enrollAndDeploy(stack, site!, m, { url, sha256: builds.os.manifest.zstd.sha256 }, builds.os.manifest.raw.bytes);
      const alone = [await run(site.machines[0]!)];
      const together = await Promise.all(site.machines.slice(1).map(run));

      const phases: [string, (f: Figures) => number][] = [
        ["power-on → ramdisk joined", (f) => f.ramdisk],
        ["inventory", (f) => f.inventory],
        ["wipe", (f) => f.wipe],
        ["image write", (f) => f.write],
        ["first boot → joined", (f) => f.firstBoot],
      ];
      const worst = (list: Figures[], pick: (f: Figures) => number) => Math.max(...list.map(pick));
      const median = (list: Figures[], pick: (f: Figures) => number) => {
        const sorted = list.map(pick).sort((a, b) => a - b);
        return sorted[Math.floor((sorted.length - 1) / 2)]!;
      };
      ctx.table(
        ["phase, seconds", "1 machine", `${many} at once: median`, "max"],
        phases.map(([name, pick]) => [
          name,
          pick(alone[0]!).toFixed(1),
          median(together, pick).toFixed(1),
          worst(together, pick).toFixed(1),
        ]),
      );
      const first = alone[0]!;
      const ratio = first.ddMBps ? first.writeMBps / first.ddMBps : undefined;
      ctx.log(
        `image write ${first.writeMBps.toFixed(1)} MB/s of raw image; dd of ${DD_MIB} MiB of zeros in the same guest ${first.ddMBps?.toFixed(1) ?? "(not on its console)"} MB/s` +
          (ratio === undefined ? "" : `: ${ratio.toFixed(2)} of it ${target("≥ 0.8", ratio >= 0.8)}`),
      );
    } finally {
      await site?.stop();
      await new Promise((resolve) => images.close(resolve));
      await stack.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  },
};

async function enrollAndDeploy(
  stack: { url: string; adminKey: string },
  site: EmulatedSite,
  machine: EmulatedMachine,
  image: { url: string; sha256: string },
  rawBytes: number,
): Promise<Figures> {
  const api = <T = any>(method: string, input: Record<string, unknown>) => callApi<T>(stack.url, stack.adminKey, method, input);
  const until = async (state: string) => {
    const deadline = Date.now() + MACHINE_MINUTES * 60_000;
    for (;;) {
      const node = await api("metal.nodes.get", { node: machine.id });
      if (node.state === state) return node;
      if (node.state === "failed" || Date.now() > deadline)
        throw new Error(`${machine.id} is ${node.state}, not ${state}: ${JSON.stringify(node.lastError)}`);
      await new Promise((r) => setTimeout(r, 500));
    }
  };
  const commissioned = await api("metal.enroll", {
    pool: site.pool,
    id: machine.id,
    bmc: { address: machine.bmcAddress, username: "admin", password: "emulated-bmc-Pa55" },
  });
  await until("ready");
  const { workflow } = await api("metal.deploy", { node: machine.id, profile: "metal.deploy.image-stream", input: { image } });
  await until("deployed");
  const steps = async (id: string) => (await api<{ steps: Step[] }>("workflows.get", { id })).steps;
  const commission = await steps(commissioned.workflow);
  const deploy = await steps(workflow);
  const at = (list: Step[], name: string, end: "startedAt" | "finishedAt") => {
    const value = list.find((s) => s.name === name)?.attempts.at(-1)?.[end];
    if (!value) throw new Error(`${machine.id}: step ${name} has no ${end}`);
    return Date.parse(value);
  };
  const span = (list: Step[], from: string, to: string) => (at(list, to, "finishedAt") - at(list, from, "startedAt")) / 1000;
  const write = span(deploy, "image.write", "image.write");
  const dd = new RegExp(`bc-ramdisk: bc\\.dd: ${DD_MIB} MiB of zeros to \\S+ in ([\\d.]+) s`).exec(
    fs.readFileSync(machine.consoleFile, "utf8"),
  );
  return {
    ramdisk: span(commission, "power.cycle", "wait.ramdisk"),
    inventory: span(commission, "inventory.ramdisk", "inventory.ramdisk"),
    wipe: span(commission, "disk.wipe", "disk.wipe"),
    write,
    firstBoot: span(deploy, "power.reboot", "wait.node"),
    writeMBps: rawBytes / 1e6 / write,
    ddMBps: dd ? (DD_MIB * 2 ** 20) / 1e6 / Number(dd[1]) : undefined,
  };
}
