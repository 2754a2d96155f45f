// The machines the site agent expects to network-boot, and what each boots: the provisioning
// ramdisk (with the single-use token it joins with) or its own disk. Kept in a file of the
// agent's state directory (root's alone), so a restart of the agent loses no machine in the middle
// of its boot. DHCP answers only the MACs listed here; each machine's iPXE script lives at a URL
// with a random name, made when the machine is listed.
import { randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { writeAtomic } from "../../file-state.ts";

export type BootAction = "ramdisk" | "disk";

export interface NetbootMachine {
  machine: string;
  /** Lower-case, colon-separated. */
  macs: string[];
  action: BootAction;
  /** The name of its iPXE script (/boot/<script>.ipxe): 32 random bytes, base64url. */
  script: string;
  /** The ramdisk's join token (action ramdisk): single-use and short-lived, minted for this boot. */
  token?: string;
  updatedAt: string;
}

const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;

/** A MAC as the registry keeps it: lower case, colons. */
export function normalMac(mac: string): string | undefined {
  const m = mac.trim().toLowerCase().replaceAll("-", ":");
  return MAC.test(m) ? m : undefined;
}

export class MachineRegistry {
  readonly #file: string;
  #machines = new Map<string, NetbootMachine>();

  constructor(stateDir: string) {
    this.#file = path.join(stateDir, "machines.json");
  }

  async load(): Promise<void> {
    await fs.mkdir(path.dirname(this.#file), { recursive: true, mode: 0o700 });
    const text = await fs.readFile(this.#file, "utf8").catch((e: NodeJS.ErrnoException) => {
      if (e.code === "ENOENT") return "[]";
      throw e;
    });
    this.#machines = new Map((JSON.parse(text) as NetbootMachine[]).map((m) => [m.machine, m]));
  }

  all(): NetbootMachine[] {
    return [...this.#machines.values()];
  }

  byScript(script: string): NetbootMachine | undefined {
    return this.all().find((m) => m.script === script);
  }

  byMac(mac: string): NetbootMachine | undefined {
    const wanted = normalMac(mac);
    return this.all().find((m) => wanted !== undefined && m.macs.includes(wanted));
  }

  /**
   * Lists the machine with what it boots next. Its script keeps its name while only the token
   * changes, so a machine mid-boot is not sent to a name that no longer exists; a MAC another
   * machine had moves to this one.
   */
  async set(entry: { machine: string; macs: string[]; action: BootAction; token?: string }): Promise<NetbootMachine> {
    const previous = this.#machines.get(entry.machine);
    for (const other of this.all()) {
      if (other.machine !== entry.machine && other.macs.some((m) => entry.macs.includes(m))) {
        this.#machines.set(other.machine, { ...other, macs: other.macs.filter((m) => !entry.macs.includes(m)) });
      }
    }
    const machine: NetbootMachine = {
      machine: entry.machine,
      macs: entry.macs,
      action: entry.action,
      script: previous?.script ?? randomBytes(32).toString("base64url"),
      ...(entry.token !== undefined ? { token: entry.token } : {}),
      updatedAt: new Date().toISOString(),
    };
    this.#machines.set(entry.machine, machine);
    await this.#save();
    return machine;
  }

  async remove(machine: string): Promise<boolean> {
    const had = this.#machines.delete(machine);
    if (had) await this.#save();
    return had;
  }

  #save(): Promise<void> {
    return writeAtomic(this.#file, JSON.stringify(this.all(), null, 2) + "\n");
  }
}
