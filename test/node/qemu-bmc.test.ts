// A real machine behind the Redfish emulator: a QEMU q35 guest (testing/qemu-machine.ts) that the
// site agent's unchanged Redfish client (agent/roles/redfish.ts) powers, boots and gives virtual
// media to, as the site role does, and whose firmware really does what the BMC was asked: QMP's
// run state follows the power actions; the serial console shows which device booted (a boot
// sector and GRUB of test/support/boot-images.ts print markers; iPXE prints its net0), so a Once
// override is seen spent after one boot and a Continuous one seen kept; an ISO given as an http
// URL is downloaded by the emulator and boots from the virtual CD. BIOS (SeaBIOS, in a network
// namespace this test makes, on a tap) and UEFI (OVMF, user-mode networking with no route out but
// to this test's loopback server, whose iPXE script a PXE boot fetches).
// Boots are seconds each under TCG: each firmware boots only as often as the checks need.
import { execFileSync, spawnSync } from "node:child_process";
import { createReadStream, existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RedfishClient } from "../../agent/roles/redfish.ts";
import {
  LOOPBACK_GUEST_ADDRESS,
  OVMF_CODE,
  OVMF_VARS,
  startQemuMachine,
  type QemuMachine,
  type QemuMachineOptions,
} from "../../testing/qemu-machine.ts";
import { startRedfishEmulator, type MachineOptions, type RedfishEmulator } from "../../testing/redfish-emulator.ts";
import { bootedLine, findGrubEfi, missingTools, powerButtonLine, writeBootDisk, writeBootIso } from "../support/boot-images.ts";

const USER = "admin";
const PASS = "qemu-bmc-Pa55word";
const BOOT_TIMEOUT = 120_000;
const hasQemu = spawnSync("qemu-system-x86_64", ["--version"]).status === 0;
const grubDir = findGrubEfi();
const biosMissing = [...(hasQemu ? [] : ["qemu-system-x86"]), ...missingTools(false)];
const uefiMissing = [
  ...biosMissing,
  ...(existsSync(OVMF_CODE) && existsSync(OVMF_VARS) ? [] : ["ovmf"]),
  ...(grubDir ? [] : ["grub-efi-amd64-bin (unpacked, see test/support/boot-images.ts)"]),
  ...missingTools(true).filter((t) => !biosMissing.includes(t)),
];
if (biosMissing.length > 0) console.warn(`qemu-bmc: BIOS and UEFI machines skipped: missing ${biosMissing.join(", ")}`);
else if (uefiMissing.length > 0) console.warn(`qemu-bmc: the UEFI machine is skipped: missing ${uefiMissing.join(", ")}`);
const canNetns = (() => {
  try {
    execFileSync("ip", ["netns", "list"], { stdio: "pipe" });
    return process.getuid?.() === 0;
  } catch {
    return false;
  }
})();

const tag = Math.random().toString(16).slice(2, 6); // netns names are host-wide
const work = mkdtempSync(path.join(tmpdir(), "bc-qemu-bmc-"));
const iso = path.join(work, "test.iso");
let images: Server | undefined;
let isoUrl = "";
let imagesPort = 0;
/** Each machine's start line (the accelerator and why), then what each boot took (the action → its marker on the console), printed at the end. */
const machineLines: string[] = [];
const timings: string[] = [];

beforeAll(async () => {
  if (biosMissing.length > 0) return;
  writeBootIso(iso, { marker: "BC-BIOS-CD", uefiMarker: "BC-UEFI-CD", ...(uefiMissing.length === 0 ? { grubDir } : {}) });
  // The image server an operator's InsertMedia names, and the iPXE script a PXE boot fetches; on loopback.
  images = createServer((req, res) => {
    if (req.url === "/boot.ipxe") return void res.writeHead(200).end(`#!ipxe\necho ${bootedLine("BC-PXE")}\nsleep 600\n`);
    if (req.url !== "/images/test.iso") return void res.writeHead(404).end();
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": statSync(iso).size });
    createReadStream(iso).pipe(res);
  });
  await new Promise<void>((resolve) => images!.listen(0, "127.0.0.1", resolve));
  imagesPort = (images.address() as AddressInfo).port;
  isoUrl = `http://127.0.0.1:${imagesPort}/images/test.iso`;
});

