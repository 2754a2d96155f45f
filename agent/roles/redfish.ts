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
});
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
