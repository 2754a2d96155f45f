// betterCompute(): the one entry a deployment calls. It checks every registration at once
// (INVALID_CONFIG naming the offender), resolves the ports and composes the Workers' apps: every
// router is mounted here, on the HTTP shell they share (core/http.ts).
import type { Hono } from "hono";
import { etag } from "hono/etag";
import { methodRoutes } from "./api.ts";
import type { Bindings } from "./bindings.ts";
import { auditModule } from "./audit.ts";
import { consoleRoutes } from "./console/routes.tsx";
import { coreModule } from "./core-module.ts";
import { checkSinks } from "./events/dispatch.ts";
import { sinksModule } from "./events/module.ts";
import { watchRoutes } from "./events/watch.ts";
import { metricsRoutes } from "./metrics/routes.ts";
import type { ApprovalsPort, Approvers, BlobStore, CapacityPort, Clock, PlatformContext, RegisteredView, SecretStore } from "./context.ts";
import { databaseClock, databaseCommands, databaseEvents, databaseNodes, databaseSecrets, databaseWork } from "./store/ports.ts";
import { noBlobs, r2Blobs } from "./store/blobs.ts";
import { frameBudgets, type FrameBudgets } from "./agents/frame-budget.ts";
import { gatewayRoutes, joinRoutes } from "./agents/join.ts";
import { agentsModule } from "./agents/module.ts";
import { databaseNodeSpecs } from "./agents/node-specs.ts";
import { SINKS_OBJECT, wakeObjects } from "./agents/notify.ts";
import type { Migration, Module, ReconcileCause } from "./contracts.ts";
import { hex } from "./encoding.ts";
import { ComputeError, invalidConfig } from "./errors.ts";
import { serviceApp, type AppEnv } from "./http.ts";
import { mintJoinToken } from "./agents/tokens.ts";
import { builtinIam, mintApiKey, type IamPort, type IamProvider, type Principal } from "./iam.ts";
import { createLogger } from "./log.ts";
import { openApiDocument } from "./openapi.ts";
import { buildRegistry, type Registry, type RegistryInput } from "./registry.ts";
import { postgres, type DatabasePort, type Store } from "./store/database.ts";
import { applyMigrations, type MigrationReport } from "./store/migrate.ts";

export interface PkiOptions {
  /**
   * Quorum for destructive commands (docs/quorum.md): a workflow that sends any waits until
   * `threshold` of these Ed25519 public keys (raw, base64url) signed its batch (workflows.approve).
   */
  approvers?: { keys: string[]; threshold: number };
}

export interface ComputeOptions extends RegistryInput {
  /** The system of record; default postgres() (env.DATABASE_URL). */
  database?: DatabasePort;
  /** Deployment secret sealing stored secrets and signing credentials; default env.BC_SECRET. */
  secret?: string;
  /** Public URL of the API, as written into the OpenAPI document. */
  baseURL?: string;
  /** default builtinIam() */
  iam?: IamProvider;
  /** Business time; default compute_now() in the database. */
  clock?: (store: Store) => Clock;
  /** Where secrets are sealed; default the bc_secrets table. */
  secrets?: (store: Store, secret: string) => SecretStore;
  /** Where blobs (rendered ISOs, config drives) are kept; default the R2 bucket bound as BLOBS, else none (FAILED_PRECONDITION on use). */
  blobs?: (env: Bindings) => BlobStore;
  pki?: PkiOptions;
  limits?: {
    maxBodyBytes?: number;
    /** What one agent socket may send (core/agents/frame-budget.ts, docs/agent-protocol.md); default DEFAULT_FRAME_BUDGETS. */
    agentFrames?: Partial<FrameBudgets>;
  };
}

