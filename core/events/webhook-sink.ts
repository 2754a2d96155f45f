// The built-in webhook sink: POSTs each batch as JSON to a receiver, signed with HMAC-SHA256 under
// a secret held by reference. The URL is checked when betterCompute() runs (SSRF rules: https only,
// no private or local address) unless the operator says otherwise. A URL's path and query may hold
// the receiver's own token (Slack's do), so errors name only its origin; the secret is never in
// an error, a log line or a header.
import { defineSink, type SinkDefinition, type SinkEvent } from "../contracts.ts";
import { ComputeError, driverError, invalidConfig } from "../errors.ts";

export interface WebhookSinkOptions {
  id: string;
  /** Where batches are POSTed; https unless allowHttp. */
  url: string;
  /** A reference, never a value: "env:NAME" (a Worker secret, `wrangler secret put NAME`) or "secret:<id>" (the secret store). */
  secret: string;
  /** "events" (default) or "audit": which outbox the sink reads. */
  kind?: "events" | "audit";
  /** Allow an http:// URL (a receiver on a trusted network, a test). */
  allowHttp?: boolean;
  /** Allow a private, loopback or link-local address, or localhost/*.localhost/*.internal. */
  allowPrivate?: boolean;
  /** Per delivery; default 10 000. */
  timeoutMs?: number;
  /** Extra headers sent with every delivery (not secret: they are plain configuration). */
  headers?: Record<string, string>;
  maxBatch?: number;
  maxAttempts?: number;
  /** What sends the request; default the global fetch. A Worker's mTLS certificate binding's fetch goes here. */
  fetch?: (input: string, init: RequestInit) => Promise<Response>;
}

/** The references the dispatcher resolves (resolveSecret in dispatch.ts). */
const SECRET_REF = /^(env:[A-Za-z_][A-Za-z0-9_]*|secret:[A-Za-z0-9-]{1,100})$/;
const DEFAULT_TIMEOUT_MS = 10_000;
/** How much of a refusing receiver's body an error quotes. */
const BODY_PREFIX = 200;
/** How far a receiver's clock (or a slow delivery) may be from the timestamp before verifyWebhookSignature refuses it. */
const DEFAULT_TOLERANCE_SECONDS = 300;

export function webhookSink(options: WebhookSinkOptions): SinkDefinition {
  const { id } = options;
  const refuse = (message: string, details: Record<string, unknown> = {}) =>
    invalidConfig(`webhook sink ${id}: ${message}`, { sink: id, ...details });

  if (typeof options.secret !== "string" || !SECRET_REF.test(options.secret)) {
    // Never quote it: a value put here by mistake is the secret itself.
    throw refuse('secret must be a reference, "env:NAME" or "secret:<id>", never the value');
  }
  const url = parseUrl(options.url, refuse);
  const origin = url.origin;
  if (url.username !== "" || url.password !== "") throw refuse("the URL holds credentials; sign with the secret instead", { origin });
  if (url.protocol !== "https:" && !(url.protocol === "http:" && options.allowHttp)) {
    throw refuse(url.protocol === "http:" ? "the URL is http:// (set allowHttp: true to allow it)" : "the URL must be https://", {
      origin,
    });
  }
  const privateReason = privateHost(url.hostname);
  if (privateReason && !options.allowPrivate) {
    throw refuse(`the URL's host is ${privateReason} (set allowPrivate: true to allow it)`, { origin });
  }
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) throw refuse("timeoutMs must be a positive whole number of milliseconds");
  for (const name of Object.keys(options.headers ?? {})) {
    if (/^(content-type|x-bc-.*)$/i.test(name)) throw refuse(`header ${name} is set by the sink itself`, { header: name });
  }
  const send = options.fetch ?? ((input: string, init: RequestInit) => fetch(input, init));
  const target = url.toString();

  return defineSink({
    id,
    kind: options.kind ?? "events",
    ...(options.maxBatch === undefined ? {} : { maxBatch: options.maxBatch }),
    ...(options.maxAttempts === undefined ? {} : { maxAttempts: options.maxAttempts }),
    async deliver(batch: SinkEvent[], ctx) {
      if (batch.length === 0) return;
      const secret = await ctx.secret(options.secret);
      // What a receiver or the network says back: without the secret, nor the URL's path (only its origin).
      const scrub = (text: string) => {
        const bare = text.split(target).join(origin);
        return secret.length >= 4 ? bare.split(secret).join("[redacted]") : bare;
      };
      const body = JSON.stringify({ events: batch });
      const timestamp = String(Math.floor(Date.now() / 1000));
      // The same events always make the same delivery id: a receiver dedupes a redelivery by it.
      const delivery = `${id}:${batch[0]!.id}-${batch[batch.length - 1]!.id}`;
      const details = { sink: id, origin, delivery };
      let response: Response;
      try {
        response = await send(target, {
          method: "POST",
          headers: {
            ...options.headers,
            "content-type": "application/json",
            "x-bc-timestamp": timestamp,
            "x-bc-signature": await signWebhook(secret, timestamp, body),
            "x-bc-delivery": delivery,
          },
          body,
          // A redirect could point anywhere, a private address included: it is a failure, never followed.
          redirect: "manual",
          signal: AbortSignal.timeout(timeoutMs),
        });
      } catch (err) {
        if (err instanceof Error && (err.name === "TimeoutError" || err.name === "AbortError")) {
          throw new ComputeError("DEADLINE_EXCEEDED", `webhook sink ${id}: ${origin} did not answer within ${timeoutMs} ms`, details);
        }
        throw driverError(`webhook sink ${id}: POST to ${origin} failed: ${scrub(errorText(err))}`, details);
      }
      const { status } = response;
      if (status >= 200 && status < 300) {
        await response.body?.cancel();
        return;
      }
      const prefix = scrub(await bodyPrefix(response));
      const why = status >= 300 && status < 400 ? `redirected (${status}); a webhook sink does not follow redirects` : `answered ${status}`;
      throw driverError(`webhook sink ${id}: ${origin} ${why}${prefix ? `: ${prefix}` : ""}`, { ...details, status });
    },
  });
}

