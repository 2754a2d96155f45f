// The default deployment: what `npm start` runs and `wrangler deploy` ships. A real
// deployment edits this file: add modules, plugins, drivers, attestors and sinks here.
import { betterCompute } from "better-compute";
import { capacity } from "better-compute/capacity";
import { hetznerCloudProvider } from "better-compute/hetzner-cloud";
import { hetznerRobotHardwareProfile, hetznerRobotMetal, hetznerRobotProvider } from "better-compute/hetzner-robot";
import { metalModule } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";
import { proxmoxProvider } from "better-compute/proxmox";
import { vps } from "better-compute/vps";

export const compute = betterCompute({
  // The providers' adapters are registered; nothing is used until an operator creates an account
  // (docs/vps.md). `npm run dev -- --providers` registers accounts on their emulators.
  modules: [
    provisionModule(),
    // Hosts' capacity and the placer (docs/capacity.md): ctx.capacity for vps host pools.
    capacity(),
    // A Hetzner Robot server can also be a metal machine: power and rescue through Robot, no BMC.
    metalModule({ hardwareProfiles: { "hetzner-robot": hetznerRobotHardwareProfile } }),
    hetznerRobotMetal(),
    vps({ providers: [hetznerCloudProvider, hetznerRobotProvider, proxmoxProvider] }),
  ],
  plugins: [],
});
