// The CLI's HTTP client: POST /v1/<method> with the API key, GET /openapi.json. A refusal is
// an ApiError carrying the API's code, message and request id.
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
  openapi(): Promise<OpenApiDocument>;
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
  let document: Promise<OpenApiDocument> | undefined;
  return {
    url: connection.url,
    async call<T>(method: string, body: unknown = {}) {
      const res = await request(`${connection.url}/v1/${method}`, {
        method: "POST",
        headers: { authorization: `Bearer ${connection.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return (await answer(res)) as T;
    },
    openapi() {
      return (document ??= request(`${connection.url}/openapi.json`).then((res) => answer(res) as Promise<OpenApiDocument>));
    },
  };

  async function request(url: string, init: RequestInit = {}): Promise<Response> {
    try {
      return await fetch(url, { ...init, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    } catch (err) {
      const why = err instanceof Error && err.name === "TimeoutError" ? "no answer within 30 s" : "the connection failed";
      throw new ApiError("UNAVAILABLE", `cannot reach ${connection.url} (${why}; from ${connection.source}): is it running?`);
    }
  }
}

async function answer(res: Response): Promise<unknown> {
  const requestId = res.headers.get("x-request-id") ?? undefined;
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : {};
  } catch {
    throw new ApiError(
      res.ok ? "INTERNAL" : `HTTP_${res.status}`,
      `the API answered ${res.status} with a body that is not JSON`,
      requestId,
    );
  }
  if (res.ok) return parsed;
  const error = parsed as { code?: unknown; message?: unknown; details?: unknown; requestId?: unknown };
  throw new ApiError(
    typeof error.code === "string" ? error.code : `HTTP_${res.status}`,
    typeof error.message === "string" ? error.message : res.statusText,
    typeof error.requestId === "string" ? error.requestId : requestId,
    error.details,
  );
}
