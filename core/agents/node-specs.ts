// NodeSpecs (docs/nodespec.md): each node's desired state, sections of entries written by the
// modules that registered them, and what the node's agent reports reaching. Here: the port
// modules write through (ctx.nodeSpecs), what the NodeDO reads and records, the built-in
// `access` section (operators' SSH keys) and the operator methods over both.
import { sql } from "drizzle-orm";
import { z } from "zod";
import type { EventsPort, NodeSpecsPort, NodeSpecView, WakePort } from "../context.ts";
import { defineMethod, type NodeSpecSection } from "../contracts.ts";
import { ComputeError, clip, invalidArgument, notFound, schemaIssues } from "../errors.ts";
import { defineGetMethod } from "../methods.ts";
import { canonicalJson, MAX_SPEC_BYTES, type NodeSpec, type NodeStatus } from "../protocol.ts";
import { resourceId } from "../schemas.ts";
import { one, type Db, type Store, type Tx } from "../store/database.ts";
import { databaseEvents } from "../store/ports.ts";
import type { SessionRef } from "./sessions.ts";

/** An entry's key: an instance id, a key's name... (it becomes a file's comment on the node: no spaces). */
export const ENTRY_KEY = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,252}$/;

/** The sections a deployment registered, by name, with the module that owns each. */
export type SectionOwners = ReadonlyMap<string, { section: NodeSpecSection; module: { id: string } }>;

/** ctx.nodeSpecs for one module. */
export function databaseNodeSpecs(
  moduleId: string,
  store: Store,
  sections: SectionOwners,
  events: EventsPort,
  wake: WakePort,
): NodeSpecsPort {
  return {
    async setEntry(tx, nodeId, section, key, value) {
      const registered = sections.get(section);
      if (!registered) throw invalidArgument(`no module registers the NodeSpec section ${clip(section)}`, { section });
      if (registered.module.id !== moduleId) {
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `the NodeSpec section ${section} belongs to module ${registered.module.id}; module ${moduleId} cannot write it`,
          { section, owner: registered.module.id },
        );
      }
      if (!ENTRY_KEY.test(key)) {
        throw invalidArgument(`a NodeSpec entry key is 1 to 253 characters of [A-Za-z0-9._@:-], starting with a letter or digit`, {
          section,
          key,
        });
      }
      let entry: unknown = null;
      if (value !== null) {
        const parsed = registered.section.entry.safeParse(value);
        if (!parsed.success) {
          throw invalidArgument(`the ${section} entry ${key} does not match the section's schema`, {
            section,
            key,
            issues: schemaIssues(parsed.error),
          });
        }
        entry = parsed.data ?? null;
      }
      const node = await tx.execute(sql`SELECT 1 FROM bc_nodes WHERE id = ${nodeId}`);
      if (!node.rows[0]) throw notFound(`node ${nodeId} does not exist`, { nodeId });
      if (entry !== null) await tx.execute(sql`INSERT INTO bc_node_specs (node_id) VALUES (${nodeId}) ON CONFLICT (node_id) DO NOTHING`);
      // The row lock serialises writers of one node: two keys written at once both land, each
      // change bumps the generation once, and the jsonb is changed in SQL, never rewritten whole.
      const row = await one<{ generation: string; current: unknown }>(
        tx,
        sql`
        SELECT generation, sections -> ${section}::text -> ${key}::text AS current FROM bc_node_specs WHERE node_id = ${nodeId} FOR UPDATE`,
      );
      if (!row) return { generation: 0, changed: false };
      if (canonicalJson(row.current ?? null) === canonicalJson(entry)) return { generation: Number(row.generation), changed: false };

      const path = sql`ARRAY[${section}::text, ${key}::text]`;
      const next =
        entry === null
          ? // A section left without entries is dropped: the spec shows only what is wanted.
            sql`CASE WHEN (sections #- ${path}) -> ${section}::text = '{}'::jsonb THEN sections - ${section}::text ELSE sections #- ${path} END`
          : sql`jsonb_set(sections || jsonb_build_object(${section}::text, coalesce(sections -> ${section}::text, '{}'::jsonb)), ${path}, ${JSON.stringify(entry)}::jsonb)`;
      const updated = await one<{ generation: string }>(
        tx,
        sql`
        UPDATE bc_node_specs SET sections = ${next}, generation = generation + 1, updated_at = compute_now()
        WHERE node_id = ${nodeId} AND octet_length((${next})::text) <= ${MAX_SPEC_BYTES}
        RETURNING generation`,
      );
      const generation = updated?.generation;
      if (generation === undefined) {
        throw invalidArgument(`the NodeSpec of node ${nodeId} would exceed ${MAX_SPEC_BYTES} bytes with the ${section} entry ${key}`, {
          nodeId,
          section,
          key,
          maxBytes: MAX_SPEC_BYTES,
        });
      }
      await events.publish(tx, {
        type: "node.spec.changed",
        subject: `nodes/${nodeId}`,
        data: { section, key, deleted: entry === null, generation: Number(generation) },
      });
      wake.node(nodeId);
      return { generation: Number(generation), changed: true };
    },
    get: (nodeId, tx) => readNodeSpec(tx ?? store.db, nodeId),
  };
}

