// SIMULATED Acme Cloud: an in-memory emulator of the HTTP API provider.ts speaks, reached through
// a fetch function rather than a socket, so a test runs it inside workerd as well as in Node.
// Acme Cloud is made up for the walkthrough, but it behaves like a real VPS API: a bearer token
// (401 for a wrong one), asynchronous jobs for every change, labels on servers, a server busy
// with a job refusing another (423), unique names (409), an account server limit (422) and user
// data that is write-only (the API never returns it; the test reads it here).
//
// Time in the emulator is counted in requests: every authenticated request is one tick, and a job
// ends jobTicks ticks after it started. The same calls give the same answers, so a recording of
// a run replays exchange for exchange.

type Labels = Record<string, string>;

type Status = "provisioning" | "active" | "booting" | "rebooting" | "shutting_down" | "off" | "deleting";

interface Job {
  id: number;
  type: "create" | "power_on" | "power_off" | "reboot" | "delete";
  serverId: number;
  status: "running" | "done";
  endsAt: number;
}

/** A server as the emulator keeps it, user data and SSH keys included (the API returns neither). */
export interface AcmeServer {
  id: number;
  name: string;
  status: Status;
  size: string;
  image: string;
  region: string;
  labels: Labels;
  sshKeys: string[];
  userData: string | null;
  ipv4: string | null;
  /** The job running on it, if any: a second one is refused with 423 until it ends. */
  job: number | null;
}

export interface AcmeCloudOptions {
  /** The one API token the account accepts. */
  token: string;
  /** Requests a job takes to end; default 2. */
  jobTicks?: number;
  /** Servers the account may have at once; default 10. */
  serverLimit?: number;
}

