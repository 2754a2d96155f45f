// The Hetzner Robot provider (better-compute/hetzner-robot): dedicated servers the account already
// rents, ADOPTED as instances and released again. It never orders or cancels a server: an instance
// is a free box of the account, claimed by renaming it (server_name carries the instance id, Robot
// has no labels), booted once into Hetzner's rescue system with the tenant's SSH keys, and on
// delete switched off and renamed free. Facts of the API: ../shared/PROVIDERS.md §2.
//
// Robot has no jobs: a reset is "triggered", so no call returns an Operation and the state is read
// back instead. The box's power is reset's `operating_status` (boxes whose resetter has the power
// button types); the rescue system's `active` flag says a boot into it is still pending. A create
// takes several calls, so its claim is written in two steps: `bc-claim:<instance> <host>` first,
// `bc:<instance> <host>` once the box was reset into its rescue system. find() returns a claim a
// create cut short as `incomplete`, so the next create() on the same box finishes it (or delete()
// frees it).
import { z } from "zod";
import { base64, utf8 } from "better-compute/core";
import {
  defineProvider,
  ProviderHttp,
  providerError,
  type Classified,
  type Fetch,
  type ProviderClient,
  type ProviderServer,
  type ServerStatus,
} from "better-compute/vps";

export const PROVIDER = "hetzner-robot";
/** The one image: Hetzner's rescue system, booted once with the tenant's keys (install an OS from it with installimage). */
export const RESCUE_IMAGE = "rescue-linux";
/** The name a released server gets: free for the next instance. */
export const FREE_NAME = "bc-free";

const product = z.object({
  vcpus: z.number().int().positive(),
  memoryMiB: z.number().int().positive(),
  diskGiB: z.number().int().positive(),
});

const account = z.object({
  endpoint: z.url({ protocol: /^https?$/ }).default("https://robot-ws.your-server.de"),
  /** The webservice user (Robot: Settings, Webservice and app settings), not the Robot login. */
  user: z.string().min(1).max(256),
  password: z.string().min(1).max(256),
  /** The server numbers the control plane may claim; without it, any unclaimed server of the account. */
  servers: z.array(z.number().int().positive()).min(1).optional(),
  /** Sizes per product (Robot reports none): only products listed here are offered. */
  products: z.record(z.string().min(1), product).default({}),
});

// ---------------------------------------------------------------- the stamp in server_name

/** The stamp a server_name carries: `bc:<instance> <host>`, or `bc-claim:<instance> <host>` while the create runs. */
export function stampOf(serverName: string): { instanceId: string; name: string; finished: boolean } | undefined {
  const m = /^bc(-claim)?:(\S+) (\S+)$/.exec(serverName);
  return m ? { instanceId: m[2]!, name: m[3]!, finished: !m[1] } : undefined;
}

const stamp = (instanceId: string, name: string, finished: boolean) => `${finished ? "bc" : "bc-claim"}:${instanceId} ${name}`;

// ---------------------------------------------------------------- Robot's answers

export interface RobotServer {
  server_ip: string | null;
  server_number: number;
  server_name: string;
  product: string;
  dc: string;
  status: string;
  cancelled: boolean;
  ip?: string[] | null;
  wol?: boolean;
}

export interface RobotReset {
  server_number: number;
  type: string[] | string;
  operating_status?: string;
}

interface RobotError {
  status?: number;
  code?: string;
  message?: string;
  interval?: number;
}

function classify(response: Response, body: unknown): Classified {
  const error = (body as { error?: RobotError } | null)?.error;
  const code = error?.code ?? `HTTP_${response.status}`;
  const message = `${error?.message ?? (response.statusText || "no message")} (${code})`;
  const refused = (extra: Partial<Classified> = {}): Classified => ({
    failure: "transient",
    refused: true,
    reason: code,
    message,
    ...extra,
  });
  if (response.status === 401) return { failure: "config", reason: code, message };
  // Robot says how long the window is but not when it resets: wait a whole one. A 403 without an
  // error body is read as the limit too (as hrobot-go's users do).
  if (code === "RATE_LIMIT_EXCEEDED" || (response.status === 403 && !error?.code))
    return refused({ reason: "RATE_LIMIT_EXCEEDED", retryAfterSeconds: error?.interval ?? 3600 });
  if (response.status === 403) return { failure: "config", reason: code, message };
  // Nothing was done: maintenance, a reset that failed inside Hetzner, a technician resetting the box.
  if (response.status === 503 || code === "RESET_FAILED" || code === "RESET_MANUAL_ACTIVE") return refused();
  if (response.status >= 500) return { failure: "transient", reason: code, message };
  return { failure: "rejected", reason: code, message };
}

