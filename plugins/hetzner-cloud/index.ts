// better-compute/hetzner-cloud: the Hetzner Cloud provider for vps({ providers }).
// Its emulator is better-compute/testing/hetzner-cloud (emulator.ts).
export { hetznerCloudAccount, hetznerCloudClient, hetznerCloudProvider, INSTANCE_LABEL } from "./provider.ts";
export type { HetznerCloudAccount, HetznerCloudClientOptions } from "./provider.ts";
