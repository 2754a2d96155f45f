// A Redfish client for the site agent: reads and drives one machine through its BMC over
// real HTTP with Basic auth. A BMC is named by its system URL
// (https://host/redfish/v1/Systems/<id>); every failure is an AgentError DRIVER_ERROR that
// names the BMC by that address and never carries the username or password.
//
// No retries here: the workflow engine retries steps and shows each attempt. Operations are
// idempotent by desired state, so a retried step does no harm.
import { z } from "zod";
import { base64, utf8 } from "../../core/encoding.ts";
import { AgentError, type FetchLike } from "../client.ts";

/** A BMC and its credential; the password is the resolved value, not a secret:// reference. */
export interface BmcCredential {
  address: string;
  username: string;
  password: string;
}

export interface RedfishClientOptions {
  fetch?: FetchLike;
  /** Per request (ms). Default 10 000. */
  timeoutMs?: number;
  /** The command's signal: its abort ends the request in flight with the signal's reason. */
  signal?: AbortSignal;
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

export interface BiosResult {
  /** Attributes the BMC holds for the next power-on that differ from the ones in effect. */
  pending: Record<string, BiosValue>;
  /** True when every wanted attribute is already in effect (nothing was sent). */
  applied: boolean;
}

export interface RaidResult {
  volume: { id: string; level: RaidLevel; drives: number };
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
  media: { inserted: boolean; image: string | null };
  /** Present when the system links Storage: its drives (count) and volumes. */
  storage?: { drives: number; volumes: Array<{ id: string; level: string | null }> };
  /**
   * The IP addresses its NICs report (EthernetInterfaces): IPv4, then IPv6, deduplicated, without
   * link-local or unspecified ones; [] when the system links no EthernetInterfaces.
   */
  addresses: string[];
}

const DEFAULT_TIMEOUT_MS = 10_000;
const SYSTEM_PATH = /^\/redfish\/v1\/Systems\/([^/]+)\/?$/;
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
  Boot: z.object({ BootSourceOverrideTarget: text, BootSourceOverrideEnabled: text }).nullish(),
  Actions: z.object({ "#ComputerSystem.Reset": action }).nullish(),
  Links: z.object({ ManagedBy: z.array(link).nullish() }).nullish(),
  Bios: link.nullish(),
  Storage: link.nullish(),
  EthernetInterfaces: link.nullish(),
});
const attributes = z.record(z.string(), z.unknown()).nullish();
const biosResource = z.object({ Attributes: attributes, "@Redfish.Settings": z.object({ SettingsObject: link.nullish() }).nullish() });
const biosSettingsResource = z.object({ Attributes: attributes });
const storageResource = z.object({ Drives: z.array(link).nullish(), Volumes: link.nullish() });
const volumeResource = z.object({ Id: text, RAIDType: text, VolumeType: text, Links: z.object({ Drives: z.array(link).nullish() }).nullish() });
/** Older BMCs state VolumeType only. */
const VOLUME_TYPE_LEVELS: Record<string, RaidLevel> = { NonRedundant: "RAID0", Mirrored: "RAID1", StripedWithParity: "RAID5", SpannedMirrors: "RAID10" };
const ipAddresses = z.array(z.object({ Address: text }).nullable()).nullish();
const ethernetInterfaceResource = z.object({ IPv4Addresses: ipAddresses, IPv6Addresses: ipAddresses });
// Shapes only, so a BMC's placeholder ("N/A", "") is not taken for an address.
const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const IPV6 = /^[0-9a-f:.]*:[0-9a-f:.]*$/;
/** Addresses no one can reach the machine at from elsewhere: link-local (fe80::/10) and unspecified. */
const unusable = (ip: string) => ip === "0.0.0.0" || ip === "::" || /^fe[89ab][0-9a-f]:/.test(ip);
const managerResource = z.object({ FirmwareVersion: text, VirtualMedia: link.nullish() });
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

