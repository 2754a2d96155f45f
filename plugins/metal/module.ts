// The metal module: sites, pools, hardware profiles, BMC bindings and the node lifecycle.
// Methods move a machine by events of the state machine (lifecycle.ts) and start the workflow
// that does the work; the reconciler moves it on when that workflow ends, and starts
// commissioning for enrolled machines by itself. This file composes them: the tables
// (schema.ts), the machine methods (methods.ts), the site and pool methods (sites.ts), the
// reconciler (reconciler.ts), the drivers, steps and profiles (steps.ts), and the operators'
// serial consoles (console.ts).
import { defineModule, type Module } from "better-compute";
import { ipmiDriver } from "better-compute/bcx-ipmi";
import { consoleActions, consoleCommand, consoleMethods, consoleRoles } from "./console.ts";
import { commissionProfiles, DEFAULT_HARDWARE_PROFILES, type HardwareProfile } from "./hardware.ts";
import { nodeActions, nodeMethods } from "./methods.ts";
import { machineMetrics } from "./metrics.ts";
import { lifecycleReconciler } from "./reconciler.ts";
import { metalMigrations } from "./schema.ts";
import { siteAndPoolActions, siteAndPoolMethods } from "./sites.ts";
import { imageStreamDriver, ipxeDriver, metalCommands, metalProfiles, metalSteps, redfishDriver } from "./steps.ts";

export { DEFAULT_HARDWARE_PROFILES, type HardwareProfile } from "./hardware.ts";

export interface MetalOptions {
  hardwareProfiles?: Record<string, HardwareProfile>;
}

export function metalModule(options: MetalOptions = {}): Module {
  const hardwareProfiles = { ...DEFAULT_HARDWARE_PROFILES, ...options.hardwareProfiles };
  return defineModule({
    id: "metal",
    description: "Bare-metal machines behind BMCs: sites, pools, hardware profiles and their lifecycle",
    iam: { actions: { ...siteAndPoolActions, ...nodeActions, ...consoleActions }, roles: consoleRoles },
    migrations: metalMigrations,
    api: [...siteAndPoolMethods(hardwareProfiles), ...nodeMethods(hardwareProfiles), ...consoleMethods()],
    commands: [...metalCommands, consoleCommand],
    extensions: [redfishDriver, ipmiDriver, ipxeDriver, imageStreamDriver, ...metalSteps],
    profiles: [...metalProfiles, ...commissionProfiles(hardwareProfiles)],
    reconcilers: [lifecycleReconciler(hardwareProfiles)],
    metrics: machineMetrics,
  });
}
