// npm run installer-iso [-- --cache-dir DIR] [--cmdline ARGS]: the installer ISO a BMC boots as a
// virtual CD (agent/build/installer-iso.ts, docs/ramdisk.md), built or reused from the cache; prints
// its size, how long it took, and its manifest (the window a machine's files go into).
import { buildInstallerIso } from "../agent/build/installer-iso.ts";
import { mib } from "../agent/build/ramdisk.ts";
import { cacheDirOf, runBuild } from "./build-cli.ts";

await runBuild({ cmdline: { type: "string" } }, async (values, log) => {
  const started = Date.now();
  const built = await buildInstallerIso({ ...cacheDirOf(values), ...(values.cmdline ? { cmdline: values.cmdline } : {}), log });
  const m = built.manifest;
  log(
    `installer ISO: ${mib(m.iso.bytes)} (${m.iso.bytes} bytes), window at ${m.machineImage.offset}; ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
  return { dir: built.dir, isoPath: built.iso, ...m };
});
