// /openapi.json, generated from the registered methods' zod schemas.
import { z } from "zod";
import { errorStatus } from "./errors.ts";
import type { Registry } from "./registry.ts";

const errorSchema = {
  type: "object",
  required: ["code", "message", "requestId"],
  properties: {
    code: { type: "string", enum: Object.keys(errorStatus) },
    message: { type: "string" },
    details: { type: "object", additionalProperties: true },
    /** Also the response's x-request-id header and the server log line's requestId. */
    requestId: { type: "string" },
  },
};

export function openApiDocument(registry: Registry, info: { baseURL?: string }): Record<string, unknown> {
  const paths: Record<string, unknown> = {
    "/v1/health": {
      get: {
        operationId: "health",
        summary: "Whether the API and its database are reachable",
        security: [],
        responses: { "200": { description: "healthy" }, "503": errorResponse("the database is unreachable") },
      },
    },
  };
  for (const { method, module } of registry.methods.values()) {
    const input = strictObjects(jsonSchema(method.input, "input"));
    paths[`/v1/${method.name}`] = {
      post: {
        operationId: method.name,
        summary: method.description ?? method.name,
        tags: [module.id],
        "x-iam-action": method.action,
        // An empty body reads as {}: it is optional exactly when the input requires no field.
        requestBody: { required: hasRequired(input), content: { "application/json": { schema: input } } },
        responses: {
          "200": { description: "OK", content: { "application/json": { schema: jsonSchema(method.output, "output") } } },
          "400": errorResponse(
            "INVALID_ARGUMENT: malformed JSON, a body that breaks the schema or the input rules (unknown keys, nesting, control characters)",
          ),
          "401": errorResponse("UNAUTHENTICATED"),
          "403": errorResponse("PERMISSION_DENIED"),
          "413": errorResponse("PAYLOAD_TOO_LARGE"),
          default: errorResponse("any other error (NOT_FOUND, CONFLICT, FAILED_PRECONDITION, UNAVAILABLE, ...), same body"),
        },
      },
    };
  }
  return {
    openapi: "3.1.0",
    info: { title: "Better Compute API", version: "v1" },
    servers: info.baseURL ? [{ url: info.baseURL }] : [],
    security: [{ bearer: [] }],
    components: { securitySchemes: { bearer: { type: "http", scheme: "bearer" } }, schemas: { Error: errorSchema } },
    paths,
  };
}

/** A zod schema as JSON Schema ({} where zod cannot say): for the document, and for drivers.list's manifests. */
export function jsonSchema(schema: z.ZodType, io: "input" | "output"): unknown {
  try {
    const { $schema: _, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Record<string, unknown>;
    return rest;
  } catch {
    return {};
  }
}

/**
 * The API refuses keys an object's schema does not declare (core/http.ts); zod's JSON Schema
 * leaves that open for input, so it is written here. Records and loose objects already say
 * what they take (additionalProperties), and are left as they are.
 */
function strictObjects(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(strictObjects);
  if (schema === null || typeof schema !== "object") return schema;
  const out: Record<string, unknown> = Object.fromEntries(Object.entries(schema).map(([k, v]) => [k, strictObjects(v)]));
  if (out.type === "object" && out.properties !== undefined && out.additionalProperties === undefined) out.additionalProperties = false;
  return out;
}

function hasRequired(schema: unknown): boolean {
  const required = (schema as { required?: unknown } | null)?.required;
  return Array.isArray(required) && required.length > 0;
}

function errorResponse(description: string) {
  return { description, content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } } };
}
