// The site agent's network boot service, on the provisioning interface its configuration names
// and no other: DHCP and TFTP by dnsmasq (dnsmasq.ts), and an HTTP server on the interface's
// address for the machines' iPXE scripts (each at an unguessable name), the ramdisk's kernel and
// initrds, and the images the machines write (all served from the image store by sha256). The
// machines it expects and what each boots are kept on disk (machines.ts): a restart of the agent
// loses none of them. Node-only, Linux.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import fs from "node:fs/promises";
import path from "node:path";
import { AgentError, type AgentLogger, type FetchLike } from "../../contracts.ts";
import { IPXE_EXIT, ipxeScript } from "../boot.ts";
import { Dnsmasq, type DhcpConfig } from "./dnsmasq.ts";
import { ImageStore, type StoredImage } from "./image-store.ts";
import { MachineRegistry, normalMac, type BootAction, type NetbootMachine } from "./machines.ts";

export interface NetbootConfig {
  /** Where the service keeps its files (machines, dnsmasq's configuration and leases): a directory of the agent's state. */
  stateDir: string;
  /** The site agent's address on the provisioning interface: the HTTP server listens there. */
  address: string;
  /** Its HTTP port; 0 picks a free one. */
  httpPort: number;
  /** DHCP and TFTP; absent: none (a simulated site, whose machines ask the registry themselves). */
  dhcp?: DhcpConfig;
  /** The ramdisk machines boot into: its build directory (npm run ramdisk-image), with manifest.json. */
  ramdiskDir?: string;
  /** More kernel command line for the ramdisk (console=ttyS0, ...). */
  ramdiskCmdline?: string;
  /** The control plane's URL as the machines reach it (bc.url on the ramdisk's command line). */
  controlPlaneUrl: string;
  images: { dir: string; maxBytes: number };
  fetch?: FetchLike;
  /** A blob from the control plane by its sha256 (GET /agent/v1/blobs/<sha256> with the agent's credential); absent: none can be cached. */
  blob?: (sha256: string, signal?: AbortSignal) => Promise<Response>;
  log: AgentLogger;
}

/** What the cache mirrors: an image at a URL (an ImageSource), or a blob of the control plane's (a rendered ISO). */
export type ImageSourceRef = { url: string; sha256: string } | { blob: string };

/** What npm run ramdisk-image's manifest says of its files (agent/build/ramdisk.ts): a kernel and one initrd, or several. */
interface RamdiskFiles {
  kernel: { file: string };
  initrd?: { file: string };
  initrds?: { file: string }[];
}

export class NetbootService {
  readonly machines: MachineRegistry;
  readonly images: ImageStore;
  readonly #config: NetbootConfig;
  readonly #dnsmasq: Dnsmasq | undefined;
  #server: Server | undefined;
  #baseUrl = "";
  #ramdisk: { kernel: StoredImage; initrds: StoredImage[] } | undefined;

  constructor(config: NetbootConfig) {
    this.#config = config;
    this.machines = new MachineRegistry(config.stateDir);
    this.images = new ImageStore({ ...config.images, ...(config.fetch ? { fetch: config.fetch } : {}) });
    this.#dnsmasq = config.dhcp ? new Dnsmasq(config.stateDir, config.dhcp, config.log) : undefined;
  }

  /** http://<address>:<port>: what the machines fetch from. */
  get baseUrl(): string {
    return this.#baseUrl;
  }

