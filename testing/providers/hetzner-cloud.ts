// A Hetzner Cloud API emulator for tests and `npm run dev`: SIMULATED, nothing here talks to
// Hetzner or runs a server. It serves the parts of https://api.hetzner.cloud/v1 a VPS control
// plane uses over real HTTP (node:http, 127.0.0.1, a random port), with the real API's paths,
// envelopes, status codes and asynchronous action model (facts: ../shared/PROVIDERS.md §1):
//
//   GET  /servers?name=&label_selector=&status=&sort=&page=&per_page=    POST /servers (201: server,
//        action, next_actions, root_password)    GET|PUT|DELETE /servers/{id} (DELETE: 200 {action})
//   POST /servers/{id}/actions/{poweron|poweroff|shutdown|reboot|reset}   (201 {action})
//   GET  /servers/{id}/actions[/{action_id}]   GET /actions/{id}   GET /actions?id=1&id=2
//   GET|POST /ssh_keys (?name=&fingerprint=&label_selector=)   GET|PUT|DELETE /ssh_keys/{id} (DELETE: 204)
//   GET  /server_types[/{id}]  /images[/{id}] (?type=&architecture=&name=)  /locations[/{id}]  /datacenters[/{id}]
//
// Actions start `running` and finish after the action duration (0 by default: by the next
// request); a server's status changes when its action finishes, and a mutating call on a server
// with a running action is 423 `locked`. Every answer carries RateLimit-Limit/-Remaining/-Reset
// from a token bucket (3600 a project, refilled 1/s, like the real one; settable so tests can
// spend it) and a spent bucket answers 429 `rate_limit_exceeded`. Error bodies always carry
// `details`. user_data is accepted and never returned: tests read it through userData(). Faults
// (429, 5xx, 423, failed actions, resource_unavailable, resource_limit_exceeded) are injected as a
// seeded share of calls or as the next N. `npm run dev -- --providers` starts one.
import { createHash, randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { seededRandom } from "../seeded-random.ts";

export interface HetznerCloudFaults {
  /** Share (0..1) of authenticated calls answered 429 rate_limit_exceeded, with reset headers. */
  rateLimitRate?: number;
  /** Share of authenticated calls answered 503 unavailable (before anything is done). */
  serverErrorRate?: number;
  /** Share of mutating calls on a server answered 423 locked. */
  lockedRate?: number;
  /** Share of started actions that end `error` (action_failed). */
  actionErrorRate?: number;
  /** The next N calls (or actions, or creates) answered with each fault, before any share applies. */
  next?: {
    rateLimit?: number;
    serverError?: number;
    locked?: number;
    actionError?: number;
    /** POST /servers answered 412 resource_unavailable ("error during placement"). */
    resourceUnavailable?: number;
    /** POST /servers answered 403 resource_limit_exceeded ("server limit exceeded"). */
    resourceLimitExceeded?: number;
  };
  /** Seed of the generator that draws the shares (default 1). */
  seed?: number;
}

export interface HetznerCloudEmulatorOptions {
  /** The project's API token (default "hcloud-emulator-token"). */
  token?: string;
  /** How long every action runs, in ms (default 0: finished by the next request). */
  actionDurationMs?: number;
  /** The project's rate limit: requests in a full bucket and refill per second (default 3600 and 1). */
  rateLimit?: { limit: number; refillPerSecond: number };
  /** Live servers the project may have; one more is resource_limit_exceeded (default unlimited). */
  serverLimit?: number;
  faults?: HetznerCloudFaults;
  host?: string;
  port?: number;
}

export type HetznerServerStatus = "initializing" | "starting" | "running" | "stopping" | "off" | "deleting";

/** A live server as the emulator holds it (user data included, which the API never returns). */
export interface EmulatedServer {
  id: number;
  name: string;
  status: HetznerServerStatus;
  labels: Record<string, string>;
  serverType: string;
  image: string;
  location: string;
  sshKeys: number[];
  userData: string | undefined;
}

export interface HetznerCloudEmulator {
  /** The API base, e.g. http://127.0.0.1:41234/v1 (what hcloud.Client(api_endpoint=) takes). */
  url: string;
  token: string;
  counters: {
    /** Servers created since the start (POST /servers answered 201). */
    serversCreated: number;
    /** Calls per endpoint, e.g. "POST /servers", "GET /servers/{id}", faults and refusals included. */
    calls: Record<string, number>;
    /** Calls that arrived while the rate-limit bucket was empty (answered 429): a well-behaved client makes none. */
    overLimit: number;
    /** Answers per fault injected: rateLimit, serverError, locked, actionError, resourceUnavailable, resourceLimitExceeded. */
    faults: Record<string, number>;
    /** Mutating calls refused 423 because an action was running on the server (not injected). */
    locked: number;
  };
  /** Live servers (deleted ones are gone), after finishing every action that is due. */
  servers(): EmulatedServer[];
  /** The user data a server was created with; the API itself never returns it. */
  userData(serverId: number): string | undefined;
  setFaults(faults: HetznerCloudFaults): void;
  setActionDurationMs(ms: number): void;
  setRateLimit(rateLimit: { limit: number; refillPerSecond: number }): void;
  setServerLimit(limit: number | undefined): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------- the catalogue (real names and sizes)

interface Location {
  id: number;
  name: string;
  description: string;
  country: string;
  city: string;
  latitude: number;
  longitude: number;
  network_zone: string;
}

// id, name, description, country, city, latitude, longitude, network zone
const LOCATIONS: Location[] = (
  [
    [1, "fsn1", "Falkenstein DC Park 1", "DE", "Falkenstein", 50.47612, 12.370071, "eu-central"],
    [2, "nbg1", "Nuremberg DC Park 1", "DE", "Nuremberg", 49.452102, 11.076665, "eu-central"],
    [3, "hel1", "Helsinki DC Park 1", "FI", "Helsinki", 60.169855, 24.938379, "eu-central"],
    [4, "ash", "Ashburn, VA", "US", "Ashburn, VA", 39.045821, -77.487073, "us-east"],
    [5, "hil", "Hillsboro, OR", "US", "Hillsboro, OR", 45.54222, -122.951924, "us-west"],
    [6, "sin", "Singapore", "SG", "Singapore", 1.283333, 103.833333, "ap-southeast"],
  ] as const
).map(([id, name, description, country, city, latitude, longitude, network_zone]) => ({
  id,
  name,
  description,
  country,
  city,
  latitude,
  longitude,
  network_zone,
}));

const DATACENTER_OF: Record<string, { id: number; name: string }> = {
  fsn1: { id: 4, name: "fsn1-dc14" },
  nbg1: { id: 2, name: "nbg1-dc3" },
  hel1: { id: 3, name: "hel1-dc2" },
  ash: { id: 5, name: "ash-dc1" },
  hil: { id: 6, name: "hil-dc1" },
  sin: { id: 7, name: "sin-dc1" },
};

const EU = ["fsn1", "nbg1", "hel1"];
const EVERYWHERE = LOCATIONS.map((l) => l.name);
const TB = 1024 ** 4;

interface ServerTypeSpec {
  id: number;
  name: string;
  cores: number;
  memory: number;
  disk: number;
  cpu: "shared" | "dedicated";
  architecture: "x86" | "arm";
  monthlyEur: number;
  locations: readonly string[];
  deprecated: boolean;
}

// id, name, cores, memory (GB), disk (GB), CPU, architecture, € a month, locations, deprecated
const SERVER_TYPES: ServerTypeSpec[] = (
  [
    [1, "cx11", 1, 2, 20, "shared", "x86", 3.29, EU, true],
    [22, "cpx11", 2, 2, 40, "shared", "x86", 4.35, EVERYWHERE, false],
    [23, "cpx21", 3, 4, 80, "shared", "x86", 7.55, EVERYWHERE, false],
    [24, "cpx31", 4, 8, 160, "shared", "x86", 13.6, EVERYWHERE, false],
    [45, "cax11", 2, 4, 40, "shared", "arm", 3.79, EU, false],
    [96, "ccx13", 2, 8, 80, "dedicated", "x86", 12.49, EVERYWHERE, false],
    [104, "cx22", 2, 4, 40, "shared", "x86", 3.79, EU, false],
    [105, "cx32", 4, 8, 80, "shared", "x86", 6.8, EU, false],
  ] as const
).map(([id, name, cores, memory, disk, cpu, architecture, monthlyEur, locations, deprecated]) => ({
  id,
  name,
  cores,
  memory,
  disk,
  cpu,
  architecture,
  monthlyEur,
  locations,
  deprecated,
}));

interface ImageSpec {
  id: number;
  name: string;
  description: string;
  osFlavor: string;
  osVersion: string;
  architecture: "x86" | "arm";
  created: string;
}

// id, name, description, OS flavor and version, architecture, created
const IMAGES: ImageSpec[] = (
  [
    [67794396, "ubuntu-22.04", "Ubuntu 22.04", "ubuntu", "22.04", "x86", "2022-04-21T13:32:38+00:00"],
    [103908130, "ubuntu-22.04", "Ubuntu 22.04", "ubuntu", "22.04", "arm", "2023-03-20T10:13:40+00:00"],
    [114690387, "debian-12", "Debian 12", "debian", "12", "x86", "2023-06-13T06:00:02+00:00"],
    [114690389, "debian-12", "Debian 12", "debian", "12", "arm", "2023-06-13T06:00:04+00:00"],
    [161547269, "ubuntu-24.04", "Ubuntu 24.04", "ubuntu", "24.04", "x86", "2024-04-25T13:26:27+00:00"],
    [161547270, "ubuntu-24.04", "Ubuntu 24.04", "ubuntu", "24.04", "arm", "2024-04-25T13:26:28+00:00"],
  ] as const
).map(([id, name, description, osFlavor, osVersion, architecture, created]) => ({
  id,
  name,
  description,
  osFlavor,
  osVersion,
  architecture,
  created,
}));

const money = (eur: number) => ({ net: eur.toFixed(10), gross: (eur * 1.19).toFixed(16) });

function serverTypeJson(t: ServerTypeSpec) {
  return {
    id: t.id,
    name: t.name,
    description: t.name.toUpperCase().replace(/^([A-Z]+)(\d+)$/, "$1 $2"),
    cores: t.cores,
    memory: t.memory,
    disk: t.disk,
    deprecated: t.deprecated,
    deprecation: t.deprecated ? { announced: "2024-06-06T06:00:00+00:00", unavailable_after: "2024-09-06T06:00:00+00:00" } : null,
    prices: t.locations.map((location) => ({
      location,
      price_hourly: money(t.monthlyEur / 730),
      price_monthly: money(t.monthlyEur),
      included_traffic: (EU.includes(location) ? 20 : 1) * TB,
      price_per_tb_traffic: money(1),
    })),
    storage_type: "local",
    cpu_type: t.cpu,
    architecture: t.architecture,
    included_traffic: 20 * TB,
  };
}

function imageJson(i: ImageSpec) {
  return {
    id: i.id,
    type: "system",
    status: "available",
    name: i.name,
    description: i.description,
    image_size: null,
    disk_size: 5,
    created: i.created,
    created_from: null,
    bound_to: null,
    os_flavor: i.osFlavor,
    os_version: i.osVersion,
    rapid_deploy: true,
    protection: { delete: false },
    deprecated: null,
    deleted: null,
    labels: {},
    architecture: i.architecture,
  };
}

function datacenterJson(location: Location) {
  const dc = DATACENTER_OF[location.name]!;
  const here = SERVER_TYPES.filter((t) => t.locations.includes(location.name)).map((t) => t.id);
  return {
    id: dc.id,
    name: dc.name,
    description: `${location.city} DC ${dc.name.split("-dc")[1]}`,
    location,
    server_types: {
      supported: here,
      available: here.filter((id) => !SERVER_TYPES.find((t) => t.id === id)!.deprecated),
      available_for_migration: here,
    },
  };
}

// ---------------------------------------------------------------- labels and label selectors

const LABEL_NAME = /^[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$/;
const LABEL_PREFIX = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^([a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?)?$/;

function labelKeyProblem(key: string): string | undefined {
  const slash = key.lastIndexOf("/");
  const [prefix, name] = slash < 0 ? [undefined, key] : [key.slice(0, slash), key.slice(slash + 1)];
  if (!LABEL_NAME.test(name)) return `label key ${JSON.stringify(key)} is invalid`;
  if (prefix !== undefined && (prefix.length > 253 || !LABEL_PREFIX.test(prefix)))
    return `label key prefix ${JSON.stringify(prefix)} is invalid`;
  if (prefix === "hetzner.cloud" || prefix?.endsWith(".hetzner.cloud")) return `label key prefix ${JSON.stringify(prefix)} is reserved`;
  return undefined;
}

function labelsProblem(labels: unknown): string | undefined {
  if (labels === undefined) return undefined;
  if (typeof labels !== "object" || labels === null || Array.isArray(labels)) return "labels must be an object";
  for (const [key, value] of Object.entries(labels)) {
    const keyProblem = labelKeyProblem(key);
    if (keyProblem) return keyProblem;
    if (typeof value !== "string" || !LABEL_VALUE.test(value)) return `label value ${JSON.stringify(value)} of ${key} is invalid`;
  }
  return undefined;
}

type Requirement = { key: string; op: "=" | "!=" | "in" | "notin" | "exists" | "!exists"; values: string[] };

/** k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b); a comma is AND. A string is the problem. */
export function parseLabelSelector(selector: string): Requirement[] | string {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i <= selector.length; i++) {
    const c = selector[i];
    if (c === "(") depth++;
    else if (c === ")") depth--;
    else if ((c === "," && depth === 0) || c === undefined) {
      terms.push(selector.slice(start, i).trim());
      start = i + 1;
    }
  }
  const requirements: Requirement[] = [];
  for (const term of terms) {
    let m: RegExpExecArray | null;
    let r: Requirement;
    if ((m = /^!\s*([^\s=!(),]+)$/.exec(term))) r = { key: m[1]!, op: "!exists", values: [] };
    else if ((m = /^([^\s=!(),]+)\s+(in|notin)\s*\(([^()]*)\)$/.exec(term)))
      r = { key: m[1]!, op: m[2] as "in" | "notin", values: m[3]!.split(",").map((v) => v.trim()) };
    else if ((m = /^([^\s=!(),]+)\s*(==|=|!=)\s*([^\s=!(),]*)$/.exec(term)))
      r = { key: m[1]!, op: m[2] === "!=" ? "!=" : "=", values: [m[3]!] };
    else if ((m = /^([^\s=!(),]+)$/.exec(term))) r = { key: m[1]!, op: "exists", values: [] };
    else return `invalid label selector term ${JSON.stringify(term)}`;
    const problem =
      labelKeyProblem(r.key) ??
      r.values.map((v) => (LABEL_VALUE.test(v) ? undefined : `invalid label value ${JSON.stringify(v)}`)).find(Boolean);
    if (problem) return problem;
    requirements.push(r);
  }
  return requirements;
}

function matches(labels: Record<string, string>, requirements: Requirement[]): boolean {
  return requirements.every(({ key, op, values }) => {
    const value = labels[key];
    switch (op) {
      case "=":
        return value === values[0];
      case "!=":
        return value !== values[0];
      case "in":
        return value !== undefined && values.includes(value);
      case "notin":
        return value === undefined || !values.includes(value);
      case "exists":
        return value !== undefined;
      case "!exists":
        return value === undefined;
    }
  });
}

// ---------------------------------------------------------------- the emulator

interface Action {
  id: number;
  command: string;
  status: "running" | "success" | "error";
  started: string;
  finished: string | null;
  resources: { id: number; type: string }[];
  error: { code: string; message: string } | null;
  /** When it begins (a next action begins when the one before it ends) and ends, ms. */
  beginsAt: number;
  endsAt: number;
  fails: boolean;
  onSuccess?: () => void;
  onError?: () => void;
}

interface Server {
  id: number;
  name: string;
  status: HetznerServerStatus;
  created: string;
  type: ServerTypeSpec;
  image: ImageSpec;
  location: Location;
  labels: Record<string, string>;
  sshKeys: number[];
  userData: string | undefined;
  ipv4: { id: number; ip: string } | null;
  ipv6: { id: number; ip: string } | null;
}

interface SshKey {
  id: number;
  name: string;
  fingerprint: string;
  public_key: string;
  labels: Record<string, string>;
  created: string;
}

class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

const invalid = (message: string, field?: string) =>
  new ApiError(400, "invalid_input", message, field ? { fields: [{ name: field, messages: [message] }] } : {});
const notFound = (what: string) => new ApiError(404, "not_found", `${what} not found`);

/** Hetzner's timestamps: ISO 8601 with +00:00. */
const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "+00:00");

/** OpenSSH key fingerprint as Hetzner shows it: MD5 of the key blob, hex pairs. */
function md5Fingerprint(publicKey: string): string | undefined {
  const blob = publicKey.trim().split(/\s+/)[1];
  if (!blob || !/^[A-Za-z0-9+/]+=*$/.test(blob)) return undefined;
  const hex = createHash("md5").update(Buffer.from(blob, "base64")).digest("hex");
  return hex.match(/../g)!.join(":");
}

const SERVER_NAME = /^(?=.{1,63}$)[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$/;
const USER_DATA_MAX = 32 * 1024;
const MAX_BODY = 1024 * 1024;

export async function startHetznerCloudEmulator(options: HetznerCloudEmulatorOptions = {}): Promise<HetznerCloudEmulator> {
  const token = options.token ?? "hcloud-emulator-token";
  let actionDurationMs = options.actionDurationMs ?? 0;
  let serverLimit = options.serverLimit;
  let faults: HetznerCloudFaults = {};
  let random = seededRandom(1);
  const setFaults = (f: HetznerCloudFaults) => {
    faults = { ...f, next: { ...f.next } };
    random = seededRandom(f.seed ?? 1);
  };
  setFaults(options.faults ?? {});

  // The project's token bucket: `limit` requests, refilled continuously.
  let bucket = { limit: 3600, refillPerSecond: 1, ...options.rateLimit, tokens: 0, at: Date.now() };
  bucket.tokens = bucket.limit;
  const refill = (now: number) => {
    bucket.tokens = Math.min(bucket.limit, bucket.tokens + ((now - bucket.at) / 1000) * bucket.refillPerSecond);
    bucket.at = now;
  };
  const rateHeaders = (now: number, tokens = bucket.tokens): Record<string, string> => ({
    "RateLimit-Limit": String(bucket.limit),
    "RateLimit-Remaining": String(Math.floor(tokens)),
    // When the bucket is full again (unix seconds, rounded up), as the real API says.
    "RateLimit-Reset": String(Math.ceil((now + ((bucket.limit - tokens) / bucket.refillPerSecond) * 1000) / 1000)),
  });

  const servers = new Map<number, Server>();
  const sshKeys = new Map<number, SshKey>();
  const actions = new Map<number, Action>();
  const counters: HetznerCloudEmulator["counters"] = { serversCreated: 0, calls: {}, overLimit: 0, faults: {}, locked: 0 };
  let nextServerId = 4_711_001;
  let nextActionId = 9_200_001;
  let nextKeyId = 1_880_001;
  let nextIpId = 51_000_001;

  /** Takes one of the next-N faults, or draws against its share. */
  const fault = (kind: keyof NonNullable<HetznerCloudFaults["next"]>, rate?: number): boolean => {
    const next = faults.next!;
    let hit = false;
    if ((next[kind] ?? 0) > 0) {
      next[kind]!--;
      hit = true;
    } else if (rate && rate > 0) hit = random() < rate;
    if (hit) counters.faults[kind] = (counters.faults[kind] ?? 0) + 1;
    return hit;
  };

  // ---- actions: finished lazily, in order, when anything looks at the state
  function settle(now = Date.now()): void {
    for (;;) {
      const due = [...actions.values()]
        .filter((a) => a.status === "running" && a.endsAt <= now)
        .sort((a, b) => a.endsAt - b.endsAt || a.id - b.id);
      if (due.length === 0) return;
      for (const a of due) {
        a.finished = iso(a.endsAt);
        if (a.fails) {
          a.status = "error";
          a.error = { code: "action_failed", message: `${a.command.replace(/_/g, " ")} failed` };
          a.onError?.();
        } else {
          a.status = "success";
          a.onSuccess?.();
        }
      }
    }
  }

  function startAction(
    command: string,
    server: Server,
    effect: { onSuccess?: () => void; onError?: () => void; after?: Action } = {},
  ): Action {
    const now = Date.now();
    const beginsAt = effect.after ? effect.after.endsAt : now;
    const action: Action = {
      id: nextActionId++,
      command,
      status: "running",
      started: iso(now),
      finished: null,
      resources: [{ id: server.id, type: "server" }],
      error: null,
      beginsAt,
      endsAt: beginsAt + actionDurationMs,
      fails: fault("actionError", faults.actionErrorRate),
      onSuccess: effect.onSuccess,
      onError: effect.onError,
    };
    actions.set(action.id, action);
    return action;
  }

  function actionJson(a: Action) {
    const span = a.endsAt - a.beginsAt;
    const progress =
      a.status !== "running" ? 100 : span <= 0 ? 0 : Math.max(0, Math.min(99, Math.floor(((Date.now() - a.beginsAt) / span) * 100)));
    return {
      id: a.id,
      command: a.command,
      status: a.status,
      progress,
      started: a.started,
      finished: a.finished,
      resources: a.resources,
      error: a.error,
    };
  }

  function serverJson(s: Server) {
    return {
      id: s.id,
      name: s.name,
      status: s.status,
      created: s.created,
      public_net: {
        ipv4: s.ipv4 && {
          id: s.ipv4.id,
          ip: s.ipv4.ip,
          blocked: false,
          dns_ptr: `static.${s.ipv4.ip.split(".").reverse().join(".")}.clients.your-server.de`,
        },
        ipv6: s.ipv6 && { id: s.ipv6.id, ip: s.ipv6.ip, blocked: false, dns_ptr: [] },
        floating_ips: [],
        firewalls: [],
      },
      private_net: [],
      server_type: serverTypeJson(s.type),
      datacenter: datacenterJson(s.location),
      location: s.location,
      image: imageJson(s.image),
      iso: null,
      rescue_enabled: false,
      locked: false,
      backup_window: null,
      outgoing_traffic: 0,
      ingoing_traffic: 0,
      included_traffic: 20 * TB,
      protection: { delete: false, rebuild: false },
      labels: s.labels,
      volumes: [],
      load_balancers: [],
      primary_disk_size: s.type.disk,
      placement_group: null,
    };
  }

  // ---- lookups: every reference field takes an id (number or numeric string) or a name
  const byIdOrName = <T extends { id: number; name: string }>(items: Iterable<T>, ref: unknown): T | undefined => {
    for (const item of items) if (item.id === Number(ref) || item.name === ref) return item;
    return undefined;
  };

  function serverOf(id: string): Server {
    const server = servers.get(Number(id));
    if (!server) throw notFound("server");
    return server;
  }

  /** A mutation of a server: refused while one of its actions runs, as the real API does. */
  function assertUnlocked(server: Server): void {
    const busy = [...actions.values()].some(
      (a) => a.status === "running" && a.resources.some((r) => r.type === "server" && r.id === server.id),
    );
    if (busy) counters.locked++;
    if (busy || fault("locked", faults.lockedRate)) throw new ApiError(423, "locked", "cannot perform operation because server is locked");
  }

  // ---- paging, sorting and filters of every list
  function page<T>(root: string, items: T[], query: URLSearchParams): { status: number; body: unknown; headers: Record<string, string> } {
    const pageNo = query.has("page") ? Number(query.get("page")) : 1;
    const perPage = query.has("per_page") ? Number(query.get("per_page")) : 25;
    if (!Number.isInteger(pageNo) || pageNo < 1) throw invalid("page must be a positive integer", "page");
    if (!Number.isInteger(perPage) || perPage < 1) throw invalid("per_page must be a positive integer", "per_page");
    const per = Math.min(perPage, 50);
    const last = Math.max(1, Math.ceil(items.length / per));
    const pagination = {
      page: pageNo,
      per_page: per,
      previous_page: pageNo > 1 ? pageNo - 1 : null,
      next_page: pageNo < last ? pageNo + 1 : null,
      last_page: last,
      total_entries: items.length,
    };
    const link = (p: number, rel: string) => {
      const q = new URLSearchParams(query);
      q.set("page", String(p));
      return `<${baseUrl}${root.startsWith("/") ? root : `/${root}`}?${q}>; rel="${rel}"`;
    };
    const links = [
      ...(pagination.previous_page ? [link(pagination.previous_page, "prev")] : []),
      ...(pagination.next_page ? [link(pagination.next_page, "next")] : []),
      link(last, "last"),
    ];
    const key = root.split("/").pop()!;
    return {
      status: 200,
      body: { [key]: items.slice((pageNo - 1) * per, pageNo * per), meta: { pagination } },
      headers: { Link: links.join(", ") },
    };
  }

  function sorted<T extends Record<string, any>>(items: T[], query: URLSearchParams): T[] {
    const sorts = query.getAll("sort");
    if (sorts.length === 0) return [...items].sort((a, b) => a.id - b.id);
    return [...items].sort((a, b) => {
      for (const s of sorts) {
        const [field, dir] = s.split(":");
        if (!field || !(field in a) || (dir && dir !== "asc" && dir !== "desc")) throw invalid(`invalid sort ${JSON.stringify(s)}`, "sort");
        const order = a[field] < b[field] ? -1 : a[field] > b[field] ? 1 : 0;
        if (order !== 0) return dir === "desc" ? -order : order;
      }
      return 0;
    });
  }

  function selectorOf(query: URLSearchParams): Requirement[] {
    const selector = query.get("label_selector");
    if (selector === null) return [];
    const parsed = parseLabelSelector(selector);
    if (typeof parsed === "string") throw invalid(parsed, "label_selector");
    return parsed;
  }

  // ---- handlers
  type Reply = { status: number; body?: unknown; headers?: Record<string, string> };
  type Route = {
    method: string;
    pattern: RegExp;
    name: string;
    handle: (params: string[], query: URLSearchParams, body: any) => Reply | Promise<Reply>;
  };
  const routes: Route[] = [];
  const route = (method: string, path: string, handle: Route["handle"]) =>
    routes.push({ method, name: `${method} ${path}`, pattern: new RegExp(`^${path.replace(/\{[a-z_]+\}/g, "([^/]+)")}$`), handle });

  route("GET", "/servers", (_, query) => {
    const selector = selectorOf(query);
    const name = query.get("name");
    const statuses = query.getAll("status");
    const found = [...servers.values()].filter(
      (s) => (name === null || s.name === name) && (statuses.length === 0 || statuses.includes(s.status)) && matches(s.labels, selector),
    );
    return page("/servers", sorted(found.map(serverJson), query), query);
  });

  route("POST", "/servers", (_, __, body) => {
    if (typeof body?.name !== "string" || !SERVER_NAME.test(body.name)) throw invalid("name must be a valid hostname (RFC 1123)", "name");
    const type = byIdOrName(SERVER_TYPES, body.server_type);
    if (!type) throw invalid("server type not found", "server_type");
    if (type.deprecated) throw invalid(`server type ${type.name} is deprecated`, "server_type");
    const image =
      IMAGES.find((i) => i.id === Number(body.image)) ?? IMAGES.find((i) => i.name === body.image && i.architecture === type.architecture);
    if (!image) throw invalid("image not found", "image");
    if (image.architecture !== type.architecture) throw invalid("image architecture does not match the server type", "image");
    const datacenter =
      body.datacenter !== undefined
        ? Object.entries(DATACENTER_OF).find(([, dc]) => dc.id === Number(body.datacenter) || dc.name === body.datacenter)
        : undefined;
    if (body.datacenter !== undefined && !datacenter) throw invalid("datacenter not found", "datacenter");
    const location = byIdOrName(LOCATIONS, body.location ?? datacenter?.[0] ?? "fsn1");
    if (!location) throw invalid("location not found", "location");
    if (!type.locations.includes(location.name)) throw invalid("unsupported location for server type", "location");
    const keyRefs: unknown[] = body.ssh_keys ?? [];
    if (!Array.isArray(keyRefs)) throw invalid("ssh_keys must be a list", "ssh_keys");
    const keys = keyRefs.map(
      (ref) =>
        byIdOrName(sshKeys.values(), ref) ??
        (() => {
          throw invalid(`ssh key ${JSON.stringify(ref)} not found`, "ssh_keys");
        })(),
    );
    if (body.user_data !== undefined && (typeof body.user_data !== "string" || Buffer.byteLength(body.user_data) > USER_DATA_MAX))
      throw invalid("user_data must be a string of at most 32 KiB", "user_data");
    const labelProblem = labelsProblem(body.labels);
    if (labelProblem) throw invalid(labelProblem, "labels");
    if ([...servers.values()].some((s) => s.name === body.name))
      throw new ApiError(409, "uniqueness_error", "server name is already used", { fields: [{ name: "name" }] });
    if (fault("resourceUnavailable")) throw new ApiError(412, "resource_unavailable", "error during placement");
    if ((serverLimit !== undefined && servers.size >= serverLimit) || fault("resourceLimitExceeded"))
      throw new ApiError(403, "resource_limit_exceeded", "server limit exceeded", { limits: [{ name: "server_limit" }] });

    const id = nextServerId++;
    const n = id % 250;
    const publicNet = body.public_net ?? {};
    const server: Server = {
      id,
      name: body.name,
      status: "initializing",
      created: iso(Date.now()),
      type,
      image,
      location,
      labels: { ...body.labels },
      sshKeys: keys.map((k) => k.id),
      userData: body.user_data,
      ipv4: publicNet.enable_ipv4 === false ? null : { id: nextIpId++, ip: `203.0.113.${n + 1}` },
      ipv6: publicNet.enable_ipv6 === false ? null : { id: nextIpId++, ip: `2001:db8:${(0x1000 + n).toString(16)}::/64` },
    };
    servers.set(id, server);
    counters.serversCreated++;
    const startAfterCreate = body.start_after_create !== false;
    const create = startAction("create_server", server, { onSuccess: () => (server.status = startAfterCreate ? "starting" : "off") });
    const start = startAfterCreate
      ? [
          startAction("start_server", server, {
            after: create,
            onSuccess: () => (server.status = "running"),
            onError: () => (server.status = "off"),
          }),
        ]
      : [];
    // A failed create leaves a server that never started (and its start fails with it).
    create.onError = () => {
      server.status = "off";
      for (const a of start) a.fails = true;
    };
    const rootPassword = keys.length === 0 ? randomBytes(12).toString("base64url") : null;
    return {
      status: 201,
      body: { server: serverJson(server), action: actionJson(create), next_actions: start.map(actionJson), root_password: rootPassword },
    };
  });

  route("GET", "/servers/{id}", ([id]) => ({ status: 200, body: { server: serverJson(serverOf(id!)) } }));

  route("PUT", "/servers/{id}", ([id], _, body) => {
    const server = serverOf(id!);
    if (body?.name !== undefined) {
      if (typeof body.name !== "string" || !SERVER_NAME.test(body.name)) throw invalid("name must be a valid hostname (RFC 1123)", "name");
      if ([...servers.values()].some((s) => s.name === body.name && s.id !== server.id))
        throw new ApiError(409, "uniqueness_error", "server name is already used", { fields: [{ name: "name" }] });
    }
    const labelProblem = labelsProblem(body?.labels);
    if (labelProblem) throw invalid(labelProblem, "labels");
    if (body?.name !== undefined) server.name = body.name;
    if (body?.labels !== undefined) server.labels = { ...body.labels };
    return { status: 200, body: { server: serverJson(server) } };
  });

  route("DELETE", "/servers/{id}", ([id]) => {
    const server = serverOf(id!);
    assertUnlocked(server);
    const before = server.status;
    server.status = "deleting";
    const action = startAction("delete_server", server, {
      onSuccess: () => servers.delete(server.id),
      onError: () => (server.status = before),
    });
    return { status: 200, body: { action: actionJson(action) } };
  });

  const POWER: Record<string, { command: string; during?: HetznerServerStatus; after: HetznerServerStatus | "same" }> = {
    poweron: { command: "start_server", during: "starting", after: "running" },
    poweroff: { command: "stop_server", during: "stopping", after: "off" },
    shutdown: { command: "shutdown_server", during: "stopping", after: "off" },
    reboot: { command: "reboot_server", during: "starting", after: "running" },
    reset: { command: "reset_server", during: "starting", after: "running" },
  };

  route("POST", "/servers/{id}/actions/{action}", ([id, name]) => {
    const power = POWER[name!];
    if (!power) throw notFound(`action ${name}`);
    const server = serverOf(id!);
    assertUnlocked(server);
    const before = server.status;
    // Powering on a running server, or off one that is off, is an action with nothing to do.
    const noop = (name === "poweron" && before === "running") || ((name === "poweroff" || name === "shutdown") && before === "off");
    if (!noop && power.during) server.status = power.during;
    const action = startAction(power.command, server, {
      onSuccess: () => !noop && (server.status = power.after === "same" ? before : power.after),
      onError: () => (server.status = before),
    });
    return { status: 201, body: { action: actionJson(action) } };
  });

  const actionsOf = (serverId: number) =>
    [...actions.values()].filter((a) => a.resources.some((r) => r.type === "server" && r.id === serverId));
  const filterStatus = (list: Action[], query: URLSearchParams) => {
    const statuses = query.getAll("status");
    return statuses.length === 0 ? list : list.filter((a) => statuses.includes(a.status));
  };

  route("GET", "/servers/{id}/actions", ([id], query) => {
    serverOf(id!);
    return page("/actions", sorted(filterStatus(actionsOf(Number(id)), query).map(actionJson), query), query);
  });

  route("GET", "/servers/{id}/actions/{action_id}", ([id, actionId]) => {
    const action = actionsOf(serverOf(id!).id).find((a) => a.id === Number(actionId));
    if (!action) throw notFound("action");
    return { status: 200, body: { action: actionJson(action) } };
  });

  route("GET", "/actions/{id}", ([id]) => {
    const action = actions.get(Number(id));
    if (!action) throw notFound("action");
    return { status: 200, body: { action: actionJson(action) } };
  });

  route("GET", "/actions", (_, query) => {
    const ids = query.getAll("id").map(Number);
    // Listing every action of a project was removed from the API on 2025-01-30.
    if (ids.length === 0) throw invalid("the id filter is required", "id");
    const found = ids.map((id) => actions.get(id)).filter((a): a is Action => a !== undefined);
    return page("/actions", sorted(filterStatus(found, query).map(actionJson), query), query);
  });

  // ---- SSH keys
  route("GET", "/ssh_keys", (_, query) => {
    const selector = selectorOf(query);
    const name = query.get("name");
    const fingerprint = query.get("fingerprint");
    const found = [...sshKeys.values()].filter(
      (k) => (name === null || k.name === name) && (fingerprint === null || k.fingerprint === fingerprint) && matches(k.labels, selector),
    );
    return page("/ssh_keys", sorted(found, query), query);
  });

  route("POST", "/ssh_keys", (_, __, body) => {
    if (typeof body?.name !== "string" || body.name.length === 0) throw invalid("name is required", "name");
    const fingerprint = typeof body.public_key === "string" ? md5Fingerprint(body.public_key) : undefined;
    if (!fingerprint) throw invalid("public_key is not a valid OpenSSH public key", "public_key");
    const labelProblem = labelsProblem(body.labels);
    if (labelProblem) throw invalid(labelProblem, "labels");
    for (const k of sshKeys.values()) {
      if (k.name === body.name)
        throw new ApiError(409, "uniqueness_error", "SSH key with the same name already exists", { fields: [{ name: "name" }] });
      if (k.fingerprint === fingerprint)
        throw new ApiError(409, "uniqueness_error", "SSH key with the same fingerprint already exists", {
          fields: [{ name: "public_key" }],
        });
    }
    const key: SshKey = {
      id: nextKeyId++,
      name: body.name,
      fingerprint,
      public_key: body.public_key.trim(),
      labels: { ...body.labels },
      created: iso(Date.now()),
    };
    sshKeys.set(key.id, key);
    return { status: 201, body: { ssh_key: key } };
  });

  const keyOf = (id: string) =>
    sshKeys.get(Number(id)) ??
    (() => {
      throw notFound("SSH key");
    })();
  route("GET", "/ssh_keys/{id}", ([id]) => ({ status: 200, body: { ssh_key: keyOf(id!) } }));
  route("PUT", "/ssh_keys/{id}", ([id], _, body) => {
    const key = keyOf(id!);
    const labelProblem = labelsProblem(body?.labels);
    if (labelProblem) throw invalid(labelProblem, "labels");
    if (typeof body?.name === "string") key.name = body.name;
    if (body?.labels !== undefined) key.labels = { ...body.labels };
    return { status: 200, body: { ssh_key: key } };
  });
  route("DELETE", "/ssh_keys/{id}", ([id]) => {
    sshKeys.delete(keyOf(id!).id);
    return { status: 204 };
  });

  // ---- the catalogue
  const catalogue = <T extends { id: number; name: string }>(
    root: string,
    single: string,
    all: () => T[],
    filter: (item: T, q: URLSearchParams) => boolean = () => true,
  ) => {
    route("GET", `/${root}`, (_, query) => {
      const name = query.get("name");
      return page(
        `/${root}`,
        sorted(
          all().filter((i) => (name === null || i.name === name) && filter(i, query)),
          query,
        ),
        query,
      );
    });
    route("GET", `/${root}/{id}`, ([id]) => {
      const item = all().find((i) => i.id === Number(id));
      if (!item) throw notFound(single.replace(/_/g, " "));
      return { status: 200, body: { [single]: item } };
    });
  };
  catalogue("server_types", "server_type", () => SERVER_TYPES.map(serverTypeJson));
  catalogue(
    "images",
    "image",
    () => IMAGES.map(imageJson),
    (image, query) => {
      const types = query.getAll("type");
      const arch = query.get("architecture");
      const status = query.getAll("status");
      return (
        (types.length === 0 || types.includes(image.type)) &&
        (arch === null || image.architecture === arch) &&
        (status.length === 0 || status.includes(image.status))
      );
    },
  );
  catalogue("locations", "location", () => LOCATIONS);
  catalogue("datacenters", "datacenter", () => LOCATIONS.map(datacenterJson));

  // ---- the HTTP server
  async function respond(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const now = Date.now();
    const url = new URL(req.url ?? "/", "http://emulator");
    const path = url.pathname.replace(/^\/v1(?=\/)/, "").replace(/\/$/, "");
    const method = req.method ?? "GET";
    const matched = routes.map((r) => ({ r, m: r.method === method ? r.pattern.exec(path) : null })).find((x) => x.m);
    const name = matched?.r.name ?? `${method} ${path}`;
    counters.calls[name] = (counters.calls[name] ?? 0) + 1;

    let reply: Reply;
    let headers: Record<string, string> | undefined;
    refill(now);
    try {
      if (req.headers.authorization !== `Bearer ${token}`) {
        headers = rateHeaders(now);
        throw new ApiError(401, "unauthorized", "unable to authenticate");
      }
      if (bucket.tokens < 1) {
        counters.overLimit++;
        headers = rateHeaders(now);
        throw new ApiError(429, "rate_limit_exceeded", "limit of requests per hour reached");
      }
      if (fault("rateLimit", faults.rateLimitRate)) {
        // As though the bucket were spent: the headers say when it is full again.
        headers = rateHeaders(now, 0);
        throw new ApiError(429, "rate_limit_exceeded", "limit of requests per hour reached");
      }
      bucket.tokens -= 1;
      headers = rateHeaders(now);
      if (fault("serverError", faults.serverErrorRate)) throw new ApiError(503, "unavailable", "service temporarily unavailable");
      if (!matched) throw notFound("route");
      const text = await readBody(req);
      let body: unknown;
      if (text.length > 0) {
        try {
          body = JSON.parse(text);
        } catch {
          throw new ApiError(400, "json_error", "invalid JSON in request body");
        }
      }
      settle(now);
      reply = await matched.r.handle(matched.m!.slice(1).map(decodeURIComponent), url.searchParams, body);
    } catch (err) {
      headers ??= rateHeaders(now);
      reply =
        err instanceof ApiError
          ? { status: err.status, body: { error: { code: err.code, message: err.message, details: err.details } }, headers: err.headers }
          : { status: 500, body: { error: { code: "server_error", message: "internal server error", details: {} } } };
    }
    const out: Record<string, string> = { ...headers, ...reply.headers, "X-Correlation-Id": randomBytes(8).toString("hex") };
    if (reply.status === 204 || reply.body === undefined) {
      res.writeHead(reply.status, out).end();
      return;
    }
    const json = JSON.stringify(reply.body);
    res
      .writeHead(reply.status, { ...out, "Content-Type": "application/json", "Content-Length": String(Buffer.byteLength(json)) })
      .end(json);
  }

  const http = createServer((req, res) => {
    respond(req, res).catch(() => res.destroy());
  });
  await new Promise<void>((resolve) => http.listen(options.port ?? 0, options.host ?? "127.0.0.1", resolve));
  const address = http.address() as AddressInfo;
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const baseUrl = `http://${host}:${address.port}/v1`;

  return {
    url: baseUrl,
    token,
    counters,
    servers() {
      settle();
      return [...servers.values()].map((s) => ({
        id: s.id,
        name: s.name,
        status: s.status,
        labels: { ...s.labels },
        serverType: s.type.name,
        image: s.image.name,
        location: s.location.name,
        sshKeys: [...s.sshKeys],
        userData: s.userData,
      }));
    },
    userData: (serverId) => servers.get(serverId)?.userData,
    setFaults,
    setActionDurationMs: (ms) => void (actionDurationMs = ms),
    setRateLimit(rateLimit) {
      bucket = { ...rateLimit, tokens: rateLimit.limit, at: Date.now() };
    },
    setServerLimit: (limit) => void (serverLimit = limit),
    stop: () =>
      new Promise<void>((resolve) => {
        http.closeAllConnections();
        http.close(() => resolve());
      }),
  };
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY) {
        reject(new ApiError(413, "invalid_input", "request body too large"));
        req.destroy();
      } else chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}
