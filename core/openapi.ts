// /openapi.json, generated from the registered methods' zod schemas.
import { z } from "zod";
import { errorStatus } from "./errors.ts";
import type { Registry } from "./registry.ts";

const errorSchema = {
  type: "object",
  required: ["code", "message"],
  properties: {
    code: { type: "string", enum: Object.keys(errorStatus) },
    message: { type: "string" },
    details: { type: "object", additionalProperties: true },
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
    paths[`/v1/${method.name}`] = {
      post: {
        operationId: method.name,
        summary: method.description ?? method.name,
        tags: [module.id],
        "x-iam-action": method.action,
        requestBody: { required: false, content: { "application/json": { schema: jsonSchema(method.input, "input") } } },
        responses: {
          "200": { description: "OK", content: { "application/json": { schema: jsonSchema(method.output, "output") } } },
          "400": errorResponse("INVALID_ARGUMENT: malformed JSON or a body that breaks the schema"),
          "401": errorResponse("UNAUTHENTICATED"),
          "403": errorResponse("PERMISSION_DENIED"),
          "413": errorResponse("PAYLOAD_TOO_LARGE"),
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

function jsonSchema(schema: z.ZodType, io: "input" | "output"): unknown {
  try {
    const { $schema: _, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Record<string, unknown>;
    return rest;
  } catch {
    return {};
  }
}

function errorResponse(description: string) {
  return { description, content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } } };
}