type Row = {
  generation: string;
  sections: NodeSpec["sections"];
  updated_at: string | null;
  observed: NodeStatus["sections"] | null;
  observed_generation: string | null;
  observed_at: string | null;
  observed_boot_id: string | null;
};

/** The node's spec and its last observed state; undefined when nothing was written or reported. */
export async function readNodeSpec(db: Db | Tx, nodeId: string): Promise<NodeSpecView | undefined> {
  const row = await one<Row>(
    db,
    sql`
    SELECT generation, sections, updated_at, observed, observed_generation, observed_at, observed_boot_id
    FROM bc_node_specs WHERE node_id = ${nodeId}`,
  );
  if (!row) return undefined;
  return {
    generation: Number(row.generation),
    sections: row.sections,
    updatedAt: iso(row.updated_at),
    observed:
      row.observed === null
        ? null
        : {
            generation: Number(row.observed_generation),
            sections: row.observed,
            at: iso(row.observed_at)!,
            bootId: row.observed_boot_id,
          },
  };
}

const iso = (v: string | null) => (v === null ? null : new Date(v).toISOString());

const events = (nodeId: string) => databaseEvents("agents", `node:${nodeId}`, undefined);

/**
 * Records a status frame as the node's observed state, if it came on the node's current session
 * (a replaced socket's late status changes nothing). Answers the sections whose observed state
 * changed (their owners' reconcilers run next); publishes node.spec.observed when anything did.
 */
export async function recordStatus(
  store: Store,
  session: SessionRef & { bootId: string | null },
  status: NodeStatus,
): Promise<{ recorded: boolean; changed: string[] }> {
  return store.transaction(async (tx) => {
    await tx.execute(sql`
      INSERT INTO bc_node_specs (node_id) SELECT id FROM bc_nodes WHERE id = ${session.nodeId} AND session_id = ${session.sessionId}
      ON CONFLICT (node_id) DO NOTHING`);
    const row = await one<Pick<Row, "observed" | "observed_generation">>(
      tx,
      sql`
      SELECT s.observed, s.observed_generation FROM bc_node_specs s JOIN bc_nodes n ON n.id = s.node_id
      WHERE s.node_id = ${session.nodeId} AND n.session_id = ${session.sessionId} AND n.revoked_at IS NULL
      FOR UPDATE OF s`,
    );
    if (!row) return { recorded: false, changed: [] };
    const before = row.observed ?? {};
    const names = new Set([...Object.keys(before), ...Object.keys(status.sections)]);
    const changed = [...names]
      .filter((name) => canonicalJson(before[name] ?? null) !== canonicalJson(status.sections[name] ?? null))
      .sort();
    await tx.execute(sql`
      UPDATE bc_node_specs
      SET observed = ${JSON.stringify(status.sections)}::jsonb, observed_generation = ${status.generation},
          observed_at = compute_now(), observed_boot_id = ${session.bootId}
      WHERE node_id = ${session.nodeId}`);
    if (changed.length > 0 || row.observed === null || Number(row.observed_generation) !== status.generation) {
      await events(session.nodeId).publish(tx, {
        type: "node.spec.observed",
        subject: `nodes/${session.nodeId}`,
        data: {
          generation: status.generation,
          changed,
          failed: Object.keys(status.sections).filter((name) => status.sections[name]!.error !== undefined),
        },
      });
    }
    return { recorded: true, changed };
  });
}

