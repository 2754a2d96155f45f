// The Hetzner Cloud provider (better-compute/hetzner-cloud): servers of one project through
// https://api.hetzner.cloud/v1 with its API token (facts and traps: ../shared/PROVIDERS.md §1).
// Every server is stamped with the label bc.dev/instance=<instance id>, so find() answers by label
// selector and a create whose answer was lost is adopted, never made twice: POST /servers has no
// idempotency key, a second create of the same name is `uniqueness_error`, and that answer is
// resolved by the stamp. Mutations return the API's action as the Operation (create: the
// create_server action and its start_server next action); operation() reads /actions. The adapter
// polls nothing itself and makes no call it was not asked for.
import { z } from "zod";
import { ComputeError } from "better-compute/core";
import {
  defineProvider,
  providerError,
  ProviderHttp,
  type Classified,
  type CreateServerRequest,
  type Fetch,
  type Operation,
  type OperationState,
  type ProviderClient,
  type ProviderOffers,
  type ProviderServer,
  type ServerStatus,
} from "better-compute/vps";

const PROVIDER = "hetzner-cloud";

/** The label every server the adapter creates carries: its instance's id. */
export const INSTANCE_LABEL = "bc.dev/instance";

const DEFAULT_ENDPOINT = "https://api.hetzner.cloud/v1";

export const hetznerCloudAccount = z.object({
  /** A Read & Write API token of the project (Cloud Console → Security → API tokens). */
  token: z.string().min(1, "the project's API token is required"),
  /** The API base; another one only for an emulator or a proxy. */
  endpoint: z.string().url().default(DEFAULT_ENDPOINT),
});
export type HetznerCloudAccount = z.output<typeof hetznerCloudAccount>;

export interface HetznerCloudClientOptions {
  fetch: Fetch;
  /** ProviderHttp's clock and sleep, for tests; the defaults are the real ones. */
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
  /** Longest wait inside one call (backoff, a rate-limit reset) before it is returned as retryAfterSeconds. */
  maxWaitSeconds?: number;
}

// The API's server statuses as the reconciler reads them (migrating, rebuilding and unknown: unknown).
const STATUS: Record<string, ServerStatus> = {
  initializing: "creating",
  starting: "starting",
  running: "running",
  stopping: "stopping",
  off: "stopped",
  deleting: "deleting",
};

