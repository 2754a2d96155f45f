// Hardware profiles: which drivers a pool's machines are driven with, what commissioning
// configures on them, and so which workflow profile runs each machine's own lifecycle work.
import type { DriverDefinition, DriverKind } from "better-compute";
import type { ModuleContext } from "better-compute/core";
import { TRANSITIONS } from "./lifecycle.ts";
import type { Policy } from "./sites.ts";
import { commissionProfileFor } from "./steps.ts";

export interface HardwareProfile {
  description?: string;
  /** Driver id per kind; each must be a registered driver of that kind. power's manifest validates BMC bindings. */
  drivers: Partial<Record<DriverKind, string>> & { power: string };
  /** BIOS settings staged during commissioning (applied when the ramdisk boots). */
  bios?: Record<string, string | number | boolean>;
  /** The RAID volume commissioning makes (replacing any other): level, and drives (default all). */
  raid?: { level: "RAID0" | "RAID1" | "RAID5" | "RAID10"; drives?: number | "all" };
  /**
   * Workflow profiles for the lifecycle's own work; default metal.commission (or metal.commission.<name> with bios/raid),
   * metal.release, metal.rescue and metal.unrescue (drivers that rescue without a ramdisk bring their own, as hetzner-robot does).
   */
  profiles?: { commission?: string; release?: string; rescue?: string; unrescue?: string };
}

export type HardwareProfiles = Record<string, HardwareProfile>;

export const DEFAULT_HARDWARE_PROFILES: HardwareProfiles = {
  "redfish-pxe": {
    description: "Redfish BMC, PXE into the bcd ramdisk through the site agent, image streamed from the ramdisk",
    drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" },
  },
  "ipmi-pxe": {
    description:
      "IPMI BMC (bcx-ipmi, hosted by the site agent: docs/drivers.md), PXE into the bcd ramdisk through the site agent, image streamed from the ramdisk",
    drivers: { power: "ipmi", management: "ipmi", boot: "ipxe", deploy: "image-stream" },
  },
};

/** A hardware profile with BIOS settings or a RAID layout commissions with its own profile. */
export const commissionProfiles = (hardwareProfiles: HardwareProfiles) =>
  Object.entries(hardwareProfiles)
    .filter(([, hw]) => hw.bios || hw.raid)
    .map(([name, hw]) => commissionProfileFor({ name, ...hw }));

/** The workflow profile that commissions, releases, rescues or unrescues a machine of this pool. */
export function lifecycleProfile(
  hardwareProfiles: HardwareProfiles,
  node: { policy: Policy; pool_agent: "bcd" | "none" },
  which: "commission" | "release" | "rescue" | "unrescue",
): string {
  const hw = hardwareProfiles[node.policy.hardwareProfile];
  if (hw?.profiles?.[which]) return hw.profiles[which]!;
  if (which === "rescue" || which === "unrescue") return TRANSITIONS[which].profile;
  if (node.pool_agent === "none") return `metal.${which}.agentless`;
  if (which === "release") return "metal.release";
  return hw && (hw.bios || hw.raid) ? `metal.commission.${node.policy.hardwareProfile}` : "metal.commission";
}

/**
 * Whether a pool's machines need its site's agent. BMC commands, PXE and relayed requests go
 * through it, unless every driver of the pool's hardware profile runs on the control plane (a
 * Robot server: power and rescue come from a web service): then there is nothing for a site agent
 * to do, and commissioning starts without one. The one place this is decided.
 */
export function needsSiteAgent(
  ctx: Pick<ModuleContext, "registered">,
  hardwareProfiles: HardwareProfiles,
  node: { policy: Policy },
): boolean {
  const hw = hardwareProfiles[node.policy.hardwareProfile];
  if (!hw) return true;
  const drivers = ctx.registered.extensions<DriverDefinition>("driver");
  return Object.values(hw.drivers).some((id) => drivers.find((d) => d.id === id)?.runsOn !== "control-plane");
}
