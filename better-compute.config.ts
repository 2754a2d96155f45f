// The default deployment: what `npm start` runs and `wrangler deploy` ships. A real
// deployment edits this file: add modules, plugins, drivers, attestors and sinks here.
import { betterCompute } from "better-compute";
import { metalModule } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";
import { vps } from "better-compute/vps";

export const compute = betterCompute({
  // vps({ providers: [...] }): no provider is registered by default (docs/vps.md).
  modules: [provisionModule(), metalModule(), vps()],
  plugins: [],
});
