// npm run build:bcd [-- --cache-dir DIR]: bcd as one installable artifact (one bundled file, the
// Node runtime it needs, a Debian package with a systemd unit), built or reused from the cache,
// and its manifest printed. docs/install.md.
import { buildBcd } from "../agent/build/bcd.ts";
import { cacheDirOf, runBuild } from "./build-cli.ts";

await runBuild({}, async (values, log) => {
  const built = await buildBcd({ ...cacheDirOf(values), log });
  return { dir: built.dir, package: built.deb, launcher: built.launcher, ...built.manifest };
});
