// How an https server's certificate is trusted: its public-key pin, as the site agent checks it for
// BMCs (bmc.tls.spkiSha256) and for machines it proxies to (site.httpProxy's tlsSpkiSha256), and/or
// a CA bundle, else the system's CAs. The agent's HTTPS transport (https-transport.ts) and the
// Proxmox provider's pinnedFetch connect, check and read an answer the same way. Node only.
import { X509Certificate, createHash } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { isIP } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";

/** The SHA-256 (base64) of a DER certificate's SubjectPublicKeyInfo: what curl's --pinnedpubkey sha256// takes. */
export function spkiSha256(certificateDer: Uint8Array): string {
  const spki = new X509Certificate(certificateDer).publicKey.export({ type: "spki", format: "der" });
  return createHash("sha256").update(spki).digest("base64");
}

/** How to trust an https server's certificate; neither given: the system's CAs. Both given: both are checked. */
export interface TlsTrust {
  /** base64 SHA-256 of the certificate's SubjectPublicKeyInfo (see spkiSha256). */
  spkiSha256?: string;
  /** PEM of the CA (or the self-signed certificate itself) to trust instead of the system's. */
  caBundle?: string;
}

/** Why a certificate was not trusted: its key is not the pinned one, or no CA trusted vouches for it. */
export type CertificateRefusal =
  { kind: "pin"; pin: string; presented: string | undefined } | { kind: "untrusted"; by: "caBundle" | "system"; reason: string };

/**
 * A TLS connection to host:port whose certificate is left to certificateRefusal, once it is
 * established (secureConnect) and before anything is written on it: with rejectUnauthorized off
 * the handshake completes either way, and `authorized` says whether the chain and the name verified.
 */
export function connectTls(host: string, port: number, tls: TlsTrust | undefined): TLSSocket {
  return tlsConnect({ host, port, servername: isIP(host) ? undefined : host, ca: tls?.caBundle, rejectUnauthorized: false });
}

/** Why the server's certificate is not trusted under `tls`, or undefined. */
export function certificateRefusal(socket: TLSSocket, tls: TlsTrust | undefined): CertificateRefusal | undefined {
  const pin = tls?.spkiSha256;
  if (pin !== undefined) {
    let presented: string | undefined;
    try {
      const peer = socket.getPeerCertificate();
      presented = peer?.raw ? spkiSha256(peer.raw) : undefined;
    } catch {
      // an unreadable certificate: no pin matches it
    }
    if (presented !== pin) return { kind: "pin", pin, presented };
    // The pin names the key: no CA vouches for a self-signed certificate, nor for the name in it.
    if (tls?.caBundle === undefined) return undefined;
  }
  if (socket.authorized) return undefined;
  return { kind: "untrusted", by: tls?.caBundle === undefined ? "system" : "caBundle", reason: String(socket.authorizationError) };
}

/**
 * Reads an answer whole: `end` gets its body; `fail` gets the stream's error, or tooLarge() once
 * the body passes maxBytes (what follows is not kept).
 */
export function readAnswer(
  res: IncomingMessage,
  maxBytes: number,
  on: { end(body: Buffer): void; fail(error: Error): void; tooLarge(): Error },
): void {
  const chunks: Buffer[] = [];
  let size = 0;
  res.on("data", (chunk: Buffer) => {
    size += chunk.byteLength;
    if (size > maxBytes) on.fail(on.tooLarge());
    else chunks.push(chunk);
  });
  res.on("error", on.fail);
  res.on("end", () => on.end(Buffer.concat(chunks)));
}
