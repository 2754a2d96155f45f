// Proxmox VE as a VPS provider (better-compute/proxmox): qemu VMs cloned from a template (or
// created from a disk image) on one node of a PVE cluster, configured for cloud-init, driven
// through PVE's HTTP API with an API token. docs/providers/proxmox.md is the operator's page.
//
// What PVE makes hard, and how this adapter meets it:
// - A create is several calls (nextid, clone, resize, config, start), any of which a crash may
//   cut short. The VM carries its instance's stamp from the first call on: its name while it is
//   being made (clone takes no tags), a tag once it is configured. create() on a stamped VM
//   continues it where it stopped; find() returns it either way, so nothing is made twice.
// - nextid only suggests an id: a clone that meets "already exists" takes the next one.
// - HTTP 200 with a UPID only means "started": tasks are polled until they stop, and exitstatus
//   decides. Errors come as the HTTP reason phrase; a missing VM is a 500, not a 404.
// - sshkeys must be URL-encoded (a raw key is 400 "invalid urlencoded string").
// - Proxmox sells nothing: flavors are the account's presets and images its node's templates.
// - PVE's API cannot write a cloud-init snippet (bugzilla.proxmox.com #2208), so user data cannot
//   reach the VM as such. PVE's own cloud-init keys carry the hostname (the VM's name) and the SSH
//   keys: user data that says no more than that (as the vps module renders it for an agent: none
//   pool) is delivered that way; any more (a join token, runcmd) is refused. The account's
//   cicustom may name a static snippet the node holds.
import { z } from "zod";
import { sha256Hex } from "better-compute/core";
import { bmcTls } from "better-compute/metal/bmc-address";
import {
  defineProvider,
  providerError,
  ProviderHttp,
  renderUserData,
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

const PROVIDER = "proxmox";

/** Proxmox has no catalogue of sizes: these presets are what an account offers unless it names its own. */
export const DEFAULT_FLAVORS = [
  { id: "small", cores: 1, memoryMiB: 2048, diskGiB: 20 },
  { id: "medium", cores: 2, memoryMiB: 4096, diskGiB: 40 },
  { id: "large", cores: 4, memoryMiB: 8192, diskGiB: 80 },
];

const NAME = /^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$/;
const STORAGE = /^[a-zA-Z][a-zA-Z0-9_.-]*$/;

function baseUrlProblem(value: string): string | undefined {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return "must be a URL such as https://pve.example.com:8006";
  }
  if (url.protocol !== "https:") return "must be https: (the Proxmox API is served over HTTPS only)";
  if (url.username || url.password) return "must not carry credentials (the token goes in tokenId and tokenSecret)";
  if (url.search || url.hash || !/^\/?(api2\/json\/?)?$/.test(url.pathname.replace(/^\//, "")))
    return "must be the server's origin, e.g. https://pve.example.com:8006 (optionally ending in /api2/json)";
  return undefined;
}

export const proxmoxAccount = z.strictObject({
  /** https://host:8006: the API of any node of the cluster. */
  baseUrl: z.string().superRefine((value, ctx) => {
    const problem = baseUrlProblem(value);
    if (problem) ctx.addIssue({ code: "custom", message: problem });
  }),
  /** The node VMs are created on (its name in GET /nodes). */
  node: z.string().regex(NAME, "must be a PVE node name"),
  /** The API token's id, USER@REALM!TOKENID (not secret). */
  tokenId: z.string().regex(/^[^\s@!=:]+@[^\s@!=:]+![A-Za-z][A-Za-z0-9._-]*$/, "must be USER@REALM!TOKENID, e.g. bc@pve!compute"),
  /** The API token's secret (a UUID): sealed, sent only in the Authorization header. */
  tokenSecret: z.string().min(1),
  /** Storage for full clones, created disks and cloud-init drives. */
  storage: z.string().regex(STORAGE, "must be a PVE storage id").default("local-lvm"),
  /** Bridge of the network device of a VM created from a disk image (clones keep their template's). */
  bridge: z
    .string()
    .regex(/^[a-zA-Z][a-zA-Z0-9_.-]*$/, "must be a bridge name such as vmbr0")
    .default("vmbr0"),
  /** Full clones (independent disks on `storage`); false: linked clones, which need the template's storage to take snapshots. */
  fullClone: z.boolean().default(true),
  /** Template vmids offered as images; default every template on the node. */
  templates: z.array(z.number().int().min(100)).optional(),
  /** Disk images offered for creating a VM from scratch (POST /nodes/{node}/qemu with import-from). */
  images: z
    .array(
      z.strictObject({ name: z.string().min(1).max(100), importFrom: z.string().regex(/^[a-zA-Z][\w.-]*:\S+$/, "must be a volume id") }),
    )
    .default([]),
  /** The sizes offered: Proxmox has none of its own. */
  flavors: z
    .array(
      z.strictObject({
        id: z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/),
        name: z.string().min(1).max(100).optional(),
        cores: z.number().int().min(1).max(512),
        memoryMiB: z.number().int().min(64),
        diskGiB: z.number().int().min(1),
      }),
    )
    .min(1)
    .default(DEFAULT_FLAVORS),
  /** cloud-init: the user the SSH keys are for (default: the image's own default user). */
  ciuser: z
    .string()
    .regex(/^[a-z_][a-z0-9_-]*$/, "must be a user name")
    .optional(),
  /** cloud-init network config of net0: ip=dhcp (default) or ip=<cidr>,gw=<ip>, ip6=... */
  ipconfig0: z.string().min(1).default("ip=dhcp"),
  /** cloud-init snippets the node already holds, e.g. vendor=local:snippets/vendor.yaml (PVE's cicustom). */
  cicustom: z
    .string()
    .regex(/^(user|network|meta|vendor)=[a-zA-Z][\w.-]*:\S+?(,(user|network|meta|vendor)=[a-zA-Z][\w.-]*:\S+?)*$/, "must be PVE's cicustom")
    .optional(),
  /** Ask the QEMU guest agent for a running VM's addresses (the image must run qemu-guest-agent). */
  guestAgent: z.boolean().default(false),
  /** How long create() and delete() wait for one task (a clone) before answering "still running, call again". */
  taskWaitSeconds: z.number().int().min(1).max(3600).default(300),
  /**
   * How to trust the server's certificate (PVE makes a self-signed one): its key's pin or the CA
   * that signed it. The adapter takes a fetch: on Node, pinnedFetch(account.tls) from
   * better-compute/proxmox/pinned-fetch honours it; a Worker's fetch cannot (docs/providers/proxmox.md).
   */
  tls: bmcTls.optional(),
});
export type ProxmoxAccount = z.output<typeof proxmoxAccount>;

/** The reason, status text and parameter errors of a PVE failure, as one line. */
function pveMessage(response: Response, body: unknown): string {
  const b = (body && typeof body === "object" ? body : {}) as { message?: unknown; errors?: unknown };
  const reason = response.statusText || (typeof b.message === "string" ? b.message.trim() : "") || `HTTP ${response.status}`;
  const errors =
    b.errors && typeof b.errors === "object"
      ? Object.entries(b.errors as Record<string, unknown>)
          .map(([k, v]) => `${k}: ${String(v).trim()}`)
          .join("; ")
      : "";
  return `${response.status} ${reason}${errors ? ` (${errors})` : ""}`;
}

/** How a PVE failure is acted on (contracts.ts ProviderFailure). */
export function classifyPve(response: Response, body: unknown): Classified {
  const message = pveMessage(response, body);
  const status = response.status;
  if (status === 401) return { failure: "config", reason: "unauthorized", message: `${message}: the API token was refused; check tokenId and tokenSecret` };
  if (status === 403)
    return { failure: "config", reason: "forbidden", message: `${message}: the API token lacks this privilege (a token with privilege separation needs its own ACLs)` };
  if (status === 429) {
    const seconds = Number(response.headers.get("retry-after"));
    return { failure: "transient", reason: "rate_limited", message, refused: true, retryAfterSeconds: Number.isFinite(seconds) && seconds > 0 ? seconds : 1 };
  }
  if (status === 400) return { failure: "rejected", reason: "invalid_parameter", message };
  if (status === 501) return { failure: "rejected", reason: "not_implemented", message };
  if (/does not exist/.test(message) && /Configuration file/.test(message)) return { failure: "rejected", reason: "not_found", message };
  if (/already exists/.test(message)) return { failure: "rejected", reason: "already_exists", message };
  if (/can't lock file|got timeout|is locked/.test(message)) return { failure: "transient", reason: "locked", message, refused: true };
  if (/hostname lookup|no such node/.test(message))
    return { failure: "config", reason: "no_such_node", message: `${message}: the account's node is not a node of this cluster` };
  if (/storage '[^']*' does not exist/.test(message)) return { failure: "config", reason: "no_such_storage", message };
  if (status >= 500) return { failure: "transient", reason: "server_error", message };
  return { failure: "rejected", reason: `http_${status}`, message };
} // prettier-ignore

/** What a failed task means: capacity when it ran out of space or memory; anything else is worth another try (a later create continues). */
function taskFailure(exitstatus: string, what: string) {
  const message = `${what} failed: ${exitstatus}`;
  if (/no space left|not enough space|out of space|insufficient|cannot allocate memory|not enough memory/i.test(exitstatus))
    return providerError(PROVIDER, "capacity", message, { reason: "no_capacity" });
  return providerError(PROVIDER, "transient", message, { reason: "task_failed", retryAfterSeconds: 10 });
}

const UPID = /^UPID:([^:]+):[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:[^:]*:[^:]*:[^:]+:$/;
const taskSucceeded = (exitstatus: string | undefined) => exitstatus === "OK" || /^WARNINGS: \d+$/.test(exitstatus ?? "");

/** A VM as GET /cluster/resources?type=vm lists it. */
interface Resource {
  vmid: number;
  node: string;
  name?: string;
  status?: string;
  template?: number;
  tags?: string;
  lock?: string;
  type?: string;
}

/** The instance's stamp: a tag once the VM is configured, its name while it is being made. */
interface Stamp {
  tag: string;
  pendingName: string;
  instanceId: string;
}

const TAG_PREFIX = "bc-instance.";
const PENDING_PREFIX = "bc-creating.";
/** An instance id used as is in a tag and a DNS label; any other is hashed. */
const PLAIN_ID = /^(?!sha256-)[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$/;

async function stampOf(instanceId: string): Promise<Stamp> {
  const value = PLAIN_ID.test(instanceId) ? instanceId : `sha256-${(await sha256Hex(instanceId)).slice(0, 40)}`;
  return { tag: TAG_PREFIX + value, pendingName: PENDING_PREFIX + value, instanceId };
}

const tagsOf = (tags: string | undefined) => (tags ?? "").split(/[;, ]+/).filter(Boolean);

/** The instance id a VM's tag or pending name spells out, when it is not a hash. */
function stampedId(r: Resource): string | undefined {
  const fromTag = tagsOf(r.tags).find((t) => t.startsWith(TAG_PREFIX));
  const value = fromTag
    ? fromTag.slice(TAG_PREFIX.length)
    : r.name?.startsWith(PENDING_PREFIX)
      ? r.name.slice(PENDING_PREFIX.length)
      : undefined;
  return value && !value.startsWith("sha256-") ? value : undefined;
}

const carries = (r: Resource, stamp: Stamp) => tagsOf(r.tags).includes(stamp.tag) || r.name === stamp.pendingName;

function statusOf(r: Resource): ServerStatus {
  if (r.name?.startsWith(PENDING_PREFIX) || r.lock === "clone" || r.lock === "create") return "creating";
  if (r.status === "running") return "running";
  if (r.status === "stopped") return "stopped";
  return "unknown";
}

/** The first disk of a config that is neither a CD-ROM nor a cloud-init drive, and its size in GiB. */
function bootDisk(config: Record<string, unknown>): { key: string; sizeGiB: number } | undefined {
  const keys = Object.keys(config)
    .filter((k) => /^(scsi|virtio|sata|ide)\d+$/.test(k))
    .sort();
  for (const key of keys) {
    const value = String(config[key]);
    if (value.includes("media=cdrom") || value.includes("cloudinit")) continue;
    const m = /(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)/.exec(value);
    const factor = { "": 1 / 1024 ** 3, K: 1 / 1024 ** 2, M: 1 / 1024, G: 1, T: 1024 }[(m?.[2] ?? "") as "" | "K" | "M" | "G" | "T"];
    return { key, sizeGiB: m ? Number(m[1]) * factor : 0 };
  }
  return undefined;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
/** Polls of a task: at once, then slower, up to 2 s apart. */
const pollDelayMs = (poll: number) => Math.min(2000, 250 * 2 ** poll);

class ProxmoxClient implements ProviderClient {
  readonly #a: ProxmoxAccount;
  readonly #http: ProviderHttp;

  constructor(account: ProxmoxAccount, fetch: Fetch) {
    this.#a = account;
    const origin = new URL(account.baseUrl).origin;
    this.#http = new ProviderHttp({
      provider: PROVIDER,
      baseUrl: `${origin}/api2/json`,
      fetch,
      headers: { authorization: `PVEAPIToken=${account.tokenId}=${account.tokenSecret}` },
      secrets: [account.tokenSecret],
      classify: classifyPve,
    });
  }

  async #call<T = any>(method: string, path: string, params?: Record<string, string | number | undefined>): Promise<T> {
    const request = method === "GET" || method === "DELETE" ? { query: params } : { form: params ?? {} };
    return (await this.#http.request<{ data: T }>(method, path, request)).body.data;
  }

  /** Every qemu VM of the cluster (templates included), one call. */
  #resources(): Promise<Resource[]> {
    return this.#call<Resource[]>("GET", "/cluster/resources", { type: "vm" }).then((list) =>
      list.filter((r) => (r.type ?? "qemu") === "qemu"),
    );
  }

  #vmPath(r: Pick<Resource, "node" | "vmid">, rest = ""): string {
    return `/nodes/${encodeURIComponent(r.node)}/qemu/${r.vmid}${rest}`;
  }

  #server(r: Resource, addresses: string[] = []): ProviderServer {
    const instanceId = stampedId(r);
    const status = statusOf(r);
    return {
      id: String(r.vmid),
      ...(instanceId ? { instanceId } : {}),
      name: r.name ?? `VM ${r.vmid}`,
      status,
      addresses,
      // Still under its pending name or its clone's lock: create() for its instance finishes it.
      ...(status === "creating" ? { incomplete: true } : {}),
    };
  }

  async offers(): Promise<ProviderOffers> {
    const a = this.#a;
    const nodes = await this.#call<{ node: string }[]>("GET", "/nodes");
    if (!nodes.some((n) => n.node === a.node)) {
      throw providerError(
        PROVIDER,
        "config",
        `node ${a.node} is not a node of this cluster (it has: ${nodes.map((n) => n.node).join(", ")})`,
        {
          reason: "no_such_node",
        },
      );
    }
    const templates = (await this.#resources()).filter((r) => this.#offeredTemplate(r));
    return {
      flavors: a.flavors.map((f) => ({
        id: f.id,
        name: f.name ?? `${f.cores} vCPU, ${f.memoryMiB / 1024} GiB RAM, ${f.diskGiB} GiB disk`,
        vcpus: f.cores,
        memoryMiB: f.memoryMiB,
        diskGiB: f.diskGiB,
        locations: [a.node],
      })),
      images: [
        ...templates.map((t) => ({ id: String(t.vmid), name: t.name ?? `template ${t.vmid}` })),
        ...a.images.map((i) => ({ id: i.importFrom, name: i.name })),
      ],
      locations: [{ id: a.node, name: a.node }],
    };
  }

  #offeredTemplate(r: Resource): boolean {
    return r.template === 1 && r.node === this.#a.node && (this.#a.templates?.includes(r.vmid) ?? true);
  }

  async get(id: string): Promise<ProviderServer | null> {
    if (!/^\d+$/.test(id)) return null;
    const r = (await this.#resources()).find((v) => v.vmid === Number(id) && v.template !== 1);
    if (!r) return null;
    return this.#server(r, r.status === "running" && this.#a.guestAgent ? await this.#addresses(r) : []);
  }

  /** The guest agent's addresses of a running VM, without loopback and link-local ones; none when the agent does not answer. */
  async #addresses(r: Resource): Promise<string[]> {
    type Interfaces = { result?: { "ip-addresses"?: { "ip-address": string }[] }[] } | null;
    const answer = await this.#http.request<{ data: Interfaces }>("GET", this.#vmPath(r, "/agent/network-get-interfaces"), {
      accept: [500],
    });
    if (answer.status !== 200) return [];
    return (answer.body.data?.result ?? [])
      .flatMap((i) => i["ip-addresses"] ?? [])
      .map((a) => a["ip-address"])
      .filter((ip) => !/^(127\.|169\.254\.|::1$|fe[89ab][0-9a-f]:)/i.test(ip));
  }

  async find(instanceId: string): Promise<ProviderServer | null> {
    const stamp = await stampOf(instanceId);
    const r = (await this.#resources()).find((v) => v.template !== 1 && carries(v, stamp));
    return r ? { ...this.#server(r), instanceId } : null;
  }

  async list(): Promise<ProviderServer[]> {
    return (await this.#resources()).filter((r) => r.template !== 1).map((r) => this.#server(r));
  }

  async create(request: CreateServerRequest): Promise<{ server: ProviderServer; operation?: Operation }> {
    const a = this.#a;
    const flavor = a.flavors.find((f) => f.id === request.flavor);
    if (!flavor) throw invalidRequest(`no flavor ${request.flavor} (the account offers ${a.flavors.map((f) => f.id).join(", ")})`);
    if (request.location !== undefined && request.location !== a.node)
      throw invalidRequest(`location ${request.location} is not this account's node (${a.node})`);
    // PVE's cloud-init takes the hostname from the VM's name: the VM is named after it (PVE finds it by its tag).
    const hostname = request.hostname ?? request.name;
    if (hostname.length > 63 || !NAME.test(hostname)) throw invalidRequest(`name ${JSON.stringify(hostname)} is not a hostname`);
    if (request.sshKeys.some((k) => /[\r\n]/.test(k.publicKey.trim())))
      throw invalidRequest("an SSH public key must be one line (OpenSSH format)");
    if (request.userData && request.userData !== renderUserData({ hostname, sshKeys: request.sshKeys })) {
      throw invalidRequest(
        "cloud-init user data beyond the hostname and the SSH keys cannot be sent: the Proxmox API cannot write the snippet cicustom would name (bugzilla.proxmox.com #2208); the hostname and SSH keys go through PVE's own cloud-init keys, and the account's cicustom may name a snippet the node holds",
      );
    }
    const stamp = await stampOf(request.instanceId);
    // A VM that vanished under us (a failed clone cleans up after itself) is made again, once.
    for (let round = 0; ; round++) {
      const resources = await this.#resources();
      let vm = resources.find((r) => r.template !== 1 && carries(r, stamp));
      if (vm && tagsOf(vm.tags).includes(stamp.tag) && !vm.lock && vm.status === "running") {
        return { server: { ...this.#server(vm), instanceId: request.instanceId } };
      }
      vm ??= await this.#make(request, flavor, stamp, resources);
      const done = await this.#complete(vm, request, flavor, stamp);
      if (done !== "gone") return done;
      if (round >= 1)
        throw providerError(PROVIDER, "transient", `VM ${vm.vmid} vanished while it was being created`, { retryAfterSeconds: 10 });
    }
  }

  /** nextid, then clone (or create) under the pending name; waits for the task. */
  async #make(
    request: CreateServerRequest,
    flavor: ProxmoxAccount["flavors"][number],
    stamp: Stamp,
    resources: Resource[],
  ): Promise<Resource> {
    const a = this.#a;
    const template = /^\d+$/.test(request.image)
      ? resources.find((r) => r.vmid === Number(request.image) && this.#offeredTemplate(r))
      : undefined;
    const image = template ? undefined : a.images.find((i) => i.importFrom === request.image);
    if (!template && !image)
      throw invalidRequest(`image ${request.image} is neither a template on node ${a.node} nor one of the account's images`);
    let vmid = Number(await this.#call<string>("GET", "/cluster/nextid"));
    for (let attempt = 1; ; attempt++) {
      try {
        const upid = template
          ? await this.#call<string>("POST", `/nodes/${encodeURIComponent(a.node)}/qemu/${template.vmid}/clone`, {
              newid: vmid,
              name: stamp.pendingName,
              full: a.fullClone ? 1 : 0,
              storage: a.fullClone ? a.storage : undefined,
            })
          : await this.#call<string>("POST", `/nodes/${encodeURIComponent(a.node)}/qemu`, {
              vmid,
              name: stamp.pendingName,
              cores: flavor.cores,
              memory: flavor.memoryMiB,
              ostype: "l26",
              scsihw: "virtio-scsi-pci",
              scsi0: `${a.storage}:0,import-from=${image!.importFrom}`,
              ide2: `${a.storage}:cloudinit`,
              net0: `virtio,bridge=${a.bridge}`,
              boot: "order=scsi0",
              serial0: "socket",
              vga: "serial0",
              agent: a.guestAgent ? 1 : undefined,
            });
        await this.#wait(upid, `${template ? "clone" : "create"} of VM ${vmid}`);
        return { vmid, node: a.node, name: stamp.pendingName, status: "stopped" };
      } catch (e) {
        // nextid only suggested the id: another client took it first. Take the next one.
        if (reasonOf(e) !== "already_exists" || attempt >= 10) throw e;
        vmid++;
      }
    }
  }

  /**
   * Brings a stamped VM the rest of the way: waits out its clone, sizes its disk, writes cloud-init,
   * its name and the tag (in one config write: the tag marks it configured), and starts it.
   */
  async #complete(
    vm: Resource,
    request: CreateServerRequest,
    flavor: ProxmoxAccount["flavors"][number],
    stamp: Stamp,
  ): Promise<{ server: ProviderServer; operation?: Operation } | "gone"> {
    const a = this.#a;
    const hostname = request.hostname ?? request.name;
    let config = await this.#config(vm);
    if (config && (config.lock === "clone" || config.lock === "create")) config = await this.#waitUnlocked(vm);
    if (!config) return "gone";
    if (!tagsOf(config.tags as string | undefined).includes(stamp.tag)) {
      const disk = bootDisk(config);
      if (!disk) throw providerError(PROVIDER, "rejected", `VM ${vm.vmid} has no disk to boot from (its template has none)`);
      if (disk.sizeGiB < flavor.diskGiB) {
        const answer = await this.#call<string | null>("PUT", this.#vmPath(vm, "/resize"), { disk: disk.key, size: `${flavor.diskGiB}G` });
        // PVE 8 resizes in a task; 7 answers when done.
        if (typeof answer === "string" && answer.startsWith("UPID:")) await this.#wait(answer, `resize of VM ${vm.vmid}`);
      }
      const hasCloudInit = Object.values(config).some((v) => typeof v === "string" && /cloudinit/.test(v));
      if (!hasCloudInit && config.ide2 !== undefined)
        throw providerError(PROVIDER, "rejected", `VM ${vm.vmid} has no cloud-init drive and ide2 is taken: give its template one`);
      const keys = request.sshKeys.map((k) => k.publicKey.trim()).join("\n");
      await this.#call("PUT", this.#vmPath(vm, "/config"), {
        name: hostname,
        tags: [...tagsOf(config.tags as string | undefined), stamp.tag].join(";"),
        cores: flavor.cores,
        memory: flavor.memoryMiB,
        ipconfig0: a.ipconfig0,
        ciuser: a.ciuser,
        cicustom: a.cicustom,
        // PVE wants the keys URL-encoded (%20, %2B, %2F, %3D, %0A between keys) inside the form.
        sshkeys: keys ? encodeURIComponent(keys) : undefined,
        agent: a.guestAgent ? 1 : undefined,
        ide2: hasCloudInit ? undefined : `${a.storage}:cloudinit`,
        net0: config.net0 === undefined ? `virtio,bridge=${a.bridge}` : undefined,
      });
    }
    const server: ProviderServer = {
      id: String(vm.vmid),
      instanceId: request.instanceId,
      name: hostname,
      status: "running",
      addresses: [],
    };
    // The listing create() began with says whether it runs (a VM it just made does not).
    if (vm.status === "running") return { server };
    const upid = await this.#call<string>("POST", this.#vmPath(vm, "/status/start"));
    return { server: { ...server, status: "starting" }, operation: { id: upid } };
  }

  /** The VM's config, or null when it does not exist (any more). */
  async #config(vm: Pick<Resource, "node" | "vmid">): Promise<Record<string, unknown> | null> {
    try {
      return await this.#call<Record<string, unknown>>("GET", this.#vmPath(vm, "/config"));
    } catch (e) {
      if (reasonOf(e) === "not_found") return null;
      throw e;
    }
  }

  /** Waits for a clone or create made by an earlier call (its task id unknown here) to let go of the VM. */
  async #waitUnlocked(vm: Resource): Promise<Record<string, unknown> | null> {
    const deadline = Date.now() + this.#a.taskWaitSeconds * 1000;
    for (let poll = 0; ; poll++) {
      await sleep(pollDelayMs(poll));
      const config = await this.#config(vm);
      if (!config || (config.lock !== "clone" && config.lock !== "create")) return config;
      if (Date.now() > deadline) {
        throw providerError(
          PROVIDER,
          "transient",
          `VM ${vm.vmid} is still locked (${String(config.lock)}); create() continues it when called again`,
          {
            reason: "in_progress",
            retryAfterSeconds: 15,
          },
        );
      }
    }
  }

  /** Polls a task until it stops; a failed one throws (capacity or transient), a long one says to come back. */
  async #wait(upid: string, what: string): Promise<void> {
    const deadline = Date.now() + this.#a.taskWaitSeconds * 1000;
    for (let poll = 0; ; poll++) {
      const state = await this.operation(upid);
      if (state.state === "succeeded") return;
      if (state.state === "failed") throw taskFailure(state.message, what);
      if (Date.now() > deadline) {
        throw providerError(PROVIDER, "transient", `${what} is still running (task ${upid}); calling again continues it`, {
          reason: "in_progress",
          retryAfterSeconds: 15,
        });
      }
      await sleep(pollDelayMs(poll));
    }
  }

  /** The VM by id, wherever it runs in the cluster; a template is never a server. */
  async #locate(id: string, what: string): Promise<Resource | null> {
    if (!/^\d+$/.test(id)) return null;
    const r = (await this.#resources()).find((v) => v.vmid === Number(id));
    if (r?.template === 1) throw providerError(PROVIDER, "rejected", `VM ${id} is a template, not a server: not going to ${what} it`);
    return r ?? null;
  }

  async #mustLocate(id: string, what: string): Promise<Resource> {
    const r = await this.#locate(id, what);
    if (!r) throw providerError(PROVIDER, "rejected", `cannot ${what} VM ${id}: it does not exist`, { reason: "not_found" });
    return r;
  }

  async powerOn(id: string): Promise<Operation | void> {
    const r = await this.#mustLocate(id, "start");
    if (r.status === "running") return;
    return { id: await this.#call<string>("POST", this.#vmPath(r, "/status/start")) };
  }

  /** ACPI shutdown, forced off after 60 s when the guest does not comply. */
  async powerOff(id: string): Promise<Operation | void> {
    const r = await this.#mustLocate(id, "stop");
    if (r.status === "stopped") return;
    return { id: await this.#call<string>("POST", this.#vmPath(r, "/status/shutdown"), { forceStop: 1, timeout: 60 }) };
  }

  /** A reboot of a stopped VM starts it. */
  async reboot(id: string): Promise<Operation | void> {
    const r = await this.#mustLocate(id, "reboot");
    const action = r.status === "running" ? "reboot" : "start";
    return { id: await this.#call<string>("POST", this.#vmPath(r, `/status/${action}`)) };
  }

  /** Stops a running VM first (PVE will not destroy one), then destroys it with its disks. */
  async delete(id: string): Promise<Operation | void> {
    const r = await this.#locate(id, "delete");
    if (!r) return;
    try {
      if (r.status === "running") await this.#wait(await this.#call<string>("POST", this.#vmPath(r, "/status/stop")), `stop of VM ${id}`);
      return { id: await this.#call<string>("DELETE", this.#vmPath(r), { purge: 1, "destroy-unreferenced-disks": 1 }) };
    } catch (e) {
      if (reasonOf(e) === "not_found") return;
      throw e;
    }
  }

  async operation(id: string): Promise<OperationState> {
    const m = UPID.exec(id);
    if (!m) throw providerError(PROVIDER, "rejected", `${JSON.stringify(id)} is not a PVE task id (UPID)`, { reason: "invalid_request" });
    const task = await this.#call<{ status: string; exitstatus?: string }>(
      "GET",
      `/nodes/${encodeURIComponent(m[1]!)}/tasks/${encodeURIComponent(id)}/status`,
    );
    if (task.status === "running") return { state: "running" };
    if (taskSucceeded(task.exitstatus)) return { state: "succeeded" };
    return { state: "failed", message: task.exitstatus ?? "the task stopped without an exit status" };
  }
}

/** A request the adapter refuses before calling PVE: the instance fails (DRIVER_ERROR), nothing is made. */
const invalidRequest = (message: string) => providerError(PROVIDER, "rejected", message, { reason: "invalid_request" });

const reasonOf = (e: unknown) => (e as { details?: { reason?: unknown } })?.details?.reason;

export const proxmoxProvider = defineProvider({
  id: PROVIDER,
  description: "Proxmox VE: qemu VMs cloned from a template (or created from a disk image) on one node, with cloud-init",
  manifest: proxmoxAccount,
  secretFields: ["tokenSecret"],
  client: (account, { fetch }) => new ProxmoxClient(account, fetch),
});
