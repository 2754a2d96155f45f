// The HTTP every provider adapter speaks through: one place for retries, backoff, rate limits,
// timeouts and keeping credentials out of errors. Each adapter supplies what differs: how its API
// reports a failure (classify) and its rate-limit window (rateLimit).
import { providerError, type Fetch, type ProviderFailure } from "./contracts.ts";

export interface Classified {
  failure: ProviderFailure;
  /** The provider's own code, e.g. "resource_unavailable", "RATE_LIMIT_EXCEEDED". */
  reason?: string;
  message: string;
  /** When the provider says when to come back (Retry-After, RateLimit-Reset). */
  retryAfterSeconds?: number;
  /** The provider refused before acting (rate limit, locked): sending it again is safe even for a POST. */
  refused?: boolean;
}

export interface ProviderHttpOptions {
  provider: string;
  baseUrl: string;
  fetch: Fetch;
  /** Sent on every request (the credential goes here, never into a URL). */
  headers?: Record<string, string>;
  /** Values that must never appear in an error (the account's secrets): replaced by "[redacted]". */
  secrets?: string[];
  /** A failed response (status >= 400) as a failure; `body` is its parsed JSON, or its text. */
  classify(response: Response, body: unknown): Classified;
  /** Calls left and when the window resets (ms since the epoch), read from any response. */
  rateLimit?(response: Response): { remaining: number; resetAt: number } | undefined;
  /** Attempts per request for a transient failure; default 4. */
  maxAttempts?: number;
  /** Longest wait inside one call (backoff, a rate-limit reset); a longer one is returned as retryAfterSeconds. Default 30. */
  maxWaitSeconds?: number;
  /** Per attempt; default 30 000. */
  timeoutMs?: number;
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
}

export interface HttpRequest {
  query?: Record<string, string | number | boolean | (string | number)[] | undefined>;
  /** A JSON body. */
  json?: unknown;
  /** An application/x-www-form-urlencoded body; arrays repeat the key as given (e.g. "authorized_key[]"). */
  form?: Record<string, string | number | boolean | (string | number)[] | undefined>;
  /** Statuses that are answers, not failures (e.g. 404 for "gone"). */
  accept?: number[];
  headers?: Record<string, string>;
}

export interface HttpResponse<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT", "DELETE"]);

export class ProviderHttp {
  readonly #o: ProviderHttpOptions;
  /** No call before this time (ms): the provider's rate-limit window is spent. */
  #pausedUntil = 0;
  /** Requests sent, failed ones included: the bench's calls per instance. */
  calls = 0;

  constructor(options: ProviderHttpOptions) {
    this.#o = options;
  }

