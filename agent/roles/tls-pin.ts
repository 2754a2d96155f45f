// A certificate's public-key pin, as the site agent checks it for BMCs (bmc.tls.spkiSha256) and
// for machines it proxies to (site.httpProxy's tlsSpkiSha256). Node only.
import { X509Certificate, createHash } from "node:crypto";

/** The SHA-256 (base64) of a DER certificate's SubjectPublicKeyInfo: what curl's --pinnedpubkey sha256// takes. */
export function spkiSha256(certificateDer: Uint8Array): string {
  const spki = new X509Certificate(certificateDer).publicKey.export({ type: "spki", format: "der" });
  return createHash("sha256").update(spki).digest("base64");
}
