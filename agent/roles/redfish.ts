// A Redfish client for the site agent: reads and drives one machine through its BMC over
// real HTTP with Basic auth. A BMC is named by its system URL
// (https://host/redfish/v1/Systems/<id>, checked by better-compute/metal/bmc-address, the same
// rules the control plane applied at enroll); every failure is an AgentError that names the BMC
// by that address and never carries the username or password.
//
// BMCs as they are, not only our emulator: a reset is applied asynchronously (power operations
// wait until the BMC reports the target state), a boot override may be recorded otherwise than
// asked (it is read back), a capability the resource tree does not offer (BIOS settings, volume
// creation, virtual media) is UNSUPPORTED naming it, and an optional resource that fails (Storage,
// EthernetInterfaces, VirtualMedia) does not fail an inspection.
//
// Requests go through https-transport.ts: an https BMC is trusted as the binding's tls block says
// (a CA bundle, a pinned public key) or else by the system's CAs, and its certificate is checked
// before a byte of the request (the Authorization header) is written. No retries here: the
// workflow engine retries steps and shows each attempt; operations are idempotent by desired
// state, so a retried step does no harm. A failure another attempt cannot mend (an untrusted
// certificate) is marked permanent and is not retried.
import { z } from "zod";
import { bmcAddressMessage, bmcTlsProblem, parseBmcAddress, type BmcTls } from "better-compute/metal/bmc-address";
import { base64, utf8 } from "../../core/encoding.ts";
import { AgentError, type FetchLike } from "../contracts.ts";
import { CertificateRefused, httpTransport, type HttpAnswer, type HttpTransport } from "./https-transport.ts";

/** A BMC and its credential; the password is the resolved value, not a secret:// reference. */
export interface BmcCredential {
  address: string;
  username: string;
  password: string;
  /** How to trust an https BMC's certificate (the binding's tls block); none: the system's CAs. */
  tls?: BmcTls;
}

export interface RedfishClientOptions {
  /** TEST SEAM: every request goes through this instead (a tls block is then not applied). */
  fetch?: FetchLike;
  /** Per request (ms). Default 10 000. */
  timeoutMs?: number;
  /** The command's signal: its abort ends the request in flight with the signal's reason. */
  signal?: AbortSignal;
  /** How long a power operation waits for the BMC to report the state it asked for (ms, default 60 000), and how often it looks (default 1 000). */
  powerWait?: { timeoutMs?: number; intervalMs?: number };
}

export type PowerAction = "on" | "off" | "cycle";
export type BootDevice = "pxe" | "cd" | "disk";
export type BiosValue = string | number | boolean;
export const RAID_LEVELS = ["RAID0", "RAID1", "RAID5", "RAID10"] as const;
export type RaidLevel = (typeof RAID_LEVELS)[number];

/** Why `count` drives cannot make a `level` volume, or undefined when they can. */
export function raidDriveCountProblem(level: RaidLevel, count: number): string | undefined {
  switch (level) {
    case "RAID0":
      return count >= 1 ? undefined : `RAID0 takes at least 1 drive, not ${count}`;
    case "RAID1":
      return count === 2 ? undefined : `RAID1 takes exactly 2 drives, not ${count}`;
    case "RAID5":
      return count >= 3 ? undefined : `RAID5 takes at least 3 drives, not ${count}`;
    case "RAID10":
      return count >= 4 && count % 2 === 0 ? undefined : `RAID10 takes an even number of drives, at least 4, not ${count}`;
  }
}

/** The usable bytes of a `level` volume over drives of these capacities (each drive counts as the smallest). */
export function raidCapacityBytes(level: RaidLevel, capacities: number[]): number {
  const smallest = Math.min(...capacities);
  const n = capacities.length;
  return smallest * (level === "RAID0" ? n : level === "RAID1" ? 1 : level === "RAID5" ? n - 1 : n / 2);
}

export interface BiosResult {
  /** Attributes the BMC holds for the next power-on that differ from the ones in effect. */
  pending: Record<string, BiosValue>;
  /** True when every wanted attribute is already in effect (nothing was sent). */
  applied: boolean;
}

export interface RaidResult {
  volume: { id: string; level: RaidLevel; drives: number };
}

export interface BootResult {
  /** What the BMC records after the change (read back). */
  target: string | null;
  enabled: string | null;
  /** Set when the BMC keeps the override for every boot although it was asked for the next one only. */
  warning?: string;
}

/** A resource inspect() could not read, and why; the rest of the inspection stands. */
export interface Unavailable {
  resource: "Storage" | "EthernetInterfaces" | "VirtualMedia";
  error: string;
}

