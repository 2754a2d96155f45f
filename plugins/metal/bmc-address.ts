// What a BMC binding may say about where its BMC is and how to trust it
// (better-compute/metal/bmc-address): one set of rules, used by the control plane (metal.enroll,
// through the redfish driver's manifest) and by the site agent (before it sends a request), so the
// agent never refuses an address the control plane accepted, nor accepts one it refused.
// Runtime-neutral (zod only, no Node built-ins).
import { z } from "zod";
import { httpProxyBody } from "./http-proxy.ts";

/** Longer addresses are refused: nothing real needs them, and they end up in every message. */
export const MAX_BMC_ADDRESS_LENGTH = 2048;
/** A CA bundle travels in every BMC command's body (one frame, 64 KiB): a few certificates fit. */
export const MAX_CA_BUNDLE_BYTES = 32 * 1024;

export const BMC_ADDRESS_FORM = "http(s)://host[:port]/redfish/v1/Systems/<id>, with no credentials, query or fragment";

const SYSTEM_PATH = /^\/redfish\/v1\/Systems\/([^/]+)\/?$/;
// Control characters (C0, DEL, C1) and whitespace: the URL parser drops some of them silently
// (tab, CR, LF), so what was checked would not be what is shown.
const UNPRINTABLE = /[\s\x00-\x1f\x7f-\x9f]/;

/** An accepted address, split into what requests need. */
export interface BmcAddress {
  /** scheme://host[:port] */
  origin: string;
  /** /redfish/v1/Systems/<id>, without a trailing slash. */
  systemPath: string;
  /** The system's id, decoded. */
  systemId: string;
  https: boolean;
}

/**
 * The address's parts, or why it is refused (a phrase to follow "the BMC address"). The problem
 * never quotes more of the address than its origin and path: a refused one may hold a credential.
 */
export function parseBmcAddress(address: unknown): { ok: true; address: BmcAddress } | { ok: false; problem: string } {
  const refuse = (problem: string) => ({ ok: false as const, problem });
  if (typeof address !== "string" || address === "") return refuse("is missing");
  if (address.length > MAX_BMC_ADDRESS_LENGTH) return refuse(`is longer than ${MAX_BMC_ADDRESS_LENGTH} characters`);
  if (UNPRINTABLE.test(address)) return refuse("holds whitespace or a control character");
  let url: URL;
  try {
    url = new URL(address);
  } catch {
    return refuse("is not a URL");
  }
  if (url.username || url.password) return refuse("carries a username or password; they travel as the credential");
  if (url.protocol !== "https:" && url.protocol !== "http:") return refuse(`must be http(s), not ${url.protocol}`);
  if (url.search || url.hash || address.includes("?") || address.includes("#"))
    return refuse(`must not carry a query or fragment: ${url.origin}${url.pathname}`);
  const id = SYSTEM_PATH.exec(url.pathname)?.[1];
  let systemId: string | undefined;
  try {
    systemId = id === undefined ? undefined : decodeURIComponent(id);
  } catch {
    // a malformed escape: refused below
  }
  if (!systemId) return refuse(`must name a system (/redfish/v1/Systems/<id>), not ${url.origin}${url.pathname}`);
  return {
    ok: true,
    address: { origin: url.origin, systemPath: url.pathname.replace(/\/$/, ""), systemId, https: url.protocol === "https:" },
  };
}

/** The one message for a refused address, wherever it is refused. */
export const bmcAddressMessage = (problem: string) => `the BMC address ${problem}; a BMC address is ${BMC_ADDRESS_FORM}`;

/** A BMC address as a field of a schema: the same rules as parseBmcAddress. */
export const bmcAddress = z.string().superRefine((value, ctx) => {
  const parsed = parseBmcAddress(value);
  if (!parsed.ok) ctx.addIssue({ code: "custom", message: bmcAddressMessage(parsed.problem) });
});

/**
 * How the site agent trusts an https BMC. Nearly every BMC serves a self-signed certificate, which
 * no system CA vouches for: name the CA that signed it (PEM) or pin its public key (the base64
 * SHA-256 of its SubjectPublicKeyInfo, the same pin as site.httpProxy's tlsSpkiSha256). Both given:
 * both are checked. Neither: the system's CAs.
 */
export const bmcTls = z
  .strictObject({
    caBundle: z
      .string()
      .max(MAX_CA_BUNDLE_BYTES, `at most ${MAX_CA_BUNDLE_BYTES} characters`)
      .refine((pem) => pem.includes("-----BEGIN CERTIFICATE-----"), "must be PEM certificates (-----BEGIN CERTIFICATE-----)")
      .optional(),
    spkiSha256: httpProxyBody.shape.tlsSpkiSha256,
  })
  .refine((t) => t.caBundle !== undefined || t.spkiSha256 !== undefined, "give caBundle, spkiSha256 or both");
export type BmcTls = z.infer<typeof bmcTls>;

/** Why this tls block does not fit this address (a tls block is for https only), or undefined. */
export function bmcTlsProblem(address: string, tls: BmcTls | undefined): string | undefined {
  if (tls === undefined) return undefined;
  const parsed = parseBmcAddress(address);
  return parsed.ok && !parsed.address.https ? "tls is only for https BMC addresses" : undefined;
}
