// @acme/bc-acme-cloud: a VPS provider for Acme Cloud, written as an outside package would (public
// entry points only). Acme Cloud's API: a bearer token, JSON, servers with labels, and a job for
// every change (create, power, delete) that ends on its own; GET /v1/jobs/:id says how it went.
// The instance id is stamped on the server as a label, so find() adopts a server whose create
// answer was lost. Every request goes through the fetch the platform gives the client.
import { z } from "zod";
import { defineProvider, providerError, type ProviderClient, type ProviderServer, type ServerStatus } from "better-compute/vps";
import { ProviderHttp, type Classified } from "better-compute/vps/http";

export const PROVIDER = "acme-cloud";
/** The label carrying the control plane's instance id. */
export const STAMP = "bc-instance";

const account = z.object({
  endpoint: z.url({ protocol: /^https?$/ }),
  token: z.string().min(8).max(256),
});

const STATUS: Record<string, ServerStatus> = {
  provisioning: "creating",
  active: "running",
  booting: "starting",
  rebooting: "starting",
  shutting_down: "stopping",
  off: "stopped",
  deleting: "deleting",
};

/** Acme's error codes that mean the account cannot have the server, as opposed to a bad request. */
const CAPACITY = new Set(["server_limit_reached", "size_unavailable"]);

function classify(response: Response, body: unknown): Classified {
  const { code = `http_${response.status}`, message = response.statusText || "no message" } =
    (body as { error?: { code?: string; message?: string } } | null)?.error ?? {};
  const reason = { reason: code, message: `${message} (${code})` };
  if (response.status === 401 || response.status === 403) return { failure: "config", ...reason };
  // Refused before anything happened: safe to send again, POST included.
  if (response.status === 429 || response.status === 423) return { failure: "transient", refused: true, ...reason };
  if (response.status >= 500) return { failure: "transient", ...reason };
  if (CAPACITY.has(code)) return { failure: "capacity", ...reason };
  return { failure: "rejected", ...reason };
}

interface AcmeServer {
  id: number;
  name: string;
  status: string;
  labels: Record<string, string>;
  ipv4: string | null;
}

const server = (s: AcmeServer): ProviderServer => ({
  id: String(s.id),
  ...(s.labels[STAMP] ? { instanceId: s.labels[STAMP] } : {}),
  name: s.name,
  status: STATUS[s.status] ?? "unknown",
  addresses: s.ipv4 ? [s.ipv4] : [],
});

/** Acme's server ids are numbers: anything else names no server. */
const serverPath = (id: string) => (/^\d{1,15}$/.test(id) ? `/servers/${id}` : undefined);

export const acmeCloudProvider = defineProvider({
  id: PROVIDER,
  version: "1",
  description: "Acme Cloud servers (the extension walkthrough's provider)",
  manifest: account,
  secretFields: ["token"],
  client(acct, { fetch }): ProviderClient {
    const http = new ProviderHttp({
      provider: PROVIDER,
      baseUrl: `${acct.endpoint.replace(/\/$/, "")}/v1`,
      fetch,
      headers: { authorization: `Bearer ${acct.token}` },
      secrets: [acct.token],
      classify,
    });
    const find = async (instanceId: string) => {
      const res = await http.request<{ servers: AcmeServer[] }>("GET", "/servers", { query: { label: `${STAMP}=${instanceId}` } });
      return res.body.servers[0] ? server(res.body.servers[0]) : null;
    };
    const action = async (id: string, type: "power_on" | "power_off" | "reboot") => {
      const path = serverPath(id);
      if (!path) throw providerError(PROVIDER, "rejected", `no server ${JSON.stringify(id)}`, { reason: "not_found" });
      const res = await http.request<{ job: { id: number } }>("POST", `${path}/actions`, { json: { type } });
      return { id: String(res.body.job.id) };
    };
    return {
      async offers() {
        // One after the other: a recording replays in the order the requests were sent.
        const sizes = await http.request("GET", "/sizes");
        const images = await http.request("GET", "/images");
        const regions = await http.request("GET", "/regions");
        return {
          flavors: sizes.body.sizes.map((s: any) => ({
            id: s.slug,
            name: s.slug,
            vcpus: s.vcpus,
            memoryMiB: s.memory_mib,
            diskGiB: s.disk_gib,
            locations: s.regions,
          })),
          images: images.body.images.map((i: any) => ({ id: i.slug, name: i.name })),
          locations: regions.body.regions.map((r: any) => ({ id: r.slug, name: r.name })),
        };
      },
      async create(request) {
        const existing = await find(request.instanceId);
        if (existing) return { server: existing };
        const res = await http.request("POST", "/servers", {
          json: {
            name: request.name,
            size: request.flavor,
            image: request.image,
            region: request.location,
            ssh_keys: request.sshKeys.map((k) => k.publicKey),
            ...(request.userData !== undefined ? { user_data: request.userData } : {}),
            labels: { [STAMP]: request.instanceId },
          },
          accept: [409],
        });
        if (res.status === 409) {
          // The name is taken: by this instance's own server (a create raced this one), or by another.
          const raced = await find(request.instanceId);
          if (raced) return { server: raced };
          throw providerError(PROVIDER, "rejected", `a server named ${request.name} already exists`, { reason: "name_taken", status: 409 });
        }
        return { server: server(res.body.server), operation: { id: String(res.body.job.id) } };
      },
      async get(id) {
        const path = serverPath(id);
        if (!path) return null;
        const res = await http.request<{ server: AcmeServer }>("GET", path, { accept: [404] });
        return res.status === 404 ? null : server(res.body.server);
      },
      find,
      async list() {
        return (await http.request<{ servers: AcmeServer[] }>("GET", "/servers")).body.servers.map(server);
      },
      powerOn: (id) => action(id, "power_on"),
      powerOff: (id) => action(id, "power_off"),
      reboot: (id) => action(id, "reboot"),
      async delete(id) {
        const path = serverPath(id);
        if (!path) return;
        const res = await http.request<{ job: { id: number } }>("DELETE", path, { accept: [404] });
        return res.status === 404 ? undefined : { id: String(res.body.job.id) };
      },
      async operation(id) {
        const res = await http.request<{ job: { status: string; error: { message: string } | null } }>(
          "GET",
          `/jobs/${encodeURIComponent(id)}`,
        );
        const { status, error } = res.body.job;
        if (status === "done") return { state: "succeeded" };
        if (status === "failed") return { state: "failed", message: error?.message ?? "the job failed" };
        return { state: "running" };
      },
    };
  },
});