/** Values as the BMC reports them (PowerState "On", boot target "Pxe"...); absent when it does not say. */
export interface BmcInspection {
  systemId: string;
  uuid?: string;
  manufacturer?: string;
  model?: string;
  serialNumber?: string;
  powerState?: string;
  biosVersion?: string;
  bmcFirmwareVersion?: string;
  bootTarget?: string;
  bootEnabled?: string;
  /** The system's ProcessorSummary: its CPUs (sockets), their model, and the logical processors (threads) they have; absent when it does not say. */
  processors?: { count: number; model: string | null; threads: number | null };
  /** The system's MemorySummary (TotalSystemMemoryGiB); absent when it does not say. */
  memoryGiB?: number;
  /** The virtual CD; absent when VirtualMedia could not be read (see unavailable). */
  media?: { inserted: boolean; image: string | null };
  /** Present when the system links Storage (and it could be read): its drives (count) and volumes. */
  storage?: { drives: number; volumes: Array<{ id: string; level: string | null }> };
  /**
   * The IP addresses its NICs report (EthernetInterfaces): IPv4, then IPv6, deduplicated, without
   * link-local or unspecified ones; [] when the system links no EthernetInterfaces (or they could not be read).
   */
  addresses: string[];
  /** The MACs of its NICs (EthernetInterfaces), lower case with colons: what network boot knows the machine by. */
  macs: string[];
  /** Optional resources that answered with an error; absent when everything was read. */
  unavailable?: Unavailable[];
}

const DEFAULT_TIMEOUT_MS = 10_000;
const DEFAULT_POWER_TIMEOUT_MS = 60_000;
const DEFAULT_POWER_INTERVAL_MS = 1_000;
const POWER_ACTIONS: readonly PowerAction[] = ["on", "off", "cycle"];
const BOOT_TARGETS: Record<BootDevice, string> = { pxe: "Pxe", cd: "Cd", disk: "Hdd" };

// Only the fields used; BMCs omit or null many of them.
const text = z.string().nullish();
const link = z.object({ "@odata.id": z.string() });
const action = z.object({ target: z.string() }).nullish();
const systemResource = z.object({
  Id: text,
  UUID: text,
  Manufacturer: text,
  Model: text,
  SerialNumber: text,
  PowerState: text,
  BiosVersion: text,
  ProcessorSummary: z.object({ Count: z.number().nullish(), Model: text, LogicalProcessorCount: z.number().nullish() }).nullish(),
  MemorySummary: z.object({ TotalSystemMemoryGiB: z.number().nullish() }).nullish(),
  Boot: z.object({ BootSourceOverrideTarget: text, BootSourceOverrideEnabled: text }).nullish(),
  Actions: z.object({ "#ComputerSystem.Reset": action }).nullish(),
  Links: z.object({ ManagedBy: z.array(link).nullish() }).nullish(),
  Bios: link.nullish(),
  Storage: link.nullish(),
  EthernetInterfaces: link.nullish(),
  VirtualMedia: link.nullish(),
});
const attributes = z.record(z.string(), z.unknown()).nullish();
const biosResource = z.object({ Attributes: attributes, "@Redfish.Settings": z.object({ SettingsObject: link.nullish() }).nullish() });
const biosSettingsResource = z.object({ Attributes: attributes });
const storageResource = z.object({ Drives: z.array(link).nullish(), Volumes: link.nullish() });
const driveResource = z.object({ CapacityBytes: z.number().nullish() });
const volumeResource = z.object({
  Id: text,
  RAIDType: text,
  VolumeType: text,
  Links: z.object({ Drives: z.array(link).nullish() }).nullish(),
});
/** Older BMCs state VolumeType only. */
const VOLUME_TYPE_LEVELS: Record<string, RaidLevel> = {
  NonRedundant: "RAID0",
  Mirrored: "RAID1",
  StripedWithParity: "RAID5",
  SpannedMirrors: "RAID10",
};
const ipAddresses = z.array(z.object({ Address: text }).nullable()).nullish();
const ethernetInterfaceResource = z.object({ IPv4Addresses: ipAddresses, IPv6Addresses: ipAddresses, MACAddress: text });
/** A MAC as BMCs write it (colons or dashes, any case); the site's DHCP knows machines by these. */
const MAC = /^[0-9a-f]{2}([:-][0-9a-f]{2}){5}$/i;
// Shapes only, so a BMC's placeholder ("N/A", "") is not taken for an address.
const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const IPV6 = /^[0-9a-f:.]*:[0-9a-f:.]*$/;
/** Addresses no one can reach the machine at from elsewhere: link-local (fe80::/10) and unspecified. */
const unusable = (ip: string) => ip === "0.0.0.0" || ip === "::" || /^fe[89ab][0-9a-f]:/.test(ip);
const consoleService = z.object({ ServiceEnabled: z.boolean().nullish(), Port: z.number().int().min(1).max(65535).nullish() }).nullish();
const managerResource = z.object({
  FirmwareVersion: text,
  VirtualMedia: link.nullish(),
  /** Manager v1.10+: how the system's serial console is offered (SSH, Telnet, IPMI). */
  SerialConsole: z.object({ Telnet: consoleService, SSH: consoleService, IPMI: consoleService }).nullish(),
});
const collectionResource = z.object({ Members: z.array(link) });
const mediaResource = z.object({
  Image: text,
  Inserted: z.boolean().nullish(),
  MediaTypes: z.array(z.string()).nullish(),
  Actions: z.object({ "#VirtualMedia.InsertMedia": action, "#VirtualMedia.EjectMedia": action }).nullish(),
});
type SystemResource = z.infer<typeof systemResource>;
type MediaResource = z.infer<typeof mediaResource>;
type Volume = { path: string; id: string; level: string | null; drives: number };

