// npm run guest-image [-- --cache-dir DIR] [--package NAME ...]: builds the microVM guest image
// (or reuses the cached build of the same inputs) and prints its manifest. docs/guest-image.md.
import { ensureGuestImage } from "../agent/runtimes/microvm/image.ts";
import { cacheDirOf, runBuild } from "./build-cli.ts";

await runBuild({ package: { type: "string", multiple: true } }, async (values, log) => {
  const image = await ensureGuestImage({ ...cacheDirOf(values), ...(values.package ? { packages: values.package } : {}), log });
  return { dir: image.dir, ...image.manifest };
});
