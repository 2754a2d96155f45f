// A Redfish BMC emulator for tests: SIMULATED HARDWARE, nothing here talks to a real
// machine or BMC. In the spirit of sushy-tools' emulator, it serves the Redfish resource
// tree of N simulated machines over real HTTP, or HTTPS with a given certificate (node:http(s),
// 127.0.0.1 unless told otherwise, Basic auth); `better-compute bmc-emulator` runs it
// (scripts/bmc-emulator.ts):
//
//   /redfish/v1                                   ServiceRoot (unauthenticated, as in the spec)
//   /redfish/v1/Systems[/<id>]                    ComputerSystem: PowerState, Boot override, BiosVersion
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
//   /redfish/v1/Managers/<id>/VirtualMedia[/Cd]   InsertMedia { Image } / EjectMedia actions
//
// Tests read and change each simulated machine through `machines` (plain state objects),
// get told of power transitions via `onPowerChange` (so a simulation can "boot" the
// machine), and can make the BMC flaky with seeded, deterministic faults. `quirks` make a
// machine's BMC behave like real ones do (asynchronous resets, no BIOS resource, no volume
// creation, Continuous-only boot overrides, a failing Storage, CapacityBytes required).
// Product UUIDs are random per emulator (two emulators never share one) unless given.
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { isIP, type AddressInfo } from "node:net";
import { RAID_LEVELS as RAID_TYPES, raidCapacityBytes, raidDriveCountProblem, type RaidLevel as RaidType } from "../agent/roles/redfish.ts";
import { seededRandom } from "./seeded-random.ts";

export type PowerState = "On" | "Off";
export const BOOT_TARGETS = ["None", "Pxe", "Cd", "Hdd"] as const;
export type BootTarget = (typeof BOOT_TARGETS)[number];
export const BOOT_ENABLED = ["Disabled", "Once", "Continuous"] as const;
export type BootEnabled = (typeof BOOT_ENABLED)[number];
export const RESET_TYPES = ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"] as const;
export type ResetType = (typeof RESET_TYPES)[number];
// The RAID levels and their drive-count rules are Redfish's, shared with the site agent's client.
export { RAID_TYPES, raidDriveCountProblem, type RaidType };
export type BiosValue = string | number | boolean;

/** The Id of the one simulated NIC of every machine that has addresses. */
export const NIC_ID = "NIC.1";

/** The Id of the one simulated RAID controller of every machine that has drives. */
export const RAID_CONTROLLER_ID = "RAID.Integrated.1";
const DRIVE_CAPACITY_BYTES = 480_103_981_056;

export interface SimDrive {
  id: string;
  name: string;
  capacityBytes: number;
  mediaType: "SSD" | "HDD";
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
  /** IP addresses of its one NIC (IPv4 and/or IPv6); default none: no EthernetInterfaces at all. */
  addresses?: string[];
  /** Its BMC's quirks, over the emulator's. */
  quirks?: BmcQuirks;
}

