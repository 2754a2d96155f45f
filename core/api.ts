// The API's methods: one POST route per registered method (/v1/<name>), generated from the
// registry: the body limit, the input rules and zod validation at the edge, IAM before the
// transaction, the handler and its audit row in one transaction (the row sent with the COMMIT; a
// handler that sends nothing opens no transaction: core/store/database.ts), the output checked.
import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { MethodDefinition, Module } from "./contracts.ts";
import type { MethodContext, PlatformContext } from "./context.ts";
import { ComputeError } from "./errors.ts";
import { hasExecutionContext, readInput, waitUntil, type AppEnv } from "./http.ts";
import type { IamPort, Principal } from "./iam.ts";
import type { Registry } from "./registry.ts";
import type { Bindings } from "./bindings.ts";
import { literal, sendWithCommit, type Store } from "./store/database.ts";

export interface MethodDeps {
  registry: Registry;
  iam: IamPort;
  maxBodyBytes: number;
  moduleContext: (mod: Module, env: Bindings, store: Store, principal?: Principal, requestId?: string) => PlatformContext;
  /** Runs one module's reconcilers once, on a store of their own (MethodDefinition.reconcile). */
  reconcileModule: (mod: Module, env: Bindings) => Promise<void>;
}

/** Every registered method as POST /v1/<name>, behind the body limit. */
export function methodRoutes(deps: MethodDeps): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: deps.maxBodyBytes,
      onError: () => {
        throw new ComputeError("PAYLOAD_TOO_LARGE", `the request body is larger than ${deps.maxBodyBytes} bytes`, {
          maxBytes: deps.maxBodyBytes,
        });
      },
    }),
  );
  for (const { method, module } of deps.registry.methods.values()) {
    app.post(`/v1/${method.name}`, (c) => invoke(c, deps, module, method));
  }
  return app;
}

async function invoke(c: Context<AppEnv>, deps: MethodDeps, mod: Module, method: MethodDefinition): Promise<Response> {
  c.set("method", method.name);
  const principal = await deps.iam.authenticate(c.req.raw, c.get("store"));
  if (!principal) throw new ComputeError("UNAUTHENTICATED", "credentials are required: send 'Authorization: Bearer <API key>'");
  return c.json((await callMethod(c, deps, { module: mod, method }, principal, await readInput(c, method.input))) as object);
}

/**
 * One method called as `principal` with its checked input: IAM, admission, the handler and its
 * audit row in one transaction, the output checked. The API's routes and the console
 * (core/console/) both call it, so a console page is decided exactly as the API call would be.
 */
export async function callMethod(
  c: Context<AppEnv>,
  deps: MethodDeps,
  { module: mod, method }: { module: Module; method: MethodDefinition },
  principal: Principal,
  input: unknown,
): Promise<unknown> {
  c.set("method", method.name);
  const store = c.get("store");
  const resource = method.resource?.(input) ?? "*";
  if (!(await deps.iam.authorize(principal, method.action, resource))) {
    throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not ${method.action} on ${resource}`, {
      action: method.action,
      resource,
    });
  }

  let inTransaction = false;
  const platform = deps.moduleContext(mod, c.env ?? {}, store, principal, c.get("requestId"));
  // Inherit rather than spread: spreading would resolve lazy ports (secrets) on every call.
  const ctx: MethodContext = Object.assign(Object.create(platform) as PlatformContext, {
    principal,
    requestId: c.get("requestId"),
    async check(action: string, checkResource = "*") {
      // Rule 2: IAM is decided before a transaction opens, never awaited inside one.
      if (inTransaction) throw new ComputeError("INTERNAL", `ctx.check(${action}) was called inside ${method.name}'s transaction`);
      if (!(await deps.iam.authorize(principal, action, checkResource))) {
        throw new ComputeError("PERMISSION_DENIED", `${principal.id} may not ${action} on ${checkResource}`, {
          action,
          resource: checkResource,
        });
      }
    },
  });

  await method.admission?.(ctx, input);
  const output = await store.transaction(async (tx) => {
    inTransaction = true;
    try {
      const result = await method.handler(ctx, input, tx);
      if (!method.readOnly) {
        // Sent with the COMMIT: one round trip fewer than a statement of its own.
        const row = [principal.id, method.action, resource, method.name, c.get("requestId")].map(literal).join(", ");
        await sendWithCommit(tx, `INSERT INTO bc_audit (actor, action, resource, method, request_id) VALUES (${row})`);
        platform.wake.sinks(); // audit sinks hear of it after commit
      }
      return result;
    } finally {
      inTransaction = false;
    }
  });

  // Wake the NodeDOs of enqueued commands without holding the response for their delivery.
  waitUntil(c, platform.afterCommit());
  // Without an execution context (a test calling app.fetch) nothing runs behind the caller's back.
  if (method.reconcile && hasExecutionContext(c)) waitUntil(c, deps.reconcileModule(mod, c.env ?? {}));
  const checked = method.output.safeParse(output);
  if (!checked.success) {
    throw new ComputeError("INTERNAL", `method ${method.name} returned a result that breaks its output schema`);
  }
  return checked.data;
}
