// ModuleContext: the ports a module meets the platform (and other modules) through.
// Every port that writes takes the caller's transaction, so state, events and work commit
// or roll back together. Their implementations over the database are in core/store/ports.ts.
import type { SQL } from "drizzle-orm";
import type { CommandKind } from "./contracts.ts";
import type { Principal } from "./iam.ts";
import type { Logger } from "./log.ts";
import type { Store, Tx } from "./store/database.ts";

export interface EventInput {
  /** Dotted type, e.g. "widget.created". */
  type: string;
  /** What the event is about, e.g. "widgets/w-1". */
  subject?: string;
  /** Facts only: never a secret value (use a SecretRef). */
  data?: Record<string, unknown>;
}

export interface WorkInput {
  queue: string;
  /** One pending item per (queue, key): enqueueing the same key again changes nothing. */
  key: string;
  payload?: Record<string, unknown>;
  /** Run no earlier than this many seconds from now (database time). */
  delaySeconds?: number;
}

/** An event written by the statement of the state change it records (EventsPort.insertSql). */
export interface StatementEvent {
  /** Or text computed in the statement from `from`'s columns (with `each`). */
  type: string | SQL;
  subject?: string | SQL;
  /** Facts only, as EventInput's; or jsonb computed in the statement (from its CTEs' columns). */
  data?: Record<string, unknown> | SQL;
  /** Who did it, when not the port's actor: text computed from `from`'s columns (with `each`). */
  actor?: SQL;
  /**
   * A CTE of the statement: the event is written only if it returned a row (it returns at most
   * one). Unset: always written.
   */
  from?: string;
  /** With `from`: one event for each row it returned (any number), written in this order of its columns. */
  each?: { orderBy: SQL };
}

export interface EventsPort {
  /**
   * Writes the event in tx and returns its id. The row is sent with tx's next statement or its
   * COMMIT (sendWithCommit), so publishing costs no round trip of its own; a statement after it in
   * tx sees the row, and a failure to write it fails that statement (or the COMMIT).
   */
  publish(tx: Tx, event: EventInput): Promise<string>;
  /**
   * The INSERT of the row publish writes, for a CTE of the caller's one statement
   * (`WITH moved AS (...), events AS (${ctx.events.insertSql([...])}) ...`): the events ride in the
   * statement of the state change, written in the order given.
   */
  insertSql(events: StatementEvent[]): SQL;
}

export interface WorkPort {
  enqueue(tx: Tx, item: WorkInput): Promise<void>;
}

/** Business time: read from the database (compute_now()), never from the isolate. */
export interface Clock {
  now(tx?: Tx): Promise<Date>;
}

/** "secret://<id>": how a secret travels in rows, commands, events and errors. */
export type SecretRef = `secret://${string}`;

export interface SecretStore {
  put(tx: Tx, input: { module: string; name: string; value: string }): Promise<SecretRef>;
  /** Only code that hands the value to its final consumer resolves a reference. */
  resolve(ref: SecretRef, tx?: Tx): Promise<string>;
  /** Several references in one round trip (a delivery batch's commands); NOT_FOUND names the first missing one. */
  resolveAll(refs: readonly SecretRef[], tx?: Tx): Promise<Map<SecretRef, string>>;
}

/** A blob's name and size: its sha256 (64 hex digits) and its length in bytes. */
export interface StoredBlob {
  sha256: string;
  bytes: number;
}

/**
 * Content-addressed bytes too large for a row: ISOs and config drives rendered per machine.
 * An R2 bucket bound as BLOBS on Cloudflare (miniflare's locally); the site agents fetch a blob
 * by its sha256 (GET /agent/v1/blobs/<sha256> with their credential) and check it.
 */
export interface BlobStore {
  /** Keeps the bytes under their sha256; the same bytes again change nothing. */
  put(bytes: Uint8Array): Promise<StoredBlob>;
  /** The blob of that sha256, or undefined. */
  get(sha256: string): Promise<(StoredBlob & { body: ReadableStream<Uint8Array> }) | undefined>;
}

export interface CommandInput {
  nodeId: string;
  /** A kind some registered module declares (CommandKind). */
  kind: string;
  /** Idempotency key: enqueueing the same key again returns the first command, sends nothing new. */
  key: string;
  body?: Record<string, unknown>;
  /** Secrets the agent needs, by reference only. */
  secretRefs?: SecretRef[];
  /** The command expires if no result arrives within this many seconds. */
  deadlineSeconds?: number;
  /**
   * Who waits for the result: "<object kind>:<name>" (objectOrigin: "workflow:<id>") names the
   * Durable Object woken when it is recorded.
   */
  origin?: string;
}

export interface EnqueuedCommand {
  id: string;
  seq: number;
  /** False when the key was enqueued before: nothing new will be sent. */
  created: boolean;
}

export interface CommandsPort {
  /** Writes the command in the caller's transaction; its NodeDO delivers it after commit. */
  enqueue(tx: Tx, command: CommandInput): Promise<EnqueuedCommand>;
}

