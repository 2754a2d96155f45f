// ModuleContext: the ports a module meets the platform (and other modules) through.
// Every port that writes takes the caller's transaction, so state, events and work commit
// or roll back together.
import { is, SQL, sql } from "drizzle-orm";
import { base64 as b64, unbase64 as unb64, utf8 } from "./encoding.ts";
import type { CommandKind } from "./contracts.ts";
import { MAX_KEY_LENGTH } from "./protocol.ts";
import { ComputeError, invalidArgument, notFound, schemaIssues } from "./errors.ts";
import { isSecretRef } from "./schemas.ts";
import type { Principal } from "./iam.ts";
import type { Logger } from "./log.ts";
import { one, rows, sendWithCommit, type Store, type Tx } from "./store/database.ts";

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

// ---------------------------------------------------------------- default implementations

export function databaseEvents(moduleId: string, actor: string | undefined, requestId: string | undefined): EventsPort {
  // The one place an event row's shape lives: publish and every statement that writes events use it.
  const text = (value: string | SQL | null | undefined) => (is(value, SQL) ? value : sql`${value ?? null}::text`);
  const insertSql = (events: StatementEvent[], ids?: string[]): SQL => {
    const rows = events.map((e, i) => {
      const data = is(e.data, SQL) ? e.data : sql`${JSON.stringify(e.data ?? {})}::jsonb`;
      // One event per row of `from` (each) gets its id from the database; otherwise the id is made here.
      const each = e.each && e.from ? e.each : undefined;
      const id = each ? sql`gen_random_uuid()` : sql`${ids?.[i] ?? crypto.randomUUID()}::uuid`;
      return sql`SELECT ${i}::int AS bc_ord, ${each ? sql`row_number() OVER (ORDER BY ${each.orderBy})` : sql`0::bigint`} AS bc_row,
          ${id} AS event_id, ${text(e.type)} AS type, ${text(e.subject)} AS subject, ${data} AS data,
          ${e.actor ?? sql`${actor ?? null}::text`} AS actor ${e.from ? sql`FROM ${sql.identifier(e.from)}` : sql``}`;
    });
    return sql`
      INSERT INTO bc_events (event_id, type, module, subject, data, actor, request_id)
      SELECT event_id, type, ${moduleId}::text, subject, data, actor, ${requestId ?? null}::text
      FROM (${sql.join(rows, sql` UNION ALL `)}) AS e ORDER BY bc_ord, bc_row`;
  };
  return {
    async publish(tx, event) {
      // Nothing in the row is the database's to choose, so nothing is waited for: the INSERT goes
      // with the transaction's next statement or its COMMIT.
      const id = crypto.randomUUID();
      await sendWithCommit(tx, insertSql([event], [id]));
      return id;
    },
    insertSql: (events) => insertSql(events),
  };
}

export function databaseWork(moduleId: string): WorkPort {
  return {
    async enqueue(tx, item) {
      const delay = Math.max(0, item.delaySeconds ?? 0);
      // A pending item stays as it is (level-triggered: one pass sees the latest state anyway);
      // a finished one is armed again.
      await tx.execute(sql`
        INSERT INTO bc_work_items (queue, key, module, payload, run_at)
        VALUES (${item.queue}, ${item.key}, ${moduleId}, ${JSON.stringify(item.payload ?? {})}::jsonb,
                compute_now() + make_interval(secs => ${delay}))
        ON CONFLICT (queue, key) DO UPDATE
          SET state = 'pending', payload = excluded.payload, run_at = excluded.run_at,
              attempts = 0, last_error = NULL, updated_at = compute_now()
          WHERE bc_work_items.state <> 'pending'`);
    },
  };
}

