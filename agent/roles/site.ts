// The site agent's command handlers: it sits next to the machines and drives their BMCs over
// Redfish, or through a BMC driver it hosts as a bcx plugin (IPMI: bcx-ipmi). The command names
// the BMC's password by reference (secret://<id>); the value travels in the command's secrets (and
// to a hosted driver over its stdin) and is never part of the body, a result, a message or a log
// line. Each BMC operation is logged (kind, BMC, outcome, duration), and each failure.
// Node-only, like the Redfish client (node:https, so each BMC binding's tls block decides trust).
import { z } from "zod";
import { bmcTls } from "better-compute/metal/bmc-address";
import { SECRET_REF } from "../../core/schemas.ts";
import { AgentError, inLane, type AgentLogger, type CommandContext, type CommandHandler, type FetchLike } from "../contracts.ts";
import { ConsoleSessions, telnetConsole, type ConsoleStream } from "./console.ts";
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
  /** BMC drivers bcd hosts as bcx plugins (docs/bcx.md): a binding whose driver is not redfish goes to one of them. */
  hosted?: HostedDrivers;
}

/** What the site role needs of bcd's plugin host (agent/bcx/host.ts). */
export interface HostedDrivers {
  drivers(): ReadonlyArray<{ id: string; kinds: readonly string[]; operations: readonly string[]; streams: readonly string[] }>;
  invoke(driverId: string, op: string, args: unknown[], opts?: { deadlineMs?: number; signal?: AbortSignal }): Promise<unknown>;
  /** A driver's stream (a BMC driver's "console"), listed in its manifest's streams. */
  openStream(driverId: string, op: string, args: unknown[]): ConsoleStream;
}

/**
 * The BMC driver contract over bcx: each metal.bmc.* kind is one operation of the hosted driver,
 * its first argument the binding (with the password's value), the rest the body's fields in order.
 */
const BMC_OPERATIONS: Record<string, { op: string; args: (body: Record<string, unknown>) => unknown[] }> = {
  "metal.bmc.inspect": { op: "inspect", args: () => [] },
  "metal.bmc.power": { op: "power.set", args: (b) => [b.action] },
  "metal.bmc.boot": { op: "boot.set", args: (b) => [b.device, b.once ?? true] },
  "metal.bmc.media.insert": { op: "media.insert", args: (b) => [b.url] },
  "metal.bmc.media.eject": { op: "media.eject", args: () => [] },
  "metal.bmc.bios": { op: "bios.apply", args: (b) => [b.attributes] },
  "metal.bmc.raid": { op: "raid.apply", args: (b) => [{ level: b.level, drives: b.drives ?? "all" }] },
};
/** A console read's answer is one result frame (64 KiB): this many bytes, base64, fit with room to spare. */
export const MAX_CONSOLE_READ_BYTES = 32 * 1024;
const consoleBody = z.object({
  bmc: z.object({ driver: z.string().optional(), address: z.string().min(1) }).passthrough(),
  /** Where the reader left off: the connection's session and the offset in it (none: from the oldest byte kept). */
  from: z.object({ session: z.string().min(1).max(64), offset: z.number().int().min(0) }).optional(),
  maxBytes: z.number().int().min(0).max(MAX_CONSOLE_READ_BYTES).default(MAX_CONSOLE_READ_BYTES),
  /** How long to wait for bytes when there are none yet (a long poll). */
  waitMs: z.number().int().min(0).max(10_000).default(2_000),
  /** Keystrokes to type first (base64). */
  input: z.base64().max(8192).optional(),
});

