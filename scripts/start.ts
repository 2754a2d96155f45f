// npm start (and npm run dev): the whole control plane on this machine with no external service.
//
//   npm start [-- options]     the stack: PGlite keeps its data under .data/ (or $BC_DATA_DIR);
//                              DATABASE_URL points it at any real Postgres instead
//   npm run dev [-- options]   the stack plus a whole simulated site (scripts/dev/site.ts),
//                              on its own data dir, <data dir>/dev, started afresh each run
//
//   --port P           the API's port (default $PORT, else 8787)
//   --new-admin-key    mint a new admin key instead of reusing the one kept in the data dir
//   --sim N            join N simulated ping-only agents (FakeDaemon, role node)
//   --site             the simulated site (what npm run dev passes); --machines N of them (default 3)
//   --emulated         with --site: QEMU machines that really network-boot through the installed bcd
//                      site agent instead of simulated ones (scripts/dev/emulated.ts); --machines N (default 2);
//                      --ipmi: behind IPMI BMCs (ipmi_sim), driven by the site agent's bcx-ipmi plugin
//   --providers        with --site: the Hetzner Cloud, Hetzner Robot and Proxmox emulators, registered
//                      as accounts and pools with a tenant (scripts/dev/providers.ts)
//   --vms              with --site: this machine as the host of a host pool (a real bcd node booting
//                      QEMU microVMs) with a tenant (scripts/dev/vms.ts)
import path from "node:path";
import { parseArgs } from "node:util";
import { nodeTransport } from "../agent/node-transport.ts";
import { FakeDaemon } from "../testing/index.ts";
import { startDevProviders, type DevTenant } from "./dev/providers.ts";
import { startDevSite, type DevSite } from "./dev/site.ts";
import { devEmulatedBuilds, devEmulatedProblem, EMULATED_SITE_MAIN, startDevEmulated, type DevEmulated } from "./dev/emulated.ts";
import { devGuestImage, devVmsProblem, registerDevVms, type DevVms } from "./dev/vms.ts";
import { repoRoot } from "../local/node-store.ts";
import { shownPath, StackRefusedError, startStack, type Stack } from "../local/stack.ts";

const USAGE =
  "usage: npm start -- [--port P] [--new-admin-key] [--sim N]    npm run dev -- [--emulated [--ipmi]] [--machines N] [--providers] [--vms] [--port P] [--sim N]";

let values;
try {
  ({ values } = parseArgs({
    options: {
      sim: { type: "string", default: "0" },
      port: { type: "string" },
      site: { type: "boolean", default: false },
      machines: { type: "string" },
      emulated: { type: "boolean", default: false },
      ipmi: { type: "boolean", default: false },
      providers: { type: "boolean", default: false },
      vms: { type: "boolean", default: false },
      "new-admin-key": { type: "boolean", default: false },
    },
  }));
} catch (err) {
  usage((err as Error).message);
}
const simulated = count(values.sim, "--sim", "agents", 0, 1000);
const siteMode = values.site;
if (values.machines !== undefined && !siteMode) usage("--machines is for the simulated site: npm run dev -- --machines N");
// The emulators live in this process only: their accounts belong in npm run dev's data, started afresh.
if (values.providers && !siteMode) usage("--providers is for npm run dev (its data starts afresh): npm run dev -- --providers");
if (values.vms && !siteMode) usage("--vms is for npm run dev (its data starts afresh): npm run dev -- --vms");
if (values.emulated && !siteMode) usage("--emulated is for npm run dev: npm run dev -- --emulated");
if (values.ipmi && !values.emulated) usage("--ipmi is for the emulated site: npm run dev -- --emulated --ipmi");
const emulated = values.emulated;
const machines = emulated
  ? count(values.machines ?? "2", "--machines", "emulated machines", 1, 8)
  : count(values.machines ?? "3", "--machines", "machines", 1, 100);
