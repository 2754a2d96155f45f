// The emulated site: real machines without a rack (docs/emulated-site.md). QEMU q35 machines
// (SeaBIOS or OVMF, an NVMe disk, a virtio NIC whose option ROM is iPXE) on a bridge inside a
// network namespace this run makes; each behind the Redfish emulator, which works it over QMP as a
// BMC works a server; the site agent is the installed bcd build (npm run build:bcd) running inside
// the namespace, serving DHCP (dnsmasq, server mode, the bridge only), iPXE scripts, the ramdisk
// (npm run ramdisk-image) and the image cache. Only the hardware is emulated: the firmware, the
// ramdisk, the disks' bytes and every packet on the bridge are real.
//
//   host loopback                    namespace bc-es<n>-<pid>
//   control plane :P  ◄── relay ──── 10.77.0.1:P   ◄── site agent (bcd), ramdisks, installed systems
//   Redfish emulator :B ◄─ relay ─── 127.0.0.1:B   ◄── site agent's Redfish client
//   image servers :I ◄─── relay ──── 127.0.0.1:I   ◄── site agent's image cache
//                                    br0 10.77.0.1/24: dnsmasq, netboot HTTP :8780, tap<i> ── machine i
//   Redfish consoles :T ◄── relay ── 127.0.0.1:T   ◄── site agent's console reader (Telnet, raw)
//                                    127.0.0.1:<udp> ipmi_sim: the IPMI machines' BMCs (UDP stays inside),
//                                                    driven by the site agent's bcx-ipmi plugin
//
// Nothing in the namespace is routed anywhere: what must reach the host crosses through relays
// over unix sockets (testing/netns.ts). Everything is removed at stop(), and a run killed before
// its stop() is cleaned up by the next one.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { buildBcd, type BcdBuild } from "../agent/build/bcd.ts";
import { buildInstallerIso, type InstallerIso } from "../agent/build/installer-iso.ts";
import { buildOsImage, type OsImage } from "../agent/build/os-image.ts";
import { buildRamdisk, type RamdiskImage } from "../agent/build/ramdisk.ts";
import { startBcd, type BcdProcess } from "../local/bcd-process.ts";
import { hostTscKhz } from "../agent/runtimes/microvm/helpers.ts";
import { Cleanup } from "./cleanup.ts";
import { callApi } from "./metal-sim-control-plane.ts";
import { joinedSiteAgent } from "./metal-sim.ts";
import { makeNetns, removeLeftoverNetns, type Netns } from "./netns.ts";
import { startQemuMachine, type Firmware, type QemuMachine } from "./qemu-machine.ts";
import { startIpmiBmc, type IpmiBmc } from "./ipmi-bmc.ts";
import { fakeMac, startRedfishEmulator, type RedfishEmulator } from "./redfish-emulator.ts";

export const EMULATED_BMC_USER = "admin";
export const EMULATED_BMC_PASSWORD = "emulated-bmc-Pa55";
/** The site agent's address on the provisioning network (the bridge), and the machines' range. */
export const SITE_ADDRESS = "10.77.0.1";
const SITE_PREFIX = 24;
const DHCP_RANGE = "10.77.0.100,10.77.0.199";
const SITE_ADDRESS_V6 = "fd77::1/64";
/** bcd's network boot HTTP port (its default). */
const NETBOOT_PORT = 8780;
const NETNS_PREFIX = "bc";
/** The hardware profile examples/emulated-site's config adds (the same drivers as redfish-pxe). */
export const EMULATED_HARDWARE_PROFILE = "emulated-redfish";

export interface EmulatedMachineOptions {
  /** Its system id at the BMC (default m1, m2, ...). */
  id?: string;
  firmware?: Firmware;
  /** Its NVMe disk (default 256 MiB, sparse). */
  diskBytes?: number;
  /** Its disk fails every write (QEMU's blkdebug): a dying disk. */
  failWrites?: boolean;
  /** Its NIC's cable goes nowhere (a tap on no bridge): it never network-boots. */
  unplugged?: boolean;
  /** Default 1024 (the ramdisk's 38 MiB initrd unpacks to ~150 MiB, and Node runs in it). */
  memoryMiB?: number;
  /** Its BMC: the Redfish emulator (default), or an IPMI BMC (ipmi_sim) driven through the site agent's bcx-ipmi plugin. */
  bmc?: "redfish" | "ipmi";
}

