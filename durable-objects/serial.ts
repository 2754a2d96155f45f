/**
 * One run at a time, in the order they were asked for; what arrives while a run waits its turn
 * joins that run. A Durable Object's events interleave at every await: this keeps one kind of
 * its work serial (a later write never commits before an earlier one) and gathers what piles up
 * behind a slow run into the next one, instead of a run per arrival.
 */
export class SerialBatches<T = void, R = void> {
  #tail: Promise<void> = Promise.resolve();
  #waiting: { item: T; resolve(result: R): void; reject(err: unknown): void }[] | undefined;

  /** run answers one result per item of its batch, in order, or nothing (each gets undefined); a throw rejects the whole batch. */
  constructor(private readonly run: (batch: T[]) => Promise<R[] | void>) {}

  /** Queues item for the next run that has not started yet (one is started if none waits); settles with its result. */
  add(item: T): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      if (this.#waiting) return void this.#waiting.push({ item, resolve, reject });
      const batch = [{ item, resolve, reject }];
      this.#waiting = batch;
      this.#tail = this.#tail.then(async () => {
        this.#waiting = undefined;
        try {
          const results = await this.run(batch.map((b) => b.item));
          batch.forEach((b, i) => b.resolve(results ? results[i]! : (undefined as R)));
        } catch (err) {
          for (const b of batch) b.reject(err);
        }
      });
    });
  }

  /** Something waits for a run that has not started. */
  get waiting(): boolean {
    return this.#waiting !== undefined;
  }
}
