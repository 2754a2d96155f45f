// `npm run dev -- --providers`: the three providers' emulators beside the local stack, registered
// over the API as an operator would, so a tenant can create instances at once. SIMULATED: Hetzner
// Cloud, Hetzner Robot and Proxmox VE (better-compute/testing/<provider>: their APIs over real
// HTTP(S) from this process, servers in memory). REAL: everything that calls them (the vps module,
// its reconciler and the adapters, in the Worker under wrangler dev).
//
// The emulators start before the stack: the Worker reaches the Proxmox emulator over HTTPS with a
// self-signed certificate, which workerd trusts only when wrangler dev was started with it in
// NODE_EXTRA_CA_CERTS (miniflare adds those certificates to workerd's trust store). The adapter's
// TLS is not relaxed: the account names no `tls` block, exactly as a Worker's account must.
//
// register() makes, per provider, an account (credentials sealed), a pool of the same id (agent
// none), a flavor and a quota of a few instances of it for the tenant "demo"; then the tenant's API
// key (role vps-tenant, a member of the tenant) and its SSH key. Once watched, every instance's
// state change is printed as it happens.
import { randomBytes, randomUUID } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { startHetznerCloudEmulator, type HetznerCloudEmulator } from "../../testing/providers/hetzner-cloud.ts";
import { EMULATED_PRODUCTS, startHetznerRobotEmulator, type HetznerRobotEmulator } from "../../testing/providers/hetzner-robot.ts";
import { startProxmoxEmulator, type ProxmoxEmulator } from "../../testing/providers/proxmox.ts";
import { shownPath, type Stack } from "../../local/stack.ts";
import { Cleanup, eventFeed, type DevEvent } from "./common.ts";

const TENANT = "demo";
/** The tenant's SSH key (a demo key: nothing in dev can be logged into). */
const SSH_KEY = {
  name: "demo",
  publicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl demo@npm-run-dev",
};
/** Instances the tenant may have in each pool (its quota: this many of the pool's flavor). */
const QUOTA_INSTANCES = 3;
/**
 * How long the emulated providers take: an hcloud action and a Robot boot into the rescue system
 * (seconds at the real ones, well under the minute between two cron passes), a Proxmox task (the
 * adapter waits for a clone inside the pass, so it is kept short).
 */
const ACTION_MS = { hetznerCloud: 5_000, hetznerRobot: 5_000, proxmox: 2_000 };

type Emulators = { hetznerCloud: HetznerCloudEmulator; hetznerRobot: HetznerRobotEmulator; proxmox: ProxmoxEmulator };

export interface DevProviders {
  /** The Proxmox emulator's certificate (after any the operator had in NODE_EXTRA_CA_CERTS), for wrangler dev's NODE_EXTRA_CA_CERTS. */
  caFile: string;
  /** Registers the accounts, pools, flavors, the tenant, its quotas, key and SSH key over the stack's API. */
  register(stack: Stack): Promise<DevTenant>;
  stop(): Promise<void>;
}

export interface DevTenant {
  /** The banner's lines: added to REAL and SIMULATED, the tenant and its pools, the commands to try as the tenant. */
  banner: { real: string[]; simulated: string[]; summary: string[]; commands: string[] };
  /** Starts printing the instances' state changes (read from the event record every second), until stop(). */
  watch(print: (line: string) => void): void;
}

export async function startDevProviders(): Promise<DevProviders> {
  const cleanup = new Cleanup();
  return cleanup.guard(async () => {
    // Credentials made up for this run: they open only these emulators.
    const hetznerCloud = await startHetznerCloudEmulator({
      token: `hcloud-dev-${randomBytes(16).toString("hex")}`,
      actionDurationMs: ACTION_MS.hetznerCloud,
    });
    cleanup.push(() => hetznerCloud.stop());
    const hetznerRobot = await startHetznerRobotEmulator({
      password: randomBytes(16).toString("base64url"),
      actionDurationMs: ACTION_MS.hetznerRobot,
    });
    cleanup.push(() => hetznerRobot.stop());
    const proxmox = await startProxmoxEmulator({ tokenSecret: randomUUID(), actionDurationMs: ACTION_MS.proxmox });
    cleanup.push(() => proxmox.stop());

    const caDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-dev-providers-"));
    cleanup.push(async () => fs.rmSync(caDir, { recursive: true, force: true }));
    const caFile = path.join(caDir, "ca.pem");
    const operatorCas = process.env.NODE_EXTRA_CA_CERTS ? fs.readFileSync(process.env.NODE_EXTRA_CA_CERTS, "utf8") : "";
    fs.writeFileSync(caFile, `${operatorCas.trimEnd()}\n${proxmox.certificate}`.trimStart());

    return {
      caFile,
      async register(stack) {
        const credentialsFile = path.join(stack.dataDir, "providers.json");
        // The credentials open nothing once the emulators are gone.
        cleanup.push(async () => fs.rmSync(credentialsFile, { force: true }));
        const tenant = await register(stack, { hetznerCloud, hetznerRobot, proxmox }, caFile, credentialsFile);
        return {
          ...tenant,
          watch(print) {
            const stopWatching = watchInstances(stack, print);
            cleanup.push(async () => stopWatching());
          },
        };
      },
      stop: cleanup.stop,
    };
  });
}

