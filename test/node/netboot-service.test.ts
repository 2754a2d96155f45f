// The site agent's network boot service (agent/roles/netboot/): DHCP by dnsmasq, bound to the
// provisioning interface it is given, answering only the MACs of the machines it expects, with an
// iPXE client's script; the scripts and images over HTTP; the image cache on disk. The DHCP
// exchanges run inside two network namespaces this test makes (a server with two bridges, a client
// with a veth on each): nothing leaves them, and they are removed afterwards (also those a killed
// run left behind).
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NetbootService } from "../../agent/roles/netboot/service.ts";
import { canMakeNetns, makeNetns, removeLeftoverNetns, type Netns } from "../../testing/netns.ts";

const exec = promisify(execFile);
const PREFIX = "bc-nbtest";
const work = fs.mkdtempSync(path.join(os.tmpdir(), "bc-netboot-"));
const lines: string[] = [];
const log = {
  info: (message: string, fields?: object) => void lines.push(JSON.stringify({ message, ...fields })),
  warn: (message: string, fields?: object) => void lines.push(JSON.stringify({ message, ...fields })),
  error: (message: string, fields?: object) => void lines.push(JSON.stringify({ message, ...fields })),
};
const KNOWN = "52:54:00:aa:00:01";
const UNKNOWN = "52:54:00:aa:00:99";
const TOKEN = "bcj_0123456789abcdef_not-a-real-token-but-secret-looking-xyz";

const canNetns = canMakeNetns() && fs.existsSync("/usr/sbin/dnsmasq");
let server: Netns;
let client: Netns;

function makeNetwork(): void {
  removeLeftoverNetns(PREFIX);
  server = makeNetns(PREFIX, "s");
  client = makeNetns(PREFIX, "c");
  for (const [bridge, address, veth] of [
    ["br0", "10.77.0.1/24", "0"],
    ["br1", "10.78.0.1/24", "1"],
  ] as const) {
    server.ip("link", "add", bridge, "type", "bridge");
    server.ip("addr", "add", address, "dev", bridge);
    server.ip("link", "set", bridge, "up");
    // A veth from the bridge to the client's namespace, one per bridge.
    server.ip("link", "add", `vb${veth}`, "type", "veth", "peer", "name", `vc${veth}`, "netns", client.name);
    server.ip("link", "set", `vb${veth}`, "master", bridge, "up");
    client.ip("link", "set", `vc${veth}`, "up");
  }
}

/** A DHCP client (busybox udhcpc) on the client's veth `dev` with this MAC: the lease it got, or null. */
async function dhcp(dev: "vc0" | "vc1", mac: string, options: { ipxe?: boolean } = {}): Promise<{ ip: string; bootFile: string } | null> {
  client.ip("link", "set", dev, "down");
  client.ip("link", "set", dev, "address", mac);
  client.ip("link", "set", dev, "up");
  const script = path.join(work, "udhcpc.sh");
  fs.writeFileSync(script, '#!/bin/sh\n[ "$1" = bound ] && echo "LEASE $ip ${boot_file:-none}"\nexit 0\n', { mode: 0o755 });
  // iPXE says who it is with user class (option 77) "iPXE".
  const ipxe = options.ipxe ? ["-x", `0x4d:${Buffer.from("iPXE").toString("hex")}`] : [];
  const run = exec("ip", [
    "netns",
    "exec",
    client.name,
    "busybox",
    "udhcpc",
    "-f",
    "-q",
    "-n",
    "-i",
    dev,
    "-t",
    "3",
    "-T",
    "1",
    "-A",
    "1",
    "-s",
    script,
    ...ipxe,
  ]);
  const out = await run.then(
    (r) => r.stdout,
    (e: { stdout?: string }) => e.stdout ?? "",
  );
  const lease = /^LEASE (\S+) (\S+)$/m.exec(out);
  return lease ? { ip: lease[1]!, bootFile: lease[2]! } : null;
}

let service: NetbootService | undefined;
let upstream: Server;
let upstreamUrl = "";
const files = new Map<string, Buffer>();

/** A fake ramdisk build: a manifest naming a kernel and two initrds. */
function fakeRamdisk(): string {
  const dir = path.join(work, "ramdisk");
  fs.mkdirSync(dir, { recursive: true });
  for (const name of ["vmlinuz", "initrd-base.gz", "initrd-bcd.gz"]) fs.writeFileSync(path.join(dir, name), `${name} bytes`);
  fs.writeFileSync(
    path.join(dir, "manifest.json"),
    JSON.stringify({ kernel: { file: "vmlinuz" }, initrds: [{ file: "initrd-base.gz" }, { file: "initrd-bcd.gz" }] }),
  );
  return dir;
}