export function databaseCommands(
  moduleId: string,
  kinds: ReadonlyMap<string, { command: CommandKind }>,
  onEnqueued: (nodeId: string) => void,
  /** Set under pki.approvers: destructive kinds are enqueued only when it approves them. */
  approvals?: () => ApprovalsPort,
): CommandsPort {
  return {
    async enqueue(tx, input) {
      const declared = kinds.get(input.kind)?.command;
      if (!declared) throw invalidArgument(`unknown command kind ${input.kind}: no registered module declares it`, { kind: input.kind });
      if (approvals && declared.destructive) {
        // Refused before a command row exists: an operator's commands.create, another module's enqueue.
        const verdict = await approvals().check(tx, { kind: input.kind, ...(input.origin ? { origin: input.origin } : {}) });
        if (!verdict.approved) throw new ComputeError("PERMISSION_DENIED", verdict.message, { kind: input.kind, ...verdict.details });
      }
      let body = input.body ?? {};
      if (declared.input) {
        const parsed = declared.input.safeParse(body);
        if (!parsed.success) {
          throw invalidArgument(`the body of ${input.kind} does not match its schema`, {
            kind: input.kind,
            issues: schemaIssues(parsed.error),
          });
        }
        body = parsed.data as Record<string, unknown>;
      }
      if (input.key.length === 0 || input.key.length > MAX_KEY_LENGTH)
        throw invalidArgument(`an idempotency key is 1 to ${MAX_KEY_LENGTH} characters`);
      const refs = input.secretRefs ?? [];
      if (!refs.every(isSecretRef)) throw invalidArgument("secretRefs must be secret:// references, never values");

      // One statement: the key's command if it exists; otherwise the insert, numbered from one
      // sequence (migrations/core/0015). The node's row is share-locked, not updated: enqueues to
      // one node do not wait for each other, and a revocation waits for them (or they see it).
      // A concurrent enqueue of the same key that committed first wins: nothing is inserted, and
      // the next try returns it.
      const sources = await rows<{
        source: "existing" | "inserted" | "live";
        id: string;
        seq: string;
        node_id: string;
        kind: string;
      }>(
        tx,
        sql`
        WITH existing AS (SELECT id, seq, node_id, kind FROM bc_commands WHERE idempotency_key = ${input.key}),
        node AS (
          SELECT id FROM bc_nodes
          WHERE id = ${input.nodeId} AND revoked_at IS NULL AND NOT EXISTS (SELECT 1 FROM existing)
          FOR SHARE),
        inserted AS (
          INSERT INTO bc_commands (node_id, seq, kind, idempotency_key, module, body, secret_refs, attested, destructive, deadline, origin)
          SELECT id, nextval('bc_command_seq'), ${input.kind}, ${input.key}, ${moduleId}, ${JSON.stringify(body)}::jsonb,
                 ${pgArray(refs)}::text[], ${declared.attested === true}, ${declared.destructive === true},
                 CASE WHEN ${input.deadlineSeconds ?? null}::float8 IS NULL THEN NULL
                      ELSE compute_now() + make_interval(secs => ${input.deadlineSeconds ?? 0}) END, ${input.origin ?? null}
          FROM node
          ON CONFLICT (idempotency_key) DO NOTHING
          RETURNING id, seq)
        SELECT 'existing' AS source, id::text, seq::text, node_id, kind FROM existing
        UNION ALL SELECT 'inserted', id::text, seq::text, NULL, NULL FROM inserted
        UNION ALL SELECT 'live', NULL, NULL, NULL, NULL FROM node`,
      );
      const found = sources.find((r) => r.source === "existing");
      if (found) {
        if (found.node_id !== input.nodeId || found.kind !== input.kind) {
          throw new ComputeError("CONFLICT", `idempotency key ${input.key} was used for another command`, { key: input.key });
        }
        return { id: found.id, seq: Number(found.seq), created: false };
      }
      const row = sources.find((r) => r.source === "inserted");
      if (!sources.some((r) => r.source === "live"))
        throw notFound(`node ${input.nodeId} does not exist or was revoked`, { nodeId: input.nodeId });
      if (!row) return this.enqueue(tx, input);
      onEnqueued(input.nodeId);
      return { id: row.id, seq: Number(row.seq), created: true };
    },
  };
}

