// npm run ramdisk-image [-- --cache-dir DIR]: the provisioning ramdisk (Debian's cloud kernel, one
// initrd with busybox, its init and bcd), built or reused from the cache; prints its manifest and
// sizes. docs/ramdisk.md.
import { buildRamdisk, mib } from "../agent/build/ramdisk.ts";
import { cacheDirOf, runBuild } from "./build-cli.ts";

await runBuild({}, async (values, log) => {
  const ramdisk = await buildRamdisk({ ...cacheDirOf(values), log });
  const m = ramdisk.manifest;
  log(`kernel ${m.kernelRelease}: ${mib(m.kernel.bytes)}; initrd: ${mib(m.initrd.bytes)} (zstd; ${mib(m.initrdUnpackedBytes)} unpacked)`);
  return { dir: ramdisk.dir, kernelPath: ramdisk.kernel, initrdPath: ramdisk.initrd, ...m };
});