function newService(maxBytes = 10_000_000): NetbootService {
  return new NetbootService({
    stateDir: path.join(work, "state"),
    address: "127.0.0.1",
    httpPort: 0,
    dhcp: {
      interface: "br0",
      mode: { kind: "server", range: ["10.77.0.100", "10.77.0.199"], netmask: "255.255.255.0", leaseSeconds: 3600 },
      routerAdvertisements: false,
      tftpRoot: "/usr/lib/ipxe",
      command: [...server.prefix, "dnsmasq"],
    },
    ramdiskDir: fakeRamdisk(),
    ramdiskCmdline: "console=ttyS0",
    controlPlaneUrl: "http://10.77.0.1:8787",
    images: { dir: path.join(work, "images"), maxBytes },
    log,
  });
}

beforeAll(async () => {
  upstream = createServer((req, res) => {
    const body = files.get((req.url ?? "").split("?")[0]!);
    if (!body) return void res.writeHead(404).end();
    res.writeHead(200, { "content-length": String(body.length) }).end(body);
  });
  await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await service?.stop();
  upstream.close();
  await server?.remove();
  await client?.remove();
  fs.rmSync(work, { recursive: true, force: true });
});

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

describe.skipIf(!canNetns)("DHCP on the provisioning interface", () => {
  beforeAll(async () => {
    makeNetwork();
    service = newService();
    await service.start();
    await service.set({ machine: "m-1", macs: [KNOWN.toUpperCase()], action: "ramdisk", token: TOKEN });
  }, 60_000);

  it("leases to a machine it expects, and hands its iPXE its own script", async () => {
    const plain = await dhcp("vc0", KNOWN);
    expect(plain?.ip).toMatch(/^10\.77\.0\.1\d\d$/);
    const ipxe = await dhcp("vc0", KNOWN, { ipxe: true });
    const machine = service!.machines.byMac(KNOWN)!;
    expect(ipxe?.bootFile).toBe(service!.scriptUrl(machine));
  }, 60_000);

  it("never answers a MAC it does not know", async () => {
    expect(await dhcp("vc0", UNKNOWN)).toBeNull();
    expect(await dhcp("vc0", UNKNOWN, { ipxe: true })).toBeNull();
  }, 60_000);

  it("never answers on an interface it was not given, even a machine it knows", async () => {
    expect(await dhcp("vc1", KNOWN)).toBeNull();
  }, 60_000);

  it("keeps its machines across a restart, and stops answering one it was told to forget", async () => {
    await service!.stop();
    service = newService();
    await service.start();
    expect(service.machines.byMac(KNOWN)).toMatchObject({ machine: "m-1", action: "ramdisk" });
    expect((await dhcp("vc0", KNOWN))?.ip).toMatch(/^10\.77\.0\./);
    await service.clear("m-1");
    expect(await dhcp("vc0", KNOWN)).toBeNull();
    // The token reached no log line.
    expect(lines.join("\n")).not.toContain(TOKEN);
  }, 90_000);
});