afterAll(async () => {
  if (timings.length > 0) console.log(`${machineLines.join("\n")}\nqemu-bmc boots: ${timings.join("; ")}`);
  await new Promise<void>((resolve) => (images ? images.close(() => resolve()) : resolve()));
  rmSync(work, { recursive: true, force: true });
});

/** The console without colours, cursor moves and backspaced spinners. */
const plain = (text: string) => text.replace(/\x1b\[[0-9;=?]*[A-Za-z]/g, "").replace(/[^\n]\x08/g, "");

/**
 * Runs `action` and waits for `line` on the console after it; answers the console from the
 * action to the line (what the firmware did first) and how long it took.
 */
async function boot(q: QemuMachine, what: string, action: () => Promise<unknown>, line: string): Promise<string> {
  const from = q.console.length;
  const started = Date.now();
  await action();
  const found = await q.console.waitFor(line, { from, timeoutMs: BOOT_TIMEOUT });
  timings.push(`${q.firmware} ${what} ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return plain(q.console.text.slice(from, found.index));
}

/** One machine, its emulator and the client the site role would make for it. */
async function bmcOver(machine: QemuMachineOptions, options: Omit<MachineOptions, "qemu">) {
  const q = await startQemuMachine({ memoryMiB: 256, log: (line) => machineLines.push(line), ...machine });
  try {
    const emu = await startRedfishEmulator({ machines: [{ ...options, qemu: q }], username: USER, password: PASS });
    const address = `${emu.url}/redfish/v1/Systems/${options.id}`;
    const client = new RedfishClient({ address, username: USER, password: PASS }, { powerWait: { intervalMs: 200 } });
    return { q, emu, client, address };
  } catch (e) {
    await q.stop();
    throw e;
  }
}

async function redfish(emu: RedfishEmulator, method: string, path: string, body?: unknown) {
  const res = await fetch(emu.url + path, {
    method,
    headers: {
      authorization: `Basic ${Buffer.from(`${USER}:${PASS}`).toString("base64")}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as any) : undefined };
}

/** A Reset the site agent's client does not send (it only turns power on and off), straight to the emulator. */
async function reset(emu: RedfishEmulator, address: string, type: string): Promise<void> {
  const res = await redfish(emu, "POST", `${new URL(address).pathname}/Actions/ComputerSystem.Reset`, { ResetType: type });
  expect(res.status, JSON.stringify(res.json)).toBe(204);
}

/** GracefulShutdown: the ACPI power button, which the booted media acts on (it says so); QMP tells the guest shut down. */
async function gracefulShutdown({ q, emu, address }: Awaited<ReturnType<typeof bmcOver>>, marker: string): Promise<void> {
  const from = q.console.length;
  const [shutdown, stopped] = [q.nextEvent("SHUTDOWN"), q.nextEvent("STOP")];
  await reset(emu, address, "GracefulShutdown");
  await q.console.waitFor(powerButtonLine(marker), { from, timeoutMs: 30_000 });
  expect((await shutdown).data).toEqual({ guest: true, reason: "guest-shutdown" });
  await stopped; // -no-shutdown: QEMU stays, the machine stopped
  expect(await q.status()).toBe("shutdown");
}

