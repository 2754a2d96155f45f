// The agents module: join tokens, nodes and commands over the API. Built in, registered on
// the same contract as any other module.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type Module } from "../contracts.ts";
import { ComputeError, notFound } from "../errors.ts";
import { defineGetMethod, defineListMethod } from "../methods.ts";
import { newestFirst, nextCursor, pageLimit } from "../paging.ts";
import { resourceId } from "../schemas.ts";
import { one, rows, type Tx } from "../store/database.ts";
import { builtinAttestors } from "./attestors.ts";
import { agentMetrics } from "./metrics.ts";
import { accessSection, nodeSpecActions, nodeSpecMethods, type SectionOwners } from "./node-specs.ts";
import { MAX_TOKEN_TTL_SECONDS, mintJoinToken } from "./tokens.ts";

const role = z.enum(["node", "site", "ramdisk"]);
const labels = z.record(z.string().max(253), z.string().max(253));
const ttlSeconds = z.number().int().min(1).max(MAX_TOKEN_TTL_SECONDS).optional();
const minted = z.object({ id: z.string(), token: z.string(), expiresAt: z.string() });

const node = z.object({
  id: z.string(),
  role,
  state: z.enum(["joined", "connected", "disconnected"]),
  hostname: z.string().nullable(),
  labels,
  attestor: z.string(),
  agentVersion: z.string().nullable(),
  bootId: z.string().nullable(),
  joinedAt: z.string(),
  connectedAt: z.string().nullable(),
  disconnectedAt: z.string().nullable(),
  revoked: z.boolean(),
});

const command = z.object({
  id: z.string(),
  nodeId: z.string(),
  seq: z.number(),
  kind: z.string(),
  key: z.string(),
  state: z.enum(["pending", "delivered", "succeeded", "failed", "expired"]),
  attempts: z.number(),
  result: z.unknown().nullable(),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
  createdAt: z.string(),
  completedAt: z.string().nullable(),
});

const TOKEN_STATES = ["active", "used", "expired", "revoked"] as const;

/** A join token as an operator sees it: never the token, nor its digest. */
const joinToken = z.object({
  id: z.string(),
  attestor: z.string(),
  role,
  labels,
  /** The node id it joins as (a provisioned token names one), or null. */
  node: z.string().nullable(),
  state: z.enum(TOKEN_STATES),
  createdBy: z.string(),
  createdAt: z.string(),
  expiresAt: z.string(),
  usedAt: z.string().nullable(),
  /** The node that joined with it (null when it was refused, e.g. expired, or not used). */
  usedBy: z.string().nullable(),
  revokedAt: z.string().nullable(),
});

/** bc_join_tokens rows with their state (revoked, used, expired or active, in that order) and the node that joined with them. */
const TOKEN_ROWS = sql`(
  SELECT t.id, t.attestor, t.role, t.labels, t.node_id, t.created_by, t.created_at, t.expires_at, t.consumed_at, t.revoked_at,
         CASE WHEN t.revoked_at IS NOT NULL THEN 'revoked' WHEN t.consumed_at IS NOT NULL THEN 'used' WHEN t.expires_at <= compute_now() THEN 'expired' ELSE 'active' END AS state,
         (SELECT n.id FROM bc_nodes n WHERE n.public_key = t.consumed_by ORDER BY n.joined_at LIMIT 1) AS used_by
  FROM bc_join_tokens t) AS tokens`;

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());

function toNode(r: Record<string, any>): z.infer<typeof node> {
  return {
    id: r.id,
    role: r.role,
    state: r.state,
    hostname: r.hostname,
    labels: r.labels,
    attestor: r.attestor,
    agentVersion: r.agent_version,
    bootId: r.boot_id,
    joinedAt: iso(r.joined_at)!,
    connectedAt: iso(r.connected_at),
    disconnectedAt: iso(r.disconnected_at),
    revoked: r.revoked_at !== null,
  };
}

/** The node of that id as the API shows it, or undefined. */
async function findNode(tx: Tx, id: string): Promise<z.infer<typeof node> | undefined> {
  const found = await one(tx, sql`SELECT * FROM bc_nodes WHERE id = ${id}`);
  return found && toNode(found);
}

function toJoinToken(r: Record<string, any>): z.infer<typeof joinToken> {
  return {
    id: r.id,
    attestor: r.attestor,
    role: r.role,
    labels: r.labels,
    node: r.node_id,
    state: r.state,
    createdBy: r.created_by,
    createdAt: iso(r.created_at)!,
    expiresAt: iso(r.expires_at)!,
    usedAt: r.state === "used" ? iso(r.consumed_at) : null,
    usedBy: r.used_by,
    revokedAt: iso(r.revoked_at),
  };
}

