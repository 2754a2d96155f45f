// better-compute/capacity: hosts' capacity and the placer. capacity() is the module: it provides
// ctx.capacity (reserve, hold, release, explain) to every module, runs the built-in filters and
// scorers with the registered scheduler plugins' (defineSchedulerPlugin), and gives operators the
// capacity.* methods. docs/capacity.md.
import { sql } from "drizzle-orm";
import { defineModule, type Module } from "better-compute";
import { capacityActions, capacityMethods } from "./methods.ts";
import { capacityMetrics } from "./metrics.ts";
import type { PlacerDefaults } from "./placer.ts";
import { capacityPort } from "./port.ts";
import { capacityMigrations } from "./schema.ts";

export type CapacityOptions = PlacerDefaults;

export function capacity(options: CapacityOptions = {}): Module {
  return defineModule({
    id: "capacity",
    description: "Hosts' capacity (what their agents report), reservations and holds, and the placer",
    iam: { actions: capacityActions },
    migrations: capacityMigrations,
    api: capacityMethods(),
    ports: { capacity: (ctx) => capacityPort(ctx, options) },
    metrics: capacityMetrics,
    sweeps: [
      {
        // Expired holds already count for nothing; this only keeps the table small.
        id: "capacity.expiredHolds",
        async run(ctx) {
          const rows = await ctx.store.transaction((tx) =>
            tx.execute(sql`DELETE FROM capacity_reservations WHERE state = 'held' AND expires_at <= compute_now() RETURNING id`),
          );
          return rows.rows.length;
        },
      },
    ],
  });
}

export { ANY_VALUE, DRIVER_LABEL_PREFIX } from "./builtins.ts";
export { placementRequest } from "./placer.ts";
