// better-compute/runtimes: the runtime contract (what `bcd node` asks of a runtime driver), its
// conformance cases, and the microVM runtime (one core over a VMM backend) with its QEMU backend.
import { MicroVmRuntime, type MicroVmImage, type MicroVmRuntimeOptions } from "./microvm/core.ts";
import { QemuBackend, type QemuBackendOptions } from "./microvm/qemu.ts";

export type { GuestReport, InstanceObserved, InstanceSpec, InstanceState, RuntimeDriver, RuntimeProbe, StopReason } from "./contract.ts";
export { runtimeConformanceCases, withUserData, type RuntimeSubject } from "./conformance.ts";
export type { Accel, VmmBackend, VmmLaunch } from "./microvm/backend.ts";
export { MicroVmRuntime, type CrashStep, type MicroVmImage, type MicroVmRuntimeOptions } from "./microvm/core.ts";
export { parseSize } from "./microvm/helpers.ts";
export { DEFAULT_NETWORK, guestMac, type NetworkPlan } from "./microvm/network.ts";
export { QemuBackend, qemuCommand, type QemuBackendOptions } from "./microvm/qemu.ts";
export {
  FirecrackerBackend,
  firecrackerRuntime,
  type FirecrackerBackendOptions,
  type FirecrackerRuntimeOptions,
} from "./microvm/firecracker.ts";

export type QemuMicroVmRuntimeOptions = Omit<MicroVmRuntimeOptions, "backend"> & { qemu?: QemuBackendOptions };

/**
 * The qemu-microvm runtime: QEMU's microvm machine, KVM when a probe boot under KVM reaches the
 * guest's init, TCG otherwise. The probe boots the first image given (or qemu.probeImage).
 */
export function qemuMicroVmRuntime(options: QemuMicroVmRuntimeOptions): MicroVmRuntime {
  const { qemu, ...rest } = options;
  const images = rest.images;
  const firstImage = typeof images === "function" ? undefined : Object.values(images)[0];
  const probeImage = qemu?.probeImage ?? (firstImage ? async (): Promise<MicroVmImage> => firstImage : undefined);
  return new MicroVmRuntime({ ...rest, backend: new QemuBackend({ log: rest.log, ...qemu, probeImage }) });
}
