// The site agent's network boot commands: which machines it boots and into what, and the images
// their ramdisks write, mirrored into the site's cache. The ramdisk's join token arrives as a
// secret reference resolved at delivery (ctx.secrets): never in the command's body, its result,
// the journal or a log line; it reaches only the machine's iPXE script.
import { z } from "zod";
import { SECRET_REF } from "../../../core/schemas.ts";
import { AgentError, inLane, type CommandHandler } from "../../contracts.ts";
import { parseBody } from "../site.ts";
import type { NetbootService } from "./service.ts";

const setBody = z.object({
  machine: z.string().min(1).max(128),
  macs: z.array(z.string().min(1).max(32)).min(1).max(16),
  action: z.enum(["ramdisk", "disk"]),
  /** The ramdisk's join token, by reference (action ramdisk). */
  token: z.string().regex(SECRET_REF, "must be a secret://<id> reference, never the token itself").optional(),
});

const sha256 = z.string().regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits");
/** An image at a URL with its sha256, or a blob of the control plane's by its sha256. */
const imageBody = z.union([z.strictObject({ url: z.url({ protocol: /^https?$/ }), sha256 }), z.strictObject({ blob: sha256 })]);

export function netbootHandlers(service: NetbootService): Record<string, CommandHandler> {
  return {
    "metal.netboot.set": async (raw, ctx) => {
      const body = parseBody(ctx.kind, setBody, raw);
      let token: string | undefined;
      if (body.token) {
        token = ctx.secrets?.[body.token];
        if (token === undefined) throw new AgentError("INVALID_ARGUMENT", `the command carries no value for ${body.token}`);
      }
      const machine = await service.set({ machine: body.machine, macs: body.macs, action: body.action, ...(token ? { token } : {}) });
      return { machine: machine.machine, macs: machine.macs, action: machine.action };
    },
    "metal.netboot.clear": async (raw, ctx) => {
      const { machine } = parseBody(ctx.kind, z.object({ machine: z.string().min(1).max(128) }), raw);
      return { machine, cleared: await service.clear(machine) };
    },
    // One image at a time per image: a second command for one being fetched waits for it.
    "metal.images.cache": inLane(
      (body) => {
        const digest = body.sha256 ?? body.blob;
        return typeof digest === "string" ? `image:${digest.toLowerCase()}` : undefined;
      },
      async (raw, ctx) => service.cacheImage(parseBody(ctx.kind, imageBody, raw), ctx.signal),
    ),
  };
}
