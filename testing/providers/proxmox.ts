// A Proxmox VE API emulator for tests (better-compute/testing/proxmox): SIMULATED, nothing here
// runs a virtual machine. It serves the part of PVE's HTTP API a VPS adapter and proxmoxer use
// (docs/providers/proxmox.md, ../shared/PROVIDERS.md §3), as a real node:https server on
// 127.0.0.1 with a self-signed certificate made at start (HTTPS only, as PVE and proxmoxer are):
//
//   GET  /api2/json/version, /nodes, /cluster/nextid[?vmid=], /cluster/resources[?type=vm|node|storage]
//   GET  /nodes/{node}/qemu                          POST /nodes/{node}/qemu (create, incl. import-from)
//   POST /nodes/{node}/qemu/{vmid}/clone             GET|PUT|POST /nodes/{node}/qemu/{vmid}/config
//   PUT  /nodes/{node}/qemu/{vmid}/resize            GET /nodes/{node}/qemu/{vmid}/status/current
//   POST /nodes/{node}/qemu/{vmid}/status/{start|stop|shutdown|reboot|reset|suspend|resume}
//   DELETE /nodes/{node}/qemu/{vmid}[?purge=1&destroy-unreferenced-disks=1]
//   GET  /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces
//   GET  /nodes/{node}/tasks/{upid}/status, /nodes/{node}/tasks/{upid}/log (the UPID raw or percent-encoded)
//
// As PVE does it: API token auth (Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET), every
// answer {"data":...} (errors too, with "errors" for parameter failures) and the error text in the
// HTTP reason phrase; a VM that does not exist is 500 "Configuration file ... does not exist";
// mutating calls start a task (UPID, 9 colon-separated fields with a trailing colon) that runs for
// setActionDurationMs (0: done before the answer) and ends with exitstatus "OK" or an error; a
// clone or create holds the VM's lock until it ends; sshkeys must be URL-encoded; nextid only
// suggests an id. Faults are injected on demand: 429 (as a reverse proxy in front of PVE answers;
// PVE itself has no rate limit), 502, 596 timeouts, lock timeouts, answers lost after the call
// acted, failed tasks, and a racing client taking the id nextid just suggested.
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { selfSignedCertificate } from "../tls.ts";
import { seededRandom } from "../seeded-random.ts";

export interface ProxmoxTemplate {
  vmid: number;
  name: string;
  /** Size of its disk (scsi0) in MiB; default 3584 (a cloud image). */
  diskMiB?: number;
}

export interface ProxmoxEmulatorOptions {
  /** The node VMs live on; default "pve". */
  node?: string;
  /** Every node of the cluster (default [node]). */
  nodes?: string[];
  /** The one API token it accepts; default root@pam!bc and a random UUID secret. */
  tokenId?: string;
  tokenSecret?: string;
  /** Templates on the node; default one Ubuntu cloud image, vmid 9000. */
  templates?: ProxmoxTemplate[];
  /** Disk images a create may import from (import-from=<volid>); default one Debian cloud image. */
  volumes?: { volid: string; sizeMiB: number }[];
  /** Storages of the node; default local (iso, import, snippets) and local-lvm (images). */
  storages?: string[];
  /** How long a task runs, in ms; default 0 (done before the answer). */
  actionDurationMs?: number;
  /** A reverse proxy's limit in front of the API: at most `limit` calls per `windowMs`, then 429 with Retry-After. */
  rateLimit?: { limit: number; windowMs: number };
  /** Seeds the share of faults (deterministic runs); default 1. */
  seed?: number;
}

export interface EmulatedVm {
  vmid: number;
  node: string;
  status: "running" | "stopped";
  /** The config file's keys, values as PVE stores them (strings). */
  config: Record<string, string>;
  startedAt?: number;
}

export interface EmulatedTask {
  upid: string;
  node: string;
  type: string;
  id: string;
  status: "running" | "stopped";
  exitstatus?: string;
  starttime: number;
  pid: number;
  log: string[];
}

/**
 * A call's injected failure: `rate-limit` 429 with Retry-After (a proxy's), `bad-gateway` 502 (a
 * proxy's), `timeout` 596 (pveproxy's when a node does not answer), `locked` 500 "can't lock
 * file ... got timeout" (PVE's, before it acts), `lost-answer` the call acts and then answers 596.
 */
export type ProxmoxFault = "rate-limit" | "bad-gateway" | "timeout" | "locked" | "lost-answer";

type Match = (method: string, path: string) => boolean;

export interface ProxmoxFaults {
  /** The next `n` calls (those `match` picks, default all) answer with the fault. */
  next(n: number, fault: ProxmoxFault, match?: Match): void;
  /** A share (0..1) of calls (those `match` picks) answer with one of the faults, picked by the seeded generator. */
  share(share: number, faults: ProxmoxFault[], match?: Match): void;
  /** The next `n` tasks (of these types, e.g. ["qmclone"]; default any) end with this exitstatus instead of OK. */
  failTasks(n: number, exitstatus?: string, types?: string[]): void;
  /** A share (0..1) of tasks end with this exitstatus. */
  failTaskShare(share: number, exitstatus?: string, types?: string[]): void;
  /** The next `n` ids nextid suggests are taken by another client (a VM of its own) right after the answer. */
  raceNextId(n: number): void;
  clear(): void;
}

