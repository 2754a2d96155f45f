// A real machine behind the IPMI BMC (testing/ipmi-bmc.ts: OpenIPMI's ipmi_sim over a QEMU q35
// SeaBIOS guest), driven first by Debian's ipmitool as an operator would (the reference client),
// then by the bcx-ipmi plugin's client (plugins/bcx-ipmi/ipmitool.ts): chassis power really
// powers the machine, `bootdev` is the device SeaBIOS boots (its console says which), sdr and fru
// answer, serial over LAN carries the machine's console live both ways (SeaBIOS and iPXE lines
// out, Ctrl-B and a command typed into iPXE in), a wrong password is refused at once and a BMC
// that is not there fails within the timeout. Last, the same BMC inside a network namespace (as
// the emulated site runs it), reached by ipmitool inside. Every ipmitool call is -C 3.
import { execFile, spawn, spawnSync, type ChildProcess } from "node:child_process";
import dgram from "node:dgram";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fruIdentity, IpmiClient, IpmiError, type SolSession } from "../../plugins/bcx-ipmi/ipmitool.ts";
import { startIpmiBmc, type IpmiBmc } from "../../testing/ipmi-bmc.ts";
import { canMakeNetns, makeNetns, removeLeftoverNetns, type Netns } from "../../testing/netns.ts";
import { startQemuMachine, type QemuMachine } from "../../testing/qemu-machine.ts";

const USER = "admin";
const PASS = "ipmi-Pa55word";
const SMBIOS = { manufacturer: "Better Compute", product: "BC-Emulated 1", serial: "BC-IPMI-0001" };
const NS_PREFIX = "bc-ipmitest";

const has = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
const missing = ["qemu-system-x86_64", "ipmi_sim", "sdrcomp", "ipmitool", "socat", "script"].filter((c) => !has(c));
const skipReason =
  missing.length > 0
    ? `missing ${missing.join(", ")} (apt-get install qemu-system-x86 openipmi ipmitool socat util-linux)`
    : !canMakeNetns()
      ? "network namespaces cannot be made here (Linux, root, iproute2)"
      : undefined;
if (skipReason) console.warn(`ipmi-bmc: skipped: ${skipReason}`);

