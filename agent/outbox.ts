// The result outbox: builds and signs each result (exactly what the control plane will parse,
// within the frame limit) and keeps it until the control plane acknowledges it (result-ack):
// sent now if a session is welcomed, again on every welcome, and after a backoff when the
// control plane answered UNAVAILABLE.
import { MAX_FRAME_BYTES, resultMessage, type AgentFrame, type ResultFrame } from "../core/protocol.ts";
import { utf8 } from "../core/encoding.ts";
import { jitterBackoff, type BackoffOptions } from "./backoff.ts";
import type { Credentials } from "./credentials.ts";
import type { Plumbing } from "./events.ts";

/** What a handler's run came to, before it is a signed result frame. */
export type Outcome = { ok: true; output?: unknown } | { ok: false; error: { code: string; message: string; permanent?: boolean } };

export interface OutboxOptions {
  backoff?: BackoffOptions;
}

interface OutboxDeps extends Plumbing {
  credentials: Pick<Credentials, "identity" | "sign">;
  /** Send on the welcomed socket; false if there is none or sending failed. */
  send: (frame: AgentFrame) => boolean;
}

const MAX_ERROR_CODE = 64;
const MAX_ERROR_MESSAGE = 4096;

export class Outbox {
  readonly #opts: OutboxOptions;
  readonly #deps: OutboxDeps;
  /** Results not yet result-acked, by command id, in the order produced. */
  readonly #unacked = new Map<string, ResultFrame>();
  /** Resend attempts of results the control plane answered UNAVAILABLE, by command id. */
  readonly #retries = new Map<string, number>();
  /** Pending resends; a closed socket cancels them (the next welcome sends everything unacked). */
  readonly #retryTimers = new Set<ReturnType<typeof setTimeout>>();

  constructor(opts: OutboxOptions, deps: OutboxDeps) {
    this.#opts = opts;
    this.#deps = deps;
  }

  /** The signed result frame of an outcome; a failed result if the output cannot be sent. */
  async build(id: string, key: string, outcome: Outcome): Promise<ResultFrame> {
    let body: Outcome = outcome;
    if (outcome.ok) {
      // Sign exactly what the control plane will parse: the output after a JSON round trip.
      try {
        const json = outcome.output === undefined ? undefined : JSON.stringify(outcome.output);
        body = json === undefined ? { ok: true } : { ok: true, output: JSON.parse(json) as unknown };
      } catch (e) {
        body = {
          ok: false,
          error: { code: "RESULT_NOT_JSON", message: `the handler's output cannot be sent as JSON: ${(e as Error).message}` },
        };
      }
    }
    const frame: ResultFrame = body.ok
      ? { t: "result", id, key, ok: true, ...(body.output !== undefined ? { output: body.output } : {}) }
      : {
          t: "result",
          id,
          key,
          ok: false,
          error: {
            code: body.error.code.slice(0, MAX_ERROR_CODE),
            message: body.error.message.slice(0, MAX_ERROR_MESSAGE),
            ...(body.error.permanent ? { permanent: true } : {}),
          },
        };
    frame.signature = await this.#sign(frame);
    const bytes = utf8(JSON.stringify(frame)).length;
    if (bytes > MAX_FRAME_BYTES) {
      return this.build(id, key, {
        ok: false,
        error: { code: "RESULT_TOO_LARGE", message: `the result frame would be ${bytes} bytes; the limit is ${MAX_FRAME_BYTES}` },
      });
    }
    return frame;
  }

  /** A recorded result answering another delivery id: same outcome, re-signed for the new id. */
  async reissue(result: ResultFrame, id: string): Promise<ResultFrame> {
    if (result.id === id) return result;
    const frame: ResultFrame = { ...result, id };
    delete frame.signature;
    frame.signature = await this.#sign(frame);
    return frame;
  }

  /** Keep until result-ack; send now if a session is welcomed, else on the next welcome. */
  deliver(result: ResultFrame): void {
    this.#unacked.delete(result.id);
    this.#unacked.set(result.id, result);
    this.#deps.emit("result", result);
    if (this.#deps.send(result)) this.#deps.counters.resultsSent++;
  }

  /** A session was welcomed: results the control plane has not acknowledged go again, before anything new. */
  resendAll(): void {
    for (const result of this.#unacked.values()) if (this.#deps.send(result)) this.#deps.counters.resultsResent++;
  }

  acked(id: string): void {
    this.#unacked.delete(id);
    this.#retries.delete(id);
    this.#deps.counters.resultAcks++;
    this.#deps.emit("result-ack", { id });
  }

  /** The control plane could not take a result just now: offer it again after a backoff. */
  retry(id: string): void {
    if (!this.#unacked.has(id)) return;
    const attempt = (this.#retries.get(id) ?? 0) + 1;
    this.#retries.set(id, attempt);
    const timer = setTimeout(
      () => {
        this.#retryTimers.delete(timer);
        const result = this.#unacked.get(id);
        if (result && this.#deps.send(result)) this.#deps.counters.resultsResent++;
      },
      jitterBackoff(attempt, this.#opts.backoff, this.#deps.random),
    );
    this.#retryTimers.add(timer);
  }

  /** The socket closed: drop pending resends. */
  cancelRetries(): void {
    this.#retryTimers.forEach(clearTimeout);
    this.#retryTimers.clear();
  }

  async #sign(frame: ResultFrame): Promise<string> {
    return this.#deps.credentials.sign(await resultMessage(this.#deps.credentials.identity!.nodeId, frame));
  }
}
