// The local stack's Hyperdrive binding: wrangler dev emulates a `[[hyperdrive]]` binding by handing
// the Worker a connectionString whose TCP connections workerd forwards to a local database, so the
// Worker runs the production code path (node-postgres over cloudflare:sockets) against PGlite or
// DATABASE_URL. The root wrangler.toml does not declare the binding (a placeholder id would fail
// `wrangler deploy`), so the stack runs a copy of the config that does.
import fs from "node:fs";
import path from "node:path";

/** The environment variable wrangler dev reads a binding's local connection string from. */
export const LOCAL_CONNECTION_STRING_VAR = "CLOUDFLARE_HYPERDRIVE_LOCAL_CONNECTION_STRING_HYPERDRIVE";

export interface LocalHyperdrive {
  /** The wrangler config to run: the given one when it declares the binding, else a copy in dir that does. */
  config: string;
  /** For wrangler dev's environment: the database the binding reaches (kept out of the config file). */
  env: Record<string, string>;
}

/**
 * The config and environment for wrangler dev with HYPERDRIVE bound to `databaseUrl`. The copy keeps
 * every line of the original but `main`, made absolute (it is relative to the config's folder).
 */
export function localHyperdrive(wranglerConfig: string, dir: string, databaseUrl: string): LocalHyperdrive {
  const env = { [LOCAL_CONNECTION_STRING_VAR]: databaseUrl };
  const toml = fs.readFileSync(wranglerConfig, "utf8");
  if (/^\s*binding\s*=\s*"HYPERDRIVE"/m.test(toml)) return { config: wranglerConfig, env };
  const main = /^main\s*=\s*"([^"]+)"\s*$/m.exec(toml);
  if (!main) throw new Error(`${wranglerConfig}: expected a line main = "…" (the Worker's entry)`);
  const absoluteMain = path.resolve(path.dirname(wranglerConfig), main[1]!);
  const copy = path.join(dir, "wrangler.local.toml");
  fs.writeFileSync(
    copy,
    `# Written by the local stack from ${wranglerConfig}: the same config with main made absolute and\n` +
      `# the HYPERDRIVE binding added (its local connection string comes from ${LOCAL_CONNECTION_STRING_VAR}).\n` +
      toml.replace(main[0], `main = ${JSON.stringify(absoluteMain)}`) +
      `\n[[hyperdrive]]\nbinding = "HYPERDRIVE"\nid = "local"\n`,
  );
  return { config: copy, env };
}

/** wrangler dev's emulation needs a user and a password in the URL (a local trust-auth URL has none). */
export function hyperdriveCanReach(databaseUrl: string): boolean {
  const url = new URL(databaseUrl);
  return url.username !== "" && url.password !== "";
}
