// The site agent's `site.httpProxy` command: one HTTP(S) request to an agentless machine on the
// site (e.g. Talos's API on https://<machine-ip>:50000), which the control plane cannot reach
// itself. The control plane validates the request first; the agent checks it again with the same
// rules (better-compute/metal/http-proxy) before it sends anything.
//
// Machines' certificates are self-signed, so https is not checked against any CA: the command
// pins the certificate's public key instead (tlsSpkiSha256), and the agent checks the pin on the
// established TLS connection before a byte of the request (headers, secrets, body) is written.
// Redirects are never followed. Secret header values come from the command's secrets and never
// appear in a result or an error. Node-only (node:http, node:https, node:tls).
import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { AgentError, inLane, type CommandContext, type CommandHandler } from "../contracts.ts";
import {
  HTTP_PROXY_KIND,
  MAX_PROXY_RESPONSE_BYTES,
  headerProblem,
  httpProxyBody,
  type HttpProxyBody,
  type HttpProxyAnswer,
} from "better-compute/metal/http-proxy";
import { parseBody } from "./site.ts";
import { spkiSha256 } from "./tls-pin.ts";

export interface HttpProxyOptions {
  /** Per request, connecting included (ms), unless the command says; default 10 000. */
  timeoutMs?: number;
  /** Largest response body (bytes), unless the command says; default (and at most) 48 KiB, to fit one result frame. */
  maxResponseBytes?: number;
}

const DEFAULT_TIMEOUT_MS = 10_000;
const DEFAULT_MAX_RESPONSE_BYTES = MAX_PROXY_RESPONSE_BYTES;

/** The machine a command body names (its URL's IP), read without trusting the body's shape. */
function machineLane(body: Record<string, unknown>): string | undefined {
  if (typeof body.url !== "string") return undefined;
  try {
    // The IP, not host:port: all of one machine's requests run in order, whatever its port.
    return `http:${new URL(body.url).hostname}`;
  } catch {
    return undefined; // refused by the handler, in the default lane
  }
}

export function httpProxyHandlers(options: HttpProxyOptions = {}): Record<string, CommandHandler> {
  return {
    [HTTP_PROXY_KIND]: inLane(machineLane, async (raw, ctx) => {
      const body = parseBody(ctx.kind, httpProxyBody, raw);
      const { headers, secretValues } = resolveHeaders(body, ctx);
      return proxy(body, headers, secretValues, ctx.signal, {
        timeoutMs: body.timeoutMs ?? options.timeoutMs ?? DEFAULT_TIMEOUT_MS,
        maxResponseBytes: body.maxResponseBytes ?? options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES,
      });
    }),
  };
}

/** The headers to send, secret values filled in and checked like the others. */
function resolveHeaders(body: HttpProxyBody, ctx: CommandContext): { headers: Record<string, string>; secretValues: string[] } {
  const secretHeaders: Record<string, string> = {};
  for (const [name, ref] of Object.entries(body.secretHeaders ?? {})) {
    const value = ctx.secrets?.[ref];
    if (value === undefined) throw new AgentError("INVALID_ARGUMENT", `${ctx.kind}: the command carries no value for ${ref}`);
    const problem = headerProblem(name, value);
    if (problem) throw new AgentError("INVALID_ARGUMENT", `${ctx.kind}: secretHeaders.${name} (${ref}): ${problem}`);
    secretHeaders[name] = value;
  }
  return { headers: { ...body.headers, ...secretHeaders }, secretValues: Object.values(secretHeaders) };
}

/** Text from the network stack or the machine, without a secret value in case it echoes one. */
function scrub(text: string, secrets: string[]): string {
  for (const secret of secrets) if (secret) text = text.replaceAll(secret, "[redacted]");
  return text;
}

function proxy(
  body: HttpProxyBody,
  headers: Record<string, string>,
  secrets: string[],
  signal: AbortSignal,
  limits: { timeoutMs: number; maxResponseBytes: number },
): Promise<HttpProxyAnswer> {
  const url = new URL(body.url);
  const what = `${body.method} ${url.href}`;
  const https = url.protocol === "https:";
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1"); // sockets take IPv6 without brackets
  const port = Number(url.port || (https ? 443 : 80));

  return new Promise<HttpProxyAnswer>((resolve, reject) => {
    let socket: Socket | undefined;
    let settled = false;
    const finish = (outcome: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      socket?.destroy();
      outcome();
    };
    const fail = (message: string) => finish(() => reject(new AgentError("DRIVER_ERROR", `${what} ${scrub(message, secrets)}`)));
    const timer = setTimeout(() => fail(`got no answer within ${limits.timeoutMs} ms`), limits.timeoutMs);
    // The command's deadline or the agent stopping: report that, not a machine failure.
    const onAbort = () => finish(() => reject(signal.reason));
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });

    // Connect first, and (https) check the pin on the established connection; only then is the
    // request written, so an unpinned server never sees a header.
    if (https) {
      const tls: TLSSocket = tlsConnect({ host, port, rejectUnauthorized: false });
      socket = tls;
      tls.once("secureConnect", () => {
        let pin: string | undefined;
        try {
          const peer = tls.getPeerCertificate();
          pin = peer?.raw ? spkiSha256(peer.raw) : undefined;
        } catch {
          // an unreadable certificate: no pin matches it
        }
        if (pin !== body.tlsSpkiSha256) return fail("refused: the certificate does not match the pinned SPKI");
        send(tls);
      });
    } else {
      socket = netConnect({ host, port });
      socket.once("connect", () => send(socket!));
    }
    socket.on("error", (e) => fail(`failed: ${e.message}`));
    // After a complete answer this is a no-op; before one, the machine hung up.
    socket.on("close", () => fail("failed: the connection closed before a complete answer"));

    function send(connected: Socket) {
      // createConnection hands over the checked connection; without an agent it is used for
      // this request only (Connection: close), never pooled.
      const req = (https ? httpsRequest : httpRequest)(url, {
        method: body.method,
        headers,
        createConnection: () => connected,
      });
      req.on("error", (e) => fail(`failed: ${e.message}`));
      req.on("response", (res) => receive(res));
      req.end(body.body);
    }

    function receive(res: IncomingMessage) {
      const status = res.statusCode ?? 0;
      if (status >= 300 && status < 400) {
        const location = res.headers.location;
        return fail(`was answered ${status}: redirect${location ? ` to ${location}` : ""} refused`);
      }
      const tooLarge = () => fail(`was answered with a body over ${limits.maxResponseBytes} bytes; refused`);
      if (Number(res.headers["content-length"]) > limits.maxResponseBytes) return tooLarge();
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (chunk: Buffer) => {
        size += chunk.byteLength;
        // Stop reading at the cap: finish() destroys the socket.
        if (size > limits.maxResponseBytes) tooLarge();
        else chunks.push(chunk);
      });
      res.on("error", (e) => fail(`broke off while answering: ${e.message}`));
      res.on("aborted", () => fail("broke off while answering"));
      res.on("end", () => {
        const out: Record<string, string> = {};
        for (const [name, value] of Object.entries(res.headers)) {
          // Cookies are the machine's session state, never the control plane's business.
          if (name === "set-cookie" || value === undefined) continue;
          out[name] = scrub(Array.isArray(value) ? value.join(", ") : value, secrets);
        }
        const text = scrub(Buffer.concat(chunks).toString("utf8"), secrets);
        finish(() => resolve({ status, headers: out, body: text }));
      });
    }
  });
}
