// The node role's converger (agent/roles/node.ts) on its own, in Node: the desired NodeSpec is
// saved (FileState) before it is converged, so a converger stopped mid-pass converges it again
// after a restart with no control plane at all; the access file; sections and runtimes the node
// does not have; the runtime's watch; and the AgentClient's spec and status frames. Guests are
// SIMULATED (testing/simulated-runtime.ts): no VMM runs here.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { AgentClient } from "../../agent/client.ts";
import { FakeNodeServer } from "../../testing/fake-server.ts";
import { startBcd } from "../../local/bcd-process.ts";
import { FileState, writeAtomic } from "../../agent/file-state.ts";
import { nodeTransport } from "../../agent/node-transport.ts";
import { nodeRole, type NodeRole, type NodeRoleOptions } from "../../agent/roles/node.ts";
import { MemoryState } from "../../agent/state.ts";
import { simulatedRuntime } from "../../testing/simulated-runtime.ts";
import { sha256Hex } from "../../core/encoding.ts";
import type { NodeSpec, NodeStatus } from "../../core/protocol.ts";

const silent = { info() {}, warn() {}, error() {} };
const dirs: string[] = [];
const roles: NodeRole[] = [];

afterEach(async () => {
  await Promise.all(roles.splice(0).map((r) => r.stop()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "bc-node-role-"));
  dirs.push(dir);
  return dir;
}

function role(opts: Partial<NodeRoleOptions> & Pick<NodeRoleOptions, "state" | "runtimes">): { role: NodeRole; statuses: NodeStatus[] } {
  const statuses: NodeStatus[] = [];
  const r = nodeRole({ log: silent, report: (s) => statuses.push(s), ...opts });
  roles.push(r);
  return { role: r, statuses };
}

async function instance(name: string, runtime = "simulated") {
  const userData = Buffer.from(`#!/bin/sh\necho ${name}\n`).toString("base64");
  return {
    name,
    runtime,
    desired: "running",
    vcpus: 1,
    memory: "256MiB",
    disk: "1GiB",
    image: "bc-guest",
    userData,
    userDataSha256: await sha256Hex(`#!/bin/sh\necho ${name}\n`),
  };
}

const KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGz6Yk2c1oYQ4z4Qm0Zq0bR0bY1s7zQ6m3m8kFh3o1Zr";
const KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3l1vX7f0qfWcJm2g9H0o4r1m2Yp6V8kD5aQ9s3t2Uw";

describe("the node role", () => {
  it("saves the spec before converging: stopped mid-boot and restarted, it converges the saved spec without the control plane, booting nothing twice", async () => {
    const dir = await tempDir();
    const runtime = simulatedRuntime({ bootDelayMs: 60_000 });
    const desired: NodeSpec = { generation: 4, sections: { instances: { "i-slow": await instance("i-slow") } } };

    const first = role({ state: new FileState(dir), runtimes: [runtime] });
    await first.role.start();
    await first.role.onSpec(desired);
    await expect.poll(() => runtime.boots).toEqual(["i-slow"]);
    await first.role.stop(); // the agent dies while the guest boots
    expect(first.statuses).toEqual([]);
    expect(JSON.parse(await readFile(path.join(dir, "spec.json"), "utf8"))).toEqual(desired);

    // A new process: a new state store over the same directory, no control plane, the guest still there.
    runtime.bootDelayMs = 10;
    const second = role({ state: new FileState(dir), runtimes: [runtime] });
    await second.role.start();
    await second.role.idle();
    expect(second.statuses.at(-1)).toMatchObject({
      generation: 4,
      sections: { instances: { entries: { "i-slow": { state: "running", report: { hostname: "i-slow" } } } } },
    });
    expect(runtime.boots).toEqual(["i-slow"]);
  });

  it("writes the access section as the authorized_keys file, one line per key with its name, and nothing else", async () => {
    const dir = await tempDir();
    const file = path.join(dir, "authorized_keys");
    const { role: r, statuses } = role({ state: new MemoryState(), runtimes: [], accessFile: { path: file, write: writeAtomic } });
    await r.start();
    await r.onSpec({
      generation: 1,
      sections: {
        access: { bob: { publicKey: KEY_B }, alice: { publicKey: KEY_A }, mallory: { publicKey: `${KEY_A}\nssh-rsa AAAA evil` } },
      },
    });
    await r.idle();
    expect(await readFile(file, "utf8")).toBe(`${KEY_A} alice\n${KEY_B} bob\n`);
    expect(statuses.at(-1)!.sections.access!.entries).toEqual({
      alice: { publicKey: KEY_A },
      bob: { publicKey: KEY_B },
      mallory: { error: { code: "INVALID_ARGUMENT", message: expect.any(String) } },
    });

    await r.onSpec({ generation: 2, sections: { access: { alice: { publicKey: KEY_A } } } });
    await r.idle();
    expect(await readFile(file, "utf8")).toBe(`${KEY_A} alice\n`);
    // An older generation arriving late changes nothing.
    await r.onSpec({ generation: 1, sections: { access: { bob: { publicKey: KEY_B } } } });
    await r.idle();
    expect(await readFile(file, "utf8")).toBe(`${KEY_A} alice\n`);
  });

  it("reports a section it has no handler for, and an instance on a runtime it does not have, as UNSUPPORTED", async () => {
    const { role: r, statuses } = role({ state: new MemoryState(), runtimes: [simulatedRuntime()] });
    await r.start();
    await r.onSpec({
      generation: 1,
      sections: {
        devices: { gpu0: { model: "x" } },
        instances: { "i-ok": await instance("i-ok"), "i-fc": await instance("i-fc", "firecracker") },
        access: { alice: { publicKey: KEY_A } },
      },
    });
    await r.idle();
    const { sections } = statuses.at(-1)!;
    expect(sections.devices!.error?.code).toBe("UNSUPPORTED");
    // No access file on this node.
    expect(sections.access!.error?.code).toBe("UNSUPPORTED");
    expect(sections.instances!.entries["i-ok"]).toMatchObject({ state: "running" });
    expect(sections.instances!.entries["i-fc"]).toMatchObject({ state: "failed", error: { code: "UNSUPPORTED" } });
  });

  it("converges the latest spec: a spec arriving mid-pass makes one more pass; guests not wanted are removed; at most two boot at once", async () => {
    const runtime = simulatedRuntime({ bootDelayMs: 30 });
    let booting = 0;
    let most = 0;
    const apply = runtime.apply.bind(runtime);
    runtime.apply = async (spec, signal) => {
      most = Math.max(most, ++booting);
      try {
        return await apply(spec, signal);
      } finally {
        booting--;
      }
    };
    const { role: r, statuses } = role({ state: new MemoryState(), runtimes: [runtime] });
    await r.start();
    const names = ["i-1", "i-2", "i-3", "i-4", "i-5"];
    const five = Object.fromEntries(await Promise.all(names.map(async (n) => [n, await instance(n)] as const)));
    await r.onSpec({ generation: 1, sections: { instances: five } });
    await r.onSpec({ generation: 2, sections: { instances: { "i-1": five["i-1"] } } });
    await r.idle();
    expect(most).toBe(2);
    expect(statuses.at(-1)!.generation).toBe(2);
    expect(Object.keys(statuses.at(-1)!.sections.instances!.entries)).toEqual(["i-1"]);
    expect((await runtime.list()).map((g) => g.name)).toEqual(["i-1"]);
  });

  it("reports a guest the runtime's watch saw stop, without a pass", async () => {
    const runtime = simulatedRuntime();
    const { role: r, statuses } = role({ state: new MemoryState(), runtimes: [runtime] });
    await r.start();
    await r.onSpec({ generation: 1, sections: { instances: { "i-w": await instance("i-w") } } });
    await r.idle();
    const before = statuses.length;
    runtime.powerOff("i-w");
    expect(statuses).toHaveLength(before + 1);
    expect(statuses.at(-1)).toMatchObject({
      generation: 1,
      sections: { instances: { entries: { "i-w": { state: "stopped", reason: "guest_poweroff" } } } },
    });
    expect(runtime.boots).toEqual(["i-w"]);
  });
});

describe("AgentClient: spec in, status out", () => {
  let server: FakeNodeServer;
  beforeAll(async () => {
    server = await FakeNodeServer.start();
  });
  afterAll(() => server.close());

  it("hands a spec frame (larger than MAX_FRAME_BYTES) to onSpec, and sends the latest status again after every reconnect", async () => {
    const c = new AgentClient({
      transport: nodeTransport(),
      state: new MemoryState(),
      baseUrl: server.url,
      backoff: { initialMs: 10, maxMs: 80, healthyAfterMs: 200 },
    });
    try {
      const { nodeId } = await c.join({ attestor: "join-token", evidence: { token: server.token() }, role: "node" });
      const specs: NodeSpec[] = [];
      c.onSpec((s) => specs.push(s));
      void c.run().catch(() => {});
      await c.waitConnected(5_000);

      const big = { generation: 7, sections: { blobs: { a: "x".repeat(100 * 1024) } } };
      server.sendRaw(nodeId, JSON.stringify({ t: "spec", ...big }));
      await expect.poll(() => specs.length).toBe(1);
      expect(specs[0]!.generation).toBe(7);
      expect((specs[0]!.sections.blobs!.a as string).length).toBe(100 * 1024);

      const statusFrames = () => server.received.filter((r) => r.nodeId === nodeId && r.text.startsWith('{"t":"status"'));
      c.sendStatus({ generation: 6, sections: {} });
      c.sendStatus({ generation: 7, sections: { blobs: { entries: {}, error: { code: "UNSUPPORTED", message: "no" } } } });
      await expect.poll(() => statusFrames().length).toBe(2);

      c.dropConnection();
      await expect.poll(() => statusFrames().length, { timeout: 5_000 }).toBe(3);
      expect(JSON.parse(statusFrames().at(-1)!.text)).toMatchObject({ t: "status", generation: 7 });
    } finally {
      await c.stop({ graceMs: 50 });
    }
  });
});

describe("bcd run as a node", () => {
  let server: FakeNodeServer;
  beforeAll(async () => {
    server = await FakeNodeServer.start();
  });
  afterAll(() => server.close());

  it("reports the host's resources, writes the access file from the spec it is sent, saves the spec and reports its status", async () => {
    const dir = await tempDir();
    const stateDir = path.join(dir, "state");
    const accessFile = path.join(dir, "authorized_keys");
    const bcd = startBcd({
      url: server.url,
      role: "node",
      stateDir,
      token: server.token(),
      args: ["--access-file", accessFile, "--quiet"],
    });
    try {
      await expect.poll(() => server.hellos.length, { timeout: 30_000 }).toBeGreaterThan(0);
      const hello = server.hellos.at(-1)!;
      expect(hello.frame.role).toBe("node");
      expect(hello.frame.resources).toMatchObject({ cpus: expect.any(Number), memoryMiB: expect.any(Number), diskGiB: expect.any(Number) });
      expect(hello.frame.resources!.cpus).toBeGreaterThan(0);

      server.sendRaw(hello.nodeId, JSON.stringify({ t: "spec", generation: 3, sections: { access: { alice: { publicKey: KEY_A } } } }));
      await expect.poll(() => readFile(accessFile, "utf8").catch(() => ""), { timeout: 10_000 }).toBe(`${KEY_A} alice\n`);
      expect(JSON.parse(await readFile(path.join(stateDir, "spec.json"), "utf8")).generation).toBe(3);
      const status = () => server.received.filter((r) => r.nodeId === hello.nodeId && r.text.startsWith('{"t":"status"'));
      await expect.poll(() => status().length, { timeout: 10_000 }).toBeGreaterThan(0);
      expect(JSON.parse(status().at(-1)!.text)).toMatchObject({
        generation: 3,
        sections: { access: { entries: { alice: { publicKey: KEY_A } } } },
      });
    } finally {
      bcd.process.kill("SIGTERM");
      expect((await bcd.exited).code, bcd.output("stderr")).toBe(0);
    }
  });
});