/** After the caller's transaction commits, the platform wakes the Durable Objects named here. */
export interface WakePort {
  /** The node's NodeDO re-reads the node and delivers its open commands. */
  node(nodeId: string): void;
  /** The workflow's WorkflowDO advances it. */
  workflow(workflowId: string): void;
  /** The SinkDO delivers what the transaction wrote to the outbox (events publish this themselves). */
  sinks(): void;
}

export interface ProvisionedTokenInput {
  /** The role the installed system joins as. */
  role: "node" | "site" | "ramdisk";
  /** The node id it joins as; default a new one (returned). */
  nodeId?: string;
  labels?: Record<string, string>;
  /** Evidence the joining machine must present with these exact values, e.g. { productUuid }. */
  expect?: Record<string, string>;
  ttlSeconds?: number;
}

/** pki.approvers: the Ed25519 keys (raw, base64url) whose threshold must approve a workflow's destructive commands. */
export interface Approvers {
  readonly keys: readonly string[];
  readonly threshold: number;
}

/**
 * Under pki.approvers, who approves destructive commands: a module provides it (the provision
 * module approves a workflow's signed batch: docs/quorum.md). Asked in the enqueueing transaction.
 */
export interface ApprovalsPort {
  check(
    tx: Tx,
    command: { kind: string; origin?: string },
  ): Promise<{ approved: true } | { approved: false; message: string; details?: Record<string, unknown> }>;
}

/** The platform's certificate authority, as modules see it. */
export interface PkiPort {
  /** Set when destructive commands need a quorum (docs/quorum.md): enqueue refuses them outside an approved batch. */
  readonly approvers?: Approvers;
  /**
   * Mints a single-use join token for the provisioned attestor, in the caller's transaction.
   * The token is returned once: put it where only the machine reads it (an ISO, user data),
   * never into a command, an event or a log.
   */
  mintJoinToken(tx: Tx, input: ProvisionedTokenInput): Promise<{ token: string; tokenId: string; nodeId: string; expiresAt: string }>;
}

/** Agents' nodes, as modules act on them. */
export interface NodesPort {
  /**
   * Revokes nodes in the caller's transaction: their sockets close after commit and they can
   * neither renew nor reconnect. Select one node by id, or every live node of a role whose labels
   * include all of `labels` (e.g. the installed system of a machine being wiped). Returns the ids.
   */
  revoke(
    tx: Tx,
    which: { nodeId: string } | { role: "node" | "site" | "ramdisk"; labels: Record<string, string> },
    reason: string,
  ): Promise<string[]>;
  /**
   * Wakes the workflow when an agent of the role whose labels include all of `labels` connects
   * (its hello), instead of at its step's next poll. One wait per workflow: a later call replaces it.
   * Look for the agent again after registering: one whose hello came just before fired nothing.
   */
  wakeWhenConnected(tx: Tx, wait: { workflowId: string; role: "node" | "site" | "ramdisk"; labels: Record<string, string> }): Promise<void>;
}

/** What a guest needs from a host, and where it may go (the capacity module places it: docs/capacity.md). */
export interface PlacementRequest {
  /** Who the reservation is for, e.g. "vps/instances/<id>": one live reservation per owner (a second reserve returns it). */
  owner: string;
  /** The hosts considered: those whose labels include all of these (e.g. a pool's). */
  candidates?: { labels?: Record<string, string> };
  /** Labels a host must have (e.g. "bc.dev/driver.qemu-microvm"); a host without them is rejected by the "labels" filter. */
  nodeLabels?: Record<string, string>;
  /** The runtime driver the guest needs: the host must advertise it (label bc.dev/driver.<runtime>). */
  runtime?: string;
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
  /** Devices of one kind the guest is given (GPUs...); an atom picker chooses which. */
  devices?: { kind: string; count: number };
  /** The pool's overcommit ratios (default 1: none); disk and devices are never overcommitted. */
  overcommit?: { cpu?: number; memory?: number };
  /** No two live reservations of one group on a host. */
  antiAffinity?: { group: string };
  /** spread: least used host first (default); pack: most used first. */
  strategy?: "spread" | "pack";
  /** Recorded on the reservation for the operator (e.g. the vps pool). */
  pool?: string;
  /** Consume this hold (made by hold()) instead of placing anew. */
  holdId?: string;
}

export interface ResourceAmounts {
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
}

/** A host as the placer's filters and scorers see it. */
export interface HostView {
  nodeId: string;
  hostname: string | null;
  labels: Record<string, string>;
  /** The agent's liveness: only "connected" hosts are schedulable. */
  state: "joined" | "connected" | "disconnected";
  cordoned: boolean;
  maintenance: boolean;
  /** Why it is cordoned or in maintenance (the operator's words). */
  reason: string | null;
  /** What its agent reported (null: it never reported resources). */
  capacity: ResourceAmounts | null;
  devices: { id: string; kind: string; model?: string }[];
  /** Summed over its live reservations (active, and holds not expired). */
  used: ResourceAmounts;
  /** Device ids given to live reservations. */
  usedDevices: string[];
  /** Anti-affinity groups of its live reservations. */
  groups: string[];
  reservations: number;
}

