// SerialBatches (durable-objects/serial.ts): how the NodeDO keeps its delivery passes, result
// recordings and status recordings one at a time while gathering what arrives meanwhile.
import { describe, expect, it } from "vitest";
import { SerialBatches } from "../durable-objects/serial.ts";

/** A run the test lets finish when it chooses. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe("SerialBatches", () => {
  it("runs one batch at a time, and what arrives while one runs is the next batch, answered item by item", async () => {
    const runs: number[][] = [];
    const first = gate();
    let running = 0;
    let most = 0;
    const queue = new SerialBatches(async (batch: number[]) => {
      most = Math.max(most, ++running);
      runs.push(batch);
      if (runs.length === 1) await first.opened;
      running--;
      return batch.map((n) => n * 10);
    });
    const one = queue.add(1);
    await Promise.resolve(); // the first run has started (nothing waits)
    await Promise.resolve();
    expect(queue.waiting).toBe(false);
    const later = [queue.add(2), queue.add(3), queue.add(4)];
    expect(queue.waiting).toBe(true);
    first.open();
    expect(await one).toBe(10);
    expect(await Promise.all(later)).toEqual([20, 30, 40]);
    expect(runs).toEqual([[1], [2, 3, 4]]);
    expect(most).toBe(1);
    expect(queue.waiting).toBe(false);
  });

  it("a run that throws rejects its own batch only; the next batch still runs", async () => {
    const hold = gate();
    const queue = new SerialBatches(async (batch: string[]) => {
      if (batch[0] === "hold") await hold.opened;
      if (batch.includes("bad")) throw new Error("the database is unavailable");
      return batch.map((s) => s.toUpperCase());
    });
    const held = queue.add("hold");
    await Promise.resolve();
    await Promise.resolve();
    const failed = [queue.add("bad"), queue.add("also in the batch")];
    hold.open();
    expect(await held).toBe("HOLD");
    await expect(failed[0]).rejects.toThrow("the database is unavailable");
    await expect(failed[1]).rejects.toThrow("the database is unavailable");
    expect(await queue.add("good")).toBe("GOOD");
  });

  it("a run that answers nothing settles every item with undefined (a pass shared by every wake-up)", async () => {
    let passes = 0;
    const release = gate();
    const queue = new SerialBatches(async () => {
      passes++;
      await release.opened;
    });
    const first = queue.add();
    await Promise.resolve();
    await Promise.resolve();
    const shared = [queue.add(), queue.add(), queue.add()];
    release.open();
    await Promise.all([first, ...shared]);
    expect(passes).toBe(2);
  });
});
