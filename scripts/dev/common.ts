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

type Call = <T>(method: string, input: Record<string, unknown>) => Promise<T>;

/**
 * Prints each enrolled machine's transitions as they are recorded (with the seconds since its
 * last one) and, with `steps`, each step its workflows begin; one line once all of them are
 * ready. Answers a function that stops it.
 */
export function watchMachines(
  call: Call,
  enrolled: ReadonlyMap<string, string>,
  print: (line: string) => void,
  options: { what: string; steps?: boolean },
): () => void {
  const known = new Map(enrolled);
  const since = new Map([...enrolled.keys()].map((id) => [id, Date.now()]));
  const nodes = [...enrolled.keys()];
  const width = Math.max(...nodes.map((id) => id.length));
  /** Workflow id → the machine it works on (from workflow.started). */
  const workflows = new Map<string, string>();
  let allReady = false;
  let lastProblem = "";
  let stopped = false;
  const transitions = eventFeed(call, "metal.node.*");
  const workflowEvents = options.steps ? eventFeed(call, "workflow.*") : undefined;
  const poll = async () => {
    try {
      // Both feeds in the order they were recorded: a step's line before the transition it led to.
      const events: DevEvent[] = [];
      for (const feed of [transitions, workflowEvents]) if (feed) for await (const event of feed()) events.push(event);
      events.sort((a, b) => (BigInt(a.position) < BigInt(b.position) ? -1 : 1));
      for (const event of events) {
        if (event.type.startsWith("workflow.")) {
          const id = event.subject?.replace(/^workflows\//, "");
          if (!id) continue;
          if (event.type === "workflow.started" && typeof event.data.target === "string") workflows.set(id, event.data.target);
          const machine = workflows.get(id);
          if (event.type === "workflow.step.started" && machine && known.has(machine))
            print(`  ${machine.padEnd(width)}    ${known.get(machine)}: ${String(event.data.step)}`);
          continue;
        }
        const id = event.subject?.replace(/^metal\/nodes\//, "");
        const { from, to, reason } = event.data;
        if (!id || !known.has(id) || typeof from !== "string" || typeof to !== "string" || from === to) continue;
        known.set(id, to);
        const seconds = ((Date.now() - since.get(id)!) / 1000).toFixed(0);
        since.set(id, Date.now());
        print(
          `  ${id.padEnd(width)}  ${from} → ${to} (${seconds} s)${to === "failed" && typeof reason === "string" ? `  (${reason})` : ""}`,
        );
      }
      if (!allReady && nodes.every((id) => known.get(id) === "ready")) {
        allReady = true;
        print(`  ${nodes.length} ${options.what} machine${nodes.length === 1 ? "" : "s"} ready`);
      }
      lastProblem = "";
    } catch (err) {
      const problem = err instanceof Error ? err.message : String(err);
      if (!stopped && problem !== lastProblem) print(`  could not read the machines' transitions (events.list): ${problem}`);
      lastProblem = problem;
    }
  };
  const loop = async () => {
    while (!stopped) {
      await poll();
      await new Promise((r) => setTimeout(r, 1_000));
    }
  };
  void loop();
  return () => void (stopped = true);
}