export interface Compute {
  readonly registry: Registry;
  readonly iam: IamPort;
  /** The API Worker's app: every method, JoinService, the agent gateway. */
  readonly app: Hono<AppEnv>;
  /** The join Worker's app (workers/join): JoinService and /v1/health alone. */
  readonly joinApp: Hono<AppEnv>;
  readonly options: Readonly<ComputeOptions>;
  /** What one agent socket may send before its NodeDO drops frames and then closes it. */
  readonly frameBudgets: FrameBudgets;
  /** The Worker's fetch handler: `export default compute`. */
  fetch(request: Request, env: Bindings, ctx?: ExecutionContext): Promise<Response>;
  /** Module migrations in apply order (core migrations live in migrations/core). */
  migrations(): Migration[];
  openapi(): Record<string, unknown>;
  /** A module's ports outside a request (Durable Objects, reconcilers, scripts). */
  moduleContext(moduleId: string, env: Bindings, store: Store): PlatformContext;
  /** Opens the system of record through the deployment's database port. */
  openStore(env: Bindings): Store;
  /** Applies the modules' migrations (core migrations are applied by `npm run migrate`). */
  applyModuleMigrations(store: Store): Promise<MigrationReport>;
  /** Runs every module's reconcilers once; returns how many things they changed (a failing one is logged and skipped). */
  reconcile(env: Bindings, store: Store, cause?: ReconcileCause): Promise<number>;
  /** Runs one module's reconcilers once, on a store of their own (the NodeDO, when a section the module owns was observed changed). */
  reconcileModule(moduleId: string, env: Bindings): Promise<void>;
  /** The cron handler's work: every module's sweeps, then every reconciler; returns how many things they changed. */
  sweep(env: Bindings, store: Store): Promise<number>;
  /** Mints an API key in its own transaction (npm start, tests, operators' scripts). */
  mintApiKey(store: Store, input: { name: string; roles: string[]; createdBy?: string }): Promise<{ id: string; key: string }>;
}

const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;

