// A method that needs an agent's answer now (a console read): the command is written in its own
// transaction, its NodeDO told at once, and the caller waits a few seconds for the result, with no
// transaction open while it waits. Call it from a method's admission, never its handler (whose
// transaction would hold the command back until it commits).
import { sql } from "drizzle-orm";
import type { CommandInput, MethodContext, PlatformContext } from "../context.ts";
import { one } from "../store/database.ts";

export interface AgentAnswer<T> {
  /** The command's id (its row in bc_commands). */
  id: string;
  state: "succeeded" | "failed" | "expired" | "pending";
  result: T | null;
  error: { code: string; message: string } | null;
  /** When the agent answered (ISO 8601), or null. */
  at: string | null;
}

const POLL_MS = 100;

/** Sends the command and returns its answer, or state "pending" when none came within waitMs. */
export async function askAgent<T>(ctx: MethodContext, command: CommandInput, waitMs: number): Promise<AgentAnswer<T>> {
  const sent = await ctx.store.transaction((tx) => ctx.commands.enqueue(tx, command));
  // The method's own wake-up comes only after its handler; the agent must hear of the command now.
  await (ctx as unknown as PlatformContext).afterCommit();
  const until = Date.now() + waitMs;
  for (;;) {
    const row = await one<{ state: string; result: T | null; error: AgentAnswer<T>["error"]; at: string | null }>(
      ctx.store.db,
      sql`SELECT state, result, error, completed_at AS at FROM bc_commands WHERE id = ${sent.id}::bigint`,
    );
    const at = row?.at ? new Date(row.at).toISOString() : null;
    if (row && (row.state === "succeeded" || row.state === "failed" || row.state === "expired"))
      return { id: sent.id, state: row.state, result: row.result, error: row.error, at };
    if (Date.now() >= until) return { id: sent.id, state: "pending", result: null, error: null, at: null };
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}
