// better-compute/driver-sdk: out-of-process drivers (bcx, docs/bcx.md).
//   serveDriver            the plugin side: a driver in its own process, spoken to over stdio
//   externalDriver         the control plane's declaration of it (betterCompute({ drivers: [...] }))
//   driverConformanceCases what every plugin must do, run against the real process (bcxSubject)
//
// This entry loads on Workers too (externalDriver is declared in the control plane's config): what
// needs Node's processes (bcd's PluginHost, behind bcxSubject) is imported only when called.
import type { z } from "zod";
import { defineDriver, type DriverDefinition, type DriverKind } from "../../core/contracts.ts";
import type { BcxSubject } from "./conformance.ts";
import type { BcxSubjectOptions } from "./subject.ts";

export {
  serveDriver,
  DriverError,
  type DriverOperation,
  type DriverStream,
  type Invocation,
  type ServeDriverOptions,
  type StreamIo,
} from "./serve.ts";
export { driverConformanceCases, type BcxSubject } from "./conformance.ts";
export type { BcxSubjectOptions } from "./subject.ts";
export type { BcxStream, HostedDriver, InvokeOptions, PluginHost, PluginStatus, PluginTiming } from "./host.ts";
export { BCX_PROTOCOL, MAX_FRAME_BYTES, PLUGIN_ERROR_CODES, type Manifest, type PluginErrorCode } from "./protocol.ts";

/** A plugin file started by bcd's PluginHost (sandboxed unless privileged), for driverConformanceCases and a plugin's tests. */
export async function bcxSubject(opts: BcxSubjectOptions): Promise<BcxSubject> {
  return (await import("./subject.ts")).bcxSubject(opts);
}

export interface ExternalDriverOptions {
  id: string;
  version?: string;
  kinds: DriverKind[];
  /** The agent role whose bcd hosts the plugin. */
  runsOn: "site" | "node" | "ramdisk";
  /** Schema of a binding's configuration (a BMC binding's fields, for a power driver). */
  manifest?: z.ZodType;
  /** The binding's fields that hold secret references, never values. */
  secretFields?: string[];
}

/**
 * A driver served by a bcx plugin, declared on the control plane like any other (drivers.list
 * shows it, with transport "bcx"); its code runs in the plugin that bcd hosts on the agents.
 */
export function externalDriver(def: ExternalDriverOptions): DriverDefinition {
  return defineDriver({ ...def, transport: "bcx" });
}
