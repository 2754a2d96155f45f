// A Hetzner Robot webservice emulator for tests and `npm run dev`: SIMULATED, nothing here talks to
// Hetzner or powers a machine. It serves the parts of https://robot-ws.your-server.de that an adapter
// of already-rented dedicated servers uses, over real HTTP (node:http, 127.0.0.1, a random port),
// with the real API's paths, envelopes and errors (facts: ../shared/PROVIDERS.md §2):
//
//   GET  /server   GET|POST /server/{n} (server_name=)        list items carry fewer fields than one server
//   GET  /reset    GET|POST /reset/{n} (type=sw|hw|man|power|power_long)    POST /wol/{n}
//   GET  /boot/{n}   GET|POST|DELETE /boot/{n}/rescue (os=, authorized_key[]=<fingerprint>)
//   GET|POST /key (name=, data=)   GET|POST|DELETE /key/{fingerprint}
//
// HTTP Basic auth (401 UNAUTHORIZED), form-encoded bodies (arrays as `key[]=`), lists as arrays of
// wrapped objects, an empty list answered 404 (SERVER_NOT_FOUND, NOT_FOUND), errors as
// {"error":{status,code,message}} (INVALID_INPUT adds missing[]/invalid[]), per-endpoint hourly
// limits answered 403 RATE_LIMIT_EXCEEDED with max_request and interval (settable, so tests can
// spend them; a call refused is not counted against the window). Robot has no jobs: a reset is
// answered at once and its effect lands after the action duration (0 by default: by the next
// request). The emulator keeps each box's power and shows it as reset's `operating_status`
// ("running" / "off" for a box whose resetter has the power button types; "not supported"
// otherwise, the one value public fixtures show: the two power readings are this emulator's
// assumption). A rescue system armed on a box is booted at its next boot, with the keys it was
// armed with, and `active` flips back to false then. Faults (403 RATE_LIMIT_EXCEEDED, 503
// maintenance, 500 RESET_FAILED, 409 RESET_MANUAL_ACTIVE) are injected as a seeded share of calls
// or as the next N. `npm run dev -- --providers` starts one.
import { createHash, randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { seededRandom } from "../seeded-random.ts";

export type ResetType = "sw" | "hw" | "man" | "power" | "power_long";
/** A resetter with the power button (newer boxes): it can switch the box off and on, and reports its power. */
export const POWER_RESET_TYPES: ResetType[] = ["power", "power_long", "hw", "man"];
/** An older resetter: Ctrl-Alt-Del, the reset button, a technician; no power reading. */
export const LEGACY_RESET_TYPES: ResetType[] = ["sw", "hw", "man"];

/** A per-endpoint limit: at most `max` calls in any `intervalSeconds`. */
export interface RobotLimit {
  max: number;
  intervalSeconds: number;
}

/**
 * The hourly limits per endpoint ("METHOD /template"). Documented: GET /server 200, POST /reset 50,
 * POST /wol 10, boot 500, POST /key 200; the others are this emulator's assumption.
 */
export const ROBOT_LIMITS: Record<string, RobotLimit> = {
  "GET /server": { max: 200, intervalSeconds: 3600 },
  "GET /server/{n}": { max: 200, intervalSeconds: 3600 },
  "POST /server/{n}": { max: 200, intervalSeconds: 3600 },
  "GET /reset": { max: 500, intervalSeconds: 3600 },
  "GET /reset/{n}": { max: 500, intervalSeconds: 3600 },
  "POST /reset/{n}": { max: 50, intervalSeconds: 3600 },
  "POST /wol/{n}": { max: 10, intervalSeconds: 3600 },
  "GET /boot/{n}": { max: 500, intervalSeconds: 3600 },
  "GET /boot/{n}/rescue": { max: 500, intervalSeconds: 3600 },
  "POST /boot/{n}/rescue": { max: 500, intervalSeconds: 3600 },
  "DELETE /boot/{n}/rescue": { max: 500, intervalSeconds: 3600 },
  "GET /key": { max: 500, intervalSeconds: 3600 },
  "POST /key": { max: 200, intervalSeconds: 3600 },
  "GET /key/{fingerprint}": { max: 500, intervalSeconds: 3600 },
  "POST /key/{fingerprint}": { max: 200, intervalSeconds: 3600 },
  "DELETE /key/{fingerprint}": { max: 200, intervalSeconds: 3600 },
};

/**
 * What the emulator's products stand for. Robot reports no sizes (an account gives them to the
 * adapter): these are the products' published figures, threads as vCPUs, disks in GiB.
 */
export const EMULATED_PRODUCTS: Record<string, { vcpus: number; memoryMiB: number; diskGiB: number }> = {
  "AX41-NVMe": { vcpus: 12, memoryMiB: 65536, diskGiB: 953 },
  AX102: { vcpus: 32, memoryMiB: 131072, diskGiB: 3576 },
  EX44: { vcpus: 20, memoryMiB: 65536, diskGiB: 953 },
};

export interface RobotServerSpec {
  product?: string;
  dc?: string;
  name?: string;
  /** Default POWER_RESET_TYPES. */
  resetTypes?: ResetType[];
  /** Default "on". */
  power?: "on" | "off";
  cancelled?: boolean;
  /** Default "ready"; "in process" while Hetzner is still setting it up. */
  status?: "ready" | "in process";
  /** Wake-on-LAN available (default true). */
  wol?: boolean;
}

const DEFAULT_FLEET: RobotServerSpec[] = [
  { product: "AX41-NVMe", dc: "FSN1-DC14" },
  { product: "AX41-NVMe", dc: "FSN1-DC14" },
  { product: "AX41-NVMe", dc: "HEL1-DC7" },
  { product: "EX44", dc: "FSN1-DC14" },
  { product: "EX44", dc: "NBG1-DC3" },
  { product: "AX102", dc: "FSN1-DC14" },
];

export interface HetznerRobotFaults {
  /** Share (0..1) of authenticated calls answered 403 RATE_LIMIT_EXCEEDED (with the endpoint's max_request and interval). */
  rateLimitRate?: number;
  /** Share of authenticated calls answered 503 (maintenance), before anything is done. */
  maintenanceRate?: number;
  /** Share of POST /reset/{n} answered 500 RESET_FAILED (nothing reset). */
  resetFailedRate?: number;
  /** Share of POST /reset/{n} answered 409 RESET_MANUAL_ACTIVE (nothing reset). */
  manualActiveRate?: number;
  /** The next N calls answered with each fault, before any share applies. */
  next?: { rateLimit?: number; maintenance?: number; resetFailed?: number; manualActive?: number };
  /** Seed of the generator that draws the shares (default 1). */
  seed?: number;
}

export interface HetznerRobotEmulatorOptions {
  /** The webservice user and its password (default "#ws+emulator" / "robot-emulator-password"). */
  user?: string;
  password?: string;
  /** The account's servers: how many of the default fleet (cycled), or each one (default 6). */
  servers?: number | RobotServerSpec[];
  /** How long a boot or an ACPI shutdown takes, in ms (default 0: done by the next request). */
  actionDurationMs?: number;
  /** Overrides of ROBOT_LIMITS. */
  limits?: Record<string, RobotLimit>;
  faults?: HetznerRobotFaults;
  /** The root password a rescue activation answers with (default random); a test fixes it to redact it. */
  rescuePassword?: () => string;
  host?: string;
  port?: number;
}

/** What a box runs: the rescue system it booted (with the keys it was armed with), its disks, or nothing. */
export type RunningSystem = { system: "rescue"; keys: string[] } | { system: "disk" } | null;

/** A server as the emulator holds it. */
export interface EmulatedRobotServer {
  number: number;
  name: string;
  product: string;
  dc: string;
  ip: string;
  ipv6Net: string;
  status: "ready" | "in process";
  cancelled: boolean;
  resetTypes: ResetType[];
  wol: boolean;
  power: "on" | "off";
  /** null while off or booting. */
  running: RunningSystem;
  rescue: { active: boolean; os: string | null; keys: string[]; password: string | null };
  /** Every reset and wake-on-LAN the box was given, in order. */
  resets: (ResetType | "wol")[];
}

export interface EmulatedKey {
  name: string;
  fingerprint: string;
  type: string;
  size: number;
  data: string;
  created_at: string;
}

export interface HetznerRobotEmulator {
  /** The webservice base, e.g. http://127.0.0.1:41234 (what robot-ws.your-server.de is). */
  url: string;
  user: string;
  password: string;
  counters: {
    /** Calls per endpoint ("POST /reset/{n}"), refused ones included. */
    calls: Record<string, number>;
    /** Calls per endpoint that found its window spent (answered 403 RATE_LIMIT_EXCEEDED, not injected). */
    overLimit: Record<string, number>;
    /** Answers per injected fault: rateLimit, maintenance, resetFailed, manualActive. */
    faults: Record<string, number>;
    /** Calls answered 401. */
    unauthorized: number;
  };
  /** The account's servers, after applying every effect that is due. */
  servers(): EmulatedRobotServer[];
  keys(): EmulatedKey[];
  /** The most calls an endpoint accepted within any one of its windows (never above its max). */
  busiestWindow(endpoint: string): number;
  setFaults(faults: HetznerRobotFaults): void;
  setActionDurationMs(ms: number): void;
  setLimits(limits: Record<string, RobotLimit>): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------- SSH keys (the real fingerprint)

/** Parses an OpenSSH public key line: Robot's type name, size in bits and MD5 fingerprint of the blob. */
export function sshKeyFacts(line: string): { type: string; size: number; fingerprint: string; data: string } | undefined {
  const [algorithm, base64] = line.trim().split(/\s+/);
  if (!algorithm || !base64 || !/^[A-Za-z0-9+/]+={0,2}$/.test(base64)) return undefined;
  const blob = Buffer.from(base64, "base64");
  const fields: Buffer[] = [];
  for (let at = 0; at + 4 <= blob.length;) {
    const length = blob.readUInt32BE(at);
    if (at + 4 + length > blob.length) return undefined;
    fields.push(blob.subarray(at + 4, at + 4 + length));
    at += 4 + length;
  }
  if (fields[0]?.toString() !== algorithm) return undefined;
  let type: string;
  let size: number;
  if (algorithm === "ssh-ed25519") [type, size] = ["ED25519", 256];
  else if (algorithm === "ssh-rsa" && fields[2]) {
    const modulus = fields[2][0] === 0 ? fields[2].subarray(1) : fields[2];
    [type, size] = ["RSA", modulus.length * 8 - Math.clz32(modulus[0] ?? 0) + 24];
  } else if (/^ecdsa-sha2-nistp(256|384|521)$/.test(algorithm)) [type, size] = ["ECDSA", Number(algorithm.slice(-3))];
  else return undefined;
  const md5 = createHash("md5").update(blob).digest("hex");
  return { type, size, fingerprint: md5.match(/../g)!.join(":"), data: line.trim() };
}

// ---------------------------------------------------------------- the emulator

interface Box extends EmulatedRobotServer {
  /** Bumped by every power change, so a boot or shutdown scheduled before it does not land. */
  generation: number;
  manualUntil: number;
}

interface Effect {
  at: number;
  box: Box;
  generation: number;
  apply(): void;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly extra: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

const notFound = (code = "NOT_FOUND", message = "Not found") => new HttpError(404, code, message);
const invalidInput = (missing: string[] | null, invalid: string[] | null) =>
  new HttpError(400, "INVALID_INPUT", "invalid input", { missing, invalid });

/** "POST /reset/{n}" for POST /reset/2451003. */
function endpointOf(method: string, segments: string[]): string {
  const [head, id, tail] = segments;
  if (!head) return `${method} /`;
  const template = head === "key" ? "{fingerprint}" : "{n}";
  return `${method} /${[head, ...(id !== undefined ? [template] : []), ...(tail !== undefined ? [tail] : [])].join("/")}`;
}

const robotTime = (ms: number) => new Date(ms).toISOString().slice(0, 19).replace("T", " ");

export async function startHetznerRobotEmulator(options: HetznerRobotEmulatorOptions = {}): Promise<HetznerRobotEmulator> {
  const user = options.user ?? "#ws+emulator";
  const password = options.password ?? "robot-emulator-password";
  const expectedAuth = `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;
  const rescuePassword = options.rescuePassword ?? (() => randomBytes(9).toString("base64url"));
  let actionDurationMs = options.actionDurationMs ?? 0;
  let limits: Record<string, RobotLimit> = { ...ROBOT_LIMITS, ...options.limits };
  let faults: HetznerRobotFaults = {};
  let random = seededRandom(1);
  const next = { rateLimit: 0, maintenance: 0, resetFailed: 0, manualActive: 0 };
  const setFaults = (f: HetznerRobotFaults) => {
    faults = f;
    random = seededRandom(f.seed ?? 1);
    Object.assign(next, { rateLimit: 0, maintenance: 0, resetFailed: 0, manualActive: 0 }, f.next);
  };
  setFaults(options.faults ?? {});

  const counters: HetznerRobotEmulator["counters"] = { calls: {}, overLimit: {}, faults: {}, unauthorized: 0 };
  /** Accepted calls per endpoint (ms), for the sliding windows. */
  const accepted = new Map<string, number[]>();
  const busiest = new Map<string, number>();
  const keys = new Map<string, EmulatedKey>();
  let effects: Effect[] = [];

  const specs = Array.isArray(options.servers)
    ? options.servers
    : Array.from({ length: options.servers ?? 6 }, (_, i) => DEFAULT_FLEET[i % DEFAULT_FLEET.length]!);
  const boxes: Box[] = specs.map((spec, i) => ({
    number: 2451001 + i,
    name: spec.name ?? "",
    product: spec.product ?? "AX41-NVMe",
    dc: spec.dc ?? "FSN1-DC14",
    ip: `136.243.${10 + Math.floor(i / 250)}.${(i % 250) + 1}`,
    ipv6Net: `2a01:4f8:211:${(0x1a00 + i).toString(16)}::`,
    status: spec.status ?? "ready",
    cancelled: spec.cancelled ?? false,
    resetTypes: [...(spec.resetTypes ?? POWER_RESET_TYPES)],
    wol: spec.wol ?? true,
    power: spec.power ?? "on",
    running: (spec.power ?? "on") === "on" ? { system: "disk" } : null,
    rescue: { active: false, os: null, keys: [], password: null },
    resets: [],
    generation: 0,
    manualUntil: 0,
  }));

  // -------------------------------------------------------------- time: boots and shutdowns land when due

  const schedule = (box: Box, apply: () => void) =>
    effects.push({ at: Date.now() + actionDurationMs, box, generation: box.generation, apply });

  function settle(): void {
    const now = Date.now();
    const due = effects.filter((e) => e.at <= now);
    effects = effects.filter((e) => e.at > now);
    for (const e of due.sort((a, b) => a.at - b.at)) if (e.box.generation === e.generation) e.apply();
  }

  /** The box (powered) starts its boot: the armed rescue system, or its disks. */
  function boot(box: Box): void {
    box.generation++;
    box.power = "on";
    box.running = null;
    schedule(box, () => {
      if (box.rescue.active) {
        box.running = { system: "rescue", keys: [...box.rescue.keys] };
        box.rescue = { active: false, os: null, keys: [], password: null };
      } else box.running = { system: "disk" };
    });
  }

  function switchOff(box: Box): void {
    box.generation++;
    box.power = "off";
    box.running = null;
  }

  function reset(box: Box, type: ResetType | "wol"): void {
    box.resets.push(type);
    const on = box.power === "on";
    switch (type) {
      case "sw":
      case "hw":
        // Ctrl-Alt-Del and the reset button do nothing to a box that is off.
        if (on) boot(box);
        break;
      case "man":
        // A technician power-cycles the box; until then another reset is refused.
        box.manualUntil = Date.now() + actionDurationMs;
        box.generation++;
        schedule(box, () => boot(box));
        break;
      case "power":
        // The power button: ACPI shutdown of a running box (the OS takes its time), or on.
        if (on) schedule(box, () => switchOff(box));
        else boot(box);
        break;
      case "power_long":
        if (on) switchOff(box);
        break;
      case "wol":
        if (!on) boot(box);
        break;
    }
  }

  // -------------------------------------------------------------- views (the field sets of the real answers)

  const listView = (b: Box) => ({
    server_ip: b.ip,
    server_ipv6_net: b.ipv6Net,
    server_number: b.number,
    server_name: b.name,
    product: b.product,
    dc: b.dc,
    traffic: "unlimited",
    status: b.status,
    cancelled: b.cancelled,
    paid_until: "2030-12-31",
    ip: [b.ip],
    subnet: [{ ip: b.ipv6Net, mask: "64" }],
  });
  const detailView = (b: Box) => ({
    ...listView(b),
    reset: true,
    rescue: true,
    vnc: true,
    windows: false,
    plesk: false,
    cpanel: false,
    wol: b.wol,
    hot_swap: false,
    linked_storagebox: null,
  });
  const operatingStatus = (b: Box) => (b.resetTypes.includes("power") ? (b.power === "on" ? "running" : "off") : "not supported");
  const resetView = (b: Box) => ({
    server_ip: b.ip,
    server_ipv6_net: b.ipv6Net,
    server_number: b.number,
    type: [...b.resetTypes],
    operating_status: operatingStatus(b),
  });
  const keyRef = (fingerprint: string) => {
    const k = keys.get(fingerprint);
    return { key: { name: k?.name ?? "", fingerprint, type: k?.type ?? "", size: k?.size ?? 0 } };
  };
  // Options (arrays) while inactive, the chosen values while active.
  const rescueView = (b: Box) => ({
    server_ip: b.ip,
    server_ipv6_net: b.ipv6Net,
    server_number: b.number,
    os: b.rescue.active ? b.rescue.os : ["linux", "vkvm"],
    arch: b.rescue.active ? 64 : [64],
    active: b.rescue.active,
    password: b.rescue.password,
    authorized_key: b.rescue.keys.map(keyRef),
    host_key: [],
    boot_time: null,
  });

  // -------------------------------------------------------------- the handlers

  const boxOf = (id: string | undefined) => {
    const box = /^\d+$/.test(id ?? "") ? boxes.find((b) => b.number === Number(id)) : undefined;
    if (!box) throw notFound("SERVER_NOT_FOUND", "server not found");
    return box;
  };
  const keyOf = (fingerprint: string | undefined) => {
    const key = keys.get(fingerprint ?? "");
    if (!key) throw notFound("NOT_FOUND", "key not found");
    return key;
  };

  function handle(method: string, segments: string[], form: URLSearchParams): { status?: number; body: unknown } {
    const [head, id, tail] = segments;
    const route = `${method} ${head ?? ""}${id !== undefined ? "/:id" : ""}${tail !== undefined ? `/${tail}` : ""}`;
    switch (route) {
      case "GET server": {
        if (boxes.length === 0) throw notFound("SERVER_NOT_FOUND", "No servers found");
        return { body: boxes.map((b) => ({ server: listView(b) })) };
      }
      case "GET server/:id":
        return { body: { server: detailView(boxOf(id)) } };
      case "POST server/:id": {
        const box = boxOf(id);
        const name = form.get("server_name");
        if (name === null) throw invalidInput(["server_name"], null);
        if (name.length > 100) throw invalidInput(null, ["server_name"]);
        box.name = name;
        return { body: { server: detailView(box) } };
      }
      case "GET reset":
        if (boxes.length === 0) throw notFound("RESET_NOT_AVAILABLE", "No reset available");
        return { body: boxes.map((b) => ({ reset: resetView(b) })) };
      case "GET reset/:id":
        return { body: { reset: resetView(boxOf(id)) } };
      case "POST reset/:id": {
        const box = boxOf(id);
        const type = form.get("type");
        if (!type) throw invalidInput(["type"], null);
        if (!box.resetTypes.includes(type as ResetType)) throw invalidInput(null, ["type"]);
        if (box.manualUntil > Date.now()) throw new HttpError(409, "RESET_MANUAL_ACTIVE", "There is already a running manual reset");
        reset(box, type as ResetType);
        return { body: { reset: { server_ip: box.ip, server_ipv6_net: box.ipv6Net, server_number: box.number, type } } };
      }
      case "POST wol/:id": {
        const box = boxOf(id);
        if (!box.wol) throw notFound("WOL_NOT_AVAILABLE", "Wake On LAN not available for this server");
        reset(box, "wol");
        return { body: { wol: { server_ip: box.ip, server_ipv6_net: box.ipv6Net, server_number: box.number } } };
      }
      case "GET boot/:id": {
        const box = boxOf(id);
        return { body: { boot: { rescue: rescueView(box), linux: null, vnc: null, windows: null, plesk: null, cpanel: null } } };
      }
      case "GET boot/:id/rescue":
        return { body: { rescue: rescueView(boxOf(id)) } };
      case "POST boot/:id/rescue": {
        const box = boxOf(id);
        const os = form.get("os");
        if (!os) throw invalidInput(["os"], null);
        if (!["linux", "vkvm"].includes(os)) throw invalidInput(null, ["os"]);
        const fingerprints = [...form.getAll("authorized_key[]"), ...form.getAll("authorized_key")];
        if (fingerprints.some((f) => !keys.has(f))) throw invalidInput(null, ["authorized_key"]);
        if (box.rescue.active) throw new HttpError(409, "BOOT_ALREADY_ENABLED", "A boot option is already active");
        box.rescue = { active: true, os, keys: [...new Set(fingerprints)], password: rescuePassword() };
        return { body: { rescue: rescueView(box) } };
      }
      case "DELETE boot/:id/rescue": {
        const box = boxOf(id);
        box.rescue = { active: false, os: null, keys: [], password: null };
        return { body: { rescue: rescueView(box) } };
      }
      case "GET key":
        if (keys.size === 0) throw notFound("NOT_FOUND", "No keys found");
        return { body: [...keys.values()].map((key) => ({ key })) };
      case "POST key": {
        const name = form.get("name");
        const data = form.get("data");
        const missing = [...(name ? [] : ["name"]), ...(data ? [] : ["data"])];
        if (missing.length) throw invalidInput(missing, null);
        const facts = sshKeyFacts(data!);
        if (!facts) throw invalidInput(null, ["data"]);
        // Uniqueness is by the key itself: the same key under another name is a conflict.
        if (keys.has(facts.fingerprint)) throw new HttpError(409, "KEY_ALREADY_EXISTS", "The key already exists");
        const key = { name: name!, ...facts, created_at: robotTime(Date.now()) };
        keys.set(key.fingerprint, key);
        return { status: 201, body: { key } };
      }
      case "GET key/:id":
        return { body: { key: keyOf(id) } };
      case "POST key/:id": {
        const key = keyOf(id);
        const name = form.get("name");
        if (!name) throw invalidInput(["name"], null);
        key.name = name;
        return { body: { key } };
      }
      case "DELETE key/:id":
        keyOf(id);
        keys.delete(id!);
        return { body: null };
      default:
        throw notFound();
    }
  }

  // -------------------------------------------------------------- limits and faults

  /** Spends one call of the endpoint's window, or says the window is spent. */
  function spend(endpoint: string): RobotLimit | undefined {
    const limit = limits[endpoint];
    if (!limit) return undefined;
    const now = Date.now();
    const window = (accepted.get(endpoint) ?? []).filter((t) => t > now - limit.intervalSeconds * 1000);
    if (window.length >= limit.max) {
      accepted.set(endpoint, window);
      return limit;
    }
    window.push(now);
    accepted.set(endpoint, window);
    busiest.set(endpoint, Math.max(busiest.get(endpoint) ?? 0, window.length));
    return undefined;
  }

  const rateLimited = (limit: RobotLimit) =>
    new HttpError(403, "RATE_LIMIT_EXCEEDED", "Rate limit exceeded", { max_request: limit.max, interval: limit.intervalSeconds });

  function draw(fault: keyof typeof next, rate: number | undefined): boolean {
    const hit = next[fault] > 0 ? (next[fault]--, true) : random() < (rate ?? 0);
    if (hit) counters.faults[fault] = (counters.faults[fault] ?? 0) + 1;
    return hit;
  }

  function injectFault(endpoint: string): void {
    if (draw("rateLimit", faults.rateLimitRate)) throw rateLimited(limits[endpoint] ?? { max: 200, intervalSeconds: 3600 });
    if (draw("maintenance", faults.maintenanceRate))
      throw new HttpError(503, "MAINTENANCE", "The webservice is currently unavailable because of maintenance work");
    if (endpoint !== "POST /reset/{n}") return;
    if (draw("manualActive", faults.manualActiveRate))
      throw new HttpError(409, "RESET_MANUAL_ACTIVE", "There is already a running manual reset");
    if (draw("resetFailed", faults.resetFailedRate)) throw new HttpError(500, "RESET_FAILED", "Resetting failed due to an internal error");
  }

  // -------------------------------------------------------------- HTTP

  const send = (res: ServerResponse, status: number, body: unknown) => {
    const text = body === null ? "" : JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text) });
    res.end(text);
  };

  async function serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://robot.invalid");
    const method = req.method ?? "GET";
    const segments = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
    const endpoint = endpointOf(method, segments);
    counters.calls[endpoint] = (counters.calls[endpoint] ?? 0) + 1;
    let raw = "";
    for await (const chunk of req) raw += chunk;
    try {
      if (req.headers.authorization !== expectedAuth) {
        counters.unauthorized++;
        res.setHeader("www-authenticate", 'Basic realm="Webservice"');
        throw new HttpError(401, "UNAUTHORIZED", "Unauthorized");
      }
      injectFault(endpoint);
      const spent = spend(endpoint);
      if (spent) {
        counters.overLimit[endpoint] = (counters.overLimit[endpoint] ?? 0) + 1;
        throw rateLimited(spent);
      }
      settle();
      const answer = handle(method, segments, new URLSearchParams(method === "GET" ? url.search : raw));
      send(res, answer.status ?? 200, answer.body);
    } catch (err) {
      if (!(err instanceof HttpError)) throw err;
      send(res, err.status, { error: { status: err.status, code: err.code, message: err.message, ...err.extra } });
    }
  }

  const server = createServer((req, res) => {
    serve(req, res).catch((err: unknown) => send(res, 500, { error: { status: 500, code: "INTERNAL_ERROR", message: String(err) } }));
  });
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, options.host ?? "127.0.0.1", resolve));
  const { address, port } = server.address() as AddressInfo;
  const host = address.includes(":") ? `[${address}]` : address;

  const copy = (b: Box): EmulatedRobotServer => {
    const { generation: _g, manualUntil: _m, ...view } = structuredClone(b);
    return view;
  };

  return {
    url: `http://${host}:${port}`,
    user,
    password,
    counters,
    servers() {
      settle();
      return boxes.map(copy);
    },
    keys: () => [...keys.values()].map((k) => ({ ...k })),
    busiestWindow: (endpoint) => busiest.get(endpoint) ?? 0,
    setFaults,
    setActionDurationMs(ms) {
      actionDurationMs = ms;
    },
    setLimits(l) {
      limits = { ...limits, ...l };
    },
    stop: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((err) => (err ? reject(err) : resolve()));
      }),
  };
}
