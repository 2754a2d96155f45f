// SIMULATED: a RuntimeDriver that runs no guest at all. It keeps its "guests" in memory, moves
// each from booting to running after a configurable delay, and answers a GuestReport computed
// from the spec (instance id, hostname, the sha256 of the user data it was given) with a fake
// host key. For FakeDaemon hosts (FakeDaemon's `node` option) and the node role's tests, where a
// host must converge NodeSpecs without a VMM; the real runtimes boot real guests (docs/nodespec.md).
// Its state lives as long as the object: pass the same one to a restarted agent to model guests
// that outlive the agent.
import { AgentError } from "../agent/contracts.ts";
import type { GuestReport, InstanceObserved, InstanceSpec, RuntimeDriver, RuntimeProbe } from "../agent/runtimes/contract.ts";

export interface SimulatedRuntimeOptions {
  /** The driver id (hello driver, bc.dev/driver.<id>). Default "simulated". */
  id?: string;
  /** How long a guest boots before it reports (ms). Default 20. */
  bootDelayMs?: number;
}

export interface SimulatedRuntime extends RuntimeDriver {
  /** Every boot, in order (a guest booted twice appears twice). */
  readonly boots: string[];
  /** Every removal, in order. */
  readonly removed: string[];
  /** How long a guest boots (ms); change it to make later boots slower or faster. */
  bootDelayMs: number;
  /** SIMULATED: the guest powers itself off; the watch hears it (reason guest_poweroff). */
  powerOff(name: string): void;
}

async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

const base64Bytes = (text: string) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

export function simulatedRuntime(opts: SimulatedRuntimeOptions = {}): SimulatedRuntime {
  const id = opts.id ?? "simulated";
  const guests = new Map<string, InstanceObserved>();
  const listeners = new Set<(observed: InstanceObserved) => void>();
  const boots: string[] = [];
  const removed: string[] = [];

  const set = (name: string, patch: Omit<InstanceObserved, "name" | "since">): InstanceObserved => {
    const observed: InstanceObserved = { name, vmm: `${id}/simulated`, ...patch, since: new Date().toISOString() };
    guests.set(name, observed);
    return { ...observed };
  };

  const wait = (ms: number, signal?: AbortSignal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const timer = setTimeout(() => (signal?.removeEventListener("abort", onAbort), resolve()), ms);
      const onAbort = () => (clearTimeout(timer), reject(signal!.reason));
      signal?.addEventListener("abort", onAbort, { once: true });
    });

  const runtime: SimulatedRuntime = {
    id,
    version: "simulated",
    bootDelayMs: opts.bootDelayMs ?? 20,
    boots,
    removed,
    async probe(): Promise<RuntimeProbe> {
      return { ok: true, detail: "SIMULATED: no guest runs; states and reports are made up" };
    },
    async apply(spec: InstanceSpec, signal?: AbortSignal) {
      if (!/^[a-z0-9-]{1,63}$/.test(spec.name))
        throw new AgentError("INVALID_ARGUMENT", `instance name ${spec.name} is not [a-z0-9-]{1,63}`);
      const current = guests.get(spec.name);
      const rebootCount = spec.rebootCount ?? 0;
      if (spec.desired === "stopped") {
        if (current?.state === "stopped") return { ...current };
        return set(spec.name, { state: "stopped", reason: "requested", rebootCount });
      }
      if (current?.state === "running" && (current.rebootCount ?? 0) === rebootCount) return { ...current };
      if (current?.state !== "booting") {
        boots.push(spec.name);
        set(spec.name, { state: "booting", rebootCount });
      }
      // An abort leaves the guest booting: applying it again carries on, never boots it twice.
      await wait(runtime.bootDelayMs, signal);
      const report: GuestReport = {
        instanceId: spec.name,
        hostname: spec.name,
        userDataSha256: await sha256Hex(base64Bytes(spec.userData)),
        hostKeys: [`ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISIMULATED${spec.name.replaceAll("-", "")} simulated`],
        address: "10.0.2.2/30",
        mac: "06:00:0a:00:02:02",
      };
      return set(spec.name, { state: "running", rebootCount, report });
    },
    async observe(name) {
      const current = guests.get(name);
      return current ? { ...current } : { name, state: "absent", since: new Date().toISOString() };
    },
    async list() {
      return [...guests.values()].map((g) => ({ ...g }));
    },
    async remove(name) {
      if (guests.delete(name)) removed.push(name);
    },
    async console(name, maxBytes) {
      if (!guests.has(name)) throw new AgentError("NOT_FOUND", `no guest ${name}`);
      return `SIMULATED console of ${name}\n`.slice(-maxBytes);
    },
    watch(listener) {
      listeners.add(listener);
      return () => void listeners.delete(listener);
    },
    async close() {
      listeners.clear();
    },
    powerOff(name) {
      if (!guests.has(name)) return;
      const observed = set(name, { state: "stopped", reason: "guest_poweroff", rebootCount: guests.get(name)!.rebootCount ?? 0 });
      for (const listener of listeners) listener(observed);
    },
  };
  return runtime;
}
