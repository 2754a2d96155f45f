// The guest network: every guest gets the SAME address plan (guest 10.0.2.2/30, gateway 10.0.2.1)
// inside its own network namespace `bc-<name>`, on a tap `tap0` that holds the gateway address.
// Nothing connects the namespace to the host's, so guest traffic stays inside it
// (FC-NETWORK-RANGE-INDEX is replaced by this identical plan).
import { AgentError } from "../../contracts.ts";
import { run } from "./helpers.ts";

export interface NetworkPlan {
  /** The guest's address with its prefix, e.g. "10.0.2.2/30". */
  guest: string;
  gateway: string;
  /** The resolvers written into the guest's /etc/resolv.conf (FC-RESOLVER-GATEWAY: the gateway). */
  dns: string[];
}

export const DEFAULT_NETWORK: NetworkPlan = { guest: "10.0.2.2/30", gateway: "10.0.2.1", dns: ["10.0.2.1"] };
export const TAP = "tap0";

const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

function octets(ip: string, what: string): number[] {
  const m = IPV4.exec(ip);
  const parts = m?.slice(1).map(Number);
  if (!parts || parts.some((n) => n > 255)) throw new AgentError("INVALID_CONFIG", `${what} ${JSON.stringify(ip)} is not an IPv4 address`);
  return parts;
}

function toInt(o: number[]): number {
  return ((o[0]! << 24) >>> 0) + (o[1]! << 16) + (o[2]! << 8) + o[3]!;
}

/** Checks a plan before any guest uses it: INVALID_CONFIG for a guest addressed as its gateway (FC-GUEST-IS-NOT-GATEWAY). */
export function validateNetworkPlan(plan: NetworkPlan): NetworkPlan & { prefix: number } {
  const [address, prefixText] = plan.guest.split("/");
  const prefix = Number(prefixText);
  if (!Number.isInteger(prefix) || prefix < 8 || prefix > 30) {
    throw new AgentError("INVALID_CONFIG", `guest address ${JSON.stringify(plan.guest)} needs a prefix from /8 to /30`);
  }
  const guest = toInt(octets(address!, "guest address"));
  const gateway = toInt(octets(plan.gateway, "gateway"));
  for (const dns of plan.dns) octets(dns, "resolver");
  // A guest addressed as its own gateway would ARP for itself: its frames answered by the interface that sent them.
  if (guest === gateway) throw new AgentError("INVALID_CONFIG", `the guest address ${address} is its gateway's`);
  const mask = prefix === 0 ? 0 : (~0 << (32 - prefix)) >>> 0;
  if ((guest & mask) >>> 0 !== (gateway & mask) >>> 0) {
    throw new AgentError("INVALID_CONFIG", `the gateway ${plan.gateway} is not inside ${plan.guest}`);
  }
  return { ...plan, prefix };
}

/** The guest MAC: 06:00 and the four bytes of its IPv4 address (FC-GUEST-MAC), so its network setup finds the address by MAC. */
export function guestMac(guestAddress: string): string {
  const o = octets(guestAddress.split("/")[0]!, "guest address");
  return ["06", "00", ...o.map((n) => n.toString(16).padStart(2, "0"))].join(":");
}

export function netnsName(name: string): string {
  return `bc-${name}`;
}

/** The seed's network-config, in exactly the layout the guest init reads. */
export function networkConfig(plan: NetworkPlan): string {
  return [
    "version: 2",
    "ethernets:",
    "  eth0:",
    "    match:",
    `      macaddress: "${guestMac(plan.guest)}"`,
    `    addresses: [${plan.guest}]`,
    `    gateway4: ${plan.gateway}`,
    "    nameservers:",
    `      addresses: [${plan.dns.join(", ")}]`,
    "",
  ].join("\n");
}

export async function netnsExists(netns: string): Promise<boolean> {
  const out = await run(["ip", "netns", "list"]);
  return out.split("\n").some((line) => line.split(" ")[0] === netns);
}

/** Creates the namespace with lo and tap0 holding the gateway address; idempotent (a crash half way converges). */
export async function ensureNetns(netns: string, plan: NetworkPlan & { prefix: number }): Promise<void> {
  if (!(await netnsExists(netns))) await run(["ip", "netns", "add", netns]);
  await run(["ip", "-n", netns, "link", "set", "lo", "up"]);
  const links = await run(["ip", "-n", netns, "-o", "link", "show"]);
  if (!links.includes(` ${TAP}:`)) await run(["ip", "-n", netns, "tuntap", "add", "dev", TAP, "mode", "tap"]);
  await run(["ip", "-n", netns, "addr", "replace", `${plan.gateway}/${plan.prefix}`, "dev", TAP]);
  await run(["ip", "-n", netns, "link", "set", TAP, "up"]);
}

/** Deletes the namespace (and its tap with it); an absent one is fine. */
export async function deleteNetns(netns: string): Promise<void> {
  if (await netnsExists(netns)) await run(["ip", "netns", "del", netns]);
}
