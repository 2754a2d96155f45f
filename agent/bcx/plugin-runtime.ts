// A runtime driver bcd hosts as a bcx plugin (docs/bcx.md, Walkthrough 4): on `bcd node`, a hosted
// driver whose manifest lists the kind "runtime" (and whose id is no built-in runtime's) converges
// instances like qemu-microvm does. bcd speaks the RuntimeDriver contract (agent/runtimes/contract.ts)
// to it over Invoke, positional JSON arguments: apply(spec), observe(name), list(), remove(name),
// console(name, maxBytes), probe(). The plugin cannot push, so changes it notices on its own are
// found by listing every few seconds.
import { AgentError } from "../contracts.ts";
import type { InstanceObserved, InstanceSpec, RuntimeDriver, RuntimeProbe } from "../runtimes/contract.ts";
import type { HostedDriver, PluginHost } from "./host.ts";

/** apply waits for the guest to boot: give it as long as the built-in runtimes take. */
const APPLY_DEADLINE_MS = 10 * 60_000;
const CALL_DEADLINE_MS = 60_000;
const WATCH_EVERY_MS = 3_000;
export const RUNTIME_OPERATIONS = ["apply", "observe", "list", "remove"] as const;

/** The hosted drivers that are runtimes: those of kind runtime serving the contract's operations. */
export function pluginRuntimes(host: PluginHost, builtin: readonly string[]): RuntimeDriver[] {
  return host
    .drivers()
    .filter((d) => d.kinds.includes("runtime") && !builtin.includes(d.id) && RUNTIME_OPERATIONS.every((op) => d.operations.includes(op)))
    .map((d) => pluginRuntime(host, d));
}

function pluginRuntime(host: PluginHost, driver: HostedDriver): RuntimeDriver {
  const call = <T>(op: string, args: unknown[], deadlineMs = CALL_DEADLINE_MS, signal?: AbortSignal) =>
    host.invoke(driver.id, op, args, { deadlineMs, ...(signal ? { signal } : {}) }) as Promise<T>;
  const listeners = new Set<(o: InstanceObserved) => void>();
  const last = new Map<string, string>();
  let timer: ReturnType<typeof setInterval> | undefined;

  /** Tells listeners of each instance whose state changed since the last look. */
  const look = async () => {
    let now: InstanceObserved[];
    try {
      now = await call<InstanceObserved[]>("list", []);
    } catch {
      return; // the plugin is restarting: the next look sees it
    }
    for (const o of now) {
      if (last.get(o.name) === o.state) continue;
      last.set(o.name, o.state);
      for (const l of listeners) l(o);
    }
  };

  return {
    id: driver.id,
    version: driver.version,
    async probe(): Promise<RuntimeProbe> {
      if (!driver.operations.includes("probe")) return { ok: true, detail: `bcx plugin ${driver.plugin}` };
      return call<RuntimeProbe>("probe", []);
    },
    async apply(spec: InstanceSpec, signal?: AbortSignal) {
      const observed = await call<InstanceObserved>("apply", [spec], APPLY_DEADLINE_MS, signal);
      last.set(observed.name, observed.state);
      return observed;
    },
    observe: (name) => call<InstanceObserved>("observe", [name]),
    list: () => call<InstanceObserved[]>("list", []),
    async remove(name, signal) {
      await call("remove", [name], APPLY_DEADLINE_MS, signal);
      last.delete(name);
    },
    async console(name, maxBytes) {
      if (!driver.operations.includes("console"))
        throw new AgentError("UNSUPPORTED", `runtime ${driver.id} (bcx plugin ${driver.plugin}) keeps no console`);
      const tail = await call<string>("console", [name, maxBytes]);
      return typeof tail === "string" ? tail.slice(-maxBytes) : "";
    },
    watch(listener) {
      listeners.add(listener);
      timer ??= setInterval(() => void look(), WATCH_EVERY_MS);
      timer.unref?.();
      return () => {
        listeners.delete(listener);
        if (listeners.size === 0) {
          clearInterval(timer);
          timer = undefined;
        }
      };
    },
    async close() {
      clearInterval(timer);
      timer = undefined;
      listeners.clear();
    },
  };
}
