// An IPMI BMC binding, as metal.enroll takes it and the bcx-ipmi plugin reads it: where the BMC
// answers (host[:port], UDP 623 by default), its user, the password by reference, the RMCP+ cipher
// suite, and the MACs of the machine's provisioning NICs: an IPMI BMC does not report them (as
// Ironic asks for ports at enrollment), and the site's network boot answers only the MACs it knows.
// Plain TypeScript, no imports: the control plane's manifest (driver.ts) and the plugin both use it.

export const IPMI_DRIVER = "ipmi";
/** The plugin's version: its handshake says it, the control plane's declaration too. */
export const IPMI_PLUGIN_VERSION = "1.0.0";
export const IPMI_PORT = 623;
/**
 * RMCP+ cipher suites with an authentication algorithm. Suite 0 (none) is refused: a BMC then takes
 * any password (ipmi_sim does). 3 is what most BMCs answer; newer ones want 17 (SHA-256).
 */
export const IPMI_CIPHER_SUITES = [1, 2, 3, 6, 7, 8, 11, 12, 15, 16, 17] as const;
/** IPMI 2.0 limits a user name to 16 bytes and a password to 20. */
export const MAX_IPMI_USER_BYTES = 16;
export const MAX_IPMI_PASSWORD_BYTES = 20;

const HOST = /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const IPV6 = /^[0-9A-Fa-f:.]+$/;
export const MAC = /^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$/;

/** host[:port] or [v6]:port, split; or why the address is refused (a phrase after "the IPMI address"). */
export function parseIpmiAddress(address: string): { ok: true; host: string; port: number } | { ok: false; problem: string } {
  const refuse = (problem: string) => ({ ok: false as const, problem });
  if (address.length > 255) return refuse("is longer than 255 characters");
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(address);
  const [host, port] = bracketed
    ? [bracketed[1]!, bracketed[2]]
    : address.includes("::") || address.split(":").length > 2
      ? [address, undefined]
      : (address.split(":") as [string, string | undefined]);
  if (bracketed || host.includes(":")) {
    if (!IPV6.test(host)) return refuse(`has an IPv6 host that is not an address: ${host}`);
  } else if (!HOST.test(host)) return refuse("is not host[:port] (a name or an IPv4 address, e.g. 10.0.0.5:623)");
  const n = port === undefined ? IPMI_PORT : Number(port);
  if (!(Number.isInteger(n) && n >= 1 && n <= 65535)) return refuse(`has a port that is not 1-65535: ${port}`);
  return { ok: true, host, port: n };
}
