// npm run build:bcd [-- --cache-dir DIR]: bcd as one installable artifact (one bundled file, the
// Node runtime it needs, a Debian package with a systemd unit), built or reused from the cache,
// and its manifest printed. docs/install.md.
import { parseArgs } from "node:util";
import { buildBcd } from "../agent/build/bcd.ts";
import { AgentError } from "../agent/contracts.ts";

const { values } = parseArgs({ options: { "cache-dir": { type: "string" } } });

try {
  const built = await buildBcd({ ...(values["cache-dir"] ? { cacheDir: values["cache-dir"] } : {}), log: (msg) => console.error(msg) });
  console.log(JSON.stringify({ dir: built.dir, package: built.deb, launcher: built.launcher, ...built.manifest }, null, 2));
} catch (e) {
  console.error(e instanceof AgentError ? `${e.code}: ${e.message}` : e);
  process.exitCode = 1;
}
