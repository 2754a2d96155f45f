// A machine's serial console for operators: read live through its site agent (metal.bmc.console:
// a Redfish BMC's Telnet console, an IPMI BMC's serial-over-LAN through the hosted driver). An
// operator opens a session (metal.nodes.console: a mutating call, so each session is one audit
// row), then reads it from where they left off (metal.nodes.consoleRead, as often as they like,
// unaudited) and, when their role allows it, types into it (metal.nodes.consoleWrite: each an
// audit row). Console bytes stay in the commands' results: never in an event or a log line.
import { sql } from "drizzle-orm";
import { z } from "zod";
import type { CommandKind, DriverDefinition } from "better-compute";
import {
  askAgent,
  ComputeError,
  defineMethod,
  one,
  resourceId,
  type MethodContext,
  type MethodDefinition,
  type SecretRef,
  base64,
  utf8,
} from "better-compute/core";
import { loadNode, type NodeRow } from "./nodes.ts";
import { siteAgentOf } from "./steps.ts";

export const CONSOLE_KIND = "metal.bmc.console";
/** What one read answers at most (the site agent's cap: its answer is one result frame). */
const MAX_READ_BYTES = 32 * 1024;
/** How long a read waits for the site agent (which itself waits up to 2 s for new bytes). */
const READ_WAIT_MS = 6_000;
/** A session lives this long after it was opened. */
const SESSION_HOURS = 12;

export const consoleCommand: CommandKind = {
  kind: CONSOLE_KIND,
  description: "Read a machine's serial console from where the reader left off (and type into it), through its BMC",
  roles: ["site"],
};

/** A role for whoever watches machines boot (on call): consoles to read, never to type into. */
export const consoleRoles = {
  "metal-console": ["metal.nodes.get", "metal.nodes.list", "metal.nodes.console", "metal.nodes.consoleRead"],
};

export const consoleActions = {
  "metal.nodes.console": "Open a machine's serial console (each session is an audit row)",
  "metal.nodes.consoleRead": "Read the serial console of a session opened with metal.nodes.console",
  "metal.nodes.consoleWrite": "Type into a machine's serial console",
};

const chunk = z.object({
  session: z.string(),
  node: z.string(),
  /** The site agent's connection to the console: a new one means the console was reconnected (offsets start again). */
  connection: z.string().nullable(),
  /** Pass back as `offset` (with the same connection) to read on from here. */
  offset: z.number().int(),
  /** The console's bytes, base64 (a terminal's output: escape sequences included). */
  data: z.string(),
  /** Bytes the reader missed: it fell behind the site agent's buffer by that much. */
  skipped: z.number().int(),
  /** Why the console's connection ended, when it has (the next read reconnects). */
  ended: z.string().nullable(),
  /** true: the site agent did not answer in time (data is empty; read again). */
  stale: z.boolean(),
});
type Chunk = z.infer<typeof chunk>;

interface SessionRow {
  id: string;
  node_id: string;
  actor: string;
}

/** The site agent's answer for this read (it opens the BMC's console if it has none open). */
async function askSite(
  ctx: MethodContext,
  node: NodeRow,
  session: string,
  body: { from?: { session: string; offset: number }; maxBytes?: number; input?: string },
): Promise<Chunk> {
  const agent = await siteAgentOf(ctx.store.db, node.site_id);
  if (!agent) throw new ComputeError("UNAVAILABLE", `site ${node.site_id} has no agent to reach machine ${node.id}'s BMC through`);
  const answer = await askAgent<{ session: string; offset: number; data: string; skipped: number; ended?: string }>(
    ctx,
    {
      nodeId: agent,
      kind: CONSOLE_KIND,
      key: `${CONSOLE_KIND}/${node.id}/${crypto.randomUUID()}`,
      body: { bmc: node.bmc, ...body },
      secretRefs: [node.bmc.password as SecretRef],
      deadlineSeconds: 30,
    },
    READ_WAIT_MS,
  );
  if (answer.state === "failed" || answer.state === "expired") {
    const error = answer.error ?? { code: "DEADLINE_EXCEEDED", message: "the site agent did not answer" };
    throw new ComputeError(error.code === "UNSUPPORTED" ? "UNSUPPORTED" : "UNAVAILABLE", `machine ${node.id}'s console: ${error.message}`, {
      node: node.id,
      code: error.code,
    });
  }
  const r = answer.result;
  return {
    session,
    node: node.id,
    connection: r?.session ?? body.from?.session ?? null,
    offset: r?.offset ?? body.from?.offset ?? 0,
    data: r?.data ?? "",
    skipped: r?.skipped ?? 0,
    ended: r?.ended ?? null,
    stale: answer.state === "pending",
  };
}

