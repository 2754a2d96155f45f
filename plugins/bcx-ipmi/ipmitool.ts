// The IPMI client of the bcx-ipmi plugin: Debian's ipmitool over IPMI 2.0 LAN (RMCP+, lanplus),
// one child process per call (there is no IPMI client on npm; ../shared/IPMI.md). Dependency-free
// Node, so it runs inside a bcx plugin process.
//
//   ipmitool -I lanplus -H host -p port -U user -E -C <suite> -N <s> -R <n> <command...>
//
// The password reaches ipmitool only through its environment (IPMI_PASSWORD, -E), never its argv
// (ps shows that); stdin is /dev/null, so a missing password fails at once instead of prompting.
// Cipher suite 0 is refused (a BMC then takes any password); -C is always given (without it
// ipmitool first asks for the suites, which some BMCs never answer: 10 s a call). ipmitool says
// the same line when the BMC is unreachable and when it refused the password, and exits 0 when
// the BMC rejected a boot device: each is told apart here, by timing and by parsing its output.
// Every failure is an IpmiError: DRIVER_ERROR (the BMC's side, or no BMC) or INVALID_ARGUMENT
// (ours); no message holds the password.
import { spawn, type ChildProcess } from "node:child_process";
import { Duplex } from "node:stream";
import { IPMI_CIPHER_SUITES, MAX_IPMI_PASSWORD_BYTES, MAX_IPMI_USER_BYTES, parseIpmiAddress } from "./binding.ts";

export type IpmiErrorCode = "DRIVER_ERROR" | "INVALID_ARGUMENT";

export class IpmiError extends Error {
  readonly code: IpmiErrorCode;
  constructor(code: IpmiErrorCode, message: string) {
    super(message);
    this.name = "IpmiError";
    this.code = code;
  }
}

export interface IpmiCredential {
  /** host[:port] (UDP 623 by default), or [v6]:port. */
  address: string;
  username: string;
  password: string;
  /** The RMCP+ cipher suite (-C); default 3, what most BMCs answer; newer ones want 17. Never 0. */
  cipherSuite?: number;
}

export interface IpmitoolOptions {
  /** -N: seconds ipmitool waits for an answer before it sends again (default 1). */
  retransmitSeconds?: number;
  /** -R: how many times it sends again, 1-10 (default 2). A BMC that never answers fails after about N·R·(R+1) s. */
  retries?: number;
  /** Kills a call that has not finished after this long (default that budget + 10 s). */
  timeoutMs?: number;
  /** How long power on and off wait for the BMC to report the new state (default 30 s; 0: no wait). */
  powerWaitMs?: number;
  /** The ipmitool program (default "ipmitool" on PATH). */
  binary?: string;
}

export type PowerState = "on" | "off";
export const POWER_ACTIONS = ["on", "off", "soft", "cycle", "reset"] as const;
export type PowerAction = (typeof POWER_ACTIONS)[number];
export const BOOT_DEVICES = ["pxe", "disk", "cdrom"] as const;
export type BootDevice = (typeof BOOT_DEVICES)[number];

export interface Sensor {
  name: string;
  /** The number of a reading like "40 degrees C"; null for a discrete state ("0x01") or none ("no reading"). */
  value: number | null;
  unit: string | null;
  /** ipmitool's status column: ok, ns (no reading), nc/cr/nr (non-critical, critical, non-recoverable)... */
  status: string;
  /** The reading as ipmitool printed it. */
  reading: string;
}

export interface FruDevice {
  id: number | null;
  description: string;
  /** "Product Name", "Product Serial", "Board Mfg"...: as ipmitool prints them. */
  fields: Record<string, string>;
}

/** What a run of ipmitool gave. */
interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

const MAX_OUTPUT = 1 << 20;
const SOL_BANNER = /\[SOL Session operational\.[^\]\n]*\]\r?\n?/;
const bytes = (s: string) => Buffer.byteLength(s, "utf8");
const invalid = (message: string) => new IpmiError("INVALID_ARGUMENT", message);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A word for `sh -c`, quoted. */
const shellWord = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

export class IpmiClient {
  /** host:port, for messages. */
  readonly address: string;
  readonly cipherSuite: number;
  readonly #host: string;
  readonly #port: number;
  readonly #username: string;
  readonly #password: string;
  readonly #n: number;
  readonly #r: number;
  readonly #timeoutMs: number;
  readonly #powerWaitMs: number;
  readonly #binary: string;