  async request<T = any>(method: string, path: string, request: HttpRequest = {}): Promise<HttpResponse<T>> {
    const o = this.#o;
    const maxAttempts = o.maxAttempts ?? 4;
    const clockMs = o.now ?? Date.now;
    const sleep = o.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
    for (let attempt = 1; ; attempt++) {
      await this.#waitForWindow(clockMs, sleep);
      let response: Response;
      try {
        this.calls++;
        response = await o.fetch(this.#url(path, request.query), {
          method,
          headers: { accept: "application/json", ...this.#contentType(request), ...o.headers, ...request.headers },
          body: this.#body(request),
          signal: AbortSignal.timeout(o.timeoutMs ?? 30_000),
        });
      } catch (err) {
        // Only a network failure or a timeout is the provider's; anything else (a replay's
        // unexpected request, a bug) is not retried.
        if (!isNetworkFailure(err)) throw err;
        // No answer: the request may or may not have reached the provider.
        const failure = { failure: "transient" as const, message: `${method} ${path}: ${this.#scrub(errorText(err))}` };
        if (attempt < maxAttempts && IDEMPOTENT.has(method)) {
          await sleep(backoffMs(attempt));
          continue;
        }
        throw providerError(o.provider, failure.failure, failure.message, { retryAfterSeconds: backoffMs(attempt) / 1000 });
      }
      this.#noteWindow(response, clockMs);
      const body = await readBody(response);
      if (response.status < 400 || request.accept?.includes(response.status))
        return { status: response.status, body: body as T, headers: response.headers };

      const classified = o.classify(response, body);
      const waitSeconds = classified.retryAfterSeconds ?? retryAfter(response, clockMs) ?? backoffMs(attempt) / 1000;
      if (classified.retryAfterSeconds !== undefined && classified.reason && /rate/i.test(classified.reason)) {
        this.#pausedUntil = Math.max(this.#pausedUntil, clockMs() + waitSeconds * 1000);
      }
      const retryable = classified.failure === "transient" && (IDEMPOTENT.has(method) || classified.refused === true);
      if (retryable && attempt < maxAttempts && waitSeconds <= (o.maxWaitSeconds ?? 30)) {
        if (this.#pausedUntil <= clockMs()) await sleep(waitSeconds * 1000);
        continue;
      }
      throw providerError(o.provider, classified.failure, `${method} ${path}: ${this.#scrub(classified.message)}`, {
        status: response.status,
        ...(classified.reason ? { reason: classified.reason } : {}),
        ...(classified.failure === "transient" ? { retryAfterSeconds: Math.max(1, Math.ceil(waitSeconds)) } : {}),
      });
    }
  }

  /** Waits out a spent rate-limit window, or says when to come back if that is too long. */
  async #waitForWindow(clockMs: () => number, sleep: (ms: number) => Promise<void>): Promise<void> {
    const wait = this.#pausedUntil - clockMs();
    if (wait <= 0) return;
    if (wait > (this.#o.maxWaitSeconds ?? 30) * 1000) {
      throw providerError(this.#o.provider, "transient", "the rate limit is spent until its window resets", {
        reason: "rate_limited",
        retryAfterSeconds: Math.ceil(wait / 1000),
      });
    }
    await sleep(wait);
  }

  #noteWindow(response: Response, clockMs: () => number): void {
    const window = this.#o.rateLimit?.(response);
    if (window && window.remaining <= 0 && window.resetAt > clockMs()) this.#pausedUntil = Math.max(this.#pausedUntil, window.resetAt);
  }

  #url(path: string, query: HttpRequest["query"]): string {
    const url = new URL(this.#o.baseUrl.replace(/\/$/, "") + path);
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(key, String(v));
    }
    return url.toString();
  }

  #contentType(request: HttpRequest): Record<string, string> {
    if (request.json !== undefined) return { "content-type": "application/json" };
    if (request.form !== undefined) return { "content-type": "application/x-www-form-urlencoded" };
    return {};
  }

  #body(request: HttpRequest): string | undefined {
    if (request.json !== undefined) return JSON.stringify(request.json);
    if (request.form === undefined) return undefined;
    const form = new URLSearchParams();
    for (const [key, value] of Object.entries(request.form)) {
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) form.append(key, String(v));
    }
    return form.toString();
  }

  #scrub(text: string): string {
    return (this.#o.secrets ?? []).filter((s) => s.length >= 4).reduce((out, secret) => out.split(secret).join("[redacted]"), text);
  }
}

/** 0.5 s, 1 s, 2 s, ... capped at 30 s. */
const backoffMs = (attempt: number) => Math.min(30_000, 500 * 2 ** (attempt - 1));

/** Retry-After in seconds or as an HTTP date. */
function retryAfter(response: Response, clockMs: () => number): number | undefined {
  const header = response.headers.get("retry-after");
  if (!header) return undefined;
  const seconds = Number(header);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, (at - clockMs()) / 1000);
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  if (text === "") return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** fetch rejects with a TypeError when the network fails, and a DOMException when the timeout aborts it. */
const isNetworkFailure = (err: unknown) =>
  err instanceof TypeError || (err instanceof Error && (err.name === "TimeoutError" || err.name === "AbortError"));

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));
