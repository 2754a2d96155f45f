// The emulated site's deployment (docs/emulated-site.md): the default deployment's modules, and the
// hardware profile its pool names. QEMU machines behind the Redfish emulator, network-booted by
// the site agent into the bcd ramdisk, deployed by streaming an image from it: the same drivers as
// a rack of Redfish servers (redfish-pxe), named for what they drive here.
import { betterCompute } from "better-compute";
import { capacity } from "better-compute/capacity";
import { hetznerCloudProvider } from "better-compute/hetzner-cloud";
import { hetznerRobotHardwareProfile, hetznerRobotMetal, hetznerRobotProvider } from "better-compute/hetzner-robot";
import { metalModule, type HardwareProfile } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";
import { proxmoxProvider } from "better-compute/proxmox";
import { vps } from "better-compute/vps";

export const hardwareProfiles: Record<string, HardwareProfile> = {
  "emulated-redfish": {
    description: "QEMU machines behind the Redfish emulator, PXE-booted by the site agent",
    drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" },
  },
  "hetzner-robot": hetznerRobotHardwareProfile,
};

export const modules = [
  provisionModule(),
  capacity(),
  metalModule({ hardwareProfiles }),
  hetznerRobotMetal(),
  vps({ providers: [hetznerCloudProvider, hetznerRobotProvider, proxmoxProvider] }),
];

export const compute = betterCompute({ modules, plugins: [] });