export function betterCompute(options: ComputeOptions = {}): Compute {
  let registry: Registry | undefined;
  let iam: IamPort | undefined;
  const core = coreModule({ registry: () => registry!, iam: () => iam! });
  const agents = agentsModule({ sections: () => registry!.nodeSpecSections });
  registry = buildRegistry([core, agents, auditModule(), sinksModule()], options);
  const hasSinks = checkSinks(registry.byContract("sink")).length > 0;
  const capacityProviders = registry.modules.filter((m) => m.ports?.capacity);
  if (capacityProviders.length > 1) {
    throw invalidConfig(`capacity is provided by more than one module: ${capacityProviders.map((m) => m.id).join(", ")}`, {
      modules: capacityProviders.map((m) => m.id),
    });
  }
  const capacityProvider = capacityProviders[0];
  const approvalsProviders = registry.modules.filter((m) => m.ports?.approvals);
  if (approvalsProviders.length > 1) {
    throw invalidConfig(`approvals are provided by more than one module: ${approvalsProviders.map((m) => m.id).join(", ")}`, {
      modules: approvalsProviders.map((m) => m.id),
    });
  }
  const approvalsProvider = approvalsProviders[0];
  iam = (options.iam ?? builtinIam())(registry.catalog);
  const database = options.database ?? postgres();
  const maxBodyBytes = options.limits?.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  if (!Number.isInteger(maxBodyBytes) || maxBodyBytes <= 0) throw invalidConfig("limits.maxBodyBytes must be a positive integer");
  const budgets = frameBudgets(options.limits?.agentFrames);

  const approvers = checkApprovers(options.pki?.approvers, approvalsProvider !== undefined);
  const reg = registry;
  const registered: RegisteredView = {
    extensions: <T extends { contract: string }>(contract: string) => reg.byContract(contract as never) as unknown as T[],
    commandKind: (kind) => reg.commandKinds.get(kind)?.command,
  };
  const blobsFor = (env: Bindings): BlobStore => options.blobs?.(env) ?? (env.BLOBS ? r2Blobs(env.BLOBS) : noBlobs);
  const contextFor = (mod: Module, env: Bindings, store: Store, principal?: Principal, requestId?: string): PlatformContext => {
    const log = createLogger({ module: mod.id, ...(requestId ? { requestId } : {}) });
    let secrets: SecretStore | undefined;
    let capacity: CapacityPort | undefined;
    let approvals: ApprovalsPort | undefined;
    const touchedNodes = new Set<string>();
    const touchedWorkflows = new Set<string>();
    let wroteOutbox = false;
    const wake = {
      node: (id: string) => void touchedNodes.add(id),
      workflow: (id: string) => void touchedWorkflows.add(id),
      sinks: () => void (wroteOutbox = hasSinks),
    };
    const published = databaseEvents(mod.id, principal?.id, requestId);
    const events: typeof published = {
      publish: (tx, event) => (wake.sinks(), published.publish(tx, event)),
      insertSql: (written) => (wake.sinks(), published.insertSql(written)),
    };
    const ctx: PlatformContext = {
      moduleId: mod.id,
      env,
      store,
      events,
      work: databaseWork(mod.id),
      commands: databaseCommands(
        mod.id,
        reg.commandKinds,
        (nodeId) => touchedNodes.add(nodeId),
        // The provider's port over its own context, as capacity's.
        approvers && approvalsProvider
          ? () =>
              (approvals ??= approvalsProvider.ports!.approvals!(
                mod === approvalsProvider ? ctx : contextFor(approvalsProvider, env, store, principal, requestId),
              ))
          : undefined,
      ),
      wake,
      nodes: databaseNodes(events, wake),
      nodeSpecs: databaseNodeSpecs(mod.id, store, reg.nodeSpecSections, events, wake),
      registered,
      async afterCommit() {
        const nodes = [...touchedNodes];
        const workflows = [...touchedWorkflows];
        const sinks = wroteOutbox ? [SINKS_OBJECT] : [];
        touchedNodes.clear();
        touchedWorkflows.clear();
        wroteOutbox = false;
        await Promise.all([
          wakeObjects(env, "node", nodes, log),
          wakeObjects(env, "workflow", workflows, log),
          wakeObjects(env, "sinks", sinks, log),
        ]);
      },
      clock: (options.clock ?? databaseClock)(store),
      blobs: blobsFor(env),
      // Resolved on first use: a deployment without BC_SECRET serves everything that needs no secret.
      get secrets() {
        return (secrets ??= (options.secrets ?? databaseSecrets)(store, deploymentSecret(options, env)));
      },
      // The provider's port over its own context (its events name it), built on first use.
      get capacity() {
        if (!capacityProvider) return noCapacity;
        return (capacity ??= capacityProvider.ports!.capacity!(
          mod === capacityProvider ? ctx : contextFor(capacityProvider, env, store, principal, requestId),
        ));
      },
      pki: {
        approvers,
        async mintJoinToken(tx, input) {
          const nodeId = input.nodeId ?? `n-${hex(crypto.getRandomValues(new Uint8Array(8)))}`;
          const minted = await mintJoinToken(tx, { ...input, attestor: "provisioned", nodeId, createdBy: `module:${mod.id}` });
          return { token: minted.token, tokenId: minted.id, nodeId, expiresAt: minted.expiresAt };
        },
      },
      log,
    };
    mod.setup?.(ctx);
    return ctx;
  };

  let openapi: Record<string, unknown> | undefined;
  const openapiDoc = () => (openapi ??= openApiDocument(reg, { baseURL: options.baseURL }));
  const modules = reg.modules.map((m) => m.id);
  const join = joinRoutes({ registry: reg, agentsContext: (env, store) => contextFor(agents, env, store) });
  // The API Worker's app: /v1/health, /openapi.json, JoinService, the agent gateway, every method.
  const app = serviceApp({ database, modules });
  app.get("/openapi.json", etag(), (c) => c.json(openapiDoc())); // the ETag lets the CLI revalidate its cached copy (304)
  app.route("/", join);
  app.route("/", gatewayRoutes({ blobs: blobsFor }));
  const reconcileModule = async (mod: Module, env: Bindings) => {
    const store = database.open(env);
    try {
      await runPasses("reconcilers", env, store, mod);
    } finally {
      await store.close();
    }
  };
  app.route("/", methodRoutes({ registry: reg, iam, maxBodyBytes, moduleContext: contextFor, reconcileModule }));
  app.route("/", watchRoutes({ iam, openStore: (env) => database.open(env) }));
  app.route(
    "/",
    consoleRoutes({
      registry: reg,
      iam,
      maxBodyBytes,
      moduleContext: contextFor,
      reconcileModule,
      openStore: (env) => database.open(env),
      approvers,
    }),
  );
  app.route("/", metricsRoutes({ iam, modules: reg.modules, moduleContext: contextFor }));
  // The join Worker's app: JoinService and /v1/health alone (the gateway needs the NodeDO binding).
  const joinApp = serviceApp({ database, modules });
  joinApp.route("/", join);

  /** Runs one kind of pass of every module once, in registration order; a failing pass is logged and skipped, the next run retries it. */
  const runPasses = async (kind: "sweeps" | "reconcilers", env: Bindings, store: Store, only?: Module, cause?: ReconcileCause) => {
    let changed = 0;
    for (const mod of only ? [only] : reg.modules) {
      for (const pass of mod[kind] ?? []) {
        const ctx = contextFor(mod, env, store);
        try {
          changed += await pass.run(ctx, cause);
        } catch (err) {
          const what = kind === "sweeps" ? "sweep" : "reconciler";
          ctx.log.warn(`a ${what} pass failed; the next pass retries`, {
            [what]: pass.id,
            error: err instanceof Error ? err.message : String(err),
          });
        }
        await ctx.afterCommit();
      }
    }
    return changed;
  };

  return {
    registry: reg,
    iam,
    app,
    joinApp,
    options,
    frameBudgets: budgets,
    fetch: (request, env, ctx) => Promise.resolve(app.fetch(request, env, ctx)),
    migrations: () => reg.migrations,
    openapi: openapiDoc,
    openStore: (env) => database.open(env),
    applyModuleMigrations: (store) => applyMigrations(store, reg.migrations),
    mintApiKey: (store, input) =>
      store.transaction((tx) => mintApiKey(tx, { ...input, createdBy: input.createdBy ?? "system:operator" }, iam!.roles())),
    reconcile: (env, store, cause) => runPasses("reconcilers", env, store, undefined, cause),
    async reconcileModule(moduleId, env) {
      const mod = reg.modules.find((m) => m.id === moduleId);
      if (mod) await reconcileModule(mod, env);
    },
    sweep: async (env, store) => (await runPasses("sweeps", env, store)) + (await runPasses("reconcilers", env, store)),
    moduleContext(moduleId, env, store) {
      const mod = reg.modules.find((m) => m.id === moduleId);
      if (!mod) throw invalidConfig(`no module ${moduleId} is registered`);
      return contextFor(mod, env, store);
    },
  };
}