export interface EmulatedSiteOptions {
  /** The control plane the site agent joins (a local stack, on this host's loopback). */
  controlPlane: { url: string; adminKey: string };
  machines: EmulatedMachineOptions[];
  /** The installed bcd's launcher (a build's `launcher`). */
  bcd: string;
  /** The ramdisk build's directory (its manifest.json names the kernel and initrd). */
  ramdiskDir: string;
  /** Where the site agent's state, the consoles and the disks go (kept: the caller removes it). */
  workDir: string;
  /** Default "emulated". */
  site?: string;
  /** Default EMULATED_HARDWARE_PROFILE (the deployment must define it: examples/emulated-site). */
  hardwareProfile?: string;
  /** Ports of HTTP servers on this host's loopback the site agent must reach (image servers), at the same 127.0.0.1:<port> inside. */
  loopbackPorts?: number[];
  /** More of the ramdisk's kernel command line (e.g. npm run bench's bc.dd=<MiB>). */
  ramdiskCmdline?: string;
  /** One line each: the site agent's log and each machine's start. Default: nothing. */
  print?: (line: string) => void;
}

export interface EmulatedMachine {
  id: string;
  qemu: QemuMachine;
  mac: string;
  /** Its disk's file on this host: read it to see what the machine wrote. */
  disk: string;
  bmc: "redfish" | "ipmi";
  /** Its BMC address, as metal.enroll takes it (an IPMI one: 127.0.0.1:<port> inside the namespace). */
  bmcAddress: string;
  /** Where its serial console is written. */
  consoleFile: string;
}

export interface EmulatedSite {
  site: string;
  pool: string;
  netns: Netns;
  bmc: RedfishEmulator;
  /** The IPMI BMCs, when a machine has one. */
  ipmi?: IpmiBmc;
  /** The pool of the IPMI machines (hardware profile ipmi-pxe), when there are any. */
  ipmiPool?: string;
  machines: EmulatedMachine[];
  /** The site agent's node id. */
  siteAgentNodeId: string;
  /** The site agent's process now (a new one after restartSiteAgent). */
  siteAgent(): BcdProcess;
  /** metal.enroll into the site's pool: the reconciler then commissions it. */
  enroll(machine: EmulatedMachine): Promise<{ id: string; state: string }>;
  /** Stops the site agent (SIGTERM, as systemd would) and starts it again on the same state. */
  restartSiteAgent(): Promise<void>;
  stop(): Promise<void>;
}

/** What the emulated site runs: the bcd build, the ramdisk, the OS image and the installer ISO (each cached; minutes the first time). */
export interface EmulatedSiteBuilds {
  bcd: BcdBuild;
  ramdisk: RamdiskImage;
  os: OsImage;
  installer: InstallerIso;
}

export async function buildForEmulatedSite(log: (line: string) => void = () => {}): Promise<EmulatedSiteBuilds> {
  const bcd = await buildBcd(); // the ramdisk's build logs it
  const ramdisk = await buildRamdisk({ log });
  // The installed system boots under TCG too: its kernel needs the TSC's rate as the ramdisk's does.
  const tsc = await hostTscKhz();
  const cmdline = tsc ? { cmdline: `tsc_early_khz=${tsc}` } : {};
  const os = await buildOsImage({ ramdisk, log, ...cmdline });
  const installer = await buildInstallerIso({ ramdisk, log, ...cmdline });
  return { bcd, ramdisk, os, installer };
}

let sitesMade = 0;

/** A bcd configuration pinning the plugins the build ships (usr/lib/bcd/plugins beside the launcher's bcd), by their sha256. */
function pinShippedPlugins(launcher: string, workDir: string): string {
  const dir = path.resolve(path.dirname(launcher), "..", "lib", "bcd", "plugins");
  const pins = readdirSync(dir).map((file) => {
    const sha256 = createHash("sha256")
      .update(readFileSync(path.join(dir, file)))
      .digest("hex");
    return `[[plugins.pin]]\npath = "${file}"\nsha256 = "${sha256}"\n`;
  });
  const file = path.join(workDir, "site-agent.toml");
  mkdirSync(workDir, { recursive: true });
  writeFileSync(file, `[plugins]\ndir = "${dir}"\n\n${pins.join("\n")}`);
  return file;
}

