// Chaos on the node, through the real agent: `bcd start --role node` (the node role converging its
// NodeSpec with the qemu-microvm runtime) against FakeNodeServer, SIGKILLed by its test hook
// (BC_TEST_CRASH_AT, agent/bcd.ts) at each step of create, stop and delete, then started again
// without the hook. Like the NodeDO, the fake control plane sends the current spec after every
// welcome; a restarted bcd also converges the spec it saved. Every QEMU started for the guest's
// work dir is counted by a wrapper put first on bcd's PATH (it execs the real QEMU), so a second
// boot cannot go unseen. Real guests (TCG), two boots in all.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeNodeServer } from "../../testing/fake-server.ts";
import { startBcd, type BcdExit } from "../../local/bcd-process.ts";
import type { CrashStep, InstanceObserved } from "../../agent/runtimes/index.ts";
import { processesNaming } from "../../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage } from "../../agent/runtimes/microvm/image.ts";
import { deleteNetns, netnsExists } from "../../agent/runtimes/microvm/network.ts";
import type { NodeSpec, NodeStatus } from "../../core/protocol.ts";

const base = mkdtempSync(path.join(tmpdir(), "bc-bcdchaos-"));
const stateDir = path.join(base, "state");
const runtimeDir = path.join(base, "rt");
const bin = path.join(base, "bin");
const vmmStarts = path.join(base, "vmm-starts");
const name = `bcdchaos-${Math.random().toString(16).slice(2, 6)}`;
const workDir = path.join(runtimeDir, "qemu-microvm", name);
const BCD_TIMEOUT_MS = 240_000;

let server: FakeNodeServer;
let nodeId: string | undefined;
/** What the control plane wants now: sent after every welcome (the NodeDO does). */
let current: NodeSpec | undefined;
let welcomed = 0;
let specSender: ReturnType<typeof setInterval> | undefined;
const children = new Set<number>();

const userData = Buffer.from("#!/bin/sh\necho bcd chaos guest\n");
const userDataSha256 = createHash("sha256").update(userData).digest("hex");

function instance(desired: "running" | "stopped") {
  return {
    name,
    runtime: "qemu-microvm",
    desired,
    vcpus: 1,
    memory: "128M",
    disk: "256M",
    image: "bc-guest",
    userData: userData.toString("base64"),
    userDataSha256,
  };
}

/** The control plane changes the spec: sent now to the connected bcd, and after every later welcome. */
function publish(spec: NodeSpec): void {
  current = spec;
  if (nodeId) server.sendRaw(nodeId, JSON.stringify({ t: "spec", ...spec }));
}

interface Bcd {
  exited: Promise<BcdExit>;
  stderr: () => string;
  kill: (signal: NodeJS.Signals) => void;
}

/** A real bcd node, killed by its test hook at crashAt when given. */
function bcd(crashAt?: CrashStep): Bcd {
  const run = startBcd({
    url: server.url,
    role: "node",
    stateDir,
    token: server.token(),
    args: ["--runtime-dir", runtimeDir, "--quiet"],
    // The counting QEMU first on its PATH; the crash hook only when armed, never inherited.
    env: { PATH: `${bin}:${process.env.PATH}`, BC_TEST_CRASH_AT: crashAt },
  });
  const pid = run.process.pid!;
  children.add(pid);
  const exited = run.exited.finally(() => children.delete(pid));
  return { exited, stderr: () => run.output("stderr").slice(-8000), kill: (signal) => run.process.kill(signal) };
}

/** Starts bcd armed to die at step and waits until it has: reaching the step is the only way it dies by SIGKILL. */
async function killedAt(step: CrashStep): Promise<void> {
  const run = bcd(step);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), BCD_TIMEOUT_MS)));
  const outcome = await Promise.race([run.exited, late]);
  clearTimeout(timer);
  if (outcome === "late") {
    run.kill("SIGKILL");
    await run.exited;
    throw new Error(`bcd did not reach ${step} within ${BCD_TIMEOUT_MS} ms: ${run.stderr()}`);
  }
  expect(outcome, `bcd armed at ${step} ended otherwise: ${run.stderr()}`).toEqual({ code: null, signal: "SIGKILL" });
}

/** The latest status of `generation` the agent sent after frame number `from`. */
function statusOf(generation: number, from: number): NodeStatus | undefined {
  return server.received
    .slice(from)
    .filter((r) => r.nodeId === nodeId && r.text.startsWith('{"t":"status"'))
    .map((r) => JSON.parse(r.text) as NodeStatus)
    .filter((s) => s.generation === generation)
    .at(-1);
}