  constructor(bmc: IpmiCredential, options: IpmitoolOptions = {}) {
    const parsed = parseIpmiAddress(bmc.address);
    if (!parsed.ok) throw invalid(`the IPMI address ${parsed.problem}`);
    const fits = (v: unknown, max: number) => typeof v === "string" && v.length > 0 && !v.includes("\0") && bytes(v) <= max;
    if (!fits(bmc.username, MAX_IPMI_USER_BYTES)) throw invalid(`the IPMI user name must be 1-${MAX_IPMI_USER_BYTES} bytes`);
    // An empty password would make ipmitool prompt for one.
    if (!fits(bmc.password, MAX_IPMI_PASSWORD_BYTES)) throw invalid(`the IPMI password must be 1-${MAX_IPMI_PASSWORD_BYTES} bytes`);
    const suite = bmc.cipherSuite ?? 3;
    if (!(IPMI_CIPHER_SUITES as readonly number[]).includes(suite))
      throw invalid(`cipher suite ${suite} is not one of ${IPMI_CIPHER_SUITES.join(", ")} (0 is refused: the BMC would take any password)`);
    const n = options.retransmitSeconds ?? 1;
    const r = options.retries ?? 2;
    if (!(Number.isInteger(n) && n >= 1 && n <= 30)) throw invalid("retransmitSeconds must be an integer 1-30");
    // ipmitool takes -R 0 for its own default (4: about 20 s per unanswered call).
    if (!(Number.isInteger(r) && r >= 1 && r <= 10)) throw invalid("retries must be an integer 1-10");
    this.#host = parsed.host;
    this.#port = parsed.port;
    this.address = `${parsed.host.includes(":") ? `[${parsed.host}]` : parsed.host}:${parsed.port}`;
    this.cipherSuite = suite;
    this.#username = bmc.username;
    this.#password = bmc.password;
    this.#n = n;
    this.#r = r;
    this.#timeoutMs = options.timeoutMs ?? (n * r * (r + 1) + 10) * 1000;
    this.#powerWaitMs = options.powerWaitMs ?? 30_000;
    this.#binary = options.binary ?? "ipmitool";
  }

  // ------------------------------------------------------------ chassis

  async powerStatus(): Promise<PowerState> {
    const out = await this.run(["chassis", "power", "status"]);
    const m = /Chassis Power is (on|off)/i.exec(out);
    if (!m) throw this.#fail(`answered the power status with ${JSON.stringify(out.trim().slice(0, 200))}`);
    return m[1]!.toLowerCase() as PowerState;
  }

  /**
   * on / off (waited until the BMC reports it); cycle: off then on, each waited (as Ironic does:
   * a BMC's own `power cycle` turns the power back on later, behind the caller's next step), so a
   * machine that is off is just powered on; reset: a hard reset; soft: the ACPI power button (the
   * OS decides; not waited).
   */
  async power(action: PowerAction): Promise<{ previous: PowerState; powerState: PowerState }> {
    if (!POWER_ACTIONS.includes(action)) throw invalid(`unknown power action ${JSON.stringify(action)}`);
    const previous = await this.powerStatus();
    const turn = async (to: PowerState) => {
      await this.run(["chassis", "power", to]);
      return this.#waitForPower(to);
    };
    if (action === "on") return { previous, powerState: previous === "on" ? previous : await turn("on") };
    if (action === "off") return { previous, powerState: previous === "off" ? previous : await turn("off") };
    if (action === "cycle") {
      if (previous === "on") await turn("off");
      return { previous, powerState: await turn("on") };
    }
    await this.run(["chassis", "power", action]);
    return { previous, powerState: previous };
  }

