// The default deployment: what `npm start` runs and `wrangler deploy` ships. A real
// deployment edits this file: add modules, plugins, drivers, attestors and sinks here.
import { betterCompute } from "better-compute";
import { metalModule } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";

export const compute = betterCompute({
  modules: [provisionModule(), metalModule()],
  plugins: [],
});
