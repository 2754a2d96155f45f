// runtimeConformanceCases(): what every RuntimeDriver must do, as plain { name, run } cases run
// against a subject (core/conformance's runner). A subject is one runtime over a fresh state
// directory plus a few ways to look at the host it runs on (VMM starts, leftovers). The cases boot
// real guests: each boot costs seconds of CPU under TCG, so the checks share boots where honest.
import { createHash } from "node:crypto";
import type { ConformanceCase } from "../../core/conformance/index.ts";
import { AgentError } from "../contracts.ts";
import type { InstanceObserved, InstanceSpec, RuntimeDriver } from "./contract.ts";

export interface RuntimeSubject {
  runtime: RuntimeDriver;
  /** Closes the runtime and opens a new one over the same state: an agent restart. Later calls use `runtime`. */
  reopen(): Promise<RuntimeDriver>;
  /** A valid spec (desired running) whose user data is a `#!/bin/sh` script; a fresh name when none is given. */
  spec(name?: string): InstanceSpec;
  /** How many times a VMM was started for this guest (by any runtime over this state). */
  starts(name: string): Promise<number>;
  /** What a guest left on the host: e.g. "vmm pid 123", "work dir", "netns bc-x". Empty when nothing. */
  leftovers(name: string): Promise<string[]>;
}

/** The spec with other user data (base64 and sha256 kept consistent). */
export function withUserData(spec: InstanceSpec, text: string): InstanceSpec {
  const bytes = Buffer.from(text);
  return { ...spec, userData: bytes.toString("base64"), userDataSha256: createHash("sha256").update(bytes).digest("hex") };
}

