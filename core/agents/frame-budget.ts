// What one agent's socket may send before the NodeDO stops working for it. A socket is
// authenticated, but its peer may be a buggy agent or a stolen key: without a budget, one socket
// sending thousands of frames a second fills its object's queue, its database and the log.
//
//   ack     one per command sent on this socket (an agent acks each delivery once); an ack
//           beyond that acknowledges nothing and is dropped.
//   result  a token bucket: each result is a database write (batched). One over the budget is
//           dropped and answered RATE_LIMITED: the agent keeps it and sends it again after a backoff.
//   status  a token bucket: each status is a write of up to 512 KiB. One over the budget is
//           dropped; the agent's next status replaces it.
//
// Every dropped frame and every refused result (another node's command, an unknown one, a bad
// signature) is a strike. Strikes are a token bucket too: a well-behaved agent never comes near
// it, one that keeps misbehaving empties it, and its socket is closed (POLICY_VIOLATION) with an
// event saying why. Refusals are logged once a period with how many were not, so a flood writes a
// bounded number of lines. Budgets live in memory, per socket: a hibernated object that wakes
// starts them full again, which only forgives.
import { invalidConfig } from "../errors.ts";

export interface Rate {
  perSecond: number;
  burst: number;
}

export interface FrameBudgets {
  result: Rate;
  status: Rate;
  /** Dropped frames and refused results; when they run out the socket is closed. */
  strikes: Rate;
}

/**
 * Far above what a well-behaved agent sends: its results are bounded by the commands it runs (32
 * at once by default), its statuses by the NodeSpec generations it reaches.
 */
export const DEFAULT_FRAME_BUDGETS: FrameBudgets = {
  result: { perSecond: 1_000, burst: 10_000 },
  status: { perSecond: 2, burst: 20 },
  strikes: { perSecond: 10, burst: 200 },
};

/** Refusals are logged at most once a period per socket (the first at once), with how many were not. */
export const REFUSAL_LOG_PERIOD_MS = 60_000;

/** A token bucket: `burst` tokens, refilled at `perSecond`. */
class Bucket {
  #tokens: number;
  #at: number;
  constructor(
    private readonly rate: Rate,
    now: number,
  ) {
    this.#tokens = rate.burst;
    this.#at = now;
  }

  take(now: number): boolean {
    this.#tokens = Math.min(this.rate.burst, this.#tokens + ((now - this.#at) / 1000) * this.rate.perSecond);
    this.#at = now;
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }
}

export type BudgetedKind = "ack" | "result" | "status";

/** What the socket did, for the close event and the log. */
export interface BudgetSummary {
  seconds: number;
  /** Frames taken and dropped, by kind. */
  frames: Record<BudgetedKind, { taken: number; dropped: number }>;
  /** Refused results, by code. */
  refused: Record<string, number>;
}

/** A refusal: whether the socket must now be closed, and whether to log it (with how many refusals went unlogged before it). */
export interface Strike {
  close: boolean;
  log: { suppressed: number } | undefined;
}

export class SocketBudget {
  readonly #opened: number;
  readonly #result: Bucket;
  readonly #status: Bucket;
  readonly #strikes: Bucket;
  #ackCredit = 0;
  #loggedAt = -Infinity;
  #unlogged = 0;
  #frames: BudgetSummary["frames"] = { ack: { taken: 0, dropped: 0 }, result: { taken: 0, dropped: 0 }, status: { taken: 0, dropped: 0 } };
  #refused: Record<string, number> = {};
  /** Set once the socket was closed for its budget: what it still sends is ignored. */
  closed = false;

  constructor(
    budgets: FrameBudgets,
    private readonly clock: () => number = Date.now,
  ) {
    const at = clock();
    this.#opened = at;
    this.#result = new Bucket(budgets.result, at);
    this.#status = new Bucket(budgets.status, at);
    this.#strikes = new Bucket(budgets.strikes, at);
  }

  /** Commands were sent on this socket: each may be acked once. */
  sent(commands: number): void {
    this.#ackCredit += commands;
  }

  /** Whether a frame of this kind is within budget (else it is dropped: see strike). */
  admit(kind: BudgetedKind): boolean {
    let ok: boolean;
    if (kind === "ack") {
      ok = this.#ackCredit > 0;
      if (ok) this.#ackCredit--;
    } else ok = (kind === "result" ? this.#result : this.#status).take(this.clock());
    this.#frames[kind][ok ? "taken" : "dropped"]++;
    return ok;
  }

  /** A dropped frame, or a result refused with `code`. */
  strike(code?: string): Strike {
    if (this.closed) return { close: false, log: undefined };
    if (code) this.#refused[code] = (this.#refused[code] ?? 0) + 1;
    const now = this.clock();
    const close = !this.#strikes.take(now);
    if (close) this.closed = true;
    if (close || now - this.#loggedAt < REFUSAL_LOG_PERIOD_MS) {
      this.#unlogged++;
      return { close, log: undefined };
    }
    const log = { suppressed: this.#unlogged };
    this.#loggedAt = now;
    this.#unlogged = 0;
    return { close, log };
  }

  summary(): BudgetSummary {
    return {
      seconds: Math.round((this.clock() - this.#opened) / 100) / 10,
      frames: structuredClone(this.#frames),
      refused: { ...this.#refused },
    };
  }
}

/** The deployment's budgets (ComputeOptions.limits.agentFrames over the defaults); INVALID_CONFIG when a rate is not positive. */
export function frameBudgets(overrides: Partial<FrameBudgets> | undefined): FrameBudgets {
  const budgets = { ...DEFAULT_FRAME_BUDGETS, ...overrides };
  for (const [name, rate] of Object.entries(budgets)) {
    const valid = rate && Number.isFinite(rate.perSecond) && rate.perSecond > 0 && Number.isInteger(rate.burst) && rate.burst >= 1;
    if (!valid) throw invalidConfig(`limits.agentFrames.${name} must be { perSecond > 0, burst: an integer >= 1 }`);
  }
  return budgets;
}
