// bcd's flags for the site role's network boot (docs/netboot.md), and the service they make.
// Without --netboot-address the site agent boots nothing itself (its machines PXE-boot elsewhere).
import path from "node:path";
import type { AgentLogger } from "../../contracts.ts";
import type { DhcpConfig } from "./dnsmasq.ts";
import { NetbootService, type NetbootConfig } from "./service.ts";

/** The flags, as node:util parseArgs options. */
export const NETBOOT_FLAGS = {
  "netboot-address": { type: "string" },
  "netboot-port": { type: "string" },
  "netboot-interface": { type: "string" },
  "netboot-mode": { type: "string" },
  "netboot-range": { type: "string" },
  "netboot-netmask": { type: "string" },
  "netboot-subnet": { type: "string" },
  "netboot-ra": { type: "boolean" },
  "tftp-root": { type: "string" },
  "ramdisk-dir": { type: "string" },
  "ramdisk-cmdline": { type: "string" },
  "ramdisk-url": { type: "string" },
  "image-cache-dir": { type: "string" },
  "image-cache-gib": { type: "string" },
} as const;

export const NETBOOT_USAGE = `            [--netboot-address ADDR [--netboot-port N]]   role site: serve network boot on this address (HTTP; default port 8780)
            [--netboot-interface IF --netboot-mode server|proxy]   and DHCP/TFTP (dnsmasq) on this interface, and no other:
            [--netboot-range START,END [--netboot-netmask M]]   server: the network's DHCP server; or
            [--netboot-subnet NET]       proxy: beside its DHCP server; [--netboot-ra] router advertisements (server)
            [--ramdisk-dir DIR] [--ramdisk-cmdline ARGS] [--ramdisk-url URL]   the ramdisk machines boot (npm run ramdisk-image)
            [--image-cache-dir DIR] [--image-cache-gib N]   the site's image cache (default <state-dir>/images, 20 GiB)`;

export const DEFAULT_NETBOOT_PORT = 8780;

/** A flag that cannot work: the caller reports it as a usage error. */
export class NetbootFlagError extends Error {}

type Flags = Record<string, string | boolean | string[] | undefined>;

/** The network boot service the flags ask for, or undefined when they ask for none. */
export function netbootFromFlags(
  flags: Flags,
  opts: { url: string; stateDir: string; log: AgentLogger; blob?: NetbootConfig["blob"] },
): NetbootService | undefined {
  const str = (name: keyof typeof NETBOOT_FLAGS) => (typeof flags[name] === "string" ? (flags[name] as string) : undefined);
  const address = str("netboot-address");
  if (!address) {
    const stray = Object.keys(NETBOOT_FLAGS).find((name) => flags[name] !== undefined);
    if (stray) throw new NetbootFlagError(`--${stray} needs --netboot-address`);
    return undefined;
  }
  const port = Number(str("netboot-port") ?? DEFAULT_NETBOOT_PORT);
  if (!Number.isInteger(port) || port < 1 || port > 65535)
    throw new NetbootFlagError(`--netboot-port wants a port, got ${str("netboot-port")}`);
  let dhcp: DhcpConfig | undefined;
  const iface = str("netboot-interface");
  if (iface) {
    const mode = str("netboot-mode") ?? "proxy";
    const tftpRoot = str("tftp-root") ?? "/usr/lib/ipxe";
    if (mode === "server") {
      const range = str("netboot-range")?.split(",");
      if (range?.length !== 2) throw new NetbootFlagError("--netboot-mode server needs --netboot-range START,END");
      dhcp = {
        interface: iface,
        mode: { kind: "server", range: [range[0]!, range[1]!], netmask: str("netboot-netmask") ?? "255.255.255.0", leaseSeconds: 3600 },
        routerAdvertisements: flags["netboot-ra"] === true,
        tftpRoot,
      };
    } else if (mode === "proxy") {
      const subnet = str("netboot-subnet");
      if (!subnet) throw new NetbootFlagError("--netboot-mode proxy needs --netboot-subnet (the network's address, e.g. 10.0.0.0)");
      if (flags["netboot-ra"]) throw new NetbootFlagError("--netboot-ra is for a network the site owns (--netboot-mode server)");
      dhcp = { interface: iface, mode: { kind: "proxy", subnet }, routerAdvertisements: false, tftpRoot };
    } else throw new NetbootFlagError(`--netboot-mode wants server or proxy, got ${mode}`);
  }
  const gib = Number(str("image-cache-gib") ?? 20);
  if (!(gib > 0)) throw new NetbootFlagError(`--image-cache-gib wants a positive number, got ${str("image-cache-gib")}`);
  const ramdiskDir = str("ramdisk-dir");
  const ramdiskCmdline = str("ramdisk-cmdline");
  return new NetbootService({
    stateDir: path.join(opts.stateDir, "netboot"),
    address,
    httpPort: port,
    ...(dhcp ? { dhcp } : {}),
    ...(ramdiskDir ? { ramdiskDir: path.resolve(ramdiskDir) } : {}),
    ...(ramdiskCmdline ? { ramdiskCmdline } : {}),
    controlPlaneUrl: str("ramdisk-url") ?? opts.url,
    images: { dir: path.resolve(str("image-cache-dir") ?? path.join(opts.stateDir, "images")), maxBytes: Math.floor(gib * 2 ** 30) },
    ...(opts.blob ? { blob: opts.blob } : {}),
    log: opts.log,
  });
}