export interface ProxmoxEmulator {
  /** https://127.0.0.1:<port>: an account's baseUrl. */
  url: string;
  /** 127.0.0.1:<port>: proxmoxer's host argument. */
  host: string;
  node: string;
  tokenId: string;
  tokenSecret: string;
  /** The certificate (PEM, valid for 127.0.0.1 and localhost) and its pin: an account's tls. */
  certificate: string;
  spkiSha256: string;
  vms: Map<number, EmulatedVm>;
  tasks: Map<string, EmulatedTask>;
  counters: {
    /** VMs made by clone or create, ever (failed ones included). */
    serversCreated: number;
    /** HTTP requests received, refused ones included. */
    requests: number;
    /** Calls answered, by "METHOD /path/{pattern}". */
    calls: Record<string, number>;
    /** 429s the rate-limit window answered. */
    rateLimited: number;
    /** Requests that arrived inside a window after that window had answered 429 (a client that did not wait). */
    callsWhileLimited: number;
    /** Faults injected, by kind ("task" for a failed task). */
    faults: Record<ProxmoxFault | "task", number>;
    /** VMs that are not templates, now. */
    liveServers(): number;
  };
  faults: ProxmoxFaults;
  setActionDurationMs(ms: number): void;
  stop(): Promise<void>;
}

/** A failure PVE answers: its status, the message it puts in the reason phrase, parameter errors. */
class PveError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly errors?: Record<string, string>,
  ) {
    super(message);
  }
}

const paramError = (errors: Record<string, string>) => new PveError(400, "Parameter verification failed.", errors);
const noConfig = (node: string, vmid: number | string) =>
  new PveError(500, `Configuration file 'nodes/${node}/qemu-server/${vmid}.conf' does not exist`);

// PVE's formats (pve-common JSONSchema), as far as the emulator checks them.
const DNS_NAME = /^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$/;
const URLENCODED = /^[-%a-zA-Z0-9_.!~*'()]*$/;
const TAG = /^[a-z0-9_][a-z0-9_+.-]*$/i;
const SSH_KEY =
  /^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com) [A-Za-z0-9+/]+={0,3}( .*)?$/;
const DISK_KEY = /^(scsi\d+|virtio\d+|sata\d+|ide\d+)$/;
const NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties";
const CLONE_KEYS = new Set(["newid", "name", "full", "storage", "target", "description", "pool", "format", "snapname", "bwlimit"]);
const CONFIG_KEYS = new Set([
  "name", "description", "tags", "cores", "sockets", "memory", "cpu", "ostype", "scsihw", "boot", "agent", "serial0", "vga",
  "onboot", "net0", "net1", "ciuser", "cipassword", "sshkeys", "ipconfig0", "ipconfig1", "cicustom", "citype", "nameserver",
  "searchdomain", "ciupgrade", "digest", "delete", "skiplock", "machine", "bios", "numa", "balloon",
]); // prettier-ignore

const hex8 = (n: number) => n.toString(16).toUpperCase().padStart(8, "0");

/** Size in MiB from PVE's notation ("3584M", "20G", "1T", "+10G" is relative and handled by the caller). */
function mib(size: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)([KMGT]?)$/.exec(size);
  if (!m) return undefined;
  const factor = { "": 1 / (1024 * 1024), K: 1 / 1024, M: 1, G: 1024, T: 1024 * 1024 }[m[2] as "" | "K" | "M" | "G" | "T"];
  return Math.round(Number(m[1]) * factor);
}
const sizeText = (sizeMiB: number) => (sizeMiB % 1024 === 0 ? `${sizeMiB / 1024}G` : `${sizeMiB}M`);

