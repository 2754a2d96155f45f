// What the parts of AgentClient report through: its events, its counters and its logger (which
// redacts field values named like secrets). Each part is given one Plumbing.
import { redact } from "../core/log.ts";
import type { CommandFrame, ResultFrame } from "../core/protocol.ts";
import type { AgentError, AgentLogger } from "./contracts.ts";

export interface AgentEvents {
  connected: { nodeId: string; sessionId: string };
  disconnected: { code: number; reason: string; welcomed: boolean };
  "connect-failed": { error: AgentError };
  reconnecting: { attempt: number; delayMs: number };
  command: CommandFrame;
  /** A handler is about to run (first and only time for its key). */
  executing: { id: string; key: string; kind: string };
  /** A result was produced or answered from the journal (sent now, or on the next welcome). */
  result: ResultFrame;
  "result-ack": { id: string };
  "server-error": { code: string; message: string; ref?: string };
  renewed: { expiresAt: string };
  /** The client stopped for good: REVOKED, CREDENTIAL_EXPIRED. run() rejects with the same error. */
  fatal: AgentError;
}

export interface AgentCounters {
  connects: number;
  connectFailures: number;
  disconnects: number;
  commandsReceived: number;
  executed: number;
  replayed: number;
  interrupted: number;
  resultsSent: number;
  resultsResent: number;
  resultAcks: number;
  serverErrors: number;
  pingsSent: number;
  renewals: number;
}

export const zeroCounters = (): AgentCounters => ({
  connects: 0,
  connectFailures: 0,
  disconnects: 0,
  commandsReceived: 0,
  executed: 0,
  replayed: 0,
  interrupted: 0,
  resultsSent: 0,
  resultsResent: 0,
  resultAcks: 0,
  serverErrors: 0,
  pingsSent: 0,
  renewals: 0,
});

export type Emit = <E extends keyof AgentEvents>(event: E, payload: AgentEvents[E]) => void;

/** What every part of the client is given: the logger, the clock, the jitter source, the counters and the events. */
export interface Plumbing {
  log: AgentLogger;
  now: () => number;
  random: () => number;
  counters: AgentCounters;
  emit: Emit;
}

/** The listeners of each event; one that throws is logged and the others still run. */
export class Emitter {
  readonly #listeners = new Map<keyof AgentEvents, Set<(payload: never) => void>>();
  readonly #log: AgentLogger;

  constructor(log: AgentLogger) {
    this.#log = log;
  }

  /** Subscribe to an event; returns the unsubscribe function. */
  on<E extends keyof AgentEvents>(event: E, listener: (payload: AgentEvents[E]) => void): () => void {
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    set.add(listener as (payload: never) => void);
    return () => set.delete(listener as (payload: never) => void);
  }

  emit<E extends keyof AgentEvents>(event: E, payload: AgentEvents[E]): void {
    for (const listener of this.#listeners.get(event) ?? []) {
      try {
        (listener as (p: AgentEvents[E]) => void)(payload);
      } catch (e) {
        this.#log.error("an event listener threw", { event, message: (e as Error).message });
      }
    }
  }
}

export const silentLogger: AgentLogger = { info() {}, warn() {}, error() {} };

/** Wrap a logger so field values named like secrets are redacted (core/log.ts's rule). */
export function redactingLogger(inner: AgentLogger): AgentLogger {
  const f = (fields?: Record<string, unknown>) => (fields ? (redact(fields) as Record<string, unknown>) : fields);
  return {
    info: (m, x) => inner.info(m, f(x)),
    warn: (m, x) => inner.warn(m, f(x)),
    error: (m, x) => inner.error(m, f(x)),
    debug: (m, x) => inner.debug?.(m, f(x)),
  };
}