async function register(stack: Stack, emulators: Emulators, caFile: string, credentialsFile: string): Promise<Pick<DevTenant, "banner">> {
  const call = <T = Record<string, unknown>>(method: string, input: Record<string, unknown> = {}) =>
    callApi<T>(stack.url, stack.adminKey, method, input);
  const { hetznerCloud, hetznerRobot, proxmox } = emulators;
  // Each account and its pool share an id; `example` is the instance the banner's commands create there.
  const accounts = [
    {
      id: "hcloud",
      provider: "hetzner-cloud",
      name: "Hetzner Cloud",
      url: hetznerCloud.url,
      config: { token: hetznerCloud.token, endpoint: hetznerCloud.url },
      location: "fsn1",
      flavor: { id: "hcloud-cx22", offer: "cx22", image: "ubuntu-24.04" },
      example: "web-1",
    },
    {
      id: "robot",
      provider: "hetzner-robot",
      name: "Hetzner Robot",
      url: hetznerRobot.url,
      config: { user: hetznerRobot.user, password: hetznerRobot.password, endpoint: hetznerRobot.url, products: EMULATED_PRODUCTS },
      location: undefined,
      flavor: { id: "robot-ax41", offer: "AX41-NVMe", image: "rescue-linux" },
      example: "box-1",
    },
    {
      id: "proxmox",
      provider: "proxmox",
      name: "Proxmox VE",
      url: proxmox.url,
      config: { baseUrl: proxmox.url, node: proxmox.node, tokenId: proxmox.tokenId, tokenSecret: proxmox.tokenSecret },
      location: proxmox.node,
      flavor: { id: "proxmox-small", offer: "small", image: "9000" },
      example: "vm-1",
    },
  ];

  await call("vps.tenants.create", { id: TENANT, name: "Demo tenant (npm run dev)" });
  const flavors: string[] = [];
  for (const a of accounts) {
    await call("vps.accounts.create", { id: a.id, provider: a.provider, config: a.config });
    await call("vps.pools.create", {
      id: a.id,
      account: a.id,
      class: "provider",
      agent: "none",
      ...(a.location ? { location: a.location } : {}),
    });
    const flavor = await call<{ vcpus: number; memoryMiB: number; diskGiB: number }>("vps.flavors.create", { pool: a.id, ...a.flavor });
    await call("vps.quotas.set", {
      tenant: TENANT,
      pool: a.id,
      instances: QUOTA_INSTANCES,
      vcpus: QUOTA_INSTANCES * flavor.vcpus,
      memoryMiB: QUOTA_INSTANCES * flavor.memoryMiB,
      diskGiB: QUOTA_INSTANCES * flavor.diskGiB,
    });
    flavors.push(
      `    pool ${a.id.padEnd(8)} ${a.name.padEnd(13)} flavor ${a.flavor.id} (${a.flavor.offer}, ${a.flavor.image}: ` +
        `${flavor.vcpus} vCPU, ${flavor.memoryMiB} MiB, ${flavor.diskGiB} GiB)`,
    );
  }
  const key = await call<{ id: string; key: string }>("iam.apiKeys.create", { name: `${TENANT} (npm run dev)`, roles: ["vps-tenant"] });
  await call("vps.tenants.addMember", { tenant: TENANT, principal: `apikey:${key.id}` });
  // The tenant adds its own SSH key, with its own key.
  await callApi(stack.url, key.key, "vps.sshKeys.create", SSH_KEY);

  // What an operator needs to look at the emulators directly (curl, hcloud, proxmoxer), while they run.
  const credentials = {
    "hetzner-cloud": { endpoint: hetznerCloud.url, token: hetznerCloud.token },
    "hetzner-robot": { endpoint: hetznerRobot.url, user: hetznerRobot.user, password: hetznerRobot.password },
    proxmox: {
      baseUrl: proxmox.url,
      node: proxmox.node,
      tokenId: proxmox.tokenId,
      tokenSecret: proxmox.tokenSecret,
      tls: { spkiSha256: proxmox.spkiSha256, caBundle: proxmox.certificate },
    },
  };
  fs.writeFileSync(credentialsFile, `${JSON.stringify(credentials, null, 2)}\n`, { mode: 0o600 });

  const [hc, robot, pve] = accounts as [(typeof accounts)[number], (typeof accounts)[number], (typeof accounts)[number]];
  const seconds = (ms: number) => `${ms / 1000} s`;
  const banner = {
    real: [
      "             the vps module, its reconciler and the Hetzner Cloud, Hetzner Robot and Proxmox adapters (in the Worker), calling",
      "             the providers over HTTP and HTTPS; workerd verifies the Proxmox emulator's self-signed certificate, trusted through",
      `             NODE_EXTRA_CA_CERTS=${caFile} given to wrangler dev (the adapters' TLS is as in production)`,
    ],
    simulated: [
      `             the providers: ${hc.name} at ${hc.url}, ${robot.name} at ${robot.url} and ${pve.name} at ${pve.url}:`,
      `             emulators in this process, servers in memory; an hcloud action takes ${seconds(ACTION_MS.hetznerCloud)}, ` +
        `a Robot boot ${seconds(ACTION_MS.hetznerRobot)}, a Proxmox task ${seconds(ACTION_MS.proxmox)}`,
      `             (their URLs and credentials are in ${shownPath(credentialsFile)} while they run)`,
    ],
    summary: [
      `  tenant ${TENANT}: a quota of ${QUOTA_INSTANCES} instances in each provider pool (agent none), the SSH key ${SSH_KEY.name},`,
      `  and its API key (role vps-tenant, new on every npm run dev): ${key.key}`,
      ...flavors,
      "  an instance moves when a request asks it to, then at each sweep: here every " + DEV_SWEEP_SECONDS + " s while one is on its way",
      "  (deployed: the cron, each minute); every change is shown below as it happens",
    ],
    commands: [
      `  try, as tenant ${TENANT} (unset BC_URL BC_API_KEY to be the admin again):`,
      `    export BC_URL=${stack.url} BC_API_KEY=${key.key}`,
      "    npx better-compute vps flavors list",
      ...accounts.map(
        (a) =>
          `    npx better-compute vps instances create --id ${a.example} --pool ${a.id} --flavor ${a.flavor.id} --name ${a.example} --sshKeys ${SSH_KEY.name}`,
      ),
      "    npx better-compute vps instances list",
      `    npx better-compute vps instances history --instance ${hc.example}`,
      `    npx better-compute vps instances stop ${hc.example}`,
      `    npx better-compute vps instances delete ${hc.example}`,
      "",
    ],
  };
  return { banner };
}