/** The console without colours and cursor moves. */
const plain = (text: string) => text.replace(/\x1b\[[0-9;=?]*[A-Za-z]/g, "");
const timings: Record<string, number[]> = {};
const time = (what: string, ms: number) => (timings[what] ??= []).push(ms);

/** Debian's ipmitool, asynchronously (the BMC's chassis control is answered by this process). */
async function ipmitool(port: number, args: string[], opts: { password?: string; prefix?: string[] } = {}) {
  const argv = [...(opts.prefix ?? []), "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", String(port), "-U", USER, "-E"];
  argv.push("-C", "3", "-N", "1", "-R", "2", ...args);
  const started = Date.now();
  const env = { PATH: process.env.PATH, IPMI_PASSWORD: opts.password ?? PASS };
  const done = await promisify(execFile)(argv[0]!, argv.slice(1), { env, timeout: 20_000 }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? -1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" }),
  );
  const ms = Date.now() - started;
  if (!opts.prefix) time(`ipmitool ${args.slice(0, 2).join(" ")}`, ms);
  return { ...done, ms };
}

async function ok(port: number, args: string[], prefix?: string[]): Promise<string> {
  const r = await ipmitool(port, args, prefix ? { prefix } : {});
  expect(r.code, `ipmitool ${args.join(" ")}: ${r.stderr}`).toBe(0);
  return r.stdout;
}

/** `ipmitool sol activate` under a pty (script), as an operator's terminal; its output as text. */
function solActivate(port: number, prefix: string[] = []) {
  const cmd = `exec ipmitool -I lanplus -H 127.0.0.1 -p ${port} -U ${USER} -E -C 3 -N 1 -R 2 sol activate`;
  const argv = [...prefix, "script", "-qfec", cmd, "-E", "never", "/dev/null"];
  const child = spawn(argv[0]!, argv.slice(1), {
    env: { PATH: process.env.PATH, IPMI_PASSWORD: PASS, SHELL: "/bin/sh" },
    stdio: ["pipe", "pipe", "pipe"],
    detached: true,
  });
  const session = { child, text: "" };
  child.stdout!.on("data", (d: Buffer) => (session.text += d.toString("latin1")));
  child.stderr!.on("data", (d: Buffer) => (session.text += d.toString("latin1")));
  return session;
}

async function endSol(child: ChildProcess, port: number, prefix?: string[]): Promise<void> {
  const closed = new Promise((resolve) => child.once("close", resolve));
  if (child.exitCode === null) process.kill(-child.pid!, "SIGTERM");
  await closed;
  await ipmitool(port, ["sol", "deactivate"], prefix ? { prefix } : {});
}

/** Waits until `read()` matches, from `from` on; fails quoting its end. */
async function waitForText(read: () => string, pattern: RegExp, from = 0, timeoutMs = 30_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = pattern.exec(plain(read().slice(from)));
    if (m) return Date.now();
    if (Date.now() > deadline)
      throw new Error(`no ${pattern} within ${timeoutMs / 1000} s; the end: ${JSON.stringify(plain(read()).slice(-500))}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Command lines of every process now: the password must be in none. */
function allCommandLines(): string {
  return readdirSync("/proc")
    .filter((p) => /^\d+$/.test(p))
    .map((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, "latin1").replaceAll("\0", " ");
      } catch {
        return "";
      }
    })
    .join("\n");
}

/** Processes whose command line names `text` (a BMC's directory). */
const processesNaming = (text: string) =>
  allCommandLines()
    .split("\n")
    .filter((l) => l.includes(text));

describe.skipIf(skipReason !== undefined)("an IPMI BMC (ipmi_sim) over a QEMU machine", () => {
  let q: QemuMachine;
  let bmc: IpmiBmc;
  let port: number;
  const machineLines: string[] = [];

  beforeAll(async () => {
    removeLeftoverNetns(NS_PREFIX);
    // No disk: bootdev disk is checked on the override; SeaBIOS tries the CD (empty) and the NIC (iPXE).
    q = await startQemuMachine({
      name: "ipmi1",
      accel: "tcg",
      memoryMiB: 128,
      smbios: SMBIOS,
      nics: [{ mac: "52:54:00:1b:c0:01" }],
      log: (line) => machineLines.push(line),
    });
    bmc = await startIpmiBmc({ machines: [q], user: USER, password: PASS });
    port = bmc.port("ipmi1");
  });

  afterAll(async () => {
    const dir = bmc?.dir;
    await bmc?.stop();
    await q?.stop();
    if (dir) {
      expect(existsSync(dir)).toBe(false);
      expect(processesNaming(dir)).toEqual([]);
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const lines = Object.entries(timings).map(([what, ms]) => `${what}: median ${median(ms)} ms of ${ms.length}`);
    console.log(`${machineLines.join("\n")}\nipmi-bmc timings:\n  ${lines.join("\n  ")}`);
  });

  it("ipmitool: power, boot device, sdr, fru, mc info and serial over LAN act on the machine", async () => {
    expect(bmc.address("ipmi1")).toBe(`127.0.0.1:${port}`);
    expect(await ok(port, ["chassis", "power", "status"])).toContain("Chassis Power is off");
    expect(await ok(port, ["sdr", "list"])).toMatch(/MB Temp\s+\| 40 degrees C\s+\| ok/);
    const fru = await ok(port, ["fru", "print"]);
    expect(fru).toMatch(/Product Manufacturer\s+: Better Compute/);
    expect(fru).toMatch(/Product Name\s+: BC-Emulated 1/);
    expect(fru).toMatch(/Product Serial\s+: BC-IPMI-0001/);
    expect(fru).toMatch(/Board Serial\s+: BC-IPMI-0001/);
    expect(await ok(port, ["mc", "info"])).toMatch(/IPMI Version\s+: 2\.0/);

    // A wrong password: refused by the BMC, at once.
    const refused = await ipmitool(port, ["chassis", "power", "status"], { password: "not-the-password" });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("Unable to establish IPMI v2 / RMCP+ session");
    expect(refused.ms).toBeLessThan(2_000);

    // bootdev cdrom, then power on with an operator's SOL session open: SeaBIOS boots the (empty) CD first.
    expect(await ok(port, ["chassis", "bootdev", "cdrom"])).toContain("Set Boot Device to cdrom");
    await expect.poll(() => q.bootOverride).toEqual({ target: "Cd", enabled: "Once" });
    const sol = solActivate(port);
    try {
      await waitForText(() => sol.text, /SOL Session operational/, 0, 10_000);
      expect(allCommandLines()).not.toContain(PASS); // ipmi_sim, the chassis control, ipmitool: none has it in its argv
      const from = sol.text.length;
      const consoleFrom = q.console.length;
      const started = Date.now();
      expect(await ok(port, ["chassis", "power", "on"])).toContain("Chassis Power Control: Up/On");
      expect(await ok(port, ["chassis", "power", "status"])).toContain("Chassis Power is on");
      time("power on → SeaBIOS over SOL", (await waitForText(() => sol.text, /SeaBIOS/, from)) - started);
      time("power on → Booting from DVD/CD over SOL", (await waitForText(() => sol.text, /Booting from DVD\/CD/, from)) - started);
      expect(plain(q.console.text.slice(consoleFrom))).toContain("Booting from DVD/CD");
      await expect.poll(() => q.bootOverride).toEqual({ target: "None", enabled: "Disabled" }); // once: spent by that boot
      expect(await q.powerState()).toBe("On");

      // bootdev pxe, power cycle: a cold boot (a fresh QEMU) into iPXE's ROM.
      expect(await ok(port, ["chassis", "bootdev", "pxe"])).toContain("Set Boot Device to pxe");
      await expect.poll(() => q.bootOverride).toEqual({ target: "Pxe", enabled: "Once" });
      const launches = q.launches;
      const cycleFrom = sol.text.length;
      expect(await ok(port, ["chassis", "power", "cycle"])).toContain("Chassis Power Control: Cycle");
      await waitForText(() => sol.text, /Booting from ROM[\s\S]*iPXE/, cycleFrom);
      expect(plain(sol.text.slice(cycleFrom))).not.toContain("Booting from DVD/CD");
      expect(q.launches).toBeGreaterThan(launches);

      // bootdev disk (the machine's Hdd group), options=persistent (ipmi_sim drops the flag: next boot only).
      expect(await ok(port, ["chassis", "bootdev", "disk", "options=persistent"])).toContain("Set Boot Device to disk");
      await expect.poll(() => q.bootOverride).toEqual({ target: "Hdd", enabled: "Once" });
      expect(await ok(port, ["chassis", "bootdev", "none"])).toContain("Set Boot Device to none");
      await expect.poll(() => q.bootOverride).toEqual({ target: "None", enabled: "Disabled" });

      // reset: another cold boot; soft: the ACPI button (SeaBIOS and iPXE ignore it: still on); off.
      const beforeReset = q.launches;
      expect(await ok(port, ["chassis", "power", "reset"])).toContain("Chassis Power Control: Reset");
      await expect.poll(() => q.launches).toBeGreaterThan(beforeReset);
      await expect.poll(() => q.powerState()).toBe("On");
      const powerButton = q.nextEvent("POWERDOWN", 10_000);
      expect(await ok(port, ["chassis", "power", "soft"])).toContain("Chassis Power Control: Soft");
      await powerButton;
      expect(await q.powerState()).toBe("On");
      expect(await ok(port, ["chassis", "power", "off"])).toContain("Chassis Power Control: Down/Off");
      expect(await ok(port, ["chassis", "power", "status"])).toContain("Chassis Power is off");
      await expect.poll(() => q.powerState()).toBe("Off");
    } finally {
      await endSol(sol.child, port);
    }
  }, 90_000);

  it("the bcx-ipmi client: power, boot device, sensors, FRU, mc info, a SOL stream both ways", async () => {
    const client = new IpmiClient({ address: bmc.address("ipmi1"), username: USER, password: PASS }, { powerWaitMs: 20_000 });
    const timed = async <T>(what: string, run: () => Promise<T>): Promise<T> => {
      const started = Date.now();
      const out = await run();
      time(`client ${what}`, Date.now() - started);
      return out;
    };
    expect(await timed("powerStatus", () => client.powerStatus())).toBe("off");
    expect(await timed("sensors", () => client.sensors())).toEqual([
      { name: "MB Temp", value: 40, unit: "degrees C", status: "ok", reading: "40 degrees C" },
    ]);
    const fru = await timed("fru", () => client.fru());
    expect(fru[0]).toMatchObject({ id: 0, description: "Builtin FRU Device" });
    expect(fruIdentity(fru)).toEqual(SMBIOS);
    expect((await timed("mcInfo", () => client.mcInfo()))["IPMI Version"]).toBe("2.0");

    await timed("setBootDevice", () => client.setBootDevice("pxe"));
    await expect.poll(() => q.bootOverride).toEqual({ target: "Pxe", enabled: "Once" });
    expect(await client.setBootDevice("cdrom", { persistent: true })).toEqual({ device: "cdrom", persistent: true });
    await expect.poll(() => q.bootOverride).toEqual({ target: "Cd", enabled: "Once" });

    // SOL: the stream shows the boot; Ctrl-B typed into it stops iPXE at its prompt, a command typed runs.
    const sol: SolSession = await timed("sol (session up)", () => client.sol());
    let text = "";
    sol.on("data", (d: Buffer) => (text += d.toString("latin1")));
    try {
      expect(allCommandLines()).not.toContain(PASS);
      const started = Date.now();
      expect(await client.power("on")).toEqual({ previous: "off", powerState: "on" });
      time("client power on → SeaBIOS over SOL", (await waitForText(() => text, /SeaBIOS/)) - started);
      await waitForText(() => text, /Booting from DVD\/CD[\s\S]*Booting from ROM/);
      const ctrlB = setInterval(() => sol.write("\x02"), 150);
      try {
        await waitForText(() => text, /iPXE> /);
      } finally {
        clearInterval(ctrlB);
      }
      await new Promise((r) => setTimeout(r, 300));
      const typedFrom = text.length;
      sol.write("echo typed-over-sol\r");
      await waitForText(() => text, /typed-over-sol[\s\S]*typed-over-sol/, typedFrom, 15_000); // echoed as typed, then printed

      // cycle (on: off then on), off, cycle when off (on), reset, soft (the OS decides: SeaBIOS/iPXE stay on).
      let launches = q.launches;
      expect(await client.power("cycle")).toEqual({ previous: "on", powerState: "on" });
      await expect.poll(() => q.launches).toBeGreaterThan(launches);
      expect(await client.power("off")).toEqual({ previous: "on", powerState: "off" });
      await expect.poll(() => q.powerState()).toBe("Off");
      expect(await client.power("off")).toEqual({ previous: "off", powerState: "off" });
      expect(await client.power("cycle")).toEqual({ previous: "off", powerState: "on" });
      await expect.poll(() => q.powerState()).toBe("On");
      launches = q.launches;
      expect(await client.power("reset")).toEqual({ previous: "on", powerState: "on" });
      await expect.poll(() => q.launches).toBeGreaterThan(launches);
      expect(await client.power("soft")).toEqual({ previous: "on", powerState: "on" });
      expect(await client.power("off")).toEqual({ previous: "on", powerState: "off" });
    } finally {
      await sol.close();
    }
    // The session was deactivated at close: another starts at once.
    const again = await client.sol();
    await again.close();
  }, 90_000);

  it("the bcx-ipmi client: a wrong password, a BMC that is not there, bad input", async () => {
    const wrong = "Wr0ng-pa55";
    const refused = new IpmiClient({ address: bmc.address("ipmi1"), username: USER, password: wrong });
    let started = Date.now();
    const e1 = await refused.powerStatus().catch((e: unknown) => e);
    expect(e1).toBeInstanceOf(IpmiError);
    expect((e1 as IpmiError).code).toBe("DRIVER_ERROR");
    expect((e1 as IpmiError).message).toBe(
      `BMC 127.0.0.1:${port} refused the session: authentication failed (wrong user name or password)`,
    );
    expect((e1 as IpmiError).message).not.toContain(wrong);
    expect(Date.now() - started).toBeLessThan(2_000);

    // A closed port on loopback: nothing answers; with -N 1 -R 1 ipmitool gives up after about 2 s.
    const closedPort = await new Promise<number>((resolve) => {
      const s = dgram.createSocket("udp4").bind(0, "127.0.0.1", () => {
        const { port: p } = s.address();
        s.close(() => resolve(p));
      });
    });
    const nobody = new IpmiClient(
      { address: `127.0.0.1:${closedPort}`, username: USER, password: PASS },
      { retries: 1, timeoutMs: 10_000 },
    );
    started = Date.now();
    const e2 = await nobody.powerStatus().catch((e: unknown) => e);
    const took = Date.now() - started;
    expect((e2 as IpmiError).code).toBe("DRIVER_ERROR");
    expect((e2 as IpmiError).message).toMatch(
      new RegExp(`^BMC 127\\.0\\.0\\.1:${closedPort} unreachable \\(no answer within \\d+\\.\\d s\\)$`),
    );
    expect(took).toBeLessThan(10_000);
    time("client unreachable (-N 1 -R 1)", took);

    const invalid = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return (e as IpmiError).code;
      }
      return "no error";
    };
    expect(invalid(() => new IpmiClient({ address: "127.0.0.1", username: USER, password: PASS, cipherSuite: 0 }))).toBe(
      "INVALID_ARGUMENT",
    );
    expect(invalid(() => new IpmiClient({ address: "127.0.0.1", username: USER, password: "" }))).toBe("INVALID_ARGUMENT");
    expect(invalid(() => new IpmiClient({ address: "-H evil", username: USER, password: PASS }))).toBe("INVALID_ARGUMENT");
    const client = new IpmiClient({ address: bmc.address("ipmi1"), username: USER, password: PASS });
    await expect(client.setBootDevice("floppy" as "pxe")).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
    await expect(client.power("hibernate" as "on")).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
  }, 30_000);

  it("inside a network namespace, as the emulated site runs it: ipmitool inside drives the machine, SOL included", async () => {
    const ns: Netns = makeNetns(NS_PREFIX, "bmc");
    let inside: IpmiBmc | undefined;
    try {
      inside = await startIpmiBmc({ machines: [{ machine: q, id: "m1" }], user: USER, password: PASS, netns: ns });
      const p = inside.port("m1");
      expect(await ok(p, ["chassis", "power", "status"], ns.prefix)).toContain("Chassis Power is off");
      // Not on the host's loopback: nothing answers there (with one quick try).
      const outside = new IpmiClient({ address: `127.0.0.1:${p}`, username: USER, password: PASS }, { retries: 1 });
      await expect(outside.powerStatus()).rejects.toThrow(/unreachable/);

      const sol = solActivate(p, ns.prefix);
      try {
        await waitForText(() => sol.text, /SOL Session operational/, 0, 10_000);
        const from = sol.text.length;
        expect(await ok(p, ["chassis", "power", "on"], ns.prefix)).toContain("Up/On");
        await waitForText(() => sol.text, /SeaBIOS[\s\S]*iPXE/, from);
        expect(await ok(p, ["chassis", "power", "off"], ns.prefix)).toContain("Down/Off");
        await expect.poll(() => q.powerState()).toBe("Off");
      } finally {
        await endSol(sol.child, p, ns.prefix);
      }
    } finally {
      const dir = inside?.dir;
      await inside?.stop();
      if (dir) expect(processesNaming(dir)).toEqual([]);
      await ns.remove();
    }
  }, 60_000);
});
