// The one alarm a Durable Object has, set the same way by both objects. Neither keeps a schedule
// table: each has one thing to do when it wakes (the NodeDO its sweep, the WorkflowDO its next
// pass), and the runtime's alarm is already durable, so it is the schedule.

/**
 * Sets the object's alarm to `at` (ms since the epoch, never in the past), or clears it (null).
 * With `keepSooner`, an alarm already set for an earlier time stays: the NodeDO wakes for a hello
 * that is late and for its sweep, whichever comes first. Without it, `at` replaces the alarm:
 * the WorkflowDO's next pass is its only reason to wake, and a stale earlier alarm would run it
 * once more for nothing.
 */
export async function setAlarm(storage: DurableObjectStorage, at: number | null, { keepSooner = false } = {}): Promise<void> {
  if (at === null) return storage.deleteAlarm();
  if (keepSooner) {
    const current = await storage.getAlarm();
    if (current !== null && current <= at) return;
  }
  await storage.setAlarm(Math.max(at, Date.now()));
}
