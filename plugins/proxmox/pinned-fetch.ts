// pinnedFetch (better-compute/proxmox/pinned-fetch, Node only): a fetch for a Proxmox account's
// `tls` block. PVE serves a certificate it made itself, which no system CA vouches for; the account
// pins its public key (spkiSha256) or names the CA that signed it (caBundle), both checked when
// both are given, as the site agent trusts a BMC (agent/roles/redfish.ts: the same connection,
// check and reading of the answer, better-compute/tls-pin). The certificate is checked on the
// established connection before a byte of the request is written, so a server that is not the
// pinned one never sees the API token. One connection per request (no pooling): control-plane
// calls are few.
//
// A Worker's fetch cannot do this (it trusts public CAs only, with no pin or CA option): there,
// give PVE a publicly trusted certificate instead (docs/providers/proxmox.md).
import { request as httpsRequest } from "node:https";
import type { TLSSocket } from "node:tls";
import { ComputeError } from "better-compute/core";
import { certificateRefusal, connectTls, readAnswer, type TlsTrust } from "better-compute/tls-pin";
import type { Fetch } from "better-compute/vps";

/** The account's tls block: spkiSha256 (curl's --pinnedpubkey sha256//...) and/or caBundle. */
export type PinnedTls = TlsTrust;

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
      const socket = connectTls(host, port, tls);
      if (signal.aborted) return onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      socket.once("secureConnect", () => {
        const refused = refusal(socket, tls, url.host);
        if (refused) return fail(refused);
        const req = httpsRequest(url, { method: request.method, headers, createConnection: () => socket });
        req.on("error", fail);
        req.on("response", (res) =>
          readAnswer(res, MAX_ANSWER_BYTES, {
            fail,
            tooLarge: () => new TypeError(`the answer from ${url.host} is larger than ${MAX_ANSWER_BYTES} bytes`),
            end: (bytes) => {
              const status = res.statusCode ?? 0;
              const out = new Headers();
              for (const [name, value] of Object.entries(res.headers)) {
                for (const v of Array.isArray(value) ? value : value === undefined ? [] : [value]) out.append(name, v);
              }
              const text = status === 204 || status === 304 ? null : bytes;
              finish(() => resolve(new Response(text, { status, statusText: res.statusMessage ?? "", headers: out })));
            },
          }),
        );
        req.end(body);
      });
      socket.on("error", (e) => fail(new TypeError(`fetch to ${url.host} failed: ${e.message}`)));
      // After a complete answer this is a no-op; before one, the server hung up.
      socket.on("close", () => fail(new TypeError(`the connection to ${url.host} closed before a complete answer`)));
    });
  };
}

/** The refusal of a certificate not trusted under `tls`, worded for the account's config; or undefined. */
function refusal(socket: TLSSocket, tls: PinnedTls | undefined, where: string): ComputeError | undefined {
  const refused = certificateRefusal(socket, tls);
  if (refused?.kind === "pin")
    return new ComputeError(
      "INVALID_CONFIG",
      `${where} presented a certificate whose public key does not match the pin tls.spkiSha256 ${refused.pin}${refused.presented ? ` (its pin is ${refused.presented})` : ""}; nothing was sent`,
    );
  if (refused?.kind === "untrusted") {
    const by = refused.by === "system" ? "by the system's CAs" : "by tls.caBundle";
    return new ComputeError(
      "INVALID_CONFIG",
      `${where} presented a certificate that is not trusted ${by} (${refused.reason}); nothing was sent. Pin its public key with tls.spkiSha256 or name its CA in tls.caBundle`,
    );
  }
  return undefined;
}