async function openSession(ctx: MethodContext, id: string): Promise<SessionRow> {
  const row = await one<SessionRow>(
    ctx.store.db,
    sql`SELECT id, node_id, actor FROM metal_console_sessions WHERE id = ${id} AND expires_at > compute_now()`,
  );
  if (!row) throw new ComputeError("NOT_FOUND", `console session ${id} does not exist or has expired: open one with metal.nodes.console`);
  return row;
}

export function consoleMethods(): MethodDefinition<any, any>[] {
  // Answers are read in admission (no transaction open while the site agent is asked) for the handler of the same call.
  const answers = new WeakMap<object, Chunk>();

  const open = defineMethod({
    name: "metal.nodes.console",
    resource: (input) => `metal/nodes/${input.node}`,
    description:
      "Open a machine's serial console: a session to read (metal.nodes.consoleRead) and, where your role allows, type into (metal.nodes.consoleWrite); answers what the console shows now",
    input: z.object({ node: resourceId }),
    output: chunk,
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node);
      const driver = ctx.registered.extensions<DriverDefinition>("driver").find((d) => d.id === node.bmc.driver);
      if (driver?.runsOn === "control-plane")
        throw new ComputeError(
          "UNSUPPORTED",
          `machine ${node.id}'s power driver ${node.bmc.driver} runs on the control plane: no site agent reaches a console`,
        );
      const id = `con-${crypto.randomUUID()}`;
      await tx.execute(sql`
        INSERT INTO metal_console_sessions (id, node_id, actor, expires_at)
        VALUES (${id}, ${node.id}, ${ctx.principal.id}, compute_now() + make_interval(hours => ${SESSION_HOURS}))`);
      // The first read happens once this session is committed, by the caller: nothing is asked inside this transaction.
      return { session: id, node: node.id, connection: null, offset: 0, data: "", skipped: 0, ended: null, stale: false };
    },
  });

  const read = defineMethod({
    name: "metal.nodes.consoleRead",
    readOnly: true,
    resource: (input) => `metal/nodes/${input.node}`,
    description:
      "Read a console session from where you left off (connection and offset from the last answer; none: the bytes the site agent still holds); waits a few seconds for new bytes",
    input: z.object({
      node: resourceId,
      session: z.string().min(1).max(64),
      connection: z.string().min(1).max(64).optional(),
      offset: z.number().int().min(0).optional(),
      maxBytes: z.number().int().min(1).max(MAX_READ_BYTES).default(MAX_READ_BYTES),
    }),
    output: chunk,
    admission: async (ctx, input) => {
      const session = await openSession(ctx, input.session);
      if (session.node_id !== input.node)
        throw new ComputeError("INVALID_ARGUMENT", `console session ${input.session} is not machine ${input.node}'s`);
      const node = await ctx.store.transaction((tx) => loadNode(tx, input.node));
      const from = input.connection !== undefined ? { session: input.connection, offset: input.offset ?? 0 } : undefined;
      answers.set(input, await askSite(ctx, node, session.id, { ...(from ? { from } : {}), maxBytes: input.maxBytes }));
    },
    handler: async (_ctx, input) => answers.get(input)!,
  });

  const write = defineMethod({
    name: "metal.nodes.consoleWrite",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Type into a machine's serial console (text, sent as UTF-8; \\r is Enter) in a session opened with metal.nodes.console",
    input: z.object({ node: resourceId, session: z.string().min(1).max(64), text: z.string().min(1).max(4096) }),
    output: chunk,
    admission: async (ctx, input) => {
      const session = await openSession(ctx, input.session);
      if (session.node_id !== input.node)
        throw new ComputeError("INVALID_ARGUMENT", `console session ${input.session} is not machine ${input.node}'s`);
      if (session.actor !== ctx.principal.id)
        throw new ComputeError("PERMISSION_DENIED", `console session ${input.session} was opened by another principal`);
      const node = await ctx.store.transaction((tx) => loadNode(tx, input.node));
      answers.set(input, await askSite(ctx, node, session.id, { input: base64(utf8(input.text)), maxBytes: 0 }));
    },
    handler: async (_ctx, input) => answers.get(input)!,
  });

  return [open, read, write];
}
