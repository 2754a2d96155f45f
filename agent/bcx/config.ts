// bcd's configuration file (`bcd run --config FILE`, TOML): today its [plugins] section, the bcx
// plugins bcd hosts (docs/bcx.md). Every key is checked, unknown ones refused, and each problem
// names its field; pins are checked against the bytes on disk before every start (readPinned).
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { parse as parseToml } from "smol-toml";
import { z } from "zod";
import { AgentError } from "../contracts.ts";
import { DRIVER_ID } from "./protocol.ts";

/** A plugin file and the sha256 its bytes must have. */
export interface PluginPin {
  /** Absolute. */
  path: string;
  /** Lowercase hex. */
  sha256: string;
  /** The driver id its handshake must announce, when the operator names it. */
  id?: string;
}

export interface PluginsConfig {
  /** Where relative pin paths were resolved (absolute). */
  dir: string;
  /** Who unprivileged plugins run as: a user name or a uid (never root). */
  user: string | number;
  /** Their group; default the user's own. */
  group?: string | number;
  /** Plugin ids or file names that run as root, without the seccomp filter. */
  privileged: string[];
  pins: PluginPin[];
}

export interface BcdConfig {
  plugins?: PluginsConfig;
}

/** A configuration file bcd cannot use: the message names the file and the field. */
export class ConfigError extends Error {
  override name = "ConfigError";
}

const notRoot = (v: string | number) => v !== 0 && v !== "root" && v !== "0";
const principal = z
  .union([
    z.string().min(1).max(64),
    z
      .number()
      .int()
      .min(1)
      .max(2 ** 31 - 1),
  ])
  .refine(notRoot, "must not be root: a plugin that needs root is named under privileged");

const schema = z.strictObject({
  plugins: z
    .strictObject({
      dir: z.string().min(1).optional(),
      user: principal.default("nobody"),
      group: principal.optional(),
      privileged: z.array(z.string().min(1).max(255)).max(256).default([]),
      pin: z
        .array(
          z.strictObject({
            path: z.string().min(1).max(4096),
            sha256: z.string().regex(/^[0-9a-fA-F]{64}$/, "must be the file's sha256: 64 hex digits (sha256sum FILE)"),
            id: z.string().max(128).regex(DRIVER_ID, "must be a driver id").optional(),
          }),
        )
        .max(256)
        .default([]),
    })
    .optional(),
});

/** The configuration in text (read from file), checked; ConfigError naming the field otherwise. */
export function parseBcdConfig(text: string, file: string): BcdConfig {
  let raw: unknown;
  try {
    raw = parseToml(text);
  } catch (e) {
    throw new ConfigError(`${file}: not TOML: ${(e as Error).message.split("\n")[0]}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const where = issue.path.map((p, i) => (typeof p === "number" ? `[${p}]` : `${i ? "." : ""}${String(p)}`)).join("");
    throw new ConfigError(`${file}: ${where || "the file"}: ${issue.message}`);
  }
  const plugins = parsed.data.plugins;
  if (!plugins) return {};
  const base = path.dirname(path.resolve(file));
  const dir = path.resolve(base, plugins.dir ?? ".");
  const pins = plugins.pin.map((p) => ({ path: path.resolve(dir, p.path), sha256: p.sha256.toLowerCase(), ...(p.id ? { id: p.id } : {}) }));
  pins.forEach((p, i) => {
    if (pins.findIndex((q) => q.path === p.path) !== i) throw new ConfigError(`${file}: plugins.pin[${i}].path: ${p.path} is pinned twice`);
  });
  for (const name of plugins.privileged)
    if (!pins.some((p) => matches(p, name)))
      throw new ConfigError(`${file}: plugins.privileged: ${name} names no pinned plugin (by id or file name)`);
  return {
    plugins: {
      dir,
      user: plugins.user,
      ...(plugins.group !== undefined ? { group: plugins.group } : {}),
      privileged: plugins.privileged,
      pins,
    },
  };
}

export async function readBcdConfig(file: string): Promise<BcdConfig> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    throw new ConfigError(`${file}: cannot read it: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  return parseBcdConfig(text, file);
}

/** The name a plugin goes by before its handshake says its id: its file's name. */
export const pluginFileName = (pin: PluginPin) => path.basename(pin.path);

/** A name under privileged matches a pin by its id, its file name, or its file name without the extension. */
function matches(pin: PluginPin, name: string): boolean {
  const file = pluginFileName(pin);
  return pin.id === name || file === name || file.replace(/\.[^.]*$/, "") === name;
}

export const isPrivileged = (config: PluginsConfig, pin: PluginPin) => config.privileged.some((name) => matches(pin, name));

/**
 * The pinned file's bytes, read once and checked against the pin (what runs is what was checked).
 * An AgentError otherwise, whose message the caller prefixes with the plugin's name.
 */
export async function readPinned(pin: PluginPin): Promise<Buffer> {
  let bytes: Buffer;
  try {
    bytes = await readFile(pin.path);
  } catch (e) {
    throw new AgentError("DRIVER_ERROR", `cannot read ${pin.path}: ${(e as NodeJS.ErrnoException).code ?? e}`);
  }
  const actual = createHash("sha256").update(bytes).digest("hex");
  if (actual !== pin.sha256)
    throw new AgentError(
      "DRIVER_ERROR",
      `refused: ${pin.path} has sha256 ${actual.slice(0, 16)}…, the config pins ${pin.sha256.slice(0, 16)}…`,
      undefined,
      {
        permanent: true,
      },
    );
  return bytes;
}