describe.skipIf(biosMissing.length > 0)("a BIOS machine (SeaBIOS) behind the emulator, virtual media under its System", () => {
  const MAC = "52:54:00:bc:01:01";
  const netns = `bc-qbmc-${tag}`;
  let m: Awaited<ReturnType<typeof bmcOver>>;
  let diskBytes = 0;

  beforeAll(async () => {
    const disk = path.join(work, "bios-disk.img");
    diskBytes = writeBootDisk(disk, { marker: "BC-BIOS-HDD" });
    // Its NIC on a tap in a namespace of its own when this host allows it: nothing it sends leaves it.
    const net = canNetns ? { tap: "tap0" } : {};
    if (canNetns) {
      execFileSync("ip", ["netns", "add", netns]);
      execFileSync("ip", ["-n", netns, "tuntap", "add", "dev", "tap0", "mode", "tap"]);
      execFileSync("ip", ["-n", netns, "link", "set", "tap0", "up"]);
    }
    m = await bmcOver(
      {
        firmware: "bios",
        nics: [{ mac: MAC, ...net }],
        disks: [{ serial: "BC-NVME-0001", file: disk }],
        smbios: { manufacturer: "Better Compute", product: "QEMU q35 (BIOS)", serial: "BC-BIOS-0001" },
        defaultBootOrder: ["Hdd", "Pxe", "Cd"], // a deployed server: its disk first
        ...(canNetns ? { prefix: ["ip", "netns", "exec", netns] } : {}),
      },
      { id: "bios-1", virtualMedia: "System" },
    );
  }, 60_000);

  afterAll(async () => {
    await m?.emu.stop();
    await m?.q.stop();
    if (canNetns) spawnSync("ip", ["netns", "del", netns]);
  });

  it("serves the machine's UUID, serial, NIC, disk, CPU and memory in the tree, powered off", async () => {
    const { q, emu, client } = m;
    expect(await q.status()).toBe("prelaunch");
    // Its log line names the accelerator and why (TCG where KVM does not work, as on these machines).
    expect(machineLines.find((l) => l.startsWith(`qemu machine ${q.name}:`))).toMatch(/: (TCG|KVM) \(.+\), SeaBIOS, 256 MiB/);
    if (canNetns) expect(execFileSync("ip", ["netns", "pids", netns], { encoding: "utf8" }).split("\n")).toContain(String(q.pid));
    expect(await client.inspect()).toEqual({
      systemId: "bios-1",
      uuid: q.uuid,
      manufacturer: "Better Compute",
      model: "QEMU q35 (BIOS)",
      serialNumber: "BC-BIOS-0001",
      powerState: "Off",
      biosVersion: "SeaBIOS",
      bmcFirmwareVersion: "SIM-BMC-2.0.0",
      bootTarget: "None",
      bootEnabled: "Disabled",
      processors: { count: 1, model: expect.stringMatching(/^QEMU (TCG|KVM) CPU$/), threads: 1 },
      memoryGiB: 0.25,
      media: { inserted: false, image: null },
      storage: { drives: 1, volumes: [] },
      addresses: [],
      macs: [MAC.toLowerCase()],
    });
    const nic = await redfish(emu, "GET", "/redfish/v1/Systems/bios-1/EthernetInterfaces/NIC.1");
    expect(nic.json).toMatchObject({ MACAddress: MAC.toUpperCase(), PermanentMACAddress: MAC.toUpperCase() });
    const drive = await redfish(emu, "GET", "/redfish/v1/Systems/bios-1/Storage/NVMe.1/Drives/Disk.NVMe.0");
    expect(drive.json).toMatchObject({ SerialNumber: "BC-NVME-0001", CapacityBytes: diskBytes, Protocol: "NVMe" });
    const system = (await redfish(emu, "GET", "/redfish/v1/Systems/bios-1")).json;
    expect(system).toMatchObject({
      ProcessorSummary: { Count: 1 },
      MemorySummary: { TotalSystemMemoryGiB: 0.25 },
      Boot: { BootSourceOverrideMode: "Legacy" },
      VirtualMedia: { "@odata.id": "/redfish/v1/Systems/bios-1/VirtualMedia" },
    });
    expect((await redfish(emu, "GET", "/redfish/v1/Systems/bios-1/Memory/DIMM.0")).json.CapacityMiB).toBe(256);
    expect((await redfish(emu, "GET", "/redfish/v1/Chassis/bios-1")).json).toMatchObject({
      SerialNumber: "BC-BIOS-0001",
      PowerState: "Off",
    });
  });

  it("Pxe Once: iPXE starts on net0; the boot after it is the default order again (the disk)", { timeout: 4 * BOOT_TIMEOUT }, async () => {
    const { q, emu, client, address } = m;
    expect(await client.setBootDevice("pxe", true)).toEqual({ target: "Pxe", enabled: "Once" });
    const first = await boot(q, "Pxe (power on)", () => client.setPower("on"), `net0: ${MAC}`);
    expect(first).toContain("Booting from ROM");
    expect(await q.status()).toBe("running");
    // Spent by the boot it applied to, as real BMCs do.
    expect(await client.inspect()).toMatchObject({ powerState: "On", bootTarget: "None", bootEnabled: "Disabled" });

    const next = await boot(q, "Hdd (default, ForceRestart)", () => reset(emu, address, "ForceRestart"), bootedLine("BC-BIOS-HDD"));
    expect(next).toContain("Booting from Hard Disk");
    expect(next).not.toContain("iPXE initialising devices");
    expect(await q.status()).toBe("running");
  });

  it(
    "Cd Continuous with an ISO inserted over http: every boot is the CD's; GracefulShutdown and GracefulRestart reach the guest",
    { timeout: 6 * BOOT_TIMEOUT },
    async () => {
      const { q, emu, client, address } = m;
      expect(await client.insertMedia(isoUrl)).toEqual({ image: isoUrl, inserted: true });
      // Under the System: the client found it there, and the emulator fetched the image into the CD.
      expect(
        emu.requests.filter((r) => r.method === "POST" && r.path.includes("VirtualMedia")).map((r) => `${r.path} ${r.status}`),
      ).toEqual(["/redfish/v1/Systems/bios-1/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia 204"]);
      expect(q.media).not.toBeNull();
      expect(statSync(q.media!).size).toBe(statSync(iso).size);
      expect(await client.setBootDevice("cd", false)).toEqual({ target: "Cd", enabled: "Continuous" });

      const cycled = await boot(q, "Cd (power cycle)", () => client.setPower("cycle"), bootedLine("BC-BIOS-CD"));
      expect(cycled).toContain("Booting from DVD/CD");

      await gracefulShutdown(m, "BC-BIOS-CD");
      expect((await client.inspect()).powerState).toBe("Off");

      await boot(q, "Cd again (power on)", () => client.setPower("on"), bootedLine("BC-BIOS-CD"));
      const restarted = await boot(q, "Cd (GracefulRestart)", () => reset(emu, address, "GracefulRestart"), bootedLine("BC-BIOS-CD"));
      expect(restarted).toContain(powerButtonLine("BC-BIOS-CD"));
      expect(await client.inspect()).toMatchObject({ powerState: "On", bootTarget: "Cd", bootEnabled: "Continuous" });

      expect(await client.ejectMedia()).toEqual({ ejected: true });
      expect(q.media).toBeNull();
      expect(await client.setPower("off")).toEqual({ powerState: "Off", previous: "On" });
      expect(await q.status()).toBe("prelaunch");
      expect(emu.machines.get("bios-1")!.log.map((e) => e.message)).toEqual([
        "Boot override set: BootSourceOverrideTarget Pxe, BootSourceOverrideEnabled Once",
        "ComputerSystem.Reset On",
        "ComputerSystem.Reset ForceRestart",
        `VirtualMedia.InsertMedia ${isoUrl}`,
        "Boot override set: BootSourceOverrideTarget Cd, BootSourceOverrideEnabled Continuous",
        "ComputerSystem.Reset ForceOff",
        "ComputerSystem.Reset On",
        "ComputerSystem.Reset GracefulShutdown",
        "ComputerSystem.Reset On",
        "ComputerSystem.Reset GracefulRestart",
        "VirtualMedia.EjectMedia",
        "ComputerSystem.Reset ForceOff",
      ]);
    },
  );
});