/** The x-bc-signature header's value: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>. */
async function signWebhook(secret: string, timestamp: string, body: string): Promise<string> {
  const mac = await crypto.subtle.sign("HMAC", await hmacKey(secret), signedBytes(timestamp, body));
  return `v1=${[...new Uint8Array(mac)].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/**
 * For receivers: true when `header` (x-bc-signature) signs `timestamp` (x-bc-timestamp) and the raw
 * `body` under `secret`, and the timestamp is within toleranceSeconds (default 300) of now: an old
 * delivery replayed by someone who captured it is refused. Compares in constant time.
 */
export async function verifyWebhookSignature(
  secret: string,
  timestamp: string,
  body: string | Uint8Array,
  header: string,
  options: { toleranceSeconds?: number; nowSeconds?: number } = {},
): Promise<boolean> {
  const match = /^v1=([0-9a-f]{64})$/.exec(header.trim());
  if (!match || !/^\d{1,12}$/.test(timestamp)) return false;
  const now = options.nowSeconds ?? Date.now() / 1000;
  if (Math.abs(now - Number(timestamp)) > (options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS)) return false;
  const mac = Uint8Array.from(match[1]!.match(/../g)!, (hex) => parseInt(hex, 16));
  return crypto.subtle.verify("HMAC", await hmacKey(secret), mac, signedBytes(timestamp, body));
}

const hmacKey = (secret: string) =>
  crypto.subtle.importKey("raw", new TextEncoder().encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);

function signedBytes(timestamp: string, body: string | Uint8Array): Uint8Array<ArrayBuffer> {
  const head = new TextEncoder().encode(`${timestamp}.`);
  const tail = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const out = new Uint8Array(head.length + tail.length);
  out.set(head);
  out.set(tail, head.length);
  return out;
}

function parseUrl(value: unknown, refuse: (message: string) => ComputeError): URL {
  try {
    return new URL(String(value));
  } catch {
    throw refuse("url is not a valid absolute URL");
  }
}

// ---------------------------------------------------------------- SSRF: which hosts are private
// The URL parser has already normalized the host (0x7f.1 and 2130706433 are 127.0.0.1; IPv6 is
// bracketed and compressed). A DNS name is not resolved here: a Worker cannot resolve before its
// fetch (docs/sinks-webhook.md), and Workers' fetch does not reach private ranges in production.

const PRIVATE_RANGES: [string, string][] = [
  ["0.0.0.0/8", "an unspecified address"],
  ["10.0.0.0/8", "a private address"],
  ["100.64.0.0/10", "a carrier-grade NAT address"],
  ["127.0.0.0/8", "a loopback address"],
  ["169.254.0.0/16", "a link-local address"],
  ["172.16.0.0/12", "a private address"],
  ["192.0.0.0/24", "an IETF protocol address"],
  ["192.168.0.0/16", "a private address"],
  ["198.18.0.0/15", "a benchmarking address"],
  ["224.0.0.0/4", "a multicast address"],
  ["240.0.0.0/4", "a reserved address"],
  ["::/128", "an unspecified address"],
  ["::1/128", "a loopback address"],
  ["fc00::/7", "a unique local address"],
  ["fe80::/10", "a link-local address"],
  ["fec0::/10", "a site-local address"],
  ["ff00::/8", "a multicast address"],
];

/** IPv6 forms that carry an IPv4 address: the IPv4 address decides. */
const EMBEDS_IPV4: [string, number][] = [
  ["::ffff:0:0/96", 12], // IPv4-mapped
  ["::/96", 12], // IPv4-compatible (deprecated)
  ["64:ff9b::/96", 12], // NAT64
  ["2002::/16", 2], // 6to4
];

const cidr = (text: string) => {
  const [address, bits] = text.split("/");
  return { bytes: parseIp(address!)!, bits: Number(bits) };
};
const privateRanges = PRIVATE_RANGES.map(([range, what]) => ({ ...cidr(range), what }));
const embedding = EMBEDS_IPV4.map(([range, offset]) => ({ ...cidr(range), offset }));

/** Why the host is private or local, or undefined when it is a public address or a DNS name. */
function privateHost(hostname: string): string | undefined {
  const host = hostname.toLowerCase().replace(/\.+$/, "");
  if (host === "localhost" || host.endsWith(".localhost")) return "localhost";
  if (host.endsWith(".internal")) return "an .internal name";
  let bytes = parseIp(host.replace(/^\[(.*)\]$/, "$1"));
  if (!bytes) return undefined;
  if (bytes.length === 16) {
    // ::/96 also holds :: and ::1, which are refused as themselves below.
    const inner = embedding.find((e) => inPrefix(bytes!, e.bytes, e.bits) && !isZeroOrOne(bytes!));
    if (inner) bytes = bytes.slice(inner.offset, inner.offset + 4);
  }
  return privateRanges.find((r) => r.bytes.length === bytes!.length && inPrefix(bytes!, r.bytes, r.bits))?.what;
}

const isZeroOrOne = (bytes: number[]) => bytes.slice(0, 15).every((b) => b === 0) && bytes[15]! <= 1;

function inPrefix(address: number[], base: number[], bits: number): boolean {
  for (let i = 0; i < bits; i++) {
    const mask = 0x80 >> (i % 8);
    if ((address[i >> 3]! & mask) !== (base[i >> 3]! & mask)) return false;
  }
  return true;
}

/** Dotted IPv4 (4 bytes) or IPv6 (16 bytes), or undefined for anything else (a DNS name). */
function parseIp(text: string): number[] | undefined {
  const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(text);
  if (v4) {
    const bytes = v4.slice(1).map(Number);
    return bytes.every((b) => b <= 255) ? bytes : undefined;
  }
  if (!text.includes(":")) return undefined;
  const halves = text.split("::");
  if (halves.length > 2) return undefined;
  const groups = (part: string) => (part === "" ? [] : part.split(":"));
  const [head, tail] = [groups(halves[0]!), halves.length === 2 ? groups(halves[1]!) : []];
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return undefined;
  const all = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill("0"), ...tail];
  if (!all.every((g) => /^[0-9a-f]{1,4}$/.test(g))) return undefined;
  return all.flatMap((g) => [parseInt(g, 16) >> 8, parseInt(g, 16) & 0xff]);
}

async function bodyPrefix(response: Response): Promise<string> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  try {
    while (text.length <= BODY_PREFIX) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
  } catch {
    // A body cut off mid-way: what arrived is enough to quote.
  } finally {
    void reader.cancel().catch(() => {});
  }
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > BODY_PREFIX ? `${flat.slice(0, BODY_PREFIX)}…` : flat;
}

const errorText = (err: unknown): string => {
  if (!(err instanceof Error)) return String(err);
  // Node's fetch says "fetch failed" and puts the reason (ECONNREFUSED...) in its cause.
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : "";
  return `${err.message}${cause}`;
};
