// A record/replay fetch for provider adapters (better-compute/vps/record-replay). Recording
// passes every request through and keeps the exchange, the account's secrets redacted; replay
// answers from a recording offline, in order, and refuses any request it does not expect. An
// adapter that puts nothing random into its requests replays exactly, so a conformance run can be
// committed and checked in CI without the provider.
import type { Fetch } from "./contracts.ts";

export interface Exchange {
  request: { method: string; path: string; body?: string };
  response: { status: number; statusText?: string; headers: Record<string, string>; body: string };
}

export interface Recording {
  /** Version of this file's shape. */
  format: 1;
  /** What was recorded (provider id, what ran it). */
  about: string;
  exchanges: Exchange[];
}

const REDACTED = "[redacted]";
/** Request and response headers worth replaying: a provider's rate-limit and retry headers among them. */
const KEPT_HEADERS = /^(content-type|retry-after|ratelimit-.*|x-ratelimit-.*|location)$/i;

/** Passes every request to `fetch` and records it; `secrets` never reach the recording. */
export function recordingFetch(fetch: Fetch, options: { secrets?: string[]; about?: string } = {}) {
  const exchanges: Exchange[] = [];
  const redact = redactor(options.secrets ?? []);
  const recorded: Fetch = async (input, init) => {
    const request = new Request(input, init);
    const body = request.body ? await request.clone().text() : undefined;
    const response = await fetch(request);
    const text = await response.clone().text();
    exchanges.push({
      request: { method: request.method, path: redact(pathOf(request.url)), ...(body ? { body: redact(body) } : {}) },
      response: {
        status: response.status,
        ...(response.statusText ? { statusText: redact(response.statusText) } : {}),
        headers: Object.fromEntries([...response.headers].filter(([name]) => KEPT_HEADERS.test(name)).map(([k, v]) => [k, redact(v)])),
        body: redact(text),
      },
    });
    return response;
  };
  return {
    fetch: recorded,
    exchanges,
    recording: (): Recording => ({ format: 1, about: options.about ?? "", exchanges }),
  };
}

/**
 * Answers from a recording, in order. A request that differs from the next recorded one (method,
 * path and query, body: secrets redacted on both sides) throws: the adapter changed, or the test
 * did. assertConsumed() fails unless every exchange was asked for.
 */
export function replayFetch(recording: Recording | Exchange[], options: { secrets?: string[] } = {}) {
  const exchanges = Array.isArray(recording) ? recording : recording.exchanges;
  const redact = redactor(options.secrets ?? []);
  let next = 0;
  const replayed: Fetch = async (input, init) => {
    const request = new Request(input, init);
    const body = request.body ? redact(await request.text()) : undefined;
    const path = redact(pathOf(request.url));
    const expected = exchanges[next];
    const asked = `${request.method} ${path}${body ? ` ${body}` : ""}`;
    if (!expected) throw new Error(`replay: unexpected request after all ${exchanges.length} recorded exchanges: ${asked}`);
    const wanted = `${expected.request.method} ${expected.request.path}${expected.request.body ? ` ${expected.request.body}` : ""}`;
    if (asked !== wanted)
      throw new Error(`replay: request ${next + 1} differs from the recording\n  asked:    ${asked}\n  recorded: ${wanted}`);
    next++;
    const { status, statusText, headers, body: text } = expected.response;
    // 204/304 carry no body by definition.
    return new Response(status === 204 || status === 304 ? null : text, { status, statusText, headers });
  };
  return {
    fetch: replayed,
    remaining: () => exchanges.length - next,
    assertConsumed(): void {
      if (next < exchanges.length)
        throw new Error(
          `replay: ${exchanges.length - next} of ${exchanges.length} recorded exchanges were never asked for (next: ${exchanges[next]!.request.method} ${exchanges[next]!.request.path})`,
        );
    },
  };
}

const pathOf = (url: string) => {
  const u = new URL(url);
  return u.pathname + u.search;
};

function redactor(secrets: string[]): (text: string) => string {
  // Secrets also travel URL- or form-encoded (a Basic header never reaches the recording).
  const forms = [
    ...new Set(
      secrets.filter((s) => s.length > 0).flatMap((s) => [s, encodeURIComponent(s), new URLSearchParams({ s }).toString().slice(2)]),
    ),
  ];
  forms.sort((a, b) => b.length - a.length);
  return (text) => forms.reduce((out, secret) => out.split(secret).join(REDACTED), text);
}
