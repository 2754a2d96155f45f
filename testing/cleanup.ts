// Undoing what a composition set up (npm run dev's, the emulated site's): last first at stop, or at
// once when setting up fails halfway.

/** Steps that undo what was set up. A step's failure goes to `failed` (default: ignored), and the others still run. */
export class Cleanup {
  #steps: Array<() => Promise<unknown>> = [];

  constructor(private readonly failed: (error: unknown) => void = () => {}) {}

  push(step: () => Promise<unknown>): void {
    this.#steps.push(step);
  }

  /** Runs the steps pushed so far, last first; stopping again runs none of them twice. */
  readonly stop = async (): Promise<void> => {
    for (const step of this.#steps.reverse()) await step().catch(this.failed);
    this.#steps.length = 0;
  };

  /** Sets up with `start`; when it throws, what it set up so far is undone before the error goes on. */
  async guard<T>(start: () => Promise<T>): Promise<T> {
    try {
      return await start();
    } catch (err) {
      await this.stop();
      throw err;
    }
  }
}
