// npm run migrate: applies core and module migrations of the deployment to DATABASE_URL.
// Idempotent: run it on every deploy.
import { applyMigrations } from "../core/store/migrate.ts";
import { coreMigrations, openNodeStore } from "../local/node-store.ts";

const url = process.env.DATABASE_URL;
if (!url) {
  console.error("DATABASE_URL is not set (for the embedded default, `npm start` migrates by itself)");
  process.exit(2);
}
const { compute } = await import("../better-compute.config.ts");
const store = await openNodeStore(url);
try {
  const report = await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
  console.log(`migrations: ${report.applied.length} applied, ${report.skipped.length} already applied`);
  for (const name of report.applied) console.log(`  applied ${name}`);
} finally {
  await store.close();
}
