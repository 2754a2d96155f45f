// The migration runner: core migrations, then module migrations, in order, each once.
// Safe to run again and from two places at once (an advisory lock serializes runners; a
// migration already applied is skipped, one whose text changed since is refused).
import { sql } from "drizzle-orm";
import type { Migration } from "../contracts.ts";
import { invalidConfig } from "../errors.ts";
import { sha256Hex } from "../encoding.ts";
import { one, type Store } from "./database.ts";

const LOCK_ID = 0x6263_6d67; // "bcmg"

export interface MigrationReport {
  applied: string[];
  skipped: string[];
}

export async function applyMigrations(store: Store, migrations: Migration[]): Promise<MigrationReport> {
  const report: MigrationReport = { applied: [], skipped: [] };
  await store.db.execute(sql`
    CREATE TABLE IF NOT EXISTS bc_migrations (
      name text PRIMARY KEY,
      sha256 text NOT NULL,
      applied_at timestamptz NOT NULL
    )`);
  for (const migration of migrations) {
    const digest = await sha256Hex(migration.sql);
    await store.transaction(async (tx) => {
      await tx.execute(sql`SELECT pg_advisory_xact_lock(${LOCK_ID})`);
      const applied = await one<{ sha256: string }>(tx, sql`SELECT sha256 FROM bc_migrations WHERE name = ${migration.name}`);
      if (applied) {
        if (applied.sha256 !== digest) {
          throw invalidConfig(`migration ${migration.name} was changed after it was applied; add a new migration instead`, {
            migration: migration.name,
          });
        }
        report.skipped.push(migration.name);
        return;
      }
      // No parameters: the simple query protocol runs a multi-statement file as one unit.
      await tx.execute(sql.raw(migration.sql));
      await tx.execute(sql`INSERT INTO bc_migrations (name, sha256, applied_at) VALUES (${migration.name}, ${digest}, compute_now())`);
      report.applied.push(migration.name);
    });
  }
  return report;
}