const port = Number(values.port ?? process.env.PORT ?? 8787);
if (!Number.isInteger(port) || port < 1 || port > 65535) usage(`--port takes a port number, not ${values.port ?? process.env.PORT}`);

const baseDir = process.env.BC_DATA_DIR ? path.resolve(process.env.BC_DATA_DIR) : path.join(repoRoot, ".data");
// The simulated machines live only in memory: the dev site starts from empty data, away from npm start's.
const dataDir = siteMode ? path.join(baseDir, "dev") : baseDir;
const databaseUrl = siteMode ? undefined : process.env.DATABASE_URL || undefined;
if (siteMode && process.env.DATABASE_URL)
  console.log("npm run dev keeps its own embedded PGlite (its machines live only in memory): DATABASE_URL is not used");
console.log(
  siteMode
    ? `Better Compute: starting ${emulated ? "an emulated" : "a simulated"} site afresh in ${shownPath(dataDir)}…`
    : databaseUrl
      ? "Better Compute: starting on DATABASE_URL…"
      : `Better Compute: starting on the embedded PGlite (${shownPath(path.join(dataDir, "pglite"))})…`,
);

// Before the stack: wrangler dev reads NODE_EXTRA_CA_CERTS once, when it starts, and must trust
// the Proxmox emulator's self-signed certificate (workerd verifies it like any other).
const providers = values.providers ? await startDevProviders() : undefined;
if (providers) process.env.NODE_EXTRA_CA_CERTS = providers.caFile;
// The VM host's guest image is built (minutes, the first time) or found while the stack starts.
const vmsProblem = values.vms ? await devVmsProblem() : undefined;
if (vmsProblem) {
  await providers?.stop();
  console.error(vmsProblem);
  process.exit(1);
}
const guestImage = values.vms ? devGuestImage((line) => console.log(line)) : undefined;
guestImage?.catch(() => {}); // awaited below, once the stack runs
const emulatedProblem = emulated ? devEmulatedProblem(values.ipmi) : undefined;
if (emulatedProblem) {
  await providers?.stop();
  console.error(emulatedProblem);
  process.exit(1);
}
const emulatedBuilds = emulated ? devEmulatedBuilds((line) => console.log(line)) : undefined;
emulatedBuilds?.catch(() => {}); // awaited below, once the stack runs

let stack: Stack;
try {
  stack = await startStack({
    dataDir,
    port,
    databaseUrl,
    fresh: siteMode,
    // The emulated machines' pool names examples/emulated-site's hardware profile.
    ...(emulated ? { main: EMULATED_SITE_MAIN } : {}),
    newAdminKey: values["new-admin-key"],
    onOutput: (line) => console.log(`  [wrangler] ${line}`),
    onNotice: (line) => console.log(line),
  });
} catch (err) {
  await providers?.stop();
  if (!(err instanceof StackRefusedError)) throw err;
  console.error(err.message);
  process.exit(1);
}
const running: { daemons: FakeDaemon[]; site?: DevSite; emulated?: DevEmulated; tenant?: DevTenant; vms?: DevVms } = { daemons: [] };
let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    console.log("\nstopping…");
    await running.vms?.stop();
    await running.site?.stop();
    await running.emulated?.stop();
    await providers?.stop();
    await Promise.all(running.daemons.map((d) => d.stop()));
    await stack.stop();
    process.exit(0);
  });
}

try {
  running.daemons = await simulate(stack, simulated);
  if (emulated)
    running.emulated = await startDevEmulated(stack, await emulatedBuilds!, {
      machines,
      ipmi: values.ipmi,
      print: (line) => console.log(line),
    });
  else if (siteMode) running.site = await startDevSite(stack, { machines, print: (line) => console.log(line) });
  if (providers) running.tenant = await providers.register(stack);
  if (guestImage) running.vms = await registerDevVms(stack, await guestImage, (line) => console.log(line));
} catch (err) {
  await running.vms?.stop();
  await running.site?.stop();
  await running.emulated?.stop();
  await providers?.stop();
  await Promise.all(running.daemons.map((d) => d.stop()));
  await stack.stop();
  throw err;
}
console.log(banner(stack, running.daemons, running.site, running.tenant, running.vms, running.emulated));
running.site?.watch();
running.emulated?.watch();
running.tenant?.watch((line) => console.log(line));
// --providers' watch prints every instance's transitions: then this one adds only the guests' reports.
running.vms?.watch((line) => console.log(line), { transitions: !running.tenant });

