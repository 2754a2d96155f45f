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
// The image write's MB/s (the image's raw bytes over its seconds), for the zstd image and, on the
// first machine deployed again, for the raw one, is shown beside a raw dd write in the same guest:
// the ramdisk is booted with bc.dd=<MiB>, which writes that many MiB of zeros to the disk
// (conv=fsync) before bcd starts and prints the time on the console (target: the image write at
// 0.8 of it or better). Under TCG (no working KVM) every figure is the emulation's.
import fs from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { startStack } from "../local/stack.ts";
import {
  buildForEmulatedSite,
  EMULATED_BMC_PASSWORD,
  EMULATED_BMC_USER,
  startEmulatedSite,
  type EmulatedMachine,
  type EmulatedSite,
} from "../testing/emulated-site.ts";
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
  /** The image write's raw MB/s, dd's in the same guest and its Node's sha256 (from its console). */
  writeMBps: number;
  ddMBps: number | undefined;
  sha256MBps: number | undefined;
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
    // The OS image as deployments stream it (zstd) and as it lands on the disk (raw).
    const images = createServer((req, res) => {
      const [file, bytes] =
        req.url === "/bc-os.img" ? [builds.os.raw, builds.os.manifest.raw.bytes] : [builds.os.zstd, builds.os.manifest.zstd.bytes];
      res.writeHead(200, { "content-length": bytes });
      fs.createReadStream(file).pipe(res);
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
      const rawBytes = builds.os.manifest.raw.bytes;
      ctx.log(
        `${1 + many} machines (SeaBIOS, 1 vCPU, 1 GiB, a 256 MiB NVMe disk) under ${accel.toUpperCase()}${accel === "tcg" ? " (no working KVM here)" : ""}; ` +
          `the OS image: ${(rawBytes / 1e6).toFixed(1)} MB raw, ${(builds.os.manifest.zstd.bytes / 1e6).toFixed(1)} MB zstd`,
      );
      const api: Api = (method, input) => callApi(stack.url, stack.adminKey, method, input);
      const zstd = { url: `http://127.0.0.1:${imagePort}/bc-os.img.zst`, sha256: builds.os.manifest.zstd.sha256 };
      const raw = { url: `http://127.0.0.1:${imagePort}/bc-os.img`, sha256: builds.os.manifest.raw.sha256 };
      const run = (m: EmulatedMachine) => enrollAndDeploy(api, site!, m, zstd, rawBytes);
      const first = site.machines[0]!;
      const one = await run(first);
      // The same machine again with the raw image: the write without decompression.
      const rawWrite = await redeploy(api, first, raw, rawBytes);
      const together = await Promise.all(site.machines.slice(1).map(run));

      const phases: [string, (f: Figures) => number][] = [
        ["power-on → ramdisk joined", (f) => f.ramdisk],
        ["inventory", (f) => f.inventory],
        ["wipe", (f) => f.wipe],
        ["image write (zstd)", (f) => f.write],
        ["first boot → joined", (f) => f.firstBoot],
      ];
      const worst = (pick: (f: Figures) => number) => Math.max(...together.map(pick));
      const median = (pick: (f: Figures) => number) => {
        const sorted = together.map(pick).sort((a, b) => a - b);
        return sorted[Math.floor((sorted.length - 1) / 2)]!;
      };
      ctx.table(
        ["phase, seconds", "1 machine", `${many} at once: median`, "max"],
        phases.map(([name, pick]) => [name, pick(one).toFixed(1), median(pick).toFixed(1), worst(pick).toFixed(1)]),
      );
      const dd = one.ddMBps;
      const of = (mbps: number) => (dd ? ` (${(mbps / dd).toFixed(2)} of dd)` : "");
      ctx.log(
        `image write, MB/s of image on the disk: zstd ${one.writeMBps.toFixed(1)}${of(one.writeMBps)}, raw ${rawWrite.toFixed(1)}${of(rawWrite)}; ` +
          `dd of ${DD_MIB} MiB of zeros in the same guest: ${dd?.toFixed(1) ?? "(not on its console)"}` +
          (dd ? ` ${target("the image write at 0.8 of dd", Math.max(one.writeMBps, rawWrite) / dd >= 0.8)}` : ""),
      );
      if (one.sha256MBps)
        ctx.log(
          `sha256 in bcd's Node in the same guest: ${one.sha256MBps.toFixed(1)} MB/s${dd ? ` (${(one.sha256MBps / dd).toFixed(2)} of dd)` : ""}: ` +
            "every byte an image write puts on the disk is hashed, so it cannot be faster than that",
        );
      if (accel === "tcg")
        ctx.log(
          "under TCG the guest's CPU is emulated: hashing and decompressing cost it many times what they cost on hardware; dd does neither",
        );
    } finally {
      await site?.stop();
      await new Promise((resolve) => images.close(resolve));
      await stack.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  },
};

