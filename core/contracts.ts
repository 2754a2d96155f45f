// The typed contracts a module, plugin or extension is declared with. define* helpers check
// what can be checked alone (ids, names); the registry checks what needs the whole picture.
import type { z } from "zod";
import type { ApprovalsPort, CapacityPort, HostView, MethodContext, ModuleContext, PlacementRequest, PlatformContext } from "./context.ts";
import type { Bindings } from "./bindings.ts";
import { invalidConfig } from "./errors.ts";
import type { Logger } from "./log.ts";
import type { MetricFamily } from "./metrics/openmetrics.ts";
import type { Tx } from "./store/database.ts";

const ID = /^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*$/;
const METHOD_NAME = /^[a-z][a-zA-Z0-9]*(\.[a-z][a-zA-Z0-9]*)+$/;

// ---------------------------------------------------------------- methods

/** A method as it is declared to defineMethod: its action may be left out. */
export interface MethodDeclaration<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  /** Route name: POST /v1/<name>. Dotted, e.g. "widgets.create". */
  name: string;
  /** IAM action; must be in the catalog of a registered module. Default: the name. */
  action?: string;
  /** The resource the action is checked against; default "*". */
  resource?: (input: z.output<I>) => string;
  description?: string;
  /** A read-only method writes no audit row. */
  readOnly?: boolean;
  /**
   * Once the method commits, run its module's reconcilers in the background of the request (a
   * Worker's waitUntil), so what it asked for starts now rather than at the next cron sweep.
   * Only where the runtime gives the request an execution context; the cron runs them anyway.
   */
  reconcile?: boolean;
  input: I;
  output: O;
  /** Runs after validation and IAM, before the transaction opens (may call ctx.check). */
  admission?: (ctx: MethodContext, input: z.output<I>) => void | Promise<void>;
  handler: (ctx: MethodContext, input: z.output<I>, tx: Tx) => Promise<z.input<O>>;
}

/** A method as defineMethod answers it: its action filled in. */
export interface MethodDefinition<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> extends MethodDeclaration<I, O> {
  /** IAM action; must be in the catalog of a registered module. */
  action: string;
}

export function defineMethod<I extends z.ZodType, O extends z.ZodType>(def: MethodDeclaration<I, O>): MethodDefinition<I, O> {
  const method = { ...def, action: def.action ?? def.name };
  assertName(method.name, METHOD_NAME, "method name");
  assertName(method.action, METHOD_NAME, "method action");
  return method;
}

// ---------------------------------------------------------------- modules

export interface Migration {
  /** "<module id>/<NNNN>_<what>", e.g. "acme-widgets/0001_widgets". Applied in name order. */
  name: string;
  sql: string;
}

export interface IamCatalog {
  /** action → what it allows. Every method's action must be listed by some module. */
  actions: Record<string, string>;
  /** role → action patterns ("widgets.*", "*"), merged into the IAM port's roles. */
  roles?: Record<string, string[]>;
}

export type AgentRole = "node" | "site" | "ramdisk";

/** A kind of command the module sends to agents through ctx.commands.enqueue. */
export interface CommandKind {
  /** Dotted, e.g. "bmc.setPower". Unique across the deployment. */
  kind: string;
  description?: string;
  /** The command's body; checked at enqueue, before anything is sent. */
  input?: z.ZodType;
  /** The result must be signed by the node's key (verified before it is recorded). */
  attested?: boolean;
  /** Irreversible on the machine (a wipe, a power cycle): declared so quorum and audits can see it. */
  destructive?: boolean;
  /** Agent roles that run it. */
  roles?: AgentRole[];
}

/**
 * A level-triggered control loop: it reads the record and moves what can move now. It runs from
 * the cron sweep and whenever a workflow ends, possibly twice at once: guard every write by the
 * state it expects. Returns how many things it changed. A module's `sweeps` have the same shape
 * and run from the cron sweep only.
 */
export interface Reconciler {
  id: string;
  /**
   * `cause` says why this pass runs when it is not a full one: a workflow ended. A reconciler that
   * can may then look only at what that workflow touched (metal settles its one machine); the
   * cron's full pass (no cause) catches anything else. Ignoring it and doing a full pass is correct.
   */
  run(ctx: PlatformContext, cause?: ReconcileCause): Promise<number>;
}

/** Why a reconciler pass runs, when something in particular triggered it. */
export interface ReconcileCause {
  /** The id of the workflow whose end triggered the pass (the WorkflowDO runs the reconcilers then). */
  workflowEnded: string;
}

