// `better-compute bmc-emulator` (scripts/bmc-emulator.ts): the Redfish emulator (SIMULATED
// hardware) as a process of its own, spawned with tsx as the CLI runs it. It prints each system's
// address, the credential and, with --tls, the pin and the certificate's PEM file; a system is read
// over real HTTPS trusting that PEM, and the site agent reaches it with the printed pin. Two
// processes never share a product UUID. SIGTERM stops it and removes the PEM file.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { request } from "node:https";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { siteHandlers } from "../../agent/roles/site.ts";
import { repoRoot } from "../../local/node-store.ts";
import { commandContext } from "../support/command-context.ts";

const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) if (child.exitCode === null) child.kill("SIGKILL");
});

/** Spawns the emulator and resolves with what it printed once it is serving. */
function emulator(args: string[]): Promise<{ child: ChildProcess; output: string }> {
  const child = spawn(process.execPath, ["--import", "tsx", path.join(repoRoot, "scripts", "bmc-emulator.ts"), ...args], {
    cwd: repoRoot,
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let output = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the emulator did not start:\n${output}`)), 30_000);
    const seen = (d: Buffer) => {
      output += d;
      if (output.includes("Ctrl-C stops it.")) (clearTimeout(timer), resolve({ child, output }));
    };
    child.stdout!.on("data", seen);
    child.stderr!.on("data", seen);
    child.once("exit", (code) => (clearTimeout(timer), reject(new Error(`the emulator exited (${code}):\n${output}`))));
  });
}

const field = (output: string, re: RegExp) => re.exec(output)?.[1] ?? expect.fail(`${re} not in:\n${output}`);

function getJson(url: string, headers: Record<string, string>, ca: string): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    request(url, { headers, ca }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, json: body ? JSON.parse(body) : undefined }));
    })
      .on("error", reject)
      .end();
  });
}

it("serves simulated systems over TLS, prints how to reach and trust them, and stops on SIGTERM", async () => {
  const [tls, plain] = await Promise.all([
    emulator(["--machines", "2", "--tls", "--user", "ops", "--password", "emulated-Pa55", "--no-bios", "--drives", "2"]),
    emulator(["--machines", "1"]),
  ]);
  const addresses = [...tls.output.matchAll(/^ {2}(https:\/\/127\.0\.0\.1:\d+\/redfish\/v1\/Systems\/node-\d)$/gm)].map((m) => m[1]!);
  expect(addresses).toHaveLength(2);
  expect(tls.output).toMatch(/^ {2}username ops$/m);
  expect(tls.output).toMatch(/^ {2}quirks {3}noBios$/m);
  const pin = field(tls.output, /bmc\.tls\.spkiSha256 +(\S+)/);
  const certFile = field(tls.output, /bmc\.tls\.caBundle +the PEM in (\S+)/);
  const ca = readFileSync(certFile, "utf8");

  // Over HTTPS, trusting the printed PEM: a system of its own, with the quirk asked for.
  const auth = { authorization: `Basic ${Buffer.from("ops:emulated-Pa55").toString("base64")}` };
  const first = await getJson(addresses[0]!, auth, ca);
  const second = await getJson(addresses[1]!, auth, ca);
  expect(first.status).toBe(200);
  expect(first.json).toMatchObject({ Id: "node-1", PowerState: "Off", Storage: { "@odata.id": "/redfish/v1/Systems/node-1/Storage" } });
  expect(first.json.Bios).toBeUndefined();
  expect((await getJson(addresses[0]!, {}, ca)).status).toBe(401);

  // The default password is random, and printed; the plain emulator's systems have UUIDs of their own.
  const plainAddress = field(plain.output, /^ {2}(http:\/\/127\.0\.0\.1:\d+\/redfish\/v1\/Systems\/node-1)$/m);
  const plainPassword = field(plain.output, /^ {2}password (\S+)$/m);
  const plainSystem = (await (
    await fetch(plainAddress, { headers: { authorization: `Basic ${Buffer.from(`admin:${plainPassword}`).toString("base64")}` } })
  ).json()) as { UUID: string };
  expect(new Set([first.json.UUID, second.json.UUID, plainSystem.UUID]).size).toBe(3);

  // The site agent reaches it with the printed pin.
  const ctx = commandContext("metal.bmc.inspect", { "secret://emu": "emulated-Pa55" });
  const inspected = (await siteHandlers()["metal.bmc.inspect"]!(
    { bmc: { address: addresses[1], username: "ops", password: "secret://emu", tls: { spkiSha256: pin } } },
    ctx,
  )) as { systemId: string; uuid: string };
  expect(inspected).toMatchObject({ systemId: "node-2", uuid: second.json.UUID });

  for (const { child } of [tls, plain]) {
    const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
  }
  expect(existsSync(certFile)).toBe(false);
}, 60_000);
