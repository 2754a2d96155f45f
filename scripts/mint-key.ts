// npm run mint-key -- --role admin [--name "ops laptop"]: mints an API key directly in the
// database at DATABASE_URL (the first admin key of a deployment). Prints the key once.
import { parseArgs } from "node:util";
import { openNodeStore } from "../local/node-store.ts";

const { values } = parseArgs({ options: { role: { type: "string", multiple: true }, name: { type: "string" } } });
const url = process.env.DATABASE_URL;
if (!url || !values.role?.length) {
  console.error("usage: DATABASE_URL=postgres://… npm run mint-key -- --role admin [--role …] [--name NAME]");
  process.exit(2);
}
const { compute } = await import("../better-compute.config.ts");
const store = await openNodeStore(url);
try {
  const { id, key } = await compute.mintApiKey(store, {
    name: values.name ?? "mint-key",
    roles: values.role,
    createdBy: "system:mint-key",
  });
  console.log(`API key ${id} (roles: ${values.role.join(", ")}); shown once:\n${key}`);
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  process.exitCode = 1;
} finally {
  await store.close();
}
