// npm run ramdisk-image [-- --cache-dir DIR]: the provisioning ramdisk (Debian's cloud kernel, one
// initrd with busybox, its init and bcd), built or reused from the cache; prints its manifest and
// sizes. docs/ramdisk.md.
import { parseArgs } from "node:util";
import { buildRamdisk, mib } from "../agent/build/ramdisk.ts";
import { AgentError } from "../agent/contracts.ts";

const { values } = parseArgs({ options: { "cache-dir": { type: "string" } } });

try {
  const ramdisk = await buildRamdisk({
    ...(values["cache-dir"] ? { cacheDir: values["cache-dir"] } : {}),
    log: (msg) => console.error(msg),
  });
  console.log(JSON.stringify({ dir: ramdisk.dir, kernelPath: ramdisk.kernel, initrdPath: ramdisk.initrd, ...ramdisk.manifest }, null, 2));
  const m = ramdisk.manifest;
  console.error(
    `kernel ${m.kernelRelease}: ${mib(m.kernel.bytes)}; initrd: ${mib(m.initrd.bytes)} (zstd; ${mib(m.initrdUnpackedBytes)} unpacked)`,
  );
} catch (e) {
  console.error(e instanceof AgentError ? `${e.code}: ${e.message}` : e);
  process.exitCode = 1;
}
