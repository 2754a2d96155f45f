// The qemu-microvm runtime: the conformance cases and the firecracker inventory's lessons
// (each test named with its FC id), against real guests booted by QEMU (TCG here), real network
// namespaces and real files. The guest image is built (or reused from its cache) by
// ensureGuestImage. Boots cost seconds of CPU each: the guests of one describe are shared.
import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentError } from "../../agent/contracts.ts";
import { runConformance } from "../../core/conformance/index.ts";
import {
  MicroVmRuntime,
  QemuBackend,
  guestMac,
  parseSize,
  qemuCommand,
  runtimeConformanceCases,
  withUserData,
  type InstanceObserved,
  type InstanceSpec,
  type MicroVmImage,
  type RuntimeSubject,
  type VmmBackend,
  type VmmLaunch,
} from "../../agent/runtimes/index.ts";
import { processesNaming } from "../../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage } from "../../agent/runtimes/microvm/image.ts";
import { netnsExists } from "../../agent/runtimes/microvm/network.ts";

const BOOT_TIMEOUT = 600_000;
const tag = Math.random().toString(16).slice(2, 6); // names unique to this run: netns names are host-wide
const bases: string[] = [];
let image: MicroVmImage;

beforeAll(async () => {
  image = await ensureGuestImage();
}, 900_000);

afterAll(async () => {
  for (const base of bases) {
    // Whatever a failed test left: its VMMs, namespaces and files.
    for (const pid of await processesNaming(base)) process.kill(pid, "SIGKILL");
    for (const ns of execFileSync("ip", ["netns", "list"], { encoding: "utf8" }).split("\n")) {
      const name = ns.split(" ")[0]!;
      if (name.startsWith(`bc-${tag}`)) execFileSync("ip", ["netns", "del", name]);
    }
    rmSync(base, { recursive: true, force: true });
  }
});

function newBase(): string {
  const base = mkdtempSync(path.join(tmpdir(), "bc-rt-"));
  bases.push(base);
  return base;
}

/** The real QEMU backend, counting VMM starts per guest in a file outside the runtime's root. */
function countingBackend(countFile: string, inner: VmmBackend = new QemuBackend({ accel: "tcg" })): VmmBackend {
  return {
    id: inner.id,
    probe: () => inner.probe(),
    start: async (launch: VmmLaunch) => {
      appendFileSync(countFile, `${launch.name}\n`);
      return inner.start(launch);
    },
    requestShutdown: (dir) => inner.requestShutdown(dir),
    attach: (dir) => inner.attach!(dir),
    exitReason: (dir) => inner.exitReason(dir),
  };
}

function starts(countFile: string, name: string): number {
  return existsSync(countFile)
    ? readFileSync(countFile, "utf8")
        .split("\n")
        .filter((l) => l === name).length
    : 0;
}

async function leftovers(root: string, name: string): Promise<string[]> {
  const dir = path.join(root, name);
  const left = (await processesNaming(dir)).map((pid) => `vmm pid ${pid}`);
  if (existsSync(dir)) left.push("work dir");
  if (await netnsExists(`bc-${name}`)) left.push(`netns bc-${name}`);
  return left;
}

let seq = 0;
function spec(name = `${tag}-g${++seq}`, userData = "#!/bin/sh\necho user data ran\n"): InstanceSpec {
  return withUserData(
    { name, desired: "running", vcpus: 1, memory: "128M", disk: "256M", image: "bc-guest", userData: "", userDataSha256: "" },
    userData,
  );
}

const sha256 = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return "ok";
  } catch (e) {
    return e instanceof AgentError ? e.code : String(e);
  }
}

function runtime(root: string, countFile: string, extra: Partial<ConstructorParameters<typeof MicroVmRuntime>[0]> = {}): MicroVmRuntime {
  return new MicroVmRuntime({ root, images: { "bc-guest": image }, backend: countingBackend(countFile), ...extra });
}

