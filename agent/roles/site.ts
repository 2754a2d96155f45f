// The site agent's command handlers: it sits next to the machines and drives their BMCs over
// Redfish. The command names the BMC's password by reference (secret://<id>); the value
// travels in the command's secrets and is never part of the body, a result or a message.
// Runtime-neutral: Node-only parts (the image cache's HTTP server) live in image-cache.ts.
import { z } from "zod";
import { AgentError, inLane, type CommandContext, type CommandHandler, type FetchLike } from "../client.ts";
import { RAID_LEVELS, RedfishClient, raidDriveCountProblem, type BmcCredential } from "./redfish.ts";

export interface SiteHandlerOptions {
  fetch?: FetchLike;
  /** Per BMC request (ms); default the client's 10 s. */
  timeoutMs?: number;
}

/** A command body checked against its schema; INVALID_ARGUMENT naming each bad field otherwise. */
export function parseBody<T>(kind: string, schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((i) => `${i.path.length ? i.path.map(String).join(".") : "body"}: ${i.message}`);
  throw new AgentError("INVALID_ARGUMENT", `${kind}: ${issues.join("; ")}`);
}

const bmc = z.object({
  address: z.string().min(1),
  username: z.string().min(1),
  // The message does not echo the value: it may be a password sent by mistake.
  password: z.string().regex(/^secret:\/\/[\w-]+$/, "must be a secret://<id> reference, never the password itself"),
});
type BmcBody = z.infer<typeof bmc>;

function resolveBmc(ref: BmcBody, ctx: CommandContext): BmcCredential {
  const password = ctx.secrets?.[ref.password];
  if (password === undefined) throw new AgentError("INVALID_ARGUMENT", `the command carries no value for ${ref.password}`);
  return { address: ref.address, username: ref.username, password };
}

const biosAttributes = z
  .record(z.string().min(1), z.union([z.string(), z.number(), z.boolean()]))
  .refine((a) => Object.keys(a).length > 0, "at least one BIOS attribute");

const raidBody = z
  .object({ bmc, level: z.enum(RAID_LEVELS), drives: z.union([z.number().int().min(1), z.literal("all")]).default("all") })
  .superRefine((b, ctx) => {
    const problem = typeof b.drives === "number" ? raidDriveCountProblem(b.level, b.drives) : undefined;
    if (problem) ctx.addIssue({ code: "custom", path: ["drives"], message: problem });
  });

/** The BMC a command body names (its system's address), read without trusting the body's shape. */
function bmcLane(body: Record<string, unknown>): string | undefined {
  const address = (body.bmc as { address?: unknown } | undefined)?.address;
  return typeof address === "string" ? `bmc:${address}` : undefined;
}

export function siteHandlers(options: SiteHandlerOptions = {}): Record<string, CommandHandler> {
  /**
   * A handler that validates the body, then runs `op` against the body's BMC. Each BMC is its own
   * lane: one machine's commands run in order, different machines' side by side.
   */
  const onBmc = <T extends { bmc: BmcBody }>(schema: z.ZodType<T>, op: (client: RedfishClient, body: T) => Promise<unknown>): CommandHandler =>
    inLane(bmcLane, async (raw, ctx) => {
      const body = parseBody(ctx.kind, schema, raw);
      const client = new RedfishClient(resolveBmc(body.bmc, ctx), { fetch: options.fetch, timeoutMs: options.timeoutMs, signal: ctx.signal });
      return op(client, body);
    });

  return {
    "metal.bmc.inspect": onBmc(z.object({ bmc }), (c) => c.inspect()),
    "metal.bmc.power": onBmc(z.object({ bmc, action: z.enum(["on", "off", "cycle"]) }), (c, b) => c.setPower(b.action)),
    "metal.bmc.boot": onBmc(z.object({ bmc, device: z.enum(["pxe", "cd", "disk"]), once: z.boolean().default(true) }), (c, b) =>
      c.setBootDevice(b.device, b.once),
    ),
    "metal.bmc.media.insert": onBmc(z.object({ bmc, url: z.url({ protocol: /^https?$/ }) }), (c, b) => c.insertMedia(b.url)),
    "metal.bmc.media.eject": onBmc(z.object({ bmc }), (c) => c.ejectMedia()),
    // Staged for the next power-on: the workflow power-cycles when `applied` is false.
    "metal.bmc.bios": onBmc(z.object({ bmc, attributes: biosAttributes }), (c, b) => c.applyBiosSettings(b.attributes)),
    "metal.bmc.raid": onBmc(raidBody, (c, b) => c.configureRaid({ level: b.level, drives: b.drives })),
  };
}
