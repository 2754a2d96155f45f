// npm run guest-image [-- --cache-dir DIR] [--package NAME ...]: builds the microVM guest image
// (or reuses the cached build of the same inputs) and prints its manifest. docs/guest-image.md.
import { parseArgs } from "node:util";
import { AgentError } from "../agent/contracts.ts";
import { ensureGuestImage } from "../agent/runtimes/microvm/image.ts";

const { values } = parseArgs({
  options: {
    "cache-dir": { type: "string" },
    package: { type: "string", multiple: true },
  },
});

try {
  const image = await ensureGuestImage({
    ...(values["cache-dir"] ? { cacheDir: values["cache-dir"] } : {}),
    ...(values.package ? { packages: values.package } : {}),
    log: (msg) => console.error(msg),
  });
  console.log(JSON.stringify({ dir: image.dir, ...image.manifest }, null, 2));
} catch (e) {
  console.error(e instanceof AgentError ? `${e.code}: ${e.message}` : e);
  process.exitCode = 1;
}