/** How long a hosted driver may take over one BMC operation (a power-on waits for the state). */
const HOSTED_BMC_DEADLINE_MS = 90_000;

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
/** A binding for a hosted driver: its plugin checks the rest (the control plane's manifest did at enroll). */
const hostedBmc = bmc
  .omit({ tls: true })
  .extend({ driver: z.string().min(1) })
  .catchall(z.unknown());

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
  const log = options.log ?? silent;

  /** Runs one BMC operation, logging its outcome and duration (never a credential: messages are scrubbed by whoever threw). */
  async function logged(kind: string, target: { driver?: string; bmc?: string }, op: () => Promise<unknown>): Promise<unknown> {
    const started = Date.now();
    try {
      const output = await op();
      log.info("bmc operation", { kind, ...target, outcome: "ok", durationMs: Date.now() - started });
      const warning = (output as { warning?: unknown } | undefined)?.warning;
      if (typeof warning === "string") log.warn("bmc operation warning", { kind, ...target, warning });
      return output;
    } catch (e) {
      const { code, message, permanent } = (e ?? {}) as { code?: unknown; message?: unknown; permanent?: unknown };
      log.warn("bmc operation failed", {
        kind,
        ...target,
        outcome: typeof code === "string" ? code : "ERROR",
        durationMs: Date.now() - started,
        error: typeof message === "string" ? message : String(e),
        ...(permanent === true ? { permanent } : {}),
      });
      throw e;
    }
  }

  /** A Redfish handler: validates the body, then runs `op` against the body's BMC. */
  const onBmc =
    <T extends { bmc: BmcBody }>(schema: z.ZodType<T>, op: (client: RedfishClient, body: T) => Promise<unknown>): CommandHandler =>
    (raw, ctx) => {
      // The client's address: a refused one may hold a credential, so it is not logged.
      const target: { bmc?: string } = {};
      return logged(ctx.kind, target, () => {
        const body = parseBody(ctx.kind, schema, raw);
        const client = new RedfishClient(resolveBmc(body.bmc, ctx), {
          fetch: options.fetch,
          timeoutMs: options.timeoutMs,
          powerWait: options.powerWait,
          signal: ctx.signal,
        });
        target.bmc = client.address;
        return op(client, body);
      });
    };

  /** A binding naming a driver other than redfish: the plugin bcd hosts for it does the operation. */
  const onHostedBmc = (driverId: string, raw: Record<string, unknown>, ctx: CommandContext): Promise<unknown> => {
    const contract = BMC_OPERATIONS[ctx.kind]!;
    const body = parseBody(ctx.kind, z.object({ bmc: hostedBmc }).passthrough(), raw);
    return logged(ctx.kind, { driver: driverId, bmc: body.bmc.address }, async () => {
      const driver = options.hosted?.drivers().find((d) => d.id === driverId);
      const unsupported = (message: string) => new AgentError("UNSUPPORTED", message, undefined, { permanent: true });
      if (!driver) throw unsupported(`this site agent hosts no BMC driver ${driverId}: pin its plugin in bcd's [plugins] (docs/bcx.md)`);
      if (!driver.operations.includes(contract.op)) throw unsupported(`BMC driver ${driverId} does not do ${contract.op} (${ctx.kind})`);
      const binding = { ...body.bmc, password: resolveBmc(body.bmc, ctx).password };
      return options.hosted!.invoke(driverId, contract.op, [binding, ...contract.args(body)], {
        deadlineMs: HOSTED_BMC_DEADLINE_MS,
        signal: ctx.signal,
      });
    });
  };

  /** Each BMC is its own lane whichever driver drives it: one machine's commands run in order, different machines' side by side. */
  const byDriver =
    (redfish: CommandHandler): CommandHandler =>
    (raw, ctx) => {
      const driver = (raw.bmc as { driver?: unknown } | undefined)?.driver;
      return driver === undefined || driver === "redfish" ? redfish(raw, ctx) : onHostedBmc(String(driver), raw, ctx);
    };

  /**
   * metal.bmc.console: the machine's serial console, read from where the reader left off (and typed
   * into). Outside the BMC's lane: a read waits for bytes, and must not hold back a power command.
   */
  const consoles = new ConsoleSessions();
  const readConsole: CommandHandler = async (raw, ctx) => {
    const body = parseBody(ctx.kind, consoleBody, raw);
    const driverId = body.bmc.driver ?? "redfish";
    const open = async (): Promise<ConsoleStream> => {
      if (driverId === "redfish") {
        const binding = parseBody(ctx.kind, z.object({ bmc }), raw).bmc;
        const client = new RedfishClient(resolveBmc(binding, ctx), {
          fetch: options.fetch,
          timeoutMs: options.timeoutMs,
          signal: ctx.signal,
        });
        const { host, port } = await client.consoleEndpoint();
        return telnetConsole(host, port);
      }
      const driver = options.hosted?.drivers().find((d) => d.id === driverId);
      if (!driver?.streams.includes("console"))
        throw new AgentError("UNSUPPORTED", `this site agent hosts no BMC driver ${driverId} with a console stream`, undefined, {
          permanent: true,
        });
      const binding = parseBody(ctx.kind, z.object({ bmc: hostedBmc }), raw).bmc;
      return options.hosted!.openStream(driverId, "console", [{ ...binding, password: resolveBmc(binding, ctx).password }]);
    };
    const key = `${driverId}:${body.bmc.address}`;
    if (body.input) await consoles.write(key, open, Buffer.from(body.input, "base64"));
    const read = await consoles.read(key, open, {
      from: body.from,
      maxBytes: body.maxBytes,
      waitMs: body.input ? 0 : body.waitMs,
      signal: ctx.signal,
    });
    return {
      session: read.session,
      offset: read.offset,
      data: read.data.toString("base64"),
      skipped: read.skipped,
      ...(read.ended ? { ended: read.ended } : {}),
    };
  };

  const handlers: Record<string, CommandHandler> = {
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
  return {
    ...Object.fromEntries(Object.entries(handlers).map(([kind, handler]) => [kind, inLane(bmcLane, byDriver(handler))])),
    "metal.bmc.console": readConsole,
  };
}