  async start(): Promise<void> {
    await this.machines.load();
    await this.images.open();
    if (this.#config.ramdiskDir) this.#ramdisk = await this.#loadRamdisk(this.#config.ramdiskDir);
    this.#server = createServer((req, res) => void this.#answer(req.url ?? "", req.method ?? "GET", req.headers.range, res));
    await new Promise<void>((resolve, reject) => {
      this.#server!.once("error", reject);
      this.#server!.listen(this.#config.httpPort, this.#config.address, () => resolve());
    });
    const { port } = this.#server.address() as AddressInfo;
    this.#baseUrl = `http://${this.#config.address.includes(":") ? `[${this.#config.address}]` : this.#config.address}:${port}`;
    await this.#dnsmasq?.apply(this.machines.all(), (m) => this.scriptUrl(m));
    this.#config.log.info("network boot service started", {
      http: this.#baseUrl,
      dhcp: this.#config.dhcp ? `${this.#config.dhcp.mode.kind} on ${this.#config.dhcp.interface}` : "none",
      machines: this.machines.all().length,
      ramdisk: this.#ramdisk ? "ready" : "none",
    });
  }

  async stop(): Promise<void> {
    await this.#dnsmasq?.stop();
    await new Promise<void>((resolve) => (this.#server ? this.#server.close(() => resolve()) : resolve()));
    this.#server?.closeAllConnections();
  }

  scriptUrl(m: NetbootMachine): string {
    return `${this.#baseUrl}/boot/${m.script}.ipxe`;
  }

  /** Lists the machine (its MACs) with what it boots next, and lets DHCP answer it. */
  async set(entry: { machine: string; macs: string[]; action: BootAction; token?: string }): Promise<NetbootMachine> {
    const macs = entry.macs.map((mac) => normalMac(mac) ?? mac);
    const bad = macs.find((mac) => normalMac(mac) === undefined);
    if (bad !== undefined) throw new AgentError("INVALID_ARGUMENT", `not a MAC address: ${JSON.stringify(bad)}`);
    if (entry.action === "ramdisk") {
      if (!this.#ramdisk)
        throw new AgentError("FAILED_PRECONDITION", "this site agent has no ramdisk to boot machines into (--ramdisk-dir)");
      if (!entry.token) throw new AgentError("INVALID_ARGUMENT", "a ramdisk boot needs the ramdisk's join token");
    }
    const machine = await this.machines.set({ ...entry, macs });
    await this.#dnsmasq?.apply(this.machines.all(), (m) => this.scriptUrl(m));
    return machine;
  }

  /** Forgets the machine: DHCP no longer answers it. */
  async clear(machine: string): Promise<boolean> {
    const had = await this.machines.remove(machine);
    if (had) await this.#dnsmasq?.apply(this.machines.all(), (m) => this.scriptUrl(m));
    return had;
  }

  /** The image's URL on the provisioning network, fetched into the store first if it is not there. */
  async cacheImage(source: ImageSourceRef, signal?: AbortSignal): Promise<{ url: string; sha256: string; bytes: number }> {
    let image: StoredImage;
    if ("url" in source) image = await this.images.fetch(source.url, source.sha256, signal);
    else {
      const blob = this.#config.blob;
      if (!blob) throw new AgentError("UNSUPPORTED", "this site agent fetches no blobs from the control plane");
      image = await this.images.fetch(`blob ${source.blob}`, source.blob, signal, () => blob(source.blob.toLowerCase(), signal));
    }
    return { url: `${this.#baseUrl}/images/${image.sha256}`, sha256: image.sha256, bytes: image.bytes };
  }

  /** The iPXE script of a machine: boot the ramdisk with its token, or leave for the disk. */
  script(m: NetbootMachine): string {
    if (m.action === "disk" || !this.#ramdisk) return IPXE_EXIT;
    const url = (image: StoredImage) => `${this.#baseUrl}/images/${image.sha256}`;
    // quiet: otherwise the kernel prints its command line, the token with it, on the console.
    const cmdline = ["quiet", `bc.url=${this.#config.controlPlaneUrl}`, `bc.token=${m.token}`, this.#config.ramdiskCmdline ?? ""];
    return ipxeScript({ kernelUrl: url(this.#ramdisk.kernel), initrdUrl: this.#ramdisk.initrds.map(url), cmdline: cmdline.join(" ") });
  }

  async #answer(url: string, method: string, range: string | undefined, res: import("node:http").ServerResponse): Promise<void> {
    const notFound = () => res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    if (method !== "GET" && method !== "HEAD") return void notFound();
    const pathname = url.split("?")[0] ?? "";
    const script = /^\/boot\/([A-Za-z0-9_-]{43})\.ipxe$/.exec(pathname)?.[1];
    if (script !== undefined) {
      const machine = this.machines.byScript(script);
      if (!machine) return void notFound();
      const body = this.script(machine);
      this.#config.log.info("served an iPXE script", { machine: machine.machine, action: machine.action });
      return void res
        .writeHead(200, { "content-type": "text/plain", "cache-control": "no-store" })
        .end(method === "HEAD" ? undefined : body);
    }
    const sha256 = /^\/images\/([0-9a-f]{64})$/.exec(pathname)?.[1];
    const image = sha256 ? await this.images.get(sha256) : undefined;
    if (!image) return void notFound();
    // A ramdisk whose download stopped (this agent restarted) resumes it from where it stopped;
    // other ranges are ignored (HTTP allows it): the whole image.
    const from = range === undefined ? undefined : /^bytes=(\d+)-$/.exec(range)?.[1];
    if (from !== undefined && Number(from) >= image.bytes)
      return void res.writeHead(416, { "content-range": `bytes */${image.bytes}` }).end();
    const start = Number(from ?? 0);
    res.writeHead(from === undefined ? 200 : 206, {
      "content-type": "application/octet-stream",
      "content-length": String(image.bytes - start),
      "accept-ranges": "bytes",
      ...(from === undefined ? {} : { "content-range": `bytes ${start}-${image.bytes - 1}/${image.bytes}` }),
    });
    if (method === "HEAD") return void res.end();
    await this.images.serve(image, res, start).catch((e: unknown) => {
      this.#config.log.error("serving an image failed", { sha256: image.sha256, error: (e as Error).message });
      res.destroy();
    });
  }

  /** The ramdisk's files, added to the image store (served by sha256 like any image). */
  async #loadRamdisk(dir: string): Promise<{ kernel: StoredImage; initrds: StoredImage[] }> {
    let manifest: RamdiskFiles;
    try {
      manifest = JSON.parse(await fs.readFile(path.join(dir, "manifest.json"), "utf8")) as RamdiskFiles;
    } catch (e) {
      throw new AgentError(
        "INVALID_CONFIG",
        `--ramdisk-dir ${dir} holds no ramdisk manifest (npm run ramdisk-image): ${(e as Error).message}`,
      );
    }
    const initrds = manifest.initrds ?? (manifest.initrd ? [manifest.initrd] : []);
    return {
      kernel: await this.images.add(path.join(dir, manifest.kernel.file)),
      initrds: await Promise.all(initrds.map((i) => this.images.add(path.join(dir, i.file)))),
    };
  }
}