export function runtimeConformanceCases(): ConformanceCase<RuntimeSubject>[] {
  return [
    {
      name: "boots once, reports its identity and host keys, keeps its console bounded, and is removed without leftovers",
      async run(s) {
        const spec = s.spec();
        const o = await s.runtime.apply(spec);
        expectRunning(o, spec);
        const again = await s.runtime.apply(spec);
        check(again.state === "running", `a second apply answered ${again.state}`);
        check((await s.starts(spec.name)) === 1, `apply twice started the VMM ${await s.starts(spec.name)} times`);
        check((await s.runtime.observe(spec.name)).state === "running", "observe does not say running");
        check(
          (await s.runtime.list()).some((g) => g.name === spec.name && g.state === "running"),
          "list does not show the guest",
        );
        const tail = await s.runtime.console(spec.name, 64);
        check(Buffer.byteLength(tail) <= 64, `console(64) returned ${Buffer.byteLength(tail)} bytes`);
        check((await s.runtime.console(spec.name, 64 * 1024)).includes("bc-report"), "the console does not hold the guest's report");
        await s.runtime.remove(spec.name);
        const left = await s.leftovers(spec.name);
        check(left.length === 0, `remove left ${left.join(", ")}`);
        check((await s.runtime.observe(spec.name)).state === "absent", "a removed guest is not absent");
        await s.runtime.remove(spec.name); // removing an absent guest succeeds
      },
    },
    {
      name: "stops, starts again, and reboots with the same seed",
      async run(s) {
        const spec = s.spec();
        expectRunning(await s.runtime.apply(spec), spec);
        const stopped = await s.runtime.apply({ ...spec, desired: "stopped" });
        check(stopped.state === "stopped" && stopped.reason === "requested", `stop answered ${describe(stopped)}`);
        check(!(await s.leftovers(spec.name)).some((l) => l.startsWith("vmm")), "a stopped guest's VMM still runs");
        const started = await s.runtime.apply(spec);
        expectRunning(started, spec);
        check((await s.starts(spec.name)) === 2, `start after stop: ${await s.starts(spec.name)} VMM starts, not 2`);
        const rebooted = await s.runtime.apply({ ...spec, rebootCount: 1 });
        expectRunning(rebooted, spec);
        check(rebooted.rebootCount === 1, `rebootCount ${rebooted.rebootCount} after a reboot`);
        check((await s.starts(spec.name)) === 3, `a reboot: ${await s.starts(spec.name)} VMM starts, not 3`);
        check(
          (await s.runtime.apply({ ...spec, rebootCount: 1 })).state === "running" && (await s.starts(spec.name)) === 3,
          "the same rebootCount rebooted again",
        );
        await s.runtime.remove(spec.name);
      },
    },
    {
      name: "a restarted runtime adopts a running guest and never boots it again",
      async run(s) {
        const spec = s.spec();
        const first = await s.runtime.apply(spec);
        expectRunning(first, spec);
        const runtime = await s.reopen();
        const listed = await runtime.list();
        check(
          listed.some((g) => g.name === spec.name && g.state === "running"),
          `after a restart the guest is ${JSON.stringify(listed)}`,
        );
        const again = await runtime.apply(spec);
        expectRunning(again, spec);
        check(JSON.stringify(again.report) === JSON.stringify(first.report), "the adopted guest's report changed");
        check((await s.starts(spec.name)) === 1, `adoption started the VMM again (${await s.starts(spec.name)} starts)`);
        await runtime.remove(spec.name);
        const left = await s.leftovers(spec.name);
        check(left.length === 0, `remove after adoption left ${left.join(", ")}`);
      },
    },
    {
      name: "a guest that powers off is noticed, with reason guest_poweroff",
      async run(s) {
        const spec = withUserData(s.spec(), "#!/bin/sh\nsleep 1\npoweroff -f\n");
        const seen = new Promise<InstanceObserved>((resolve) => {
          const stop = s.runtime.watch((o) => {
            if (o.name === spec.name && o.state !== "running" && o.state !== "booting") (resolve(o), stop());
          });
        });
        expectRunning(await s.runtime.apply(spec), spec);
        const gone = await within(seen, 30_000, "the guest's poweroff was not noticed within 30 s");
        check(gone.state === "stopped" && gone.reason === "guest_poweroff", `a guest poweroff was reported as ${describe(gone)}`);
        check((await s.runtime.observe(spec.name)).reason === "guest_poweroff", "observe does not keep the reason");
        check((await s.leftovers(spec.name)).includes("work dir"), "the work dir went with the VMM; only remove deletes it");
        await s.runtime.remove(spec.name);
      },
    },
    {
      name: "a spec without user data is refused before anything exists",
      async run(s) {
        const spec = { ...s.spec(), userData: "", userDataSha256: "" };
        await expectCode(s.runtime.apply(spec), "INVALID_ARGUMENT");
        const left = await s.leftovers(spec.name);
        check(left.length === 0, `a refused spec left ${left.join(", ")}`);
        check((await s.starts(spec.name)) === 0, "a refused spec started a VMM");
      },
    },
    {
      name: "an unparseable size is refused, never defaulted",
      async run(s) {
        const spec = s.spec();
        for (const bad of [{ memory: "lots" }, { memory: "1.5G" }, { disk: "-1G" }, { disk: "10X" }, { vcpus: 0 }, { vcpus: "two" }]) {
          await expectCode(s.runtime.apply({ ...spec, ...bad } as InstanceSpec), "INVALID_ARGUMENT");
        }
        check((await s.leftovers(spec.name)).length === 0, "a refused size left something behind");
      },
    },
  ];
}

function expectRunning(o: InstanceObserved, spec: InstanceSpec): void {
  check(o.state === "running", `the guest is ${describe(o)}`);
  const r = o.report;
  check(!!r, "no guest report");
  check(r!.instanceId === spec.name, `instanceId ${r!.instanceId} is not ${spec.name}`);
  check(r!.hostname === spec.name, `hostname ${r!.hostname} is not ${spec.name}`);
  check(r!.userDataSha256 === spec.userDataSha256, "the guest's user data sha256 differs from the stored one");
  check(
    r!.hostKeys.length > 0 && r!.hostKeys.every((k) => /^(ssh-ed25519|ecdsa-sha2-nistp\d+|ssh-rsa) AAAA[A-Za-z0-9+/=]+/.test(k)),
    "no SSH host keys",
  );
}

function describe(o: InstanceObserved): string {
  return `${o.state}${o.reason ? ` (${o.reason})` : ""}${o.message ? `: ${o.message}` : ""}`;
}

function check(ok: boolean, message: string): void {
  if (!ok) throw new Error(message);
}

async function expectCode(p: Promise<unknown>, code: string): Promise<void> {
  try {
    await p;
  } catch (e) {
    if (e instanceof AgentError && e.code === code) return;
    throw new Error(`expected ${code}, got ${e instanceof AgentError ? e.code : String(e)}`);
  }
  throw new Error(`expected ${code}, but it succeeded`);
}

async function within<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(message)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
