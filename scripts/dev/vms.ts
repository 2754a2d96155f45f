// `npm run dev -- --vms`: this machine becomes a host of a host pool, so a tenant creates real
// microVMs on it in seconds. REAL: all of it. The host is a `bcd start --role node` child process
// (its state and runtime dirs under the dev data dir) whose qemu-microvm runtime boots the guest
// image (agent/runtimes/microvm/image.ts, built on first use, then reused from its cache) under
// KVM when a probe boot works, TCG otherwise. Nothing here is simulated.
//
// registerDevVms() makes, over the API as an operator would: the host pool `dev-vms` (hosts
// labelled bc.dev/dev=vms, runtime qemu-microvm), a flavor, the tenant `vms-demo` with a quota,
// its API key, and the host's join token; then starts bcd with that token and waits until the host
// is schedulable. stop() stops bcd and removes every guest it left (VMM, network namespace, work
// dir) with the runtime's own remove: bcd keeps its guests running across a restart by design,
// and Ctrl-C stops the stack's API with it, so the dev process removes them itself.
import type { ChildProcess } from "node:child_process";
import { constants } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { ensureGuestImage, type GuestImage } from "../../agent/runtimes/microvm/image.ts";
import { QemuBackend, qemuMicroVmRuntime } from "better-compute/runtimes";
import { startBcd } from "../../local/bcd-process.ts";
import { shownPath, type Stack } from "../../local/stack.ts";
import { Cleanup, eventFeed, type DevEvent } from "./common.ts";

const POOL = "dev-vms";
const POOL_LABELS = { "bc.dev/dev": "vms" };
const RUNTIME = "qemu-microvm";
const FLAVOR = { id: "dev-vms-small", vcpus: 1, memoryMiB: 128, diskGiB: 1 };
const TENANT = "vms-demo";
/** Guests the tenant may have: this machine's CPUs bound it first (one vCPU each, no overcommit). */
const QUOTA_INSTANCES = 4;
const HOST_NAME = "dev-vms-host";
/** What the banner's create command gives the guest: it prints its own name on its console. */
const DEMO_USER_DATA = '#!/bin/sh\necho "hello from $(hostname)"\n';
/** A guest asked to power off (ACPI) at shutdown has this long before it is killed. */
const STOP_GRACE_MS = 5_000;

export interface DevVms {
  /** The banner's lines: added to REAL, the pool and tenant, the commands to try as the tenant. */
  banner: { real: string[]; summary: string[]; commands: string[] };
  /** Starts printing the pool's instances as they change (read from the event record every second). */
  watch(print: (line: string) => void, options: { transitions: boolean }): void;
  /** Stops bcd and removes the guests it leaves; the control plane must not be needed for it (Ctrl-C stops it too). */
  stop(): Promise<void>;
}

/** Why `--vms` cannot run on this machine (root for the guests' network namespaces, QEMU, ip), or undefined. */
export async function devVmsProblem(): Promise<string | undefined> {
  if (process.platform !== "linux") return "--vms boots guests with QEMU and network namespaces: it needs Linux";
  if (process.getuid?.() !== 0) return "--vms needs root: each guest gets its own network namespace (run npm run dev -- --vms as root)";
  for (const program of ["qemu-system-x86_64", "ip"])
    if (!(await onPath(program))) return `--vms needs ${program} (docs/vms-walkthrough.md lists what a host needs)`;
  return undefined;
}

/** Builds the guest image, or finds it in its cache; says which, since the first build takes minutes. */
export async function devGuestImage(print: (line: string) => void): Promise<GuestImage> {
  return ensureGuestImage({
    log: (message) => {
      if (message.startsWith("building")) print(`  ${message}: the first time takes a few minutes, later runs reuse it`);
      else if (/reused|ready/.test(message)) print(`  ${message}`);
    },
  });
}

