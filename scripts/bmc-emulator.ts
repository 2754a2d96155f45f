// better-compute bmc-emulator: the Redfish BMC emulator (SIMULATED hardware, nothing here drives
// a real machine) as a process of its own, for trying the site agent and metal.enroll without a
// rack. It prints each system's address (what metal.enroll takes), the credential, and with --tls
// how to trust its self-signed certificate, then serves until SIGINT or SIGTERM. See docs/bmc.md.
//
//   better-compute bmc-emulator [--machines N] [--port P] [--host H] [--tls] [--user U] [--password P]
//                               [--drives N] [--reset-delay-ms MS] [--no-bios] [--no-volume-creation]
//                               [--continuous-boot-only] [--failing-storage] [--require-volume-capacity]
//                               [--virtual-media manager|system|both]
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { isIP } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startRedfishEmulator, VIRTUAL_MEDIA_LOCATIONS, type BmcQuirks, type VirtualMediaLocation } from "../testing/redfish-emulator.ts";
import { selfSignedCertificate } from "../testing/tls.ts";

const USAGE = `usage: better-compute bmc-emulator [--machines N] [--port P] [--host H] [--tls] [--user U] [--password P]
         [--drives N] [--reset-delay-ms MS] [--no-bios] [--no-volume-creation] [--continuous-boot-only]
         [--failing-storage] [--require-volume-capacity] [--virtual-media manager|system|both]

  --machines N               simulated machines, one system each (default 1)
  --port P                   the port (default 0: any free one)
  --host H                   the address to listen on (default 127.0.0.1)
  --tls                      HTTPS with a self-signed certificate (its pin and PEM are printed)
  --user U, --password P     the BMC credential (default admin and a random password, printed)
  --drives N                 drives behind each machine's RAID controller (default 0: no Storage)
real-world BMC behaviour (docs/bmc.md):
  --reset-delay-ms MS        resets are applied MS after they are answered, through PoweringOn/Off
  --no-bios                  no BIOS settings resource
  --no-volume-creation       the Volumes collection offers no POST
  --continuous-boot-only     boot overrides asked Once are recorded Continuous
  --failing-storage          everything under Storage answers 500
  --require-volume-capacity  creating a volume requires CapacityBytes
  --virtual-media WHERE      the virtual CD under each machine's manager (default), its system
                             (iDRAC since 6.x, sushy-tools), or both`;

function usage(problem: string): never {
  console.error(`bmc-emulator: ${problem}\n${USAGE}`);
  process.exit(2);
}

function integer(value: string | undefined, flag: string, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) usage(`${flag} takes a whole number from ${min} to ${max}, not ${JSON.stringify(value)}`);
  return n;
}

let values;
try {
  ({ values } = parseArgs({
    options: {
      machines: { type: "string" },
      port: { type: "string" },
      host: { type: "string", default: "127.0.0.1" },
      tls: { type: "boolean", default: false },
      user: { type: "string", default: "admin" },
      password: { type: "string" },
      drives: { type: "string" },
      "reset-delay-ms": { type: "string" },
      "no-bios": { type: "boolean", default: false },
      "no-volume-creation": { type: "boolean", default: false },
      "continuous-boot-only": { type: "boolean", default: false },
      "failing-storage": { type: "boolean", default: false },
      "require-volume-capacity": { type: "boolean", default: false },
      "virtual-media": { type: "string", default: "manager" },
      help: { type: "boolean", default: false },
    },
  }));
} catch (err) {
  usage((err as Error).message);
}
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}

const machines = integer(values.machines, "--machines", 1, 1000, 1);
const port = integer(values.port, "--port", 0, 65535, 0);
const drives = integer(values.drives, "--drives", 0, 24, 0);
const resetDelayMs = integer(values["reset-delay-ms"], "--reset-delay-ms", 0, 600_000, 0);
const username = values.user;
const password = values.password ?? randomBytes(12).toString("base64url");
if (!username || username.includes(":")) usage("--user takes a name without ':'");
if (!password) usage("--password takes a password");
const host = values.host;
const virtualMedia = VIRTUAL_MEDIA_LOCATIONS.find((l) => l.toLowerCase() === values["virtual-media"]) as VirtualMediaLocation | undefined;
if (!virtualMedia) usage(`--virtual-media takes manager, system or both, not ${JSON.stringify(values["virtual-media"])}`);

const quirks: BmcQuirks = {
  ...(resetDelayMs ? { resetDelayMs } : {}),
  ...(values["no-bios"] ? { noBios: true } : {}),
  ...(values["no-volume-creation"] ? { noVolumeCreation: true } : {}),
  ...(values["continuous-boot-only"] ? { continuousBootOnly: true } : {}),
  ...(values["failing-storage"] ? { failingStorage: true } : {}),
  ...(values["require-volume-capacity"] ? { requireVolumeCapacity: true } : {}),
};

// The certificate names loopback and the host it listens on, so it verifies as its own CA there.
let certDir: string | undefined;
let tls: { key: string; cert: string; spkiSha256: string; certFile: string } | undefined;
if (values.tls) {
  const names = ["IP:127.0.0.1", "DNS:localhost"];
  if (host !== "0.0.0.0" && host !== "::" && host !== "127.0.0.1") names.push(isIP(host) ? `IP:${host}` : `DNS:${host}`);
  const cert = selfSignedCertificate("bmc-emulator", { altNames: names, days: 30 });
  certDir = mkdtempSync(join(tmpdir(), "bc-bmc-emulator-"));
  const certFile = join(certDir, "cert.pem");
  writeFileSync(certFile, cert.cert);
  tls = { ...cert, certFile };
}

const emulator = await startRedfishEmulator({
  machines,
  username,
  password,
  host,
  port,
  drives,
  quirks,
  virtualMedia,
  ...(tls ? { tls: { key: tls.key, cert: tls.cert } } : {}),
}).catch((err: Error) => {
  if (certDir) rmSync(certDir, { recursive: true, force: true });
  console.error(`bmc-emulator: ${err.message}`);
  process.exit(1);
});

const addresses = [...emulator.machines.values()].map((m) => `${emulator.url}/redfish/v1/Systems/${encodeURIComponent(m.id)}`);
const shownQuirks = Object.entries(quirks).map(([k, v]) => (v === true ? k : `${k}=${v}`));
const lines = [
  `Redfish BMC emulator (SIMULATED hardware): ${machines} machine(s) on ${emulator.url}`,
  `  username ${username}`,
  `  password ${password}`,
  ...(shownQuirks.length ? [`  quirks   ${shownQuirks.join(", ")}`] : []),
  ...(virtualMedia !== "Manager"
    ? [`  virtual media under each machine's ${virtualMedia === "System" ? "system" : "manager and system"}`]
    : []),
  ...(tls
    ? [
        "  TLS: a self-signed certificate, as real BMCs serve; trust it in the binding with one of",
        `    bmc.tls.spkiSha256  ${tls.spkiSha256}`,
        `    bmc.tls.caBundle    the PEM in ${tls.certFile}`,
      ]
    : []),
  "systems (each is a BMC address for metal.enroll):",
  ...addresses.map((a) => `  ${a}`),
  "enroll the first one:",
  `  {"pool":"<pool>","bmc":{"address":"${addresses[0]}","username":"${username}","password":"${password}"${tls ? `,"tls":{"spkiSha256":"${tls.spkiSha256}"}` : ""}}}`,
  "Ctrl-C stops it.",
];
console.log(lines.join("\n"));

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    await emulator.stop();
    if (certDir) rmSync(certDir, { recursive: true, force: true });
    process.exit(0);
  });
}