export interface ModuleDefinition {
  id: string;
  version?: string;
  description?: string;
  iam?: IamCatalog;
  migrations?: Migration[];
  api?: MethodDefinition<any, any>[];
  commands?: CommandKind[];
  extensions?: Extension[];
  /** Provisioning profiles (defineProfile from better-compute/provision), registered as profile:id@version. */
  profiles?: Extension[];
  reconcilers?: Reconciler[];
  /** NodeSpec sections the module owns: only it writes them (ctx.nodeSpecs.setEntry); its reconcilers run when their observed state changes. */
  nodeSpecSections?: NodeSpecSection[];
  /**
   * Cron-only passes (same shape as a reconciler): safety nets such as waking workflows whose
   * wake-up was lost. The cron sweep runs them, then the reconcilers; a workflow's end does not.
   */
  sweeps?: Reconciler[];
  /**
   * The module's families for GET /metrics (docs/metrics.md), read from its own tables when
   * Prometheus scrapes: current state and the window (inMetricsWindow) through indexes, never a
   * read that grows with history. Names start bc_.
   */
  metrics?: (ctx: ModuleContext) => Promise<MetricFamily[]>;
  /** Called once per request context; a module keeps no state of its own between requests. */
  setup?: (ctx: ModuleContext) => void;
  /** Ports the module provides to every module's context (one provider each per deployment). */
  ports?: {
    capacity?: (ctx: ModuleContext) => CapacityPort;
    /** Who approves destructive commands under pki.approvers (the provision module: a workflow's signed batch). */
    approvals?: (ctx: ModuleContext) => ApprovalsPort;
  };
}

/** A NodeSpec section: a map of entries keyed by name (instances by id, access keys by name...), delivered to node agents. */
export interface NodeSpecSection {
  /** Unique across the deployment, e.g. "instances"; [a-z][a-z0-9-]*. */
  name: string;
  /** Every entry is checked against it before it is written. */
  entry: z.ZodType;
  description?: string;
  /**
   * How an entry is shown to operators (nodes.spec.get, readable by viewers): leave out what is
   * not theirs to read, e.g. a tenant's user data. Default: the entry as stored.
   */
  view?: (entry: unknown) => unknown;
}

export interface Module extends Required<Pick<ModuleDefinition, "id" | "version">>, Omit<ModuleDefinition, "id" | "version"> {
  contract: "module" | "plugin";
}

export function defineModule(def: ModuleDefinition): Module {
  assertName(def.id, ID, "module id");
  return { ...def, version: def.version ?? "1", contract: "module" };
}

/** A plugin is a module shipped by a third party; it registers through options.plugins. */
export function definePlugin(def: ModuleDefinition): Module {
  assertName(def.id, ID, "plugin id");
  return { ...def, version: def.version ?? "1", contract: "plugin" };
}

// ---------------------------------------------------------------- extensions
// Typed contracts whose engines arrive with the modules that run them (metal, join, sinks,
// placer). Registering them here is already checked: kind:id@version is unique.

interface ExtensionBase {
  id: string;
  version: string;
}

export type DriverKind = "power" | "management" | "boot" | "deploy" | "media" | "bios" | "raid" | "firmware" | "runtime";

export interface DriverDefinition extends ExtensionBase {
  contract: "driver";
  kinds: DriverKind[];
  /** Where the driver's code runs. */
  runsOn: "control-plane" | "site" | "node" | "ramdisk";
  /** Schema of a binding's configuration (a row validated by this manifest). */
  manifest?: z.ZodType;
  /** Fields of the binding that hold secret references, never values. */
  secretFields?: string[];
  /** How its code is reached: in the process that runs it (default), or a bcx plugin bcd hosts (externalDriver, docs/bcx.md). */
  transport?: "in-process" | "bcx";
}

/** What a joining agent asked for, its key already proven (it signed the join request). */
export interface AttestationRequest {
  role: AgentRole;
  publicKey: string;
  hostname?: string;
  /**
   * For an attestor with challenge(): the state it kept for the challenge the evidence names
   * (evidence.challengeId). JoinService consumes the challenge before verify() runs: single-use,
   * unexpired and issued to this key, or the join is refused.
   */
  challenge?: Record<string, unknown>;
}

/** What challenge() answers. */
export interface AttestationChallenge {
  /** Sent to the agent, which answers it in its join's evidence. */
  challenge: Record<string, unknown>;
  /** Kept by the control plane for verify() (as request.challenge); keep digests of secrets, not secrets. */
  state: Record<string, unknown>;
}