export async function registerDevVms(stack: Stack, image: GuestImage, print: (line: string) => void): Promise<DevVms> {
  const call = <T = Record<string, unknown>>(method: string, input: Record<string, unknown> = {}) =>
    callApi<T>(stack.url, stack.adminKey, method, input);
  const stateDir = path.join(stack.dataDir, "vms-host");
  const runtimeDir = path.join(stateDir, "runtime");
  const cleanup = new Cleanup((e) => print(`  --vms cleanup: ${(e as Error).message}`));
  return cleanup.guard(async () => {
    // Run last (cleanup goes in reverse), once bcd is stopped: the guests it leaves running.
    cleanup.push(() => removeGuests(runtimeDir, print));
    await call("vps.pools.create", { id: POOL, class: "host", hosts: { labels: POOL_LABELS }, runtime: RUNTIME });
    const { id: flavor, ...size } = FLAVOR;
    await call("vps.flavors.create", { id: flavor, pool: POOL, ...size });
    await call("vps.tenants.create", { id: TENANT, name: "VMs demo tenant (npm run dev -- --vms)" });
    await call("vps.quotas.set", {
      tenant: TENANT,
      pool: POOL,
      instances: QUOTA_INSTANCES,
      vcpus: QUOTA_INSTANCES * FLAVOR.vcpus,
      memoryMiB: QUOTA_INSTANCES * FLAVOR.memoryMiB,
      diskGiB: QUOTA_INSTANCES * FLAVOR.diskGiB,
    });
    const key = await call<{ id: string; key: string }>("iam.apiKeys.create", { name: `${TENANT} (npm run dev)`, roles: ["vps-tenant"] });
    await call("vps.tenants.addMember", { tenant: TENANT, principal: `apikey:${key.id}` });

    const { token } = await call<{ token: string }>("joinTokens.create", { role: "node", labels: POOL_LABELS });
    // The host: `bcd start --role node`, in its own process group: Ctrl-C reaches the dev process,
    // which stops bcd before it removes the guests.
    const bcd = startBcd({
      url: stack.url,
      role: "node",
      stateDir,
      hostname: HOST_NAME,
      token,
      args: ["--runtime-dir", runtimeDir],
      tag: "vms-host",
      print,
      detached: true,
      stopGraceMs: 10_000,
    });
    // bcd first (it stops converging), then whatever guests it leaves.
    cleanup.push(() => bcd.stop());
    const host = await schedulableHost(bcd.process, call);

    // The same probe the runtime makes before its first guest: KVM only when a short boot under it works.
    const accel = await new QemuBackend({ probeImage: async () => image }).probe();
    const userDataFile = path.join(stack.dataDir, "vms-demo.sh");
    await fs.writeFile(userDataFile, DEMO_USER_DATA, { mode: 0o644 });

    const banner = {
      real: [
        `             this machine as a host of pool ${POOL}: a bcd process (bcd start --role node, node ${host.node},`,
        `             state in ${shownPath(stateDir)}) booting QEMU microvm guests under ${accel.accel.toUpperCase()} (${accel.detail.split("; ").pop()}),`,
        `             each in its network namespace bc-<instance id>; the guest image ${image.manifest.digest.slice(0, 12)} (kernel ${image.manifest.kernelRelease})`,
      ],
      summary: [
        `  host pool ${POOL} (hosts labelled ${Object.entries(POOL_LABELS)
          .map(([k, v]) => `${k}=${v}`)
          .join(", ")}, runtime ${RUNTIME}): this machine, ${host.vcpus} vCPUs, ${host.memoryMiB} MiB, ${host.diskGiB} GiB`,
        `    flavor ${FLAVOR.id}: ${FLAVOR.vcpus} vCPU, ${FLAVOR.memoryMiB} MiB, ${FLAVOR.diskGiB} GiB`,
        `  tenant ${TENANT}: a quota of ${QUOTA_INSTANCES} instances in pool ${POOL}, and its API key (role vps-tenant, new on every npm run dev): ${key.key}`,
        "  its guests are removed from this machine at Ctrl-C",
      ],
      commands: [
        `  try, as tenant ${TENANT} (unset BC_URL BC_API_KEY to be the admin again):`,
        `    export BC_URL=${stack.url} BC_API_KEY=${key.key}`,
        `    npx better-compute vps instances create --id demo-1 --pool ${POOL} --flavor ${FLAVOR.id} --name demo --userData "$(cat ${shownPath(userDataFile)})"`,
        "    npx better-compute vps instances get demo-1           # state, host, and the guest's own report once it runs",
        "    npx better-compute vps instances console demo-1       # the guest's serial console: its boot, its report, what the user data printed",
        "    npx better-compute vps instances delete demo-1",
        "    env -u BC_URL -u BC_API_KEY npx better-compute capacity hosts list   # as the admin: the host, what it has, uses and holds",
        "",
      ],
    };
    return {
      banner,
      watch(printLine, options) {
        const stopWatching = watchInstances(stack, printLine, options.transitions);
        // The watch stops before bcd does: the guests' removal is not the tenant's doing.
        cleanup.push(async () => stopWatching());
      },
      stop: cleanup.stop,
    };
  });
}

interface HostSummary {
  node: string;
  schedulable: boolean;
  labels: Record<string, string>;
  capacity: { vcpus: number; memoryMiB: number; diskGiB: number };
}