describe("scripts and images over HTTP", () => {
  let web: NetbootService;
  beforeAll(async () => {
    web = new NetbootService({
      stateDir: path.join(work, "web-state"),
      address: "127.0.0.1",
      httpPort: 0,
      ramdiskDir: fakeRamdisk(),
      ramdiskCmdline: "console=ttyS0",
      controlPlaneUrl: "http://10.77.0.1:8787",
      images: { dir: path.join(work, "web-images"), maxBytes: 4096 },
      log,
    });
    await web.start();
  });
  afterAll(() => web.stop());

  const get = async (url: string) => {
    const res = await fetch(url);
    return { status: res.status, text: await res.text() };
  };

  it("serves each machine its script at an unguessable name: the ramdisk with its token, or leave for the disk", async () => {
    const ramdisk = await web.set({ machine: "m-r", macs: ["52:54:00:bb:00:01"], action: "ramdisk", token: TOKEN });
    const script = await get(web.scriptUrl(ramdisk));
    expect(script.status).toBe(200);
    const lines = script.text.split("\n");
    expect(lines[0]).toBe("#!ipxe");
    const kernel = lines.find((l) => l.startsWith("kernel "));
    expect(kernel).toMatch(
      /^kernel http:\/\/127\.0\.0\.1:\d+\/images\/[0-9a-f]{64} initrd=initrd0 initrd=initrd1 quiet bc\.url=http:\/\/10\.77\.0\.1:8787 bc\.token=/,
    );
    expect(kernel).toContain(`bc.token=${TOKEN} console=ttyS0`);
    expect(lines.filter((l) => l.startsWith("initrd --name"))).toHaveLength(2);
    // Each file it names is served, byte for byte.
    for (const url of script.text.match(/http:\/\/\S+\/images\/[0-9a-f]{64}/g)!) {
      const body = await get(url);
      expect(body.status).toBe(200);
      expect(sha(Buffer.from(body.text))).toBe(url.slice(-64));
    }
    expect(ramdisk.script).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const disk = await web.set({ machine: "m-d", macs: ["52:54:00:bb:00:02"], action: "disk" });
    expect((await get(web.scriptUrl(disk))).text).toBe("#!ipxe\nexit\n");
    expect((await get(`${web.baseUrl}/boot/${"A".repeat(43)}.ipxe`)).status).toBe(404);
    await expect(web.set({ machine: "m-x", macs: ["not-a-mac"], action: "disk" })).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
  });

  it("caches an image once, verified by sha256, serves it, and refuses one that does not match", async () => {
    const image = Buffer.from("an image, 40 bytes of it, give or take..");
    files.set("/img", image);
    const cached = await web.cacheImage({ url: `${upstreamUrl}/img?sig=secret`, sha256: sha(image) });
    expect(cached).toEqual({ url: `${web.baseUrl}/images/${sha(image)}`, sha256: sha(image), bytes: image.length });
    files.delete("/img"); // served from the cache from now on
    expect((await web.cacheImage({ url: `${upstreamUrl}/img`, sha256: sha(image) })).bytes).toBe(image.length);
    expect((await get(cached.url)).text).toBe(image.toString());
    // A ramdisk whose download stopped resumes it from the byte it got to.
    const rest = await fetch(cached.url, { headers: { range: "bytes=10-" } });
    expect(rest.status).toBe(206);
    expect(rest.headers.get("content-range")).toBe(`bytes 10-${image.length - 1}/${image.length}`);
    expect(await rest.text()).toBe(image.subarray(10).toString());
    expect((await fetch(cached.url, { headers: { range: `bytes=${image.length}-` } })).status).toBe(416);
    for (const range of ["bytes=0-5", "lines=1-"])
      expect(await (await fetch(cached.url, { headers: { range } })).text(), range).toBe(image.toString());

    files.set("/bad", Buffer.from("other bytes"));
    const refused = await web
      .cacheImage({ url: `${upstreamUrl}/bad?sig=secret`, sha256: sha(image).replace(/^./, "0") })
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: "DRIVER_ERROR", message: expect.stringContaining("digest mismatch") });
    expect((refused as Error).message).not.toContain("secret");
  });

  it("stays within its size, dropping the least recently used, and drops a file whose bytes changed", async () => {
    const a = Buffer.alloc(1500, 1);
    const b = Buffer.alloc(1500, 2);
    const c = Buffer.alloc(1500, 3);
    for (const [name, body] of [
      ["/a", a],
      ["/b", b],
      ["/c", c],
    ] as const) {
      files.set(name, body);
      await web.cacheImage({ url: `${upstreamUrl}${name}`, sha256: sha(body) });
    }
    const kept = fs.readdirSync(path.join(work, "web-images")).filter((f) => /^[0-9a-f]{64}$/.test(f));
    expect(kept).not.toContain(sha(a));
    expect(kept).toEqual(expect.arrayContaining([sha(b), sha(c)]));
    const total = kept.reduce((n, f) => n + fs.statSync(path.join(work, "web-images", f)).size, 0);
    expect(total).toBeLessThanOrEqual(4096);

    const file = path.join(work, "web-images", sha(c));
    fs.chmodSync(file, 0o600);
    fs.writeFileSync(file, Buffer.alloc(1500, 4));
    const res = await fetch(`${web.baseUrl}/images/${sha(c)}`);
    await res.arrayBuffer().catch(() => undefined);
    await new Promise((r) => setTimeout(r, 100));
    expect(fs.existsSync(file)).toBe(false);
  });
});
