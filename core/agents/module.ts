// The agents module: join tokens, nodes and commands over the API. Built in, registered on
// the same contract as any other module.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, defineModule, type Module } from "../contracts.ts";
import { notFound } from "../errors.ts";
import { builtinAttestors } from "./attestors.ts";
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

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());

function toNode(r: Record<string, any>): z.infer<typeof node> {
  return {
    id: r.id, role: r.role, state: r.state, hostname: r.hostname, labels: r.labels, attestor: r.attestor,
    agentVersion: r.agent_version, bootId: r.boot_id, joinedAt: iso(r.joined_at)!, connectedAt: iso(r.connected_at),
    disconnectedAt: iso(r.disconnected_at), revoked: r.revoked_at !== null,
  };
}

function toCommand(r: Record<string, any>): z.infer<typeof command> {
  return {
    id: String(r.id), nodeId: r.node_id, seq: Number(r.seq), kind: r.kind, key: r.idempotency_key, state: r.state,
    attempts: r.attempts, result: r.result, error: r.error, createdAt: iso(r.created_at)!, completedAt: iso(r.completed_at),
  };
}

export function agentsModule(): Module {
  const joinTokensCreate = defineMethod({
    name: "joinTokens.create",
    action: "joinTokens.create",
    resource: (input) => `joinTokens/${input.role}`,
    description: "Mint a single-use join token for an agent of a role (shown once)",
    input: z.object({ role, ttlSeconds, labels: labels.optional() }),
    output: minted,
    handler: async (ctx, input, tx) => {
      const token = await mintJoinToken(tx, { attestor: "join-token", role: input.role, labels: input.labels, ttlSeconds: input.ttlSeconds, createdBy: ctx.principal.id });
      await ctx.events.publish(tx, { type: "joinToken.created", subject: `joinTokens/${token.id}`, data: { role: input.role, expiresAt: token.expiresAt } });
      return token;
    },
  });

  const siteTokensCreate = defineMethod({
    name: "siteTokens.create",
    action: "siteTokens.create",
    resource: (input) => `sites/${input.site}`,
    description: "Mint a single-use join token for a site agent (shown once)",
    input: z.object({ site: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/), ttlSeconds }),
    output: minted,
    handler: async (ctx, input, tx) => {
      const token = await mintJoinToken(tx, { attestor: "join-token", role: "site", labels: { "bc.dev/site": input.site }, ttlSeconds: input.ttlSeconds, createdBy: ctx.principal.id });
      await ctx.events.publish(tx, { type: "joinToken.created", subject: `joinTokens/${token.id}`, data: { role: "site", site: input.site, expiresAt: token.expiresAt } });
      return token;
    },
  });

  const nodesList = defineMethod({
    name: "nodes.list",
    action: "nodes.list",
    readOnly: true,
    input: z.object({ role: role.optional(), state: node.shape.state.optional() }),
    output: z.object({ nodes: z.array(node) }),
    handler: async (_ctx, input, tx) => {
      const rows = await tx.execute(sql`
        SELECT * FROM bc_nodes
        WHERE (${input.role ?? null}::text IS NULL OR role = ${input.role ?? null})
          AND (${input.state ?? null}::text IS NULL OR state = ${input.state ?? null})
        ORDER BY joined_at, id`);
      return { nodes: rows.rows.map((r) => toNode(r as Record<string, any>)) };
    },
  });

  const nodesGet = defineMethod({
    name: "nodes.get",
    action: "nodes.get",
    readOnly: true,
    resource: (input) => `nodes/${input.id}`,
    input: z.object({ id: z.string() }),
    output: node,
    handler: async (_ctx, input, tx) => {
      const rows = await tx.execute(sql`SELECT * FROM bc_nodes WHERE id = ${input.id}`);
      if (!rows.rows[0]) throw notFound(`node ${input.id} does not exist`);
      return toNode(rows.rows[0] as Record<string, any>);
    },
  });

  const nodesRevoke = defineMethod({
    name: "nodes.revoke",
    action: "nodes.revoke",
    resource: (input) => `nodes/${input.id}`,
    description: "Revoke a node's credentials: its socket is closed and it cannot renew or reconnect",
    input: z.object({ id: z.string() }),
    output: node,
    handler: async (ctx, input, tx) => {
      await ctx.nodes.revoke(tx, { nodeId: input.id }, `revoked by ${ctx.principal.id}`);
      const rows = await tx.execute(sql`SELECT * FROM bc_nodes WHERE id = ${input.id}`);
      if (!rows.rows[0]) throw notFound(`node ${input.id} does not exist`);
      return toNode(rows.rows[0] as Record<string, any>);
    },
  });

  const commandsCreate = defineMethod({
    name: "commands.create",
    action: "commands.create",
    resource: (input) => `nodes/${input.nodeId}`,
    description: "Send a command to a node's agent (idempotent by key)",
    input: z.object({
      nodeId: z.string(),
      kind: z.string(),
      body: z.record(z.string(), z.unknown()).default({}),
      key: z.string().min(1).max(256).optional(),
      deadlineSeconds: z.number().positive().optional(),
    }),
    output: z.object({ id: z.string(), seq: z.number(), created: z.boolean() }),
    handler: async (ctx, input, tx) => {
      const key = input.key ?? `api:${crypto.randomUUID()}`;
      return ctx.commands.enqueue(tx, { nodeId: input.nodeId, kind: input.kind, key, body: input.body, deadlineSeconds: input.deadlineSeconds });
    },
  });

  const commandsGet = defineMethod({
    name: "commands.get",
    action: "commands.get",
    readOnly: true,
    input: z.object({ id: z.string().regex(/^\d+$/) }),
    output: command,
    handler: async (_ctx, input, tx) => {
      const rows = await tx.execute(sql`SELECT * FROM bc_commands WHERE id = ${input.id}::bigint`);
      if (!rows.rows[0]) throw notFound(`command ${input.id} does not exist`);
      return toCommand(rows.rows[0] as Record<string, any>);
    },
  });

  const commandsList = defineMethod({
    name: "commands.list",
    action: "commands.list",
    readOnly: true,
    resource: (input) => `nodes/${input.nodeId}`,
    input: z.object({ nodeId: z.string(), afterSeq: z.number().int().default(0), limit: z.number().int().min(1).max(1000).default(100) }),
    output: z.object({ commands: z.array(command) }),
    handler: async (_ctx, input, tx) => {
      const rows = await tx.execute(sql`
        SELECT * FROM bc_commands WHERE node_id = ${input.nodeId} AND seq > ${input.afterSeq} ORDER BY seq LIMIT ${input.limit}`);
      return { commands: rows.rows.map((r) => toCommand(r as Record<string, any>)) };
    },
  });

  return defineModule({
    id: "agents",
    description: "Join tokens, nodes and the commands sent to their agents",
    iam: {
      actions: {
        "joinTokens.create": "Mint join tokens for agents",
        "siteTokens.create": "Mint join tokens for site agents",
        "nodes.list": "List nodes",
        "nodes.get": "Read a node",
        "nodes.revoke": "Revoke a node's credentials",
        "commands.create": "Send commands to agents",
        "commands.get": "Read a command and its result",
        "commands.list": "List a node's commands",
      },
    },
    api: [joinTokensCreate, siteTokensCreate, nodesList, nodesGet, nodesRevoke, commandsCreate, commandsGet, commandsList],
    commands: [
      { kind: "agent.ping", description: "Round trip to the agent", input: z.object({}).passthrough() },
      { kind: "agent.info", description: "The agent's host, version and role", input: z.object({}) },
    ],
    extensions: builtinAttestors,
  });
}
