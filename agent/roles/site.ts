// The site agent's command handlers: it sits next to the machines and drives their BMCs over
// Redfish. The command names the BMC's password by reference (secret://<id>); the value
// travels in the command's secrets and is never part of the body, a result, a message or a log
// line. Each BMC operation is logged (kind, BMC, outcome, duration), and each failure.
// Node-only, like the Redfish client (node:https, so each BMC binding's tls block decides trust).
import { z } from "zod";
import { bmcTls } from "better-compute/metal/bmc-address";
import { SECRET_REF } from "../../core/schemas.ts";
import { AgentError, inLane, type AgentLogger, type CommandContext, type CommandHandler, type FetchLike } from "../contracts.ts";
import { RAID_LEVELS, RedfishClient, raidDriveCountProblem, type BmcCredential, type RedfishClientOptions } from "./redfish.ts";

export interface SiteHandlerOptions {
  /** TEST SEAM: BMC requests go through this fetch (see RedfishClientOptions). */
  fetch?: FetchLike;
  /** Per BMC request (ms); default the client's 10 s. */
  timeoutMs?: number;
  /** How long power operations wait for the BMC to report the target state; default the client's (60 s, looking every 1 s). */
  powerWait?: RedfishClientOptions["powerWait"];
  /** Where each BMC operation and each failure is logged (bcd: its stderr logger); never a credential. */
  log?: AgentLogger;
}

/** A command body checked against its schema; INVALID_ARGUMENT naming each bad field otherwise. */
export function parseBody<T>(kind: string, schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((i) => `${i.path.length ? i.path.map(String).join(".") : "body"}: ${i.message}`);
  throw new AgentError("INVALID_ARGUMENT", `${kind}: ${issues.join("; ")}`);
}

// The address is checked by the client, with the control plane's rules (better-compute/metal/bmc-address).
const bmc = z.object({
  address: z.string().min(1),
  username: z.string().min(1),
  // The message does not echo the value: it may be a password sent by mistake.
  password: z.string().regex(SECRET_REF, "must be a secret://<id> reference, never the password itself"),
  tls: bmcTls.optional(),
});
type BmcBody = z.infer<typeof bmc>;

function resolveBmc(ref: BmcBody, ctx: CommandContext): BmcCredential {
  const password = ctx.secrets?.[ref.password];
  if (password === undefined) throw new AgentError("INVALID_ARGUMENT", `the command carries no value for ${ref.password}`);
  return { address: ref.address, username: ref.username, password, ...(ref.tls ? { tls: ref.tls } : {}) };
}

const silent: AgentLogger = { info() {}, warn() {}, error() {} };

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
  const log = options.log ?? silent;
  const onBmc = <T extends { bmc: BmcBody }>(
    schema: z.ZodType<T>,
    op: (client: RedfishClient, body: T) => Promise<unknown>,
  ): CommandHandler =>
    inLane(bmcLane, async (raw, ctx) => {
      const started = Date.now();
      let bmcAddress: string | undefined; // the client's: a refused address may hold a credential, so it is not logged
      try {
        const body = parseBody(ctx.kind, schema, raw);
        const client = new RedfishClient(resolveBmc(body.bmc, ctx), {
          fetch: options.fetch,
          timeoutMs: options.timeoutMs,
          powerWait: options.powerWait,
          signal: ctx.signal,
        });
        bmcAddress = client.address;
        const output = await op(client, body);
        log.info("bmc operation", { kind: ctx.kind, bmc: bmcAddress, outcome: "ok", durationMs: Date.now() - started });
        const warning = (output as { warning?: unknown } | undefined)?.warning;
        if (typeof warning === "string") log.warn("bmc operation warning", { kind: ctx.kind, bmc: bmcAddress, warning });
        return output;
      } catch (e) {
        // Messages are the client's (scrubbed of the credential) or a schema's (which never echo a value).
        const { code, message, permanent } = (e ?? {}) as { code?: unknown; message?: unknown; permanent?: unknown };
        log.warn("bmc operation failed", {
          kind: ctx.kind,
          bmc: bmcAddress,
          outcome: typeof code === "string" ? code : "ERROR",
          durationMs: Date.now() - started,
          error: typeof message === "string" ? message : String(e),
          ...(permanent === true ? { permanent } : {}),
        });
        throw e;
      }
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
