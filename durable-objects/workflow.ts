// WorkflowDO: one per workflow (idFromName(workflowId)). It drives the provision engine's
// advance() and keeps only a schedule in its SQLite: a table of named wake-up times
// multiplexed on the one alarm and re-armed on start. Everything else (the workflow, its
// attempts, their commands) is in Postgres, so an aborted object resumes where the record is.
import { DurableObject } from "cloudflare:workers";
import type { Compute } from "../core/compute.ts";
import { createLogger } from "../core/log.ts";
import type { Store } from "../core/store/database.ts";
import { advance } from "../plugins/provision/engine.ts";

/** After a failed pass (the database unreachable), try again this soon. */
const RETRY_MS = 5_000;

export function workflowObject(compute: Compute) {
  return class WorkflowDO extends DurableObject {
    #store: Store | undefined;
    #running: Promise<void> = Promise.resolve();
    readonly #log = createLogger({ component: "workflow-do" });

    constructor(ctx: DurableObjectState, env: object) {
      super(ctx, env as never);
      ctx.blockConcurrencyWhile(async () => {
        this.ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS schedule (name TEXT PRIMARY KEY, at INTEGER NOT NULL)");
        this.ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS identity (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
        // A schedule that outlived the object (evicted, aborted) is armed again.
        if ((await this.ctx.storage.getAlarm()) === null) await this.arm();
      });
    }

    private get store(): Store {
      return (this.#store ??= compute.openStore(this.env as object));
    }

    override async fetch(request: Request): Promise<Response> {
      const name = request.headers.get("x-bc-name");
      if (new URL(request.url).pathname !== "/wake" || !name) return new Response("not found", { status: 404 });
      this.ctx.storage.sql.exec("INSERT OR IGNORE INTO identity (key, value) VALUES ('workflow', ?)", name);
      await this.run();
      return new Response(null, { status: 204 });
    }

    override async alarm(): Promise<void> {
      this.ctx.storage.sql.exec("DELETE FROM schedule WHERE at <= ?", Date.now());
      await this.run();
    }

    /** One advance at a time; the next wake-up goes into the schedule. */
    private run(): Promise<void> {
      this.#running = this.#running.then(() => this.advanceOnce());
      return this.#running;
    }

    private async advanceOnce(): Promise<void> {
      const row = this.ctx.storage.sql.exec<{ value: string }>("SELECT value FROM identity WHERE key = 'workflow'").toArray()[0];
      if (!row) return;
      try {
        const ctx = compute.moduleContext("provision", this.env as object, this.store);
        const result = await advance(ctx, row.value);
        if (result.wakeInMs === null) {
          this.ctx.storage.sql.exec("DELETE FROM schedule WHERE name = 'advance'");
          // The workflow ended: whoever started it (metal's lifecycle) moves on now, not at the next cron.
          if (result.state !== "missing") await compute.reconcile(this.env as object, this.store);
        } else this.schedule("advance", Date.now() + result.wakeInMs);
      } catch (err) {
        this.#log.warn("advancing the workflow failed; retrying", { workflow: row.value, error: err instanceof Error ? err.message : String(err) });
        this.#store = undefined;
        this.schedule("advance", Date.now() + RETRY_MS);
      }
      await this.arm();
    }

    private schedule(name: string, at: number): void {
      this.ctx.storage.sql.exec("INSERT INTO schedule (name, at) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET at = excluded.at", name, at);
    }

    /** The one alarm is set to the soonest entry of the schedule. */
    private async arm(): Promise<void> {
      const next = this.ctx.storage.sql.exec<{ at: number | null }>("SELECT min(at) AS at FROM schedule").toArray()[0]?.at ?? null;
      if (next === null) await this.ctx.storage.deleteAlarm();
      else await this.ctx.storage.setAlarm(Math.max(next, Date.now()));
    }
  };
}