/** What the box's power reading says; "unknown" for a resetter without the power button ("not supported"). */
export function powerOf(reset: RobotReset | undefined): "on" | "off" | "unknown" {
  const status = reset?.operating_status?.toLowerCase() ?? "";
  if (/^(running|on|powered on)$/.test(status)) return "on";
  if (/\b(off|shut|stopped)\b/.test(status)) return "off";
  return "unknown";
}

export const typesOf = (reset: RobotReset) => (Array.isArray(reset.type) ? reset.type : [reset.type]);

/** OpenSSH one-line key: its type and blob, which identify it (Robot's fingerprint is the blob's MD5). */
function keyBlob(publicKey: string): string | undefined {
  const [type, blob] = publicKey.trim().split(/\s+/);
  return type && blob && /^[A-Za-z0-9+/]+={0,2}$/.test(blob) ? `${type} ${blob}` : undefined;
}

function basicAuth(user: string, password: string): string {
  return `Basic ${base64(utf8(`${user}:${password}`))}`;
}

/** The Robot webservice as one webservice user: Basic auth, Robot's errors classified, the password kept out of every error. */
/**
 * Arms the rescue system (Linux) of server n with these key fingerprints; one already armed (by an
 * earlier try, or by hand: BOOT_ALREADY_ENABLED) is replaced. False when another boot option stays active.
 * The answer carries a root password: it is never returned (root logs in with the keys).
 */
export async function armRescue(http: ProviderHttp, n: number, fingerprints: string[]): Promise<boolean> {
  const arm = () => http.request("POST", `/boot/${n}/rescue`, { form: { os: "linux", "authorized_key[]": fingerprints }, accept: [409] });
  if ((await arm()).status !== 409) return true;
  await http.request("DELETE", `/boot/${n}/rescue`);
  return (await arm()).status !== 409;
}

export function robotHttp(endpoint: string, user: string, password: string, fetch: Fetch): ProviderHttp {
  return new ProviderHttp({
    provider: PROVIDER,
    baseUrl: endpoint,
    fetch,
    headers: { authorization: basicAuth(user, password) },
    secrets: [password],
    classify,
  });
}

const rejected = (message: string, reason: string) => providerError(PROVIDER, "rejected", message, { reason });