/** Starts the namespace, the machines (powered off), their BMC and the site agent; creates the site and its pool. */
export async function startEmulatedSite(options: EmulatedSiteOptions): Promise<EmulatedSite> {
  const print = options.print ?? (() => {});
  const site = options.site ?? "emulated";
  const pool = `${site}-pool`;
  const call = <T = Record<string, unknown>>(method: string, input: Record<string, unknown> = {}) =>
    callApi<T>(options.controlPlane.url, options.controlPlane.adminKey, method, input);
  const cleanup = new Cleanup();
  return cleanup.guard(async () => {
    if (!existsSync(path.join(options.ramdiskDir, "manifest.json")))
      throw new Error(`${options.ramdiskDir} holds no ramdisk build (npm run ramdisk-image makes one)`);
    removeLeftoverNetns(NETNS_PREFIX);
    const netns = makeNetns(NETNS_PREFIX, `es${sitesMade++}`);
    cleanup.push(() => netns.remove());
    netns.ip("link", "add", "br0", "type", "bridge");
    netns.ip("addr", "add", `${SITE_ADDRESS}/${SITE_PREFIX}`, "dev", "br0");
    netns.ip("addr", "add", SITE_ADDRESS_V6, "dev", "br0", "nodad");
    netns.ip("link", "set", "br0", "up");

    // The machines, powered off, each on its own tap.
    const tsc = await hostTscKhz();
    const machines: EmulatedMachine[] = [];
    cleanup.push(async () => void (await Promise.all(machines.map((m) => m.qemu.stop()))));
    for (const [i, spec] of options.machines.entries()) {
      const id = spec.id ?? `m${i + 1}`;
      const tap = `tap${i}`;
      netns.ip("tuntap", "add", "dev", tap, "mode", "tap");
      if (!spec.unplugged) netns.ip("link", "set", tap, "master", "br0");
      netns.ip("link", "set", tap, "up");
      const mac = fakeMac(`emulated-${site}-${id}`).toLowerCase();
      const consoleFile = path.join(options.workDir, `${id}.console.log`);
      mkdirSync(options.workDir, { recursive: true });
      const qemu = await startQemuMachine({
        name: id,
        firmware: spec.firmware ?? "bios",
        memoryMiB: spec.memoryMiB ?? 1024,
        prefix: netns.prefix,
        nics: [{ mac, tap }],
        disks: [{ serial: `EMU-${id.toUpperCase()}`, sizeBytes: spec.diskBytes ?? 256 * 2 ** 20, failWrites: spec.failWrites ?? false }],
        consoleFile,
        log: print,
      });
      machines.push({ id, qemu, mac, disk: qemu.disks[0]!.file, bmc: spec.bmc ?? "redfish", bmcAddress: "", consoleFile });
    }

    // The BMC downloads virtual media from the site agent's image server, as a real one would over
    // the management network: here through a forward into the namespace.
    const netbootOrigin = `http://${SITE_ADDRESS}:${NETBOOT_PORT}`;
    const forwarded = `http://127.0.0.1:${await netns.forward(SITE_ADDRESS, NETBOOT_PORT)}`;
    const bmc = await startRedfishEmulator({
      machines: machines.filter((m) => m.bmc === "redfish").map((m) => ({ id: m.id, qemu: m.qemu })),
      username: EMULATED_BMC_USER,
      password: EMULATED_BMC_PASSWORD,
      mediaRoute: (url) => (url.startsWith(`${netbootOrigin}/`) ? forwarded + url.slice(netbootOrigin.length) : url),
    });
    cleanup.push(() => bmc.stop());
    for (const m of machines.filter((m) => m.bmc === "redfish")) m.bmcAddress = `${bmc.url}/redfish/v1/Systems/${m.id}`;
    // IPMI is UDP, which the relays do not carry: those BMCs run inside the namespace, beside the site agent.
    const ipmiMachines = machines.filter((m) => m.bmc === "ipmi");
    const ipmi = ipmiMachines.length
      ? await startIpmiBmc({
          machines: ipmiMachines.map((m) => ({ machine: m.qemu, id: m.id })),
          user: EMULATED_BMC_USER,
          password: EMULATED_BMC_PASSWORD,
          workDir: options.workDir,
          netns,
          log: print,
        })
      : undefined;
    if (ipmi) cleanup.push(() => ipmi.stop());
    for (const m of ipmiMachines) m.bmcAddress = ipmi!.address(m.id);

    // What the namespace reaches on this host: the control plane on every address (the machines
    // reach it at SITE_ADDRESS), the BMC and the image servers on its loopback, at their own ports.
    const cpPort = Number(new URL(options.controlPlane.url).port);
    await netns.relay(cpPort, cpPort);
    const consolePorts = [...bmc.machines.values()].flatMap((m) => (m.consolePort ? [m.consolePort] : []));
    for (const port of [Number(new URL(bmc.url).port), ...consolePorts, ...(options.loopbackPorts ?? [])])
      await netns.relay(port, port, "127.0.0.1");

    await call("metal.sites.create", { id: site });
    await call("metal.pools.create", {
      id: pool,
      site,
      agent: "bcd",
      policy: { hardwareProfile: options.hardwareProfile ?? EMULATED_HARDWARE_PROFILE },
    });

    const ipmiPool = ipmi ? `${site}-ipmi` : undefined;
    if (ipmiPool) await call("metal.pools.create", { id: ipmiPool, site, agent: "bcd", policy: { hardwareProfile: "ipmi-pxe" } });

    const stateDir = path.join(options.workDir, "site-agent");
    // The site agent hosts the IPMI driver as an operator would set it up: the bcx-ipmi plugin that
    // ships beside bcd, pinned by its sha256 in bcd's configuration (docs/drivers.md).
    const config = ipmi ? [`--config`, pinShippedPlugins(options.bcd, options.workDir)] : [];
    const url = `http://${SITE_ADDRESS}:${cpPort}`;
    const { token } = await call<{ token: string }>("siteTokens.create", { site });
    const startSiteAgent = () =>
      startBcd({
        bcd: [...netns.prefix, options.bcd],
        url,
        role: "site",
        stateDir,
        hostname: `${site}-site-agent`,
        token,
        args: [
          ...config,
          ...["--netboot-address", SITE_ADDRESS, "--netboot-interface", "br0", "--netboot-mode", "server"],
          ...["--netboot-range", DHCP_RANGE, "--netboot-ra", "--ramdisk-dir", options.ramdiskDir],
          // Under TCG the kernel must be told the TSC's rate, or about one boot in 25 hangs calibrating it.
          "--ramdisk-cmdline",
          ["console=ttyS0", ...(tsc ? [`tsc_early_khz=${tsc}`] : []), ...(options.ramdiskCmdline ? [options.ramdiskCmdline] : [])].join(
            " ",
          ),
        ],
        tag: "site-agent",
        print,
        stopGraceMs: 10_000,
      });
    let siteAgent = startSiteAgent();
    cleanup.push(() => siteAgent.stop());
    const joined = await joinedSiteAgent(stateDir, `http://${SITE_ADDRESS}:${NETBOOT_PORT}`, siteAgent.process, call);

    return {
      site,
      pool,
      netns,
      bmc,
      ...(ipmi ? { ipmi, ipmiPool: ipmiPool! } : {}),
      machines,
      siteAgentNodeId: joined.nodeId,
      siteAgent: () => siteAgent,
      enroll: (machine) =>
        call("metal.enroll", {
          pool: machine.bmc === "ipmi" ? ipmiPool : pool,
          id: machine.id,
          bmc: {
            address: machine.bmcAddress,
            username: EMULATED_BMC_USER,
            password: EMULATED_BMC_PASSWORD,
            // An IPMI BMC does not report the machine's NICs: the operator names them (as Ironic's ports).
            ...(machine.bmc === "ipmi" ? { macs: [machine.mac] } : {}),
          },
        }),
      async restartSiteAgent() {
        await siteAgent.stop();
        siteAgent = startSiteAgent();
        await joinedSiteAgent(stateDir, `http://${SITE_ADDRESS}:${NETBOOT_PORT}`, siteAgent.process, call);
      },
      stop: cleanup.stop,
    };
  });
}
