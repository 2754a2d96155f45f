// The runtime contract: what `bcd node` asks of a runtime driver (kinds: ['runtime'],
// runsOn: 'node') to converge one tenant instance on this host. The node role's `instances`
// section calls apply for every desired instance and remove for every guest it no longer wants;
// the death watch reports what changed on its own.
//
// Every method is level-triggered and idempotent: apply on a running guest changes nothing (never
// a second boot), remove of an absent guest succeeds. Failures are AgentErrors with the platform's
// codes (INVALID_ARGUMENT, FAILED_PRECONDITION, DRIVER_ERROR, UNAVAILABLE).

/** One instance as the control plane wants it (a NodeSpec `instances` entry). */
export interface InstanceSpec {
  /**
   * The one name (FC-GUEST-NAME): the instance id, the work dir's last segment, the NoCloud
   * instance-id and the guest's hostname. [a-z0-9-], at most 63 characters.
   */
  name: string;
  desired: "running" | "stopped";
  /** Sizes as the control plane wrote them; parsed by parseSize (an unparseable one is INVALID_ARGUMENT). */
  vcpus: number | string;
  memory: number | string;
  disk: number | string;
  /** The guest image by name, as the node knows it (e.g. "bc-guest"). */
  image: string;
  /** The user data, base64 of exactly the stored bytes: written to the seed verbatim, never re-composed (FC-ENRICH-ONCE). */
  userData: string;
  /** sha256 hex of those bytes, as the control plane stored it. */
  userDataSha256: string;
  /** Bumped by the control plane to ask for a reboot of a running guest. */
  rebootCount?: number;
}

export type InstanceState = "booting" | "running" | "stopping" | "stopped" | "failed" | "absent";

/** Why a guest stopped without being asked (FC-VM-TERMINATED). */
export type StopReason = "guest_poweroff" | "vmm_exited" | "host_reboot" | "boot_timeout" | "boot_failed" | "requested";

/** What the guest itself reported once booted (its first report line). */
export interface GuestReport {
  instanceId: string;
  hostname: string;
  /** sha256 hex of the user data the guest read from its seed. */
  userDataSha256: string;
  /** The guest's SSH host public keys, one OpenSSH line each (FC-GUEST-HOSTKEYS-REPORT). */
  hostKeys: string[];
  /** The address the guest configured, e.g. "10.0.2.2/30", and its MAC. */
  address?: string;
  mac?: string;
  /** The root disk's size as the guest sees it, in bytes. */
  diskBytes?: number;
}

/** What the runtime observes of one instance (a NodeSpec `instances` status entry). */
export interface InstanceObserved {
  name: string;
  state: InstanceState;
  /** How the guest runs: the VMM and its accelerator ("qemu-microvm/tcg", "firecracker/kvm"). */
  vmm?: string;
  /** The reboot count the running guest was booted or rebooted for. */
  rebootCount?: number;
  report?: GuestReport;
  /** Set when state is stopped or failed without being asked, or for a failed boot. */
  reason?: StopReason;
  message?: string;
  /** The VMM's last output on a failed boot, bounded (FC-BOOT-TIMEOUT). Never tenant console bytes in logs. */
  lastOutput?: string;
  /** When the state last changed (ISO 8601). */
  since: string;
}

export interface RuntimeProbe {
  ok: boolean;
  /** "kvm" or "tcg" for a VMM runtime, and why (e.g. "KVM probe boot failed: emulation failure; using TCG"). */
  accel?: string;
  detail: string;
}

export interface RuntimeDriver {
  readonly id: string;
  readonly version: string;
  /** Whether the runtime can run guests here, and how. */
  probe(): Promise<RuntimeProbe>;
  /** Converge one instance; resolves once it is running (the guest reported) or stopped, or failed. */
  apply(spec: InstanceSpec, signal?: AbortSignal): Promise<InstanceObserved>;
  observe(name: string): Promise<InstanceObserved>;
  /** Every guest this runtime has a work dir for, adopted if its VMM still runs (FC-ADOPT-AFTER-RESTART). */
  list(): Promise<InstanceObserved[]>;
  /** Stop (ask, then kill), wait until the VMM is gone, then remove its network namespace and work dir. */
  remove(name: string, signal?: AbortSignal): Promise<void>;
  /** The tail of the guest's console, at most maxBytes (bounded; never written to the host's logs). */
  console(name: string, maxBytes: number): Promise<string>;
  /** Changes the runtime noticed on its own (a guest powered off, the VMM died). Returns the unsubscribe. */
  watch(listener: (observed: InstanceObserved) => void): () => void;
  /** Stops watching; the guests keep running (a later runtime adopts them). */
  close(): Promise<void>;
}