export const hetznerRobotProvider = defineProvider({
  id: PROVIDER,
  version: "1",
  description: "Hetzner Robot dedicated servers the account rents, adopted as instances (rescue system with the tenant's keys)",
  manifest: account,
  secretFields: ["password"],
  client(acct, { fetch }): ProviderClient {
    const http = robotHttp(acct.endpoint, acct.user, acct.password, fetch);
    const allowed = acct.servers ? new Set(acct.servers) : undefined;

    /** Robot answers an empty list with 404. */
    async function listServers(): Promise<RobotServer[]> {
      const res = await http.request<{ server: RobotServer }[]>("GET", "/server", { accept: [404] });
      return res.status === 404 ? [] : res.body.map((s) => s.server);
    }

    async function readServer(n: number): Promise<RobotServer | undefined> {
      const res = await http.request<{ server: RobotServer }>("GET", `/server/${n}`, { accept: [404] });
      return res.status === 404 ? undefined : res.body.server;
    }

    async function readReset(n: number): Promise<RobotReset | undefined> {
      const res = await http.request<{ reset: RobotReset }>("GET", `/reset/${n}`, { accept: [404] });
      return res.status === 404 ? undefined : res.body.reset;
    }

    const rename = (n: number, serverName: string) => http.request("POST", `/server/${n}`, { form: { server_name: serverName } });
    const pressReset = (n: number, type: string) => http.request("POST", `/reset/${n}`, { form: { type } });

    const view = (s: RobotServer, status: ServerStatus): ProviderServer => {
      const st = stampOf(s.server_name)!;
      const addresses = s.ip?.length ? s.ip : s.server_ip ? [s.server_ip] : [];
      return {
        id: String(s.server_number),
        instanceId: st.instanceId,
        name: st.name,
        status,
        addresses,
        ...(st.finished ? {} : { incomplete: true }),
      };
    };

    /**
     * The status of a claimed server: a claim still being made is creating; then the power reading
     * (stopped when off) and, while on, the rescue flag (a boot into it pending: starting). A box
     * without a power reading that the adapter never switched off is read as on.
     */
    async function statusOf(s: RobotServer): Promise<ServerStatus> {
      if (!stampOf(s.server_name)!.finished) return "creating";
      if (powerOf(await readReset(s.server_number)) === "off") return "stopped";
      const rescue = await http.request<{ rescue: { active: boolean } }>("GET", `/boot/${s.server_number}/rescue`, { accept: [404] });
      return rescue.status !== 404 && rescue.body.rescue.active ? "starting" : "running";
    }

    /** The server, if it exists and carries a claim; anything else is not this control plane's to touch. */
    async function claimed(id: string): Promise<RobotServer | undefined> {
      if (!/^\d{1,12}$/.test(id)) return undefined;
      const s = await readServer(Number(id));
      return s && stampOf(s.server_name) ? s : undefined;
    }

    async function mustBeClaimed(id: string): Promise<RobotServer> {
      const s = await claimed(id);
      if (!s) throw providerError(PROVIDER, "rejected", `server ${id} does not exist or is not an instance's`, { reason: "not_found" });
      return s;
    }

    /** The Robot fingerprints of the keys, uploading those the account does not have (one key is kept once, under any name). */
    async function ensureKeys(sshKeys: { name: string; publicKey: string }[]): Promise<string[]> {
      const listKeys = async () => {
        const res = await http.request<{ key: { fingerprint: string; data: string } }[]>("GET", "/key", { accept: [404] });
        const known = new Map<string, string>();
        if (res.status !== 404) for (const { key } of res.body) known.set(keyBlob(key.data) ?? key.data, key.fingerprint);
        return known;
      };
      let known = await listKeys();
      const fingerprints: string[] = [];
      for (const key of sshKeys) {
        const blob = keyBlob(key.publicKey)!;
        let fingerprint = known.get(blob);
        if (!fingerprint) {
          const res = await http.request<{ key: { fingerprint: string } }>("POST", "/key", {
            form: { name: key.name, data: key.publicKey.trim() },
            accept: [409],
          });
          // 409 KEY_ALREADY_EXISTS: it was added since the list was read.
          if (res.status === 409) fingerprint = (known = await listKeys()).get(blob);
          else fingerprint = res.body.key.fingerprint;
          if (!fingerprint) throw rejected(`Robot refused the SSH key ${JSON.stringify(key.name)} and does not list it`, "key_conflict");
        }
        fingerprints.push(fingerprint);
      }
      return fingerprints;
    }

    /** Switches a box on: the power button when it is known off, else wake-on-LAN (harmless to a box that is on). */
    async function switchOn(s: RobotServer, reset: RobotReset | undefined): Promise<void> {
      const power = powerOf(reset);
      if (power === "on") return;
      if (power === "off" && reset && typesOf(reset).includes("power")) await pressReset(s.server_number, "power");
      else await http.request("POST", `/wol/${s.server_number}`);
    }

    /** The instance's box: its finished claim, else one a create cut short (incomplete: create() again finishes it). */
    async function findClaim(instanceId: string): Promise<RobotServer | undefined> {
      const mine = (await listServers()).filter((s) => stampOf(s.server_name)?.instanceId === instanceId);
      return mine.find((s) => stampOf(s.server_name)!.finished) ?? mine[0];
    }

    return {
      async offers() {
        const free = (await listServers()).filter((s) => isFree(s, allowed) && acct.products[s.product]);
        const dcsOf = (p: string) => [...new Set(free.filter((s) => s.product === p).map((s) => s.dc))].sort();
        return {
          flavors: [...new Set(free.map((s) => s.product))]
            .sort()
            .map((p) => ({ id: p, name: p, ...acct.products[p]!, locations: dcsOf(p) })),
          images: [{ id: RESCUE_IMAGE, name: "Hetzner rescue system (Linux), booted once with the tenant's SSH keys" }],
          locations: [...new Set(free.map((s) => s.dc))].sort().map((dc) => ({ id: dc, name: dc })),
        };
      },

      async create(request) {
        // Robot has no user data: refuse what it cannot deliver rather than start a box that silently lacks it.
        if (request.userData !== undefined && !saysOnlyHostnameAndKeys(request.userData))
          throw rejected("Robot has no user data (cloud-init): it takes a hostname and SSH keys, nothing more", "user_data_unsupported");
        if (request.image !== RESCUE_IMAGE)
          throw rejected(`unknown image ${JSON.stringify(request.image)}: the one image is ${RESCUE_IMAGE}`, "invalid_image");
        if (request.sshKeys.length === 0)
          throw rejected("the rescue system is reached with SSH keys only: give at least one", "no_ssh_key");
        if (request.sshKeys.some((k) => !keyBlob(k.publicKey)))
          throw rejected("an SSH key is not an OpenSSH public key line", "invalid_ssh_key");
        const hostname = request.hostname ?? request.name;
        if (/\s/.test(request.instanceId) || !/^\S+$/.test(hostname))
          throw rejected("the instance id and the name take no spaces", "invalid_name");

        const servers = await listServers();
        const mine = servers.filter((s) => stampOf(s.server_name)?.instanceId === request.instanceId);
        const finished = mine.find((s) => stampOf(s.server_name)!.finished);
        if (finished) return { server: view(finished, await statusOf(finished)) };

        // A claim of this instance that a create cut short is finished; otherwise a free box is claimed.
        let target = mine[0];
        if (!target) {
          target = servers
            .filter((s) => isFree(s, allowed) && s.product === request.flavor && (!request.location || s.dc === request.location))
            .sort((a, b) => a.server_number - b.server_number)[0];
          const where = request.location ? ` in ${request.location}` : "";
          if (!target)
            throw providerError(PROVIDER, "capacity", `no free server of product ${request.flavor}${where}`, { reason: "no_free_server" });
          await rename(target.server_number, stamp(request.instanceId, hostname, false));
        }
        const n = target.server_number;

        const fingerprints = await ensureKeys(request.sshKeys);
        if (!(await armRescue(http, n, fingerprints)))
          throw providerError(PROVIDER, "transient", `server ${n}: another boot option stays active`, { reason: "BOOT_ALREADY_ENABLED" });
        // Boot it into the rescue system: the reset button restarts a box that is on; one that is off is switched on.
        const reset = await readReset(n);
        if (powerOf(reset) === "off") await switchOn(target, reset);
        else await pressReset(n, "hw");
        await rename(n, stamp(request.instanceId, hostname, true));
        return { server: view({ ...target, server_name: stamp(request.instanceId, hostname, true) }, "starting") };
      },

      async get(id) {
        const s = await claimed(id);
        return s ? view(s, await statusOf(s)) : null;
      },

      async find(instanceId) {
        const s = await findClaim(instanceId);
        return s ? view(s, await statusOf(s)) : null;
      },

      async list() {
        const mine = (await listServers()).filter((s) => stampOf(s.server_name));
        if (mine.length === 0) return [];
        // One call for every box's power; the rescue flag is not read here (get() tells starting from running).
        const res = await http.request<{ reset: RobotReset }[]>("GET", "/reset", { accept: [404] });
        const power = new Map(res.status === 404 ? [] : res.body.map(({ reset }) => [reset.server_number, powerOf(reset)] as const));
        return mine.map((s) =>
          view(s, !stampOf(s.server_name)!.finished ? "creating" : power.get(s.server_number) === "off" ? "stopped" : "running"),
        );
      },

      async powerOn(id) {
        const s = await mustBeClaimed(id);
        await switchOn(s, await readReset(s.server_number));
      },

      async powerOff(id) {
        const s = await mustBeClaimed(id);
        const reset = await readReset(s.server_number);
        const power = powerOf(reset);
        if (power === "off") return;
        const types = reset ? typesOf(reset) : [];
        // A forced switch-off; the ACPI button only when the box is known on (pressed on a box that is off, it starts it).
        if (types.includes("power_long")) await pressReset(s.server_number, "power_long");
        else if (power === "on" && types.includes("power")) await pressReset(s.server_number, "power");
        else
          throw rejected(
            `server ${id} cannot be switched off through Robot (its resetter offers ${types.join(", ") || "nothing"})`,
            "power_off_unavailable",
          );
      },

      async reboot(id) {
        const s = await mustBeClaimed(id);
        const reset = await readReset(s.server_number);
        if (powerOf(reset) === "off") return switchOn(s, reset);
        await pressReset(s.server_number, reset && !typesOf(reset).includes("hw") ? "sw" : "hw");
      },

      async delete(id) {
        const s = await claimed(id);
        if (!s) return;
        const n = s.server_number;
        // No rescue boot with the tenant's keys after the release.
        await http.request("DELETE", `/boot/${n}/rescue`, { accept: [404] });
        const reset = await readReset(n);
        const types = reset ? typesOf(reset) : [];
        if (powerOf(reset) !== "off") {
          // Off when the resetter can; otherwise restarted from its disks, which ends a rescue session.
          if (types.includes("power_long")) await pressReset(n, "power_long");
          else if (types.includes("hw")) await pressReset(n, "hw");
        }
        await rename(n, FREE_NAME);
      },

      async operation(id) {
        throw rejected(`Robot has no jobs: no operation ${JSON.stringify(id)}`, "no_operations");
      },
    };
  },
});

/**
 * Cloud-config that carries no more than a hostname and SSH keys, which Robot takes by other means
 * (the server's name, the rescue system's authorized keys). A join token, files, commands: no.
 */
function saysOnlyHostnameAndKeys(userData: string): boolean {
  const [first, ...rest] = userData.split("\n");
  if (first?.trim() !== "#cloud-config") return userData.trim() === "";
  const keys = rest.filter((line) => /^[^\s#-]/.test(line)).map((line) => /^([\w-]+)\s*:/.exec(line)?.[1] ?? line);
  return keys.every((key) => key === "hostname" || key === "ssh_authorized_keys");
}

/** A box the control plane may claim: ready, not cancelled, carrying no claim, and allowed by the account. */
function isFree(s: RobotServer, allowed: Set<number> | undefined): boolean {
  return s.status === "ready" && !s.cancelled && !stampOf(s.server_name) && (!allowed || allowed.has(s.server_number));
}
