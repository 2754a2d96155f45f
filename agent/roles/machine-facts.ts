// What a Linux machine says about itself, from /proc and /sys: its DMI identity (the product UUID
// the provisioned attestor and metal match it by, its serial), CPUs, memory and NICs. The
// ramdisk's inventory reports them; the provisioned attestor's evidence carries the UUID.
// Node-only, Linux only.
import fs from "node:fs/promises";
import path from "node:path";

export interface MachineFacts {
  /** DMI product serial (the system's serial number), when set. */
  serial: string | null;
  manufacturer: string | null;
  model: string | null;
  cpus: { count: number; model: string | null };
  /** Memory as the kernel sees it (MemTotal). */
  memoryBytes: number;
  nics: { name: string; mac: string; link: "up" | "down" }[];
}

export interface MachineFactsOptions {
  /** Where sysfs and procfs are mounted (a test's fake trees). */
  sys?: string;
  proc?: string;
}

/** A sysfs attribute's text, trimmed (NVMe pads serials with spaces); undefined when absent, unreadable or empty. */
export async function sysText(file: string): Promise<string | undefined> {
  const text = await fs.readFile(file, "utf8").then(
    (t) => t.trim(),
    () => "",
  );
  return text || undefined;
}

/**
 * The machine's DMI product UUID, lower-case (SMBIOS UUIDs compare case-insensitively), or
 * undefined: no DMI, not root (the file is root's alone), or a UUID the firmware left unset
 * (all zeros, or all ones).
 */
export async function readProductUuid(sys = "/sys"): Promise<string | undefined> {
  const uuid = (await sysText(path.join(sys, "class", "dmi", "id", "product_uuid")))?.toLowerCase();
  if (!uuid || !/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(uuid)) return undefined;
  const digits = uuid.replaceAll("-", "");
  return /^0+$/.test(digits) || /^f+$/.test(digits) ? undefined : uuid;
}

/** What the inventory reports beyond the disks. */
export async function machineFacts(opts: MachineFactsOptions = {}): Promise<MachineFacts> {
  const sys = opts.sys ?? "/sys";
  const proc = opts.proc ?? "/proc";
  const dmi = (name: string) => sysText(path.join(sys, "class", "dmi", "id", name)).then((v) => v ?? null);
  const cpuinfo = await fs.readFile(path.join(proc, "cpuinfo"), "utf8").catch(() => "");
  const meminfo = await fs.readFile(path.join(proc, "meminfo"), "utf8").catch(() => "");
  return {
    serial: await dmi("product_serial"),
    manufacturer: await dmi("sys_vendor"),
    model: await dmi("product_name"),
    cpus: {
      count: cpuinfo.match(/^processor\s*:/gm)?.length ?? 0,
      model: /^model name\s*:\s*(.+)$/m.exec(cpuinfo)?.[1]?.trim() ?? null,
    },
    memoryBytes: Number(/^MemTotal:\s*(\d+) kB$/m.exec(meminfo)?.[1] ?? 0) * 1024,
    nics: await ethernetNics(sys),
  };
}

/** Ethernet interfaces (type 1; not lo, not tunnels), by name. */
async function ethernetNics(sys: string): Promise<MachineFacts["nics"]> {
  const dir = path.join(sys, "class", "net");
  const nics: MachineFacts["nics"] = [];
  for (const name of (await fs.readdir(dir).catch(() => [] as string[])).sort()) {
    if ((await sysText(path.join(dir, name, "type"))) !== "1") continue;
    const mac = (await sysText(path.join(dir, name, "address"))) ?? "";
    const link = (await sysText(path.join(dir, name, "operstate"))) === "up" ? "up" : "down";
    nics.push({ name, mac, link });
  }
  return nics;
}
