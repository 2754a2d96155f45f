// SinkDO: the one object (idFromName("sinks")) that drives the sink dispatcher
// (core/events/dispatch.ts). A transaction that wrote events or audit rows wakes it after its
// commit; its alarm then runs passes over every sink until each is caught up, and comes back
// when a failing sink's backoff is due. It keeps nothing but the alarm: cursors, retry state and
// dead letters are in Postgres, and each sink's cursor row keeps passes one at a time, so the
// cron sweep's pass (the safety net) may race it harmlessly.
import { DurableObject } from "cloudflare:workers";
import type { Bindings, WakeableObject } from "../core/bindings.ts";
import type { Compute } from "../core/compute.ts";
import { drainSinks } from "../core/events/dispatch.ts";
import { SINKS_MODULE } from "../core/events/module.ts";
import { createLogger } from "../core/log.ts";
import { setAlarm } from "./alarm.ts";
import { PassStore } from "./pass-store.ts";
import { SerialBatches } from "./serial.ts";

export function sinkObject(compute: Compute) {
  return class SinkDO extends DurableObject<Bindings> implements WakeableObject {
    readonly #db = new PassStore(() => compute.openStore(this.env), createLogger({ component: "sink-do" }));
    /** One drain at a time; alarms that arrive meanwhile share the next one. */
    readonly #drains = new SerialBatches(() => this.drain());

    /** Something was written to the outbox: drain now (the alarm runs it, so the caller does not wait for the sinks). */
    async wake(): Promise<void> {
      await setAlarm(this.ctx.storage, Date.now(), { keepSooner: true });
    }

    override async alarm(): Promise<void> {
      await this.#drains.add();
    }

    private async drain(): Promise<void> {
      const next = await this.#db.next(
        async (store) => (await drainSinks(compute.moduleContext(SINKS_MODULE, this.env, store))).nextInMs,
        "draining the sinks failed; retrying",
      );
      // Caught up: no alarm of its own, but one a wake-up set during the drain stays (a sooner one too).
      if (next !== null) await setAlarm(this.ctx.storage, next, { keepSooner: true });
    }
  };
}