/** Label values: at most 63 characters, alphanumeric at both ends, `-_.` inside. */
const LABEL_VALUE = /^[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$/;

const CAPACITY = new Set(["resource_unavailable", "resource_limit_exceeded", "placement_error"]);
const CONFIG = new Set(["unauthorized", "forbidden", "token_readonly"]);
const TRANSIENT = new Set(["server_error", "service_error", "unavailable", "maintenance", "timeout", "bad_gateway"]);

/**
 * When the next request may be sent. The bucket refills evenly and RateLimit-Reset says when it
 * is full again, so with none left one request's worth is (reset - now) / limit: 1 s for the real
 * 3600 an hour, whatever the emulator is set to.
 */
function rateWindow(response: Response, now: number): { remaining: number; resetAt: number } | undefined {
  const [limit, remaining, reset] = ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"].map((h) => response.headers.get(h));
  if (limit == null || remaining == null || reset == null) return undefined;
  const [l, r, fullAt] = [Number(limit), Number(remaining), Number(reset) * 1000];
  if (![l, r, fullAt].every(Number.isFinite)) return undefined;
  // 25 ms of slack for the rounding of the reset to whole seconds and the clocks' skew.
  return { remaining: r, resetAt: r > 0 || l <= 0 ? fullAt : now + Math.max(0, fullAt - now) / l + 25 };
}

function classifier(clock: () => number) {
  return (response: Response, body: unknown): Classified => {
    const error = (body as { error?: { code?: unknown; message?: unknown } } | null)?.error;
    const code = typeof error?.code === "string" ? error.code : undefined;
    const message = code ? `${code}: ${typeof error?.message === "string" ? error.message : ""}` : `HTTP ${response.status}`;
    const status = response.status;
    if (code === "rate_limit_exceeded" || status === 429) {
      const at = clock();
      const window = rateWindow(response, at);
      const retryAfterSeconds = window ? Math.max(0, (window.resetAt - at) / 1000) : undefined;
      return {
        failure: "transient",
        reason: "rate_limit_exceeded",
        message,
        refused: true,
        ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
      };
    }
    // Refused before anything was done: safe to send again, even a POST.
    if (code === "locked" || code === "conflict" || status === 423)
      return { failure: "transient", reason: code ?? "locked", message, refused: true };
    if (code && CAPACITY.has(code)) return { failure: "capacity", reason: code, message };
    if (status === 401 || (code && CONFIG.has(code)) || (status === 403 && !code))
      return { failure: "config", ...(code ? { reason: code } : {}), message };
    if ((code && TRANSIENT.has(code)) || status >= 500 || status === 408)
      return { failure: "transient", ...(code ? { reason: code } : {}), message };
    return { failure: "rejected", ...(code ? { reason: code } : {}), message };
  };
}

interface ApiServer {
  id: number;
  name: string;
  status: string;
  labels?: Record<string, string>;
  public_net?: { ipv4: { ip: string } | null; ipv6: { ip: string } | null };
}
interface ApiAction {
  id: number;
  command: string;
  status: "running" | "success" | "error";
  error: { code: string; message: string } | null;
}

function toServer(s: ApiServer): ProviderServer {
  const addresses: string[] = [];
  if (s.public_net?.ipv4) addresses.push(s.public_net.ipv4.ip);
  // The server's address in its /64 is ::1, by Hetzner's convention.
  if (s.public_net?.ipv6) addresses.push(s.public_net.ipv6.ip.replace(/\/\d+$/, "").replace(/::$/, "::1"));
  const instanceId = s.labels?.[INSTANCE_LABEL];
  return { id: String(s.id), name: s.name, status: STATUS[s.status] ?? "unknown", addresses, ...(instanceId ? { instanceId } : {}) };
}

/** The base64 blob of an OpenSSH public key: what makes two keys the same. */
const keyBlob = (publicKey: string) => publicKey.trim().split(/\s+/)[1] ?? "";

/** FNV-1a, 32 bits, hex: a short stable tag of a key for its name (the API dedups keys by name and fingerprint). */
function fnv1a(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return h.toString(16).padStart(8, "0");
}

const isId = (id: string) => /^\d+$/.test(id);

/** The API's answer to a second server of the same name, or a second SSH key of the same name or key. */
const isUniquenessError = (err: unknown) => err instanceof ComputeError && err.details?.reason === "uniqueness_error";

/** A client for one project; hetznerCloudProvider.client() builds it with the deployment's fetch. */
export function hetznerCloudClient(account: HetznerCloudAccount, options: HetznerCloudClientOptions): ProviderClient {
  const clock = options.now ?? Date.now;
  const http = new ProviderHttp({
    provider: PROVIDER,
    baseUrl: account.endpoint ?? DEFAULT_ENDPOINT,
    fetch: options.fetch,
    headers: { authorization: `Bearer ${account.token}` },
    secrets: [account.token],
    classify: classifier(clock),
    rateLimit: (response) => rateWindow(response, clock()),
    ...(options.sleep ? { sleep: options.sleep } : {}),
    ...(options.now ? { now: options.now } : {}),
    ...(options.maxWaitSeconds !== undefined ? { maxWaitSeconds: options.maxWaitSeconds } : {}),
  });

  /** Every page of a list (50 a page, the most the API gives). */
  async function listAll<T>(path: string, root: string, query: Record<string, string | string[]> = {}): Promise<T[]> {
    const items: T[] = [];
    for (let page: number | null = 1; page !== null;) {
      const { body }: { body: Record<string, any> } = await http.request("GET", path, { query: { ...query, page, per_page: 50 } });
      items.push(...(body[root] as T[]));
      page = body.meta?.pagination?.next_page ?? null;
    }
    return items;
  }

  const operationOf = (actions: ApiAction[]): Operation => ({ id: actions.map((a) => a.id).join(",") });

  async function find(instanceId: string): Promise<ProviderServer | null> {
    if (!LABEL_VALUE.test(instanceId)) return null; // no server can carry it
    const [server] = await listAll<ApiServer>("/servers", "servers", { label_selector: `${INSTANCE_LABEL}==${instanceId}` });
    return server ? toServer(server) : null;
  }

  /** The ids of the request's keys, uploading the ones the project does not have yet. */
  async function sshKeyIds(keys: CreateServerRequest["sshKeys"]): Promise<number[]> {
    const ids: number[] = [];
    for (const key of keys) {
      const blob = keyBlob(key.publicKey);
      const name = `${key.name}-${fnv1a(blob)}`;
      const [named] = await listAll<{ id: number; public_key: string }>("/ssh_keys", "ssh_keys", { name });
      if (named && keyBlob(named.public_key) === blob) {
        ids.push(named.id);
        continue;
      }
      try {
        const { body } = await http.request("POST", "/ssh_keys", { json: { name, public_key: key.publicKey.trim() } });
        ids.push(body.ssh_key.id);
      } catch (err) {
        // The same key under another name (or a concurrent upload): use the one the project has.
        if (!isUniquenessError(err)) throw err;
        const existing = (await listAll<{ id: number; public_key: string }>("/ssh_keys", "ssh_keys")).find(
          (k) => keyBlob(k.public_key) === blob,
        );
        if (!existing) throw err;
        ids.push(existing.id);
      }
    }
    return ids;
  }

  async function serverAction(id: string, action: string): Promise<Operation> {
    if (!isId(id))
      throw providerError(PROVIDER, "rejected", `no server ${JSON.stringify(id)} (server ids are numbers)`, { reason: "not_found" });
    const { body } = await http.request<{ action: ApiAction }>("POST", `/servers/${id}/actions/${action}`);
    return operationOf([body.action]);
  }

  return {
    async offers(): Promise<ProviderOffers> {
      const [types, images, locations] = [
        await listAll<{
          name: string;
          cores: number;
          memory: number;
          disk: number;
          deprecated: boolean;
          deprecation?: unknown;
          prices: { location: string }[];
        }>("/server_types", "server_types"),
        await listAll<{ name: string; description: string }>("/images", "images", { type: "system", status: "available" }),
        await listAll<{ name: string; description: string }>("/locations", "locations"),
      ];
      const imageNames = new Map<string, string>();
      for (const image of images) if (!imageNames.has(image.name)) imageNames.set(image.name, image.description);
      return {
        flavors: types
          .filter((t) => !t.deprecated && !t.deprecation)
          .map((t) => ({
            id: t.name,
            name: t.name,
            vcpus: t.cores,
            memoryMiB: Math.round(t.memory * 1024),
            diskGiB: t.disk,
            locations: t.prices.map((p) => p.location),
          })),
        images: [...imageNames].map(([id, name]) => ({ id, name })),
        locations: locations.map((l) => ({ id: l.name, name: l.description })),
      };
    },

    async create(request) {
      if (!LABEL_VALUE.test(request.instanceId))
        throw providerError(
          PROVIDER,
          "rejected",
          `instance id ${JSON.stringify(request.instanceId)} cannot be a label value (<= 63 of [a-zA-Z0-9-_.])`,
        );
      const sshKeys = await sshKeyIds(request.sshKeys);
      try {
        const { body } = await http.request<{ server: ApiServer; action: ApiAction; next_actions: ApiAction[] }>("POST", "/servers", {
          json: {
            name: request.name,
            server_type: request.flavor,
            image: request.image,
            ...(request.location ? { location: request.location } : {}),
            ssh_keys: sshKeys,
            ...(request.userData !== undefined ? { user_data: request.userData } : {}),
            labels: { [INSTANCE_LABEL]: request.instanceId },
            start_after_create: true,
          },
        });
        return { server: toServer(body.server), operation: operationOf([body.action, ...(body.next_actions ?? [])]) };
      } catch (err) {
        // The name is taken: by this instance's own server (a create whose answer was lost), or not.
        if (!isUniquenessError(err)) throw err;
        const existing = await find(request.instanceId);
        if (existing) return { server: existing };
        throw providerError(
          PROVIDER,
          "rejected",
          `a server named ${request.name} already exists and is not instance ${request.instanceId}'s`,
          {
            reason: "uniqueness_error",
            status: 409,
          },
        );
      }
    },

    async get(id) {
      if (!isId(id)) return null;
      const { status, body } = await http.request<{ server: ApiServer }>("GET", `/servers/${id}`, { accept: [404] });
      return status === 404 ? null : toServer(body.server);
    },

    find,

    async list() {
      return (await listAll<ApiServer>("/servers", "servers")).map(toServer);
    },

    powerOn: (id) => serverAction(id, "poweron"),
    // A hard power cut, which always ends; `shutdown` (ACPI) waits for an OS that may ignore it.
    powerOff: (id) => serverAction(id, "poweroff"),
    reboot: (id) => serverAction(id, "reboot"),

    async delete(id) {
      if (!isId(id)) return;
      const { status, body } = await http.request<{ action: ApiAction }>("DELETE", `/servers/${id}`, { accept: [404] });
      return status === 404 ? undefined : operationOf([body.action]);
    },

    async operation(id): Promise<OperationState> {
      const ids = id.split(",");
      if (!ids.every(isId)) return { state: "failed", message: `no action ${JSON.stringify(id)}` };
      let actions: ApiAction[];
      if (ids.length === 1) {
        const { status, body } = await http.request<{ action: ApiAction }>("GET", `/actions/${ids[0]}`, { accept: [404] });
        actions = status === 404 ? [] : [body.action];
      } else {
        const { body } = await http.request<{ actions: ApiAction[] }>("GET", "/actions", { query: { id: ids } });
        actions = body.actions;
      }
      if (actions.length < ids.length) return { state: "failed", message: `action ${id} not found` };
      const failed = actions.find((a) => a.status === "error");
      if (failed)
        return { state: "failed", message: `${failed.command}: ${failed.error?.code ?? "error"}: ${failed.error?.message ?? ""}` };
      return actions.some((a) => a.status === "running") ? { state: "running" } : { state: "succeeded" };
    },
  };
}

export const hetznerCloudProvider = defineProvider({
  id: PROVIDER,
  description: "Hetzner Cloud servers of one project (api.hetzner.cloud), by API token",
  manifest: hetznerCloudAccount,
  secretFields: ["token"],
  client: (account, { fetch }) => hetznerCloudClient(account, { fetch }),
});