/** States an instance passes through on its way: while one is in them, the dev stack sweeps more often. */
const MOVING = new Set(["created", "requested", "pending", "creating", "starting", "stopping", "deleting"]);
/** How often the dev stack runs the scheduled handler while an instance is on its way (a deployment: the cron, each minute). */
export const DEV_SWEEP_SECONDS = 5;

/**
 * Prints each instance's state changes (and what was asked of it) from the event record, in order,
 * and runs the Worker's scheduled handler every DEV_SWEEP_SECONDS while an instance is on its way,
 * so the emulators' jobs are seen done in seconds rather than at the next minute. Answers its stop.
 */
function watchInstances(stack: Stack, print: (line: string) => void): () => void {
  const changes = eventFeed((method, input) => callApi(stack.url, stack.adminKey, method, input), "vps.instance.*");
  let lastProblem = "";
  let polling = false;
  const moving = new Set<string>();
  let lastSweep = 0;
  const sweep = async () => {
    const [cron] = stack.crons;
    if (!cron || moving.size === 0 || Date.now() - lastSweep < DEV_SWEEP_SECONDS * 1000) return;
    lastSweep = Date.now();
    const res = await fetch(`${stack.url}/__scheduled?cron=${encodeURIComponent(cron)}`, { signal: AbortSignal.timeout(30_000) });
    await res.body?.cancel();
  };
  const poll = async () => {
    if (polling) return;
    polling = true;
    try {
      for await (const event of changes()) {
        const line = instanceLine(event);
        if (line) print(line);
        const id = event.subject?.replace(/^vps\/instances\//, "");
        if (id) {
          if (MOVING.has(event.type.slice("vps.instance.".length))) moving.add(id);
          else moving.delete(id);
        }
      }
      await sweep();
      lastProblem = "";
    } catch (err) {
      const problem = err instanceof Error ? err.message : String(err);
      if (problem !== lastProblem) print(`  could not read the instances' changes (events.list): ${problem}`);
      lastProblem = problem;
    } finally {
      polling = false;
    }
  };
  const timer = setInterval(() => void poll(), 1_000);
  return () => clearInterval(timer);
}

const HOST_POOL_EVENTS = new Set(["placed", "state", "moved"]);

function instanceLine(event: DevEvent): string | undefined {
  const id = event.subject?.replace(/^vps\/instances\//, "");
  if (!id) return undefined;
  const what = event.type.slice("vps.instance.".length);
  // A host pool's instance changes (placed, state, moved) are --vms's to print (scripts/dev/vms.ts).
  if (HOST_POOL_EVENTS.has(what)) return undefined;
  const d = event.data;
  if (what === "created") return `  instance ${id}  created for tenant ${String(d.tenant)} in pool ${String(d.pool)} (pending)`;
  if (what === "requested") return `  instance ${id}  ${String(d.action)} asked`;
  const error = d.error as { message?: string } | undefined;
  return `  instance ${id}  ${String(d.from)} → ${what}${error?.message ? `  (${error.message})` : ""}`;
}
