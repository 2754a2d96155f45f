// The VMM backend: the one seam between the microvm core (core.ts: validation, work dir, seed,
// network namespace, boot wait, death watch, stop, adoption) and the process that runs a guest.
// Two implementations: qemu-microvm (qemu.ts) and firecracker. The interface is the lead's
// (docs/runtimes.md); a backend only starts, asks, watches and explains a VMM.

export type Accel = "kvm" | "tcg";

export interface VmmLaunch {
  /** The one name (FC-GUEST-NAME). */
  name: string;
  /** Every VMM process's command line names workDir: the pid-reuse guard and adoption by /proc scan. */
  workDir: string;
  kernel: string;
  initrd: string;
  cmdline: string;
  vcpus: number;
  memoryMiB: number;
  /** Root first (/dev/vda), then the seed (read-only). */
  drives: { id: "root" | "seed"; path: string; readOnly: boolean }[];
  /** The VMM runs inside netns, on tap. */
  net?: { netns: string; tap: string; mac: string };
  /** The guest's serial output is APPENDED here (O_APPEND: the core caps it by copy-truncate). */
  consoleLog: string;
  /** The VMM's own output (its last lines are reported on a failed boot). */
  vmmLog: string;
  accel: Accel;
}

export interface VmmBackend {
  /** "qemu-microvm" | "firecracker" */
  readonly id: string;
  /** Can this backend run here, and with which accelerator (qemu: probe KVM by a short boot, never by /dev/kvm). */
  probe(): Promise<{ ok: boolean; accel: Accel; detail: string }>;
  /** Starts the VMM detached (it survives the agent), returns its pid once the guest is started. */
  start(launch: VmmLaunch): Promise<{ pid: number }>;
  /** Asks the guest to shut down (qemu: QMP system_powerdown; firecracker: PUT /actions SendCtrlAltDel). */
  requestShutdown(workDir: string): Promise<void>;
  /** Starts watching a running VMM's control socket (qemu: QMP events -> writes workDir/exit-event.json). Returns the stop. */
  attach?(workDir: string): Promise<() => void>;
  /** After the VMM is gone: guest_poweroff (it powered off/reset itself) or vmm_exited, with a detail. */
  exitReason(workDir: string): Promise<{ reason: "guest_poweroff" | "vmm_exited"; detail: string }>;
}