// ---------------------------------------------------------------- access: operators' SSH keys on a node

/** An OpenSSH public key without its comment (the entry's name is the comment on the node). */
const SSH_PUBLIC_KEY =
  /^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}$/;

export const accessSection: NodeSpecSection = {
  name: "access",
  description: "Operators' SSH public keys: bcd node writes them, one line each, into its authorized_keys file (--access-file)",
  entry: z.strictObject({
    publicKey: z.string().max(16_384).regex(SSH_PUBLIC_KEY, "an OpenSSH public key: its type and base64, without a comment"),
  }),
};

const entryName = z.string().regex(ENTRY_KEY, "1 to 253 characters of [A-Za-z0-9._@:-], starting with a letter or digit");

const observedSection = z.object({
  entries: z.record(z.string(), z.unknown()),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});

const specView = z.object({
  node: z.string(),
  /** 0: nothing was ever written. */
  generation: z.number(),
  sections: z.record(z.string(), z.record(z.string(), z.unknown())),
  updatedAt: z.string().nullable(),
  observed: z
    .object({ generation: z.number(), sections: z.record(z.string(), observedSection), at: z.string(), bootId: z.string().nullable() })
    .nullable(),
});

const written = z.object({ node: z.string(), generation: z.number(), changed: z.boolean() });

async function existingNode(tx: Tx, nodeId: string): Promise<void> {
  const found = await tx.execute(sql`SELECT 1 FROM bc_nodes WHERE id = ${nodeId}`);
  if (!found.rows[0]) throw notFound(`node ${nodeId} does not exist`, { nodeId });
}

export const nodeSpecActions = {
  "nodes.spec.get": "Read a node's NodeSpec: what it should run, and what its agent reported reaching",
  "nodes.access.set": "Put an operator's SSH public key on a node (its NodeSpec access section)",
  "nodes.access.remove": "Take an operator's SSH public key off a node",
};

/** The desired sections as operators see them: each entry through its section's `view`. */
function operatorView(sections: NodeSpec["sections"], owners: SectionOwners): NodeSpec["sections"] {
  return Object.fromEntries(
    Object.entries(sections).map(([name, entries]) => {
      const view = owners.get(name)?.section.view;
      return [name, view ? Object.fromEntries(Object.entries(entries).map(([key, entry]) => [key, view(entry)])) : entries];
    }),
  );
}

/** The operator's view of NodeSpecs (read-only) and the writers of the access section. */
export function nodeSpecMethods(owners: () => SectionOwners) {
  const get = defineGetMethod({
    name: "nodes.spec.get",
    what: "node",
    collection: "nodes",
    key: "node",
    description: "A node's NodeSpec: the desired sections and generation, and the agent's last observed status",
    output: specView,
    find: async (tx, node) => {
      await existingNode(tx, node);
      const spec = await readNodeSpec(tx, node);
      if (!spec) return { node, generation: 0, sections: {}, updatedAt: null, observed: null };
      return { node, ...spec, sections: operatorView(spec.sections, owners()) };
    },
  });

  const accessSet = defineMethod({
    name: "nodes.access.set",
    resource: (input) => `nodes/${input.node}`,
    description: "Put an SSH public key on a node under a name (its authorized_keys, written by bcd node); setting it again replaces it",
    input: z.object({
      node: resourceId,
      name: entryName,
      /** An OpenSSH public key line; a trailing comment is dropped (the name is the comment). */
      publicKey: z.string().max(16_384),
    }),
    output: written,
    handler: async (ctx, input, tx) => {
      const publicKey = input.publicKey.trim().split(/\s+/).slice(0, 2).join(" ");
      return { node: input.node, ...(await ctx.nodeSpecs.setEntry(tx, input.node, "access", input.name, { publicKey })) };
    },
  });

  const accessRemove = defineMethod({
    name: "nodes.access.remove",
    resource: (input) => `nodes/${input.node}`,
    description: "Take the SSH public key of that name off a node (removing an absent one changes nothing)",
    input: z.object({ node: resourceId, name: entryName }),
    output: written,
    handler: async (ctx, input, tx) => ({
      node: input.node,
      ...(await ctx.nodeSpecs.setEntry(tx, input.node, "access", input.name, null)),
    }),
  });

  return [get, accessSet, accessRemove];
}
