// better-compute/hetzner-robot: Hetzner Robot dedicated servers as a VPS provider (docs/providers/hetzner-robot.md).
export { hetznerRobotProvider, stampOf, FREE_NAME, PROVIDER, RESCUE_IMAGE } from "./provider.ts";
// A Robot server in a metal pool: power and rescue through Robot instead of a BMC (docs/providers/hetzner-robot.md).
export {
  hetznerRobotHardwareProfile,
  hetznerRobotMetal,
  robotBinding,
  robotServer,
  ROBOT_DRIVER,
  type HetznerRobotMetalOptions,
  type RobotBinding,
} from "./metal.ts";