function banner(
  stack: Stack,
  daemons: FakeDaemon[],
  site: DevSite | undefined,
  vps: DevTenant | undefined,
  vms: DevVms | undefined,
  emulated: DevEmulated | undefined,
): string {
  const keyFile = shownPath(path.join(stack.dataDir, "admin-key"));
  const key = stack.adminKeyReused ? `reused from ${keyFile}; --new-admin-key mints another` : `new, kept in ${keyFile}`;
  const cron = stack.crons.length ? `the cron (${stack.crons.map((c) => `"${c}"`).join(", ")}) fires locally` : "no cron in wrangler.toml";
  const lines = [
    `Better Compute is running at ${stack.url}${site || emulated ? ` with ${emulated ? "an emulated" : "a simulated"} site${vps ? " and simulated providers" : ""}${vms ? " and this machine as a VM host" : ""} (npm run dev)` : ""}`,
    "",
    `  admin API key (${key}): ${stack.adminKey}`,
    `  web console: ${stack.url}/console/ (sign in with the admin API key)`,
    site || emulated
      ? `  data: ${shownPath(stack.dataDir)}/, started afresh on every npm run dev (npm start's data is not touched); ${cron}`
      : `  data: ${shownPath(stack.dataDir)}/ (one stack at a time); ${cron}`,
    "",
  ];
  if (site) {
    const [first] = site.machines;
    lines.push(
      "  REAL       the control plane: the API Worker, NodeDOs and WorkflowDOs in wrangler dev's workerd, Postgres (PGlite),",
      `             the site agent (a bcd process, node ${site.siteAgent.nodeId}, state in ${shownPath(site.siteAgent.stateDir)}),`,
      "             the ramdisk and installed-OS agents' protocol (joins, signed hellos and results over WebSockets)",
      ...(vps?.banner.real ?? []),
      ...(vms?.banner.real ?? []),
      `  SIMULATED  ${site.machines.length} machines and their disks (in memory), their BMCs (a Redfish emulator at ${site.bmcUrl}),`,
      "             DHCP: each machine asks the site agent's network boot (real, HTTP) for its iPXE script; its ramdisk",
      "             and installed system are in-process agents; a demo disk image served over HTTP",
      "             (npm run dev -- --emulated boots QEMU machines for real: DHCP, the ramdisk, wipes, image writes)",
      ...(vps?.banner.simulated ?? []),
      "",
      `  machines in pool ${site.pool}: ${site.machines.map((m) => m.node).join(", ")} (enrolled; their states follow below)`,
      ...(vps?.banner.summary ?? []),
      ...(vms?.banner.summary ?? []),
      "",
      ...metalCommands(first?.node, site.image),
      ...(vps?.banner.commands ?? []),
      ...(vms?.banner.commands ?? []),
    );
  } else if (emulated) {
    lines.push(...emulatedBanner(emulated), ...(vps?.banner.commands ?? []), ...(vms?.banner.commands ?? []));
  } else {
    lines.push(
      `  curl ${stack.url}/v1/health`,
      `  curl ${stack.url}/openapi.json`,
      `  curl -X POST -H "authorization: Bearer ${stack.adminKey}" ${stack.url}/v1/modules.list`,
      "",
    );
  }
  if (daemons.length) lines.push(`  ${daemons.length} simulated agents connected: ${daemons.map((d) => d.nodeId).join(", ")}`, "");
  lines.push("Press Ctrl-C to stop.");
  return `\n${lines.join("\n")}`;
}

