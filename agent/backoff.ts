// Waiting, in one place: the one backoff the agent uses (reconnects, renewal retries and result
// resends all wait jitterBackoff), setTimeout's bound, and waiting for a promise with a limit.

export interface BackoffOptions {
  /** First reconnect delay bound (ms); doubles per failed attempt. Default 250. */
  initialMs?: number;
  /** Cap of the delay bound (ms). Default 30 000. */
  maxMs?: number;
  /** A session that stayed welcomed this long resets the backoff. Default 10 000. */
  healthyAfterMs?: number;
}

/**
 * "Full jitter": a delay drawn uniformly below a bound that doubles per attempt up to maxMs, so
 * agents that lost the control plane together do not all come back at the same moment.
 */
export function jitterBackoff(attempt: number, backoff: BackoffOptions = {}, random: () => number = Math.random): number {
  const bound = Math.min(backoff.maxMs ?? 30_000, (backoff.initialMs ?? 250) * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * bound);
}

const MAX_TIMER_MS = 2 ** 31 - 1;

/** ms as a setTimeout delay: not negative, and not past the largest delay timers take (longer ones fire at once). */
export const timerDelay = (ms: number) => Math.min(Math.max(ms, 0), MAX_TIMER_MS);

/** Resolves true if p settled within ms, false otherwise. */
export async function withTimeout(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const settled = await Promise.race([
    p.then(
      () => true,
      () => true,
    ),
    new Promise<false>((r) => (timer = setTimeout(() => r(false), ms))),
  ]);
  clearTimeout(timer);
  return settled;
}