/** Waits until bcd has joined and the capacity module sees it as a schedulable host offering the runtime. */
async function schedulableHost(
  bcd: ChildProcess,
  call: <T>(method: string, input?: Record<string, unknown>) => Promise<T>,
): Promise<{ node: string } & HostSummary["capacity"]> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (bcd.exitCode !== null) throw new Error(`the host's bcd exited with ${bcd.exitCode} before it connected; its lines are above`);
    const { hosts } = await call<{ hosts: HostSummary[] }>("capacity.hosts.list", { labels: POOL_LABELS });
    const host = hosts.find((h) => h.schedulable && h.labels[`bc.dev/driver.${RUNTIME}`] !== undefined);
    if (host) return { node: host.node, ...host.capacity };
    if (Date.now() > deadline) throw new Error("the host's bcd did not become a schedulable host within 60 s; its lines are above");
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * Removes every guest under the runtime dir: the VMM asked to power off then killed, its network
 * namespace, its work dir (the runtime's own remove, which adopts what a bcd left running).
 */
async function removeGuests(runtimeDir: string, print: (line: string) => void): Promise<void> {
  const root = path.join(runtimeDir, RUNTIME);
  if (!(await exists(root))) return;
  const runtime = qemuMicroVmRuntime({ root, images: {}, stopGraceMs: STOP_GRACE_MS });
  try {
    for (const guest of await runtime.list()) {
      await runtime.remove(guest.name);
      print(`  guest ${guest.name} removed from this machine (its VMM, network namespace bc-${guest.name} and work dir)`);
    }
  } finally {
    await runtime.close();
  }
}

/**
 * Prints the changes of the pool's instances from the event record, in order (transitions: false
 * leaves those to --providers' watch, which prints every instance's), and each guest's report once
 * it runs. No extra sweeps: the host's status runs the vps.hostInstances reconciler at once.
 */
function watchInstances(stack: Stack, print: (line: string) => void, transitions: boolean): () => void {
  const call = <T>(method: string, input: Record<string, unknown>) => callApi<T>(stack.url, stack.adminKey, method, input);
  const ours = new Set<string>();
  const changes = eventFeed(call, "vps.instance.*");
  let lastProblem = "";
  let stopped = false;
  const poll = async () => {
    for await (const event of changes()) {
      const id = event.subject?.replace(/^vps\/instances\//, "");
      if (!id) continue;
      if (event.type === "vps.instance.created" && event.data.pool === POOL) ours.add(id);
      if (!ours.has(id)) continue;
      if (transitions) print(`  instance ${id}  ${instanceChange(event)}`);
      if (event.type === "vps.instance.state" && event.data.to === "running") print(await guestLine(id));
    }
  };
  const guestLine = async (id: string) => {
    const { guest } = await call<{
      guest: { hostname: string; userDataSha256: string; storedUserDataSha256: string; hostKeys: string[] } | null;
    }>("vps.instances.get", { id });
    if (!guest) return `  instance ${id}  running, no guest report yet`;
    const sha =
      guest.userDataSha256 === guest.storedUserDataSha256 ? "the one stored at create" : `NOT the stored ${guest.storedUserDataSha256}`;
    return `  instance ${id}  guest report: hostname ${guest.hostname}, user data sha256 ${guest.userDataSha256.slice(0, 12)}… (${sha}), ${guest.hostKeys.length} SSH host keys`;
  };
  const loop = async () => {
    while (!stopped) {
      try {
        await poll();
        lastProblem = "";
      } catch (err) {
        const problem = err instanceof Error ? err.message : String(err);
        if (!stopped && problem !== lastProblem) print(`  could not read the instances' changes (events.list): ${problem}`);
        lastProblem = problem;
      }
      await new Promise((r) => setTimeout(r, 1_000));
    }
  };
  void loop();
  return () => void (stopped = true);
}

function instanceChange(event: DevEvent): string {
  const d = event.data;
  switch (event.type.slice("vps.instance.".length)) {
    case "created":
      return `created for tenant ${String(d.tenant)} in pool ${String(d.pool)}`;
    case "placed":
      return `placed on host ${String(d.host)}`;
    case "requested":
      return `${String(d.action)} asked`;
    case "state":
      return `${String(d.from)} → ${String(d.to)}${d.reason ? `  (${String(d.reason)})` : ""}`;
    case "deleted":
      return "→ deleted (its guest is gone from the host)";
    default:
      return event.type;
  }
}

async function onPath(program: string): Promise<boolean> {
  for (const dir of (process.env.PATH ?? "").split(path.delimiter).filter(Boolean))
    if (
      await fs.access(path.join(dir, program), constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      return true;
  return false;
}

async function exists(file: string): Promise<boolean> {
  return fs.access(file).then(
    () => true,
    () => false,
  );
}
