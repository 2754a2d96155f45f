// driverConformanceCases: what every bcx plugin must do, checked against the real plugin process
// through bcd's own PluginHost (docs/bcx.md). Run them with better-compute/conformance's
// runConformance and a factory from bcxSubject (agent/bcx/subject.ts): each case gets a freshly
// started plugin.
import type { ConformanceCase } from "../../core/conformance/index.ts";
import type { AgentError } from "../contracts.ts";
import type { HostedDriver, PluginHost } from "./host.ts";
import { PLUGIN_ERROR_CODES } from "./protocol.ts";

export interface BcxSubject {
  host: PluginHost;
  /** The plugin's driver, as its handshake announced it. */
  driver: HostedDriver;
  /** Arguments that make each operation do its job (an operation without them is called with none). */
  samples: Record<string, unknown[]>;
  /** The grace a cancelled invoke has to be answered in. */
  cancelGraceMs: number;
  close(): Promise<void>;
}

/** Arguments no operation takes: each must be refused with INVALID_ARGUMENT. */
const GARBAGE: unknown[] = [{ "not-an-argument": [null, { deep: true }] }, -1.5e308, ["x".repeat(4096)], null];

/** The plugin is still the process it was (not killed, not restarted) and ready. */
function alive(s: BcxSubject, what: string): void {
  const status = s.host.status()[0];
  if (status?.state !== "ready" || status.restarts > 0)
    throw new Error(`after ${what}, the plugin was ${status?.state} with ${status?.restarts} restarts: it crashed or broke the protocol`);
}

async function outcome(p: Promise<unknown>): Promise<{ ok: true; value: unknown } | { ok: false; error: AgentError }> {
  try {
    return { ok: true, value: await p };
  } catch (e) {
    if (typeof (e as AgentError | null)?.code !== "string") throw e;
    return { ok: false, error: e as AgentError };
  }
}

export function driverConformanceCases(): ConformanceCase<BcxSubject>[] {
  return [
    {
      name: "handshake: one driver with its id, version, kinds and operations",
      async run(s) {
        const d = s.driver;
        if (!d.id || !d.version || d.kinds.length === 0) throw new Error(`an incomplete manifest: ${JSON.stringify(d)}`);
        if (s.host.drivers().length !== 1) throw new Error("the host lists more than the plugin's one driver");
        alive(s, "the handshake");
      },
    },
    {
      name: "every declared operation answers: a value, or an error with a protocol code (UNSUPPORTED when it cannot)",
      async run(s) {
        for (const op of s.driver.operations) {
          const sample = s.samples[op];
          const r = await outcome(s.host.invoke(s.driver.id, op, sample ?? [], { deadlineMs: 10_000 }));
          alive(s, op);
          if (r.ok) continue;
          if (!(PLUGIN_ERROR_CODES as readonly string[]).includes(r.error.code))
            throw new Error(`${op} answered ${r.error.code}: ${r.error.message}`);
          if (sample && r.error.code !== "UNSUPPORTED")
            throw new Error(
              `${op} with its sample arguments answered ${r.error.code}: ${r.error.message} (a value or UNSUPPORTED expected)`,
            );
        }
      },
    },
    {
      name: "an unknown operation answers UNSUPPORTED",
      async run(s) {
        const r = await outcome(s.host.invoke(s.driver.id, "no.such-operation", [], { deadlineMs: 5_000 }));
        if (r.ok || r.error.code !== "UNSUPPORTED") throw new Error(`an unknown operation answered ${r.ok ? "a value" : r.error.code}`);
        alive(s, "an unknown operation");
      },
    },
    {
      name: "garbage arguments answer INVALID_ARGUMENT, not a crash",
      async run(s) {
        for (const op of s.driver.operations) {
          const r = await outcome(s.host.invoke(s.driver.id, op, GARBAGE, { deadlineMs: 5_000 }));
          alive(s, `${op} with garbage arguments`);
          if (r.ok) throw new Error(`${op} accepted garbage arguments`);
          if (r.error.code !== "INVALID_ARGUMENT" && r.error.code !== "UNSUPPORTED")
            throw new Error(`${op} answered garbage arguments with ${r.error.code}: ${r.error.message}`);
        }
      },
    },
    {
      name: "a cancelled invoke is answered within the grace period, and the plugin lives on",
      async run(s) {
        const op = s.driver.operations[0];
        if (!op) return;
        const controller = new AbortController();
        const call = outcome(s.host.invoke(s.driver.id, op, s.samples[op] ?? [], { signal: controller.signal, deadlineMs: 10_000 }));
        setImmediate(() => controller.abort());
        await call;
        // A plugin that does not answer the cancel in time is killed when the grace ends.
        await new Promise((r) => setTimeout(r, s.cancelGraceMs + 200));
        alive(s, `a cancel of ${op}`);
        await s.host.ping(s.driver.id);
      },
    },
    {
      name: "a ping is answered",
      async run(s) {
        await s.host.ping(s.driver.id);
        alive(s, "a ping");
      },
    },
    {
      name: "an unknown stream ends with UNSUPPORTED",
      async run(s) {
        const stream = s.host.openStream(s.driver.id, "no.such-stream", []);
        const error = await new Promise<Error | undefined>((resolve) => stream.onEnd(resolve));
        if ((error as AgentError | undefined)?.code !== "UNSUPPORTED")
          throw new Error(`an unknown stream ended with ${error?.message ?? "no error"}`);
        alive(s, "an unknown stream");
      },
    },
  ];
}
