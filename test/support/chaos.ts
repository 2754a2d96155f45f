// Fault injection for the chaos tests: a database port that counts the transactions of the
// stores it opens (a one-statement store.write is one too) and, when armed, stops at the chosen
// one: before it commits (its work is rolled back when the connection dies) or right after.
// "abort" kills the Durable Object that is running (ctx.abort(): its memory, timers and
// connections are gone, as in a crash); "throw" fails the caller's request instead. Unarmed, it is the database port it wraps.
import type { DatabasePort, Tx } from "../../core/store/database.ts";

export type Boundary = "before-commit" | "after-commit";

interface Armed {
  at: number;
  boundary: Boundary;
  how: "abort" | "throw";
}

// The test file and the Worker it drives load this module separately (the test through
// vitest's module runner, the Worker from its bundle), in one isolate: the state lives on
// globalThis so both see the same switch.
const state = ((globalThis as Record<symbol, unknown>)[Symbol.for("better-compute.chaos")] ??= {
  armed: undefined,
  count: 0,
  hit: false,
}) as {
  armed: Armed | undefined;
  count: number;
  /** The boundary the last arm() chose was reached (plain data: the test polls it). */
  hit: boolean;
  /** Aborts the Durable Object that is running now (set by the test deployment's WorkflowDO). */
  abort?: () => never;
};

export const chaos = {
  /** Stops the at-th transaction from now at the boundary. */
  arm(at: number, boundary: Boundary, how: "abort" | "throw" = "abort"): void {
    state.count = 0;
    state.hit = false;
    state.armed = { at, boundary, how };
  },
  get hit(): boolean {
    return state.hit;
  },
  disarm(): void {
    state.armed = undefined;
  },
  /** Called by a Durable Object as it starts an event: it is the one an "abort" kills. */
  running(abort: () => never): void {
    state.abort = abort;
  },
  /** Transactions counted since the last arm(). */
  get count(): number {
    return state.count;
  },
};

async function stop(at: Armed): Promise<never> {
  state.armed = undefined;
  state.hit = true;
  if (at.how === "abort" && state.abort) state.abort();
  throw new Error(`chaos: the process died at transaction ${at.at}, ${at.boundary}`);
}

export function chaosDatabase(inner: DatabasePort): DatabasePort {
  return {
    open(env) {
      const store = inner.open(env);
      /** Runs a commit boundary: `commit` alone, or, when it is the armed one, with the process dying there. */
      async function boundary<T>(fn: (tx: Tx) => Promise<T>, commit: () => Promise<T>): Promise<T> {
        const armed = state.armed;
        const target = armed && ++state.count === armed.at ? armed : undefined;
        if (target?.boundary === "before-commit") {
          return store.transaction(async (tx) => {
            await fn(tx);
            return stop(target);
          });
        }
        const result = await commit();
        if (target) await stop(target);
        return result;
      }
      return {
        db: store.db,
        close: () => store.close(),
        transaction: (fn) => boundary(fn, () => store.transaction(fn)),
        // Before its commit, a write runs in a transaction that the crash rolls back.
        write: (statement) =>
          boundary(
            (tx) => tx.execute(statement),
            () => store.write(statement),
          ),
      };
    },
  };
}
