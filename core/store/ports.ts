// The context's ports over the deployment's database (core/context.ts declares them): events
// and work written in the caller's transaction, commands numbered and share-locked against
// revocation, node revocation, business time from compute_now(), and secrets sealed with a key
// derived from the deployment secret.
import { is, SQL, sql } from "drizzle-orm";
import { base64 as b64, unbase64 as unb64, utf8 } from "../encoding.ts";
import type { CommandKind } from "../contracts.ts";
import { MAX_KEY_LENGTH } from "../protocol.ts";
import { ComputeError, invalidArgument, notFound, schemaIssues } from "../errors.ts";
import { isSecretRef } from "../schemas.ts";
import { one, rows, sendWithCommit, type Store, type Tx } from "./database.ts";
import type {
  ApprovalsPort,
  Clock,
  CommandsPort,
  EventsPort,
  NodesPort,
  SecretRef,
  SecretStore,
  StatementEvent,
  WakePort,
  WorkPort,
} from "../context.ts";

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
