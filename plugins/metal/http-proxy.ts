// The rules of the site agent's `site.httpProxy` command (better-compute/metal/http-proxy; the
// handler is agent/roles/http-proxy.ts): which
// requests it performs on the control plane's behalf to an agentless machine (e.g. Talos's API
// on https://<machine-ip>:50000). Runtime-neutral (zod and better-compute/core, no Node built-ins) so the control
// plane checks a request with the same rules before it sends it; the agent checks again.
import { z } from "zod";
import { SECRET_REF } from "better-compute/core";
import { parseIp } from "./addresses.ts";

export const HTTP_PROXY_KIND = "site.httpProxy";
export const HTTP_PROXY_METHODS = ["GET", "POST", "PUT", "DELETE"] as const;
export type HttpProxyMethod = (typeof HTTP_PROXY_METHODS)[number];
/** Largest request body (UTF-8 bytes). */
export const MAX_PROXY_REQUEST_BODY_BYTES = 64 * 1024;
/** Bounds of the per-command settings. */
export const MAX_PROXY_TIMEOUT_MS = 60_000;
/** An answer travels in one result frame (MAX_FRAME_BYTES, 64 KiB): the body stays well under it. */
export const MAX_PROXY_RESPONSE_BYTES = 48 * 1024;

/** What the command answers for any status that is not a redirect. */
export interface HttpProxyAnswer {
  status: number;
  /** Lower-case names; set-cookie left out. */
  headers: Record<string, string>;
  /** The response body decoded as UTF-8. */
  body: string;
}

// RFC 9110 token characters.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// What a header value may hold (RFC 9110 field-value; Node refuses the rest too): no CR, LF, NUL
// or other control character but tab.
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
// Headers that frame the message or steer the connection: the agent decides those, never the
// caller, so a request cannot be smuggled or sent through another proxy.
const FORBIDDEN_HEADERS = new Set([
  "host",
  "connection",
  "content-length",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "keep-alive",
  "expect",
]);
// The standard base64 of 32 bytes: 43 characters, the last holding 2 bits, and one '='.
const SPKI_SHA256 = /^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$/;

/**
 * Why a header may not be sent through the proxy, or undefined when it may. Never quotes the
 * value: it may be a secret.
 */
export function headerProblem(name: string, value: string): string | undefined {
  if (!TOKEN.test(name)) return `the header name ${JSON.stringify(name)} is not an HTTP token`;
  const lower = name.toLowerCase();
  if (FORBIDDEN_HEADERS.has(lower) || lower.startsWith("proxy-")) return `the header ${name} is set by the agent, not by the command`;
  if (typeof value !== "string" || !FIELD_VALUE.test(value))
    return `the value of the header ${name} holds CR, LF or another character a header value may not`;
  return undefined;
}

/**
 * Why the agent would refuse this URL, or undefined. The host must be an IP literal: a name
 * could resolve anywhere, so the control plane could not know which machine it reaches.
 */
export function proxyUrlProblem(url: string): string | undefined {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return "not a URL"; // not echoed: it may hold a credential
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return `must be http: or https:, not ${u.protocol}`;
  if (u.username || u.password) return "must not carry a username or password";
  // The URL parser has already turned numeric forms (127.1, 0x7f.0.0.1) into dotted IPv4 and
  // checked a bracketed IPv6 literal, so anything else here is a name.
  if (parseIp(u.hostname) === undefined) return `the host must be an IP address, not the name ${u.hostname}`;
  return undefined;
}

/** Bytes of the UTF-8 encoding of a string. */
const utf8Length = (s: string) => new TextEncoder().encode(s).byteLength;

/**
 * The command body. Strict: an unknown field (say, a wish to follow redirects) is refused rather
 * than silently ignored. timeoutMs and maxResponseBytes default in the agent.
 */
export const httpProxyBody = z
  .strictObject({
    url: z.string().superRefine((url, ctx) => {
      const problem = proxyUrlProblem(url);
      if (problem) ctx.addIssue({ code: "custom", message: problem });
    }),
    method: z.enum(HTTP_PROXY_METHODS).default("GET"),
    headers: z.record(z.string(), z.string()).optional(),
    // The message does not echo the value: it may be a secret sent by mistake.
    secretHeaders: z
      .record(z.string(), z.string().regex(SECRET_REF, "must be a secret://<id> reference, never the value itself"))
      .optional(),
    body: z
      .string()
      .refine((b) => utf8Length(b) <= MAX_PROXY_REQUEST_BODY_BYTES, `at most ${MAX_PROXY_REQUEST_BODY_BYTES} bytes`)
      .optional(),
    tlsSpkiSha256: z
      .string()
      .regex(SPKI_SHA256, "must be the base64 SHA-256 of the certificate's SubjectPublicKeyInfo (44 characters)")
      .optional(),
    timeoutMs: z.number().int().min(1).max(MAX_PROXY_TIMEOUT_MS).optional(),
    maxResponseBytes: z.number().int().min(1).max(MAX_PROXY_RESPONSE_BYTES).optional(),
  })
  .superRefine((b, ctx) => {
    // Header names are case-insensitive: the same one twice would leave it to chance which is sent.
    const seen = new Set<string>();
    for (const field of ["headers", "secretHeaders"] as const) {
      for (const [name, value] of Object.entries(b[field] ?? {})) {
        // A secret reference stands in for the value here; the agent checks the value itself.
        const problem = headerProblem(name, field === "headers" ? value : "");
        if (problem) ctx.addIssue({ code: "custom", path: [field, name], message: problem });
        else if (seen.has(name.toLowerCase()))
          ctx.addIssue({ code: "custom", path: [field, name], message: `the header ${name} is given twice` });
        seen.add(name.toLowerCase());
      }
    }
    let protocol: string | undefined;
    try {
      protocol = new URL(b.url).protocol;
    } catch {
      // the url field's own issue says it
    }
    // Machines' certificates are self-signed: the pin is the only thing that says it is the machine.
    if (protocol === "https:" && b.tlsSpkiSha256 === undefined)
      ctx.addIssue({ code: "custom", path: ["tlsSpkiSha256"], message: "required for https: (the machine's certificate is self-signed)" });
    if (protocol === "http:" && b.tlsSpkiSha256 !== undefined)
      ctx.addIssue({ code: "custom", path: ["tlsSpkiSha256"], message: "only for https: URLs" });
  });
export type HttpProxyBody = z.infer<typeof httpProxyBody>;
