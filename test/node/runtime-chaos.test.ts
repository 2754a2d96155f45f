// Chaos on the node: the runtime runs in a child process that SIGKILLs itself at a named step of
// apply, stop or remove (the core's crashPoint hook). After each kill a fresh runtime carries on
// from what is on disk; in the end the guest converges, it was never booted twice (VMM starts are
// counted in a file outside the runtime's root), and after remove nothing is left: no VMM process,
// no work dir, no network namespace. Real QEMU guests (TCG), two boots in all.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CrashStep, InstanceObserved, InstanceSpec } from "../../agent/runtimes/index.ts";
import { processesNaming } from "../../agent/runtimes/microvm/helpers.ts";
import { ensureGuestImage, type GuestImage } from "../../agent/runtimes/microvm/image.ts";
import { deleteNetns, netnsExists } from "../../agent/runtimes/microvm/network.ts";

const repo = path.resolve(import.meta.dirname, "../..");
const base = mkdtempSync(path.join(tmpdir(), "bc-chaos-"));
const root = path.join(base, "root");
const countFile = path.join(base, "starts");
const script = path.join(base, "child.mts");
const name = `chaos-${Math.random().toString(16).slice(2, 6)}`;
let image: GuestImage;

// The child: one runtime, one action, killed by itself at CRASH_AT.
const CHILD = `
import { appendFileSync } from "node:fs";
import { MicroVmRuntime, QemuBackend } from ${JSON.stringify(path.join(repo, "agent/runtimes/index.ts"))};
const env = process.env;
const inner = new QemuBackend({ accel: "tcg" });
const backend = {
  id: inner.id,
  probe: () => inner.probe(),
  start: async (launch) => (appendFileSync(env.COUNT_FILE, launch.name + "\\n"), inner.start(launch)),
  requestShutdown: (dir) => inner.requestShutdown(dir),
  attach: (dir) => inner.attach(dir),
  exitReason: (dir) => inner.exitReason(dir),
};
const runtime = new MicroVmRuntime({
  root: env.ROOT,
  images: { "bc-guest": JSON.parse(env.IMAGE) },
  backend,
  crashPoint: (step) => { if (step === env.CRASH_AT) process.kill(process.pid, "SIGKILL"); },
});
const spec = JSON.parse(env.SPEC);
const result = env.ACTION === "remove" ? (await runtime.remove(spec.name), { removed: true }) : await runtime.apply(spec);
await runtime.close();
console.log(JSON.stringify(result));
`;

function spec(desired: "running" | "stopped"): InstanceSpec {
  const userData = Buffer.from("#!/bin/sh\necho chaos guest\n");
  return {
    name,
    desired,
    vcpus: 1,
    memory: "128M",
    disk: "256M",
    image: "bc-guest",
    userData: userData.toString("base64"),
    userDataSha256: createHash("sha256").update(userData).digest("hex"),
  };
}

/** Runs one action in a child; resolves its result, or "killed" when it died at its crash point. */
function child(action: "apply" | "remove", desired: "running" | "stopped", crashAt?: CrashStep): Promise<InstanceObserved | "killed"> {
  const env = {
    ...process.env,
    ROOT: root,
    COUNT_FILE: countFile,
    IMAGE: JSON.stringify(image),
    SPEC: JSON.stringify(spec(desired)),
    ACTION: action,
    CRASH_AT: crashAt ?? "",
  };
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--import", "tsx", script], { cwd: repo, env, timeout: 240_000 }, (err, stdout, stderr) => {
      if (err && (err as { signal?: string }).signal === "SIGKILL" && crashAt) return resolve("killed");
      if (err) return reject(new Error(`child ${action} failed: ${stderr || err.message}`));
      if (crashAt) return reject(new Error(`the child passed ${crashAt} without reaching it`));
      resolve(JSON.parse(stdout.trim().split("\n").pop()!) as InstanceObserved);
    });
  });
}

const starts = () =>
  existsSync(countFile)
    ? readFileSync(countFile, "utf8")
        .split("\n")
        .filter((l) => l === name).length
    : 0;

async function leftovers(): Promise<string[]> {
  const dir = path.join(root, name);
  const left = (await processesNaming(dir)).map((pid) => `vmm pid ${pid}`);
  if (existsSync(dir)) left.push("work dir");
  if (await netnsExists(`bc-${name}`)) left.push("netns");
  return left;
}

beforeAll(async () => {
  image = await ensureGuestImage();
  writeFileSync(script, CHILD);
}, 900_000);

afterAll(async () => {
  for (const pid of await processesNaming(base)) process.kill(pid, "SIGKILL");
  await deleteNetns(`bc-${name}`);
  rmSync(base, { recursive: true, force: true });
});

describe("bcd killed at every step of create, stop and delete", () => {
  it("create: killed after each step in turn, a fresh runtime carries on; the guest runs and was booted once", async () => {
    const steps: CrashStep[] = ["workdir", "seed", "disk", "netns", "start", "started", "report"];
    for (const step of steps) expect(await child("apply", "running", step), step).toBe("killed");
    const o = await child("apply", "running");
    expect(o).toMatchObject({ state: "running", report: { instanceId: name, userDataSha256: spec("running").userDataSha256 } });
    expect(starts()).toBe(1);
  }, 600_000);

  it("stop: killed after asking and after stopping, the guest ends stopped; started again it boots a second time only", async () => {
    expect(await child("apply", "stopped", "stop-requested")).toBe("killed");
    expect(await child("apply", "stopped", "stopped")).toBe("killed");
    expect(await child("apply", "stopped")).toMatchObject({ state: "stopped" });
    expect(await processesNaming(path.join(root, name))).toEqual([]);
    expect(await child("apply", "running")).toMatchObject({ state: "running" });
    expect(starts()).toBe(2);
  }, 600_000);

  it("delete: killed after asking, after the VMM is gone and after the netns is deleted; then nothing is left", async () => {
    expect(await child("remove", "running", "stop-requested")).toBe("killed");
    expect(await child("remove", "running", "stopped")).toBe("killed");
    expect(await child("remove", "running", "netns-removed")).toBe("killed");
    expect(await leftovers()).toEqual(["work dir"]); // the VMM and the netns went first, the work dir last
    expect(await child("remove", "running")).toEqual({ removed: true });
    expect(await leftovers()).toEqual([]);
    expect(starts()).toBe(2);
  }, 600_000);
});