/** ctx.capacity of a deployment without a capacity module: every call says so. */
const noCapacity: CapacityPort = {
  reserve: missingCapacity,
  hold: missingCapacity,
  release: missingCapacity,
  explain: missingCapacity,
};
async function missingCapacity(): Promise<never> {
  throw new ComputeError(
    "FAILED_PRECONDITION",
    "no capacity module is registered: add capacity() (better-compute/capacity) to the modules",
  );
}

/** pki.approvers as given, checked: distinct raw Ed25519 keys, a threshold they can reach, workflows to carry the batches. */
function checkApprovers(approvers: PkiOptions["approvers"], approvalsProvided: boolean): Approvers | undefined {
  if (approvers === undefined) return undefined;
  const keys = approvers.keys ?? [];
  const malformed = keys.findIndex((key) => typeof key !== "string" || !ED25519_PUBLIC_KEY.test(key));
  if (malformed >= 0)
    throw invalidConfig(`pki.approvers.keys[${malformed}] is not an Ed25519 public key (32 bytes, raw, base64url: 43 characters)`);
  const duplicate = keys.findIndex((key, i) => keys.indexOf(key) !== i);
  if (duplicate >= 0) throw invalidConfig(`pki.approvers.keys[${duplicate}] is listed twice: each approver counts once`);
  const { threshold } = approvers;
  if (!Number.isInteger(threshold) || threshold < 1 || threshold > keys.length)
    throw invalidConfig(
      `pki.approvers.threshold must be an integer from 1 to the number of keys (${keys.length}), not ${String(threshold)}`,
    );
  if (!approvalsProvided)
    throw invalidConfig(
      "pki.approvers needs the provision module, or another module that provides ports.approvals: destructive commands are approved as a workflow's batch",
    );
  return { keys: [...keys], threshold };
}
const ED25519_PUBLIC_KEY = /^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$/;

function deploymentSecret(options: ComputeOptions, env: Bindings): string {
  const secret = options.secret ?? env.BC_SECRET;
  if (typeof secret !== "string" || secret.length < 32) {
    throw invalidConfig("the deployment secret is missing or shorter than 32 characters: set BC_SECRET (wrangler secret put BC_SECRET)");
  }
  return secret;
}
