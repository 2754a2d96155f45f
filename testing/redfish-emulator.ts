// A Redfish BMC emulator for tests. In the spirit of sushy-tools' emulator, it serves the Redfish
// resource tree of N machines over real HTTP, or HTTPS with a given certificate (node:http(s),
// 127.0.0.1 unless told otherwise, Basic auth or a session's X-Auth-Token); `better-compute
// bmc-emulator` runs it (scripts/bmc-emulator.ts). A machine is SIMULATED (in-memory state, the
// default) or backed by a real QEMU machine (testing/qemu-machine.ts, `qemu` in its options): its
// PowerState is QEMU's run state, a Reset powers it as sushy-tools' libvirt driver does, a boot
// override is the firmware's boot order, and InsertMedia downloads the image into its virtual CD.
//
//   /redfish/v1                                   ServiceRoot (unauthenticated, as in the spec)
//   /redfish/v1/SessionService[/Sessions[/<id>]]  sessions: POST (unauthenticated) answers X-Auth-Token; DELETE ends one
//   /redfish/v1/AccountService[/Accounts|/Roles]  the one account (the emulator's credential) and its role
//   /redfish/v1/Chassis[/<id>]                    one chassis per machine, linked to its system and manager
//   /redfish/v1/Systems[/<id>]                    ComputerSystem: PowerState, Boot override, BiosVersion, summaries
//   /redfish/v1/Systems/<id>/Processors[/<id>], /Memory[/<id>], /SimpleStorage[/<id>]   inventory
//   /redfish/v1/Systems/<id>/Bios                 BIOS attributes (read-only), @Redfish.Settings → Bios/Settings
//   /redfish/v1/Systems/<id>/Bios/Settings        pending attributes; PATCH { Attributes } stages them for
//                                                 the next power-on, when they are applied (as real BIOSes do)
//   /redfish/v1/Systems/<id>/Storage[/RAID.Integrated.1]   one RAID controller and its Drives/<id>
//   …/Storage/RAID.Integrated.1/Volumes[/<id>]    POST { RAIDType, Links: { Drives }, Name?, CapacityBytes? } creates a
//                                                 volume (Drives at the top level, the older schema, too); DELETE removes it
//   /redfish/v1/Systems/<id>/EthernetInterfaces[/NIC.1]    one NIC: MACAddress, IPv4Addresses, IPv6Addresses
//                                                 (only for a machine given addresses, as inspection finds them)
//   POST …/Systems/<id>/Actions/ComputerSystem.Reset   { ResetType }
//   PATCH /redfish/v1/Systems/<id>                { Boot: { BootSourceOverrideTarget, BootSourceOverrideEnabled } }
//   /redfish/v1/Managers[/<id>]                   one BMC per system, linked both ways
//   /redfish/v1/Managers/<id>/VirtualMedia[/Cd]   InsertMedia { Image } / EjectMedia actions; or under
//                                                 /Systems/<id>/VirtualMedia (newer BMCs), or both (virtualMedia)
//   /redfish/v1/Managers/<id>/LogServices/Log[/Entries]   what the BMC was asked to do (resets, boot, media)
//   a QEMU-backed machine's serial console: raw TCP on the port its Manager's SerialConsole.Telnet names
//
// Tests read and change each simulated machine through `machines` (plain state objects),
// get told of power transitions via `onPowerChange` (so a simulation can "boot" the
// machine), and can make the BMC flaky with seeded, deterministic faults. `quirks` make a
// machine's BMC behave like real ones do (asynchronous resets, no BIOS resource, no volume
// creation, Continuous-only boot overrides, a failing Storage, CapacityBytes required).
// Product UUIDs are random per emulator (two emulators never share one) unless given.
import { createHash, randomBytes, randomUUID, timingSafeEqual } from "node:crypto";
import { createWriteStream, mkdtempSync, rmSync } from "node:fs";
import { createServer, get as httpGet, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, get as httpsGet } from "node:https";
import { createServer as createNetServer, isIP, type AddressInfo, type Server as NetServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { RAID_LEVELS as RAID_TYPES, raidCapacityBytes, raidDriveCountProblem, type RaidLevel as RaidType } from "../agent/roles/redfish.ts";
import type { QemuMachine } from "./qemu-machine.ts";
import { seededRandom } from "./seeded-random.ts";

// A machine backed by real hardware emulation is made with these (better-compute/testing/redfish offers them too).
export { startQemuMachine, type QemuMachine, type QemuMachineOptions } from "./qemu-machine.ts";

export type PowerState = "On" | "Off";
export const BOOT_TARGETS = ["None", "Pxe", "Cd", "Hdd"] as const;
export type BootTarget = (typeof BOOT_TARGETS)[number];
export const BOOT_ENABLED = ["Disabled", "Once", "Continuous"] as const;
export type BootEnabled = (typeof BOOT_ENABLED)[number];
export const RESET_TYPES = ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"] as const;
export type ResetType = (typeof RESET_TYPES)[number];
/** A QEMU-backed machine takes sushy-tools' two more: ForceOn (as On) and Nmi. */
export const QEMU_RESET_TYPES = [...RESET_TYPES, "ForceOn", "Nmi"] as const;
/** Where a BMC serves its virtual media: under its Manager (most), its System (iDRAC since 6.x, sushy-tools), or both. */
export const VIRTUAL_MEDIA_LOCATIONS = ["Manager", "System", "Both"] as const;
export type VirtualMediaLocation = (typeof VIRTUAL_MEDIA_LOCATIONS)[number];
// The RAID levels and their drive-count rules are Redfish's, shared with the site agent's client.
export { RAID_TYPES, raidDriveCountProblem, type RaidType };
export type BiosValue = string | number | boolean;

/** The Id of the one simulated NIC of every machine that has addresses. */
export const NIC_ID = "NIC.1";

/** The Id of the one simulated RAID controller of every machine that has drives. */
export const RAID_CONTROLLER_ID = "RAID.Integrated.1";
/** The Id of a QEMU-backed machine's storage: its NVMe disks, no RAID. */
export const NVME_STORAGE_ID = "NVMe.1";
const DRIVE_CAPACITY_BYTES = 480_103_981_056;

export interface SimDrive {
  id: string;
  name: string;
  capacityBytes: number;
  mediaType: "SSD" | "HDD";
  /** A QEMU-backed machine's disk: its NVMe serial. */
  serialNumber?: string;
}

export interface SimVolume {
  id: string;
  name: string;
  raidType: RaidType;
  /** Ids of the member drives (SimDrive.id). */
  drives: string[];
  capacityBytes: number;
}

/**
 * How a machine's BMC departs from the happy path, as real BMCs do (sushy-tools, iDRAC, iLO...).
 * Each is off by default; they live on MachineState.quirks, so a test may change them at any time.
 */
export interface BmcQuirks {
  /**
   * A reset is answered at once and applied over this many ms: the old PowerState first, then
   * PoweringOn/PoweringOff, then the new one (a restart goes through Off). 0: applied before the answer.
   */
  resetDelayMs?: number;
  /** No BIOS settings resource: the system links no Bios, and Bios answers 404. */
  noBios?: boolean;
  /** Volumes cannot be created: the Volumes collection says Allow: GET, and a POST is answered 405. */
  noVolumeCreation?: boolean;
  /** Boot overrides are always Continuous: a Once is accepted and recorded as Continuous (sushy-tools' libvirt driver). */
  continuousBootOnly?: boolean;
  /** Every request under Storage is answered 500. */
  failingStorage?: boolean;
  /** Creating a volume requires CapacityBytes (as some controllers do). */
  requireVolumeCapacity?: boolean;
}

export interface MachineOptions {
  id?: string;
  uuid?: string;
  power?: PowerState;
  /** Simulated drives behind its RAID controller (default: the emulator's `drives`); 0: no controller, no Storage. */
  drives?: number;
  /** IP addresses of its one NIC (IPv4 and/or IPv6); default none: no EthernetInterfaces at all (unless `nic`). */
  addresses?: string[];
  /** Its one NIC even without addresses: its MAC is what network boot knows the machine by. */
  nic?: boolean;
  /** Its BMC's quirks, over the emulator's. */
  quirks?: BmcQuirks;
  /** A real machine instead of a simulated one (started by the caller, who stops it too); its uuid, disks and NICs are the machine's. */
  qemu?: QemuMachine;
  /** Where its virtual media is served (default: the emulator's). */
  virtualMedia?: VirtualMediaLocation;
}

/** One entry of a manager's log: what its BMC was asked to do. */
export interface BmcLogEntry {
  id: string;
  created: string;
  message: string;
}

/**
 * The state of one machine and its emulated BMC: a simulated machine's all of it, a QEMU-backed
 * machine's power and boot override as last read from the machine. Tests may read and mutate it.
 */
export interface MachineState {
  id: string;
  uuid: string;
  managerId: string;
  /** A QEMU-backed machine's is as last read from it (every read of the system reads it). */
  power: PowerState;
  /** Shown as PowerState while an asynchronous reset is under way (quirks.resetDelayMs). */
  transition: "PoweringOn" | "PoweringOff" | null;
  boot: { target: BootTarget; enabled: BootEnabled };
  media: { inserted: boolean; image: string | null };
  biosVersion: string;
  bmcFirmwareVersion: string;
  /** The BIOS attributes in effect. */
  biosSettings: Record<string, BiosValue>;
  /** Attributes staged through Bios/Settings; applied (and cleared) at the next power-on. */
  biosPending: Record<string, BiosValue>;
  /** The RAID controller's drives and volumes (no controller when there are no drives). */
  storage: { drives: SimDrive[]; volumes: SimVolume[] };
  /** Power transitions so far, e.g. ["On", "Off", "On"] (a simulated machine's; a QEMU-backed one keeps none). */
  powerHistory: PowerState[];
  /** The IP addresses its NIC reports; none: the system links no EthernetInterfaces (unless `nic`). */
  addresses: string[];
  /** Its simulated NIC, present with addresses or when asked for; its MAC is derived from the machine's id. */
  nic: boolean;
  /** How its BMC departs from the happy path; change at will. */
  quirks: BmcQuirks;
  /** The real machine behind it, if any: power, boot and media then act on it (and power, boot are read from it). */
  qemu?: QemuMachine;
  virtualMedia: VirtualMediaLocation;
  /** Its manager's log (LogServices/Log): resets, boot overrides, media, oldest first. */
  log: BmcLogEntry[];
  /** A QEMU-backed machine's serial console, served raw over TCP (SerialConsole.Telnet: no negotiation). */
  consolePort?: number;
}

export interface RedfishFaults {
  /** Probability that a request's connection is destroyed without an answer. */
  dropRate?: number;
  /** Delay before every answer. */
  delayMs?: number;
  /** Probability that a request is answered 503. */
  errorRate?: number;
  /** Seed of the deterministic RNG deciding drops and errors (default 1). */
  seed?: number;
}

export interface RedfishRequestRecord {
  method: string;
  path: string;
  /** HTTP status, or 0 when the connection was dropped. */
  status: number;
}

export interface RedfishEmulatorOptions {
  machines: MachineOptions[] | number;
  /**
   * Simulated drives per machine unless the machine says otherwise; default 0, no Storage at all
   * (as sushy-tools without storage configured; inspecting a machine with Storage costs requests).
   */
  drives?: number;
  username?: string;
  password?: string;
  faults?: RedfishFaults;
  /** Every machine's BMC quirks unless the machine says otherwise. */
  quirks?: BmcQuirks;
  /** Serve HTTPS with this identity (e.g. testing/tls.ts's selfSignedCertificate) instead of HTTP. */
  tls?: { key: string; cert: string };
  /** Where to listen; default 127.0.0.1. */
  host?: string;
  port?: number;
  /** Called after each power transition of a simulated machine; awaited before the action is answered. */
  onPowerChange?: (machine: MachineState, from: PowerState, to: PowerState) => void | Promise<void>;
  /** Where virtual media is served, unless a machine says otherwise; default Manager. */
  virtualMedia?: VirtualMediaLocation;
  /**
   * For tests: a QEMU-backed machine's InsertMedia also takes a local file (an absolute path or a
   * file: URL), used in place. Off by default: a BMC on the network must not open the host's files.
   */
  mediaFromFiles?: boolean;
  /**
   * Where this BMC's network takes an image URL before it downloads it (default: as it is): the
   * emulated site's BMC reaches the site agent's address inside its namespace through a forward.
   */
  mediaRoute?: (url: string) => string;
}

export interface RedfishEmulator {
  url: string;
  machines: Map<string, MachineState>;
  /** Replace the fault settings; re-seeds the RNG. */
  setFaults(f: RedfishFaults): void;
  requests: RedfishRequestRecord[];
  stop(): Promise<void>;
}

const MAX_BODY = 64 * 1024;

/** A locally administered MAC address, derived from the machine id so it is stable across runs. */
export function fakeMac(id: string): string {
  const h = createHash("sha256").update(`redfish-emulator-mac-${id}`).digest();
  return ["02", ...[...h.subarray(0, 5)].map((b) => b.toString(16).padStart(2, "0"))].join(":").toUpperCase();
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly messageId: string,
    message: string,
    readonly args: string[] = [],
  ) {
    super(message);
  }
}