export async function startProxmoxEmulator(options: ProxmoxEmulatorOptions = {}): Promise<ProxmoxEmulator> {
  const node = options.node ?? "pve";
  const nodes = options.nodes ?? [node];
  const tokenId = options.tokenId ?? "root@pam!bc";
  const tokenSecret = options.tokenSecret ?? randomUUID();
  const [tokenUser, tokenName] = tokenId.split("!") as [string, string];
  const storages = options.storages ?? ["local", "local-lvm"];
  const volumes = new Map(
    (options.volumes ?? [{ volid: "local:import/debian-12-genericcloud-amd64.qcow2", sizeMiB: 2048 }]).map((v) => [v.volid, v]),
  );
  let durationMs = options.actionDurationMs ?? 0;
  const random = seededRandom(options.seed ?? 1);
  const certificate = selfSignedCertificate("pve.emulator", { altNames: ["IP:127.0.0.1", "DNS:localhost"] });

  const vms = new Map<number, EmulatedVm>();
  const tasks = new Map<string, EmulatedTask>();
  const timers = new Set<NodeJS.Timeout>();
  const counters = {
    serversCreated: 0,
    requests: 0,
    calls: {} as Record<string, number>,
    rateLimited: 0,
    callsWhileLimited: 0,
    faults: { "rate-limit": 0, "bad-gateway": 0, timeout: 0, locked: 0, "lost-answer": 0, task: 0 } as Record<
      ProxmoxFault | "task",
      number
    >,
    liveServers: () => [...vms.values()].filter((vm) => vm.config.template !== "1").length,
  };
  const pstart = Math.floor(random() * 0xfffffff);
  let pid = 0x10000 + Math.floor(random() * 0xfffff);
  let macSerial = 1;

  const mac = () => {
    const n = macSerial++;
    return `BC:24:11:${hex8(n).slice(2, 4)}:${hex8(n).slice(4, 6)}:${hex8(n).slice(6, 8)}`;
  };

  for (const t of options.templates ?? [{ vmid: 9000, name: "ubuntu-24.04-cloud" }]) {
    vms.set(t.vmid, {
      vmid: t.vmid,
      node,
      status: "stopped",
      config: {
        name: t.name,
        template: "1",
        cores: "1",
        memory: "1024",
        ostype: "l26",
        scsihw: "virtio-scsi-pci",
        scsi0: `local-lvm:base-${t.vmid}-disk-0,size=${sizeText(t.diskMiB ?? 3584)}`,
        ide2: `local-lvm:vm-${t.vmid}-cloudinit,media=cdrom`,
        net0: `virtio=${mac()},bridge=vmbr0`,
        boot: "order=scsi0",
        serial0: "socket",
        vga: "serial0",
        agent: "1",
      },
    });
  }

  // ------------------------------------------------------------------ faults
  type CallFault = { left: number; fault: ProxmoxFault; match?: Match };
  type ShareFault = { share: number; faults: ProxmoxFault[]; match?: Match };
  type TaskFault = { left?: number; share?: number; exitstatus: string; types?: string[] };
  let callFaults: CallFault[] = [];
  let shareFaults: ShareFault[] = [];
  let taskFaults: TaskFault[] = [];
  let nextIdRaces = 0;
  const faults: ProxmoxFaults = {
    next: (n, fault, match) => void callFaults.push({ left: n, fault, match }),
    share: (share, list, match) => void shareFaults.push({ share, faults: list, match }),
    failTasks: (n, exitstatus = "command failed: unexpected error (injected)", types) =>
      void taskFaults.push({ left: n, exitstatus, types }),
    failTaskShare: (share, exitstatus = "command failed: unexpected error (injected)", types) =>
      void taskFaults.push({ share, exitstatus, types }),
    raceNextId: (n) => void (nextIdRaces += n),
    clear: () => {
      callFaults = [];
      shareFaults = [];
      taskFaults = [];
      nextIdRaces = 0;
    },
  };

  function pickCallFault(method: string, path: string): ProxmoxFault | undefined {
    const fault = chooseCallFault(method, path);
    if (fault) counters.faults[fault]++;
    return fault;
  }

  function chooseCallFault(method: string, path: string): ProxmoxFault | undefined {
    const counted = callFaults.find((f) => f.left > 0 && (f.match?.(method, path) ?? true));
    if (counted) {
      counted.left--;
      return counted.fault;
    }
    for (const f of shareFaults) {
      if (!(f.match?.(method, path) ?? true)) continue;
      if (random() < f.share) return f.faults[Math.floor(random() * f.faults.length)];
    }
    return undefined;
  }

  function taskFailure(type: string): string | undefined {
    const exitstatus = chooseTaskFailure(type);
    if (exitstatus !== undefined) counters.faults.task++;
    return exitstatus;
  }

  function chooseTaskFailure(type: string): string | undefined {
    for (const f of taskFaults) {
      if (f.types && !f.types.includes(type)) continue;
      if (f.left !== undefined && f.left > 0) {
        f.left--;
        return f.exitstatus;
      }
      if (f.share !== undefined && random() < f.share) return f.exitstatus;
    }
    return undefined;
  }

  // ------------------------------------------------------------------ tasks
  /**
   * Starts a task: `complete` applies its effect when it ends well, `fail` undoes what the task
   * had begun when it ends with an error (an injected one, or one `complete` throws).
   */
  function startTask(type: string, id: string | number, work: { complete(): void; fail?(): void }): string {
    const starttime = Math.floor(Date.now() / 1000);
    const taskPid = pid++;
    const upid = `UPID:${node}:${hex8(taskPid)}:${hex8(pstart)}:${hex8(starttime)}:${type}:${id}:${tokenId}:`;
    const task: EmulatedTask = { upid, node, type, id: String(id), status: "running", starttime, pid: taskPid, log: [] };
    tasks.set(upid, task);
    const finish = () => {
      let exitstatus = taskFailure(type);
      if (exitstatus === undefined) {
        try {
          work.complete();
          exitstatus = "OK";
        } catch (e) {
          exitstatus = e instanceof Error ? e.message : String(e);
        }
      }
      if (exitstatus !== "OK") work.fail?.();
      task.log.push(exitstatus === "OK" ? "TASK OK" : `TASK ERROR: ${exitstatus}`);
      task.status = "stopped";
      task.exitstatus = exitstatus;
    };
    if (durationMs <= 0) finish();
    else {
      const timer = setTimeout(() => {
        timers.delete(timer);
        finish();
      }, durationMs);
      timers.add(timer);
    }
    return upid;
  }

  // ------------------------------------------------------------------ VMs
  function vmOn(nodeName: string, vmidText: string): EmulatedVm {
    const vmid = Number(vmidText);
    const vm = Number.isInteger(vmid) ? vms.get(vmid) : undefined;
    if (!vm || vm.node !== nodeName) throw noConfig(nodeName, vmidText);
    return vm;
  }

  function checkUnlocked(vm: EmulatedVm): void {
    if (vm.config.lock) throw new PveError(500, `VM is locked (${vm.config.lock})`);
  }

  function checkVmidFree(vmid: number, prefix = ""): void {
    const taken = vms.get(vmid);
    if (taken) throw new PveError(500, `${prefix}VM ${vmid} already exists on node '${taken.node}'`);
  }

  function parseVmid(value: string | undefined, param: string): number {
    const vmid = Number(value);
    if (value === undefined || !/^\d+$/.test(value)) throw paramError({ [param]: "property is missing and it is not optional" });
    if (vmid < 100 || vmid > 999_999_999) throw paramError({ [param]: `value must have a minimum value of 100` });
    return vmid;
  }

  function checkStorage(storage: string): void {
    if (!storages.includes(storage)) throw new PveError(500, `storage '${storage}' does not exist`);
  }

  /** Checks config parameters as PVE's schema does: 400 naming each bad one. */
  function validateConfig(params: Record<string, string>, extra: string[] = []): void {
    const errors: Record<string, string> = {};
    for (const [key, value] of Object.entries(params)) {
      if (!CONFIG_KEYS.has(key) && !DISK_KEY.test(key) && !extra.includes(key)) {
        errors[key] = NOT_IN_SCHEMA;
      } else if (key === "name" && !DNS_NAME.test(value)) {
        errors[key] = "invalid format - value does not look like a valid DNS name";
      } else if ((key === "cores" || key === "sockets") && !/^[1-9]\d*$/.test(value)) {
        errors[key] = "type check ('integer') failed - got '" + value + "'";
      } else if (key === "memory" && !(/^\d+$/.test(value) && Number(value) >= 16)) {
        errors[key] = "value must have a minimum value of 16";
      } else if (key === "tags") {
        const bad = value.split(/[;, ]+/).find((t) => t !== "" && !TAG.test(t));
        if (bad !== undefined) errors[key] = `invalid format - invalid characters in tag '${bad}'`;
      } else if (key === "sshkeys") {
        if (!URLENCODED.test(value)) errors[key] = `invalid format - invalid urlencoded string: ${value}`;
        else {
          const bad = decodeURIComponent(value)
            .split("\n")
            .find((line) => line.trim() !== "" && !SSH_KEY.test(line.trim()));
          if (bad !== undefined) errors[key] = "invalid format - unable to parse ssh key";
        }
      } else if (/^ipconfig\d+$/.test(key)) {
        const ok = value.split(",").every((part) => {
          const [k, v = ""] = part.split("=");
          if (k === "ip") return v === "dhcp" || /^[\d.]+\/\d+$/.test(v);
          if (k === "ip6") return v === "dhcp" || v === "auto" || /^[0-9a-f:]+\/\d+$/i.test(v);
          return (k === "gw" || k === "gw6") && v !== "";
        });
        if (!ok) errors[key] = "invalid format - format error";
      } else if (key === "cicustom") {
        const ok = value.split(",").every((part) => /^(user|network|meta|vendor)=[a-zA-Z][\w.-]*:.+$/.test(part));
        if (!ok) errors[key] = "invalid format - format error";
      }
    }
    if (Object.keys(errors).length) throw paramError(errors);
  }

  /** Turns disk parameters into allocated volumes, as PVE does at create: "<storage>:<GiB>", ":0,import-from=", ":cloudinit". */
  function allocateDisks(vmid: number, params: Record<string, string>): void {
    let n = 0;
    for (const key of Object.keys(params).filter((k) => DISK_KEY.test(k))) {
      const [volume = "", ...opts] = params[key]!.split(",");
      if (volume === "none" || opts.includes("media=cdrom")) continue;
      const [storage = "", spec = ""] = volume.split(":");
      checkStorage(storage);
      if (spec === "cloudinit") {
        params[key] = `${storage}:vm-${vmid}-cloudinit,media=cdrom`;
        continue;
      }
      const importFrom = opts.find((o) => o.startsWith("import-from="))?.slice("import-from=".length);
      let sizeMiB: number;
      if (importFrom !== undefined) {
        const source = volumes.get(importFrom);
        if (!source) throw new PveError(500, `unable to parse volume ID '${importFrom}' or volume does not exist`);
        sizeMiB = source.sizeMiB;
      } else if (/^\d+(\.\d+)?$/.test(spec) && Number(spec) > 0) sizeMiB = Number(spec) * 1024;
      else throw paramError({ [key]: "invalid format - unable to parse drive options" });
      const rest = opts.filter((o) => !o.startsWith("import-from=") && !o.startsWith("size="));
      params[key] = [`${storage}:vm-${vmid}-disk-${n++}`, ...rest, `size=${sizeText(sizeMiB)}`].join(",");
    }
  }

  /** Applies config parameters (validated) to a VM: `delete` removes keys; tags are stored with ';'. */
  function applyConfig(vm: EmulatedVm, params: Record<string, string>): void {
    const { delete: remove, digest, skiplock, ...set } = params;
    if (digest !== undefined && digest !== configDigest(vm)) {
      throw new PveError(500, "detected modified configuration - file changed by other user? Try again.");
    }
    if (!skiplock) checkUnlocked(vm);
    for (const key of (remove ?? "").split(/[,;\s]+/).filter(Boolean)) delete vm.config[key];
    for (const [key, value] of Object.entries(set)) {
      if (key === "tags")
        vm.config.tags = value
          .split(/[;, ]+/)
          .filter(Boolean)
          .join(";");
      else if (DISK_KEY.test(key) && /:cloudinit$/.test(value.split(",")[0]!)) {
        const storage = value.split(":")[0]!;
        checkStorage(storage);
        vm.config[key] = `${storage}:vm-${vm.vmid}-cloudinit,media=cdrom`;
      } else vm.config[key] = value;
    }
  }

  const configDigest = (vm: EmulatedVm) =>
    createHash("sha1")
      .update(
        Object.keys(vm.config)
          .sort()
          .map((k) => `${k}: ${vm.config[k]}`)
          .join("\n"),
      )
      .digest("hex");

  /** The first disk of the VM that is neither a CD-ROM nor a cloud-init drive. */
  function bootDisk(vm: EmulatedVm): { key: string; sizeMiB: number } | undefined {
    for (const key of Object.keys(vm.config)
      .filter((k) => DISK_KEY.test(k))
      .sort()) {
      const value = vm.config[key]!;
      if (value.includes("media=cdrom") || value.includes("cloudinit")) continue;
      const size = /(?:^|,)size=([^,]+)/.exec(value)?.[1];
      return { key, sizeMiB: size ? (mib(size) ?? 0) : 0 };
    }
    return undefined;
  }

  const isTemplate = (vm: EmulatedVm) => vm.config.template === "1";

  function statusOf(vm: EmulatedVm) {
    const disk = bootDisk(vm);
    const running = vm.status === "running";
    return {
      vmid: vm.vmid,
      name: vm.config.name ?? `VM ${vm.vmid}`,
      status: vm.status,
      ...(running ? { qmpstatus: "running", pid: 40000 + vm.vmid } : { qmpstatus: "stopped" }),
      uptime: running && vm.startedAt ? Math.floor((Date.now() - vm.startedAt) / 1000) : 0,
      cpus: Number(vm.config.cores ?? 1) * Number(vm.config.sockets ?? 1),
      maxmem: Number(vm.config.memory ?? 512) * 1024 * 1024,
      maxdisk: (disk?.sizeMiB ?? 0) * 1024 * 1024,
      mem: running ? 256 * 1024 * 1024 : 0,
      disk: 0,
      cpu: running ? 0.01 : 0,
      netin: 0,
      netout: 0,
      diskread: 0,
      diskwrite: 0,
      ha: { managed: 0 },
      ...(vm.config.tags ? { tags: vm.config.tags } : {}),
      ...(vm.config.lock ? { lock: vm.config.lock } : {}),
      ...(isTemplate(vm) ? { template: 1 } : {}),
      ...(vm.config.agent ? { agent: 1 } : {}),
    };
  }

  function resourceOf(vm: EmulatedVm) {
    const s = statusOf(vm);
    return {
      id: `qemu/${vm.vmid}`,
      type: "qemu",
      vmid: vm.vmid,
      node: vm.node,
      name: s.name,
      status: vm.status,
      template: isTemplate(vm) ? 1 : 0,
      ...(vm.config.tags ? { tags: vm.config.tags } : {}),
      ...(vm.config.lock ? { lock: vm.config.lock } : {}),
      maxcpu: s.cpus,
      maxmem: s.maxmem,
      maxdisk: s.maxdisk,
      mem: s.mem,
      cpu: s.cpu,
      disk: 0,
      uptime: s.uptime,
      netin: 0,
      netout: 0,
      diskread: 0,
      diskwrite: 0,
    };
  }

  const nodeEntry = (name: string) => ({
    id: `node/${name}`,
    type: "node",
    node: name,
    status: "online",
    level: "",
    cpu: 0.02,
    maxcpu: 32,
    mem: 8 * 1024 ** 3,
    maxmem: 128 * 1024 ** 3,
    disk: 10 * 1024 ** 3,
    maxdisk: 100 * 1024 ** 3,
    uptime: 86_400,
    ssl_fingerprint: "",
  });

  /** Creates a VM (clone or create) locked until its task ends; a failed task removes it again, as PVE cleans up. */
  function beginVm(vm: EmulatedVm, lock: string, type: string, taskId: number, then: () => void): string {
    vm.config.lock = lock;
    vms.set(vm.vmid, vm);
    counters.serversCreated++;
    return startTask(type, taskId, {
      complete() {
        if (vms.get(vm.vmid) !== vm) throw new Error(`VM ${vm.vmid} vanished`);
        delete vm.config.lock;
        then();
      },
      fail() {
        if (vms.get(vm.vmid) === vm) vms.delete(vm.vmid);
      },
    });
  }

  /** The power tasks: each checks what PVE checks before it forks the worker. */
  function power(vm: EmulatedVm, action: string): string {
    checkUnlocked(vm);
    if (isTemplate(vm)) throw new PveError(500, "you can't start a vm if it's a template");
    const running = vm.status === "running";
    const needsRunning = ["reboot", "reset", "suspend", "resume"];
    if (needsRunning.includes(action) && !running) throw new PveError(500, `VM ${vm.vmid} not running`);
    const type = { start: "qmstart", stop: "qmstop", shutdown: "qmshutdown", reboot: "qmreboot", reset: "qmreset", suspend: "qmsuspend", resume: "qmresume" }[action]!; // prettier-ignore
    return startTask(type, vm.vmid, {
      complete() {
        if (action === "start") {
          if (vm.status === "running") throw new Error(`VM ${vm.vmid} already running`);
          vm.status = "running";
          vm.startedAt = Date.now();
        } else if (action === "stop" || action === "shutdown") {
          vm.status = "stopped";
          delete vm.startedAt;
        } else if (action === "reboot" || action === "reset") vm.startedAt = Date.now();
      },
    });
  }

  // ------------------------------------------------------------------ routes
  type Handler = (p: Record<string, string>, params: Record<string, string>) => unknown;
  const routes: { method: string; pattern: string; re: RegExp; names: string[]; handler: Handler }[] = [];
  const route = (method: string, pattern: string, handler: Handler) => {
    const names: string[] = [];
    const re = new RegExp(
      "^" +
        pattern.replace(/\{(\w+)\}/g, (_, name: string) => {
          names.push(name);
          return "([^/]+)";
        }) +
        "$",
    );
    routes.push({ method, pattern, re, names, handler });
  };
  const checkNode = (name: string) => {
    if (!nodes.includes(name))
      throw new PveError(500, `hostname lookup '${name}' failed - failed to get address info for: ${name}: Name or service not known`);
  };

  route("GET", "/version", () => ({ version: "8.2.4", release: "8.2", repoid: "faa83925c9641325" }));
  route("GET", "/nodes", () => nodes.map(nodeEntry));
  route("GET", "/cluster/nextid", (_, params) => {
    if (params.vmid !== undefined) {
      const vmid = parseVmid(params.vmid, "vmid");
      if (vms.has(vmid)) throw paramError({ vmid: `VM ${vmid} already exists` });
      return String(vmid);
    }
    let vmid = 100;
    while (vms.has(vmid)) vmid++;
    if (nextIdRaces > 0) {
      nextIdRaces--;
      // Another client asks nextid at the same moment and creates its VM first.
      vms.set(vmid, { vmid, node, status: "stopped", config: { name: `other-client-${vmid}`, memory: "512", cores: "1" } });
    }
    return String(vmid);
  });
  route("GET", "/cluster/resources", (_, params) => {
    const type = params.type;
    if (type !== undefined && !["vm", "node", "storage", "sdn", "pool"].includes(type))
      throw paramError({ type: `value '${type}' does not have a value in the enumeration 'vm, storage, node, sdn, pool'` });
    const out: unknown[] = [];
    if (!type || type === "node") out.push(...nodes.map(nodeEntry));
    if (!type || type === "vm") out.push(...[...vms.values()].sort((a, b) => a.vmid - b.vmid).map(resourceOf));
    if (!type || type === "storage")
      out.push(...storages.map((s) => ({ id: `storage/${node}/${s}`, type: "storage", storage: s, node, status: "available", shared: 0 })));
    return out;
  });
  route("GET", "/nodes/{node}/qemu", ({ node: n }) => {
    checkNode(n!);
    return [...vms.values()].filter((vm) => vm.node === n).map(statusOf);
  });
  route("POST", "/nodes/{node}/qemu", ({ node: n }, params) => {
    checkNode(n!);
    const { vmid: vmidText, start, ...config } = params;
    const vmid = parseVmid(vmidText, "vmid");
    validateConfig(config);
    checkVmidFree(vmid, `unable to create VM ${vmid} - `);
    allocateDisks(vmid, config);
    const vm: EmulatedVm = { vmid, node: n!, status: "stopped", config: {} };
    for (const key of Object.keys(config).filter((k) => /^net\d+$/.test(k))) {
      config[key] = config[key]!.replace(/^(virtio|e1000|rtl8139|vmxnet3)(?=,|$)/, `$1=${mac()}`);
    }
    applyConfig(vm, { ...config, skiplock: "1" });
    return beginVm(vm, "create", "qmcreate", vmid, () => {
      if (start === "1") {
        vm.status = "running";
        vm.startedAt = Date.now();
      }
    });
  });
  route("POST", "/nodes/{node}/qemu/{vmid}/clone", ({ node: n, vmid }, params) => {
    checkNode(n!);
    const source = vmOn(n!, vmid!);
    const { newid: newidText, name, full, storage, target, description } = params;
    const unknown = Object.keys(params).filter((k) => !CLONE_KEYS.has(k));
    if (unknown.length) throw paramError(Object.fromEntries(unknown.map((k) => [k, NOT_IN_SCHEMA])));
    const newid = parseVmid(newidText, "newid");
    if (name !== undefined && !DNS_NAME.test(name))
      throw paramError({ name: "invalid format - value does not look like a valid DNS name" });
    if (target !== undefined) checkNode(target);
    const linked = full !== "1" && isTemplate(source);
    if (full === "0" && !isTemplate(source)) throw new PveError(500, "Linked clone feature is not supported for drive 'scsi0'");
    if (storage !== undefined) {
      if (linked) throw paramError({ storage: "changing storage is only possible for full clones" });
      checkStorage(storage);
    }
    checkUnlocked(source);
    checkVmidFree(newid);
    const config: Record<string, string> = {};
    let n2 = 0;
    for (const [key, value] of Object.entries(source.config)) {
      if (key === "template" || key === "lock") continue;
      if (DISK_KEY.test(key) && !value.includes("media=cdrom")) {
        const [volume, ...opts] = value.split(",");
        const [store = "", volName = ""] = volume!.split(":");
        const dest = storage ?? store;
        config[key] = value.includes("cloudinit")
          ? `${dest}:vm-${newid}-cloudinit,media=cdrom`
          : [linked ? `${store}:${volName}/vm-${newid}-disk-${n2++}` : `${dest}:vm-${newid}-disk-${n2++}`, ...opts].join(",");
      } else if (/^net\d+$/.test(key)) config[key] = value.replace(/=([0-9A-F]{2}:){5}[0-9A-F]{2}/, `=${mac()}`);
      else config[key] = value;
    }
    if (name !== undefined) config.name = name;
    else config.name = `Copy-of-VM-${source.config.name ?? source.vmid}`;
    if (description !== undefined) config.description = description;
    const vm: EmulatedVm = { vmid: newid, node: target ?? n!, status: "stopped", config };
    return beginVm(vm, "clone", "qmclone", source.vmid, () => {});
  });
  route("GET", "/nodes/{node}/qemu/{vmid}/config", ({ node: n, vmid }) => {
    checkNode(n!);
    const vm = vmOn(n!, vmid!);
    const config: Record<string, unknown> = { ...vm.config, digest: configDigest(vm) };
    if (config.cipassword !== undefined) config.cipassword = "**********";
    for (const key of ["cores", "memory", "sockets", "template", "agent", "onboot"]) {
      if (typeof config[key] === "string" && /^\d+$/.test(config[key] as string)) config[key] = Number(config[key]);
    }
    return config;
  });
  const setConfig = (sync: boolean): Handler => ({ node: n, vmid }, params) => {
    checkNode(n!);
    const vm = vmOn(n!, vmid!);
    validateConfig(params);
    if (sync) {
      applyConfig(vm, params);
      return null;
    }
    if (!params.skiplock) checkUnlocked(vm);
    return startTask("qmconfig", vm.vmid, { complete: () => applyConfig(vm, params) });
  }; // prettier-ignore
  route("PUT", "/nodes/{node}/qemu/{vmid}/config", setConfig(true));
  route("POST", "/nodes/{node}/qemu/{vmid}/config", setConfig(false));
  route("PUT", "/nodes/{node}/qemu/{vmid}/resize", ({ node: n, vmid }, params) => {
    checkNode(n!);
    const vm = vmOn(n!, vmid!);
    const { disk, size, digest, skiplock } = params;
    if (!disk || !DISK_KEY.test(disk)) throw paramError({ disk: "value does not have a value in the enumeration" });
    const m = size === undefined ? null : /^(\+)?(.+)$/.exec(size);
    const amount = m ? mib(m[2]!) : undefined;
    if (!m || amount === undefined) throw paramError({ size: "value does not match the regex pattern" });
    if (digest !== undefined && digest !== configDigest(vm)) throw new PveError(500, "detected modified configuration - file changed by other user? Try again.");
    if (!skiplock) checkUnlocked(vm);
    const value = vm.config[disk];
    if (value === undefined) throw new PveError(500, `no disk '${disk}'`);
    const current = mib(/(?:^|,)size=([^,]+)/.exec(value)?.[1] ?? "0") ?? 0;
    const wanted = m[1] ? current + amount : amount;
    if (wanted < current) throw new PveError(500, "shrinking disks is not supported");
    return startTask("qmresize", vm.vmid, {
      complete() {
        const now = vm.config[disk];
        if (now !== undefined) vm.config[disk] = now.replace(/size=[^,]+/, `size=${sizeText(wanted)}`);
      },
    });
  }); // prettier-ignore
  route("GET", "/nodes/{node}/qemu/{vmid}/status/current", ({ node: n, vmid }) => {
    checkNode(n!);
    return statusOf(vmOn(n!, vmid!));
  });
  route("POST", "/nodes/{node}/qemu/{vmid}/status/{action}", ({ node: n, vmid, action }) => {
    checkNode(n!);
    if (!["start", "stop", "shutdown", "reboot", "reset", "suspend", "resume"].includes(action!))
      throw new PveError(501, `Method 'POST /nodes/${n}/qemu/${vmid}/status/${action}' not implemented`);
    return power(vmOn(n!, vmid!), action!);
  });
  // purge and destroy-unreferenced-disks are accepted: nothing else references an emulated VM's disks.
  route("DELETE", "/nodes/{node}/qemu/{vmid}", ({ node: n, vmid }) => {
    checkNode(n!);
    const vm = vmOn(n!, vmid!);
    checkUnlocked(vm);
    if (vm.status === "running") throw new PveError(500, `VM ${vm.vmid} is running - destroy failed`);
    return startTask("qmdestroy", vm.vmid, {
      complete() {
        if (vms.get(vm.vmid) === vm) vms.delete(vm.vmid);
      },
    });
  });
  route("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", ({ node: n, vmid }) => {
    checkNode(n!);
    const vm = vmOn(n!, vmid!);
    if (!vm.config.agent || vm.config.agent === "0") throw new PveError(500, "No QEMU guest agent configured");
    if (vm.status !== "running") throw new PveError(500, `VM ${vm.vmid} is not running`);
    const hw = /=(([0-9A-F]{2}:){5}[0-9A-F]{2})/.exec(vm.config.net0 ?? "")?.[1]?.toLowerCase() ?? "bc:24:11:00:00:00";
    return {
      result: [
        { name: "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [{ "ip-address-type": "ipv4", "ip-address": "127.0.0.1", prefix: 8 }] },
        {
          name: "eth0",
          "hardware-address": hw,
          "ip-addresses": [
            { "ip-address-type": "ipv4", "ip-address": `10.10.${(vm.vmid >> 8) & 255}.${vm.vmid & 255}`, prefix: 16 },
            { "ip-address-type": "ipv6", "ip-address": `fe80::be24:11ff:fe00:${(vm.vmid & 0xffff).toString(16)}`, prefix: 64 },
          ],
        },
      ],
    };
  }); // prettier-ignore
  const taskOf = (n: string, upid: string) => {
    checkNode(n);
    const task = tasks.get(upid);
    if (!task || task.node !== n) throw new PveError(500, `unable to parse worker upid '${upid}'`);
    return task;
  };
  route("GET", "/nodes/{node}/tasks/{upid}/status", ({ node: n, upid }) => {
    const task = taskOf(n!, upid!);
    return {
      upid: task.upid,
      node: task.node,
      pid: task.pid,
      pstart,
      starttime: task.starttime,
      type: task.type,
      id: task.id,
      user: tokenUser,
      tokenid: tokenName,
      status: task.status,
      ...(task.status === "stopped" ? { exitstatus: task.exitstatus } : {}),
    };
  });
  route("GET", "/nodes/{node}/tasks/{upid}/log", ({ node: n, upid }) => taskOf(n!, upid!).log.map((t, i) => ({ n: i + 1, t })));

  // ------------------------------------------------------------------ HTTP
  let window = { start: 0, count: 0, refused: false };

  function send(res: ServerResponse, status: number, reason: string, body: unknown, headers: Record<string, string> = {}): void {
    const text = JSON.stringify(body);
    // A reason phrase is one line of visible characters: PVE's messages end with "\n", which it drops.
    res.writeHead(status, reason.replace(/[^\t\x20-\x7e]/g, " ").trim() || "Error", {
      "content-type": "application/json;charset=UTF-8",
      "content-length": String(Buffer.byteLength(text)),
      "cache-control": "max-age=0",
      server: "pve-api-daemon/3.0",
      ...headers,
    });
    res.end(text);
  }
  const sendError = (res: ServerResponse, e: PveError) =>
    send(res, e.status, e.message, { data: null, ...(e.errors ? { errors: e.errors } : {}), message: `${e.message}\n` });

  function authorized(req: IncomingMessage): boolean | "missing" {
    const header = req.headers.authorization;
    if (!header) return "missing";
    const m = /^PVEAPIToken=([^=]+)=(.*)$/.exec(header);
    if (!m || m[1] !== tokenId) return false;
    const given = Buffer.from(m[2]!);
    const wanted = Buffer.from(tokenSecret);
    return given.length === wanted.length && timingSafeEqual(given, wanted);
  }

  async function readParams(req: IncomingMessage, url: URL): Promise<Record<string, string>> {
    const params: Record<string, string> = Object.fromEntries(url.searchParams);
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString("utf8");
    if (text === "") return params;
    if ((req.headers["content-type"] ?? "").includes("application/json")) {
      const json = JSON.parse(text) as Record<string, unknown>;
      for (const [k, v] of Object.entries(json)) params[k] = typeof v === "boolean" ? (v ? "1" : "0") : String(v);
    } else for (const [k, v] of new URLSearchParams(text)) params[k] = v;
    return params;
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    counters.requests++;
    const method = req.method ?? "GET";
    const url = new URL(req.url ?? "/", "https://pve");
    if (options.rateLimit) {
      const now = Date.now();
      if (now - window.start >= options.rateLimit.windowMs) window = { start: now, count: 0, refused: false };
      else if (window.refused) counters.callsWhileLimited++;
      if (++window.count > options.rateLimit.limit) {
        window.refused = true;
        counters.rateLimited++;
        const retryAfter = Math.max(1, Math.ceil((window.start + options.rateLimit.windowMs - now) / 1000));
        req.resume();
        return send(res, 429, "Too Many Requests", { data: null }, { "retry-after": String(retryAfter) });
      }
    }
    const auth = authorized(req);
    if (auth !== true) {
      req.resume();
      return send(res, 401, auth === "missing" ? "No ticket" : "authentication failure", { data: null });
    }
    if (!url.pathname.startsWith("/api2/json/")) {
      req.resume();
      return send(res, 501, `Method '${method} ${url.pathname}' not implemented`, { data: null });
    }
    let segments: string[];
    try {
      segments = url.pathname.slice("/api2/json".length).split("/").map(decodeURIComponent);
    } catch {
      req.resume();
      return send(res, 400, "malformed URL", { data: null });
    }
    const path = segments.join("/").replace(/\/$/, "");
    const found = routes.find((r) => r.method === method && r.re.test(path));
    if (!found) {
      req.resume();
      return send(res, 501, `Method '${method} ${path}' not implemented`, { data: null });
    }

    const fault = pickCallFault(method, path);
    if (fault && fault !== "lost-answer") {
      req.resume();
      if (fault === "rate-limit") return send(res, 429, "Too Many Requests", { data: null }, { "retry-after": "1" });
      if (fault === "bad-gateway") return send(res, 502, "Bad Gateway", { data: null });
      if (fault === "timeout") return send(res, 596, "Connection timed out", { data: null });
      const vmid = /\/qemu\/(\d+)/.exec(path)?.[1] ?? "100";
      return sendError(res, new PveError(500, `can't lock file '/var/lock/qemu-server/lock-${vmid}.conf' - got timeout`));
    }

    const key = `${method} ${found.pattern}`;
    counters.calls[key] = (counters.calls[key] ?? 0) + 1;
    const match = found.re.exec(path)!;
    const pathParams = Object.fromEntries(found.names.map((name, i) => [name, match[i + 1]!]));
    try {
      const params = await readParams(req, url);
      const data = found.handler(pathParams, params);
      if (fault === "lost-answer") return send(res, 596, "Connection timed out", { data: null });
      send(res, 200, "OK", { data });
    } catch (e) {
      if (e instanceof PveError) return sendError(res, e);
      if (e instanceof SyntaxError) return sendError(res, new PveError(400, "malformed JSON body"));
      sendError(res, new PveError(500, e instanceof Error ? e.message : String(e)));
    }
  }

  const server: Server = createServer({ key: certificate.key, cert: certificate.cert }, (req, res) => {
    handle(req, res).catch((e) => {
      if (!res.headersSent) sendError(res, new PveError(500, String(e)));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `https://127.0.0.1:${port}`,
    host: `127.0.0.1:${port}`,
    node,
    tokenId,
    tokenSecret,
    certificate: certificate.cert,
    spkiSha256: certificate.spkiSha256,
    vms,
    tasks,
    counters,
    faults,
    setActionDurationMs: (ms) => void (durationMs = ms),
    async stop() {
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
