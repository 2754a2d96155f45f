// The microVM guest image (agent/runtimes/microvm/image.ts): built from Debian packages, cached
// by the digest of its inputs, and booted once for real (QEMU microvm under TCG, user-mode
// networking with restrict=on: the guest reaches nothing) to check what its init reports.
// The first run downloads the packages (allow minutes); later runs reuse the cached build.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GuestReport } from "../../agent/runtimes/contract.ts";
import { ensureGuestImage, runProgram, type GuestImage, type RunProgram } from "../../agent/runtimes/microvm/image.ts";
import { agentFailure } from "../support/agent-error.ts";

const exec = promisify(execFile);
const MiB = 1024 * 1024;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bc-guest-image-"));
let image: GuestImage;

/** Runs programs for real and records which ran. */
function recordingRunner(inner: RunProgram = runProgram) {
  const calls: string[] = [];
  const run: RunProgram = (file, args, options) => {
    calls.push(path.basename(file) + " " + (args[0] ?? ""));
    return inner(file, args, options);
  };
  return { calls, run };
}

const sha256 = (bytes: Buffer | string) => createHash("sha256").update(bytes).digest("hex");

beforeAll(async () => {
  image = await ensureGuestImage();
}, 600_000);

afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe("the guest image", () => {
  it("FC-IMAGE-ENSURE: a second ensure reuses the complete build, nothing is rebuilt", async () => {
    const { calls, run } = recordingRunner();
    const kernelMtime = fs.statSync(image.kernel).mtimeMs;
    const logs: string[] = [];
    const again = await ensureGuestImage({ run, log: (m) => logs.push(m) });
    expect(again.dir).toBe(image.dir);
    expect(again.manifest.builtAt).toBe(image.manifest.builtAt);
    expect(fs.statSync(again.kernel).mtimeMs).toBe(kernelMtime);
    expect(again.rootfsBytes).toBe(fs.statSync(again.rootfs).size);
    expect(again.rootfsBytes).toBeGreaterThan(0);
    // Only the inputs were looked up: nothing downloaded, extracted or made.
    expect(calls.filter((c) => !/^(apt-cache|dpkg-query) /.test(c))).toEqual([]);
    expect(logs.join("\n")).toMatch(/reused/);
  });

  it("FC-IMAGE-REUSE-STALE: a changed input or a damaged build is built anew, never reused; concurrent builds agree", async () => {
    // A cache of its own (sharing the downloaded .debs), so the main cache keeps only real builds.
    const cacheDir = path.join(tmp, "cache");
    fs.mkdirSync(cacheDir);
    fs.symlinkSync(path.join(path.dirname(image.dir), "debs"), path.join(cacheDir, "debs"));
    const variant = fs.readFileSync(new URL("../../agent/runtimes/microvm/guest/init.sh", import.meta.url), "utf8") + "\n# a variant\n";
    const [a, b] = await Promise.all([
      ensureGuestImage({ cacheDir, initScript: variant }),
      ensureGuestImage({ cacheDir, initScript: variant }),
    ]);
    expect(a.dir).not.toBe(image.dir);
    expect(a.manifest.digest).not.toBe(image.manifest.digest);
    expect(b.dir).toBe(a.dir);
    expect(b.manifest).toEqual(a.manifest);
    expect(sha256(fs.readFileSync(a.initrd))).toBe(a.manifest.initrd.sha256);
    // No half-built directory is left behind, and the original image is untouched.
    expect(fs.readdirSync(cacheDir).sort()).toEqual([a.manifest.digest, "debs"].sort());
    expect(fs.existsSync(path.join(image.dir, "manifest.json"))).toBe(true);

    // A build damaged by hand (a truncated initrd) is not reused: it is built again in its place.
    fs.truncateSync(a.initrd, 1000);
    const rebuilt = await ensureGuestImage({ cacheDir, initScript: variant });
    expect(rebuilt.dir).toBe(a.dir);
    expect(rebuilt.manifest.builtAt).not.toBe(a.manifest.builtAt);
    expect(sha256(fs.readFileSync(rebuilt.initrd))).toBe(rebuilt.manifest.initrd.sha256);
  }, 600_000);

  it("FC-IMAGE-PROVENANCE: the manifest names every package with its .deb sha256, the kernel release and the files' sha256", async () => {
    const m = image.manifest;
    const names = m.packages.map((p) => p.name);
    expect(names).toEqual(expect.arrayContaining([`linux-image-${m.kernelRelease}`, "busybox-static", "dropbear-bin"]));
    for (const p of m.packages) {
      const deb = path.join(path.dirname(image.dir), "debs", `${p.name}_${p.version.replaceAll(":", "%3a")}.deb`);
      expect(sha256(fs.readFileSync(deb)), p.name).toBe(p.debSha256);
      const { stdout } = await exec("dpkg-deb", ["-f", deb, "Package", "Version"]);
      expect(stdout).toBe(`Package: ${p.name}\nVersion: ${p.version}\n`);
    }
    for (const f of [m.kernel, m.initrd, m.rootfs]) expect(sha256(fs.readFileSync(path.join(image.dir, f.file))), f.file).toBe(f.sha256);
    expect(m.kernelFormat).toBe("elf-pvh");
    expect(fs.readFileSync(image.kernel).subarray(0, 4).toString("latin1")).toBe("\x7fELF");
    expect(m.modules.indexOf("kernel/drivers/virtio/virtio_ring.ko")).toBeLessThan(m.modules.indexOf("kernel/drivers/virtio/virtio.ko"));
    expect(Date.parse(m.builtAt)).not.toBeNaN();
  });

  it("FC-PACKAGES-GUARD: a bad package name is INVALID_ARGUMENT before any program runs", async () => {
    const { calls, run } = recordingRunner();
    const e = await agentFailure(ensureGuestImage({ cacheDir: path.join(tmp, "guard"), packages: ["curl; reboot"], run }));
    expect(e.code).toBe("INVALID_ARGUMENT");
    expect(calls).toEqual([]);

    // A name apt answers is validated too before it reaches apt-get download.
    const lying = recordingRunner(async (file) =>
      file === "apt-cache" ? "linux-image-cloud-amd64\n  Depends: linux-image-$(reboot)\n" : "",
    );
    const e2 = await agentFailure(ensureGuestImage({ cacheDir: path.join(tmp, "guard"), run: lying.run }));
    expect(e2.code).toBe("INVALID_ARGUMENT");
    expect(lying.calls).toEqual(["apt-cache depends"]);
    expect(fs.existsSync(path.join(tmp, "guard"))).toBe(false);
  });
});