/** Starts bcd unarmed, waits for it to report `generation` converged as expected, then stops it (SIGTERM: the guests keep running). */
async function converges(generation: number, expected: Record<string, unknown>): Promise<void> {
  const from = server.received.length;
  const run = bcd();
  try {
    await expect
      .poll(() => statusOf(generation, from)?.sections.instances, { timeout: BCD_TIMEOUT_MS, interval: 500 })
      .toMatchObject({ entries: expected });
    expect(statusOf(generation, from)!.sections.instances!.error).toBeUndefined();
  } finally {
    run.kill("SIGTERM");
    expect(await run.exited, run.stderr()).toEqual({ code: 0, signal: null });
  }
}

/** QEMU processes ever started for the guest's work dir. */
const boots = () => (existsSync(vmmStarts) ? readFileSync(vmmStarts, "utf8").split("\n").filter(Boolean).length : 0);

async function leftovers(): Promise<string[]> {
  const left = (await processesNaming(workDir)).map((pid) => `vmm pid ${pid}`);
  if (existsSync(workDir)) left.push("work dir");
  if (await netnsExists(`bc-${name}`)) left.push("netns");
  return left;
}

beforeAll(async () => {
  await ensureGuestImage(); // built once and cached: bcd finds it in the same cache
  server = await FakeNodeServer.start();
  // After each welcome the current spec goes to the new connection (helloAt is set in the same tick the welcome is sent).
  specSender = setInterval(() => {
    for (const conn of server.connections.slice(welcomed)) {
      if (!conn.helloAt && !conn.closedAt) break;
      welcomed++;
      if (!conn.helloAt || !conn.nodeId) continue;
      nodeId = conn.nodeId;
      if (current) publish(current);
    }
  }, 20);
  const qemu = execFileSync("sh", ["-c", "command -v qemu-system-x86_64"], { encoding: "utf8" }).trim();
  mkdirSync(bin);
  writeFileSync(
    path.join(bin, "qemu-system-x86_64"),
    `#!/bin/sh\n# Counts each QEMU started for the guest's work dir, then becomes the real QEMU (same pid, same command line).\ncase "$*" in *"${workDir}/"*) echo "$$" >> "${vmmStarts}" ;; esac\nexec "${qemu}" "$@"\n`,
  );
  chmodSync(path.join(bin, "qemu-system-x86_64"), 0o755);
}, 900_000);

afterAll(async () => {
  clearInterval(specSender);
  for (const pid of children) process.kill(pid, "SIGKILL");
  for (const pid of await processesNaming(base)) process.kill(pid, "SIGKILL");
  await deleteNetns(`bc-${name}`);
  await server?.close();
  rmSync(base, { recursive: true, force: true });
});

describe("bcd (the node role) killed at every step of create, stop and delete", () => {
  it("create: bcd killed at each step in turn carries on from its saved spec; the guest runs, booted once", async () => {
    publish({ generation: 1, sections: { instances: { [name]: instance("running") } } });
    // "report" is killed in the run that boots the guest (the one after "start"); "started" is killed on the second boot below.
    for (const step of ["workdir", "seed", "disk", "netns", "start", "report"] as const) await killedAt(step);
    expect(boots()).toBe(1);
    await converges(1, { [name]: { state: "running", report: { instanceId: name, hostname: name, userDataSha256 } } });
    expect(boots()).toBe(1);
  }, 1_800_000);

  it("stop: bcd killed after asking the guest and after it stopped; the guest ends stopped, its VMM gone, never booted again", async () => {
    publish({ generation: 2, sections: { instances: { [name]: instance("stopped") } } });
    await killedAt("stop-requested");
    await killedAt("stopped");
    await converges(2, { [name]: { state: "stopped" } });
    expect(await leftovers()).toEqual(["work dir", "netns"]);
    expect(boots()).toBe(1);
  }, 1_200_000);

  it("start again: bcd killed right after starting the VMM adopts the booting guest on restart; booted a second time only", async () => {
    publish({ generation: 3, sections: { instances: { [name]: instance("running") } } });
    await killedAt("started");
    await converges(3, { [name]: { state: "running", report: { instanceId: name, userDataSha256 } } });
    expect(boots()).toBe(2);
  }, 1_200_000);

  it("delete: bcd killed after asking, after the VMM is gone and after the netns is deleted; then nothing is left", async () => {
    publish({ generation: 4, sections: { instances: {} } });
    await killedAt("stop-requested");
    await killedAt("stopped");
    await killedAt("netns-removed");
    expect(await leftovers()).toEqual(["work dir"]); // the VMM and the netns went first, the work dir last
    await converges(4, {});
    expect(statusOf(4, 0)!.sections.instances!.entries).toEqual({});
    expect(await leftovers()).toEqual([]);
    expect(boots()).toBe(2);
  }, 1_200_000);
});
