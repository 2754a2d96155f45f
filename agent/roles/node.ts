// The node role's converger (`bcd run` as a node): makes the host what its NodeSpec says
// (docs/nodespec.md). The control plane sends the desired spec (sections of entries keyed by
// name); the role saves it in the state store BEFORE converging, so an agent restarted mid-pass
// converges the saved spec again, whether or not the control plane is reachable. Level-triggered:
// a pass converges the latest spec whole, at most one pass runs at a time, a spec arriving during
// a pass makes another pass, and the latest spec is converged again every resyncMs (drift,
// failed entries). Each pass reports, per section, the observed entries (keyed like the desired
// ones) or the section's error, and the generation it converged.
//
// Sections: `access` (operators' SSH keys -> the authorized_keys file), `instances` (tenant
// guests -> the runtime drivers); any other section is reported UNSUPPORTED.
//
// Platform-free (it runs in FakeDaemon inside workerd too): files are written through the
// injected accessFile.write.
import type { InstanceEntry, NodeSpec, NodeStatus } from "../../core/protocol.ts";
import { AgentError, asAgentError, type AgentLogger, type CommandHandler } from "../contracts.ts";
import type { InstanceObserved, RuntimeDriver } from "../runtimes/contract.ts";
import type { AgentStateStore } from "../state.ts";

export type SectionStatus = NodeStatus["sections"][string];

/** Converges one section: its desired entries in, the observed ones out (keyed alike). A throw is the section's error. */
export interface SectionHandler {
  converge(entries: Record<string, unknown>, signal: AbortSignal): Promise<SectionStatus>;
}

export interface NodeRoleOptions {
  state: Pick<AgentStateStore, "loadDesiredSpec" | "saveDesiredSpec">;
  /** The runtime drivers guests run on, by id (an `instances` entry names one). */
  runtimes: RuntimeDriver[];
  /**
   * The authorized_keys file the `access` section owns (its whole content), and how to replace
   * it atomically (bcd: writeAtomic). Without it, access entries are reported UNSUPPORTED.
   */
  accessFile?: { path: string; write(path: string, content: string): Promise<void> };
  /** Where each status goes (the agent: AgentClient.sendStatus). */
  report: (status: NodeStatus) => void;
  log: AgentLogger;
  /** Converge the latest spec again this often, even when none arrived (ms). Default 60 000. */
  resyncMs?: number;
  /** At most this many instances are applied at once. Default 2. */
  concurrency?: number;
}

export interface NodeRole {
  /** A spec from the control plane: saved, then converged (an older or equal generation is ignored). */
  onSpec(spec: NodeSpec): Promise<void>;
  /** Watches the runtimes and converges the saved spec (after a restart: the one it was converging). */
  start(): Promise<void>;
  /** Aborts the running pass (nothing is reported for it) and waits for it to end; the guests keep running. */
  stop(): Promise<void>;
  /** The last status reported. */
  readonly status: NodeStatus | undefined;
  /** Resolves once no pass is running or due. */
  idle(): Promise<void>;
}