/** What the emulated site runs, what in it is real, and what to try. */
function emulatedBanner(emulated: DevEmulated): string[] {
  const { site, builds, image } = emulated;
  const [first] = emulated.machines;
  const accel = site.machines[0]?.qemu.accel === "kvm" ? "under KVM" : "under TCG: no working KVM here, every boot is slower";
  return [
    "  REAL       the control plane: the API Worker, NodeDOs and WorkflowDOs in wrangler dev's workerd, Postgres (PGlite),",
    `             examples/emulated-site's deployment; the site agent: the installed bcd build (${builds.bcd.manifest.packageVersion}),`,
    `             node ${site.siteAgentNodeId}, inside network namespace ${site.netns.name}: DHCP (dnsmasq) on br0 only, iPXE scripts,`,
    `             the ramdisk (${builds.ramdisk.manifest.digest.slice(0, 12)}) and the image cache over HTTP;`,
    `             ${site.machines.length} QEMU machines (${accel}): their firmware, NICs, NVMe disks and network boot,`,
    `             the bcd ramdisk that inspects and wipes them, the OS image (${builds.os.manifest.digest.slice(0, 12)}) it writes and they boot`,
    site.ipmi
      ? `  EMULATED   their BMCs: IPMI BMCs (ipmi_sim, UDP in the namespace at ${site.machines.map((m) => m.bmcAddress).join(", ")}),\n             driven by the site agent's bcx-ipmi plugin (ipmitool); each works its machine over QMP`
      : `  EMULATED   their BMCs: a Redfish emulator at ${site.bmc.url} working each machine over QMP`,
    "",
    `  machines in pool ${site.ipmiPool ?? site.pool}: ${emulated.machines.map((m) => `${m.node} (${m.firmware})`).join(", ")} (enrolled; their progress follows below)`,
    `  their consoles: ${emulated.machines.map((m) => shownPath(m.console)).join(", ")}`,
    "",
    ...metalCommands(first?.node, image),
  ];
}

/** The metal commands to try on a site's first machine, deploying this image. */
function metalCommands(node: string | undefined, image: { url: string; sha256: string }): string[] {
  const input = JSON.stringify({ image: { url: image.url, sha256: image.sha256 } });
  return [
    "  try:",
    "    npx better-compute metal nodes list",
    ...(node ? [`    npx better-compute metal console ${node}            # its serial console, live (Ctrl-C leaves)`] : []),
    ...(node
      ? [
          `    npx better-compute metal deploy ${node} --profile metal.deploy.image-stream --input '${input}'`,
          `    npx better-compute metal undeploy ${node}`,
        ]
      : []),
    "",
  ];
}

/** Joins N FakeDaemons with join tokens minted over the API, as an operator would. */
async function simulate(stack: Stack, count: number): Promise<FakeDaemon[]> {
  const daemons: FakeDaemon[] = [];
  for (let i = 0; i < count; i++) {
    const res = await fetch(`${stack.url}/v1/joinTokens.create`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.adminKey}`, "content-type": "application/json" },
      body: JSON.stringify({ role: "node", labels: { "bc.dev/simulated": "true" } }),
    });
    if (!res.ok) throw new Error(`could not mint a join token for a simulated agent: ${res.status} ${await res.text()}`);
    const { token } = (await res.json()) as { token: string };
    const daemon = new FakeDaemon({
      baseUrl: stack.url,
      transport: nodeTransport(),
      role: "node",
      hostname: `sim-${i + 1}`,
      handlers: { "agent.ping": () => ({ pong: true, simulated: true }) },
    });
    await daemon.join(token);
    await daemon.connect();
    daemons.push(daemon);
  }
  return daemons;
}

function count(value: string, flag: string, what: string, min: number, max: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) usage(`${flag} takes a whole number of ${what} from ${min} to ${max}`);
  return n;
}

function usage(problem: string): never {
  console.error(`${problem}\n${USAGE}`);
  process.exit(2);
}