export interface AttestationResult {
  /** The node the agent joins as; default a new id. */
  nodeId?: string;
  role: AgentRole;
  labels?: Record<string, string>;
}

export interface AttestorDefinition extends ExtensionBase {
  contract: "attestor";
  /**
   * Verifies a joining agent's evidence; throws PERMISSION_DENIED when it does not hold.
   * It runs its own transactions: a single-use token is consumed even when the join is refused.
   */
  verify(ctx: ModuleContext, evidence: Record<string, unknown>, request: AttestationRequest): Promise<AttestationResult>;
  /**
   * A challenge-response attestor (tpm) answers the agent's first request (POST /join/v1/challenge)
   * with a challenge; throws PERMISSION_DENIED for evidence it would never accept.
   */
  challenge?(ctx: ModuleContext, evidence: Record<string, unknown>, request: AttestationRequest): Promise<AttestationChallenge>;
}

export interface SinkEvent {
  id: number;
  eventId: string;
  type: string;
  module: string;
  subject: string | null;
  data: Record<string, unknown>;
  occurredAt: string;
}

/** What a sink's deliver() gets besides the batch. */
export interface SinkContext {
  env: Bindings;
  /**
   * Resolves a secret reference: `env:NAME` (a Worker secret or var) or `secret:<id>` (a sealed row
   * of the secret store). An unknown reference is INVALID_CONFIG naming the reference, never a value.
   */
  secret(ref: string): Promise<string>;
  log: Logger;
}

export interface SinkDefinition extends ExtensionBase {
  contract: "sink";
  kind: "events" | "audit";
  /** At most this many events per deliver() call (default 100). */
  maxBatch?: number;
  /** Failed deliveries of a batch before its first event alone is retried, then dead-lettered (default 5). */
  maxAttempts?: number;
  /** At-least-once: a batch may be delivered again after a crash; deliver idempotently. Throw to fail the batch. */
  deliver(batch: SinkEvent[], ctx: SinkContext): Promise<void>;
}

/** Refuses hosts: true keeps the host, a string refuses it and is the reason the explanation shows. */
export interface PlacementFilter {
  name: string;
  filter(host: HostView, request: PlacementRequest): true | string;
}

/** Ranks the hosts left: higher is better; the placer sums weight (default 1) x score over every scorer. */
export interface PlacementScorer {
  name: string;
  weight?: number;
  score(host: HostView, request: PlacementRequest): number;
}

/** Chooses the devices of one kind (which GPUs) a guest gets on a host; null: none fit there. */
export interface AtomPicker {
  name: string;
  kind: string;
  pick(host: HostView, request: PlacementRequest): string[] | null;
}

/** The placer's extensions (the capacity module runs them beside its built-ins: docs/capacity.md). */
export interface SchedulerPluginDefinition extends ExtensionBase {
  contract: "scheduler-plugin";
  filters?: PlacementFilter[];
  scorers?: PlacementScorer[];
  atomPickers?: AtomPicker[];
  /** Runs before any host is looked at: a string refuses the request (FAILED_PRECONDITION with it). */
  admission?: (request: PlacementRequest) => void | string;
}

/** Any contract registered by kind:id@version (providers, steps and profiles join this union). */
export interface GenericExtension extends ExtensionBase {
  contract: string;
}

export type Extension = DriverDefinition | AttestorDefinition | SinkDefinition | SchedulerPluginDefinition | GenericExtension;

type Declared<T extends { contract: string; version: string }> = Omit<T, "contract" | "version"> & { version?: string };

/** One definer per contract: checks the id, defaults the version to "1", stamps the contract. */
function extensionDefiner<T extends Extension & { contract: string }>(contract: T["contract"]) {
  return (def: Declared<T>): T => {
    assertName(def.id, ID, `${contract} id`);
    return { ...def, version: def.version ?? "1", contract } as T;
  };
}

export const defineDriver = extensionDefiner<DriverDefinition>("driver");
export const defineAttestor = extensionDefiner<AttestorDefinition>("attestor");
export const defineSink = extensionDefiner<SinkDefinition>("sink");
export const defineSchedulerPlugin = extensionDefiner<SchedulerPluginDefinition>("scheduler-plugin");

function assertName(value: unknown, pattern: RegExp, what: string): void {
  if (typeof value !== "string" || !pattern.test(value)) {
    throw invalidConfig(`${what} ${JSON.stringify(value)} is not valid (expected ${pattern.source})`, { [what]: value });
  }
}
