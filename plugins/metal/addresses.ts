// IP literals and CIDR ranges, parsed without node:net (this runs in Workers): what httpViaSite
// checks a request's host against (the machine's recorded addresses, the provisioning networks).

export interface Ip {
  version: 4 | 6;
  value: bigint;
}

/** An IPv4 or IPv6 literal (brackets allowed); undefined for anything else, names included. */
export function parseIp(text: string): Ip | undefined {
  const literal = text.startsWith("[") && text.endsWith("]") ? text.slice(1, -1) : text;
  const v4 = parseIpv4(literal);
  if (v4 !== undefined) return { version: 4, value: v4 };
  const v6 = parseIpv6(literal);
  return v6 === undefined ? undefined : { version: 6, value: v6 };
}

function parseIpv4(text: string): bigint | undefined {
  const parts = text.split(".");
  if (parts.length !== 4 || !parts.every((p) => /^(0|[1-9]\d{0,2})$/.test(p) && Number(p) <= 255)) return undefined;
  return parts.reduce((acc, p) => (acc << 8n) | BigInt(p), 0n);
}

function parseIpv6(text: string): bigint | undefined {
  if (!/^[0-9a-fA-F:.]+$/.test(text)) return undefined;
  // A trailing dotted quad ("::ffff:10.0.0.1") is the last two groups.
  const lastColon = text.lastIndexOf(":");
  if (text.includes(".")) {
    const v4 = parseIpv4(text.slice(lastColon + 1));
    if (v4 === undefined) return undefined;
    text = `${text.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const halves = text.split("::");
  if (halves.length > 2) return undefined;
  const groups = (part: string | undefined) => (part ? part.split(":") : []);
  const left = groups(halves[0]);
  const right = groups(halves[1]);
  const all = [...left, ...right];
  if (!all.every((g) => /^[0-9a-fA-F]{1,4}$/.test(g))) return undefined;
  if (halves.length === 1 ? all.length !== 8 : all.length > 7) return undefined;
  const full = [...left, ...Array<string>(8 - all.length).fill("0"), ...right];
  return full.reduce((acc, g) => (acc << 16n) | BigInt(`0x${g}`), 0n);
}

/** Whether the address is inside "a.b.c.d/n" or "v6::/n"; false for a malformed range. */
export function inCidr(ip: Ip, cidr: string): boolean {
  const [base, bits] = cidr.split("/");
  const network = base === undefined ? undefined : parseIp(base);
  const width = ip.version === 4 ? 32 : 128;
  const prefix = Number(bits);
  if (!network || network.version !== ip.version || !Number.isInteger(prefix) || prefix < 0 || prefix > width) return false;
  const shift = BigInt(width - prefix);
  return ip.value >> shift === network.value >> shift;
}

export const sameIp = (a: Ip, b: Ip) => a.version === b.version && a.value === b.value;