export function nodeRole(opts: NodeRoleOptions): NodeRole {
  const { log } = opts;
  const handlers: Record<string, SectionHandler> = {
    access: accessHandler(opts.accessFile),
    instances: instancesHandler(opts.runtimes, opts.concurrency ?? 2, () => status?.sections.instances?.entries ?? {}),
  };
  let desired: NodeSpec | null = null;
  let status: NodeStatus | undefined;
  let stopped = true;
  let again = false;
  let running: Promise<void> | undefined;
  let saving: Promise<void> = Promise.resolve();
  let controller = new AbortController();
  let resync: ReturnType<typeof setInterval> | undefined;
  const unwatch: (() => void)[] = [];

  const report = (next: NodeStatus) => {
    status = next;
    opts.report(next);
  };

  async function pass(spec: NodeSpec, signal: AbortSignal): Promise<void> {
    const sections: NodeStatus["sections"] = {};
    // The built-in sections run even without entries: they remove what is no longer wanted.
    const names = [...new Set([...Object.keys(spec.sections), ...Object.keys(handlers)])].sort();
    for (const name of names) {
      const handler = handlers[name];
      if (!handler) {
        sections[name] = {
          entries: {},
          error: { code: "UNSUPPORTED", message: `this node has no handler for the NodeSpec section ${name}` },
        };
        continue;
      }
      try {
        sections[name] = await handler.converge(spec.sections[name] ?? {}, signal);
      } catch (err) {
        if (signal.aborted) return;
        const e = asAgentError(err, "DRIVER_ERROR");
        sections[name] = { entries: {}, error: { code: e.code, message: e.message } };
      }
      if (signal.aborted) return; // stopped mid-pass: the next start converges the saved spec
    }
    log.info("converged the NodeSpec", { generation: spec.generation, failed: names.filter((n) => sections[n]?.error) });
    report({ generation: spec.generation, sections });
  }

  function kick(): void {
    if (stopped || !desired) return;
    again = true;
    running ??= (async () => {
      try {
        while (again && !stopped) {
          again = false;
          await pass(desired!, controller.signal);
        }
      } finally {
        running = undefined;
      }
    })();
  }

  /** A guest changed on its own (powered off, its VMM died): report it now, no pass needed. */
  function watched(runtime: RuntimeDriver, observed: InstanceObserved): void {
    const instances = status?.sections.instances;
    const wanted = desired?.sections.instances?.[observed.name] as { runtime?: unknown } | undefined;
    if (!status || !instances || wanted?.runtime !== runtime.id) return;
    report({
      ...status,
      sections: { ...status.sections, instances: { ...instances, entries: { ...instances.entries, [observed.name]: observed } } },
    });
  }

  return {
    get status() {
      return status;
    },
    onSpec(spec) {
      saving = saving.then(async () => {
        if (desired && spec.generation <= desired.generation) return;
        try {
          await opts.state.saveDesiredSpec(spec);
        } catch (err) {
          return log.error("could not save the NodeSpec; it is not converged", {
            generation: spec.generation,
            message: (err as Error).message,
          });
        }
        desired = spec;
        log.info("received a NodeSpec", { generation: spec.generation, sections: Object.keys(spec.sections) });
        kick();
      });
      return saving;
    },
    async start() {
      if (!stopped) return;
      stopped = false;
      controller = new AbortController();
      for (const runtime of opts.runtimes) unwatch.push(runtime.watch((observed) => watched(runtime, observed)));
      const saved = await opts.state.loadDesiredSpec();
      if (saved && (!desired || saved.generation > desired.generation)) desired = saved;
      kick();
      resync = setInterval(kick, opts.resyncMs ?? 60_000);
    },
    async stop() {
      stopped = true;
      controller.abort(new AgentError("INTERRUPTED", "the node role stopped"));
      clearInterval(resync);
      unwatch.splice(0).forEach((off) => off());
      await saving;
      await running;
    },
    async idle() {
      await saving;
      while (running) await running;
    },
  };
}

// ---------------------------------------------------------------- access

/** What sshd reads as a key: its type and base64 (the control plane checks the same); the name is the line's comment. */
const KEY_LINE = /^[a-z0-9@.-]+ [A-Za-z0-9+/]+={0,3}$/;
const KEY_NAME = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,252}$/;

function accessHandler(file: NodeRoleOptions["accessFile"]): SectionHandler {
  return {
    async converge(entries) {
      const names = Object.keys(entries).sort();
      if (!file) {
        if (names.length === 0) return { entries: {} };
        throw new AgentError("UNSUPPORTED", "this node manages no authorized_keys file (start bcd with --access-file)");
      }
      const observed: Record<string, unknown> = {};
      const lines: string[] = [];
      for (const name of names) {
        const publicKey = (entries[name] as { publicKey?: unknown } | null)?.publicKey;
        // Checked again here: a line break in either would add a key nobody asked for.
        if (typeof publicKey !== "string" || !KEY_LINE.test(publicKey) || !KEY_NAME.test(name)) {
          observed[name] = { error: { code: "INVALID_ARGUMENT", message: "not an OpenSSH public key (type and base64)" } };
          continue;
        }
        lines.push(`${publicKey} ${name}\n`);
        observed[name] = { publicKey };
      }
      await file.write(file.path, lines.join(""));
      return { entries: observed };
    },
  };
}

// ---------------------------------------------------------------- instances

/** The most console bytes one `guest.console` command returns. */
export const MAX_CONSOLE_BYTES = 16 * 1024;

/**
 * The node's command kinds: `guest.console` { name, maxBytes } answers the tail of a guest's
 * serial console ({ console }) from the runtime that has it. The bytes are the tenant's: they go
 * into the result only, never into the agent's log.
 */
