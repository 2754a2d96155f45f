// DHCP and TFTP for network boot, by dnsmasq, which the site agent configures and supervises.
// Why dnsmasq and not a DHCP server in Node: node:dgram cannot bind a socket to one interface
// (no SO_BINDTODEVICE, no IP_PKTINFO), so a Node server would answer DHCP broadcasts on every
// interface of the site host; dnsmasq binds to exactly the interface it is given, and brings proxy
// DHCP, TFTP for firmware that is not iPXE, and router advertisements. (docs/decisions.md)
//
// What it answers: only the MACs of the machines the agent expects (dhcp-ignore=tag:!known);
// iPXE (user class "iPXE") gets its machine's script over HTTP; other firmware gets iPXE itself
// over TFTP (undionly.kpxe for BIOS, ipxe.efi for UEFI), which then asks again as iPXE.
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { createInterface } from "node:readline";
import { jitterBackoff } from "../../backoff.ts";
import type { AgentLogger } from "../../contracts.ts";
import { writeAtomic } from "../../file-state.ts";
import type { NetbootMachine } from "./machines.ts";

export interface DhcpConfig {
  /** The provisioning interface: dnsmasq binds to it and to no other. */
  interface: string;
  /**
   * server: the DHCP server of a network the site owns, leasing from `range`; proxy: beside the
   * network's own DHCP server, answering only the boot part of known machines' requests.
   */
  mode: { kind: "server"; range: [string, string]; netmask: string; leaseSeconds: number } | { kind: "proxy"; subnet: string };
  /** Router advertisements on the interface (iPXE waits ~13 s for IPv6 without one): only on a network the site owns. */
  routerAdvertisements: boolean;
  /** Where undionly.kpxe and ipxe.efi are (Debian's ipxe package: /usr/lib/ipxe). */
  tftpRoot: string;
  /** How to run dnsmasq: default ["dnsmasq"] from PATH (a test runs it inside its namespace: ["ip", "netns", "exec", NS, "dnsmasq"]). */
  command?: string[];
}

/** The tag dnsmasq knows a machine's MACs by (machine ids are not all valid tag names). */
const tagOf = (machine: string) => `bcm-${createHash("sha256").update(machine).digest("hex").slice(0, 16)}`;

/** dnsmasq's configuration for these machines, each one's iPXE script at scriptUrl(machine). */
export function dnsmasqConfig(
  c: DhcpConfig,
  machines: NetbootMachine[],
  scriptUrl: (m: NetbootMachine) => string,
  files: { leases: string },
): string {
  const lines = [
    "# Written by bcd (the site agent) for network boot; rewritten whenever its machines change.",
    "port=0", // no DNS
    `interface=${c.interface}`,
    "bind-interfaces",
    "except-interface=lo",
    "no-ping",
    "log-facility=-",
    `dhcp-leasefile=${files.leases}`,
    c.mode.kind === "server"
      ? `dhcp-range=${c.mode.range[0]},${c.mode.range[1]},${c.mode.netmask},${c.mode.leaseSeconds}s`
      : `dhcp-range=${c.mode.subnet},proxy`,
    // Never a machine it does not expect.
    "dhcp-ignore=tag:!known",
    "dhcp-userclass=set:ipxe,iPXE",
    // iPXE otherwise waits ~3 s for a ProxyDHCP offer.
    ...(c.mode.kind === "server" ? ["dhcp-option-force=tag:ipxe,60,PXEClient"] : []),
    "dhcp-match=set:efi64,option:client-arch,7",
    "dhcp-match=set:efi64,option:client-arch,9",
    "enable-tftp",
    `tftp-root=${c.tftpRoot}`,
    ...(c.mode.kind === "proxy"
      ? ['pxe-service=tag:!ipxe,x86PC,"Better Compute",undionly.kpxe', 'pxe-service=tag:!ipxe,X86-64_EFI,"Better Compute",ipxe.efi']
      : ["dhcp-boot=tag:!ipxe,tag:efi64,ipxe.efi", "dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe"]),
    ...(c.routerAdvertisements ? ["enable-ra", `dhcp-range=::,constructor:${c.interface},ra-only`] : []),
  ];
  for (const m of machines) {
    const tag = tagOf(m.machine);
    for (const mac of m.macs) lines.push(`dhcp-host=${mac},set:${tag}`);
    lines.push(`dhcp-boot=tag:${tag},tag:ipxe,${scriptUrl(m)}`);
  }
  return lines.join("\n") + "\n";
}

/** dnsmasq, run and kept running with the configuration of the moment; restarted when it changes. */
export class Dnsmasq {
  readonly #dir: string;
  readonly #config: DhcpConfig;
  readonly #log: AgentLogger;
  #child: ChildProcess | undefined;
  #stopping = false;
  #attempt = 0;
  #restart: ReturnType<typeof setTimeout> | undefined;

  constructor(stateDir: string, config: DhcpConfig, log: AgentLogger) {
    this.#dir = stateDir;
    this.#config = config;
    this.#log = log;
  }

  get confFile(): string {
    return path.join(this.#dir, "dnsmasq.conf");
  }

  /** Writes the configuration for these machines and (re)starts dnsmasq on it. */
  async apply(machines: NetbootMachine[], scriptUrl: (m: NetbootMachine) => string): Promise<void> {
    await fs.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    await writeAtomic(this.confFile, dnsmasqConfig(this.#config, machines, scriptUrl, { leases: path.join(this.#dir, "leases") }));
    // dnsmasq re-reads its hosts only from separate files on SIGHUP; a restart takes a few ms and
    // a client whose exchange it cut asks again.
    await this.#stop();
    this.#stopping = false;
    this.#spawn();
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#stop();
  }

  #spawn(): void {
    const [program, ...prefix] = this.#config.command ?? ["dnsmasq"];
    const child = spawn(program!, [...prefix, "--keep-in-foreground", `--conf-file=${this.confFile}`], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.#child = child;
    for (const stream of [child.stdout!, child.stderr!]) {
      createInterface({ input: stream }).on("line", (line) => {
        if (/warning|failed|error|cannot|unknown/i.test(line)) this.#log.warn("dnsmasq", { line });
      });
    }
    child.once("error", (e) => this.#log.error("dnsmasq could not start", { error: e.message }));
    child.once("exit", (code, signal) => {
      if (this.#child !== child) return; // stopped or replaced on purpose
      this.#child = undefined;
      if (this.#stopping) return;
      const delayMs = jitterBackoff(this.#attempt++, { initialMs: 500, maxMs: 30_000 });
      this.#log.error("dnsmasq exited; restarting it", { code, signal, delayMs });
      this.#restart = setTimeout(() => {
        if (!this.#stopping) this.#spawn();
      }, delayMs);
    });
    // Running for a while: a later exit starts the backoff afresh.
    setTimeout(() => {
      if (this.#child === child) this.#attempt = 0;
    }, 10_000).unref();
  }

  async #stop(): Promise<void> {
    clearTimeout(this.#restart);
    const child = this.#child;
    this.#child = undefined;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.kill("SIGTERM");
    await exited;
  }
}
