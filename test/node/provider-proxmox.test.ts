// The Proxmox VE provider (plugins/proxmox) against its emulator (SIMULATED: PVE's HTTP API
// served over real HTTPS by testing/providers/proxmox.ts; no VM runs anywhere): conformance live
// through the recording transport and offline from test/recordings/proxmox.json, proxmoxer (the
// reference Python client, Debian's python3-proxmoxer) driving the emulator unmodified, a create
// cut short at every step and continued, the nextid race, faults (429, 502, 596, lock timeouts,
// lost answers, failed tasks), capacity, wrong tokens and the certificate pin.
//
// Record the conformance run again (after a change of the adapter or the emulator):
//   BC_RECORD=1 npx vitest run --project node test/node/provider-proxmox.test.ts
import { execFile, execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { promisify } from "node:util";
import { afterEach, describe, expect, it } from "vitest";
import { runConformance } from "better-compute/conformance";
import { ComputeError } from "better-compute/core";
import { proxmoxProvider, type ProxmoxAccount } from "better-compute/proxmox";
import { pinnedFetch } from "better-compute/proxmox/pinned-fetch";
import { startProxmoxEmulator, type ProxmoxEmulator, type ProxmoxEmulatorOptions } from "better-compute/testing/proxmox";
import {
  providerConformanceCases,
  renderUserData,
  type CreateServerRequest,
  type Fetch,
  type Operation,
  type ProviderClient,
  type ProviderSubject,
} from "better-compute/vps";
import { recordingFetch, replayFetch, type Recording } from "better-compute/vps/record-replay";

const RECORDING = new URL("../recordings/proxmox.json", import.meta.url);
const WRONG_SECRET = "00000000-dead-beef-0000-000000000000";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@example";
const PYTHON = "/usr/bin/python3";

const running: ProxmoxEmulator[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

async function emulator(options: ProxmoxEmulatorOptions = {}): Promise<ProxmoxEmulator> {
  const emu = await startProxmoxEmulator(options);
  running.push(emu);
  return emu;
}

function account(
  emu: { url: string; node: string; tokenId: string; tokenSecret: string },
  extra: Record<string, unknown> = {},
): ProxmoxAccount {
  return proxmoxProvider.manifest.parse({ baseUrl: emu.url, node: emu.node, tokenId: emu.tokenId, tokenSecret: emu.tokenSecret, ...extra });
}

/** A client of the emulator through the pinned fetch (the emulator's certificate is self-signed). */
function client(emu: ProxmoxEmulator, extra: Record<string, unknown> = {}, fetch?: Fetch): ProviderClient {
  const a = account(emu, { tls: { spkiSha256: emu.spkiSha256 }, ...extra });
  return proxmoxProvider.client(a, { fetch: fetch ?? pinnedFetch(a.tls) });
}

const request = (n: number, extra: Partial<CreateServerRequest> = {}): CreateServerRequest => ({
  instanceId: `inst-${n}`,
  name: `vm-${n}`,
  flavor: "small",
  image: "9000",
  sshKeys: [{ name: "tenant", publicKey: KEY }],
  ...extra,
});

async function settle(c: ProviderClient, op: Operation | void): Promise<void> {
  if (!op) return;
  for (let i = 0; i < 500; i++) {
    const state = await c.operation(op.id);
    if (state.state === "succeeded") return;
    if (state.state === "failed") throw new Error(`task ${op.id} failed: ${state.message}`);
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`task ${op.id} did not end`);
}

async function failure(promise: Promise<unknown>): Promise<ComputeError> {
  const e = await promise.then(
    () => undefined,
    (err: unknown) => err,
  );
  if (!(e instanceof ComputeError)) throw new Error(`expected a ComputeError, got ${e === undefined ? "success" : String(e)}`);
  return e;
}

describe("conformance", () => {
  const cases = providerConformanceCases();
  const subject = (c: () => ProviderClient, wrong: () => ProviderClient, secrets: string[]) => (): ProviderSubject => ({
    client: c(),
    wrongCredential: wrong(),
    secrets,
    userData: false, // PVE's API cannot write a cloud-init snippet: create refuses user data beyond hostname and keys
  });

  it("passes live against the emulator over pinned TLS, through the recording transport, leaving no VM behind", async () => {
    const emu = await emulator();
    const secrets = [emu.tokenSecret, WRONG_SECRET];
    const recorder = recordingFetch(pinnedFetch({ spkiSha256: emu.spkiSha256 }), {
      secrets,
      about: "proxmox@1: providerConformanceCases() against testing/providers/proxmox.ts (test/node/provider-proxmox.test.ts)",
    });
    const report = await runConformance(
      cases,
      subject(
        () => client(emu, {}, recorder.fetch),
        () => client({ ...emu, tokenSecret: WRONG_SECRET } as ProxmoxEmulator, {}, recorder.fetch),
        secrets,
      ),
    );
    expect(report.failed).toEqual([]);
    expect(report.passed).toEqual(cases.map((c) => c.name));
    expect(emu.counters.serversCreated).toBe(4); // four cases create, each exactly one VM
    expect(emu.counters.liveServers()).toBe(0);

    const text = `${JSON.stringify(recorder.recording(), null, 2)}\n`;
    for (const secret of secrets) expect(text).not.toContain(secret);
    if (process.env.BC_RECORD === "1") writeFileSync(RECORDING, text);
  });

  it("passes offline from the committed recording, every exchange consumed", async () => {
    const recording = JSON.parse(readFileSync(RECORDING, "utf8")) as Recording;
    const secrets = ["replayed-token-secret", WRONG_SECRET];
    const replay = replayFetch(recording, { secrets });
    const offline = { url: "https://pve.replay.invalid:8006", node: "pve", tokenId: "root@pam!bc" };
    const make = (tokenSecret: string) => () => proxmoxProvider.client(account({ ...offline, tokenSecret }), { fetch: replay.fetch });
    const report = await runConformance(cases, subject(make(secrets[0]!), make(WRONG_SECRET), secrets));
    expect(report.failed).toEqual([]);
    expect(report.passed).toHaveLength(cases.length);
    replay.assertConsumed();
  });
});

describe("proxmoxer, the reference client, drives the emulator unmodified", () => {
  const proxmoxer = (() => {
    try {
      execFileSync(PYTHON, ["-c", "import proxmoxer"], { stdio: "ignore" });
      return true;
    } catch {
      return false;
    }
  })();

  it.skipIf(!proxmoxer)(
    "(skipped only when Debian's python3-proxmoxer is not installed: apt-get install python3-proxmoxer) nodes, nextid, clone, task, cloud-init, start, status, stop, delete",
    async () => {
      const emu = await emulator();
      const [user, tokenName] = emu.tokenId.split("!") as [string, string];
      const script = new URL("../support/proxmox-client.py", import.meta.url).pathname;
      // Asynchronously: the emulator answers from this process's event loop.
      const { stdout } = await promisify(execFile)(PYTHON, [script, emu.host, user, tokenName, emu.tokenSecret, emu.node, "9000"]);
      const out = JSON.parse(stdout);
      expect(out.nodes).toEqual(["pve"]);
      expect(out.nextid).toBe("100"); // a string, as PVE answers it
      expect(out.clone_upid).toMatch(/^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:qmclone:9000:root@pam!bc:$/);
      expect(out.clone_upid.split(":")).toHaveLength(9);
      expect(out.clone_task).toMatchObject({ status: "stopped", exitstatus: "OK", type: "qmclone", id: "9000", user: "root@pam" });
      // A raw key is refused as PVE refuses it; the URL-encoded one is stored as given.
      expect(out.raw_key).toMatchObject({ status_code: 400, content: "Parameter verification failed." });
      expect(out.config).toEqual({
        name: "py-vm",
        ciuser: "debian",
        sshkeys: encodeURIComponent(KEY.replace("tenant@example", "python@proxmoxer")),
        ipconfig0: "ip=dhcp",
        tags: "python;bc-test",
      });
      expect(out.start_task).toMatchObject({ status: "stopped", exitstatus: "OK", type: "qmstart", id: "100" });
      expect(out.status_running).toBe("running");
      expect(out.resources).toEqual([100]);
      expect(out.delete_running).toEqual({ status_code: 500, content: "VM 100 is running - destroy failed", errors: null });
      expect(out.stop_task).toMatchObject({ exitstatus: "OK", type: "qmstop" });
      expect(out.status_stopped).toBe("stopped");
      expect(out.delete_task).toMatchObject({ exitstatus: "OK", type: "qmdestroy" });
      expect(out.gone).toEqual({
        status_code: 500,
        content: "Configuration file 'nodes/pve/qemu-server/100.conf' does not exist",
        errors: null,
      });
      expect(emu.vms.has(100)).toBe(false);
    },
  );
});

describe("create", () => {
  it("clones, sizes the disk, writes cloud-init with URL-encoded keys and the stamp tag, and returns the start task", async () => {
    const emu = await emulator();
    const c = client(emu, { ciuser: "debian", cicustom: "vendor=local:snippets/vendor.yaml" });
    const created = await c.create(
      request(1, {
        sshKeys: [
          { name: "a", publicKey: KEY },
          { name: "b", publicKey: KEY.replace("tenant", "ops") },
        ],
      }),
    );
    expect(created.server).toMatchObject({ id: "100", instanceId: "inst-1", name: "vm-1", status: "starting" });
    expect(created.operation?.id).toMatch(/:qmstart:100:root@pam!bc:$/);
    await settle(c, created.operation);

    const vm = emu.vms.get(100)!;
    expect(vm.status).toBe("running");
    expect(vm.config).toMatchObject({
      name: "vm-1",
      tags: "bc-instance.inst-1",
      cores: "1",
      memory: "2048",
      ciuser: "debian",
      ipconfig0: "ip=dhcp",
      cicustom: "vendor=local:snippets/vendor.yaml",
      scsi0: "local-lvm:vm-100-disk-0,size=20G", // the template's 3.5 GiB grown to the flavor's 20
    });
    // PVE takes the keys URL-encoded: spaces, '+', '/', '=' and the newline between keys escaped.
    expect(vm.config.sshkeys).toBe(encodeURIComponent(`${KEY}\n${KEY.replace("tenant", "ops")}`));
    expect(vm.config.sshkeys).not.toMatch(/[ +/=\n]/);
    expect(await c.get("100")).toEqual({ id: "100", instanceId: "inst-1", name: "vm-1", status: "running", addresses: [] });
  });

  it("a raw key is what PVE refuses: 400 Parameter verification failed, naming sshkeys", async () => {
    const emu = await emulator();
    await client(emu).create(request(1));
    const res = await pinnedFetch({ spkiSha256: emu.spkiSha256 })(`${emu.url}/api2/json/nodes/pve/qemu/100/config`, {
      method: "PUT",
      headers: { authorization: `PVEAPIToken=${emu.tokenId}=${emu.tokenSecret}`, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ sshkeys: KEY }).toString(),
    });
    expect(res.status).toBe(400);
    expect(res.statusText).toBe("Parameter verification failed.");
    const body = (await res.json()) as { data: null; errors: Record<string, string> };
    expect(body.data).toBeNull();
    expect(body.errors.sshkeys).toMatch(/^invalid format - invalid urlencoded string/);
  });

  it("a clone whose answer was lost is found by its pending name, and the next create finishes it: one VM", async () => {
    const emu = await emulator();
    const c = client(emu);
    emu.faults.next(1, "lost-answer", (method, path) => method === "POST" && path.endsWith("/clone"));
    const e = await failure(c.create(request(7)));
    expect(e.details).toMatchObject({ failure: "transient", status: 596 });
    expect(emu.vms.get(100)?.config.name).toBe("bc-creating.inst-7");

    expect(await c.find("inst-7")).toEqual({
      id: "100",
      instanceId: "inst-7",
      name: "bc-creating.inst-7",
      status: "creating",
      addresses: [],
      incomplete: true,
    });
    const again = await c.create(request(7));
    expect(again.server.id).toBe("100");
    await settle(c, again.operation);
    expect(await c.get("100")).toMatchObject({ instanceId: "inst-7", name: "vm-7", status: "running" });
    expect(emu.vms.get(100)?.config.scsi0).toBe("local-lvm:vm-100-disk-0,size=20G");
    expect(emu.counters.serversCreated).toBe(1);
  });

  it("a clone whose answer was lost while it still runs: the next create waits for its lock, then finishes it", async () => {
    const emu = await emulator({ actionDurationMs: 150 });
    const c = client(emu);
    emu.faults.next(1, "lost-answer", (method, path) => method === "POST" && path.endsWith("/clone"));
    await failure(c.create(request(2)));
    expect(emu.vms.get(100)?.config.lock).toBe("clone");
    expect((await c.find("inst-2"))?.status).toBe("creating");

    const again = await c.create(request(2));
    await settle(c, again.operation);
    expect(emu.vms.get(100)).toMatchObject({ status: "running", config: { name: "vm-2", tags: "bc-instance.inst-2" } });
    expect(emu.counters.serversCreated).toBe(1);
  });

  it("a create cut short before the start leaves a configured, stopped, stamped VM: the next create starts it", async () => {
    const emu = await emulator();
    const c = client(emu);
    emu.faults.next(1, "bad-gateway", (method, path) => method === "POST" && path.endsWith("/status/start"));
    await failure(c.create(request(9)));
    expect(await c.find("inst-9")).toEqual({ id: "100", instanceId: "inst-9", name: "vm-9", status: "stopped", addresses: [] });
    const again = await c.create(request(9));
    expect(again.operation?.id).toMatch(/:qmstart:100:/);
    await settle(c, again.operation);
    expect(emu.vms.get(100)?.status).toBe("running");
    expect(emu.counters.serversCreated).toBe(1);
  });

  it("create on a running stamped VM returns it and calls nothing but the cluster listing", async () => {
    const emu = await emulator();
    const c = client(emu);
    await settle(c, (await c.create(request(3))).operation);
    const before = emu.counters.requests;
    const again = await c.create(request(3));
    expect(again).toEqual({ server: { id: "100", instanceId: "inst-3", name: "vm-3", status: "running", addresses: [] } });
    expect(emu.counters.requests - before).toBe(1);
  });

  it("when another client takes the id nextid suggested, the clone takes the next one", async () => {
    const emu = await emulator();
    const c = client(emu);
    emu.faults.raceNextId(1);
    const created = await c.create(request(4));
    expect(created.server.id).toBe("101");
    expect(emu.vms.get(100)?.config.name).toBe("other-client-100"); // the other client's VM, untouched
    expect(emu.counters.calls["POST /nodes/{node}/qemu/{vmid}/clone"]).toBe(2); // 500 "VM 100 already exists", then 101
  });

  it("an instance id that is not a DNS label is stamped by its hash, and still found", async () => {
    const emu = await emulator();
    const c = client(emu);
    const id = "Tenant_A/instance:42";
    await settle(c, (await c.create(request(5, { instanceId: id }))).operation);
    expect(emu.vms.get(100)?.config.tags).toMatch(/^bc-instance\.sha256-[0-9a-f]{40}$/);
    expect(await c.find(id)).toMatchObject({ id: "100", instanceId: id, status: "running" });
    expect((await c.list()).find((s) => s.id === "100")?.instanceId).toBeUndefined(); // a hash does not read back
  });

  it("creates from a disk image (import-from) when the image is one of the account's", async () => {
    const emu = await emulator();
    const volid = "local:import/debian-12-genericcloud-amd64.qcow2";
    const c = client(emu, {
      images: [{ name: "Debian 12", importFrom: volid }],
      flavors: [{ id: "m", cores: 2, memoryMiB: 4096, diskGiB: 30 }],
    });
    expect((await c.offers()).images).toEqual([
      { id: "9000", name: "ubuntu-24.04-cloud" },
      { id: volid, name: "Debian 12" },
    ]);
    await settle(c, (await c.create(request(6, { image: volid, flavor: "m" }))).operation);
    expect(emu.vms.get(100)).toMatchObject({
      status: "running",
      config: { name: "vm-6", cores: "2", memory: "4096", scsi0: "local-lvm:vm-100-disk-0,size=30G", tags: "bc-instance.inst-6" },
    });
    expect(emu.vms.get(100)?.config.net0).toMatch(/^virtio=BC:24:11:[0-9A-F:]{8},bridge=vmbr0$/);
    expect(emu.vms.get(100)?.config.ide2).toBe("local-lvm:vm-100-cloudinit,media=cdrom");
  });

  it("takes user data that says only the hostname and keys (PVE's cloud-init keys carry those), and no more", async () => {
    const emu = await emulator();
    const c = client(emu);
    const req = request(1);
    await settle(c, (await c.create({ ...req, userData: renderUserData({ hostname: req.name, sshKeys: req.sshKeys }) })).operation);
    expect(emu.vms.get(100)?.config).toMatchObject({ name: "vm-1", sshkeys: encodeURIComponent(KEY) });

    // A join token cannot reach the VM (no snippet upload in PVE's API): refused before anything is made.
    const join = renderUserData({
      hostname: "vm-2",
      sshKeys: req.sshKeys,
      join: { url: "https://bc.example", token: "bcjt_secret_join_token" },
    });
    const e = await failure(c.create(request(2, { userData: join })));
    expect(e).toMatchObject({ code: "DRIVER_ERROR", details: { provider: "proxmox", failure: "rejected" } });
    expect(e.message).toMatch(/user data beyond the hostname and the SSH keys cannot be sent/);
    expect(e.message).not.toContain("bcjt_secret_join_token");
    expect(emu.counters.serversCreated).toBe(1);
  });

  it("refuses unknown flavors and images, another node, user data it cannot deliver: nothing created", async () => {
    const emu = await emulator();
    const c = client(emu);
    for (const [req, text] of [
      [request(1, { userData: "#cloud-config\nruncmd:\n  - echo hi\n" }), /user data beyond the hostname and the SSH keys cannot be sent/],
      [request(1, { flavor: "huge" }), /no flavor huge \(the account offers small, medium, large\)/],
      [request(1, { image: "9001" }), /image 9001 is neither a template on node pve/],
      [request(1, { location: "pve2" }), /location pve2 is not this account's node/],
    ] as const) {
      const e = await failure(c.create(req));
      expect(e).toMatchObject({ code: "DRIVER_ERROR", details: { provider: "proxmox", failure: "rejected" } });
      expect(e.message).toMatch(text);
    }
    expect(emu.counters.serversCreated).toBe(0);
  });

  it("a clone that runs out of space is a capacity failure (DRIVER_ERROR), and PVE's cleanup leaves nothing", async () => {
    const emu = await emulator();
    const c = client(emu);
    emu.faults.failTasks(1, "clone failed: lvcreate 'pve/vm-100-disk-0' error:   Volume group \"pve\" has insufficient free space", [
      "qmclone",
    ]);
    const e = await failure(c.create(request(8)));
    expect(e).toMatchObject({ code: "DRIVER_ERROR", details: { provider: "proxmox", failure: "capacity", reason: "no_capacity" } });
    expect(e.message).toMatch(/^proxmox: clone of VM 100 failed: clone failed: .*insufficient free space/);
    expect(emu.counters.liveServers()).toBe(0);
  });
});

describe("power and delete", () => {
  it("power off is an ACPI shutdown forced after a timeout; power on and reboot; a running VM is stopped before it is destroyed", async () => {
    const emu = await emulator();
    const c = client(emu);
    await settle(c, (await c.create(request(1))).operation);
    const off = await c.powerOff("100");
    expect(off?.id).toMatch(/:qmshutdown:100:/);
    await settle(c, off);
    expect(await c.powerOff("100")).toBeUndefined(); // already off: nothing to do
    await settle(c, await c.reboot("100")); // a reboot of a stopped VM starts it
    expect(emu.vms.get(100)?.status).toBe("running");
    expect((await c.reboot("100"))?.id).toMatch(/:qmreboot:100:/);
    expect(await c.powerOn("100")).toBeUndefined();

    const del = await c.delete("100");
    expect(del?.id).toMatch(/:qmdestroy:100:/);
    expect(emu.counters.calls["POST /nodes/{node}/qemu/{vmid}/status/{action}"]).toBeGreaterThan(0);
    await settle(c, del);
    expect(await c.get("100")).toBeNull();
    expect(await c.delete("100")).toBeUndefined(); // gone: done
    const e = await failure(c.delete("9000"));
    expect(e.message).toMatch(/VM 9000 is a template, not a server/);
    expect(emu.vms.has(9000)).toBe(true);
  });

  it("operation() reports a failed task with its exitstatus, and refuses an id that is not a UPID", async () => {
    const emu = await emulator();
    const c = client(emu);
    await settle(c, (await c.create(request(1))).operation);
    emu.faults.failTasks(1, "shutdown failed: got timeout", ["qmshutdown"]);
    const op = await c.powerOff("100");
    expect(await c.operation(op!.id)).toEqual({ state: "failed", message: "shutdown failed: got timeout" });
    const e = await failure(c.operation("UPID:pve:1:2:3:qmstart:100:root@pam"));
    expect(e.details).toMatchObject({ failure: "rejected" });
  });

  it("with the guest agent on, get() reports the VM's addresses (not loopback, not link-local)", async () => {
    const emu = await emulator();
    const c = client(emu, { guestAgent: true });
    await settle(c, (await c.create(request(1))).operation);
    expect((await c.get("100"))?.addresses).toEqual(["10.10.0.100"]);
  });
});

describe("faults", () => {
  /** What the reconciler does for one instance, level-triggered: a transient failure is simply tried again. */
  async function converge(emu: ProxmoxEmulator, c: ProviderClient, req: CreateServerRequest, transient: ComputeError[]): Promise<string> {
    const retry = async <T>(step: () => Promise<T>): Promise<T> => {
      for (let i = 0; ; i++) {
        try {
          return await step();
        } catch (e) {
          if (!(e instanceof ComputeError) || e.details?.failure !== "transient" || i > 40) throw e;
          transient.push(e);
        }
      }
    };
    const waitTask = async (op: Operation | void) => {
      if (!op) return true;
      for (;;) {
        const state = await retry(() => c.operation(op.id));
        if (state.state === "succeeded") return true;
        if (state.state === "failed") return false;
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    let id: string;
    for (;;) {
      const found = await retry(() => c.find(req.instanceId));
      if (found?.status === "running") {
        id = found.id;
        break;
      }
      const created = await retry(() => c.create(req));
      if ((await waitTask(created.operation)) && (await retry(() => c.get(created.server.id)))?.status === "running") {
        id = created.server.id;
        break;
      }
    }
    const stamped = [...emu.vms.values()].filter(
      (vm) => vm.config.tags === `bc-instance.${req.instanceId}` || vm.config.name === `bc-creating.${req.instanceId}`,
    );
    expect(stamped.map((vm) => String(vm.vmid))).toEqual([id]); // one VM for the instance, never two
    for (;;) {
      const op = await retry(() => c.delete(id));
      await waitTask(op);
      if ((await retry(() => c.get(id))) === null) return id;
    }
  }

  it("with 429, 502, 596, lock timeouts, lost answers and failed tasks on a share of calls, every instance runs once and is deleted", async () => {
    const emu = await emulator({ seed: 7 });
    const c = client(emu);
    const lockTimeout = "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout";
    emu.faults.share(0.1, ["rate-limit", "bad-gateway", "timeout", "locked", "lost-answer"]);
    emu.faults.failTaskShare(0.1, lockTimeout);
    // Besides the share, one clone fails and one clone's answer is lost, whatever the seed picks.
    emu.faults.failTasks(1, lockTimeout, ["qmclone"]);
    emu.faults.next(1, "lost-answer", (method, path) => method === "POST" && path.endsWith("/clone"));
    const transient: ComputeError[] = [];
    for (let n = 1; n <= 6; n++) await converge(emu, c, request(n), transient);
    const injected = emu.counters.faults;
    expect(Object.values(injected).reduce((sum, n) => sum + n, 0)).toBeGreaterThan(10);
    expect(transient.length).toBeGreaterThan(0); // what ProviderHttp did not absorb surfaced, and as transient
    for (const e of transient) {
      expect(e.code).toBe("UNAVAILABLE");
      expect(e.message).not.toContain(emu.tokenSecret);
    }
    // Every VM ever made is an instance's one VM or a clone that failed (and that PVE removed again).
    const failedClones = [...emu.tasks.values()].filter((t) => t.type === "qmclone" && t.exitstatus !== "OK").length;
    expect(emu.counters.serversCreated).toBe(6 + failedClones);
    expect(emu.counters.liveServers()).toBe(0);
  });

  it("a proxy's rate limit: the adapter waits out Retry-After instead of calling on; no call lands in a spent window", async () => {
    const emu = await emulator({ rateLimit: { limit: 4, windowMs: 400 } });
    const c = client(emu);
    for (let i = 0; i < 10; i++) expect(await c.list()).toEqual([]);
    expect(emu.counters.rateLimited).toBeGreaterThan(0);
    expect(emu.counters.callsWhileLimited).toBe(0);
  });
});

describe("credentials and the certificate", () => {
  it("a wrong token is INVALID_CONFIG, asked once, quoting no secret", async () => {
    const emu = await emulator();
    const e = await failure(client({ ...emu, tokenSecret: WRONG_SECRET } as ProxmoxEmulator).list());
    expect(e).toMatchObject({
      code: "INVALID_CONFIG",
      details: { provider: "proxmox", failure: "config", status: 401, reason: "unauthorized" },
    });
    expect(e.message).toBe(
      "proxmox: GET /cluster/resources: 401 authentication failure: the API token was refused; check tokenId and tokenSecret",
    );
    expect(JSON.stringify({ m: e.message, d: e.details })).not.toContain(WRONG_SECRET);
    expect(emu.counters.requests).toBe(1);
  });

  it("a node the cluster does not have is INVALID_CONFIG naming the nodes it has", async () => {
    const emu = await emulator();
    const e = await failure(client(emu, { node: "pve9" }).offers());
    expect(e).toMatchObject({ code: "INVALID_CONFIG", message: "proxmox: node pve9 is not a node of this cluster (it has: pve)" });
  });

  it("pinnedFetch reaches the pinned server; a wrong pin, or no pin for a self-signed certificate, is refused before a byte is sent", async () => {
    const emu = await emulator();
    expect((await client(emu).offers()).locations).toEqual([{ id: "pve", name: "pve" }]);
    expect(emu.counters.requests).toBe(2);
    // The certificate as its own CA (it names 127.0.0.1) works too.
    expect(await proxmoxProvider.client(account(emu), { fetch: pinnedFetch({ caBundle: emu.certificate }) }).list()).toEqual([]);

    const before = emu.counters.requests;
    const wrongPin = "rFQOJfhYDnFl8UJf1Evymx9ioz/Bve/XntOvh1SVMKk=";
    const refused = await failure(pinnedFetch({ spkiSha256: wrongPin })(`${emu.url}/api2/json/nodes`));
    expect(refused.code).toBe("INVALID_CONFIG");
    expect(refused.message).toBe(
      `127.0.0.1:${emu.url.split(":")[2]} presented a certificate whose public key does not match the pin tls.spkiSha256 ${wrongPin} (its pin is ${emu.spkiSha256}); nothing was sent`,
    );
    const untrusted = await failure(pinnedFetch(undefined)(`${emu.url}/api2/json/nodes`));
    expect(untrusted.message).toMatch(/not trusted by the system's CAs \(DEPTH_ZERO_SELF_SIGNED_CERT\); nothing was sent/);
    expect(emu.counters.requests).toBe(before); // the emulator never saw a request, so never the token
  });

  it("the account takes only an https origin, a USER@REALM!TOKENID token id and a valid pin", () => {
    const base = { node: "pve", tokenId: "bc@pve!compute", tokenSecret: "s" };
    const problems = (a: Record<string, unknown>) => {
      const parsed = proxmoxProvider.manifest.safeParse(a);
      return parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
    };
    expect(problems({ ...base, baseUrl: "https://pve.example.com:8006" })).toEqual([]);
    expect(problems({ ...base, baseUrl: "https://pve.example.com:8006/api2/json" })).toEqual([]);
    expect(problems({ ...base, baseUrl: "http://pve.example.com:8006" })).toEqual([
      "baseUrl: must be https: (the Proxmox API is served over HTTPS only)",
    ]);
    expect(problems({ ...base, baseUrl: "https://pve:8006", tokenId: "bc@pve" })).toEqual([
      "tokenId: must be USER@REALM!TOKENID, e.g. bc@pve!compute",
    ]);
    expect(problems({ ...base, baseUrl: "https://pve:8006", tls: { spkiSha256: "nope" } })).toHaveLength(1);
    expect(proxmoxProvider.secretFields).toEqual(["tokenSecret"]);
  });
});
