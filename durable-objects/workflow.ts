// WorkflowDO: one per workflow (idFromName(workflowId)). It drives the provision engine's
// advance() and keeps nothing but its alarm: the time of its next pass. Everything else (the
// workflow, its attempts, their commands) is in Postgres, so an aborted object resumes where the
// record is. Its name is the workflow id (ctx.id.name).
import { DurableObject } from "cloudflare:workers";
import type { Bindings, WakeableObject } from "../core/bindings.ts";
import type { Compute } from "../core/compute.ts";
import { createLogger } from "../core/log.ts";
import { advance } from "../plugins/provision/engine.ts";
import { setAlarm } from "./alarm.ts";
import { PassStore } from "./pass-store.ts";
import { SerialBatches } from "./serial.ts";

export function workflowObject(compute: Compute) {
  return class WorkflowDO extends DurableObject<Bindings> implements WakeableObject {
    readonly #db = new PassStore(() => compute.openStore(this.env), createLogger({ component: "workflow-do" }));
    /** One advance at a time; wake-ups that arrive meanwhile share the next one (it reads the record afresh). */
    readonly #passes = new SerialBatches(() => this.advanceOnce());

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
      const next = await this.#db.next(
        async (store) => {
          const result = await advance(compute.moduleContext("provision", this.env, store), workflowId);
          // The workflow ended: whoever started it (metal's lifecycle) moves on now, not at the next cron.
          if (result.wakeInMs === null && result.state !== "missing")
            await compute.reconcile(this.env, store, { workflowEnded: workflowId });
          return result.wakeInMs;
        },
        "advancing the workflow failed; retrying",
        { workflow: workflowId },
      );
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
