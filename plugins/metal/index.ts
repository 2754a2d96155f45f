// better-compute/metal: bare-metal machines through their lifecycle, and the steps and profiles
// third-party provisioning plugins chain around (media.insert, power.setPower, wait.agentJoined...).
export { DEFAULT_HARDWARE_PROFILES, metalModule, type HardwareProfile, type MetalOptions } from "./module.ts";
export {
  METAL_STATES,
  ON_WORKFLOW_SUCCESS,
  TRANSITIONAL_STATES,
  TRANSITIONS,
  type MetalEvent,
  type MetalState,
  type TransitionalState,
} from "./lifecycle.ts";
export { renderTemplate } from "./template.ts";
export { bmcBinding, metalCommands, metalProfiles, metalSteps, redfishAddress, WIPE_STEP, type BmcBinding } from "./steps.ts";
export { httpViaSite, type HttpViaSiteAnswer, type HttpViaSiteRequest } from "./http-via-site.ts";
export { agentlessCommissionProfile, agentlessReleaseProfile } from "./steps.ts";
export { installConfigImage, INSTALL_CONFIG_PATH, machineImage, MACHINE_IMAGE_BYTES, type InstallConfig } from "./installer-iso.ts";