  /**
   * The device the machine boots from next (once) or from now on (persistent). The BMC may keep
   * a persistent one for the next boot only (ipmi_sim does; nothing reads back which), so a caller
   * that needs it every time sets it before every boot.
   */
  async setBootDevice(device: BootDevice, options: { persistent?: boolean } = {}): Promise<{ device: BootDevice; persistent: boolean }> {
    if (!BOOT_DEVICES.includes(device)) throw invalid(`unknown boot device ${JSON.stringify(device)} (one of ${BOOT_DEVICES.join(", ")})`);
    const persistent = options.persistent === true;
    const ran = await this.#exec(["chassis", "bootdev", device, ...(persistent ? ["options=persistent"] : [])]);
    const said = `${ran.stdout}\n${ran.stderr}`;
    // ipmitool exits 0 when the BMC refused the boot flags: "Set Chassis Boot Parameter 5 failed: ...".
    if (ran.code !== 0 || /failed|error/i.test(said) || !said.includes(`Set Boot Device to ${device}`))
      throw this.#failed(ran, `refused boot device ${device}`);
    return { device, persistent };
  }

  // ------------------------------------------------------------ inventory

  /** The sensors (`sdr list`): name, reading, status. */
  async sensors(): Promise<Sensor[]> {
    return parseSdrList(await this.run(["sdr", "list"]));
  }

  /** The FRU inventory (`fru print`): each device's fields. */
  async fru(): Promise<FruDevice[]> {
    // A BMC with a FRU device it cannot read exits 1 after printing the others.
    const ran = await this.#exec(["fru", "print"]);
    const devices = parseFruPrint(ran.stdout);
    if (devices.length === 0) throw this.#failed(ran, "answered no FRU data");
    return devices;
  }

  /** The BMC's identity (`mc info`): "Manufacturer Name", "Firmware Revision", "IPMI Version"... */
  async mcInfo(): Promise<Record<string, string>> {
    return parseKeyValues(await this.run(["mc", "info"]));
  }

  // ------------------------------------------------------------ serial over LAN