const invalid = (message: string) => new AgentError("INVALID_ARGUMENT", message);

/** Wait `ms`, or until the signal aborts (rejecting with its reason). */
function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Why a fetch failed: undici rejects with "fetch failed" and the useful reason in `cause`. */
export function fetchFailureReason(e: unknown): string {
  const cause = (e as { cause?: unknown })?.cause;
  if (cause instanceof Error) return cause.message;
  return e instanceof Error ? e.message : String(e);
}

/** The message of a Redfish error body ({error: {message, @Message.ExtendedInfo}}), if any. */
function redfishMessage(body: string): string | undefined {
  try {
    const error = (JSON.parse(body) as { error?: { message?: unknown; "@Message.ExtendedInfo"?: { Message?: unknown }[] } }).error;
    const message = error?.["@Message.ExtendedInfo"]?.[0]?.Message ?? error?.message;
    return typeof message === "string" ? message : undefined;
  } catch {
    return undefined;
  }
}

export class RedfishClient {
  /** The BMC's name in messages: its system URL without credentials. */
  readonly address: string;
  readonly systemId: string;
  readonly #origin: string;
  readonly #systemPath: string;
  readonly #credential: BmcCredential;
  readonly #authorization: string;
  readonly #transport: HttpTransport;
  readonly #timeoutMs: number;
  readonly #signal: AbortSignal | undefined;
  readonly #powerWait: { timeoutMs: number; intervalMs: number };