export interface PlacementRejection {
  nodeId: string;
  /** The filter that refused the host (a built-in's name or a scheduler plugin's "<plugin>/<filter>"). */
  filter: string;
  reason: string;
}

export type PlacementResult =
  { placed: { nodeId: string; reservationId: string; atoms: string[] } } | { unplaceable: { rejections: PlacementRejection[] } };

export interface PlacementExplanation {
  /** Every host considered: accepted with its score, or the filter that refused it. */
  verdicts: (
    { nodeId: string; accepted: true; score: number; scores: Record<string, number> } | ({ accepted: false } & PlacementRejection)
  )[];
  /** The host it would pick now, or null. */
  pick: string | null;
}

/** Capacity on hosts, as modules book it (provided by the capacity module; docs/capacity.md). */
export interface CapacityPort {
  /** Places and books in the caller's transaction; never overbooks a host. Idempotent per owner. */
  reserve(tx: Tx, request: PlacementRequest): Promise<PlacementResult>;
  /** Books capacity ahead of an instance for ttlSeconds; a reserve with holdId consumes it. The reservationId is the hold id. */
  hold(tx: Tx, request: PlacementRequest & { ttlSeconds: number }): Promise<PlacementResult>;
  /** Frees the owner's reservation or hold; false when it had none. */
  release(tx: Tx, owner: string): Promise<boolean>;
  /** A dry run: the verdict on every host considered, and the one it would pick. Books nothing. */
  explain(tx: Tx, request: Omit<PlacementRequest, "owner" | "holdId">): Promise<PlacementExplanation>;
}

/** A node's NodeSpec: what it should run (sections of entries) and what its agent reported reaching. */
export interface NodeSpecView {
  /** Bumped by every change; 0 before the first. */
  generation: number;
  /** section → entry key → entry. */
  sections: Record<string, Record<string, unknown>>;
  updatedAt: string | null;
  /** The agent's last status (its current session's), or null before it reported. */
  observed: {
    generation: number;
    sections: Record<string, { entries: Record<string, unknown>; error?: { code: string; message: string } }>;
    at: string;
    bootId: string | null;
  } | null;
}

/** NodeSpecs (docs/nodespec.md): a module writes the entries of the sections it registered (ModuleDefinition.nodeSpecSections). */
export interface NodeSpecsPort {
  /**
   * Writes (or with null deletes) one entry in the caller's transaction. The entry is checked by
   * the section's schema (INVALID_ARGUMENT); only the module that registered the section may
   * write it (FAILED_PRECONDITION). An equal value changes nothing; a change bumps the
   * generation, and the node's NodeDO delivers it after commit.
   */
  setEntry(tx: Tx, nodeId: string, section: string, key: string, value: unknown): Promise<{ generation: number; changed: boolean }>;
  /** The node's spec, or undefined if nothing was ever written for it nor reported by it. */
  get(nodeId: string, tx?: Tx): Promise<NodeSpecView | undefined>;
}

export interface ModuleContext {
  readonly moduleId: string;
  readonly env: Readonly<Record<string, unknown>>;
  readonly store: Store;
  readonly events: EventsPort;
  readonly work: WorkPort;
  readonly commands: CommandsPort;
  readonly wake: WakePort;
  readonly clock: Clock;
  readonly secrets: SecretStore;
  /** Rendered ISOs and config drives; its calls throw FAILED_PRECONDITION when the deployment binds no blob store (BLOBS). */
  readonly blobs: BlobStore;
  readonly pki: PkiPort;
  readonly nodes: NodesPort;
  /** NodeSpecs: the desired state delivered to node agents, and what they report. */
  readonly nodeSpecs: NodeSpecsPort;
  /** Host capacity and placement; its calls throw FAILED_PRECONDITION when no capacity module is registered. */
  readonly capacity: CapacityPort;
  readonly log: Logger;
  /** What the deployment registered: extensions of a contract (steps, profiles, drivers...) and command kinds. */
  readonly registered: RegisteredView;
}

export interface RegisteredView {
  extensions<T extends { contract: string }>(contract: string): T[];
  commandKind(kind: string): CommandKind | undefined;
}

export interface MethodContext extends ModuleContext {
  readonly principal: Principal;
  readonly requestId: string;
  /**
   * IAM for composite methods: decide a sub-call before the transaction opens.
   * Throws PERMISSION_DENIED; throws INTERNAL if called inside the handler's transaction.
   */
  check(action: string, resource?: string): Promise<void>;
}

/**
 * A module's context as the platform hands it out outside a method (reconcilers, sweeps, the
 * Durable Objects, attestors): whoever holds it runs afterCommit once its transaction commits.
 */
export interface PlatformContext extends ModuleContext {
  /** Wakes the Durable Objects named in ctx.wake and of the commands enqueued (ctx.commands). */
  afterCommit(): Promise<void>;
}
