// The command kind that reaches any operation of a driver bcd hosts: `driver.invoke { driver, op,
// args }` (declared by core's agents module). A string argument that is one of the command's
// secret references (secret://id) is replaced by its value here, so a secret reaches the plugin
// without ever being in the command's body, a log line or a process's arguments.
import { z } from "zod";
import { AgentError, inLane, type CommandContext, type CommandHandler } from "../contracts.ts";
import type { PluginHost } from "./host.ts";

export const DRIVER_INVOKE_KIND = "driver.invoke";

const body = z.strictObject({
  driver: z.string().min(1).max(128),
  op: z.string().min(1).max(128),
  args: z.array(z.unknown()).max(64).default([]),
});

/** The arguments with each secret reference the command carries a value for replaced by that value. */
function withSecrets(value: unknown, secrets: Readonly<Record<string, string>>): unknown {
  if (typeof value === "string") return Object.hasOwn(secrets, value) ? secrets[value] : value;
  if (Array.isArray(value)) return value.map((v) => withSecrets(v, secrets));
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, withSecrets(v, secrets)]));
  return value;
}

export function driverInvokeHandlers(host: Pick<PluginHost, "invoke">): Record<string, CommandHandler> {
  const handler = async (raw: Record<string, unknown>, ctx: CommandContext) => {
    const parsed = body.safeParse(raw);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw new AgentError("INVALID_ARGUMENT", `${DRIVER_INVOKE_KIND}: ${issue.path.join(".") || "body"}: ${issue.message}`, undefined, {
        permanent: true,
      });
    }
    const { driver, op, args } = parsed.data;
    // The executor aborts ctx.signal at the command's deadline; the plugin is told the time left.
    const deadlineMs = ctx.deadline ? Math.max(1, Date.parse(ctx.deadline) - Date.now()) : undefined;
    return host.invoke(driver, op, withSecrets(args, ctx.secrets ?? {}) as unknown[], {
      signal: ctx.signal,
      ...(deadlineMs !== undefined ? { deadlineMs } : {}),
    });
  };
  // One lane per driver: a slow driver holds up only its own invokes.
  return { [DRIVER_INVOKE_KIND]: inLane((b) => (typeof b.driver === "string" ? `driver:${b.driver}` : undefined), handler) };
}
