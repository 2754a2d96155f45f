// The Postgres connection of an object that runs passes over the record and keeps nothing but its
// alarm (the SinkDO, the WorkflowDO): opened at the first pass and kept across passes; a pass that
// fails (the database unreachable) is logged, its connection dropped (the next pass opens another)
// and the pass tried again RETRY_MS later.
import type { Logger } from "../core/log.ts";
import type { Store } from "../core/store/database.ts";

/** After a failed pass (the database unreachable), try again this soon. */
const RETRY_MS = 5_000;

export class PassStore {
  #store: Store | undefined;

  constructor(
    private readonly open: () => Store,
    private readonly log: Logger,
  ) {}

  get store(): Store {
    return (this.#store ??= this.open());
  }

  /**
   * Runs one pass and answers when the next is due, in ms since the epoch (null: none is): `pass`
   * answers in how many ms. A pass that throws is logged as `failed` (with `fields`), the
   * connection dropped, and the next one due RETRY_MS from now.
   */
  async next(pass: (store: Store) => Promise<number | null>, failed: string, fields: Record<string, unknown> = {}): Promise<number | null> {
    try {
      const inMs = await pass(this.store);
      return inMs === null ? null : Date.now() + inMs;
    } catch (err) {
      this.log.warn(failed, { ...fields, error: err instanceof Error ? err.message : String(err) });
      this.#store = undefined;
      return Date.now() + RETRY_MS;
    }
  }
}
