// Waking Durable Objects after a transaction commits: a NodeDO delivers the commands just
// enqueued, a WorkflowDO advances its workflow. Best effort: a missed wake-up is caught by the
// object's own sweep (NodeDO) or the cron sweep (workflows, sinks), so nothing waits forever.
import type { Bindings, WakeableObject } from "../bindings.ts";
import type { Logger } from "../log.ts";

/** The deployment's Durable Object bindings (wrangler.toml durable_objects.bindings). */
export const BINDINGS = { node: "NODE", workflow: "WORKFLOW", sinks: "SINKS" } as const;
export type ObjectKind = keyof typeof BINDINGS;
/** The SinkDO's name: one object drives every sink (each sink's cursor row keeps its passes one at a time). */
export const SINKS_OBJECT = "sinks";

export function objectNamespace(env: Bindings, kind: ObjectKind): DurableObjectNamespace<WakeableObject> | undefined {
  const ns = env[BINDINGS[kind]];
  return typeof ns?.idFromName === "function" ? ns : undefined;
}

export const nodeNamespace = (env: Bindings) => objectNamespace(env, "node");

/**
 * A command's origin (CommandInput.origin): the Durable Object that waits for its result,
 * "<kind>:<name>", woken when the result is recorded.
 */
export const objectOrigin = (kind: ObjectKind, name: string) => `${kind}:${name}`;

/** The object an origin names, if it names one of the deployment's kinds. */
export function originObject(origin: string | null | undefined): { kind: ObjectKind; name: string } | undefined {
  const colon = origin?.indexOf(":") ?? -1;
  if (!origin || colon <= 0) return undefined;
  const kind = origin.slice(0, colon);
  return kind in BINDINGS ? { kind: kind as ObjectKind, name: origin.slice(colon + 1) } : undefined;
}

/** Calls wake() on each named object (an RPC: the object knows its name, ctx.id.name). */
export async function wakeObjects(env: Bindings, kind: ObjectKind, names: Iterable<string>, log: Logger): Promise<void> {
  const ns = objectNamespace(env, kind);
  if (!ns) return;
  await Promise.all(
    [...names].map(async (name) => {
      try {
        await ns.get(ns.idFromName(name)).wake();
      } catch (err) {
        log.warn(`could not wake the ${kind}'s object; its sweep will catch up`, {
          [kind]: name,
          error: err instanceof Error ? err.message : String(err),
        });
      }
    }),
  );
}
