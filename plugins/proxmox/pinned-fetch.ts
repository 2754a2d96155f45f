// pinnedFetch (better-compute/proxmox/pinned-fetch, Node only): a fetch for a Proxmox account's
// `tls` block. PVE serves a certificate it made itself, which no system CA vouches for; the account
// pins its public key (spkiSha256) or names the CA that signed it (caBundle), both checked when
// both are given, as the site agent trusts a BMC (agent/roles/redfish.ts, the same pin through the
// same spkiSha256). The certificate is checked on the established connection before a byte of the
// request is written, so a server that is not the pinned one never sees the API token. One
// connection per request (no pooling): control-plane calls are few.
//
// A Worker's fetch cannot do this (it trusts public CAs only, with no pin or CA option): there,
// give PVE a publicly trusted certificate instead (docs/providers/proxmox.md).
import { request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { ComputeError } from "better-compute/core";
import { spkiSha256 } from "better-compute/tls-pin";
import type { Fetch } from "better-compute/vps";

export interface PinnedTls {
  /** base64 SHA-256 of the certificate's SubjectPublicKeyInfo (curl's --pinnedpubkey sha256//...). */
  spkiSha256?: string;
  /** PEM of the CA (or the self-signed certificate itself) to trust instead of the system's. */
  caBundle?: string;
}

/** Largest answer read (bytes): PVE's answers are small JSON. */
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;

/**
 * A fetch that reaches https URLs only, trusting what `tls` names (else the system's CAs). A
 * certificate it does not trust fails the call with INVALID_CONFIG before anything is sent.
 */
export function pinnedFetch(tls: PinnedTls | undefined): Fetch {
  return async (input, init) => {
    const request = new Request(input, init);
    const url = new URL(request.url);
    if (url.protocol !== "https:") throw new TypeError(`pinnedFetch speaks https only, not ${url.protocol}`);
    const body = request.body ? Buffer.from(await request.arrayBuffer()) : undefined;
    const headers: Record<string, string> = Object.fromEntries(request.headers);
    if (body) headers["content-length"] = String(body.byteLength);
    const host = url.hostname.replace(/^\[(.*)\]$/, "$1"); // sockets take IPv6 without brackets
    const port = Number(url.port || 443);
    const signal = request.signal;

    return new Promise<Response>((resolve, reject) => {
      let settled = false;
      const finish = (outcome: () => void) => {
        if (settled) return;
        settled = true;
        signal.removeEventListener("abort", onAbort);
        socket.destroy();
        outcome();
      };
      const fail = (e: unknown) => finish(() => reject(e));
      const onAbort = () => fail(signal.reason);
      // With rejectUnauthorized off the handshake completes either way; `authorized` says whether the chain and the name verified.
      const socket: TLSSocket = tlsConnect({
        host,
        port,
        servername: isIP(host) ? undefined : host,
        ca: tls?.caBundle,
        rejectUnauthorized: false,
      });
      if (signal.aborted) return onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      socket.once("secureConnect", () => {
        const refused = refusal(socket, tls, url.host);
        if (refused) return fail(refused);
        const req = httpsRequest(url, { method: request.method, headers, createConnection: () => socket });
        req.on("error", fail);
        req.on("response", (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on("data", (chunk: Buffer) => {
            size += chunk.byteLength;
            if (size > MAX_ANSWER_BYTES) fail(new TypeError(`the answer from ${url.host} is larger than ${MAX_ANSWER_BYTES} bytes`));
            else chunks.push(chunk);
          });
          res.on("error", fail);
          res.on("end", () => {
            const status = res.statusCode ?? 0;
            const out = new Headers();
            for (const [name, value] of Object.entries(res.headers)) {
              for (const v of Array.isArray(value) ? value : value === undefined ? [] : [value]) out.append(name, v);
            }
            const text = status === 204 || status === 304 ? null : Buffer.concat(chunks);
            finish(() => resolve(new Response(text, { status, statusText: res.statusMessage ?? "", headers: out })));
          });
        });
        req.end(body);
      });
      socket.on("error", (e) => fail(new TypeError(`fetch to ${url.host} failed: ${e.message}`)));
      // After a complete answer this is a no-op; before one, the server hung up.
      socket.on("close", () => fail(new TypeError(`the connection to ${url.host} closed before a complete answer`)));
    });
  };
}

/** Why the server's certificate is not trusted under `tls`, or undefined. */
function refusal(socket: TLSSocket, tls: PinnedTls | undefined, where: string): ComputeError | undefined {
  if (tls?.spkiSha256 !== undefined) {
    let presented: string | undefined;
    try {
      const peer = socket.getPeerCertificate();
      presented = peer?.raw ? spkiSha256(peer.raw) : undefined;
    } catch {
      // an unreadable certificate: no pin matches it
    }
    if (presented !== tls.spkiSha256) {
      return new ComputeError(
        "INVALID_CONFIG",
        `${where} presented a certificate whose public key does not match the pin tls.spkiSha256 ${tls.spkiSha256}${presented ? ` (its pin is ${presented})` : ""}; nothing was sent`,
      );
    }
    // The pin names the key: no CA vouches for a self-signed certificate, nor for the name in it.
    if (tls.caBundle === undefined) return undefined;
  }
  if (socket.authorized) return undefined;
  const by = tls?.caBundle === undefined ? "by the system's CAs" : "by tls.caBundle";
  return new ComputeError(
    "INVALID_CONFIG",
    `${where} presented a certificate that is not trusted ${by} (${String(socket.authorizationError)}); nothing was sent. Pin its public key with tls.spkiSha256 or name its CA in tls.caBundle`,
  );
}
