// bcx-ipmi: the IPMI BMC driver as a bcx plugin (docs/bcx.md), hosted by a site agent's bcd and
// driven by the metal lifecycle exactly as Redfish is: each metal.bmc.* command is one operation
// here, its first argument the binding (the password's value in it, from the command's secrets:
// never in argv or a log), and `console` is the machine's serial-over-LAN. It drives the BMC with
// Debian's ipmitool over IPMI 2.0 (lanplus): ipmitool.ts.
//
// npm run build:bcd bundles it into one file that ships beside bcd (/usr/lib/bcd/plugins/bcx-ipmi.mjs),
// for an operator to pin in bcd's [plugins] (docs/drivers.md).
import { serveDriver, DriverError } from "better-compute/driver-sdk";
import { IPMI_DRIVER, IPMI_PLUGIN_VERSION } from "./binding.ts";
import { fruIdentity, IpmiClient, POWER_ACTIONS, type BootDevice, type IpmiCredential, type PowerAction } from "./ipmitool.ts";

interface Binding extends IpmiCredential {
  /** The provisioning NICs' MACs (the BMC does not report them; the binding carries them). */
  macs?: string[];
}

const client = (binding: Binding) => {
  const b = binding as Partial<Record<keyof Binding, unknown>> | null;
  if (
    typeof b !== "object" ||
    b === null ||
    typeof b.address !== "string" ||
    typeof b.username !== "string" ||
    typeof b.password !== "string"
  )
    throw new DriverError("INVALID_ARGUMENT", "the first argument must be the BMC binding: address, username and password");
  return new IpmiClient(binding);
};
/** The metal steps' names for boot devices, as ipmitool's. */
const BOOT_DEVICES: Record<string, BootDevice> = { pxe: "pxe", disk: "disk", cd: "cdrom" };
const shownPower = (p: "on" | "off") => (p === "on" ? "On" : "Off");

/**
 * The System GUID (Get System GUID, App 0x37): the machine's SMBIOS UUID, which the ramdisk reports
 * and is matched by. Read raw and shown in the bytes' order, as ipmi_sim and the BMCs that copy the
 * SMBIOS bytes answer it (ipmitool's `mc guid` would reverse them); all zeros means none.
 */
async function systemUuid(bmc: IpmiClient): Promise<string | undefined> {
  const out = await bmc.run(["raw", "0x06", "0x37"]).catch(() => "");
  const hex = out.replace(/\s+/g, "");
  if (!/^[0-9a-fA-F]{32}$/.test(hex) || /^0+$/.test(hex)) return undefined;
  const h = hex.toLowerCase();
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

serveDriver({
  id: IPMI_DRIVER,
  version: IPMI_PLUGIN_VERSION,
  kinds: ["power", "management"],
  operations: {
    /** What metal.recordInventory records: the UUID, maker, model and serial (FRU), the binding's MACs, the power state. */
    async inspect(binding: Binding) {
      const bmc = client(binding);
      const [power, fru, uuid, sensors, mc] = await Promise.all([
        bmc.powerStatus(),
        bmc.fru().catch(() => []),
        systemUuid(bmc),
        bmc.sensors().catch(() => []),
        bmc.mcInfo().catch((): Record<string, string> => ({})),
      ]);
      const identity = fruIdentity(fru);
      return {
        ...(uuid ? { uuid } : {}),
        ...(identity.manufacturer ? { manufacturer: identity.manufacturer } : {}),
        ...(identity.product ? { model: identity.product } : {}),
        ...(identity.serial ? { serialNumber: identity.serial } : {}),
        powerState: shownPower(power),
        macs: (binding.macs ?? []).map((m) => m.toLowerCase()),
        addresses: [],
        ...(mc["Firmware Revision"] ? { bmcFirmwareVersion: mc["Firmware Revision"] } : {}),
        sensors,
      };
    },
    async "power.status"(binding: Binding) {
      return { powerState: shownPower(await client(binding).powerStatus()) };
    },
    /** on, off, cycle (each waited for: what the metal lifecycle sends); soft (the ACPI button) and reset, for driver.invoke. */
    async "power.set"(binding: Binding, action: unknown) {
      if (!(POWER_ACTIONS as readonly unknown[]).includes(action))
        throw new DriverError("INVALID_ARGUMENT", `power action must be one of ${POWER_ACTIONS.join(", ")}, not ${JSON.stringify(action)}`);
      const { previous, powerState } = await client(binding).power(action as PowerAction);
      return { previous: shownPower(previous), powerState: shownPower(powerState) };
    },
    async "boot.set"(binding: Binding, device: unknown, once: unknown) {
      const bootDevice = BOOT_DEVICES[String(device)];
      if (!bootDevice) throw new DriverError("INVALID_ARGUMENT", `boot device must be pxe, disk or cd, not ${JSON.stringify(device)}`);
      const set = await client(binding).setBootDevice(bootDevice, { persistent: once === false });
      return { target: device, once: !set.persistent };
    },
  },
  streams: {
    /** The machine's serial console over SOL: its bytes out, keystrokes in, until the host closes it. */
    async console(args, io) {
      const sol = await client(args[0] as Binding).sol();
      io.onInput((bytes) => sol.write(bytes));
      sol.on("data", (bytes: Buffer) => io.write(bytes));
      await new Promise<void>((resolve) => {
        io.signal.addEventListener("abort", () => resolve(), { once: true });
        sol.once("end", () => resolve());
      });
      await sol.close();
    },
  },
});
