// WorkflowDO: one per workflow (idFromName(workflowId)). It drives the provision engine's
// advance() and keeps nothing but its alarm: the time of its next pass. Everything else (the
// workflow, its attempts, their commands) is in Postgres, so an aborted object resumes where the
// record is. Its name is the workflow id (ctx.id.name).
import { DurableObject } from "cloudflare:workers";
import type { Bindings, WakeableObject } from "../core/bindings.ts";
import type { Compute } from "../core/compute.ts";
import { createLogger } from "../core/log.ts";
import type { Store } from "../core/store/database.ts";
import { advance } from "../plugins/provision/engine.ts";
import { setAlarm } from "./alarm.ts";
import { SerialBatches } from "./serial.ts";

/** After a failed pass (the database unreachable), try again this soon. */
const RETRY_MS = 5_000;

export function workflowObject(compute: Compute) {
  return class WorkflowDO extends DurableObject<Bindings> implements WakeableObject {
    #store: Store | undefined;
    /** One advance at a time; wake-ups that arrive meanwhile share the next one (it reads the record afresh). */
    readonly #passes = new SerialBatches(() => this.advanceOnce());
    readonly #log = createLogger({ component: "workflow-do" });

    private get store(): Store {
      return (this.#store ??= compute.openStore(this.env));
    }

    /** Someone changed the workflow (started it, recorded a result it waits for): advance it now. */
    wake(): Promise<void> {
      return this.run();
    }

    override async alarm(): Promise<void> {
      await this.run();
    }

    private run(): Promise<void> {
      return this.#passes.add();
    }

    private async advanceOnce(): Promise<void> {
      const workflowId = this.workflowId();
      if (!workflowId) return;
      let next: number | null;
      try {
        const ctx = compute.moduleContext("provision", this.env, this.store);
        const result = await advance(ctx, workflowId);
        next = result.wakeInMs === null ? null : Date.now() + result.wakeInMs;
        // The workflow ended: whoever started it (metal's lifecycle) moves on now, not at the next cron.
        if (result.wakeInMs === null && result.state !== "missing") await compute.reconcile(this.env, this.store);
      } catch (err) {
        this.#log.warn("advancing the workflow failed; retrying", {
          workflow: workflowId,
          error: err instanceof Error ? err.message : String(err),
        });
        this.#store = undefined;
        next = Date.now() + RETRY_MS;
      }
      await setAlarm(this.ctx.storage, next);
    }

    /**
     * The workflow's id: the object's name. An object created before the name was read this way
     * remembered it in an `identity` table, read when the runtime does not give the name (an
     * alarm scheduled by an older runtime).
     */
    private workflowId(): string | undefined {
      if (this.ctx.id.name) return this.ctx.id.name;
      const sql = this.ctx.storage.sql;
      if (sql.exec("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'identity'").toArray().length === 0) return undefined;
      return sql.exec<{ value: string }>("SELECT value FROM identity WHERE key = 'workflow'").toArray()[0]?.value;
    }
  };
}
