// The CLI's HTTP client: POST /v1/<method> with the API key, GET /openapi.json (conditional, for
// catalog.ts's cache). A refusal is an ApiError carrying the API's code, message, request id and
// details.
import http from "node:http";
import type { Connection } from "./connection.ts";

export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly requestId?: string,
    readonly details?: unknown,
  ) {
    super(message);
  }
}

export interface Api {
  readonly url: string;
  call<T = Record<string, unknown>>(method: string, body?: unknown): Promise<T>;
  /** GET /openapi.json; given the ETag of a copy at hand, undefined when the API answers it is unchanged (304). */
  openapi(etag?: string): Promise<{ document: OpenApiDocument; etag?: string } | undefined>;
}

export interface OpenApiDocument {
  paths: Record<string, { post?: OpenApiOperation }>;
}

export interface OpenApiOperation {
  operationId: string;
  summary?: string;
  tags?: string[];
  requestBody?: { content?: { "application/json"?: { schema?: JsonSchema } } };
  responses?: Record<string, { content?: { "application/json"?: { schema?: JsonSchema } } }>;
}

export interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  additionalProperties?: boolean | JsonSchema;
  items?: JsonSchema;
  enum?: unknown[];
  const?: unknown;
  anyOf?: JsonSchema[];
  default?: unknown;
  description?: string;
}

const REQUEST_TIMEOUT_MS = 30_000;

export function createApi(connection: Connection): Api {
  return {
    url: connection.url,
    async call<T>(method: string, body: unknown = {}) {
      const res = await request(`${connection.url}/v1/${method}`, {
        method: "POST",
        headers: { authorization: `Bearer ${connection.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return answer(res) as T;
    },
    async openapi(etag?: string) {
      const res = await request(`${connection.url}/openapi.json`, { headers: etag ? { "if-none-match": etag } : {} });
      if (res.status === 304) return undefined;
      const tag = res.headers.etag;
      return { document: answer(res) as OpenApiDocument, ...(tag ? { etag: tag } : {}) };
    },
  };

  async function request(url: string, init: Outgoing): Promise<Answer> {
    const signal = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    try {
      return await exchange(url, init, signal);
    } catch {
      const why = signal.aborted ? "no answer within 30 s" : "the connection failed";
      throw new ApiError("UNAVAILABLE", `cannot reach ${connection.url} (${why}; from ${connection.source}): is it running?`);
    }
  }
}

interface Outgoing {
  method?: string;
  headers: Record<string, string>;
  body?: string;
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
}

/**
 * One request and its whole answer, through node:http (node:https loaded only for an https URL)
 * rather than fetch: fetch's first use loads undici, which costs a CLI call about 40 ms.
 */
async function exchange(url: string, init: Outgoing, signal: AbortSignal): Promise<Answer> {
  const target = new URL(url);
  const client = target.protocol === "https:" ? await import("node:https") : http;
  return new Promise((resolve, reject) => {
    const length = init.body === undefined ? {} : { "content-length": String(Buffer.byteLength(init.body)) };
    const req = client.request(target, { method: init.method ?? "GET", headers: { ...init.headers, ...length }, signal }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(init.body);
  });
}

function answer(res: Answer): unknown {
  const requestId = typeof res.headers["x-request-id"] === "string" ? res.headers["x-request-id"] : undefined;
  const ok = res.status >= 200 && res.status < 300;
  let parsed: unknown;
  try {
    parsed = res.text ? JSON.parse(res.text) : {};
  } catch {
    throw new ApiError(ok ? "INTERNAL" : `HTTP_${res.status}`, `the API answered ${res.status} with a body that is not JSON`, requestId);
  }
  if (ok) return parsed;
  const error = parsed as { code?: unknown; message?: unknown; details?: unknown; requestId?: unknown };
  throw new ApiError(
    typeof error.code === "string" ? error.code : `HTTP_${res.status}`,
    typeof error.message === "string" ? error.message : (http.STATUS_CODES[res.status] ?? `HTTP ${res.status}`),
    typeof error.requestId === "string" ? error.requestId : requestId,
    error.details,
  );
}
