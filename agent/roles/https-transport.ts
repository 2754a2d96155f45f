// How the site agent reaches a server over HTTP (a BMC: redfish.ts): one request in, the whole
// answer out, whichever way it goes. An https URL goes through node:https on a connection of its
// own, trusting what the tls block names (a CA bundle, a pinned public key) or else the system's
// CAs; the certificate is checked on the established connection before a byte of the request (its
// Authorization header) is written. Plain http, and every request when a fetch is given (a test
// seam: the tls block is then not applied), goes through fetch. Node only.
import { request as httpsRequest } from "node:https";
import type { FetchLike } from "../contracts.ts";
import { certificateRefusal, connectTls, readAnswer, type CertificateRefusal, type TlsTrust } from "./tls-pin.ts";

export type { CertificateRefusal, TlsTrust } from "./tls-pin.ts";

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
    const socket = connectTls(host, port, tls);
    if (request.signal.aborted) return onAbort();
    request.signal.addEventListener("abort", onAbort, { once: true });
    socket.once("secureConnect", () => {
      const refusal = certificateRefusal(socket, tls);
      if (refusal) return fail(new CertificateRefused(refusal));
      const req = httpsRequest(target, { method: request.method, headers: request.headers, createConnection: () => socket });
      req.on("error", fail);
      req.on("response", (res) => {
        res.on("aborted", () => fail(new Error("the answer broke off")));
        readAnswer(res, MAX_ANSWER_BYTES, {
          fail,
          tooLarge: () => new Error(`the answer is larger than ${MAX_ANSWER_BYTES} bytes`),
          end: (bytes) => {
            const header = (name: string) => {
              const v = res.headers[name.toLowerCase()];
              return Array.isArray(v) ? v.join(", ") : v;
            };
            const body = bytes.toString("utf8");
            finish(() => resolve({ status: res.statusCode ?? 0, statusText: res.statusMessage ?? "", header, body }));
          },
        });
      });
      req.end(request.body);
    });
    socket.on("error", fail);
    // After a complete answer this is a no-op; before one, the server hung up.
    socket.on("close", () => fail(new Error("the connection closed before a complete answer")));
  });
}
