// The executor: runs commands in seq order within each lane (lanes side by side, up to a limit),
// at most once per idempotency key through the journal, each under its deadline, and aborts
// them when the agent stops. It acks through the `send` it is given; results go to the outbox.
import type { AgentFrame, CommandFrame, ResultFrame } from "../core/protocol.ts";
import { timerDelay, withTimeout } from "./backoff.ts";
import { AgentError, type CommandContext, type CommandHandler } from "./contracts.ts";
import type { Plumbing } from "./events.ts";
import type { Outbox, Outcome } from "./outbox.ts";
import type { AgentStateStore } from "./state.ts";

export interface ExecutorOptions {
  /** Commands running at once, each in its own lane (see CommandHandler.lane). Default 32. */
  maxConcurrentCommands?: number;
}

interface ExecutorDeps extends Plumbing {
  state: AgentStateStore;
  /** The handler of each command kind (AgentClient.handle adds to it). */
  handlers: ReadonlyMap<string, CommandHandler>;
  outbox: Outbox;
  /** Send on the welcomed socket; false if there is none or sending failed. */
  send: (frame: AgentFrame) => boolean;
  stopping: () => boolean;
}

interface InFlight {
  id: string;
  controller: AbortController;
  done: Promise<ResultFrame>;
}

export class Executor {
  readonly #opts: ExecutorOptions;
  readonly #deps: ExecutorDeps;
  /** Commands received and not started yet, in seq order. */
  #queue: { frame: CommandFrame; lane: string }[] = [];
  /** The command running in each busy lane. */
  readonly #lanes = new Map<string, Promise<void>>();
  readonly #inflight = new Map<string, InFlight>();
  /** Results whose `done` record could not be written: still answered within this process. */
  readonly #unjournaled = new Map<string, ResultFrame>();

  constructor(opts: ExecutorOptions, deps: ExecutorDeps) {
    this.#opts = opts;
    this.#deps = deps;
  }

