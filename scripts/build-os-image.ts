// npm run os-image [-- --cache-dir DIR] [--cmdline ARGS]: the OS image a deploy writes on the
// emulated site (agent/build/os-image.ts, docs/os-image.md), built or reused from the cache, and
// its manifest printed.
import { buildOsImage } from "../agent/build/os-image.ts";
import { cacheDirOf, runBuild } from "./build-cli.ts";

await runBuild({ cmdline: { type: "string" } }, async (values, log) => {
  const image = await buildOsImage({ ...cacheDirOf(values), ...(values.cmdline ? { cmdline: values.cmdline } : {}), log });
  return { dir: image.dir, ...image.manifest };
});