const SIZES = [
  { slug: "a1.small", vcpus: 1, memory_mib: 2048, disk_gib: 25, regions: ["fra", "ams"] },
  { slug: "a1.medium", vcpus: 2, memory_mib: 4096, disk_gib: 50, regions: ["fra", "ams"] },
  { slug: "a1.large", vcpus: 4, memory_mib: 8192, disk_gib: 100, regions: ["fra"] },
];
const IMAGES = [
  { slug: "debian-13", name: "Debian 13" },
  { slug: "ubuntu-24.04", name: "Ubuntu 24.04 LTS" },
];
const REGIONS = [
  { slug: "fra", name: "Frankfurt" },
  { slug: "ams", name: "Amsterdam" },
];
const HOSTNAME = /^(?=.{1,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
const MAX_USER_DATA = 32 * 1024;

export class AcmeCloud {
  readonly servers = new Map<number, AcmeServer>();
  /** Servers ever created: a create made twice shows here. */
  created = 0;
  /** Authenticated requests served (the emulator's clock). */
  ticks = 0;
  readonly #jobs = new Map<number, Job>();
  readonly #o: Required<AcmeCloudOptions>;
  #nextServer = 1001;
  #nextJob = 1;

  constructor(options: AcmeCloudOptions) {
    this.#o = { jobTicks: 2, serverLimit: 10, ...options };
  }

  /** The API, as a fetch function (any origin: the path is what routes). */
  readonly fetch = async (input: Request | string | URL, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    if (request.headers.get("authorization") !== `Bearer ${this.#o.token}`)
      return error(401, "unauthorized", "the API token is not valid for any account");
    this.ticks++;
    this.#advance();
    const url = new URL(request.url);
    const route = `${request.method} ${url.pathname.replace(/\/\d+(?=\/|$)/g, "/:id")}`;
    const id = Number(/\/(\d+)(?:\/|$)/.exec(url.pathname)?.[1]);
    const body = request.method === "POST" ? await request.json().catch(() => undefined) : undefined;
    switch (route) {
      case "GET /v1/sizes":
        return json(200, { sizes: SIZES });
      case "GET /v1/images":
        return json(200, { images: IMAGES });
      case "GET /v1/regions":
        return json(200, { regions: REGIONS });
      case "GET /v1/servers":
        return json(200, { servers: this.#list(url.searchParams.get("label")).map(shown) });
      case "POST /v1/servers":
        return this.#create(body);
      case "GET /v1/servers/:id": {
        const server = this.servers.get(id);
        return server ? json(200, { server: shown(server) }) : error(404, "not_found", `server ${id} does not exist`);
      }
      case "POST /v1/servers/:id/actions":
        return this.#action(id, body);
      case "DELETE /v1/servers/:id":
        return this.#delete(id);
      case "GET /v1/jobs/:id": {
        const job = this.#jobs.get(id);
        return job ? json(200, { job: shownJob(job) }) : error(404, "not_found", `job ${id} does not exist`);
      }
      default:
        return error(404, "not_found", `no route ${request.method} ${url.pathname}`);
    }
  };

  /** Servers that still exist (deleting ones included). */
  liveServers(): AcmeServer[] {
    return [...this.servers.values()];
  }

  #list(label: string | null): AcmeServer[] {
    const servers = [...this.servers.values()];
    if (!label) return servers;
    const [key, value] = label.split("=", 2) as [string, string | undefined];
    return servers.filter((s) => (value === undefined ? key in s.labels : s.labels[key] === value));
  }

  #create(body: any): Response {
    const invalid = (field: string, why: string) => error(422, "invalid_request", `${field}: ${why}`);
    if (typeof body !== "object" || body === null) return error(400, "bad_json", "the body is not a JSON object");
    if (typeof body.name !== "string" || !HOSTNAME.test(body.name)) return invalid("name", "not a hostname");
    const size = SIZES.find((s) => s.slug === body.size);
    if (!size) return invalid("size", `no size ${JSON.stringify(body.size)}`);
    if (!IMAGES.some((i) => i.slug === body.image)) return invalid("image", `no image ${JSON.stringify(body.image)}`);
    if (!REGIONS.some((r) => r.slug === body.region)) return invalid("region", `no region ${JSON.stringify(body.region)}`);
    const keys = body.ssh_keys ?? [];
    if (!Array.isArray(keys) || keys.some((k) => typeof k !== "string" || !/^(ssh-|ecdsa-)\S+ \S+/.test(k)))
      return invalid("ssh_keys", "expected OpenSSH public keys");
    if (body.user_data !== undefined && (typeof body.user_data !== "string" || body.user_data.length > MAX_USER_DATA))
      return invalid("user_data", `expected a string of at most ${MAX_USER_DATA} bytes`);
    const labels = body.labels ?? {};
    if (typeof labels !== "object" || Object.values(labels).some((v) => typeof v !== "string"))
      return invalid("labels", "expected string values");
    if ([...this.servers.values()].some((s) => s.name === body.name)) return error(409, "name_taken", `a server named ${body.name} exists`);
    if (!size.regions.includes(body.region)) return error(422, "size_unavailable", `${size.slug} is not offered in ${body.region}`);
    if (this.servers.size >= this.#o.serverLimit)
      return error(422, "server_limit_reached", `the account may have ${this.#o.serverLimit} servers`);

    const server: AcmeServer = {
      id: this.#nextServer++,
      name: body.name,
      status: "provisioning",
      size: size.slug,
      image: body.image,
      region: body.region,
      labels: { ...labels },
      sshKeys: [...keys],
      userData: body.user_data ?? null,
      ipv4: null,
      job: null,
    };
    this.servers.set(server.id, server);
    this.created++;
    const job = this.#start(server, "create");
    return json(202, { server: shown(server), job: shownJob(job) });
  }

  #action(id: number, body: any): Response {
    const server = this.servers.get(id);
    if (!server) return error(404, "not_found", `server ${id} does not exist`);
    const type = body?.type;
    if (type !== "power_on" && type !== "power_off" && type !== "reboot")
      return error(422, "invalid_request", "type: expected power_on, power_off or reboot");
    if (server.job !== null) return busy(server);
    server.status = type === "power_on" ? "booting" : type === "power_off" ? "shutting_down" : "rebooting";
    return json(202, { job: shownJob(this.#start(server, type)) });
  }

  #delete(id: number): Response {
    const server = this.servers.get(id);
    if (!server) return error(404, "not_found", `server ${id} does not exist`);
    const running = server.job === null ? undefined : this.#jobs.get(server.job);
    // Deleting a server that is being deleted answers with the delete under way.
    if (running?.type === "delete") return json(202, { job: shownJob(running) });
    if (running) return busy(server);
    server.status = "deleting";
    return json(202, { job: shownJob(this.#start(server, "delete")) });
  }

  #start(server: AcmeServer, type: Job["type"]): Job {
    const job: Job = { id: this.#nextJob++, type, serverId: server.id, status: "running", endsAt: this.ticks + this.#o.jobTicks };
    this.#jobs.set(job.id, job);
    server.job = job.id;
    return job;
  }

  /** Ends the jobs whose time has come and applies them to their servers. */
  #advance(): void {
    for (const job of this.#jobs.values()) {
      if (job.status !== "running" || job.endsAt > this.ticks) continue;
      job.status = "done";
      const server = this.servers.get(job.serverId);
      if (!server) continue;
      server.job = null;
      if (job.type === "delete") this.servers.delete(server.id);
      else if (job.type === "power_off") server.status = "off";
      else {
        server.status = "active";
        server.ipv4 ??= `203.0.113.${server.id % 250}`;
      }
    }
  }
}

/** The server as the API shows it: never its user data or keys. */
const shown = (s: AcmeServer) => ({
  id: s.id,
  name: s.name,
  status: s.status,
  size: s.size,
  image: s.image,
  region: s.region,
  labels: s.labels,
  ipv4: s.ipv4,
});

const shownJob = (j: Job) => ({
  id: j.id,
  type: j.type,
  server_id: j.serverId,
  status: j.status,
  error: null,
});

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });

const error = (status: number, code: string, message: string, headers: Record<string, string> = {}) =>
  json(status, { error: { code, message } }, headers);

const busy = (server: AcmeServer) =>
  error(423, "server_busy", `server ${server.id} is busy with job ${server.job}`, { "retry-after": "1" });