/** Redfish's answer to a value the property does not take. */
function notInList(property: string, value: unknown): HttpError {
  return new HttpError(
    400,
    "PropertyValueNotInList",
    `The value ${JSON.stringify(value)} for the property ${property} is not in the list of acceptable values.`,
    [String(value), property],
  );
}

function errorBody(e: HttpError): unknown {
  return {
    error: {
      code: `Base.1.8.${e.messageId}`,
      message: e.message,
      "@Message.ExtendedInfo": [
        {
          "@odata.type": "#Message.v1_1_1.Message",
          MessageId: `Base.1.8.${e.messageId}`,
          Message: e.message,
          MessageArgs: e.args,
          Severity: e.status >= 500 ? "Critical" : "Warning",
          Resolution: "See the message and retry with a corrected request.",
        },
      ],
    },
  };
}

function sameSecret(a: string, b: string): boolean {
  const ha = createHash("sha256").update(a).digest();
  const hb = createHash("sha256").update(b).digest();
  return timingSafeEqual(ha, hb);
}

export async function startRedfishEmulator(opts: RedfishEmulatorOptions): Promise<RedfishEmulator> {
  const username = opts.username ?? "admin";
  const password = opts.password ?? "password";
  const specs = typeof opts.machines === "number" ? Array.from({ length: opts.machines }, () => ({})) : opts.machines;
  const machines = new Map<string, MachineState>();
  const byManager = new Map<string, MachineState>();
  specs.forEach((s: MachineOptions, i) => {
    const id = s.id ?? `node-${i + 1}`;
    if (machines.has(id)) throw new Error(`duplicate machine id ${id}`);
    const driveCount = s.drives ?? opts.drives ?? 0;
    if (!Number.isInteger(driveCount) || driveCount < 0 || driveCount > 24)
      throw new Error(`machine ${id}: drives must be an integer from 0 to 24`);
    for (const a of s.addresses ?? []) if (!isIP(a)) throw new Error(`machine ${id}: ${JSON.stringify(a)} is not an IP address`);
    const q = s.qemu;
    if (q && s.uuid !== undefined && s.uuid !== q.uuid) throw new Error(`machine ${id}: its uuid is its QEMU machine's (${q.uuid})`);
    const m: MachineState = {
      id,
      // Random: a ramdisk is matched to its machine by this UUID, so two emulators must never share one.
      uuid: q?.uuid ?? s.uuid ?? randomUUID(),
      managerId: `${id}-bmc`,
      power: s.power ?? "Off",
      transition: null,
      boot: { target: "None", enabled: "Disabled" },
      media: { inserted: false, image: null },
      biosVersion: q ? (q.firmware === "uefi" ? "OVMF (EDK II)" : "SeaBIOS") : "SIM-BIOS-1.0.0",
      bmcFirmwareVersion: "SIM-BMC-2.0.0",
      biosSettings: { BootMode: q?.firmware === "bios" ? "Bios" : "Uefi", SriovGlobalEnable: false, ProcTurboMode: "Enabled" },
      biosPending: {},
      storage: {
        drives: q
          ? q.disks.map((d, n) => ({
              id: `Disk.NVMe.${n}`,
              name: `NVMe disk ${n}`,
              capacityBytes: d.sizeBytes,
              mediaType: "SSD" as const,
              serialNumber: d.serial,
            }))
          : Array.from({ length: driveCount }, (_, d) => ({
              id: `Disk.Bay.${d}`,
              name: `Simulated SSD ${d}`,
              capacityBytes: DRIVE_CAPACITY_BYTES,
              mediaType: "SSD" as const,
            })),
        volumes: [],
      },
      powerHistory: [],
      addresses: [...(s.addresses ?? [])],
      nic: s.nic === true || (s.addresses?.length ?? 0) > 0,
      quirks: { ...opts.quirks, ...s.quirks },
      ...(q ? { qemu: q } : {}),
      virtualMedia: s.virtualMedia ?? opts.virtualMedia ?? "Manager",
      log: [],
    };
    if (!VIRTUAL_MEDIA_LOCATIONS.includes(m.virtualMedia))
      throw new Error(`machine ${id}: virtualMedia must be one of ${VIRTUAL_MEDIA_LOCATIONS.join(", ")}`);
    machines.set(id, m);
    byManager.set(m.managerId, m);
  });

  let faults: RedfishFaults = { ...opts.faults };
  let random = seededRandom(faults.seed ?? 1);
  const requests: RedfishRequestRecord[] = [];

  const sys = (m: MachineState) => `/redfish/v1/Systems/${encodeURIComponent(m.id)}`;
  const mgr = (m: MachineState) => `/redfish/v1/Managers/${encodeURIComponent(m.managerId)}`;

  async function setPower(m: MachineState, to: PowerState): Promise<void> {
    const from = m.power;
    if (from === to) return;
    m.power = to;
    m.powerHistory.push(to);
    if (to === "On") applyBiosPending(m);
    await opts.onPowerChange?.(m, from, to);
    // A "Once" boot override is consumed by the boot it applied to, as on real BMCs.
    if (to === "On" && m.boot.enabled === "Once") m.boot = { target: "None", enabled: "Disabled" };
  }

  /** The power states a reset goes through, in order (a restart of an Off machine only powers it on, as many BMCs do). */
  const resetSteps = (type: ResetType): PowerState[] =>
    type === "On" ? ["On"] : type === "ForceOff" || type === "GracefulShutdown" ? ["Off"] : ["Off", "On"];

  async function reset(m: MachineState, type: ResetType): Promise<void> {
    for (const to of resetSteps(type)) await setPower(m, to);
  }

  /** The BIOS applies staged settings while it starts, before anything boots. */
  function applyBiosPending(m: MachineState): void {
    if (Object.keys(m.biosPending).length === 0) return;
    m.biosSettings = { ...m.biosSettings, ...m.biosPending };
    m.biosPending = {};
  }

  /** A QEMU-backed machine's PowerState and boot override are the machine's own: read them before answering. */
  async function refresh(m: MachineState): Promise<void> {
    if (!m.qemu) return;
    m.power = await m.qemu.powerState();
    m.boot = { ...m.qemu.bootOverride };
  }

  /** ComputerSystem.Reset of a real machine: the QemuMachine operation of each type, as sushy-tools' libvirt driver maps them. */
  const QEMU_RESETS = {
    On: "powerOn",
    ForceOn: "powerOn",
    ForceOff: "forceOff",
    GracefulShutdown: "gracefulShutdown",
    ForceRestart: "forceRestart",
    GracefulRestart: "gracefulRestart",
    PowerCycle: "powerCycle",
    Nmi: "nmi",
  } as const satisfies Record<(typeof QEMU_RESET_TYPES)[number], keyof QemuMachine>;

  let logIds = 0;
  const logEntry = (m: MachineState, message: string) =>
    m.log.push({ id: String(++logIds), created: new Date().toISOString().replace(/\.\d+Z$/, "Z"), message });

  // Asynchronous resets: each machine's run one after another, each step after part of the delay.
  const timers = new Set<ReturnType<typeof setTimeout>>();
  const resetsUnderWay = new Map<MachineState, Promise<void>>();
  let stopped = false;
  const wait = (ms: number) =>
    new Promise<void>((resolve) => {
      const t = setTimeout(() => (timers.delete(t), resolve()), ms);
      timers.add(t);
    });

  function resetLater(m: MachineState, type: ResetType, delayMs: number): void {
    const run = async () => {
      // What changes is decided when the reset's turn comes: an earlier one may have been under way.
      const changes: PowerState[] = [];
      for (const to of resetSteps(type)) if (to !== (changes.at(-1) ?? m.power)) changes.push(to);
      // Each change: the old state for a while, then PoweringOn/Off, then the new state.
      const part = delayMs / (2 * Math.max(changes.length, 1));
      for (const to of changes) {
        await wait(part);
        if (stopped) return;
        m.transition = to === "On" ? "PoweringOn" : "PoweringOff";
        await wait(part);
        if (stopped) return;
        m.transition = null;
        await setPower(m, to);
      }
    };
    const next = (resetsUnderWay.get(m) ?? Promise.resolve()).then(run).catch(() => {});
    resetsUnderWay.set(m, next);
  }

  const chassisPath = (m: MachineState) => `/redfish/v1/Chassis/${encodeURIComponent(m.id)}`;
  const mediaUnder = (m: MachineState, where: "Manager" | "System") => m.virtualMedia === where || m.virtualMedia === "Both";
  const mediaPath = (m: MachineState, where: "Manager" | "System") => `${where === "Manager" ? mgr(m) : sys(m)}/VirtualMedia`;

  /** The CPUs: a QEMU machine's vCPUs in one socket; a simulated machine's two sockets. */
  function processors(m: MachineState) {
    const q = m.qemu;
    if (q)
      return [
        { id: "CPU.0", socket: "CPU 0", cores: q.cpus, threads: q.cpus, manufacturer: "QEMU", model: `QEMU ${q.accel.toUpperCase()} CPU` },
      ];
    return [0, 1].map((n) => ({
      id: `CPU.${n}`,
      socket: `CPU ${n}`,
      cores: 16,
      threads: 32,
      manufacturer: "Better Compute (simulated)",
      model: "Simulated CPU",
    }));
  }

  /** The DIMMs (MiB each): a QEMU machine's memory as one; a simulated machine's two. */
  const dimms = (m: MachineState) => (m.qemu ? [m.qemu.memoryMiB] : [32_768, 32_768]).map((mib, n) => ({ id: `DIMM.${n}`, mib }));

  /** The NICs: a QEMU machine's, by their MACs; a simulated machine's one, only when it has addresses (as before). */
  function nics(m: MachineState): Array<{ id: string; mac: string }> {
    if (m.qemu) return m.qemu.nics.map((n, i) => ({ id: `NIC.${i + 1}`, mac: n.mac.toUpperCase() }));
    return m.nic || m.addresses.length > 0 ? [{ id: NIC_ID, mac: fakeMac(m.id) }] : [];
  }

  function systemResource(m: MachineState): unknown {
    const q = m.qemu;
    const cpus = processors(m);
    return {
      "@odata.id": sys(m),
      "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
      Id: m.id,
      Name: q ? `QEMU machine ${q.name}` : `Simulated system ${m.id}`,
      SystemType: "Physical",
      Manufacturer: q ? q.smbios.manufacturer : "Better Compute (simulated)",
      Model: q ? q.smbios.product : "Redfish emulator",
      ...(q ? { SerialNumber: q.smbios.serial } : {}),
      UUID: m.uuid,
      PowerState: m.transition ?? m.power,
      BiosVersion: m.biosVersion,
      Status: { State: "Enabled", Health: "OK" },
      ProcessorSummary: {
        Count: cpus.length,
        LogicalProcessorCount: cpus.reduce((n, c) => n + c.threads, 0),
        Model: cpus[0]!.model,
        Status: health,
      },
      MemorySummary: { TotalSystemMemoryGiB: dimms(m).reduce((n, d) => n + d.mib, 0) / 1024, Status: health },
      Boot: {
        BootSourceOverrideTarget: m.boot.target,
        BootSourceOverrideEnabled: m.boot.enabled,
        BootSourceOverrideMode: q?.firmware === "bios" ? "Legacy" : "UEFI",
        "BootSourceOverrideTarget@Redfish.AllowableValues": [...BOOT_TARGETS],
        "BootSourceOverrideEnabled@Redfish.AllowableValues": m.quirks.continuousBootOnly ? ["Disabled", "Continuous"] : [...BOOT_ENABLED],
      },
      ...(m.quirks.noBios ? {} : { Bios: { "@odata.id": `${sys(m)}/Bios` } }),
      Processors: { "@odata.id": `${sys(m)}/Processors` },
      Memory: { "@odata.id": `${sys(m)}/Memory` },
      SimpleStorage: { "@odata.id": `${sys(m)}/SimpleStorage` },
      ...(m.storage.drives.length > 0 ? { Storage: { "@odata.id": `${sys(m)}/Storage` } } : {}),
      ...(nics(m).length > 0 ? { EthernetInterfaces: { "@odata.id": `${sys(m)}/EthernetInterfaces` } } : {}),
      ...(mediaUnder(m, "System") ? { VirtualMedia: { "@odata.id": mediaPath(m, "System") } } : {}),
      Actions: {
        "#ComputerSystem.Reset": {
          target: `${sys(m)}/Actions/ComputerSystem.Reset`,
          "ResetType@Redfish.AllowableValues": q ? [...QEMU_RESET_TYPES] : [...RESET_TYPES],
        },
      },
      Links: { Chassis: [{ "@odata.id": chassisPath(m) }], ManagedBy: [{ "@odata.id": mgr(m) }] },
    };
  }

  function managerResource(m: MachineState): unknown {
    return {
      "@odata.id": mgr(m),
      "@odata.type": "#Manager.v1_10_0.Manager",
      Id: m.managerId,
      Name: `${m.qemu ? "Emulated" : "Simulated"} BMC of ${m.id}`,
      ManagerType: "BMC",
      Model: "Better Compute Redfish emulator",
      FirmwareVersion: m.bmcFirmwareVersion,
      DateTime: new Date().toISOString().replace(/\.\d+Z$/, "+00:00"),
      PowerState: "On",
      Status: { State: "Enabled", Health: "OK" },
      ...(mediaUnder(m, "Manager") ? { VirtualMedia: { "@odata.id": mediaPath(m, "Manager") } } : {}),
      LogServices: { "@odata.id": `${mgr(m)}/LogServices` },
      // A real machine's console is offered on a Telnet port, as many BMCs do; a simulated one has none.
      SerialConsole: {
        MaxConcurrentSessions: m.consolePort ? 4 : 0,
        Telnet: { ServiceEnabled: m.consolePort !== undefined, ...(m.consolePort ? { Port: m.consolePort } : {}) },
        SSH: { ServiceEnabled: false },
        IPMI: { ServiceEnabled: false },
      },
      Links: { ManagerForServers: [{ "@odata.id": sys(m) }], ManagerForChassis: [{ "@odata.id": chassisPath(m) }] },
    };
  }

  function cdResource(m: MachineState, where: "Manager" | "System"): unknown {
    const base = `${mediaPath(m, where)}/Cd`;
    return {
      "@odata.id": base,
      "@odata.type": "#VirtualMedia.v1_6_0.VirtualMedia",
      Id: "Cd",
      Name: "Virtual CD",
      MediaTypes: ["CD", "DVD"],
      Image: m.media.image,
      ImageName: m.media.image ? (m.media.image.split("/").pop() ?? null) : null,
      Inserted: m.media.inserted,
      WriteProtected: true,
      ConnectedVia: m.media.inserted ? "URI" : "NotConnected",
      Actions: {
        "#VirtualMedia.InsertMedia": { target: `${base}/Actions/VirtualMedia.InsertMedia` },
        "#VirtualMedia.EjectMedia": { target: `${base}/Actions/VirtualMedia.EjectMedia` },
      },
    };
  }

  const collection = (id: string, type: string, name: string, members: string[]) => ({
    "@odata.id": id,
    "@odata.type": `#${type}`,
    Name: name,
    "Members@odata.count": members.length,
    Members: members.map((m) => ({ "@odata.id": m })),
  });

  function readBody(req: IncomingMessage): Promise<string> {
    return new Promise((resolve, reject) => {
      let size = 0;
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => {
        size += c.length;
        if (size > MAX_BODY) reject(new HttpError(413, "GeneralError", "Request body too large."));
        else chunks.push(c);
      });
      req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
      req.on("error", reject);
    });
  }

  async function jsonBody(req: IncomingMessage): Promise<Record<string, unknown>> {
    const text = await readBody(req);
    let v: unknown;
    try {
      v = text === "" ? {} : JSON.parse(text);
    } catch {
      throw new HttpError(400, "MalformedJSON", "The request body submitted was malformed JSON.");
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) {
      throw new HttpError(400, "MalformedJSON", "The request body must be a JSON object.");
    }
    return v as Record<string, unknown>;
  }

  /** Sessions by id; a request carries one's token in X-Auth-Token (Redfish's session auth, which sushy tries first). */
  const sessions = new Map<string, { token: string; created: string }>();

  /** The emulator's credential, compared so that timing does not reveal which half failed. */
  function credentialMatches(user: string, pass: string): boolean {
    const u = sameSecret(user, username);
    const p = sameSecret(pass, password);
    return u && p;
  }

  function authorized(req: IncomingMessage): boolean {
    const token = req.headers["x-auth-token"];
    if (typeof token === "string" && token !== "") return [...sessions.values()].some((s) => sameSecret(s.token, token));
    const h = req.headers.authorization ?? "";
    const m = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(h);
    if (!m?.[1]) return false;
    const decoded = Buffer.from(m[1], "base64").toString("utf8");
    const i = decoded.indexOf(":");
    if (i < 0) return false;
    return credentialMatches(decoded.slice(0, i), decoded.slice(i + 1));
  }

  const splitPath = (path: string): string[] => {
    try {
      return path.split("/").filter(Boolean).map(decodeURIComponent);
    } catch {
      throw notFound(path);
    }
  };
  const notFound = (path: string) => new HttpError(404, "ResourceMissingAtURI", `The resource at the URI ${path} was not found.`, [path]);
  const noMethod = (method: string) => new HttpError(405, "ActionNotSupported", `The method ${method} is not supported here.`, [method]);

  /** Routes one authorized request; returns [status, body, extra headers?]. */
  async function route(req: IncomingMessage, method: string, path: string): Promise<[number, unknown, Record<string, string>?]> {
    const parts = splitPath(path); // ["redfish","v1",…]
    if (parts[0] !== "redfish" || parts[1] !== "v1") throw notFound(path);
    const [, , top, id, sub, action, name] = parts;
    if (top === "Systems" && id !== undefined && sub === "Storage") {
      const m = machines.get(id);
      if (!m) throw notFound(path);
      return storageRoute(req, method, path, m, parts.slice(5));
    }
    if (top === "Systems" && id !== undefined && sub === "EthernetInterfaces") {
      const m = machines.get(id);
      if (!m) throw notFound(path);
      return ethernetRoute(method, path, m, parts.slice(5));
    }
    if ((top === "Systems" || top === "Managers") && id !== undefined && sub === "VirtualMedia") {
      const m = top === "Systems" ? machines.get(id) : byManager.get(id);
      if (!m) throw notFound(path);
      return mediaRoute(req, method, path, m, top === "Systems" ? "System" : "Manager", parts.slice(5));
    }
    const inventory = await inventoryRoute(req, method, path, parts);
    if (inventory) return inventory;
    if (parts.length > 7) throw notFound(path);
    const get = () => {
      if (method !== "GET") throw noMethod(method);
    };

    if (top === "Systems") {
      if (id === undefined) {
        get();
        return [
          200,
          collection(
            "/redfish/v1/Systems",
            "ComputerSystemCollection.ComputerSystemCollection",
            "Computer System Collection",
            [...machines.values()].map(sys),
          ),
        ];
      }
      const m = machines.get(id);
      if (!m) throw notFound(path);
      if (sub === undefined) {
        await refresh(m);
        if (method === "GET") return [200, systemResource(m)];
        if (method !== "PATCH") throw noMethod(method);
        const body = await jsonBody(req);
        for (const k of Object.keys(body)) {
          if (k !== "Boot") throw new HttpError(400, "PropertyUnknown", `The property ${k} is not a known or patchable property.`, [k]);
        }
        const boot = body.Boot;
        if (typeof boot !== "object" || boot === null || Array.isArray(boot)) {
          throw new HttpError(400, "PropertyValueTypeError", "The value for the property Boot must be an object.", ["Boot"]);
        }
        const b = boot as Record<string, unknown>;
        let target = m.boot.target;
        let enabled = m.boot.enabled;
        for (const [k, v] of Object.entries(b)) {
          if (k === "BootSourceOverrideTarget") {
            if (!BOOT_TARGETS.includes(v as BootTarget)) throw notInList(k, v);
            target = v as BootTarget;
          } else if (k === "BootSourceOverrideEnabled") {
            if (!BOOT_ENABLED.includes(v as BootEnabled)) throw notInList(k, v);
            // A Continuous-only BMC takes a Once without complaint and records Continuous.
            enabled = v === "Once" && m.quirks.continuousBootOnly ? "Continuous" : (v as BootEnabled);
          } else if (k !== "BootSourceOverrideMode") {
            throw new HttpError(400, "PropertyUnknown", `The property Boot/${k} is not a known or patchable property.`, [k]);
          }
        }
        // A real machine's firmware follows it: its devices' boot order changes (testing/qemu-machine.ts).
        await m.qemu?.setBootOverride(target, enabled);
        m.boot = { target, enabled };
        logEntry(m, `Boot override set: BootSourceOverrideTarget ${target}, BootSourceOverrideEnabled ${enabled}`);
        await refresh(m);
        return [200, systemResource(m)];
      }
      if (sub === "Bios" && m.quirks.noBios) throw notFound(path);
      if (sub === "Bios" && action === undefined) {
        get();
        return [200, biosResource(m)];
      }
      if (sub === "Bios" && action === "Settings" && name === undefined) {
        if (method === "GET") return [200, biosSettingsResource(m)];
        if (method !== "PATCH") throw noMethod(method);
        stageBiosSettings(m, await jsonBody(req));
        return [204, undefined];
      }
      if (sub === "Actions" && action === "ComputerSystem.Reset" && name === undefined) {
        if (method !== "POST") throw noMethod(method);
        const body = await jsonBody(req);
        const t = body.ResetType;
        if (t === undefined)
          throw new HttpError(
            400,
            "ActionParameterMissing",
            "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.",
            ["ComputerSystem.Reset", "ResetType"],
          );
        const types: readonly string[] = m.qemu ? QEMU_RESET_TYPES : RESET_TYPES;
        if (typeof t !== "string" || !types.includes(t)) {
          throw new HttpError(
            400,
            "ActionParameterValueNotInList",
            `The value ${JSON.stringify(t)} for the parameter ResetType in the action ComputerSystem.Reset is not in the list of acceptable values.`,
            [String(t), "ResetType", "ComputerSystem.Reset"],
          );
        }
        logEntry(m, `ComputerSystem.Reset ${t}`);
        const delay = m.quirks.resetDelayMs ?? 0;
        if (m.qemu) {
          await m.qemu[QEMU_RESETS[t as keyof typeof QEMU_RESETS]]();
          // Staged attributes take effect at a boot as on a simulated machine (the emulator's: the firmware never sees them).
          if (!["ForceOff", "GracefulShutdown", "Nmi"].includes(t)) applyBiosPending(m);
        } else if (delay > 0) resetLater(m, t as ResetType, delay);
        else await reset(m, t as ResetType);
        return [204, undefined];
      }
      throw notFound(path);
    }

    if (top === "Managers") {
      if (id === undefined) {
        get();
        return [
          200,
          collection("/redfish/v1/Managers", "ManagerCollection.ManagerCollection", "Manager Collection", [...machines.values()].map(mgr)),
        ];
      }
      const m = byManager.get(id);
      if (!m) throw notFound(path);
      if (sub === undefined) {
        get();
        return [200, managerResource(m)];
      }
      throw notFound(path);
    }

    if (top === undefined) {
      get();
      return [200, serviceRoot()];
    }
    throw notFound(path);
  }

  function biosResource(m: MachineState): unknown {
    return {
      "@odata.id": `${sys(m)}/Bios`,
      "@odata.type": "#Bios.v1_2_0.Bios",
      Id: "Bios",
      Name: "BIOS Configuration",
      Attributes: { ...m.biosSettings },
      "@Redfish.Settings": {
        "@odata.type": "#Settings.v1_3_0.Settings",
        SettingsObject: { "@odata.id": `${sys(m)}/Bios/Settings` },
        SupportedApplyTimes: ["OnReset"],
      },
    };
  }

  function biosSettingsResource(m: MachineState): unknown {
    return {
      "@odata.id": `${sys(m)}/Bios/Settings`,
      "@odata.type": "#Bios.v1_2_0.Bios",
      Id: "Settings",
      Name: "BIOS pending settings",
      Attributes: { ...m.biosPending },
    };
  }

  /** PATCH Bios/Settings: every attribute checked (known, same type) before any is staged. */
  function stageBiosSettings(m: MachineState, body: Record<string, unknown>): void {
    for (const [k, v] of Object.entries(body)) {
      if (k === "Attributes") continue;
      if (k === "@Redfish.SettingsApplyTime") {
        const at = (v as { ApplyTime?: unknown } | null)?.ApplyTime;
        if (at !== "OnReset") throw notInList("ApplyTime", at);
        continue;
      }
      throw new HttpError(400, "PropertyUnknown", `The property ${k} is not a known or patchable property.`, [k]);
    }
    const attrs = body.Attributes;
    if (attrs === undefined)
      throw new HttpError(400, "PropertyMissing", "The property Attributes is a required property and must be included in the request.", [
        "Attributes",
      ]);
    if (typeof attrs !== "object" || attrs === null || Array.isArray(attrs)) {
      throw new HttpError(400, "PropertyValueTypeError", "The value for the property Attributes must be an object.", ["Attributes"]);
    }
    const staged: Record<string, BiosValue> = {};
    for (const [k, v] of Object.entries(attrs)) {
      if (!Object.hasOwn(m.biosSettings, k))
        throw new HttpError(400, "PropertyUnknown", `The property ${k} is not a known BIOS attribute.`, [k]);
      if (typeof v !== typeof m.biosSettings[k]) {
        throw new HttpError(
          400,
          "PropertyValueTypeError",
          `The value ${JSON.stringify(v)} for the property ${k} is of a different type than the property can accept.`,
          [JSON.stringify(v), k],
        );
      }
      staged[k] = v as BiosValue;
    }
    m.biosPending = { ...m.biosPending, ...staged };
  }

  /** A simulated machine's RAID controller, or a QEMU machine's NVMe disks (no RAID: no Volumes). */
  const storageId = (m: MachineState) => (m.qemu ? NVME_STORAGE_ID : RAID_CONTROLLER_ID);
  const storagePath = (m: MachineState) => `${sys(m)}/Storage/${storageId(m)}`;
  const drivePath = (m: MachineState, d: SimDrive) => `${storagePath(m)}/Drives/${encodeURIComponent(d.id)}`;
  const volumePath = (m: MachineState, v: SimVolume) => `${storagePath(m)}/Volumes/${encodeURIComponent(v.id)}`;
  const health = { State: "Enabled", Health: "OK" };

  function storageResource(m: MachineState): unknown {
    const base = storagePath(m);
    const name = m.qemu ? "NVMe disks" : "Simulated RAID controller";
    return {
      "@odata.id": base,
      "@odata.type": "#Storage.v1_13_0.Storage",
      Id: storageId(m),
      Name: name,
      Status: health,
      StorageControllers: [
        {
          "@odata.id": `${base}#/StorageControllers/0`,
          MemberId: "0",
          Name: name,
          Status: health,
          ...(m.qemu
            ? { SupportedControllerProtocols: ["PCIe"], SupportedDeviceProtocols: ["NVMe"], SupportedRAIDTypes: [] }
            : { SupportedRAIDTypes: [...RAID_TYPES] }),
        },
      ],
      "Drives@odata.count": m.storage.drives.length,
      Drives: m.storage.drives.map((d) => ({ "@odata.id": drivePath(m, d) })),
      ...(m.qemu ? {} : { Volumes: { "@odata.id": `${base}/Volumes` } }),
    };
  }

  function driveResource(m: MachineState, d: SimDrive): unknown {
    const volumes = m.storage.volumes.filter((v) => v.drives.includes(d.id));
    return {
      "@odata.id": drivePath(m, d),
      "@odata.type": "#Drive.v1_17_0.Drive",
      Id: d.id,
      Name: d.name,
      CapacityBytes: d.capacityBytes,
      MediaType: d.mediaType,
      Protocol: d.serialNumber === undefined ? "SATA" : "NVMe",
      ...(d.serialNumber === undefined ? {} : { SerialNumber: d.serialNumber, Model: "QEMU NVMe Ctrl" }),
      Status: health,
      Links: { "Volumes@odata.count": volumes.length, Volumes: volumes.map((v) => ({ "@odata.id": volumePath(m, v) })) },
    };
  }

  function volumeResource(m: MachineState, v: SimVolume): unknown {
    const drives = v.drives.flatMap((id) => m.storage.drives.filter((d) => d.id === id));
    return {
      "@odata.id": volumePath(m, v),
      "@odata.type": "#Volume.v1_9_0.Volume",
      Id: v.id,
      Name: v.name,
      RAIDType: v.raidType,
      CapacityBytes: v.capacityBytes,
      Status: health,
      Links: { "Drives@odata.count": drives.length, Drives: drives.map((d) => ({ "@odata.id": drivePath(m, d) })) },
    };
  }

  /** /Systems/<id>/Storage[...]; `rest` is what follows "Storage". A machine without drives has no controller. */
  async function storageRoute(
    req: IncomingMessage,
    method: string,
    path: string,
    m: MachineState,
    rest: string[],
  ): Promise<[number, unknown, Record<string, string>?]> {
    if (m.storage.drives.length === 0 || rest.length > 3) throw notFound(path);
    if (m.quirks.failingStorage) throw new HttpError(500, "InternalError", "The request failed due to an internal service error.");
    const get = () => {
      if (method !== "GET") throw noMethod(method);
    };
    const [ctrl, coll, item] = rest;
    if (ctrl === undefined) {
      get();
      return [200, collection(`${sys(m)}/Storage`, "StorageCollection.StorageCollection", "Storage Collection", [storagePath(m)])];
    }
    if (ctrl !== storageId(m)) throw notFound(path);
    if (coll === undefined) {
      get();
      return [200, storageResource(m)];
    }
    if (coll === "Drives" && item !== undefined) {
      const d = m.storage.drives.find((x) => x.id === item);
      if (!d) throw notFound(path);
      get();
      return [200, driveResource(m, d)];
    }
    if (coll !== "Volumes" || m.qemu) throw notFound(path);
    if (item === undefined) {
      // Allow says which methods the collection offers, as the Redfish spec has a GET answer it.
      const allow = { Allow: m.quirks.noVolumeCreation ? "GET" : "GET, POST" };
      if (method === "GET")
        return [
          200,
          collection(
            `${storagePath(m)}/Volumes`,
            "VolumeCollection.VolumeCollection",
            "Volume Collection",
            m.storage.volumes.map((v) => volumePath(m, v)),
          ),
          allow,
        ];
      if (method !== "POST" || m.quirks.noVolumeCreation) return [405, errorBody(noMethod(method)), allow];
      const v = createVolume(m, await jsonBody(req));
      return [201, volumeResource(m, v), { Location: volumePath(m, v) }];
    }
    const v = m.storage.volumes.find((x) => x.id === item);
    if (!v) throw notFound(path);
    if (method === "GET") return [200, volumeResource(m, v)];
    if (method !== "DELETE") throw noMethod(method);
    m.storage.volumes = m.storage.volumes.filter((x) => x !== v);
    return [204, undefined];
  }

  const nicPath = (m: MachineState, id: string) => `${sys(m)}/EthernetInterfaces/${id}`;

  /** A NIC as real BMCs (and sushy-tools) serve it: IPv4 with a mask, IPv6 with a prefix length (the machine's addresses, on its first NIC). */
  function nicResource(m: MachineState, nic: { id: string; mac: string }, first: boolean): unknown {
    const addresses = first ? m.addresses : [];
    return {
      "@odata.id": nicPath(m, nic.id),
      "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface",
      Id: nic.id,
      Name: m.qemu ? "virtio-net NIC" : "Simulated NIC",
      Status: health,
      LinkStatus: "LinkUp",
      MACAddress: nic.mac,
      PermanentMACAddress: nic.mac,
      IPv4Addresses: addresses
        .filter((a) => isIP(a) === 4)
        .map((a) => ({ Address: a, SubnetMask: "255.255.255.0", AddressOrigin: "DHCP" })),
      IPv6Addresses: addresses.filter((a) => isIP(a) === 6).map((a) => ({ Address: a, PrefixLength: 64, AddressOrigin: "SLAAC" })),
    };
  }

  /** /Systems/<id>/EthernetInterfaces[...]; `rest` is what follows it. A machine without NICs (a simulated one without addresses) has none. */
  function ethernetRoute(method: string, path: string, m: MachineState, rest: string[]): [number, unknown] {
    const all = nics(m);
    if (all.length === 0 || rest.length > 1) throw notFound(path);
    const [id] = rest;
    const nic = all.find((n) => n.id === id);
    if (id !== undefined && !nic) throw notFound(path);
    if (method !== "GET") throw noMethod(method);
    if (!nic)
      return [
        200,
        collection(
          `${sys(m)}/EthernetInterfaces`,
          "EthernetInterfaceCollection.EthernetInterfaceCollection",
          "Ethernet Interface Collection",
          all.map((n) => nicPath(m, n.id)),
        ),
      ];
    return [200, nicResource(m, nic, nic === all[0])];
  }

  const volumeCounters = new Map<MachineState, number>();

  /**
   * POST …/Volumes: the level, the drives (known, distinct, free, as many as the level takes), under
   * Links.Drives as the Volume schema has them (or at the top level, as its first versions did).
   */
  function createVolume(m: MachineState, body: Record<string, unknown>): SimVolume {
    for (const k of Object.keys(body)) {
      if (!["RAIDType", "Drives", "Links", "Name", "CapacityBytes"].includes(k))
        throw new HttpError(400, "PropertyUnknown", `The property ${k} is not a known property of a Volume.`, [k]);
    }
    const level = body.RAIDType;
    if (level === undefined)
      throw new HttpError(400, "PropertyMissing", "The property RAIDType is a required property and must be included in the request.", [
        "RAIDType",
      ]);
    if (!RAID_TYPES.includes(level as RaidType)) throw notInList("RAIDType", level);
    const links = body.Links;
    if (links !== undefined && (typeof links !== "object" || links === null || Array.isArray(links)))
      throw new HttpError(400, "PropertyValueTypeError", "The value for the property Links must be an object.", ["Links"]);
    for (const k of Object.keys(links ?? {})) {
      if (k !== "Drives")
        throw new HttpError(400, "PropertyUnknown", `The property Links/${k} is not a known property of a Volume.`, [`Links/${k}`]);
    }
    const linked = (links as { Drives?: unknown } | undefined)?.Drives;
    if (linked !== undefined && body.Drives !== undefined)
      throw new HttpError(400, "PropertyValueConflict", "The property Drives conflicts with the property Links/Drives: give one.", [
        "Drives",
        "Links/Drives",
      ]);
    const refs = linked ?? body.Drives;
    if (refs === undefined)
      throw new HttpError(400, "PropertyMissing", "The property Links/Drives is a required property and must be included in the request.", [
        "Links/Drives",
      ]);
    if (!Array.isArray(refs))
      throw new HttpError(400, "PropertyValueTypeError", "The value for the property Drives must be an array of links.", ["Drives"]);
    const drives: SimDrive[] = [];
    for (const ref of refs) {
      const uri = (ref as { "@odata.id"?: unknown } | null)?.["@odata.id"];
      const wanted = typeof uri === "string" ? uri.replace(/^https?:\/\/[^/]+/, "").replace(/\/+$/, "") : undefined;
      const d = m.storage.drives.find((x) => drivePath(m, x) === wanted);
      if (!d)
        throw new HttpError(
          400,
          "PropertyValueNotInList",
          `The value ${JSON.stringify(uri ?? ref)} in the property Drives is not a drive of this controller.`,
          [String(uri), "Drives"],
        );
      if (drives.includes(d))
        throw new HttpError(400, "PropertyValueConflict", `The drive ${String(uri)} is listed more than once in the property Drives.`, [
          "Drives",
          "Drives",
        ]);
      const holder = m.storage.volumes.find((v) => v.drives.includes(d.id));
      if (holder)
        throw new HttpError(400, "ResourceInUse", `The drive ${String(uri)} is already a member of the volume ${holder.id}.`, [
          String(uri),
        ]);
      drives.push(d);
    }
    const problem = raidDriveCountProblem(level as RaidType, drives.length);
    if (problem)
      throw new HttpError(400, "PropertyValueConflict", `The property Drives conflicts with the property RAIDType: ${problem}.`, [
        "Drives",
        "RAIDType",
      ]);
    const max = raidCapacityBytes(
      level as RaidType,
      drives.map((d) => d.capacityBytes),
    );
    if (body.CapacityBytes === undefined && m.quirks.requireVolumeCapacity) {
      throw new HttpError(
        400,
        "PropertyMissing",
        "The property CapacityBytes is a required property and must be included in the request.",
        ["CapacityBytes"],
      );
    }
    const capacity = body.CapacityBytes ?? max;
    if (typeof capacity !== "number" || !Number.isInteger(capacity) || capacity <= 0 || capacity > max) {
      throw new HttpError(
        400,
        "PropertyValueIncorrect",
        `The value ${JSON.stringify(capacity)} for the property CapacityBytes is not a size these drives can hold (at most ${max}).`,
        ["CapacityBytes", String(capacity)],
      );
    }
    const name = body.Name;
    if (name !== undefined && (typeof name !== "string" || name === ""))
      throw new HttpError(400, "PropertyValueTypeError", "The value for the property Name must be a non-empty string.", ["Name"]);
    let n = volumeCounters.get(m) ?? 0;
    let id = `Volume.${++n}`;
    while (m.storage.volumes.some((v) => v.id === id)) id = `Volume.${++n}`;
    volumeCounters.set(m, n);
    const volume: SimVolume = {
      id,
      name: name ?? `${level} volume ${n}`,
      raidType: level as RaidType,
      drives: drives.map((d) => d.id),
      capacityBytes: capacity,
    };
    m.storage.volumes = [...m.storage.volumes, volume];
    return volume;
  }

  const SESSIONS = "/redfish/v1/SessionService/Sessions";
  const sessionPath = (id: string) => `${SESSIONS}/${id}`;
  const ACCOUNT = { id: "1", role: "Administrator" };

  /** POST …/Sessions { UserName, Password }: 201, the token in X-Auth-Token and the session in Location. */
  async function createSession(req: IncomingMessage): Promise<[number, unknown, Record<string, string>]> {
    const body = await jsonBody(req);
    const user = body.UserName;
    const pass = body.Password;
    if (typeof user !== "string" || typeof pass !== "string")
      throw new HttpError(400, "PropertyMissing", "The properties UserName and Password are required to create a session.", [
        "UserName",
        "Password",
      ]);
    if (!credentialMatches(user, pass))
      throw new HttpError(401, "InsufficientPrivilege", "Authentication failed: invalid or missing credentials.");
    const id = randomBytes(8).toString("hex");
    const session = { token: randomBytes(24).toString("hex"), created: new Date().toISOString() };
    sessions.set(id, session);
    return [201, sessionResource(id), { "X-Auth-Token": session.token, Location: sessionPath(id) }];
  }

  const sessionResource = (id: string) => ({
    "@odata.id": sessionPath(id),
    "@odata.type": "#Session.v1_5_0.Session",
    Id: id,
    Name: "User Session",
    UserName: username,
    CreatedTime: sessions.get(id)?.created,
  });

  /** The resources beyond power, boot, BIOS, storage and media: sessions, accounts, chassis, inventory, logs; undefined: not one of them. */
  async function inventoryRoute(
    req: IncomingMessage,
    method: string,
    path: string,
    parts: string[],
  ): Promise<[number, unknown] | undefined> {
    const [, , top, id, sub, item, more, last] = parts;
    const get = (body: unknown): [number, unknown] => {
      if (method !== "GET") throw noMethod(method);
      return [200, body];
    };
    if (top === "SessionService") {
      if (id === undefined) return get(sessionService());
      if (id !== "Sessions" || item !== undefined) throw notFound(path);
      if (sub === undefined)
        return get(
          collection(SESSIONS, "SessionCollection.SessionCollection", "Session Collection", [...sessions.keys()].map(sessionPath)),
        );
      if (!sessions.has(sub)) throw notFound(path);
      if (method === "DELETE") {
        sessions.delete(sub);
        return [204, undefined];
      }
      return get(sessionResource(sub));
    }
    if (top === "AccountService") {
      if (parts.length > 5) throw notFound(path);
      if (id === undefined) return get(accountService());
      if (id === "Accounts" && sub === undefined)
        return get(
          collection("/redfish/v1/AccountService/Accounts", "ManagerAccountCollection.ManagerAccountCollection", "Accounts Collection", [
            `/redfish/v1/AccountService/Accounts/${ACCOUNT.id}`,
          ]),
        );
      if (id === "Accounts" && sub === ACCOUNT.id) return get(accountResource());
      if (id === "Roles" && sub === undefined)
        return get(
          collection("/redfish/v1/AccountService/Roles", "RoleCollection.RoleCollection", "Roles Collection", [
            `/redfish/v1/AccountService/Roles/${ACCOUNT.role}`,
          ]),
        );
      if (id === "Roles" && sub === ACCOUNT.role) return get(roleResource());
      throw notFound(path);
    }
    if (top === "Chassis") {
      if (parts.length > 4) throw notFound(path);
      const m = id === undefined ? undefined : machines.get(id);
      if (m) await refresh(m);
      return get(collectionOrMember(path, "/redfish/v1/Chassis", "Chassis", [...machines.values()], id, chassisResource));
    }
    if (top === "Systems" && id !== undefined && (sub === "Processors" || sub === "Memory" || sub === "SimpleStorage")) {
      const m = machines.get(id);
      if (!m || more !== undefined) throw notFound(path);
      const base = `${sys(m)}/${sub}`;
      if (sub === "Processors")
        return get(collectionOrMember(path, base, "Processor", processors(m), item, (c) => processorResource(base, c)));
      if (sub === "Memory") return get(collectionOrMember(path, base, "Memory", dimms(m), item, (d) => memoryResource(base, d)));
      const controllers = m.storage.drives.length > 0 ? [{ id: storageId(m) }] : [];
      return get(collectionOrMember(path, base, "SimpleStorage", controllers, item, () => simpleStorageResource(m, base)));
    }
    if (top === "Managers" && id !== undefined && sub === "LogServices") {
      const m = byManager.get(id);
      if (!m) throw notFound(path);
      const services = `${mgr(m)}/LogServices`;
      const log = `${services}/Log`;
      if (item === undefined)
        return get(collection(services, "LogServiceCollection.LogServiceCollection", "Log Service Collection", [log]));
      if (item !== "Log") throw notFound(path);
      if (more === undefined) return get(logServiceResource(m, log));
      if (more === "Actions" && last === "LogService.ClearLog" && parts.length === 8) {
        if (method !== "POST") throw noMethod(method);
        m.log = [];
        return [204, undefined];
      }
      if (more !== "Entries" || parts.length > 8) throw notFound(path);
      return get(collectionOrMember(path, `${log}/Entries`, "LogEntry", m.log, last, (e) => logEntryResource(`${log}/Entries`, e)));
    }
    return undefined;
  }

  /** A collection of `items` at `base` (its type named after `kind`), or the member `wanted` of it. */
  function collectionOrMember<T extends { id: string }>(
    path: string,
    base: string,
    kind: string,
    items: T[],
    wanted: string | undefined,
    render: (item: T) => unknown,
  ): unknown {
    if (wanted === undefined)
      return collection(
        base,
        `${kind}Collection.${kind}Collection`,
        `${kind} Collection`,
        items.map((i) => `${base}/${i.id}`),
      );
    const found = items.find((i) => i.id === wanted);
    if (!found) throw notFound(path);
    return render(found);
  }

  const sessionService = () => ({
    "@odata.id": "/redfish/v1/SessionService",
    "@odata.type": "#SessionService.v1_1_8.SessionService",
    Id: "SessionService",
    Name: "Session Service",
    ServiceEnabled: true,
    SessionTimeout: 1800,
    Status: health,
    Sessions: { "@odata.id": SESSIONS },
  });

  const accountService = () => ({
    "@odata.id": "/redfish/v1/AccountService",
    "@odata.type": "#AccountService.v1_12_0.AccountService",
    Id: "AccountService",
    Name: "Account Service",
    ServiceEnabled: true,
    Status: health,
    MinPasswordLength: 8,
    AccountLockoutThreshold: 0,
    Accounts: { "@odata.id": "/redfish/v1/AccountService/Accounts" },
    Roles: { "@odata.id": "/redfish/v1/AccountService/Roles" },
  });

  const accountResource = () => ({
    "@odata.id": `/redfish/v1/AccountService/Accounts/${ACCOUNT.id}`,
    "@odata.type": "#ManagerAccount.v1_10_0.ManagerAccount",
    Id: ACCOUNT.id,
    Name: "User Account",
    UserName: username,
    Password: null, // as the schema says: never shown
    RoleId: ACCOUNT.role,
    Enabled: true,
    Locked: false,
    Links: { Role: { "@odata.id": `/redfish/v1/AccountService/Roles/${ACCOUNT.role}` } },
  });

  const roleResource = () => ({
    "@odata.id": `/redfish/v1/AccountService/Roles/${ACCOUNT.role}`,
    "@odata.type": "#Role.v1_3_1.Role",
    Id: ACCOUNT.role,
    Name: "User Role",
    RoleId: ACCOUNT.role,
    IsPredefined: true,
    AssignedPrivileges: ["Login", "ConfigureManager", "ConfigureUsers", "ConfigureSelf", "ConfigureComponents"],
  });

  function chassisResource(m: MachineState): unknown {
    const q = m.qemu;
    return {
      "@odata.id": chassisPath(m),
      "@odata.type": "#Chassis.v1_21_0.Chassis",
      Id: m.id,
      Name: `Chassis of ${m.id}`,
      ChassisType: "RackMount",
      Manufacturer: q ? q.smbios.manufacturer : "Better Compute (simulated)",
      Model: q ? q.smbios.product : "Redfish emulator",
      ...(q ? { SerialNumber: q.smbios.serial } : {}),
      PowerState: m.transition ?? m.power,
      Status: health,
      Links: {
        ComputerSystems: [{ "@odata.id": sys(m) }],
        ManagedBy: [{ "@odata.id": mgr(m) }],
        "Drives@odata.count": m.storage.drives.length,
        Drives: m.storage.drives.map((d) => ({ "@odata.id": drivePath(m, d) })),
      },
    };
  }

  const processorResource = (base: string, c: ReturnType<typeof processors>[number]) => ({
    "@odata.id": `${base}/${c.id}`,
    "@odata.type": "#Processor.v1_18_0.Processor",
    Id: c.id,
    Name: "Processor",
    Socket: c.socket,
    ProcessorType: "CPU",
    ProcessorArchitecture: "x86",
    InstructionSet: "x86-64",
    Manufacturer: c.manufacturer,
    Model: c.model,
    TotalCores: c.cores,
    TotalThreads: c.threads,
    Status: health,
  });

  const memoryResource = (base: string, d: { id: string; mib: number }) => ({
    "@odata.id": `${base}/${d.id}`,
    "@odata.type": "#Memory.v1_17_0.Memory",
    Id: d.id,
    Name: "DIMM",
    MemoryType: "DRAM",
    MemoryDeviceType: "DDR4",
    CapacityMiB: d.mib,
    Status: health,
  });

  /** SimpleStorage: the controller's devices, by name and size (what inspection tools read when there is no Storage). */
  function simpleStorageResource(m: MachineState, base: string): unknown {
    return {
      "@odata.id": `${base}/${storageId(m)}`,
      "@odata.type": "#SimpleStorage.v1_3_1.SimpleStorage",
      Id: storageId(m),
      Name: m.qemu ? "NVMe Controller" : "Simulated RAID controller",
      Status: health,
      Devices: m.storage.drives.map((d) => ({ Name: d.serialNumber ?? d.name, CapacityBytes: d.capacityBytes, Status: health })),
    };
  }

  const logServiceResource = (m: MachineState, log: string) => ({
    "@odata.id": log,
    "@odata.type": "#LogService.v1_4_0.LogService",
    Id: "Log",
    Name: "BMC event log",
    ServiceEnabled: true,
    OverWritePolicy: "WrapsWhenFull",
    MaxNumberOfRecords: 1000,
    DateTime: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
    Status: health,
    Entries: { "@odata.id": `${log}/Entries` },
    Actions: { "#LogService.ClearLog": { target: `${log}/Actions/LogService.ClearLog` } },
  });

  const logEntryResource = (base: string, e: BmcLogEntry) => ({
    "@odata.id": `${base}/${e.id}`,
    "@odata.type": "#LogEntry.v1_15_0.LogEntry",
    Id: e.id,
    Name: "Log Entry",
    EntryType: "Event",
    Severity: "OK",
    Created: e.created,
    Message: e.message,
  });

  function serviceRoot(): unknown {
    return {
      "@odata.id": "/redfish/v1",
      "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
      Id: "RootService",
      Name: "Redfish emulator",
      RedfishVersion: "1.15.0",
      UUID: "00000000-0000-4000-8000-000000000000",
      Vendor: "Better Compute",
      Product: "Redfish emulator",
      Systems: { "@odata.id": "/redfish/v1/Systems" },
      Managers: { "@odata.id": "/redfish/v1/Managers" },
      Chassis: { "@odata.id": "/redfish/v1/Chassis" },
      SessionService: { "@odata.id": "/redfish/v1/SessionService" },
      AccountService: { "@odata.id": "/redfish/v1/AccountService" },
      Links: { Sessions: { "@odata.id": SESSIONS } },
    };
  }

  /** Downloaded ISOs of QEMU-backed machines (removed at eject and at stop), in a directory made at the first. */
  const downloads = new Map<MachineState, string>();
  let mediaDir: string | undefined;

  /** An image a QEMU-backed machine may take from this host's files (mediaFromFiles): its path, else undefined. */
  function localImage(m: MachineState, image: string): string | undefined {
    if (!m.qemu || !opts.mediaFromFiles) return undefined;
    if (path.isAbsolute(image)) return image;
    try {
      return new URL(image).protocol === "file:" ? fileURLToPath(image) : undefined;
    } catch {
      return undefined;
    }
  }

  /** Fetches an http(s) image to a file, as a BMC does before it presents it: the whole of it, then the CD. */
  async function download(m: MachineState, url: string): Promise<string> {
    mediaDir ??= mkdtempSync(path.join(tmpdir(), "bc-redfish-media-"));
    const file = path.join(mediaDir, `${m.id.replace(/[^\w.-]/g, "_")}-${randomBytes(4).toString("hex")}.iso`);
    try {
      await new Promise<void>((resolve, reject) => {
        const answer = (res: IncomingMessage) => {
          if (res.statusCode !== 200) {
            res.resume();
            reject(new Error(`it answered ${res.statusCode}`));
            return;
          }
          pipeline(res, createWriteStream(file)).then(resolve, reject);
        };
        // As BMCs do unless told to (VerifyCertificate false): the image server's certificate is not checked.
        const routed = opts.mediaRoute?.(url) ?? url;
        const req = routed.startsWith("https:") ? httpsGet(routed, { rejectUnauthorized: false }, answer) : httpGet(routed, answer);
        req.on("error", reject);
      });
    } catch (e) {
      rmSync(file, { force: true });
      throw new HttpError(400, "CouldNotEstablishConnection", `The service failed to get the image at ${url}: ${(e as Error).message}.`, [
        url,
      ]);
    }
    return file;
  }

  /** /Managers/<id>/VirtualMedia[...] or /Systems/<id>/VirtualMedia[...], where the machine serves it; `rest` follows "VirtualMedia". */
  async function mediaRoute(
    req: IncomingMessage,
    method: string,
    path: string,
    m: MachineState,
    where: "Manager" | "System",
    rest: string[],
  ): Promise<[number, unknown]> {
    if (!mediaUnder(m, where)) throw notFound(path);
    const [cd, actions, action, ...more] = rest;
    if (cd === undefined || (cd === "Cd" && actions === undefined)) {
      if (method !== "GET") throw noMethod(method);
      if (cd === "Cd") return [200, cdResource(m, where)];
      const members = [`${mediaPath(m, where)}/Cd`];
      return [200, collection(mediaPath(m, where), "VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Services", members)];
    }
    if (cd !== "Cd" || actions !== "Actions" || more.length > 0) throw notFound(path);
    if (action !== "VirtualMedia.InsertMedia" && action !== "VirtualMedia.EjectMedia") throw notFound(path);
    if (method !== "POST") throw noMethod(method);
    const body = await jsonBody(req);
    if (action === "VirtualMedia.EjectMedia") {
      if (m.qemu) await m.qemu.ejectMedia();
      const file = downloads.get(m);
      if (file) rmSync(file, { force: true });
      downloads.delete(m);
      if (m.media.inserted) logEntry(m, "VirtualMedia.EjectMedia");
      m.media = { inserted: false, image: null };
      return [204, undefined];
    }
    const image = body.Image;
    if (typeof image !== "string" || image === "")
      throw new HttpError(
        400,
        "ActionParameterMissing",
        "The action VirtualMedia.InsertMedia requires the parameter Image to be present in the request body.",
        ["VirtualMedia.InsertMedia", "Image"],
      );
    let ok = false;
    try {
      const u = new URL(image);
      ok = u.protocol === "http:" || u.protocol === "https:";
    } catch {
      ok = false;
    }
    const local = localImage(m, image);
    if (!ok && !local)
      throw new HttpError(
        400,
        "ActionParameterValueFormatError",
        "The value for the parameter Image in the action VirtualMedia.InsertMedia must be an http(s) URL.",
        ["Image", "VirtualMedia.InsertMedia"],
      );
    if (body.Inserted === false)
      throw new HttpError(400, "ActionParameterNotSupported", "Inserted=false is not supported by this emulator.", [
        "Inserted",
        "VirtualMedia.InsertMedia",
      ]);
    if (m.media.inserted) throw new HttpError(409, "ResourceInUse", "Virtual media is already inserted; eject it first.");
    if (m.qemu) {
      const file = local ?? (await download(m, image));
      try {
        await m.qemu.insertMedia(file);
      } catch (e) {
        if (!local) rmSync(file, { force: true });
        throw e;
      }
      if (!local) downloads.set(m, file);
    }
    m.media = { inserted: true, image };
    logEntry(m, `VirtualMedia.InsertMedia ${image}`);
    return [204, undefined];
  }

  function send(res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}): void {
    const headers: Record<string, string> = { "OData-Version": "4.0", ...extra };
    if (body === undefined) {
      res.writeHead(status, headers);
      res.end();
      return;
    }
    const text = JSON.stringify(body);
    res.writeHead(status, {
      ...headers,
      "Content-Type": "application/json; charset=utf-8",
      "Content-Length": String(Buffer.byteLength(text)),
    });
    res.end(text);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const method = req.method ?? "GET";
    const rawPath = (req.url ?? "/").split("?")[0] ?? "/";
    const path = rawPath.length > 1 ? rawPath.replace(/\/+$/, "") : rawPath;
    const record: RedfishRequestRecord = { method, path, status: 0 };
    requests.push(record);

    // Faults first: a flaky BMC misbehaves regardless of who is asking. Two draws per
    // request, always, so the sequence depends only on the seed and the request count.
    const dropDraw = random();
    const errorDraw = random();
    if (faults.delayMs && faults.delayMs > 0) await new Promise((r) => setTimeout(r, faults.delayMs));
    if (faults.dropRate && dropDraw < faults.dropRate) {
      record.status = 0;
      req.socket.destroy();
      return;
    }
    const reply = (status: number, body: unknown, extra?: Record<string, string>) => {
      record.status = status;
      send(res, status, body, extra);
    };
    if (faults.errorRate && errorDraw < faults.errorRate) {
      reply(
        503,
        errorBody(new HttpError(503, "ServiceTemporarilyUnavailable", "The service is temporarily unavailable. Retry later.", ["1"])),
        { "Retry-After": "1" },
      );
      return;
    }

    try {
      const isRoot = path === "/redfish/v1" || path === "/redfish";
      // Logging in is the one request that carries no credential of its own (the spec's session login).
      const login = method === "POST" && path === SESSIONS;
      if (!isRoot && !login && !authorized(req)) {
        // Never echo what the client sent: no username, no password.
        reply(401, errorBody(new HttpError(401, "InsufficientPrivilege", "Authentication failed: invalid or missing credentials.")), {
          "WWW-Authenticate": 'Basic realm="Redfish emulator"',
        });
        return;
      }
      if (path === "/redfish") {
        if (method !== "GET") throw noMethod(method);
        reply(200, { v1: "/redfish/v1/" });
        return;
      }
      const [status, body, headers] = login ? await createSession(req) : await route(req, method, path);
      reply(status, body, headers);
    } catch (e) {
      const he = e instanceof HttpError ? e : new HttpError(500, "InternalError", "The request failed due to an internal service error.");
      reply(he.status, errorBody(he));
    }
  }

  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 500, errorBody(new HttpError(500, "InternalError", "Internal error.")));
      else res.destroy();
    });
  };
  const server = opts.tls ? createHttpsServer({ key: opts.tls.key, cert: opts.tls.cert }, onRequest) : createServer(onRequest);
  const host = opts.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  // Each real machine's serial console on its own port: what it prints goes to every connection, what one types to the machine.
  const consoles: NetServer[] = [];
  const consoleSockets = new Set<Socket>();
  for (const m of machines.values()) {
    const q = m.qemu;
    if (!q) continue;
    const serialServer = createNetServer((socket) => {
      consoleSockets.add(socket);
      const unsubscribe = q.console.subscribe((bytes) => socket.write(bytes));
      socket.on("data", (bytes) => q.writeConsole(bytes));
      socket.on("error", () => {});
      socket.on("close", () => (unsubscribe(), consoleSockets.delete(socket)));
    });
    await new Promise<void>((resolve) => serialServer.listen(0, host, resolve));
    m.consolePort = (serialServer.address() as AddressInfo).port;
    consoles.push(serialServer);
  }
  // Listening on every address: name the loopback one.
  const shown = host === "0.0.0.0" ? "127.0.0.1" : host === "::" ? "[::1]" : isIP(host) === 6 ? `[${host}]` : host;

  return {
    url: `${opts.tls ? "https" : "http"}://${shown}:${port}`,
    machines,
    requests,
    setFaults(f: RedfishFaults) {
      faults = { ...f };
      random = seededRandom(f.seed ?? 1);
    },
    stop() {
      stopped = true;
      for (const t of timers) clearTimeout(t);
      if (mediaDir) rmSync(mediaDir, { recursive: true, force: true });
      for (const c of consoles) c.close();
      for (const socket of consoleSockets) socket.destroy();
      return new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      });
    },
  };
}
