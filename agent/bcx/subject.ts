// bcxSubject: a plugin file started by a PluginHost of its own, pinned to its current bytes, for
// driverConformanceCases (agent/bcx/conformance.ts) and a plugin's own tests.
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import type { AgentLogger } from "../contracts.ts";
import type { BcxSubject } from "./conformance.ts";
import { PluginHost, type PluginTiming } from "./host.ts";

export interface BcxSubjectOptions {
  /** The plugin's file (one file: a bundle, or an executable). */
  file: string;
  /** Run it as root without the filter, as [plugins] privileged does (default: sandboxed, as bcd runs a plugin). */
  privileged?: boolean;
  samples?: Record<string, unknown[]>;
  /** Where bcd's log lines about it (and its stderr) go (default: nowhere). */
  log?: AgentLogger;
  timing?: Partial<PluginTiming>;
}

const silent: AgentLogger = { info() {}, warn() {}, error() {} };

export async function bcxSubject(opts: BcxSubjectOptions): Promise<BcxSubject> {
  const file = path.resolve(opts.file);
  const sha256 = createHash("sha256")
    .update(await readFile(file))
    .digest("hex");
  const timing = { cancelGraceMs: 2_000, pingTimeoutMs: 2_000, ...opts.timing };
  const host = await PluginHost.start(
    { dir: path.dirname(file), user: "nobody", privileged: opts.privileged ? [path.basename(file)] : [], pins: [{ path: file, sha256 }] },
    { log: opts.log ?? silent, builtinDrivers: [], timing },
  );
  const [driver] = host.drivers();
  if (!driver) {
    const why = host.status()[0]?.error ?? "it exited or hung before its handshake";
    await host.close();
    throw new Error(`${path.basename(file)} did not complete its handshake: ${why}`);
  }
  return { host, driver, samples: opts.samples ?? {}, cancelGraceMs: timing.cancelGraceMs, close: () => host.close() };
}
