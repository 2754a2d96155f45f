// What a deployment's Worker entry exports, built from its compute: the fetch and cron handlers
// and the Durable Object classes bound to that compute (its database port, secret store, steps
// and profiles).
import type { Bindings } from "../../core/bindings.ts";
import type { Compute } from "../../core/compute.ts";
import { nodeObject } from "../../durable-objects/node.ts";
import { sinkObject } from "../../durable-objects/sinks.ts";
import { workflowObject } from "../../durable-objects/workflow.ts";

export function deploymentEntry(compute: Compute) {
  return {
    NodeDO: nodeObject(compute),
    WorkflowDO: workflowObject(compute),
    SinkDO: sinkObject(compute),
    handler: {
      fetch: (request, env, ctx) => compute.fetch(request, env, ctx),
      scheduled: (_event, env, ctx) => ctx.waitUntil(sweep(compute, env)),
    } satisfies ExportedHandler<Bindings>,
  };
}

/** The cron safety net: what the modules registered for it (their sweeps, then their reconcilers), on a store of its own. */
export async function sweep(compute: Compute, env: Bindings): Promise<number> {
  const store = compute.openStore(env);
  try {
    return await compute.sweep(env, store);
  } finally {
    await store.close();
  }
}