type Api = <T = any>(method: string, input: Record<string, unknown>) => Promise<T>;

async function untilState(api: Api, machine: EmulatedMachine, state: string): Promise<void> {
  const deadline = Date.now() + MACHINE_MINUTES * 60_000;
  for (;;) {
    const node = await api("metal.nodes.get", { node: machine.id });
    if (node.state === state) return;
    if (node.state === "failed" || Date.now() > deadline)
      throw new Error(`${machine.id} is ${node.state}, not ${state}: ${JSON.stringify(node.lastError)}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

const stepsOf = async (api: Api, workflow: string) => (await api<{ steps: Step[] }>("workflows.get", { id: workflow })).steps;

/** Seconds from when step `from` began to when step `to` finished (their last attempts). */
function span(machine: EmulatedMachine, steps: Step[], from: string, to: string): number {
  const at = (name: string, end: "startedAt" | "finishedAt") => {
    const value = steps.find((s) => s.name === name)?.attempts.at(-1)?.[end];
    if (!value) throw new Error(`${machine.id}: step ${name} has no ${end}`);
    return Date.parse(value);
  };
  return (at(to, "finishedAt") - at(from, "startedAt")) / 1000;
}

/** Deploys the machine with the image; answers its workflow's id once it is deployed. */
async function deployed(api: Api, machine: EmulatedMachine, image: { url: string; sha256: string }): Promise<string> {
  const { workflow } = await api("metal.deploy", { node: machine.id, profile: "metal.deploy.image-stream", input: { image } });
  await untilState(api, machine, "deployed");
  return workflow;
}

/** Undeploys the deployed machine and deploys it again with this image; answers the image write's MB/s. */
async function redeploy(api: Api, machine: EmulatedMachine, image: { url: string; sha256: string }, rawBytes: number): Promise<number> {
  await api("metal.undeploy", { node: machine.id });
  await untilState(api, machine, "ready");
  const steps = await stepsOf(api, await deployed(api, machine, image));
  return rawBytes / 1e6 / span(machine, steps, "image.write", "image.write");
}

async function enrollAndDeploy(
  api: Api,
  site: EmulatedSite,
  machine: EmulatedMachine,
  image: { url: string; sha256: string },
  rawBytes: number,
): Promise<Figures> {
  const commissioned = await api("metal.enroll", {
    pool: site.pool,
    id: machine.id,
    bmc: { address: machine.bmcAddress, username: EMULATED_BMC_USER, password: EMULATED_BMC_PASSWORD },
  });
  await untilState(api, machine, "ready");
  const commission = await stepsOf(api, commissioned.workflow);
  const deploy = await stepsOf(api, await deployed(api, machine, image));
  const write = span(machine, deploy, "image.write", "image.write");
  const consoleText = fs.readFileSync(machine.consoleFile, "utf8");
  const dd = new RegExp(`bc-ramdisk: bc\\.dd: ${DD_MIB} MiB of zeros to \\S+ in ([\\d.]+) s`).exec(consoleText);
  const hashed = new RegExp(`bc-ramdisk: bc\\.dd: sha256 of ${DD_MIB} MiB in ([\\d.]+) s`).exec(consoleText);
  return {
    ramdisk: span(machine, commission, "power.cycle", "wait.ramdisk"),
    inventory: span(machine, commission, "inventory.ramdisk", "inventory.ramdisk"),
    wipe: span(machine, commission, "disk.wipe", "disk.wipe"),
    write,
    firstBoot: span(machine, deploy, "power.reboot", "wait.node"),
    writeMBps: rawBytes / 1e6 / write,
    ddMBps: dd ? (DD_MIB * 2 ** 20) / 1e6 / Number(dd[1]) : undefined,
    sha256MBps: hashed ? (DD_MIB * 2 ** 20) / 1e6 / Number(hashed[1]) : undefined,
  };
}