function toCommand(r: Record<string, any>): z.infer<typeof command> {
  return {
    id: String(r.id),
    nodeId: r.node_id,
    seq: Number(r.seq),
    kind: r.kind,
    key: r.idempotency_key,
    state: r.state,
    attempts: r.attempts,
    result: r.result,
    error: r.error,
    createdAt: iso(r.created_at)!,
    completedAt: iso(r.completed_at),
  };
}

/** sections: the deployment's NodeSpec sections (known once the registry is built), for nodes.spec.get. */
export function agentsModule(deps: { sections: () => SectionOwners }): Module {
  const joinTokensCreate = defineMethod({
    name: "joinTokens.create",
    resource: (input) => `joinTokens/${input.role}`,
    description: "Mint a single-use join token for an agent of a role (shown once)",
    input: z.object({ role, ttlSeconds, labels: labels.optional() }),
    output: minted,
    handler: async (ctx, input, tx) => {
      const token = await mintJoinToken(tx, {
        attestor: "join-token",
        role: input.role,
        labels: input.labels,
        ttlSeconds: input.ttlSeconds,
        createdBy: ctx.principal.id,
      });
      await ctx.events.publish(tx, {
        type: "joinToken.created",
        subject: `joinTokens/${token.id}`,
        data: { role: input.role, expiresAt: token.expiresAt },
      });
      return token;
    },
  });

  const siteTokensCreate = defineMethod({
    name: "siteTokens.create",
    resource: (input) => `sites/${input.site}`,
    description: "Mint a single-use join token for a site agent (shown once)",
    input: z.object({ site: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/), ttlSeconds }),
    output: minted,
    handler: async (ctx, input, tx) => {
      const token = await mintJoinToken(tx, {
        attestor: "join-token",
        role: "site",
        labels: { "bc.dev/site": input.site },
        ttlSeconds: input.ttlSeconds,
        createdBy: ctx.principal.id,
      });
      await ctx.events.publish(tx, {
        type: "joinToken.created",
        subject: `joinTokens/${token.id}`,
        data: { role: "site", site: input.site, expiresAt: token.expiresAt },
      });
      return token;
    },
  });

  const joinTokensList = defineMethod({
    name: "joinTokens.list",
    readOnly: true,
    description: "Join tokens, newest first (never the token or its digest); page with after: the previous page's next",
    input: z.object({
      role: role.optional(),
      state: z.enum(TOKEN_STATES).optional(),
      limit: pageLimit,
      after: resourceId.optional(),
    }),
    output: z.object({ tokens: z.array(joinToken), next: z.string().nullable() }),
    handler: async (_ctx, input, tx) => {
      const where = sql`(${input.role ?? null}::text IS NULL OR role = ${input.role ?? null})
        AND (${input.state ?? null}::text IS NULL OR state = ${input.state ?? null})`;
      const missing = `join token ${input.after} does not exist (after is a token id from a previous page)`;
      const tokens = (await newestFirst(tx, { from: TOKEN_ROWS, table: "bc_join_tokens", where, missing }, input)).map(toJoinToken);
      return { tokens, next: nextCursor(tokens, input.limit, (t) => t.id) };
    },
  });

  const joinTokensRevoke = defineMethod({
    name: "joinTokens.revoke",
    resource: (input) => `joinTokens/${input.id}`,
    description: "Revoke a join token that was not used: it can no longer join (revoking twice is not an error)",
    input: z.object({ id: resourceId }),
    output: joinToken,
    handler: async (ctx, input, tx) => {
      // Revoking uses the token up, so the attestors refuse it as they refuse any used token.
      const revoked = await one<{ role: string }>(
        tx,
        sql`
        UPDATE bc_join_tokens SET revoked_at = compute_now(), consumed_at = compute_now() WHERE id = ${input.id} AND consumed_at IS NULL RETURNING role`,
      );
      if (revoked)
        await ctx.events.publish(tx, {
          type: "joinToken.revoked",
          subject: `joinTokens/${input.id}`,
          data: { role: revoked.role },
        });
      const found = await one<Record<string, any>>(tx, sql`SELECT * FROM ${TOKEN_ROWS} WHERE id = ${input.id}`);
      if (!found) throw notFound(`join token ${input.id} does not exist`);
      if (found.state === "used") {
        const hint = found.used_by ? `: node ${found.used_by} joined with it; revoke the node instead (nodes.revoke)` : "";
        throw new ComputeError("FAILED_PRECONDITION", `join token ${input.id} was already used${hint}`, {
          token: input.id,
          ...(found.used_by ? { node: found.used_by } : {}),
        });
      }
      return toJoinToken(found);
    },
  });

  const nodesList = defineListMethod({
    name: "nodes.list",
    input: z.object({ role: role.optional(), state: node.shape.state.optional() }),
    items: { nodes: node },
    find: async (tx, input) => {
      const found = await rows(
        tx,
        sql`
        SELECT * FROM bc_nodes
        WHERE (${input.role ?? null}::text IS NULL OR role = ${input.role ?? null})
          AND (${input.state ?? null}::text IS NULL OR state = ${input.state ?? null})
        ORDER BY joined_at, id`,
      );
      return found.map(toNode);
    },
  });

  const nodesGet = defineGetMethod({ name: "nodes.get", what: "node", collection: "nodes", key: "node", output: node, find: findNode });

  const nodesRevoke = defineMethod({
    name: "nodes.revoke",
    resource: (input) => `nodes/${input.node}`,
    description: "Revoke a node's credentials: its socket is closed and it cannot renew or reconnect",
    input: z.object({ node: resourceId }),
    output: node,
    handler: async (ctx, input, tx) => {
      await ctx.nodes.revoke(tx, { nodeId: input.node }, `revoked by ${ctx.principal.id}`);
      const found = await findNode(tx, input.node);
      if (!found) throw notFound(`node ${input.node} does not exist`);
      return found;
    },
  });

  const commandsCreate = defineMethod({
    name: "commands.create",
    resource: (input) => `nodes/${input.node}`,
    description: "Send a command to a node's agent (idempotent by key)",
    input: z.object({
      node: resourceId,
      kind: resourceId,
      body: z.record(z.string(), z.unknown()).default({}),
      key: z.string().min(1).max(256).optional(),
      deadlineSeconds: z.number().positive().optional(),
    }),
    output: z.object({ id: z.string(), seq: z.number(), created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const key = input.key ?? `api:${crypto.randomUUID()}`;
      return ctx.commands.enqueue(tx, {
        nodeId: input.node,
        kind: input.kind,
        key,
        body: input.body,
        deadlineSeconds: input.deadlineSeconds,
      });
    },
  });

  const commandsGet = defineMethod({
    name: "commands.get",
    readOnly: true,
    input: z.object({ id: z.string().regex(/^\d{1,18}$/, "a command id (digits)") }),
    output: command,
    handler: async (_ctx, input, tx) => {
      const found = await one(tx, sql`SELECT * FROM bc_commands WHERE id = ${input.id}::bigint`);
      if (!found) throw notFound(`command ${input.id} does not exist`);
      return toCommand(found);
    },
  });

  const commandsList = defineMethod({
    name: "commands.list",
    readOnly: true,
    resource: (input) => `nodes/${input.node}`,
    input: z.object({ node: resourceId, afterSeq: z.number().int().default(0), limit: z.number().int().min(1).max(1000).default(100) }),
    output: z.object({ commands: z.array(command) }),
    handler: async (_ctx, input, tx) => {
      const found = await rows(
        tx,
        sql`
        SELECT * FROM bc_commands WHERE node_id = ${input.node} AND seq > ${input.afterSeq} ORDER BY seq LIMIT ${input.limit}`,
      );
      return { commands: found.map(toCommand) };
    },
  });

  return defineModule({
    id: "agents",
    description: "Join tokens, nodes and the commands sent to their agents",
    iam: {
      actions: {
        "joinTokens.create": "Mint join tokens for agents",
        "siteTokens.create": "Mint join tokens for site agents",
        "joinTokens.list": "List join tokens (never the tokens themselves)",
        "joinTokens.revoke": "Revoke join tokens that were not used",
        "nodes.list": "List nodes",
        "nodes.get": "Read a node",
        "nodes.revoke": "Revoke a node's credentials",
        "commands.create": "Send commands to agents",
        "commands.get": "Read a command and its result",
        "commands.list": "List a node's commands",
        ...nodeSpecActions,
      },
    },
    api: [
      joinTokensCreate,
      siteTokensCreate,
      joinTokensList,
      joinTokensRevoke,
      nodesList,
      nodesGet,
      nodesRevoke,
      commandsCreate,
      commandsGet,
      commandsList,
      ...nodeSpecMethods(deps.sections),
    ],
    nodeSpecSections: [accessSection],
    commands: [
      { kind: "agent.ping", description: "Round trip to the agent", input: z.object({}).passthrough() },
      { kind: "agent.info", description: "The agent's host, version and role", input: z.object({}) },
      // What a hosted operation does is the plugin's: destructive, so quorum and audits see every one.
      {
        kind: "driver.invoke",
        description: "Run an operation of a driver a bcx plugin serves on the agent (docs/bcx.md); secrets by reference in args",
        input: z.strictObject({
          driver: z.string().min(1).max(128),
          op: z.string().min(1).max(128),
          args: z.array(z.unknown()).max(64).default([]),
        }),
        destructive: true,
      },
    ],
    extensions: builtinAttestors,
    metrics: agentMetrics,
  });
}
