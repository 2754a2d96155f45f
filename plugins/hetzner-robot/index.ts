// better-compute/hetzner-robot: Hetzner Robot dedicated servers as a VPS provider (docs/providers/hetzner-robot.md).
export { hetznerRobotProvider, stampOf, FREE_NAME, PROVIDER, RESCUE_IMAGE } from "./provider.ts";
