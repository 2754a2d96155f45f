// What `npm run dev`'s compositions (site.ts, vms.ts, providers.ts) share: undoing what they set
// up (testing/cleanup.ts), and following the event record.
export { Cleanup } from "../../testing/cleanup.ts";

/** An event as events.list answers it. */
export interface DevEvent {
  position: string;
  type: string;
  subject: string | null;
  data: Record<string, unknown>;
}

const EVENTS_PAGE = 500;

/**
 * The event record under a type prefix (metal.node.*), in order, from where the last read stopped:
 * each call yields what was recorded since, page after page, so a fast change (ready → deploying →
 * deployed within a second) is not lost between two polls as it would be to a poll of the states.
 * A read that stops early (its reader threw) resumes after the last event it yielded.
 */
export function eventFeed(
  call: <T>(method: string, input: Record<string, unknown>) => Promise<T>,
  type: string,
): () => AsyncGenerator<DevEvent> {
  let after: string | undefined;
  return async function* () {
    for (;;) {
      const page = await call<{ events: DevEvent[] }>("events.list", { type, limit: EVENTS_PAGE, ...(after ? { after } : {}) });
      for (const event of page.events) {
        after = event.position;
        yield event;
      }
      if (page.events.length < EVENTS_PAGE) break;
    }
  };
}
