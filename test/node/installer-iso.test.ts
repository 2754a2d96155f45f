// The installer ISO (agent/build/installer-iso.ts, docs/ramdisk.md "bc.mode=install"): the
// per-machine window's cpio (plugins/metal/installer-iso.ts) read back by cpio itself, `bcd install`
// on simulated disks, and then the real thing: a QEMU q35 SeaBIOS machine under TCG boots a
// per-machine ISO from its virtual CD, installs the OS image from a loopback HTTP server onto its
// NVMe disk and reboots; the disk file is read from outside. The first run builds the images (minutes).
import { execFile, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { zstdCompressSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { main as bcd } from "../../agent/bcd.ts";
import { buildInstallerIso, MACHINE_IMAGE_BYTES as BUILD_WINDOW, type InstallerIso } from "../../agent/build/installer-iso.ts";
import { install } from "../../agent/roles/install.ts";
import { mbrEntry, mbrEntryOffset, readMbr } from "../../agent/roles/mbr.ts";
import { hostTscKhz } from "../../agent/runtimes/microvm/helpers.ts";
import {
  INSTALL_CONFIG_PATH,
  installConfigImage,
  machineImage,
  MACHINE_IMAGE_BYTES,
  newcCpio,
  type InstallConfig,
} from "../../plugins/metal/installer-iso.ts";
import { buildForEmulatedSite, type EmulatedSiteBuilds } from "../../testing/emulated-site.ts";
import { LOOPBACK_GUEST_ADDRESS, startQemuMachine, type QemuMachine } from "../../testing/qemu-machine.ts";
import { simulatedDisks } from "../../testing/sim-disks.ts";

const exec = promisify(execFile);
const MiB = 2 ** 20;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-installer-iso-"));
const TOKEN = `bcj_${"5eed1e55".repeat(2)}_${"Inst4ller-token_never-on-the-console".padEnd(43, "z")}`;
const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const bytes = (s: string) => new TextEncoder().encode(s);

afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** The archive unpacked by GNU cpio into a new directory. */
function unpack(archive: Uint8Array): string {
  const dir = fs.mkdtempSync(path.join(tmp, "cpio-"));
  const r = spawnSync("cpio", ["-idm", "--quiet", "--no-absolute-filenames"], { cwd: dir, input: archive });
  if (r.status !== 0) throw new Error(`cpio -i failed: ${r.stderr}`);
  return dir;
}

describe("the machine image (a newc cpio in a 64 KiB window)", () => {
  const files = [
    { path: INSTALL_CONFIG_PATH, data: bytes('{"hello":"world"}'), mode: 0o600 },
    { path: "etc/bc/nested/deeper.txt", data: bytes("odd length: 17 b\n") },
    { path: "/top", data: new Uint8Array([0, 1, 2, 255]) },
    { path: "empty", data: new Uint8Array() },
  ];

  it("is a cpio archive cpio -i unpacks into the same files, modes and parent directories", () => {
    for (const archive of [newcCpio(files), machineImage(files)]) {
      const dir = unpack(archive);
      expect(fs.readFileSync(path.join(dir, "etc/bc-install.json"), "utf8")).toBe('{"hello":"world"}');
      expect(fs.statSync(path.join(dir, "etc/bc-install.json")).mode & 0o7777).toBe(0o600);
      expect(fs.readFileSync(path.join(dir, "etc/bc/nested/deeper.txt"), "utf8")).toBe("odd length: 17 b\n");
      expect(fs.statSync(path.join(dir, "etc/bc/nested/deeper.txt")).mode & 0o7777).toBe(0o644);
      expect([...fs.readFileSync(path.join(dir, "top"))]).toEqual([0, 1, 2, 255]);
      expect(fs.readFileSync(path.join(dir, "empty")).length).toBe(0);
      expect(fs.statSync(path.join(dir, "etc/bc/nested")).isDirectory()).toBe(true);
      const listed = spawnSync("cpio", ["-t", "--quiet"], { input: archive }).stdout.toString().trim().split("\n");
      expect(listed).toEqual(["etc", INSTALL_CONFIG_PATH, "etc/bc", "etc/bc/nested", "etc/bc/nested/deeper.txt", "top", "empty"]);
    }
  });

  it("aligns every header and file to 4 bytes and ends with TRAILER!!!", () => {
    const archive = newcCpio(files);
    expect(archive.length % 4).toBe(0);
    const text = new TextDecoder("latin1").decode(archive);
    for (let at = text.indexOf("070701"); at >= 0; at = text.indexOf("070701", at + 1)) expect(at % 4).toBe(0);
    expect(text).toContain("TRAILER!!!\0");
  });

  it("is exactly 64 KiB, zeros after the cpio, the size the build reserves; too many bytes are refused", () => {
    const image = machineImage(files);
    const cpio = newcCpio(files);
    expect(image.length).toBe(MACHINE_IMAGE_BYTES);
    expect(BUILD_WINDOW).toBe(MACHINE_IMAGE_BYTES);
    expect(image.subarray(0, cpio.length)).toEqual(cpio);
    expect(image.subarray(cpio.length).every((b) => b === 0)).toBe(true);
    expect(() => machineImage([{ path: "big", data: new Uint8Array(MACHINE_IMAGE_BYTES) }])).toThrow(
      /more than the ISO's 65536-byte window/,
    );
    expect(() => newcCpio([{ path: "etc/../x", data: new Uint8Array() }])).toThrow(/not a plain relative path/);
  });

  it("holds an install config at etc/bc-install.json, mode 600", () => {
    const config: InstallConfig = { url: "https://cp.example", token: TOKEN, hostname: "h", image: { url: "http://i/x", sha256: "0" } };
    const dir = unpack(installConfigImage(config));
    expect(JSON.parse(fs.readFileSync(path.join(dir, INSTALL_CONFIG_PATH), "utf8"))).toEqual(config);
    expect(fs.statSync(path.join(dir, INSTALL_CONFIG_PATH)).mode & 0o7777).toBe(0o600);
  });
});

/** 1 MiB of pseudo-random bytes behind an MBR with one partition. */
function mbrImage(): Uint8Array {
  const img = new Uint8Array(MiB).map((_, i) => (i * 7919) % 251);
  img.fill(0, 446, 510);
  img.set(mbrEntry(0x83, 1, MiB / 512 - 1), mbrEntryOffset(0));
  img.set([0x55, 0xaa], 510);
  return img;
}

describe("bcd install on simulated disks", () => {
  const image = zstdCompressSync(mbrImage());
  const config = {
    url: "https://cp.example.com",
    token: TOKEN,
    hostname: "inst-sim",
    image: { url: "http://cache.example/os.img.zst?sig=secret", sha256: sha256(image) },
  } satisfies InstallConfig;
  const configFile = (content: string) => {
    const file = path.join(fs.mkdtempSync(path.join(tmp, "config-")), "bc-install.json");
    fs.writeFileSync(file, content);
    return file;
  };
  const setup = () => {
    const disks = simulatedDisks([
      { device: "/dev/nvme0n1", sizeBytes: 64 * MiB },
      { device: "/dev/nvme1n1", sizeBytes: 64 * MiB },
    ]);
    const printed: string[] = [];
    const fetched: string[] = [];
    const opts = {
      disks,
      productUuid: "5f0c2a7e-91b3-4c1d-8e2f-3a4b5c6d7e01",
      print: (l: string) => void printed.push(l),
      fetch: async (url: string) => (fetched.push(url), new Response(image)),
    };
    return { disks, printed, fetched, opts };
  };

  it("writes the image onto the first disk with a config drive holding the token, hostname and URL; prints phases, never the token", async () => {
    const { disks, printed, fetched, opts } = setup();
    const result = await install(configFile(JSON.stringify(config)), opts);
    expect(fetched).toEqual([config.image.url]);
    const disk = disks.disks.get("/dev/nvme0n1")!;
    expect(disk.sha256).toBe(sha256(mbrImage()));
    expect(disks.disks.get("/dev/nvme1n1")!.data).toBeNull();
    expect(result).toMatchObject({ device: "/dev/nvme0n1", format: "zstd", sha256: config.image.sha256, written: { bytes: MiB } });
    const meta = JSON.parse(disk.configDrive!["openstack/latest/meta_data.json"]!);
    expect(meta).toEqual({
      uuid: opts.productUuid,
      hostname: "inst-sim",
      name: "inst-sim",
      meta: { "bc.url": config.url, "bc.token": TOKEN },
    });
    expect(printed).toHaveLength(4);
    expect(printed.at(-1)).toContain(`installed /dev/nvme0n1: ${image.length} bytes fetched (zstd, sha256 ${config.image.sha256})`);
    expect(printed.join("\n")).not.toContain(TOKEN);
    expect(printed.join("\n")).not.toContain("sig=secret");
  });

  it("refuses a config that is not JSON or not a config before touching a disk; a wrong digest fails; no message holds the token", async () => {
    const { disks, opts } = setup();
    const broken = JSON.stringify(config).slice(0, -3);
    const notJson = await install(configFile(broken), opts).catch((x: Error) => x);
    expect(notJson).toMatchObject({ code: "INVALID_ARGUMENT", message: expect.stringMatching(/is not JSON$/) });
    const noToken = { ...config, token: 7 };
    const e = await install(configFile(JSON.stringify(noToken)), opts).catch((x: Error) => x);
    expect(e).toMatchObject({ code: "INVALID_ARGUMENT", message: expect.stringContaining("token:") });
    expect(disks.disks.get("/dev/nvme0n1")!.data).toBeNull();
    const wrong = { ...config, image: { ...config.image, sha256: "0".repeat(64) } };
    const mismatch = await install(configFile(JSON.stringify(wrong)), opts).catch((x: Error) => x);
    expect(mismatch).toMatchObject({ code: "DRIVER_ERROR", message: expect.stringContaining("image digest mismatch") });
    for (const err of [notJson, e, mismatch]) expect(String((err as Error).message)).not.toContain(TOKEN);
    expect(disks.disks.get("/dev/nvme0n1")!.configDrive).toBeNull();
  });

  it("is a usage error (exit 2) without --config", async () => {
    expect(await bcd(["install"])).toBe(2);
    expect(await bcd(["install", "--config", "a", "extra"])).toBe(2);
  });
});

// ---------------------------------------------------------------------------------------------

const missing = [
  ...(process.getuid?.() === 0 ? [] : ["root"]),
  ...["qemu-system-x86_64", "genisoimage", "isoinfo", "mtype"].filter((t) => spawnSync("sh", ["-c", `command -v ${t}`]).status !== 0),
];
if (missing.length > 0) console.warn(`installer-iso: the boot is skipped: missing ${missing.join(", ")}`);

/** sha256 of the disk's first `n` bytes with the config drive's partition entry (the second) zeroed: the raw image's, if it is there. */
function imageOnDisk(file: string, n: number): string {
  const data = head(file, n);
  data.fill(0, mbrEntryOffset(1), mbrEntryOffset(1) + 16);
  return sha256(data);
}

function head(file: string, n: number, from = 0): Buffer {
  const buf = Buffer.alloc(n);
  const fd = fs.openSync(file, "r");
  fs.readSync(fd, buf, 0, n, from);
  fs.closeSync(fd);
  return buf;
}

describe.skipIf(missing.length > 0)("a machine booted from its installer ISO", () => {
  let builds: EmulatedSiteBuilds;
  let installer: InstallerIso;
  let images: Server;
  let imagePort: number;
  let machine: QemuMachine | undefined;

  beforeAll(async () => {
    const started = Date.now();
    builds = await buildForEmulatedSite((line) => console.log(line));
    const tsc = await hostTscKhz();
    installer = await buildInstallerIso({
      ramdisk: builds.ramdisk,
      log: (line) => console.log(line),
      ...(tsc ? { cmdline: `tsc_early_khz=${tsc}` } : {}),
    });
    console.log(
      `installer ISO ${(installer.manifest.iso.bytes / MiB).toFixed(1)} MiB; builds ready in ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
    images = createServer((req, res) => {
      if (req.url !== "/os.img.zst") return void res.writeHead(404).end();
      res.writeHead(200, { "content-length": builds.os.manifest.zstd.bytes });
      fs.createReadStream(builds.os.zstd).pipe(res);
    });
    await new Promise<void>((resolve) => images.listen(0, "127.0.0.1", resolve));
    imagePort = (images.address() as AddressInfo).port;
  }, 1_200_000);

  /** The machine boots the ISO from its virtual CD (a Once override, as a BMC's virtual media boot); answers when it was powered on. */
  async function bootFromCd(m: QemuMachine, iso: string): Promise<number> {
    await m.insertMedia(iso);
    await m.setBootOverride("Cd", "Once");
    const poweredOn = Date.now();
    await m.powerOn();
    return poweredOn;
  }

  /** A per-machine ISO: the installer ISO with the config's machine image in its window. */
  function machineIso(name: string, config: InstallConfig): string {
    const iso = path.join(tmp, `${name}.iso`);
    fs.copyFileSync(installer.iso, iso);
    const fd = fs.openSync(iso, "r+");
    fs.writeSync(fd, installConfigImage(config), 0, installer.manifest.machineImage.bytes, installer.manifest.machineImage.offset);
    fs.closeSync(fd);
    return iso;
  }

  afterAll(async () => {
    await machine?.stop();
    images?.closeAllConnections();
    await new Promise((resolve) => (images ? images.close(resolve) : resolve(undefined)));
  }, 60_000);

  it("installs the OS image onto its NVMe disk with a config drive holding its token, then reboots", async () => {
    // The control plane's URL: a port nobody listens on (the installed system's join is not this test's).
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const controlPlane = `http://10.0.2.2:${(closed.address() as AddressInfo).port}`;
    await new Promise((resolve) => closed.close(resolve));

    // The window is zeros in the built ISO; the machine's ISO has its config there.
    const window = installer.manifest.machineImage;
    expect(window.bytes).toBe(MACHINE_IMAGE_BYTES);
    expect(head(installer.iso, window.bytes, window.offset).every((b) => b === 0)).toBe(true);
    const config: InstallConfig = {
      url: controlPlane,
      token: TOKEN,
      hostname: "inst-1",
      image: { url: `http://${LOOPBACK_GUEST_ADDRESS}:${imagePort}/os.img.zst`, sha256: builds.os.manifest.zstd.sha256 },
    };
    const iso = machineIso("inst-1", config);
    const { stdout: inIso } = await exec("isoinfo", ["-i", iso, "-R", "-x", "/bc/machine.img"], { encoding: "buffer" });
    expect(Buffer.compare(inIso, Buffer.from(installConfigImage(config)))).toBe(0);

    const disk = path.join(tmp, "inst-1.disk");
    fs.writeFileSync(disk, "");
    fs.truncateSync(disk, 256 * MiB);
    const uuid = "5f0c2a7e-91b3-4c1d-8e2f-3a4b5c6d7e11";
    machine = await startQemuMachine({
      name: "inst-1",
      firmware: "bios",
      accel: "tcg",
      memoryMiB: 1024,
      uuid,
      nics: [{ mac: "52:54:00:5a:01:01", loopbackPorts: [imagePort] }],
      disks: [{ serial: "INST-0001", file: disk }],
      log: (line) => console.log(line),
    });
    const m = machine;
    const deadline = 10 * 60_000;
    const reset = m.nextEvent("RESET", deadline);
    const poweredOn = await bootFromCd(m, iso);
    const installing = m.console.waitFor("bcd install: ", { timeoutMs: deadline }).then(
      () => (Date.now() - poweredOn) / 1000,
      () => undefined,
    );
    await Promise.race([
      reset,
      m.console.waitFor(/bc-ramdisk: (the install failed|.*bcd is not started)/, { timeoutMs: deadline }).then(() => {
        throw new Error(`the install did not complete; console:\n${m.console.text.slice(-4000)}`);
      }),
    ]);
    const seconds = (Date.now() - poweredOn) / 1000;
    // Stopped before the firmware boots anything else, so the disk is as the install left it.
    await m.forceOff();
    const consoleText = m.console.text;
    console.log(`installer ISO: power-on → bcd install started ${(await installing)?.toFixed(1)} s, → rebooting ${seconds.toFixed(1)} s`);
    console.log(
      consoleText
        .split("\n")
        .filter((l) => /bcd install:|bc-ramdisk:/.test(l))
        .join("\n"),
    );

    expect(consoleText).toContain("bcd install: installed /dev/nvme0n1:");
    expect(consoleText).toContain("bc-ramdisk: installed: rebooting");
    expect(consoleText).not.toContain(TOKEN);

    const raw = builds.os.manifest.raw;
    expect(imageOnDisk(disk, raw.bytes), "the raw OS image on the disk").toBe(raw.sha256);
    const table = readMbr(head(disk, 512));
    if ("problem" in table) throw new Error(table.problem);
    const drive = table.partitions.find((p) => p.index === 1);
    expect(drive).toEqual({ index: 1, type: 0x0c, start: (192 * MiB) / 512, sectors: (64 * MiB) / 512 });
    const at = `${disk}@@${drive!.start * 512}`;
    expect((await exec("mlabel", ["-i", at, "-s", "::"])).stdout).toContain("config-2");
    const meta = JSON.parse((await exec("mtype", ["-i", at, "::/openstack/latest/meta_data.json"])).stdout);
    expect(meta).toEqual({ uuid, hostname: "inst-1", name: "inst-1", meta: { "bc.url": controlPlane, "bc.token": TOKEN } });
  }, 900_000);

  it("waits, never rebooting, when its window is empty (the ISO as built) or the install fails; the disk is left as it was", async () => {
    const m = machine!;
    const disk = m.disks[0]!.file;
    const before = sha256(head(disk, builds.os.manifest.raw.bytes));
    const cases = [
      { iso: installer.iso, says: "bc-ramdisk: no /etc/bc-install.json: this ISO holds no machine's install config" },
      {
        iso: machineIso("inst-404", {
          url: "http://10.0.2.2:9",
          token: TOKEN,
          hostname: "inst-2",
          image: { url: `http://${LOOPBACK_GUEST_ADDRESS}:${imagePort}/missing.img`, sha256: "0".repeat(64) },
        }),
        says: "bc-ramdisk: the install failed (above)",
        error: `bcd: install failed: DRIVER_ERROR: the image http://${LOOPBACK_GUEST_ADDRESS}:${imagePort}/missing.img answered 404`,
      },
    ];
    for (const c of cases) {
      const from = m.console.length;
      const poweredOn = await bootFromCd(m, c.iso);
      await m.console.waitFor(c.says, { from, timeoutMs: 5 * 60_000 });
      await new Promise((r) => setTimeout(r, 2_000));
      expect(m.events.filter((e) => e.event === "RESET" && e.at >= poweredOn)).toEqual([]);
      expect(await m.powerState()).toBe("On");
      if (c.error) expect(m.console.text.slice(from)).toContain(c.error);
      await m.forceOff();
    }
    expect(sha256(head(disk, builds.os.manifest.raw.bytes))).toBe(before);
    expect(m.console.text).not.toContain(TOKEN);
  }, 900_000);
});
