// How the site agent reaches a server over HTTP (a BMC: redfish.ts): one request in, the whole
// answer out, whichever way it goes. An https URL goes through node:https on a connection of its
// own, trusting what the tls block names (a CA bundle, a pinned public key) or else the system's
// CAs; the certificate is checked on the established connection before a byte of the request (its
// Authorization header) is written. Plain http, and every request when a fetch is given (a test
// seam: the tls block is then not applied), goes through fetch. Node only.
import { request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import type { FetchLike } from "../contracts.ts";
import { spkiSha256 } from "./tls-pin.ts";

/** How to trust an https server's certificate; neither given: the system's CAs. Both given: both are checked. */
export interface TlsTrust {
  /** base64 SHA-256 of the certificate's SubjectPublicKeyInfo (see spkiSha256). */
  spkiSha256?: string;
  /** PEM of the CA (or the self-signed certificate itself) to trust instead of the system's. */
  caBundle?: string;
}

export interface HttpRequest {
  method: string;
  headers: Record<string, string>;
  body?: string;
  /** Its abort ends the request in flight. */
  signal: AbortSignal;
}

/** An HTTP answer, read whole. */
export interface HttpAnswer {
  status: number;
  statusText: string;
  header(name: string): string | undefined;
  body: string;
}

/** One request, its answer; rejects when no answer came (with CertificateRefused when the certificate is not trusted). */
export type HttpTransport = (url: string, request: HttpRequest) => Promise<HttpAnswer>;

/** Why a certificate was not trusted: its key is not the pinned one, or no CA trusted vouches for it. */
export type CertificateRefusal =
  { kind: "pin"; pin: string; presented: string | undefined } | { kind: "untrusted"; by: "caBundle" | "system"; reason: string };

/** The server's certificate was refused; nothing was sent. Another attempt meets the same certificate. */
export class CertificateRefused extends Error {
  constructor(readonly refusal: CertificateRefusal) {
    super(
      refusal.kind === "pin"
        ? `the certificate's public key does not match the pin ${refusal.pin}`
        : `the certificate is not trusted (${refusal.reason})`,
    );
    this.name = "CertificateRefused";
  }
}

/** A larger answer is refused (the https path reads it into memory). */
const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/** The transport for a server trusted as `tls` says (https), or reached through `fetch` when one is given. */
export function httpTransport(options: { tls?: TlsTrust; fetch?: FetchLike } = {}): HttpTransport {
  const { tls, fetch: given } = options;
  return (url, request) =>
    given || new URL(url).protocol !== "https:" ? viaFetch(given ?? fetch, url, request) : viaHttps(tls, url, request);
}

async function viaFetch(fetchFn: FetchLike, url: string, request: HttpRequest): Promise<HttpAnswer> {
  const res = await fetchFn(url, request);
  return { status: res.status, statusText: res.statusText, header: (name) => res.headers.get(name) ?? undefined, body: await res.text() };
}

/**
 * One request over https, on a connection of its own whose certificate is checked first: the pin
 * and/or CA bundle, else the system's CAs. Only then is the request written, so a server that is
 * not trusted never sees its headers.
 */
function viaHttps(tls: TlsTrust | undefined, url: string, request: HttpRequest): Promise<HttpAnswer> {
  const target = new URL(url);
  const host = target.hostname.replace(/^\[(.*)\]$/, "$1"); // sockets take IPv6 without brackets
  const port = Number(target.port || 443);
  return new Promise<HttpAnswer>((resolve, reject) => {
    let settled = false;
    const finish = (outcome: () => void) => {
      if (settled) return;
      settled = true;
      request.signal.removeEventListener("abort", onAbort);
      socket.destroy();
      outcome();
    };
    const fail = (e: Error) => finish(() => reject(e));
    const onAbort = () => fail(new Error("aborted"));
    // With rejectUnauthorized off the connection completes either way; authorized says whether it verified (chain and name).
    const socket: TLSSocket = tlsConnect({
      host,
      port,
      servername: isIP(host) ? undefined : host,
      ca: tls?.caBundle,
      rejectUnauthorized: false,
    });
    if (request.signal.aborted) return onAbort();
    request.signal.addEventListener("abort", onAbort, { once: true });
    socket.once("secureConnect", () => {
      const refusal = certificateRefusal(socket, tls);
      if (refusal) return fail(new CertificateRefused(refusal));
      const req = httpsRequest(target, { method: request.method, headers: request.headers, createConnection: () => socket });
      req.on("error", fail);
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (chunk: Buffer) => {
          size += chunk.byteLength;
          if (size > MAX_ANSWER_BYTES) fail(new Error(`the answer is larger than ${MAX_ANSWER_BYTES} bytes`));
          else chunks.push(chunk);
        });
        res.on("error", fail);
        res.on("aborted", () => fail(new Error("the answer broke off")));
        res.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8");
          const header = (name: string) => {
            const v = res.headers[name.toLowerCase()];
            return Array.isArray(v) ? v.join(", ") : v;
          };
          finish(() => resolve({ status: res.statusCode ?? 0, statusText: res.statusMessage ?? "", header, body }));
        });
      });
      req.end(request.body);
    });
    socket.on("error", fail);
    // After a complete answer this is a no-op; before one, the server hung up.
    socket.on("close", () => fail(new Error("the connection closed before a complete answer")));
  });
}

/** Why the server's certificate is not trusted under `tls`, or undefined. */
function certificateRefusal(socket: TLSSocket, tls: TlsTrust | undefined): CertificateRefusal | undefined {
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