  /** A command frame from the welcomed session. */
  receive(frame: CommandFrame): void {
    this.#deps.counters.commandsReceived++;
    this.#deps.emit("command", frame);
    const running = this.#inflight.get(frame.key);
    if (running) {
      // A redelivery of what this process is running: acknowledge, answer when it finishes.
      this.#deps.send({ t: "ack", id: frame.id });
      if (running.id !== frame.id)
        void running.done.then(async (r) => this.#deps.outbox.deliver(await this.#deps.outbox.reissue(r, frame.id)));
      return;
    }
    if (this.#queue.some((q) => q.frame.id === frame.id)) return; // already waiting its turn
    this.#queue.push({ frame, lane: this.#laneOf(frame) });
    this.#startReady();
  }

  /**
   * The socket closed. Every waiting command came on it (commands are taken only from the
   * current socket), so all are dropped: the NodeDO redelivers what has no result.
   */
  dropQueued(): void {
    this.#queue = [];
  }

  /** The agent is stopping: drop what waits and abort the running handlers' signals (reason INTERRUPTED). */
  interrupt(): void {
    this.#queue = [];
    for (const f of this.#inflight.values()) f.controller.abort(new AgentError("INTERRUPTED", "the agent is stopping"));
  }

  /** Resolves when no command runs, or after graceMs. */
  async settle(graceMs: number): Promise<void> {
    if (this.#lanes.size) await withTimeout(Promise.all(this.#lanes.values()), graceMs);
  }

  #laneOf(frame: CommandFrame): string {
    try {
      return this.#deps.handlers.get(frame.kind)?.lane?.(frame.body) ?? "";
    } catch {
      return ""; // a body the lane cannot read fails in its handler, in the default lane
    }
  }

  /** Starts the first waiting command of every idle lane, up to the concurrency limit. */
  #startReady(): void {
    const limit = Math.max(1, this.#opts.maxConcurrentCommands ?? 32);
    for (let i = 0; i < this.#queue.length && this.#lanes.size < limit;) {
      const item = this.#queue[i]!;
      if (this.#deps.stopping()) {
        this.#queue.splice(i, 1);
        continue;
      }
      if (this.#lanes.has(item.lane)) {
        i++;
        continue;
      }
      this.#queue.splice(i, 1);
      const run = this.#process(item.frame)
        .catch((e: unknown) => {
          this.#deps.log.error("command processing failed", {
            id: item.frame.id,
            key: item.frame.key,
            kind: item.frame.kind,
            message: (e as Error).message,
          });
        })
        .finally(() => {
          this.#lanes.delete(item.lane);
          this.#startReady();
        });
      this.#lanes.set(item.lane, run);
    }
  }

  async #process(frame: CommandFrame): Promise<void> {
    const { id, key, kind } = frame;
    const { state, counters, log, outbox } = this.#deps;
    const earlier = this.#unjournaled.get(key);
    const rec = earlier ? null : await state.journal(key);
    if (earlier || rec?.state === "done") {
      const recorded = earlier ?? (rec as { result: ResultFrame }).result;
      counters.replayed++;
      log.info("answering a redelivered command from the journal", { id, key, kind });
      outbox.deliver(await outbox.reissue(recorded, id));
      return;
    }
    if (rec?.state === "started") {
      counters.interrupted++;
      log.warn("a command was interrupted by a restart; not running it again", { id, key, kind });
      await this.#finish(frame, {
        ok: false,
        error: { code: "INTERRUPTED", message: `the agent stopped while running ${kind} (key ${key}); it is not run again` },
      });
      return;
    }
    if (deadlineOf(frame) <= this.#deps.now()) {
      await this.#finish(frame, {
        ok: false,
        error: { code: "DEADLINE_EXCEEDED", message: `the deadline ${frame.deadline} passed before the agent could start ${kind}` },
      });
      return;
    }

    // `ack` promises the command is journaled: a crash from here on reports it INTERRUPTED.
    await state.journalStarted({ key, id, kind });
    this.#deps.send({ t: "ack", id });
    const controller = new AbortController();
    let settle!: (r: ResultFrame) => void;
    const inflight: InFlight = { id, controller, done: new Promise((r) => (settle = r)) };
    this.#inflight.set(key, inflight);
    try {
      counters.executed++;
      this.#deps.emit("executing", { id, key, kind });
      const outcome = await this.#runHandler(frame, controller);
      settle(await this.#finish(frame, outcome));
    } finally {
      this.#inflight.delete(key);
    }
  }

  async #runHandler(frame: CommandFrame, controller: AbortController): Promise<Outcome> {
    const handler = this.#deps.handlers.get(frame.kind);
    if (!handler) return { ok: false, error: { code: "UNSUPPORTED", message: `this agent has no handler for ${frame.kind}` } };
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = deadlineOf(frame);
    if (deadline !== Infinity) {
      const ms = deadline - this.#deps.now();
      timer = setTimeout(
        () => controller.abort(new AgentError("DEADLINE_EXCEEDED", `the deadline ${frame.deadline} passed`)),
        timerDelay(ms),
      );
    } else if (frame.deadline !== null)
      this.#deps.log.warn("ignoring a deadline that is not a date", { id: frame.id, deadline: frame.deadline });
    const ctx: CommandContext = {
      id: frame.id,
      key: frame.key,
      kind: frame.kind,
      seq: frame.seq,
      attested: frame.attested,
      deadline: frame.deadline,
      signal: controller.signal,
      secrets: frame.secrets ?? {},
    };
    try {
      return { ok: true, output: await handler(frame.body, ctx) };
    } catch (e) {
      const reason: unknown = controller.signal.reason;
      const err = (
        controller.signal.aborted && reason instanceof AgentError && (e === reason || (e as Error)?.name === "AbortError") ? reason : e
      ) as {
        code?: unknown;
        message?: unknown;
        permanent?: unknown;
      } | null;
      const code = err && err.code !== undefined && err.code !== null ? String(err.code) : "HANDLER_ERROR";
      const message = err && typeof err.message === "string" ? err.message : String(err);
      return { ok: false, error: { code, message, ...(err?.permanent === true ? { permanent: true } : {}) } };
    } finally {
      clearTimeout(timer);
    }
  }

  /** Build and sign the result, record it done, send it. */
  async #finish(frame: CommandFrame, outcome: Outcome): Promise<ResultFrame> {
    const result = await this.#deps.outbox.build(frame.id, frame.key, outcome);
    try {
      await this.#deps.state.journalDone({ key: frame.key, id: frame.id, kind: frame.kind, result });
    } catch (e) {
      this.#unjournaled.set(frame.key, result);
      this.#deps.log.error("could not record a result in the journal", { id: frame.id, key: frame.key, message: (e as Error).message });
    }
    this.#deps.outbox.deliver(result);
    return result;
  }
}

/** The command's deadline in ms since the epoch; Infinity when it has none (or an unreadable one). */
function deadlineOf(frame: CommandFrame): number {
  const ms = frame.deadline === null ? NaN : Date.parse(frame.deadline);
  return Number.isFinite(ms) ? ms : Infinity;
}