/** The state of one simulated machine and its simulated BMC. Tests may read and mutate it. */
export interface MachineState {
  id: string;
  uuid: string;
  managerId: string;
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
  /** Power transitions so far, e.g. ["On", "Off", "On"]. */
  powerHistory: PowerState[];
  /** The IP addresses its NIC reports; none: the system links no EthernetInterfaces. */
  addresses: string[];
  /** How its BMC departs from the happy path; change at will. */
  quirks: BmcQuirks;
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
  /** Called after each power transition; awaited before the action is answered. */
  onPowerChange?: (machine: MachineState, from: PowerState, to: PowerState) => void | Promise<void>;
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
function fakeMac(id: string): string {
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
    const m: MachineState = {
      id,
      // Random: a ramdisk is matched to its machine by this UUID, so two emulators must never share one.
      uuid: s.uuid ?? randomUUID(),
      managerId: `${id}-bmc`,
      power: s.power ?? "Off",
      transition: null,
      boot: { target: "None", enabled: "Disabled" },
      media: { inserted: false, image: null },
      biosVersion: "SIM-BIOS-1.0.0",
      bmcFirmwareVersion: "SIM-BMC-2.0.0",
      biosSettings: { BootMode: "Uefi", SriovGlobalEnable: false, ProcTurboMode: "Enabled" },
      biosPending: {},
      storage: {
        drives: Array.from({ length: driveCount }, (_, d) => ({
          id: `Disk.Bay.${d}`,
          name: `Simulated SSD ${d}`,
          capacityBytes: DRIVE_CAPACITY_BYTES,
          mediaType: "SSD" as const,
        })),
        volumes: [],
      },
      powerHistory: [],
      addresses: [...(s.addresses ?? [])],
      quirks: { ...opts.quirks, ...s.quirks },
    };
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
    // The BIOS applies staged settings while it starts, before anything boots.
    if (to === "On" && Object.keys(m.biosPending).length > 0) {
      m.biosSettings = { ...m.biosSettings, ...m.biosPending };
      m.biosPending = {};
    }
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

  function systemResource(m: MachineState): unknown {
    return {
      "@odata.id": sys(m),
      "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
      Id: m.id,
      Name: `Simulated system ${m.id}`,
      Manufacturer: "Better Compute (simulated)",
      Model: "Redfish emulator",
      UUID: m.uuid,
      PowerState: m.transition ?? m.power,
      BiosVersion: m.biosVersion,
      Status: { State: "Enabled", Health: "OK" },
      Boot: {
        BootSourceOverrideTarget: m.boot.target,
        BootSourceOverrideEnabled: m.boot.enabled,
        BootSourceOverrideMode: "UEFI",
        "BootSourceOverrideTarget@Redfish.AllowableValues": [...BOOT_TARGETS],
        "BootSourceOverrideEnabled@Redfish.AllowableValues": m.quirks.continuousBootOnly ? ["Disabled", "Continuous"] : [...BOOT_ENABLED],
      },
      ...(m.quirks.noBios ? {} : { Bios: { "@odata.id": `${sys(m)}/Bios` } }),
      ...(m.storage.drives.length > 0 ? { Storage: { "@odata.id": `${sys(m)}/Storage` } } : {}),
      ...(m.addresses.length > 0 ? { EthernetInterfaces: { "@odata.id": `${sys(m)}/EthernetInterfaces` } } : {}),
      Actions: {
        "#ComputerSystem.Reset": {
          target: `${sys(m)}/Actions/ComputerSystem.Reset`,
          "ResetType@Redfish.AllowableValues": [...RESET_TYPES],
        },
      },
      Links: { ManagedBy: [{ "@odata.id": mgr(m) }] },
    };
  }

  function managerResource(m: MachineState): unknown {
    return {
      "@odata.id": mgr(m),
      "@odata.type": "#Manager.v1_10_0.Manager",
      Id: m.managerId,
      Name: `Simulated BMC of ${m.id}`,
      ManagerType: "BMC",
      FirmwareVersion: m.bmcFirmwareVersion,
      PowerState: "On",
      Status: { State: "Enabled", Health: "OK" },
      VirtualMedia: { "@odata.id": `${mgr(m)}/VirtualMedia` },
      Links: { ManagerForServers: [{ "@odata.id": sys(m) }] },
    };
  }

  function cdResource(m: MachineState): unknown {
    const base = `${mgr(m)}/VirtualMedia/Cd`;
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

  function authorized(req: IncomingMessage): boolean {
    const h = req.headers.authorization ?? "";
    const m = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(h);
    if (!m?.[1]) return false;
    const decoded = Buffer.from(m[1], "base64").toString("utf8");
    const i = decoded.indexOf(":");
    if (i < 0) return false;
    // Evaluate both comparisons so timing does not reveal which one failed.
    const u = sameSecret(decoded.slice(0, i), username);
    const p = sameSecret(decoded.slice(i + 1), password);
    return u && p;
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
        m.boot = { target, enabled };
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
        if (!RESET_TYPES.includes(t as ResetType)) {
          throw new HttpError(
            400,
            "ActionParameterValueNotInList",
            `The value ${JSON.stringify(t)} for the parameter ResetType in the action ComputerSystem.Reset is not in the list of acceptable values.`,
            [String(t), "ResetType", "ComputerSystem.Reset"],
          );
        }
        const delay = m.quirks.resetDelayMs ?? 0;
        if (delay > 0) resetLater(m, t as ResetType, delay);
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
      if (sub !== "VirtualMedia") throw notFound(path);
      if (action === undefined) {
        get();
        return [
          200,
          collection(`${mgr(m)}/VirtualMedia`, "VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Services", [
            `${mgr(m)}/VirtualMedia/Cd`,
          ]),
        ];
      }
      if (action !== "Cd") throw notFound(path);
      if (name === undefined) {
        get();
        return [200, cdResource(m)];
      }
      throw notFound(path); // the Cd actions are handled by mediaAction()
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

  const storagePath = (m: MachineState) => `${sys(m)}/Storage/${RAID_CONTROLLER_ID}`;
  const drivePath = (m: MachineState, d: SimDrive) => `${storagePath(m)}/Drives/${encodeURIComponent(d.id)}`;
  const volumePath = (m: MachineState, v: SimVolume) => `${storagePath(m)}/Volumes/${encodeURIComponent(v.id)}`;
  const health = { State: "Enabled", Health: "OK" };

  function storageResource(m: MachineState): unknown {
    const base = storagePath(m);
    return {
      "@odata.id": base,
      "@odata.type": "#Storage.v1_13_0.Storage",
      Id: RAID_CONTROLLER_ID,
      Name: "Simulated RAID controller",
      Status: health,
      StorageControllers: [
        {
          "@odata.id": `${base}#/StorageControllers/0`,
          MemberId: "0",
          Name: "Simulated RAID controller",
          Status: health,
          SupportedRAIDTypes: [...RAID_TYPES],
        },
      ],
      "Drives@odata.count": m.storage.drives.length,
      Drives: m.storage.drives.map((d) => ({ "@odata.id": drivePath(m, d) })),
      Volumes: { "@odata.id": `${base}/Volumes` },
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
      Protocol: "SATA",
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
    if (ctrl !== RAID_CONTROLLER_ID) throw notFound(path);
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
    if (coll !== "Volumes") throw notFound(path);
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

  const nicPath = (m: MachineState) => `${sys(m)}/EthernetInterfaces/${NIC_ID}`;

  /** The NIC as real BMCs (and sushy-tools) serve it: IPv4 with a mask, IPv6 with a prefix length. */
  function nicResource(m: MachineState): unknown {
    const mac = fakeMac(m.id);
    return {
      "@odata.id": nicPath(m),
      "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface",
      Id: NIC_ID,
      Name: "Simulated NIC",
      Status: health,
      LinkStatus: "LinkUp",
      MACAddress: mac,
      PermanentMACAddress: mac,
      IPv4Addresses: m.addresses
        .filter((a) => isIP(a) === 4)
        .map((a) => ({ Address: a, SubnetMask: "255.255.255.0", AddressOrigin: "DHCP" })),
      IPv6Addresses: m.addresses.filter((a) => isIP(a) === 6).map((a) => ({ Address: a, PrefixLength: 64, AddressOrigin: "SLAAC" })),
    };
  }

  /** /Systems/<id>/EthernetInterfaces[...]; `rest` is what follows it. A machine without addresses has no NIC. */
  function ethernetRoute(method: string, path: string, m: MachineState, rest: string[]): [number, unknown] {
    if (m.addresses.length === 0 || rest.length > 1) throw notFound(path);
    const [nic] = rest;
    if (nic !== undefined && nic !== NIC_ID) throw notFound(path);
    if (method !== "GET") throw noMethod(method);
    if (nic === undefined)
      return [
        200,
        collection(
          `${sys(m)}/EthernetInterfaces`,
          "EthernetInterfaceCollection.EthernetInterfaceCollection",
          "Ethernet Interface Collection",
          [nicPath(m)],
        ),
      ];
    return [200, nicResource(m)];
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

  function serviceRoot(): unknown {
    return {
      "@odata.id": "/redfish/v1",
      "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
      Id: "RootService",
      Name: "Redfish emulator (simulated hardware)",
      RedfishVersion: "1.15.0",
      UUID: "00000000-0000-4000-8000-000000000000",
      Systems: { "@odata.id": "/redfish/v1/Systems" },
      Managers: { "@odata.id": "/redfish/v1/Managers" },
    };
  }

  /** VirtualMedia actions live one level deeper than route()'s destructuring covers. */
  async function mediaAction(req: IncomingMessage, method: string, parts: string[]): Promise<[number, unknown, Record<string, string>?]> {
    // ["redfish","v1","Managers",mgrId,"VirtualMedia","Cd","Actions",action]
    const m = byManager.get(parts[3] ?? "");
    const action = parts[7];
    if (!m) throw notFound(`/${parts.join("/")}`);
    if (action !== "VirtualMedia.InsertMedia" && action !== "VirtualMedia.EjectMedia") throw notFound(`/${parts.join("/")}`);
    if (method !== "POST") throw noMethod(method);
    const body = await jsonBody(req);
    if (action === "VirtualMedia.EjectMedia") {
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
    if (!ok)
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
    m.media = { inserted: true, image };
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
      if (!isRoot && !authorized(req)) {
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
      const parts = splitPath(path);
      const [status, body, headers] =
        parts.length === 8 && parts[2] === "Managers" && parts[4] === "VirtualMedia" && parts[5] === "Cd" && parts[6] === "Actions"
          ? await mediaAction(req, method, parts)
          : await route(req, method, path);
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
      return new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      });
    },
  };
}
