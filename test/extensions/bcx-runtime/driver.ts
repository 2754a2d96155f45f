// acme-ns on the control plane: its declaration, as the plugin's author ships it beside the plugin
// (a deployment adds it to betterCompute({ drivers }); test/support/bcx-runtime-worker.ts does).
// Its code runs in the plugin (./plugin.ts) that `bcd node` hosts; drivers.list shows it with
// transport "bcx", and a host pool may name it as its runtime.
import { externalDriver } from "better-compute/driver-sdk";

export const acmeNs = externalDriver({ id: "acme-ns", version: "0.1.0", kinds: ["runtime"], runsOn: "node" });
