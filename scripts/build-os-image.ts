// npm run os-image [-- --cache-dir DIR] [--cmdline ARGS]: the OS image a deploy writes on the
// emulated site (agent/build/os-image.ts, docs/os-image.md), built or reused from the cache, and
// its manifest printed.
import { parseArgs } from "node:util";
import { buildOsImage } from "../agent/build/os-image.ts";
import { AgentError } from "../agent/contracts.ts";

const { values } = parseArgs({ options: { "cache-dir": { type: "string" }, cmdline: { type: "string" } } });

try {
  const image = await buildOsImage({
    ...(values["cache-dir"] ? { cacheDir: values["cache-dir"] } : {}),
    ...(values.cmdline ? { cmdline: values.cmdline } : {}),
    log: (msg) => console.error(msg),
  });
  console.log(JSON.stringify({ dir: image.dir, ...image.manifest }, null, 2));
} catch (e) {
  console.error(e instanceof AgentError ? `${e.code}: ${e.message}` : e);
  process.exitCode = 1;
}
