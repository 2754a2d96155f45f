// The API Worker's hono app, generated from the registered methods: one POST route per
// method, zod validation at the edge, IAM before the transaction, one onError.
import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { sql } from "drizzle-orm";
import type { z } from "zod";
import type { MethodDefinition, Module } from "./contracts.ts";
import { agentRoutes } from "./agents/join.ts";
import type { PlatformContext } from "./compute.ts";
import type { MethodContext } from "./context.ts";
import { ComputeError, invalidArgument, isComputeError, schemaIssues } from "./errors.ts";
import type { IamPort, Principal } from "./iam.ts";
import { createLogger } from "./log.ts";
import type { Registry } from "./registry.ts";
import { fromPostgresError, type DatabasePort, type Store } from "./store/database.ts";
import { audit } from "./store/schema.ts";

/** The Worker's bindings (vars and secrets), read by name. */
export type Env = Record<string, unknown>;
export type AppEnv = { Bindings: Env; Variables: { store: Store; requestId: string } };

export interface ApiDeps {
  registry: Registry;
  iam: IamPort;
  database: DatabasePort;
  maxBodyBytes: number;
  openapi: () => unknown;
  agentsModule: Module;
  moduleContext: (mod: Module, env: Env, store: Store, principal?: Principal, requestId?: string) => PlatformContext;
}

const log = createLogger({ component: "api" });

export function createApi(deps: ApiDeps): Hono<AppEnv> {
  const app = new Hono<AppEnv>();

  app.use("*", async (c, next) => {
    const requestId = crypto.randomUUID();
    c.set("requestId", requestId);
    c.header("x-request-id", requestId);
    const store = deps.database.open(c.env ?? {});
    c.set("store", store);
    try {
      await next();
    } finally {
      // Pools never outlive their request; closing must not hold the response back.
      waitUntil(c, store.close());
    }
  });

  app.get("/v1/health", async (c) => {
    try {
      await c.var.store.db.execute(sql`SELECT 1`);
    } catch {
      throw new ComputeError("UNAVAILABLE", "the database is unreachable", { database: "unreachable" });
    }
    return c.json({ status: "ok", database: "reachable", modules: deps.registry.modules.map((m) => m.id) });
  });

  app.get("/openapi.json", (c) => c.json(deps.openapi()));

  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: deps.maxBodyBytes,
      onError: () => {
        throw new ComputeError("PAYLOAD_TOO_LARGE", `the request body is larger than ${deps.maxBodyBytes} bytes`, { maxBytes: deps.maxBodyBytes });
      },
    }),
  );

  app.route("/", agentRoutes({ registry: deps.registry, agentsModule: deps.agentsModule, moduleContext: deps.moduleContext }));

  for (const { method, module } of deps.registry.methods.values()) {
    app.post(`/v1/${method.name}`, (c) => invoke(c, deps, module, method));
  }

  app.notFound((c) => c.json(new ComputeError("NOT_FOUND", `no route for ${c.req.method} ${new URL(c.req.url).pathname}`).toJSON(), 404));

  app.onError((err, c) => {
    const error = toComputeError(err);
    if (error.code === "INTERNAL") log.error("unhandled error", { requestId: c.var.requestId, ...describeError(err) });
    return c.json(error.toJSON(), error.status as 400);
  });

  return app;
}

async function invoke(c: Context<AppEnv>, deps: ApiDeps, mod: Module, method: MethodDefinition): Promise<Response> {
  const store = c.var.store;
  const principal = await deps.iam.authenticate(c.req.raw, store);
  if (!principal) throw new ComputeError("UNAUTHENTICATED", "credentials are required: send 'Authorization: Bearer <API key>'");

  const input = parseInput(method.input, await readJson(c.req.raw));
  const resource = method.resource?.(input) ?? "*";
  if (!(await deps.iam.authorize(principal, method.action, resource))) {
    throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not ${method.action} on ${resource}`, { action: method.action, resource });
  }

  let inTransaction = false;
  const platform = deps.moduleContext(mod, c.env ?? {}, store, principal, c.var.requestId);
  // Inherit rather than spread: spreading would resolve lazy ports (secrets) on every call.
  const ctx: MethodContext = Object.assign(Object.create(platform) as PlatformContext, {
    principal,
    requestId: c.var.requestId,
    async check(action: string, checkResource = "*") {
      // Rule 2: IAM is decided before a transaction opens, never awaited inside one.
      if (inTransaction) throw new ComputeError("INTERNAL", `ctx.check(${action}) was called inside ${method.name}'s transaction`);
      if (!(await deps.iam.authorize(principal, action, checkResource))) {
        throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not ${action} on ${checkResource}`, { action, resource: checkResource });
      }
    },
  });

  await method.admission?.(ctx, input);
  const output = await store.transaction(async (tx) => {
    inTransaction = true;
    try {
      const result = await method.handler(ctx, input, tx);
      if (!method.readOnly) {
        await tx.insert(audit).values({ actor: principal.id, action: method.action, resource, method: method.name, requestId: c.var.requestId });
      }
      return result;
    } finally {
      inTransaction = false;
    }
  });

  // Wake the NodeDOs of enqueued commands without holding the response for their delivery.
  waitUntil(c, platform.afterCommit());
  const checked = method.output.safeParse(output);
  if (!checked.success) {
    throw new ComputeError("INTERNAL", `method ${method.name} returned a result that breaks its output schema`);
  }
  return c.json(checked.data as object);
}

export async function readJson(request: Request): Promise<unknown> {
  const text = await request.text();
  if (text.trim() === "") return {};
  try {
    return JSON.parse(text);
  } catch {
    throw invalidArgument("the request body is not valid JSON");
  }
}

export function parseInput<T extends z.ZodType>(schema: T, body: unknown): z.output<T> {
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  const issues = schemaIssues(parsed.error);
  throw invalidArgument(`the request body does not match the method's input: ${issues.map((i) => `${i.path || "(root)"}: ${i.message}`).join("; ")}`, { issues });
}

export function toComputeError(err: unknown): ComputeError {
  if (isComputeError(err)) return err;
  const fromPg = fromPostgresError(err);
  if (fromPg) return fromPg;
  return new ComputeError("INTERNAL", "internal error");
}

/**
 * What the log may say about an unexpected error: its name, SQLSTATE and innermost message with
 * quoted values elided. Never a wrapped driver error's text, which carries the query's parameters.
 */
export function describeError(err: unknown): Record<string, string | undefined> {
  let inner = err;
  while (inner instanceof Error && inner.cause instanceof Error) inner = inner.cause;
  const sqlstate = (inner as { code?: unknown } | null)?.code;
  return {
    error: err instanceof Error ? err.name : typeof err,
    sqlstate: typeof sqlstate === "string" && /^[0-9A-Z]{5}$/.test(sqlstate) ? sqlstate : undefined,
    detail: inner instanceof Error ? inner.message.replace(/"[^"]*"|'[^']*'/g, "…") : undefined,
  };
}

function waitUntil(c: Context<AppEnv>, promise: Promise<unknown>): void {
  try {
    c.executionCtx.waitUntil(promise);
  } catch {
    // No execution context (called from Node): the promise settles on its own.
  }
}
