// What a deployment's Worker entry exports, built from its compute: the fetch and cron
// handlers and the WorkflowDO class bound to that compute (its steps and profiles).
import type { Compute } from "../../core/compute.ts";
import { workflowObject } from "../../durable-objects/workflow.ts";
import { wakeStalledWorkflows } from "../../plugins/provision/module.ts";

export function deploymentEntry(compute: Compute) {
  return {
    WorkflowDO: workflowObject(compute),
    handler: {
      fetch: (request, env, ctx) => compute.fetch(request, env, ctx),
      scheduled: (_event, env, ctx) => ctx.waitUntil(sweep(compute, env)),
    } satisfies ExportedHandler<object>,
  };
}

/** The cron safety net: workflows nobody advanced for a minute are woken, and every reconciler runs. */
export async function sweep(compute: Compute, env: object): Promise<number> {
  const store = compute.openStore(env);
  try {
    const provision = compute.registry.modules.some((m) => m.id === "provision");
    const woken = provision ? await wakeStalledWorkflows(compute.moduleContext("provision", env, store)) : 0;
    return woken + (await compute.reconcile(env, store));
  } finally {
    await store.close();
  }
}
