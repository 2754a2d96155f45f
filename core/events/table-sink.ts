// tableSink: the built-in Postgres-table sink (docs/sinks.md), for tests and for a deployment
// that wants its events copied into a table of its own database. It writes in the dispatcher's
// transaction, so its rows commit with the cursor; a row per event, idempotent on the event id.
import { sql } from "drizzle-orm";
import { defineSink, type SinkDefinition } from "../contracts.ts";
import { ComputeError, invalidConfig } from "../errors.ts";
import { sinkTransaction } from "./dispatch.ts";

export interface TableSinkOptions {
  id: string;
  /** The table (created if missing): received (arrival order), event_id (unique), id, type, module, subject, data, occurred_at. */
  table: string;
  /** Events (bc_events, default) or audit rows (bc_audit). */
  kind?: "events" | "audit";
  maxBatch?: number;
  maxAttempts?: number;
}

export function tableSink(options: TableSinkOptions): SinkDefinition {
  if (typeof options.table !== "string" || !/^[a-z_][a-z0-9_]{0,62}$/.test(options.table)) {
    throw invalidConfig(`tableSink ${options.id}: the table ${JSON.stringify(options.table)} is not a plain lower-case SQL name`, {
      table: options.table,
    });
  }
  const table = sql.identifier(options.table);
  return defineSink({
    id: options.id,
    kind: options.kind ?? "events",
    maxBatch: options.maxBatch,
    maxAttempts: options.maxAttempts,
    async deliver(batch, ctx) {
      const tx = sinkTransaction(ctx);
      if (!tx) throw new ComputeError("FAILED_PRECONDITION", "tableSink delivers only from the sink dispatcher");
      await tx.execute(sql`
        CREATE TABLE IF NOT EXISTS ${table} (
          received bigserial PRIMARY KEY,
          event_id text NOT NULL UNIQUE,
          id bigint NOT NULL,
          type text NOT NULL,
          module text NOT NULL,
          subject text,
          data jsonb NOT NULL,
          occurred_at timestamptz NOT NULL
        )`);
      for (const event of batch) {
        await tx.execute(sql`
          INSERT INTO ${table} (event_id, id, type, module, subject, data, occurred_at)
          VALUES (${event.eventId}, ${event.id}, ${event.type}, ${event.module}, ${event.subject}, ${JSON.stringify(event.data)}::jsonb,
                  ${event.occurredAt}::timestamptz)
          ON CONFLICT (event_id) DO NOTHING`);
      }
    },
  });
}