export function databaseNodes(events: EventsPort, wake: WakePort): NodesPort {
  return {
    async revoke(tx, which, reason) {
      const selected =
        "nodeId" in which ? sql`id = ${which.nodeId}` : sql`role = ${which.role} AND labels @> ${JSON.stringify(which.labels)}::jsonb`;
      const revoked = await rows<{ id: string }>(
        tx,
        sql`UPDATE bc_nodes SET revoked_at = compute_now() WHERE ${selected} AND revoked_at IS NULL RETURNING id`,
      );
      const ids = revoked.map((r) => r.id);
      for (const id of ids) {
        await events.publish(tx, { type: "node.revoked", subject: `nodes/${id}`, data: { reason } });
        wake.node(id);
      }
      return ids;
    },
    async wakeWhenConnected(tx, wait) {
      await tx.execute(sql`
        INSERT INTO bc_agent_waits (workflow_id, role, labels) VALUES (${wait.workflowId}, ${wait.role}, ${JSON.stringify(wait.labels)}::jsonb)
        ON CONFLICT (workflow_id) DO UPDATE SET role = EXCLUDED.role, labels = EXCLUDED.labels, fired_at = NULL, created_at = compute_now()`);
    },
  };
}

/**
 * A Postgres array literal for values of a safe alphabet (checked by the caller): drizzle would
 * expand a JS array into a parameter list.
 */
export const pgArray = (values: readonly string[]) => `{${values.join(",")}}`;

export function databaseClock(store: Store): Clock {
  return {
    async now(tx) {
      const value = (await one<{ now: string | Date }>(tx ?? store.db, sql`SELECT compute_now() AS now`))?.now;
      if (value === undefined) throw new ComputeError("UNAVAILABLE", "the database returned no time");
      return new Date(value);
    },
  };
}

/** Secrets sealed with AES-GCM under a key derived from the deployment secret. */
export function databaseSecrets(store: Store, deploymentSecret: string): SecretStore {
  const key = deriveKey(deploymentSecret, "bc-secrets-v1");
  const resolveAll: SecretStore["resolveAll"] = async (refs, tx) => {
    // The ids go into an array literal (pgArray): a reference is checked before it is sliced.
    if (!refs.every(isSecretRef)) throw invalidArgument("a secret reference is secret://<id>");
    const ids = [...new Set(refs)].map((ref) => ref.slice("secret://".length));
    const values = new Map<SecretRef, string>();
    if (ids.length === 0) return values;
    const found = await rows<{ id: string; sealed: string }>(
      tx ?? store.db,
      sql`SELECT id, sealed FROM bc_secrets WHERE id = ANY(${pgArray(ids)}::text[])`,
    );
    const sealed = new Map(found.map((r) => [r.id, r.sealed]));
    for (const id of ids) {
      const row = sealed.get(id);
      if (!row) throw notFound(`secret secret://${id} does not exist`);
      const [, iv, data] = row.split(".");
      const plain = await crypto.subtle.decrypt({ name: "AES-GCM", iv: unb64(iv!), additionalData: utf8(id) }, await key, unb64(data!));
      values.set(`secret://${id}`, new TextDecoder().decode(plain));
    }
    return values;
  };
  return {
    async put(tx, { module, name, value }) {
      const id = crypto.randomUUID();
      const iv = crypto.getRandomValues(new Uint8Array(12));
      const sealed = await crypto.subtle.encrypt({ name: "AES-GCM", iv, additionalData: utf8(id) }, await key, utf8(value));
      await tx.execute(sql`
        INSERT INTO bc_secrets (id, module, name, sealed)
        VALUES (${id}, ${module}, ${name}, ${`v1.${b64(iv)}.${b64(new Uint8Array(sealed))}`})`);
      return `secret://${id}`;
    },
    resolve: async (ref, tx) => (await resolveAll([ref], tx)).get(ref)!,
    resolveAll,
  };
}

async function deriveKey(secret: string, purpose: string): Promise<CryptoKey> {
  const material = await crypto.subtle.importKey("raw", utf8(secret), "HKDF", false, ["deriveKey"]);
  return crypto.subtle.deriveKey(
    { name: "HKDF", hash: "SHA-256", salt: utf8("better-compute"), info: utf8(purpose) },
    material,
    { name: "AES-GCM", length: 256 },
    false,
    ["encrypt", "decrypt"],
  );
}
