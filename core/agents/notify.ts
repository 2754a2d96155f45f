// Waking Durable Objects after a transaction commits: a NodeDO delivers the commands just
// enqueued, a WorkflowDO advances its workflow. Best effort: a missed wake-up is caught by the
// object's own sweep (NodeDO) or the cron sweep (workflows), so nothing waits forever.
import type { Logger } from "../log.ts";

/** The deployment's Durable Object bindings (wrangler.toml durable_objects.bindings). */
export const BINDINGS = { node: "NODE", workflow: "WORKFLOW" } as const;
export type ObjectKind = keyof typeof BINDINGS;

export function objectNamespace(env: object, kind: ObjectKind): DurableObjectNamespace | undefined {
  const ns = (env as Record<string, unknown>)[BINDINGS[kind]];
  return ns && typeof (ns as DurableObjectNamespace).idFromName === "function" ? (ns as DurableObjectNamespace) : undefined;
}

export const nodeNamespace = (env: object) => objectNamespace(env, "node");

export async function wakeObjects(env: object, kind: ObjectKind, names: Iterable<string>, log: Logger): Promise<void> {
  const ns = objectNamespace(env, kind);
  if (!ns) return;
  await Promise.all(
    [...names].map(async (name) => {
      try {
        const res = await ns.get(ns.idFromName(name)).fetch(`https://${kind}.internal/wake`, { method: "POST", headers: { "x-bc-name": name } });
        await res.body?.cancel();
      } catch (err) {
        log.warn(`could not wake the ${kind}'s object; its sweep will catch up`, { [kind]: name, error: err instanceof Error ? err.message : String(err) });
      }
    }),
  );
}
