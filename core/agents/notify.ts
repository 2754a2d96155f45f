// After a transaction that enqueued commands commits, wake each target node's NodeDO so it
// delivers them now. Best effort: a missed poke is caught by the NodeDO's own sweep and by
// the delivery every (re)connect starts with.
import type { Logger } from "../log.ts";

/** The deployment's binding of NodeDO (wrangler.toml: durable_objects.bindings name "NODE"). */
export const NODE_BINDING = "NODE";

export function nodeNamespace(env: object): DurableObjectNamespace | undefined {
  const ns = (env as Record<string, unknown>)[NODE_BINDING];
  return ns && typeof (ns as DurableObjectNamespace).idFromName === "function" ? (ns as DurableObjectNamespace) : undefined;
}

export async function notifyNodes(env: object, nodeIds: Iterable<string>, log: Logger, path = "/poke"): Promise<void> {
  const ns = nodeNamespace(env);
  if (!ns) return;
  await Promise.all(
    [...nodeIds].map(async (nodeId) => {
      try {
        const res = await ns.get(ns.idFromName(nodeId)).fetch(`https://node.internal${path}`, { method: "POST", headers: { "x-bc-node-id": nodeId } });
        await res.body?.cancel();
      } catch (err) {
        log.warn("could not wake the node's object; its sweep will deliver", { nodeId, error: err instanceof Error ? err.message : String(err) });
      }
    }),
  );
}