export function nodeCommandHandlers(runtimes: RuntimeDriver[]): Record<string, CommandHandler> {
  return {
    "guest.console": async (body) => {
      const name = body.name;
      const maxBytes = body.maxBytes ?? MAX_CONSOLE_BYTES;
      if (typeof name !== "string" || !/^[a-z0-9][a-z0-9-]{0,62}$/.test(name))
        throw new AgentError("INVALID_ARGUMENT", "name is a guest's name", undefined, { permanent: true });
      if (typeof maxBytes !== "number" || !Number.isInteger(maxBytes) || maxBytes < 1 || maxBytes > MAX_CONSOLE_BYTES)
        throw new AgentError("INVALID_ARGUMENT", `maxBytes is 1 to ${MAX_CONSOLE_BYTES}`, undefined, { permanent: true });
      for (const runtime of runtimes) {
        if ((await runtime.list()).some((g) => g.name === name)) return { console: await runtime.console(name, maxBytes) };
      }
      throw new AgentError("NOT_FOUND", `this node runs no guest ${name}`, undefined, { permanent: true });
    },
  };
}

/** A guest the node could not converge: failed, with the error's code (UNSUPPORTED, INVALID_ARGUMENT, DRIVER_ERROR...). */
type FailedEntry = InstanceObserved & { error: { code: string; message: string } };

function instancesHandler(runtimes: RuntimeDriver[], concurrency: number, previous: () => Record<string, unknown>): SectionHandler {
  const byId = new Map(runtimes.map((r) => [r.id, r]));

  const failed = (name: string, code: string, message: string): FailedEntry => {
    // The same failure keeps its time: a status that did not change is not a change.
    const before = previous()[name] as Partial<FailedEntry> | undefined;
    const since =
      before?.state === "failed" && before.error?.code === code && before.message === message ? before.since! : new Date().toISOString();
    return { name, state: "failed", message, error: { code, message }, since };
  };

  return {
    async converge(entries, signal) {
      const observed: Record<string, unknown> = {};
      /** name -> the runtime it should run on. */
      const wanted = new Map<string, string>();
      for (const [name, entry] of Object.entries(entries)) {
        const runtime = (entry as { runtime?: unknown } | null)?.runtime;
        if (typeof runtime === "string") wanted.set(name, runtime);
      }

      await eachLimited(Object.entries(entries), concurrency, async ([name, entry]) => {
        if (signal.aborted) return;
        // Not checked here: the section's owner checked it against its schema, and the runtime checks what it runs.
        const { runtime: runtimeId, ...spec } = (entry ?? {}) as InstanceEntry;
        if (spec.name !== name) {
          observed[name] = failed(name, "INVALID_ARGUMENT", `the entry's name ${String(spec.name)} is not its key ${name}`);
          return;
        }
        const runtime = byId.get(runtimeId);
        if (!runtime) {
          observed[name] = failed(
            name,
            "UNSUPPORTED",
            `this node has no runtime ${String(runtimeId)} (it has: ${[...byId.keys()].join(", ") || "none"})`,
          );
          return;
        }
        try {
          observed[name] = await runtime.apply(spec, signal);
        } catch (err) {
          if (signal.aborted) return;
          const e = asAgentError(err, "DRIVER_ERROR");
          observed[name] = failed(name, e.code, e.message);
        }
      });
      if (signal.aborted) return { entries: observed };

      // Every guest a runtime has that is not wanted there goes.
      const problems: string[] = [];
      for (const runtime of runtimes) {
        let guests: InstanceObserved[];
        try {
          guests = await runtime.list();
        } catch (err) {
          problems.push(`${runtime.id}: could not list its guests: ${(err as Error).message}`);
          continue;
        }
        const unwanted = guests.filter((g) => wanted.get(g.name) !== runtime.id);
        await eachLimited(unwanted, concurrency, async (guest) => {
          if (signal.aborted) return;
          try {
            await runtime.remove(guest.name, signal);
          } catch (err) {
            if (!signal.aborted) problems.push(`${runtime.id}: could not remove ${guest.name}: ${(err as Error).message}`);
          }
        });
      }
      return {
        entries: observed,
        ...(problems.length ? { error: { code: "DRIVER_ERROR", message: problems.join("; ").slice(0, 4000) } } : {}),
      };
    },
  };
}

/** Runs fn over items, at most limit at once. */
async function eachLimited<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