describe("a booted guest", () => {
  const marker = "user-data-ran-7f3a";
  const userData = [
    "#!/bin/sh",
    "# a tenant's script: it rewrites the resolver, then watches for the init to re-assert it",
    'echo "nameserver 192.0.2.53" > /etc/resolv.conf',
    '(while grep -q 192.0.2.53 /etc/resolv.conf; do usleep 100000; done; echo "resolver-after: $(cat /etc/resolv.conf)") &',
    `echo ${marker}`,
    "",
  ].join("\n");
  const networkConfig = [
    "version: 2",
    "ethernets:",
    "  eth0:",
    "    match:",
    '      macaddress: "06:00:0a:00:02:02"',
    "    addresses: [10.0.2.2/30]",
    "    gateway4: 10.0.2.1",
    "    nameservers:",
    "      addresses: [10.0.2.1]",
    "",
  ].join("\n");
  const guests: ChildProcess[] = [];

  afterAll(() => {
    for (const qemu of guests) if (qemu.exitCode === null && qemu.signalCode === null) qemu.kill("SIGKILL");
  });

  it("reports its identity, user data hash, host keys and disk, runs the script after the report, and powers off on ACPI", async () => {
    const dir = path.join(tmp, "vm");
    // The instance's disk: the rootfs grown by 32 MiB, as the runtime makes it.
    const disk = path.join(dir, "disk.img");
    fs.mkdirSync(dir, { recursive: true });
    fs.copyFileSync(image.rootfs, disk);
    fs.truncateSync(disk, image.rootfsBytes + 32 * MiB);

    const first = await boot(path.join(dir, "boot-1"), disk, { "user-data": userData, "network-config": networkConfig });
    await waitFor(() => first.console().includes("resolver-after:"), 240_000, first.console);
    const text = first.console();
    const report = reportOf(text);
    expect(report.instanceId).toBe("vm-guest-1");
    expect(report.hostname).toBe("vm-guest-1");
    expect(report.userDataSha256).toBe(sha256(userData));
    expect(report.hostKeys.some((k) => /^ssh-ed25519 AAAA[A-Za-z0-9+/=]+$/.test(k))).toBe(true);
    expect(report.hostKeys.some((k) => /^ecdsa-sha2-nistp256 AAAA[A-Za-z0-9+/=]+$/.test(k))).toBe(true);
    expect(report.diskBytes).toBe(image.rootfsBytes + 32 * MiB);
    expect(report.address).toBe("10.0.2.2/30");
    expect(report.mac).toBe("06:00:0a:00:02:02");
    // The script ran after the report, and the resolver was re-asserted once it finished (FC-RESOLVER-GATEWAY).
    expect(text.indexOf(marker)).toBeGreaterThan(text.indexOf("bc-report "));
    expect(/resolver-after: (.*)/.exec(text)?.[1]?.trim()).toBe("nameserver 10.0.2.1");

    // The ACPI power button (what the runtime's graceful stop asks) powers the guest off; QEMU exits 0.
    await qmp(first.qmpSocket, "system_powerdown");
    expect(await first.exited).toBe(0);

    // Booted again from the same disk, it keeps its host keys (known_hosts stays valid), and a
    // script's own `poweroff` ends the VMM cleanly. No network-config: no address reported.
    const again = await boot(path.join(dir, "boot-2"), disk, { "user-data": "#!/bin/sh\npoweroff\n" });
    expect(await again.exited).toBe(0);
    const second = reportOf(again.console());
    expect(second.hostKeys).toEqual(report.hostKeys);
    expect(second.userDataSha256).toBe(sha256("#!/bin/sh\npoweroff\n"));
    expect(second.address).toBeUndefined();
  }, 480_000);

  /** Boots the image on disk with a CIDATA seed made of files (meta-data added), as the runtime does. */
  async function boot(dir: string, disk: string, files: Record<string, string>) {
    fs.mkdirSync(path.join(dir, "seed"), { recursive: true });
    const all = { "meta-data": "instance-id: vm-guest-1\nlocal-hostname: vm-guest-1\n", ...files };
    for (const [name, text] of Object.entries(all)) fs.writeFileSync(path.join(dir, "seed", name), text);
    const seed = path.join(dir, "seed.img");
    await exec("mkfs.vfat", ["-n", "CIDATA", "-C", seed, "1024"]);
    await exec("mcopy", ["-i", seed, ...Object.keys(all).map((f) => path.join(dir, "seed", f)), "::/"]);

    const consoleLog = path.join(dir, "console.log");
    const qmpSocket = path.join(dir, "qmp.sock");
    const mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(fs.readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "2000");
    // prettier-ignore
    const qemu = spawn("qemu-system-x86_64", [
      "-M", "microvm", "-accel", "tcg", "-cpu", "max", "-m", "128M", "-smp", "1",
      "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
      "-kernel", image.kernel, "-initrd", image.initrd,
      "-append", `console=ttyS0 reboot=k panic=-1 quiet tsc_early_khz=${Math.round(mhz * 1000)}`,
      "-serial", `file:${consoleLog}`,
      "-drive", `id=root,file=${disk},format=raw,if=none`, "-device", "virtio-blk-device,drive=root",
      "-drive", `id=seed,file=${seed},format=raw,if=none,readonly=on`, "-device", "virtio-blk-device,drive=seed",
      "-netdev", "user,id=n0,restrict=on,net=10.0.2.0/24,host=10.0.2.1", "-device", "virtio-net-device,netdev=n0,mac=06:00:0a:00:02:02",
      "-qmp", `unix:${qmpSocket},server=on,wait=off`,
    ], { stdio: "ignore" });
    guests.push(qemu);
    const exited = new Promise<number | null>((resolve) => qemu.on("exit", (code) => resolve(code)));
    const console = () => (fs.existsSync(consoleLog) ? fs.readFileSync(consoleLog, "utf8") : "");
    return { exited, console, qmpSocket };
  }
});

/** The one report line a console holds, parsed. */
function reportOf(text: string): GuestReport {
  const lines = text.split("\n").filter((l) => l.startsWith("bc-report "));
  expect(lines, text.slice(-2000)).toHaveLength(1);
  return JSON.parse(lines[0]!.slice("bc-report ".length)) as GuestReport;
}

async function waitFor(ok: () => boolean, timeoutMs: number, detail: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out; console:\n${detail().slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Sends one QMP command (after the capabilities handshake) and resolves on its reply. */
function qmp(socket: string, command: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const conn = net.createConnection(socket);
    let buffered = "";
    let replies = 0;
    conn.on("error", reject);
    conn.on("data", (d) => {
      buffered += d.toString();
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const msg = JSON.parse(buffered.slice(0, nl)) as Record<string, unknown>;
        buffered = buffered.slice(nl + 1);
        if ("QMP" in msg) conn.write(JSON.stringify({ execute: "qmp_capabilities" }) + "\n");
        else if ("error" in msg) reject(new Error(JSON.stringify(msg.error)));
        else if ("return" in msg && ++replies === 1) conn.write(JSON.stringify({ execute: command }) + "\n");
        else if ("return" in msg) {
          conn.end();
          resolve();
        }
      }
    });
  });
}