  constructor(bmc: BmcCredential, options: RedfishClientOptions = {}) {
    const parsed = parseBmcAddress(bmc.address);
    if (!parsed.ok) throw invalid(bmcAddressMessage(parsed.problem));
    const tlsProblem = bmcTlsProblem(bmc.address, bmc.tls);
    if (tlsProblem) throw invalid(`BMC ${parsed.address.origin}${parsed.address.systemPath}: ${tlsProblem}`);
    const { origin, systemPath, systemId } = parsed.address;
    this.#origin = origin;
    this.#systemPath = systemPath;
    this.systemId = systemId;
    this.address = origin + systemPath;
    this.#credential = bmc;
    this.#authorization = `Basic ${base64(utf8(`${bmc.username}:${bmc.password}`))}`;
    this.#transport = httpTransport({ tls: bmc.tls, fetch: options.fetch });
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#signal = options.signal;
    this.#powerWait = {
      timeoutMs: options.powerWait?.timeoutMs ?? DEFAULT_POWER_TIMEOUT_MS,
      intervalMs: options.powerWait?.intervalMs ?? DEFAULT_POWER_INTERVAL_MS,
    };
  }

  /** Identity and state; an optional resource that fails is listed in `unavailable` instead of failing it all. */
  async inspect(): Promise<BmcInspection> {
    const system = await this.#system();
    const manager = await this.#manager(system);
    const unavailable: Unavailable[] = [];
    const optional = async <T>(resource: Unavailable["resource"], read: () => Promise<T>): Promise<T | undefined> => {
      try {
        return await read();
      } catch (e) {
        // The BMC's failure only: the command's end, a refusal or a bug still ends the inspection.
        if (this.#signal?.aborted || !(e instanceof AgentError) || e.code !== "DRIVER_ERROR" || e.permanent) throw e;
        unavailable.push({ resource, error: e.message });
        return undefined;
      }
    };
    const cd = await optional("VirtualMedia", () => this.#virtualCd(mediaCollection(system, manager)));
    const storage = await optional("Storage", () => this.#storageSummary(system));
    const nics = await optional("EthernetInterfaces", () => this.#nics(system));
    return {
      systemId: system.Id ?? this.systemId,
      uuid: system.UUID ?? undefined,
      manufacturer: system.Manufacturer ?? undefined,
      model: system.Model ?? undefined,
      serialNumber: system.SerialNumber ?? undefined,
      powerState: system.PowerState ?? undefined,
      biosVersion: system.BiosVersion ?? undefined,
      bmcFirmwareVersion: manager.FirmwareVersion ?? undefined,
      bootTarget: system.Boot?.BootSourceOverrideTarget ?? undefined,
      bootEnabled: system.Boot?.BootSourceOverrideEnabled ?? undefined,
      // From the system resource itself: no request more.
      ...(typeof system.ProcessorSummary?.Count === "number"
        ? {
            processors: {
              count: system.ProcessorSummary.Count,
              model: system.ProcessorSummary.Model ?? null,
              threads: system.ProcessorSummary.LogicalProcessorCount ?? null,
            },
          }
        : {}),
      ...(typeof system.MemorySummary?.TotalSystemMemoryGiB === "number" ? { memoryGiB: system.MemorySummary.TotalSystemMemoryGiB } : {}),
      ...(cd === undefined ? {} : { media: { inserted: cd?.media.Inserted === true, image: cd?.media.Image ?? null } }),
      ...storage,
      addresses: nics?.addresses ?? [],
      macs: nics?.macs ?? [],
      ...(unavailable.length > 0 ? { unavailable } : {}),
    };
  }

  /**
   * Idempotent by desired state: a machine already on is not reset by "on". BMCs apply a reset
   * asynchronously (the old state, or PoweringOn/PoweringOff, for a while), so every reset is
   * followed by waiting until the BMC reports the target state, and a transition already under
   * way is let finish first. A cycle is off, then on, each waited for (as Ironic does): after a
   * ForceRestart nothing tells a restart that happened from one that has not started yet.
   */
  async setPower(action: PowerAction): Promise<{ powerState: string | null; previous: string | null }> {
    if (!POWER_ACTIONS.includes(action)) throw invalid(`unknown power action ${JSON.stringify(action)}`);
    const system = await this.#system();
    const previous = system.PowerState ?? null;
    const resetTarget = system.Actions?.["#ComputerSystem.Reset"]?.target ?? `${this.#systemPath}/Actions/ComputerSystem.Reset`;
    let state = previous;
    if (state === "PoweringOn" || state === "PoweringOff")
      state = await this.#waitForPower(state === "PoweringOn" ? "On" : "Off", `${state} was under way`);
    const reset = async (resetType: string, to: "On" | "Off") => {
      await this.#call("POST", resetTarget, { ResetType: resetType });
      state = await this.#waitForPower(to, `Reset ${resetType}`);
    };
    if (action === "on" && state !== "On") await reset("On", "On");
    if (action === "off" && state !== "Off") await reset("ForceOff", "Off");
    if (action === "cycle") {
      if (state !== "Off") await reset("ForceOff", "Off");
      await reset("On", "On");
    }
    return { powerState: state, previous };
  }

  /**
   * Boot override for the next boot (once) or every boot, read back: many BMCs answer a PATCH with
   * 204, and some record something else than asked. Another target is a DRIVER_ERROR. A BMC that
   * keeps every override Continuous (asked Once) is accepted with a warning in the result: our
   * profiles set the boot device before every boot, but a step that counts on the next boot
   * falling back (an installer that reboots into its disk) would boot the same device again.
   */
  async setBootDevice(device: BootDevice, once = true): Promise<BootResult> {
    const target = Object.hasOwn(BOOT_TARGETS, device) ? BOOT_TARGETS[device] : undefined;
    if (!target) throw invalid(`unknown boot device ${JSON.stringify(device)}`);
    const enabled = once ? "Once" : "Continuous";
    await this.#call("PATCH", this.#systemPath, { Boot: { BootSourceOverrideTarget: target, BootSourceOverrideEnabled: enabled } });
    const boot = (await this.#system()).Boot;
    const got = { target: boot?.BootSourceOverrideTarget ?? null, enabled: boot?.BootSourceOverrideEnabled ?? null };
    if (got.target !== target) throw this.#fail(`recorded the boot override target ${got.target ?? "(none)"} when asked for ${target}`);
    if (got.enabled === enabled) return got;
    if (once && got.enabled === "Continuous") {
      return {
        ...got,
        warning: `BMC ${this.address} recorded the boot override ${target} as Continuous when asked for Once: the machine boots ${target} every time until its boot device is set again`,
      };
    }
    throw this.#fail(`recorded the boot override as ${got.enabled ?? "(none)"} when asked for ${enabled}`);
  }

  /** Insert an image in the virtual CD; the same image already inserted is left alone, another is ejected first. */
  async insertMedia(url: string): Promise<{ image: string; inserted: true }> {
    let protocol: string | undefined;
    try {
      protocol = new URL(url).protocol;
    } catch {
      // refused below
    }
    if (protocol !== "http:" && protocol !== "https:") throw invalid("the media URL must be an http(s) URL");
    const cd = await this.#requireCd();
    if (cd.media.Inserted === true && cd.media.Image === url) return { image: url, inserted: true };
    if (cd.media.Inserted === true) await this.#eject(cd);
    const insert = cd.media.Actions?.["#VirtualMedia.InsertMedia"]?.target ?? `${cd.path}/Actions/VirtualMedia.InsertMedia`;
    await this.#call("POST", insert, { Image: url, Inserted: true, WriteProtected: true });
    return { image: url, inserted: true };
  }

  async ejectMedia(): Promise<{ ejected: boolean }> {
    const cd = await this.#requireCd();
    if (cd.media.Inserted !== true) return { ejected: false };
    await this.#eject(cd);
    return { ejected: true };
  }

  /**
   * Stage BIOS attributes for the next power-on (PATCH of the Bios settings object). Idempotent:
   * when every wanted value is already in effect nothing is sent (applied: true); values already
   * pending are not sent again. The BMC judges names and types: an unknown one is a DRIVER_ERROR.
   * A system without a Bios resource, or whose settings object refuses a PATCH, is UNSUPPORTED.
   */
  async applyBiosSettings(wanted: Record<string, BiosValue>): Promise<BiosResult> {
    if (typeof wanted !== "object" || wanted === null || Array.isArray(wanted)) throw invalid("the BIOS attributes must be an object");
    const entries = Object.entries(wanted);
    if (entries.length === 0) throw invalid("no BIOS attributes given");
    for (const [k, v] of entries) {
      if (!k || !["string", "number", "boolean"].includes(typeof v))
        throw invalid(`the BIOS attribute ${JSON.stringify(k)} must be a string, number or boolean`);
    }
    const system = await this.#system();
    const biosPath = system.Bios?.["@odata.id"];
    if (!biosPath) throw this.#unsupported("has no BIOS settings resource (Bios)");
    const bios = await this.#get(biosPath, biosResource, "Bios");
    const current = bios.Attributes ?? {};
    const has = (attrs: Record<string, unknown>, k: string, v: unknown) => Object.hasOwn(attrs, k) && attrs[k] === v;
    const changes = Object.fromEntries(entries.filter(([k, v]) => !has(current, k, v)));
    if (Object.keys(changes).length === 0) return { pending: {}, applied: true };

    const settingsPath = bios["@Redfish.Settings"]?.SettingsObject?.["@odata.id"] ?? `${biosPath.replace(/\/$/, "")}/Settings`;
    const staged = (await this.#get(settingsPath, biosSettingsResource, "Bios settings")).Attributes ?? {};
    if (!Object.entries(changes).every(([k, v]) => has(staged, k, v))) {
      await this.#call("PATCH", settingsPath, { Attributes: changes }).catch((e: unknown) => {
        throw notOffered(e)
          ? this.#unsupported(`does not take BIOS settings: PATCH ${settingsPath} answered ${(e as AgentError).status}`)
          : e;
      });
    }
    // Re-read: many BMCs answer with 204. Some list only pending values, others all of them.
    const after = (await this.#get(settingsPath, biosSettingsResource, "Bios settings")).Attributes ?? {};
    const pending = Object.fromEntries(
      Object.entries(after).filter(
        (e): e is [string, BiosValue] => ["string", "number", "boolean"].includes(typeof e[1]) && !has(current, e[0], e[1]),
      ),
    );
    return { pending, applied: false };
  }

  /**
   * One RAID volume of `level` over `drives` drives (default: all of the controller's). Idempotent:
   * a volume of that level over that many drives is returned as it is; otherwise every volume of
   * the controller is deleted and the volume created over its first drives. A BMC that does not
   * offer volume creation is UNSUPPORTED, found out before anything is deleted where it says so
   * (the Volumes collection's Allow header).
   */
  async configureRaid(spec: { level: RaidLevel; drives?: number | "all" }): Promise<RaidResult> {
    const level = spec?.level;
    if (!RAID_LEVELS.includes(level)) throw invalid(`unknown RAID level ${JSON.stringify(level)}; one of ${RAID_LEVELS.join(", ")}`);
    const asked = spec?.drives ?? "all";
    if (asked !== "all" && !(Number.isInteger(asked) && asked >= 1))
      throw invalid(`drives must be a positive integer or "all", not ${JSON.stringify(asked)}`);
    if (asked !== "all") {
      const problem = raidDriveCountProblem(level, asked);
      if (problem) throw invalid(problem);
    }
    const system = await this.#system();
    const controllers = await this.#storageControllers(system);
    if (controllers === null) throw this.#unsupported("has no storage resource (Storage); no RAID to configure");
    const controller = controllers.find((c) => c.storage.Volumes && (c.storage.Drives?.length ?? 0) > 0);
    if (!controller) throw this.#unsupported("has no storage controller with drives and volumes; no RAID to configure");
    const drives = controller.storage.Drives ?? [];
    const count = asked === "all" ? drives.length : asked;
    if (count > drives.length)
      throw invalid(`BMC ${this.address} has ${drives.length} drive(s) on ${controller.path}; ${level} over ${count} cannot be made`);
    const problem = raidDriveCountProblem(level, count);
    if (problem) throw invalid(`BMC ${this.address} has ${drives.length} drives on ${controller.path}: ${problem}`);

    const volumesPath = controller.storage.Volumes!["@odata.id"];
    const { volumes: existing, allow } = await this.#volumes(volumesPath);
    const fits = (v: Volume) => v.level === level && v.drives === count;
    const found = existing.find(fits);
    if (found) return { volume: { id: found.id, level, drives: count } };
    const noCreation = (why: string) => this.#unsupported(`does not offer volume creation: ${why}; no ${level} volume can be made`);
    if (
      allow !== undefined &&
      !allow
        .toUpperCase()
        .split(",")
        .map((m) => m.trim())
        .includes("POST")
    ) {
      throw noCreation(`its Volumes collection ${volumesPath} allows ${allow.trim() || "nothing"}, not POST`);
    }

    for (const v of existing) await this.#call("DELETE", v.path);
    // The Volume schema's shape: the drives under Links, and the size (some BMCs require it) when the drives say theirs.
    const members = drives.slice(0, count);
    const capacities = [];
    for (const d of members) capacities.push((await this.#get(d["@odata.id"], driveResource, "Drive")).CapacityBytes);
    const known = capacities.every((c): c is number => typeof c === "number" && c > 0);
    const body = {
      Name: `${level} volume`,
      RAIDType: level,
      Links: { Drives: members },
      ...(known ? { CapacityBytes: raidCapacityBytes(level, capacities) } : {}),
    };
    const answer = await this.#call("POST", volumesPath, body).catch((e: unknown) => {
      throw notOffered(e) ? noCreation(`POST ${volumesPath} answered ${(e as AgentError).status}`) : e;
    });
    const created = volumeResource.safeParse(answer);
    // Trust the answer's Id only when it is a Volume (a 202 may carry a Task instead).
    const id = created.success && (created.data.RAIDType || created.data.VolumeType) ? created.data.Id : undefined;
    if (id) return { volume: { id, level, drives: count } };
    // No body (201/202/204 without one): find it.
    const made = (await this.#volumes(volumesPath)).volumes.find(fits);
    if (!made) throw this.#fail(`accepted the ${level} volume but ${volumesPath} does not list it`);
    return { volume: { id: made.id, level, drives: count } };
  }

  /**
   * Where the system's serial console is: the Manager's SerialConsole Telnet service, on the BMC's
   * host. Telnet is the one a site agent can read with no session of its own; a BMC that offers
   * only SSH or IPMI is UNSUPPORTED here (an IPMI BMC's SOL: the ipmi driver).
   */
  async consoleEndpoint(): Promise<{ host: string; port: number }> {
    const offered = (await this.#manager(await this.#system())).SerialConsole;
    const telnet = offered?.Telnet;
    if (telnet?.ServiceEnabled !== true || !telnet.Port) {
      const others = (["SSH", "IPMI"] as const).filter((k) => offered?.[k]?.ServiceEnabled === true);
      throw new AgentError(
        "UNSUPPORTED",
        `BMC ${this.address} offers no Telnet serial console (SerialConsole.Telnet)${others.length ? `; it offers ${others.join(" and ")}, which the site agent does not read` : ""}`,
        undefined,
        { permanent: true },
      );
    }
    return { host: new URL(this.#origin).hostname.replace(/^\[|\]$/g, ""), port: telnet.Port };
  }

  // ------------------------------------------------------------ resources

  #system(): Promise<SystemResource> {
    return this.#get(this.#systemPath, systemResource, "ComputerSystem");
  }

  /**
   * The PowerState once it is `target`, looking every intervalMs for at most timeoutMs. A BMC busy
   * with the reset may fail a read (5xx, a dropped connection): it is asked again; a refusal is not.
   */
  async #waitForPower(target: "On" | "Off", after: string): Promise<string> {
    const { timeoutMs, intervalMs } = this.#powerWait;
    const until = Date.now() + timeoutMs;
    let last: string | null = null;
    let lastError: AgentError | undefined;
    for (;;) {
      try {
        last = (await this.#system()).PowerState ?? null;
        lastError = undefined;
        if (last === target) return last;
      } catch (e) {
        if (
          this.#signal?.aborted ||
          !(e instanceof AgentError) ||
          e.code !== "DRIVER_ERROR" ||
          e.permanent ||
          (e.status !== undefined && e.status < 500)
        )
          throw e;
        lastError = e;
      }
      if (Date.now() >= until) {
        const stayed = lastError ? `could not be read (${lastError.message})` : `stayed ${last ?? "unreported"}`;
        throw this.#fail(`did not reach PowerState ${target} within ${timeoutMs / 1000} s after ${after}: it ${stayed}`);
      }
      await pause(intervalMs, this.#signal);
    }
  }

  async #manager(system: SystemResource) {
    const ref = system.Links?.ManagedBy?.[0]?.["@odata.id"];
    if (!ref) throw this.#fail(`links no manager to ${this.#systemPath} (Links.ManagedBy)`);
    return this.#get(ref, managerResource, "Manager");
  }

  /** The virtual CD of a VirtualMedia collection (mediaCollection's): a member named Cd/CD1..., else the first that takes CDs. */
  async #virtualCd(collectionPath: string | undefined): Promise<{ path: string; media: MediaResource } | null> {
    if (!collectionPath) return null;
    const members = (await this.#get(collectionPath, collectionResource, "VirtualMedia collection")).Members.map((m) => m["@odata.id"]);
    const namedCd = (path: string) => /\/cd\d*$/i.test(path);
    for (const path of [...members.filter(namedCd), ...members.filter((p) => !namedCd(p))]) {
      const media = await this.#get(path, mediaResource, "VirtualMedia");
      if (namedCd(path) || media.MediaTypes?.some((t) => t === "CD" || t === "DVD")) return { path, media };
    }
    return null;
  }

  /** The system's storage controllers; null when it links no Storage. */
  async #storageControllers(system: SystemResource): Promise<Array<{ path: string; storage: z.infer<typeof storageResource> }> | null> {
    const ref = system.Storage?.["@odata.id"];
    if (!ref) return null;
    const members = (await this.#get(ref, collectionResource, "Storage collection")).Members.map((m) => m["@odata.id"]);
    const out = [];
    for (const path of members) out.push({ path, storage: await this.#get(path, storageResource, "Storage") });
    return out;
  }

  /** A Volumes collection's volumes, and its Allow header (which methods it offers) when it sends one. */
  async #volumes(collectionPath: string): Promise<{ volumes: Volume[]; allow: string | undefined }> {
    const answer = await this.#request("GET", collectionPath);
    const collection = collectionResource.safeParse(answer.json);
    if (!collection.success) throw this.#fail(`answered GET ${collectionPath} with something that is not a Volume collection`);
    const volumes: Volume[] = [];
    for (const { "@odata.id": path } of collection.data.Members) {
      const v = await this.#get(path, volumeResource, "Volume");
      const id = v.Id ?? decodeURIComponent(path.replace(/\/$/, "").split("/").pop() ?? path);
      const level =
        v.RAIDType ?? (v.VolumeType && Object.hasOwn(VOLUME_TYPE_LEVELS, v.VolumeType) ? VOLUME_TYPE_LEVELS[v.VolumeType]! : null);
      volumes.push({ path, id, level, drives: v.Links?.Drives?.length ?? 0 });
    }
    return { volumes, allow: answer.header("allow") };
  }

  /** inspect()'s storage: drives and volumes over every controller; nothing when there is no Storage. */
  async #storageSummary(system: SystemResource): Promise<Pick<BmcInspection, "storage">> {
    const controllers = await this.#storageControllers(system);
    if (controllers === null) return {};
    let drives = 0;
    const volumes: Array<{ id: string; level: string | null }> = [];
    for (const c of controllers) {
      drives += c.storage.Drives?.length ?? 0;
      const ref = c.storage.Volumes?.["@odata.id"];
      if (ref) for (const v of (await this.#volumes(ref)).volumes) volumes.push({ id: v.id, level: v.level });
    }
    return { storage: { drives, volumes } };
  }

  /** inspect()'s addresses: IPv4 then IPv6 over every interface; [] when there are no EthernetInterfaces. */
  async #nics(system: SystemResource): Promise<{ addresses: string[]; macs: string[] }> {
    const ref = system.EthernetInterfaces?.["@odata.id"];
    if (!ref) return { addresses: [], macs: [] };
    const members = (await this.#get(ref, collectionResource, "EthernetInterface collection")).Members.map((m) => m["@odata.id"]);
    const v4 = new Set<string>();
    const v6 = new Set<string>();
    const macs = new Set<string>();
    for (const path of members) {
      const nic = await this.#get(path, ethernetInterfaceResource, "EthernetInterface");
      const mac = nic.MACAddress?.trim();
      if (mac && MAC.test(mac)) macs.add(mac.toLowerCase().replaceAll("-", ":"));
      for (const a of nic.IPv4Addresses ?? []) {
        const ip = a?.Address?.trim();
        if (ip && IPV4.test(ip) && !unusable(ip)) v4.add(ip);
      }
      for (const a of nic.IPv6Addresses ?? []) {
        const ip = a?.Address?.trim().toLowerCase(); // BMCs differ in case; one address, one spelling
        if (ip && IPV6.test(ip) && !unusable(ip)) v6.add(ip);
      }
    }
    return { addresses: [...v4, ...v6], macs: [...macs] };
  }

  async #requireCd(): Promise<{ path: string; media: MediaResource }> {
    const system = await this.#system();
    const cd = await this.#virtualCd(mediaCollection(system, system.VirtualMedia ? undefined : await this.#manager(system)));
    if (!cd) throw this.#unsupported("has no virtual CD (VirtualMedia)");
    return cd;
  }

  async #eject(cd: { path: string; media: MediaResource }): Promise<void> {
    const target = cd.media.Actions?.["#VirtualMedia.EjectMedia"]?.target ?? `${cd.path}/Actions/VirtualMedia.EjectMedia`;
    await this.#call("POST", target, {});
  }

  // ------------------------------------------------------------ HTTP

  async #get<T>(path: string, schema: z.ZodType<T>, what: string): Promise<T> {
    const parsed = schema.safeParse(await this.#call("GET", path));
    if (!parsed.success) throw this.#fail(`answered GET ${path} with something that is not a ${what}`);
    return parsed.data;
  }

  /** One request; the parsed JSON answer (undefined when empty). */
  async #call(method: string, path: string, body?: unknown): Promise<unknown> {
    return (await this.#request(method, path, body)).json;
  }

  /** One request: its parsed JSON answer and headers; a status that is not 2xx is a DRIVER_ERROR carrying it. */
  async #request(method: string, path: string, body?: unknown): Promise<{ json: unknown; header(name: string): string | undefined }> {
    const url = this.#resolve(path);
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = this.#signal ? AbortSignal.any([this.#signal, timeout]) : timeout;
    const headers: Record<string, string> = { authorization: this.#authorization, accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    const request = { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal };
    let res: HttpAnswer;
    try {
      res = await this.#transport(url, request);
    } catch (e) {
      // The command's deadline or the agent stopping: report that, not a BMC failure.
      if (this.#signal?.aborted) throw this.#signal.reason;
      if (e instanceof CertificateRefused) throw this.#certificateRefused(e);
      if (e instanceof AgentError) throw e; // from a fetch given as the test seam: as it is
      throw this.#fail(
        `did not answer ${method} ${path}: ${timeout.aborted ? `no answer within ${this.#timeoutMs} ms` : this.#scrub(fetchFailureReason(e))}`,
      );
    }
    if (res.status < 200 || res.status > 299) {
      const what = `answered ${res.status}${res.statusText ? ` ${res.statusText}` : ""} to ${method} ${path}`;
      if (res.status === 401 || res.status === 403) throw this.#fail(`${what}: check the BMC credential`, res.status);
      const detail = redfishMessage(res.body);
      throw this.#fail(detail ? `${what}: ${this.#scrub(detail)}` : what, res.status);
    }
    if (!res.body) return { json: undefined, header: res.header };
    try {
      return { json: JSON.parse(res.body) as unknown, header: res.header };
    } catch {
      throw this.#fail(`answered ${method} ${path} with a body that is not JSON`);
    }
  }

  /** The BMC's certificate, refused under the binding's tls block. Permanent: another attempt meets the same certificate. */
  #certificateRefused({ refusal }: CertificateRefused): AgentError {
    if (refusal.kind === "pin") {
      const { pin, presented } = refusal;
      return this.#fail(
        `presented a certificate whose public key does not match the pin bmc.tls.spkiSha256 ${pin}${presented ? ` (its pin is ${presented})` : ""}; nothing was sent`,
        undefined,
        true,
      );
    }
    const by = refusal.by === "system" ? "by the system's CAs" : "by bmc.tls.caBundle";
    return this.#fail(
      `presented a certificate that is not trusted ${by} (${refusal.reason}); nothing was sent. Name the CA that signed it in bmc.tls.caBundle, or pin its public key with bmc.tls.spkiSha256 (docs/bmc.md)`,
      undefined,
      true,
    );
  }

  /** A link from the BMC as a URL on the BMC itself: credentials are never sent elsewhere. */
  #resolve(path: string): string {
    let url: URL | undefined;
    try {
      url = new URL(path, this.#origin);
    } catch {
      // refused below
    }
    if (url?.origin !== this.#origin) throw this.#fail(`links to ${JSON.stringify(path)}, outside the BMC; not following it`);
    return url.href;
  }

  /** A DRIVER_ERROR naming the BMC; `status` is the BMC's HTTP status when it answered one. */
  #fail(message: string, status?: number, permanent = false): AgentError {
    return new AgentError("DRIVER_ERROR", `BMC ${this.address} ${message}`, status, { permanent });
  }

  /** The resource tree does not offer what was asked: no attempt will find it there. */
  #unsupported(message: string): AgentError {
    return new AgentError("UNSUPPORTED", `BMC ${this.address} ${message}`);
  }

  /** Text the BMC or the network stack wrote, without the credential in case it echoes it. */
  #scrub(text: string): string {
    for (const secret of [this.#credential.password, this.#credential.username]) {
      if (secret) text = text.replaceAll(secret, "[redacted]");
    }
    return text;
  }
}

/**
 * Where the BMC serves virtual media: the System's collection when it links one (iDRAC since 6.x,
 * sushy-tools), else the Manager's. As Ironic decides (redfish/boot.py, _has_vmedia_via_systems):
 * a System that has it is the one asked, even when its Manager links one too (often the same
 * devices, or a deprecated copy of them).
 */
function mediaCollection(
  system: SystemResource,
  manager: { VirtualMedia?: { "@odata.id": string } | null } | undefined,
): string | undefined {
  return system.VirtualMedia?.["@odata.id"] ?? manager?.VirtualMedia?.["@odata.id"];
}

/** A BMC's answer that the method is not there: 405 Method Not Allowed, 501 Not Implemented. */
const notOffered = (e: unknown) => e instanceof AgentError && (e.status === 405 || e.status === 501);