describe.skipIf(uefiMissing.length > 0)("a UEFI machine (OVMF) behind the emulator, virtual media under its Manager", () => {
  const MAC = "52:54:00:bc:02:01";
  let m: Awaited<ReturnType<typeof bmcOver>>;

  beforeAll(async () => {
    const disk = path.join(work, "uefi-disk.img");
    writeBootDisk(disk, { marker: "BC-UEFI-HDD-BIOS", uefiMarker: "BC-UEFI-HDD", grubDir });
    m = await bmcOver(
      {
        firmware: "uefi",
        // User-mode networking, restricted: nothing leaves; its DHCP hands iPXE a script on the loopback server, all it reaches.
        nics: [{ mac: MAC, loopbackPorts: [imagesPort], bootFile: `http://${LOOPBACK_GUEST_ADDRESS}:${imagesPort}/boot.ipxe` }],
        disks: [{ serial: "BC-NVME-0002", file: disk }],
        smbios: { manufacturer: "Better Compute", product: "QEMU q35 (UEFI)", serial: "BC-UEFI-0001" },
      },
      { id: "uefi-1", virtualMedia: "Manager" },
    );
  }, 60_000);

  afterAll(async () => {
    await m?.emu.stop();
    await m?.q.stop();
  });

  it(
    "Hdd Once boots the disk's GRUB; the boot after it is the default order again (iPXE on net0 fetches its script over http)",
    { timeout: 4 * BOOT_TIMEOUT },
    async () => {
      const { q, emu, client, address } = m;
      expect((await client.inspect()).uuid).toBe(q.uuid);
      expect(await client.setBootDevice("disk", true)).toEqual({ target: "Hdd", enabled: "Once" });
      const first = await boot(q, "Hdd (power on)", () => client.setPower("on"), bootedLine("BC-UEFI-HDD"));
      expect(first).toMatch(/BdsDxe: loading Boot\w+ "UEFI QEMU NVMe Ctrl BC-NVME-0002/);
      expect(first).not.toContain("iPXE initialising devices");
      expect(await client.inspect()).toMatchObject({ powerState: "On", bootEnabled: "Disabled" });

      const pxe = await boot(q, "Pxe (default, ForceRestart)", () => reset(emu, address, "ForceRestart"), bootedLine("BC-PXE"));
      expect(pxe).toContain(`net0: ${MAC}`);
      expect(pxe).toContain(`http://${LOOPBACK_GUEST_ADDRESS}:${imagesPort}/boot.ipxe... ok`);
      expect(await q.status()).toBe("running");
      // Each boot a cold one: the first process, one for the changed boot order, one for the restart.
      expect(q.launches).toBe(3);
    },
  );

  it(
    "Cd Once with an ISO inserted over http under the Manager boots the CD's GRUB; GracefulShutdown reaches it",
    { timeout: 4 * BOOT_TIMEOUT },
    async () => {
      const { q, emu, client, address } = m;
      await client.insertMedia(isoUrl);
      expect(emu.requests.filter((r) => r.method === "POST" && r.path.includes("VirtualMedia")).map((r) => r.path)).toEqual([
        "/redfish/v1/Managers/uefi-1-bmc/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia",
      ]);
      expect(await client.setBootDevice("cd", true)).toEqual({ target: "Cd", enabled: "Once" });
      const cd = await boot(q, "Cd (power cycle)", () => client.setPower("cycle"), bootedLine("BC-UEFI-CD"));
      expect(cd).toMatch(/BdsDxe: loading Boot\w+ "UEFI QEMU DVD-ROM/);

      await gracefulShutdown(m, "BC-UEFI-CD");
      expect(await client.inspect()).toMatchObject({
        powerState: "Off",
        bootEnabled: "Disabled",
        media: { inserted: true, image: isoUrl },
      });
      expect(await client.ejectMedia()).toEqual({ ejected: true });
      expect(q.media).toBeNull();
    },
  );
});