  /**
   * A serial-over-LAN session: the machine's console bytes to read, keystrokes to write. ipmitool
   * needs a terminal for it, so it runs under util-linux `script` (a pty). A stale session (one
   * per BMC) is deactivated first, and again at close. A line typed starting with `~.` ends it
   * (ipmitool's escape).
   */
  async sol(options: { readyTimeoutMs?: number } = {}): Promise<SolSession> {
    await this.#exec(["sol", "deactivate"]).then((ran) => {
      if (ran.code !== 0 && /Unable to establish/i.test(ran.stderr)) throw this.#failed(ran, "refused serial over LAN");
    });
    const command = ["exec", ...[this.#binary, ...this.#args(), "sol", "activate"].map(shellWord)].join(" ");
    const child = spawn("script", ["--quiet", "--flush", "--return", "--echo", "never", "--command", command, "/dev/null"], {
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...this.#env(), SHELL: "/bin/sh", TERM: "dumb" },
      detached: true, // its own group: close() ends script, the shell and ipmitool together
    });
    const session = new SolSession(child, () => this.#exec(["sol", "deactivate"]).then(() => undefined));
    try {
      await session.ready(options.readyTimeoutMs ?? this.#timeoutMs);
    } catch (e) {
      await session.close();
      throw e instanceof IpmiError ? e : this.#fail(`serial over LAN did not start: ${this.#scrub((e as Error).message)}`);
    }
    return session;
  }

  // ------------------------------------------------------------ running ipmitool

  /** Runs an ipmitool command; its stdout, or a DRIVER_ERROR when it exits non-zero. */
  async run(command: string[]): Promise<string> {
    const ran = await this.#exec(command);
    if (ran.code !== 0) throw this.#failed(ran, `failed ipmitool ${command.join(" ")}`);
    return ran.stdout;
  }

  #args(): string[] {
    const session = ["-I", "lanplus", "-H", this.#host, "-p", String(this.#port), "-U", this.#username, "-E"];
    return [...session, "-C", String(this.cipherSuite), "-N", String(this.#n), "-R", String(this.#r)];
  }

  /** Only what ipmitool needs: nothing else of this process's environment goes with the password. */
  #env(): NodeJS.ProcessEnv {
    return { PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL: "C", IPMI_PASSWORD: this.#password };
  }

  #exec(command: string[]): Promise<Ran> {
    const started = Date.now();
    return new Promise((resolve, reject) => {
      let child: ChildProcess;
      try {
        child = spawn(this.#binary, [...this.#args(), ...command], { stdio: ["ignore", "pipe", "pipe"], env: this.#env() });
      } catch (e) {
        return reject(this.#fail(`could not run ipmitool: ${(e as Error).message}`));
      }
      let stdout = "";
      let stderr = "";
      child.stdout!.setEncoding("utf8").on("data", (d: string) => stdout.length < MAX_OUTPUT && (stdout += d));
      child.stderr!.setEncoding("utf8").on("data", (d: string) => stderr.length < MAX_OUTPUT && (stderr += d));
      const timer = setTimeout(() => child.kill("SIGKILL"), this.#timeoutMs);
      child.once("error", (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        reject(
          this.#fail(
            e.code === "ENOENT"
              ? `${this.#binary} is not installed (Debian: apt-get install ipmitool)`
              : `could not run ipmitool: ${e.message}`,
          ),
        );
      });
      child.once("close", (code, signal) => {
        clearTimeout(timer);
        const ms = Date.now() - started;
        if (signal === "SIGKILL") return reject(this.#fail(`unreachable (no answer within ${(ms / 1000).toFixed(1)} s)`));
        resolve({ code, stdout, stderr, ms });
      });
    });
  }

  /**
   * Why a run failed. No session: ipmitool says the same when nothing answered and when the BMC
   * refused the password; an answer within the first retransmit interval means the BMC answered.
   */
  #failed(ran: Ran, what: string): IpmiError {
    const said = this.#scrub(`${ran.stderr}\n${ran.stdout}`)
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l && !/^Close Session command failed/.test(l));
    if (said.some((l) => /Unable to establish IPMI v2 \/ RMCP\+ session/i.test(l))) {
      const suite = said.find((l) => /authentication algorithm|integrity algorithm|confidentiality algorithm|cipher suite/i.test(l));
      if (suite) return this.#fail(`refused cipher suite ${this.cipherSuite} (${suite.replace(/^.*:\s*/, "")})`);
      if (ran.ms < this.#n * 1000) return this.#fail("refused the session: authentication failed (wrong user name or password)");
      return this.#fail(`unreachable (no answer within ${(ran.ms / 1000).toFixed(1)} s)`);
    }
    return this.#fail(`${what}: ${said.slice(0, 3).join("; ").slice(0, 300) || `ipmitool exited ${ran.code}`}`);
  }

  #fail(message: string): IpmiError {
    return new IpmiError("DRIVER_ERROR", `BMC ${this.address} ${this.#scrub(message)}`);
  }

  /** The password out of anything quoted (no BMC should echo it, but a message must never carry it). */
  #scrub(text: string): string {
    return text.split(this.#password).join("***");
  }

  async #waitForPower(want: PowerState): Promise<PowerState> {
    const deadline = Date.now() + this.#powerWaitMs;
    for (;;) {
      const now = await this.powerStatus();
      if (now === want || this.#powerWaitMs === 0) return now;
      if (Date.now() > deadline) throw this.#fail(`still reports power ${now} ${this.#powerWaitMs / 1000} s after power ${want}`);
      await sleep(500);
    }
  }
}

/**
 * A serial-over-LAN session as a stream: reading gives the console's bytes (ipmitool's banner
 * taken out), writing types. It ends when the session does; close() ends it and waits.
 */
export class SolSession extends Duplex {
  readonly #child: ChildProcess;
  readonly #deactivate: () => Promise<void>;
  #started = false;
  #early = "";
  #exited: Promise<void>;
  #closing: Promise<void> | undefined;

  constructor(child: ChildProcess, deactivate: () => Promise<void>) {
    super();
    this.#child = child;
    this.#deactivate = deactivate;
    this.#exited = new Promise((resolve) => {
      child.once("close", () => resolve());
      child.once("error", (e) => ((this.#early += `could not run script (util-linux): ${e.message}`), resolve()));
    });
    child.stdin!.on("error", () => {}); // gone: the keystrokes are lost
    child.stdout!.on("data", (d: Buffer) => {
      if (this.#started) return void this.push(d);
      // Until ipmitool says the session is up, what it prints is its own (or why it failed).
      this.#early += d.toString("latin1");
      const banner = SOL_BANNER.exec(this.#early);
      if (!banner) return;
      this.#started = true;
      this.emit("started");
      const rest = this.#early.slice(banner.index + banner[0].length);
      if (rest) this.push(Buffer.from(rest, "latin1"));
    });
    child.stderr!.on("data", (d: Buffer) => this.#started || (this.#early += d.toString("latin1")));
    void this.#exited.then(() => this.push(null));
  }

  /** @internal Resolves once ipmitool says the session is operational; rejects with what it said instead. */
  ready(timeoutMs: number): Promise<void> {
    if (this.#started) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no SOL session within ${timeoutMs / 1000} s: ${this.#said()}`)), timeoutMs);
      this.once("started", () => (clearTimeout(timer), resolve()));
      void this.#exited.then(() => {
        clearTimeout(timer);
        reject(new Error(this.#said() || "ipmitool exited"));
      });
    });
  }

  #said(): string {
    return this.#early.replace(/\r/g, "").trim().split("\n").slice(-3).join("; ").slice(0, 300);
  }

  override _read(): void {}

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    if (!this.#child.stdin!.writable) return done();
    this.#child.stdin!.write(chunk, () => done());
  }

  /** Ends ipmitool (and script) and deactivates the session at the BMC; safe to call twice. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const pid = this.#child.pid;
      if (pid !== undefined && this.#child.exitCode === null && this.#child.signalCode === null) {
        try {
          process.kill(-pid, "SIGTERM");
        } catch {
          // gone
        }
        const killer = setTimeout(() => {
          try {
            process.kill(-pid, "SIGKILL");
          } catch {
            // gone
          }
        }, 2_000);
        await this.#exited;
        clearTimeout(killer);
      }
      await this.#deactivate().catch(() => {});
      this.push(null);
    })();
    return this.#closing;
  }

  override _destroy(error: Error | null, done: (error?: Error | null) => void): void {
    void this.close().then(() => done(error));
  }
}

// ------------------------------------------------------------ parsing ipmitool's output

/** `sdr list`: "MB Temp          | 40 degrees C      | ok" per sensor. */
export function parseSdrList(out: string): Sensor[] {
  const sensors: Sensor[] = [];
  for (const line of out.split("\n")) {
    const cols = line.split("|").map((c) => c.trim());
    if (cols.length < 3 || !cols[0]) continue;
    const [name, reading, status] = cols as [string, string, string];
    const m = /^(-?\d+(?:\.\d+)?)\s+(.+)$/.exec(reading);
    sensors.push({ name, value: m ? Number(m[1]) : null, unit: m ? m[2]! : null, status, reading });
  }
  return sensors;
}

/** `fru print`: a "FRU Device Description : <name> (ID n)" line, then " Key : Value" lines, per device. */
export function parseFruPrint(out: string): FruDevice[] {
  const devices: FruDevice[] = [];
  for (const line of out.split("\n")) {
    const kv = /^\s*([^:]+?)\s+:\s?(.*)$/.exec(line);
    if (!kv) continue;
    const [key, value] = [kv[1]!, kv[2]!.trim()];
    if (key === "FRU Device Description") {
      const id = /\(ID (\d+)\)\s*$/.exec(value);
      devices.push({ id: id ? Number(id[1]) : null, description: value.replace(/\s*\(ID \d+\)\s*$/, ""), fields: {} });
    } else if (devices.length > 0) devices.at(-1)!.fields[key] = value;
  }
  return devices;
}

/** The machine's identity in FRU data: the product area's, else the board's. */
export function fruIdentity(devices: FruDevice[]): { manufacturer?: string; product?: string; serial?: string } {
  const f = devices[0]?.fields ?? {};
  const pick = (...keys: string[]) => keys.map((k) => f[k]).find((v) => v !== undefined && v !== "");
  const out: { manufacturer?: string; product?: string; serial?: string } = {};
  const manufacturer = pick("Product Manufacturer", "Board Mfg");
  const product = pick("Product Name", "Board Product");
  const serial = pick("Product Serial", "Board Serial", "Chassis Serial");
  if (manufacturer) out.manufacturer = manufacturer;
  if (product) out.product = product;
  if (serial) out.serial = serial;
  return out;
}

/** "Key : Value" lines (`mc info`); indented lines without one add to the key before them, comma-separated. */
export function parseKeyValues(out: string): Record<string, string> {
  const fields: Record<string, string> = {};
  let last: string | undefined;
  for (const line of out.split("\n")) {
    const kv = /^([^:\s][^:]*?)\s+:\s?(.*)$/.exec(line);
    if (kv) {
      last = kv[1]!;
      fields[last] = kv[2]!.trim();
    } else if (last && line.trim()) fields[last] = [fields[last], line.trim()].filter(Boolean).join(", ");
  }
  return fields;
}