describe("runtimeConformanceCases for qemu-microvm", () => {
  it(
    "every case passes",
    async () => {
      const subjects: { runtime: MicroVmRuntime }[] = [];
      const report = await runConformance(
        runtimeConformanceCases(),
        () => {
          const base = newBase();
          const root = path.join(base, "root");
          const countFile = path.join(base, "starts");
          const s: RuntimeSubject & { runtime: MicroVmRuntime } = {
            runtime: runtime(root, countFile),
            async reopen() {
              await s.runtime.close();
              s.runtime = runtime(root, countFile);
              return s.runtime;
            },
            spec: (name) => spec(name),
            starts: async (name) => starts(countFile, name),
            leftovers: (name) => leftovers(root, name),
          };
          subjects.push(s);
          return s;
        },
        {
          dispose: async (s) => {
            for (const g of await s.runtime.list()) await s.runtime.remove(g.name);
            await s.runtime.close();
          },
        },
      );
      expect(report.failed).toEqual([]);
      expect(report.passed).toHaveLength(runtimeConformanceCases().length);
    },
    BOOT_TIMEOUT,
  );
});

describe("refused before anything is allocated", () => {
  const base = newBase();
  const root = path.join(base, "root");
  const countFile = path.join(base, "starts");
  const rt = runtime(root, countFile);
  afterAll(() => rt.close());

  it("FC-USERDATA-REQUIRED: a spec without user data is INVALID_ARGUMENT and no work dir or netns exists", async () => {
    const s = spec();
    for (const bad of [
      { userData: "", userDataSha256: "" },
      { userData: undefined as unknown as string },
      { userDataSha256: sha256("other bytes") },
      { userData: "not base64!" },
    ]) {
      expect(await code(rt.apply({ ...s, ...bad }))).toBe("INVALID_ARGUMENT");
    }
    expect(await leftovers(root, s.name)).toEqual([]);
    expect(starts(countFile, s.name)).toBe(0);
  });

  it("FC-MEM-AND-VCPU: one strict parser for memory; vCPUs an integer from 1; nothing unparseable defaults", async () => {
    expect(parseSize("512M", "memory")).toBe(512);
    expect(parseSize("1G", "memory")).toBe(1024);
    expect(parseSize("1GiB", "memory")).toBe(1024);
    expect(parseSize("2048KiB", "memory")).toBe(2);
    expect(parseSize(" 768 ", "memory")).toBe(768);
    expect(parseSize(256, "memory")).toBe(256);
    expect(parseSize("1t", "memory")).toBe(1024 * 1024);
    for (const bad of ["", "lots", "1.5G", "-1G", "0", "10X", "1 G B", "100K", 0, -5, 1.5, Number.NaN]) {
      expect(() => parseSize(bad, "memory"), String(bad)).toThrow(expect.objectContaining({ code: "INVALID_ARGUMENT" }));
    }
    const s = spec();
    for (const bad of [{ memory: "1.5G" }, { memory: "32M" }, { vcpus: 0 }, { vcpus: "2.5" }, { vcpus: 65 }, { vcpus: "two" }]) {
      expect(await code(rt.apply({ ...s, ...bad } as InstanceSpec)), JSON.stringify(bad)).toBe("INVALID_ARGUMENT");
    }
    expect(await leftovers(root, s.name)).toEqual([]);
  });

  it("FC-DISK-FROM-CONTRACT: the disk is parsed by the same parser; an unparseable one is refused, not left at the image's size", async () => {
    const s = spec();
    for (const disk of ["big", "1.5G", "10X", ""]) expect(await code(rt.apply({ ...s, disk }))).toBe("INVALID_ARGUMENT");
    expect(await leftovers(root, s.name)).toEqual([]);
  });

  it("FC-IMAGE-ROOTFS-SIZE: a disk smaller than the image's root file system is refused", async () => {
    const s = spec();
    const smaller = Math.floor(image.rootfsBytes / (1024 * 1024)) - 1;
    expect(await code(rt.apply({ ...s, disk: `${smaller}M` }))).toBe("INVALID_ARGUMENT");
    expect(await leftovers(root, s.name)).toEqual([]);
    expect(await code(rt.apply({ ...s, image: "no-such-image" }))).toBe("INVALID_ARGUMENT");
  });

  it("FC-GUEST-IS-NOT-GATEWAY: a guest addressed as its gateway is INVALID_CONFIG before any guest exists", () => {
    const make = (network: { guest: string; gateway: string; dns: string[] }) =>
      new MicroVmRuntime({ root, images: {}, backend: countingBackend(countFile), network });
    expect(() => make({ guest: "10.0.2.1/30", gateway: "10.0.2.1", dns: ["10.0.2.1"] })).toThrow(
      expect.objectContaining({ code: "INVALID_CONFIG" }),
    );
    expect(() => make({ guest: "10.0.2.2/30", gateway: "10.0.3.1", dns: [] })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
    expect(() => make({ guest: "10.0.2.2/30", gateway: "10.0.2.1", dns: ["10.0.2.1"] })).not.toThrow();
  });

  it("a name that is not [a-z0-9-] is refused (it becomes a path, a hostname and a netns)", async () => {
    for (const name of ["../etc", "UPPER", "a_b", "-lead", "x".repeat(64)])
      expect(await code(rt.apply({ ...spec(), name }))).toBe("INVALID_ARGUMENT");
  });

  it("the QEMU command: microvm, no defaults, serial appended to the console file, root then the read-only seed, tap with script=no, QMP and the work dir", () => {
    const launch: VmmLaunch = {
      name: "g",
      workDir: "/w/g",
      kernel: "/k",
      initrd: "/i",
      cmdline: "console=ttyS0",
      vcpus: 2,
      memoryMiB: 256,
      drives: [
        { id: "root", path: "/w/g/disk.img", readOnly: false },
        { id: "seed", path: "/w/g/seed.img", readOnly: true },
      ],
      net: { netns: "bc-g", tap: "tap0", mac: guestMac("10.0.2.2") },
      consoleLog: "/w/g/console.log",
      vmmLog: "/w/g/vmm.log",
      accel: "tcg",
    };
    const { argv } = qemuCommand(launch, { qmpSocket: "/w/g/qmp.sock" });
    const arg = (flag: string) => argv.filter((_, i) => argv[i - 1] === flag);
    expect(arg("-M")).toEqual(["microvm"]);
    expect(argv).toEqual(expect.arrayContaining(["-nodefaults", "-no-user-config", "-no-reboot"]));
    expect(arg("-chardev")).toEqual(["file,id=console,path=/w/g/console.log,append=on"]);
    expect(arg("-drive")).toEqual([
      "id=root,file=/w/g/disk.img,format=raw,if=none",
      "id=seed,file=/w/g/seed.img,format=raw,if=none,readonly=on",
    ]);
    expect(arg("-netdev")).toEqual(["tap,id=net0,ifname=tap0,script=no,downscript=no"]);
    expect(arg("-device")).toContain("virtio-net-device,netdev=net0,mac=06:00:0a:00:02:02");
    expect(arg("-qmp")).toEqual(["unix:/w/g/qmp.sock,server=on,wait=off"]);
    expect(arg("-pidfile")).toEqual(["/w/g/vmm.pid"]);
  });
});

describe("booted guests (two at once, the same address plan each in its own namespace)", () => {
  const base = newBase();
  const root = path.join(base, "root");
  const countFile = path.join(base, "starts");
  const logged: string[] = [];
  const log = {
    info: (m: string, f?: Record<string, unknown>) => logged.push(`${m} ${JSON.stringify(f ?? {})}`),
    warn: (m: string, f?: Record<string, unknown>) => logged.push(`${m} ${JSON.stringify(f ?? {})}`),
    error: (m: string, f?: Record<string, unknown>) => logged.push(`${m} ${JSON.stringify(f ?? {})}`),
  };
  const consoleMaxBytes = 8 * 1024;
  let rt: MicroVmRuntime;
  // alpha prints well past the console cap; beta overwrites its resolver, pings its gateway, and
  // prints its resolver in the background, after the init re-asserted it.
  const alphaUserData = [
    "#!/bin/sh",
    "i=0; while [ $i -lt 400 ]; do echo bc-test: console filler line $i ................................................; i=$((i+1)); done",
    "echo bc-test: filler done",
    "",
  ].join("\n");
  const betaUserData = [
    "#!/bin/sh",
    'echo "nameserver 9.9.9.9" > /etc/resolv.conf',
    "ping -c 2 -W 5 10.0.2.1 >/dev/null && echo bc-test: gateway reached",
    "( sleep 2; echo bc-test: resolver $(cat /etc/resolv.conf) ) &",
    "",
  ].join("\n");
  const alpha = spec(`${tag}-alpha`, alphaUserData);
  const beta = { ...spec(`${tag}-beta`, betaUserData), disk: "320M", vcpus: "2", memory: "192MiB" };
  let alphaUp: InstanceObserved;
  let betaUp: InstanceObserved;

  beforeAll(async () => {
    rt = runtime(root, countFile, { consoleMaxBytes, log });
    [alphaUp, betaUp] = await Promise.all([rt.apply(alpha), rt.apply(beta)]);
  }, BOOT_TIMEOUT);
  afterAll(async () => {
    await rt.remove(alpha.name).catch(() => {});
    await rt.remove(beta.name).catch(() => {});
    await rt.close();
  }, 120_000);

  it("FC-GUEST-NAME: one name is the work dir, the instance-id and the hostname", () => {
    expect(alphaUp.state).toBe("running");
    expect(existsSync(path.join(root, alpha.name, "state.json"))).toBe(true);
    expect(alphaUp.report).toMatchObject({ instanceId: alpha.name, hostname: alpha.name });
    const metaData = execFileSync("mtype", ["-i", path.join(root, alpha.name, "seed.img"), "::meta-data"], { encoding: "utf8" });
    expect(metaData).toBe(`instance-id: ${alpha.name}\nlocal-hostname: ${alpha.name}\n`);
  });

  it("FC-GUEST-HOSTKEYS-REPORT / FC-BOOT-RESULT-JSON: the guest's own report carries its SSH host keys", () => {
    for (const up of [alphaUp, betaUp]) {
      expect(up.report!.hostKeys.length).toBeGreaterThan(0);
      for (const key of up.report!.hostKeys) expect(key).toMatch(/^(ssh-ed25519|ecdsa-sha2-nistp256) AAAA[A-Za-z0-9+/=]+$/);
    }
    expect(alphaUp.report!.hostKeys).not.toEqual(betaUp.report!.hostKeys); // created in each guest, never shared
  });

  it("FC-DISK-FROM-CONTRACT / FC-MEM-AND-VCPU: the guest's disk is the spec's size, and the VMM got the parsed vCPUs and memory", async () => {
    expect(alphaUp.report!.diskBytes).toBe(256 * 1024 * 1024);
    expect(betaUp.report!.diskBytes).toBe(320 * 1024 * 1024);
    const [pid] = await processesNaming(path.join(root, beta.name));
    const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    expect(argv[argv.indexOf("-m") + 1]).toBe("192M");
    expect(argv[argv.indexOf("-smp") + 1]).toBe("2");
  });

  it("FC-GUEST-MAC: the guest MAC is 06:00 and its IPv4 address's bytes, and the guest configured it", () => {
    expect(guestMac("10.0.2.2/30")).toBe("06:00:0a:00:02:02");
    expect(guestMac("172.16.0.2")).toBe("06:00:ac:10:00:02");
    expect(alphaUp.report).toMatchObject({ mac: "06:00:0a:00:02:02", address: "10.0.2.2/30" });
  });

  it("FC-NETWORK-RANGE-INDEX: every guest has the same address plan, each inside its own namespace, and reaches its gateway there", async () => {
    expect(betaUp.report!.address).toBe(alphaUp.report!.address);
    for (const g of [alpha, beta]) {
      const addrs = execFileSync("ip", ["-n", `bc-${g.name}`, "-o", "addr", "show", "dev", "tap0"], { encoding: "utf8" });
      expect(addrs).toContain("inet 10.0.2.1/30");
    }
    await waitFor(async () => (await rt.console(beta.name, 64 * 1024)).includes("bc-test: gateway reached"), 30_000);
    // The host side of beta's namespace answered the guest and learnt its MAC from its frames.
    const neigh = execFileSync("ip", ["-n", `bc-${beta.name}`, "neigh", "show", "10.0.2.2"], { encoding: "utf8" });
    expect(neigh).toContain("lladdr 06:00:0a:00:02:02");
    expect(execFileSync("ip", ["netns", "identify", String(process.pid)], { encoding: "utf8" }).trim()).toBe(""); // tests run in the host's namespace
  });

  it("FC-RESOLVER-GATEWAY: the resolver is the gateway, re-asserted after the user data overwrote it", async () => {
    const networkConfig = execFileSync("mtype", ["-i", path.join(root, beta.name, "seed.img"), "::network-config"], { encoding: "utf8" });
    expect(networkConfig).toContain("addresses: [10.0.2.1]");
    const betaConsole = () => rt.console(beta.name, 64 * 1024);
    await waitFor(async () => (await betaConsole()).includes("bc-test: resolver"), 30_000);
    expect(await betaConsole()).toContain("bc-test: resolver nameserver 10.0.2.1");
  });

  it("FC-ENRICH-ONCE: the seed holds the stored bytes verbatim, the guest's sha256 equals the stored one, and neither apply nor adoption rewrites it", async () => {
    const seed = path.join(root, alpha.name, "seed.img");
    const userData = execFileSync("mtype", ["-i", seed, "::user-data"]);
    expect(userData.equals(Buffer.from(alphaUserData))).toBe(true);
    expect(alphaUp.report!.userDataSha256).toBe(alpha.userDataSha256);
    const before = { sha: sha256(readFileSync(seed)), mtime: statSync(seed).mtimeMs };
    await rt.apply(alpha);
    // An agent restart: the new runtime adopts alpha (and beta) and serves the tests below.
    await rt.close();
    rt = runtime(root, countFile, { consoleMaxBytes, log });
    expect((await rt.apply(alpha)).state).toBe("running");
    expect({ sha: sha256(readFileSync(seed)), mtime: statSync(seed).mtimeMs }).toEqual(before);
    expect(starts(countFile, alpha.name)).toBe(1);
  });

  it("FC-CONSOLE: the console file is capped by copy-truncate, its tail is served bounded, and none of it reaches the host's log", async () => {
    // 400 lines through an emulated serial port: under TCG on a busy machine this takes a while.
    await waitFor(async () => (await consoleAll()).includes("bc-test: filler done"), 150_000);
    const dir = path.join(root, alpha.name);
    await waitFor(async () => statSync(path.join(dir, "console.log")).size <= consoleMaxBytes, 10_000);
    expect(statSync(path.join(dir, "console.log.1")).size).toBeLessThanOrEqual(consoleMaxBytes);
    const tail = await rt.console(alpha.name, 1024 * 1024);
    expect(Buffer.byteLength(tail)).toBeLessThanOrEqual(2 * consoleMaxBytes);
    expect(tail).toContain("bc-test: filler done");
    expect(Buffer.byteLength(await rt.console(alpha.name, 100))).toBeLessThanOrEqual(100);
    expect(logged.join("\n")).not.toContain("bc-test");
    expect(logged.join("\n")).not.toContain("bc-report");
  }, 180_000);

  it("FC-GRACEFUL-STOP: a stop asks the guest (ACPI power button) and it powers itself off", async () => {
    const stopped = await rt.apply({ ...alpha, desired: "stopped" });
    expect(stopped).toMatchObject({ state: "stopped", reason: "requested" });
    expect(await processesNaming(path.join(root, alpha.name))).toEqual([]);
    // QEMU recorded the guest's own shutdown: it was asked, not killed.
    expect(JSON.parse(readFileSync(path.join(root, alpha.name, "exit-event.json"), "utf8"))).toMatchObject({ reason: "guest-shutdown" });
  });

  it("FC-GUEST-DEATH-WATCH / FC-VM-TERMINATED / FC-WORKDIR-REMOVAL: a VMM that dies is noticed with reason vmm_exited; the work dir stays until remove", async () => {
    const seen = new Promise<InstanceObserved>((resolve) => rt.watch((o) => o.name === beta.name && resolve(o)));
    const [pid] = await processesNaming(path.join(root, beta.name));
    process.kill(pid!, "SIGKILL");
    const gone = await seen;
    expect(gone).toMatchObject({ name: beta.name, state: "failed", reason: "vmm_exited" });
    expect((await rt.observe(beta.name)).reason).toBe("vmm_exited");
    expect(existsSync(path.join(root, beta.name, "disk.img"))).toBe(true);
    await rt.remove(beta.name);
    expect(await leftovers(root, beta.name)).toEqual([]);
  });

  async function consoleAll(): Promise<string> {
    return rt.console(alpha.name, 1024 * 1024);
  }
});

describe("boot failures and restarts", () => {
  const base = newBase();
  const root = path.join(base, "root");
  const countFile = path.join(base, "starts");

  it("FC-BOOT-TIMEOUT: a VMM that exits before the guest reports fails the boot with its last output; its work dir and netns are gone", async () => {
    const broken = path.join(base, "not-a-kernel");
    writeFileSync(broken, "this is not a kernel\n");
    const rt = new MicroVmRuntime({ root, images: { "bc-guest": { ...image, kernel: broken } }, backend: countingBackend(countFile) });
    const s = spec();
    const o = await rt.apply(s);
    expect(o).toMatchObject({ state: "failed", reason: "boot_failed" });
    expect(o.lastOutput).toMatch(/vmm: .*(kernel|linux)/i);
    expect(await leftovers(root, s.name)).toEqual([]);
    // The same spec again answers the failure: no boot loop.
    expect(await rt.apply(s)).toMatchObject({ state: "failed", reason: "boot_failed" });
    expect(starts(countFile, s.name)).toBe(1);
    await rt.close();
  });

  it("FC-BOOT-TIMEOUT: a guest that never reports within the bound is killed and cleaned up (a VMM stand-in that never reports: a process naming the work dir)", async () => {
    const silent: VmmBackend = {
      ...countingBackend(countFile),
      start: async (launch) => {
        appendFileSync(countFile, `${launch.name}\n`);
        writeFileSync(launch.vmmLog, "stand-in VMM: never reports\n");
        const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 600000)", launch.consoleLog], {
          detached: true,
          stdio: "ignore",
        });
        child.unref();
        return { pid: child.pid! };
      },
    };
    const rt = new MicroVmRuntime({ root, images: { "bc-guest": image }, backend: silent, bootTimeoutMs: 1_000 });
    const s = spec();
    const o = await rt.apply(s);
    expect(o).toMatchObject({ state: "failed", reason: "boot_timeout" });
    expect(o.lastOutput).toContain("stand-in VMM: never reports");
    expect(await leftovers(root, s.name)).toEqual([]);
    await rt.close();
  });

  it(
    "FC-ADOPT-AFTER-RESTART: after a host reboot (a new boot id) a guest recorded running is stopped as host_reboot, then booted again with the same seed",
    async () => {
      let bootId = "boot-a";
      const make = () => runtime(root, countFile, { hostBootId: () => bootId });
      const s = spec();
      const first = make();
      const up = await first.apply(s);
      expect(up.state).toBe("running");
      await first.close();
      // The host reboots: the VMM is gone and the boot id changes.
      for (const pid of await processesNaming(path.join(root, s.name))) process.kill(pid, "SIGKILL");
      await waitFor(async () => (await processesNaming(path.join(root, s.name))).length === 0, 10_000);
      const seed = sha256(readFileSync(path.join(root, s.name, "seed.img")));
      bootId = "boot-b";
      const second = make();
      expect((await second.list()).find((g) => g.name === s.name)).toMatchObject({ state: "stopped", reason: "host_reboot" });
      const again = await second.apply(s);
      expect(again.state).toBe("running");
      expect(again.report!.userDataSha256).toBe(s.userDataSha256);
      expect(sha256(readFileSync(path.join(root, s.name, "seed.img")))).toBe(seed);
      expect(starts(countFile, s.name)).toBe(2);
      await second.remove(s.name);
      await second.close();
    },
    BOOT_TIMEOUT,
  );

  it(
    "FC-GRACEFUL-STOP: a guest that ignores the power button is killed after the grace",
    async () => {
      const rt = runtime(root, countFile, { stopGraceMs: 2_000 });
      const s = spec(undefined, "#!/bin/sh\nkillall acpid && echo bc-test: acpid gone\n");
      expect((await rt.apply(s)).state).toBe("running");
      await waitFor(async () => (await rt.console(s.name, 64 * 1024)).includes("bc-test: acpid gone"), 30_000);
      expect(await rt.apply({ ...s, desired: "stopped" })).toMatchObject({ state: "stopped", reason: "requested" });
      expect(await processesNaming(path.join(root, s.name))).toEqual([]);
      expect(existsSync(path.join(root, s.name, "exit-event.json"))).toBe(false); // killed: QEMU recorded no shutdown
      await rt.remove(s.name);
      await rt.close();
    },
    BOOT_TIMEOUT,
  );
});

async function waitFor(check: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms`);
    await sleep(200);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