/** The address split into what requests need; refuses credentials in the URL and non-system URLs. */
function parseAddress(address: string): { origin: string; systemPath: string; systemId: string } {
  let url: URL;
  try {
    url = new URL(address);
  } catch {
    throw invalid("the BMC address is not a URL"); // not echoed: it may hold a credential
  }
  if (url.username || url.password) throw invalid("the BMC address must not carry a username or password; they travel as the credential");
  if (url.protocol !== "https:" && url.protocol !== "http:") throw invalid(`the BMC address must be http(s), not ${url.protocol}`);
  const id = SYSTEM_PATH.exec(url.pathname)?.[1];
  let systemId: string | undefined;
  try {
    systemId = id === undefined ? undefined : decodeURIComponent(id);
  } catch {
    // a malformed escape: refused below
  }
  if (systemId === undefined || url.search || url.hash) {
    throw invalid(`the BMC address must be a system URL, https://host/redfish/v1/Systems/<id>: ${url.origin}${url.pathname}`);
  }
  return { origin: url.origin, systemPath: url.pathname.replace(/\/$/, ""), systemId };
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
  readonly #fetch: FetchLike;
  readonly #timeoutMs: number;
  readonly #signal: AbortSignal | undefined;

  constructor(bmc: BmcCredential, options: RedfishClientOptions = {}) {
    const { origin, systemPath, systemId } = parseAddress(bmc.address);
    this.#origin = origin;
    this.#systemPath = systemPath;
    this.systemId = systemId;
    this.address = origin + systemPath;
    this.#credential = bmc;
    this.#authorization = `Basic ${base64(utf8(`${bmc.username}:${bmc.password}`))}`;
    this.#fetch = options.fetch ?? ((url, init) => fetch(url, init));
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#signal = options.signal;
  }

  async inspect(): Promise<BmcInspection> {
    const system = await this.#system();
    const manager = await this.#manager(system);
    const cd = await this.#virtualCd(manager.VirtualMedia?.["@odata.id"]);
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
      media: { inserted: cd?.media.Inserted === true, image: cd?.media.Image ?? null },
      ...(await this.#storageSummary(system)),
      addresses: await this.#addresses(system),
    };
  }

  /** Idempotent by desired state: a machine already on is not reset by "on". */
  async setPower(action: PowerAction): Promise<{ powerState: string | null; previous: string | null }> {
    const system = await this.#system();
    const previous = system.PowerState ?? null;
    const isOn = previous === "On" || previous === "PoweringOn";
    const isOff = previous === "Off" || previous === "PoweringOff";
    const resets: Record<PowerAction, string | null> = {
      on: isOn ? null : "On",
      off: isOff ? null : "ForceOff",
      cycle: isOff ? "On" : "ForceRestart",
    };
    if (!(action in resets)) throw invalid(`unknown power action ${JSON.stringify(action)}`);
    const resetType = resets[action];
    if (resetType) {
      const target = system.Actions?.["#ComputerSystem.Reset"]?.target ?? `${this.#systemPath}/Actions/ComputerSystem.Reset`;
      await this.#call("POST", target, { ResetType: resetType });
    }
    const powerState = resetType ? ((await this.#system()).PowerState ?? null) : previous;
    return { powerState, previous };
  }

  /** Boot override for the next boot (once) or every boot; answers what the BMC then reports. */
  async setBootDevice(device: BootDevice, once = true): Promise<{ target: string | null; enabled: string | null }> {
    const target = Object.hasOwn(BOOT_TARGETS, device) ? BOOT_TARGETS[device] : undefined;
    if (!target) throw invalid(`unknown boot device ${JSON.stringify(device)}`);
    await this.#call("PATCH", this.#systemPath, { Boot: { BootSourceOverrideTarget: target, BootSourceOverrideEnabled: once ? "Once" : "Continuous" } });
    const boot = (await this.#system()).Boot; // re-read: many BMCs answer a PATCH with 204
    return { target: boot?.BootSourceOverrideTarget ?? null, enabled: boot?.BootSourceOverrideEnabled ?? null };
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
   */
  async applyBiosSettings(wanted: Record<string, BiosValue>): Promise<BiosResult> {
    if (typeof wanted !== "object" || wanted === null || Array.isArray(wanted)) throw invalid("the BIOS attributes must be an object");
    const entries = Object.entries(wanted);
    if (entries.length === 0) throw invalid("no BIOS attributes given");
    for (const [k, v] of entries) {
      if (!k || !["string", "number", "boolean"].includes(typeof v)) throw invalid(`the BIOS attribute ${JSON.stringify(k)} must be a string, number or boolean`);
    }
    const system = await this.#system();
    const biosPath = system.Bios?.["@odata.id"];
    if (!biosPath) throw this.#fail(`links no BIOS resource to ${this.#systemPath} (Bios)`);
    const bios = await this.#get(biosPath, biosResource, "Bios");
    const current = bios.Attributes ?? {};
    const has = (attrs: Record<string, unknown>, k: string, v: unknown) => Object.hasOwn(attrs, k) && attrs[k] === v;
    const changes = Object.fromEntries(entries.filter(([k, v]) => !has(current, k, v)));
    if (Object.keys(changes).length === 0) return { pending: {}, applied: true };

    const settingsPath = bios["@Redfish.Settings"]?.SettingsObject?.["@odata.id"] ?? `${biosPath.replace(/\/$/, "")}/Settings`;
    const staged = (await this.#get(settingsPath, biosSettingsResource, "Bios settings")).Attributes ?? {};
    if (!Object.entries(changes).every(([k, v]) => has(staged, k, v))) {
      await this.#call("PATCH", settingsPath, { Attributes: changes });
    }
    // Re-read: many BMCs answer with 204. Some list only pending values, others all of them.
    const after = (await this.#get(settingsPath, biosSettingsResource, "Bios settings")).Attributes ?? {};
    const pending = Object.fromEntries(
      Object.entries(after).filter((e): e is [string, BiosValue] => ["string", "number", "boolean"].includes(typeof e[1]) && !has(current, e[0], e[1])),
    );
    return { pending, applied: false };
  }

  /**
   * One RAID volume of `level` over `drives` drives (default: all of the controller's). Idempotent:
   * a volume of that level over that many drives is returned as it is; otherwise every volume of
   * the controller is deleted and the volume created over its first drives.
   */
  async configureRaid(spec: { level: RaidLevel; drives?: number | "all" }): Promise<RaidResult> {
    const level = spec?.level;
    if (!RAID_LEVELS.includes(level)) throw invalid(`unknown RAID level ${JSON.stringify(level)}; one of ${RAID_LEVELS.join(", ")}`);
    const asked = spec?.drives ?? "all";
    if (asked !== "all" && !(Number.isInteger(asked) && asked >= 1)) throw invalid(`drives must be a positive integer or "all", not ${JSON.stringify(asked)}`);
    if (asked !== "all") {
      const problem = raidDriveCountProblem(level, asked);
      if (problem) throw invalid(problem);
    }
    const system = await this.#system();
    const controllers = await this.#storageControllers(system);
    if (controllers === null) throw this.#fail(`links no Storage to ${this.#systemPath}; no RAID to configure`);
    const controller = controllers.find((c) => c.storage.Volumes && (c.storage.Drives?.length ?? 0) > 0);
    if (!controller) throw this.#fail("has no storage controller with drives and volumes");
    const drives = controller.storage.Drives ?? [];
    const count = asked === "all" ? drives.length : asked;
    if (count > drives.length) throw invalid(`BMC ${this.address} has ${drives.length} drive(s) on ${controller.path}; ${level} over ${count} cannot be made`);
    const problem = raidDriveCountProblem(level, count);
    if (problem) throw invalid(`BMC ${this.address} has ${drives.length} drives on ${controller.path}: ${problem}`);

    const volumesPath = controller.storage.Volumes!["@odata.id"];
    const existing = await this.#volumes(volumesPath);
    const fits = (v: Volume) => v.level === level && v.drives === count;
    const found = existing.find(fits);
    if (found) return { volume: { id: found.id, level, drives: count } };

    for (const v of existing) await this.#call("DELETE", v.path);
    const answer = await this.#call("POST", volumesPath, { RAIDType: level, Drives: drives.slice(0, count), Name: `${level} volume` });
    const created = volumeResource.safeParse(answer);
    // Trust the answer's Id only when it is a Volume (a 202 may carry a Task instead).
    const id = created.success && (created.data.RAIDType || created.data.VolumeType) ? created.data.Id : undefined;
    if (id) return { volume: { id, level, drives: count } };
    // No body (201/202/204 without one): find it.
    const made = (await this.#volumes(volumesPath)).find(fits);
    if (!made) throw this.#fail(`accepted the ${level} volume but ${volumesPath} does not list it`);
    return { volume: { id: made.id, level, drives: count } };
  }

  // ------------------------------------------------------------ resources

  #system(): Promise<SystemResource> {
    return this.#get(this.#systemPath, systemResource, "ComputerSystem");
  }

  async #manager(system: SystemResource) {
    const ref = system.Links?.ManagedBy?.[0]?.["@odata.id"];
    if (!ref) throw this.#fail(`links no manager to ${this.#systemPath} (Links.ManagedBy)`);
    return this.#get(ref, managerResource, "Manager");
  }

  /** The manager's virtual CD: a member named Cd/CD1..., else the first that takes CDs. */
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

  async #volumes(collectionPath: string): Promise<Volume[]> {
    const members = (await this.#get(collectionPath, collectionResource, "Volume collection")).Members.map((m) => m["@odata.id"]);
    const out: Volume[] = [];
    for (const path of members) {
      const v = await this.#get(path, volumeResource, "Volume");
      const id = v.Id ?? decodeURIComponent(path.replace(/\/$/, "").split("/").pop() ?? path);
      const level = v.RAIDType ?? (v.VolumeType && Object.hasOwn(VOLUME_TYPE_LEVELS, v.VolumeType) ? VOLUME_TYPE_LEVELS[v.VolumeType]! : null);
      out.push({ path, id, level, drives: v.Links?.Drives?.length ?? 0 });
    }
    return out;
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
      if (ref) for (const v of await this.#volumes(ref)) volumes.push({ id: v.id, level: v.level });
    }
    return { storage: { drives, volumes } };
  }

  /** inspect()'s addresses: IPv4 then IPv6 over every interface; [] when there are no EthernetInterfaces. */
  async #addresses(system: SystemResource): Promise<string[]> {
    const ref = system.EthernetInterfaces?.["@odata.id"];
    if (!ref) return [];
    const members = (await this.#get(ref, collectionResource, "EthernetInterface collection")).Members.map((m) => m["@odata.id"]);
    const v4 = new Set<string>();
    const v6 = new Set<string>();
    for (const path of members) {
      const nic = await this.#get(path, ethernetInterfaceResource, "EthernetInterface");
      for (const a of nic.IPv4Addresses ?? []) {
        const ip = a?.Address?.trim();
        if (ip && IPV4.test(ip) && !unusable(ip)) v4.add(ip);
      }
      for (const a of nic.IPv6Addresses ?? []) {
        const ip = a?.Address?.trim().toLowerCase(); // BMCs differ in case; one address, one spelling
        if (ip && IPV6.test(ip) && !unusable(ip)) v6.add(ip);
      }
    }
    return [...v4, ...v6];
  }

  async #requireCd(): Promise<{ path: string; media: MediaResource }> {
    const manager = await this.#manager(await this.#system());
    const cd = await this.#virtualCd(manager.VirtualMedia?.["@odata.id"]);
    if (!cd) throw this.#fail("has no virtual CD");
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
    const url = this.#resolve(path);
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = this.#signal ? AbortSignal.any([this.#signal, timeout]) : timeout;
    const headers: Record<string, string> = { authorization: this.#authorization, accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    let res: Response;
    let answer: string;
    try {
      res = await this.#fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal });
      answer = await res.text();
    } catch (e) {
      // The command's deadline or the agent stopping: report that, not a BMC failure.
      if (this.#signal?.aborted) throw this.#signal.reason;
      throw this.#fail(`did not answer ${method} ${path}: ${timeout.aborted ? `no answer within ${this.#timeoutMs} ms` : this.#scrub(fetchFailureReason(e))}`);
    }
    if (!res.ok) {
      const what = `answered ${res.status}${res.statusText ? ` ${res.statusText}` : ""} to ${method} ${path}`;
      if (res.status === 401 || res.status === 403) throw this.#fail(`${what}: check the BMC credential`);
      const detail = redfishMessage(answer);
      throw this.#fail(detail ? `${what}: ${this.#scrub(detail)}` : what);
    }
    if (!answer) return undefined;
    try {
      return JSON.parse(answer) as unknown;
    } catch {
      throw this.#fail(`answered ${method} ${path} with a body that is not JSON`);
    }
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

  #fail(message: string): AgentError {
    return new AgentError("DRIVER_ERROR", `BMC ${this.address} ${message}`);
  }

  /** Text the BMC or the network stack wrote, without the credential in case it echoes it. */
  #scrub(text: string): string {
    for (const secret of [this.#credential.password, this.#credential.username]) {
      if (secret) text = text.replaceAll(secret, "[redacted]");
    }
    return text;
  }
}
