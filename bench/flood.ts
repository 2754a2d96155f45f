// Section "flood": what one misbehaving agent socket costs everyone else (issue 29). Two windows
// of the same length, side by side: without a flood, then with one agent (a real AgentClient, so
// it reconnects by itself after each close) sending BENCH_FLOOD_RATE frames a second on its
// socket (acks for nothing it was sent, and results for commands that do not exist). Meanwhile,
// in both windows and one at a time, this process measures:
//   GET /v1/health                  (the API Worker and one database round trip)
//   another agent's command round trip  (commands.create → the command reaches it → result-ack)
// and counts the database round trips of the Worker and its Durable Objects (the bench Worker's
// hook), how often the flooder's socket was closed for its frame budget (1008), how many of its
// reconnects were refused while its node cooled down (429), and how many lines the stack logged
// (its warnings and errors: local/stack.ts workerOutput).
import { nodeTransport } from "../agent/node-transport.ts";
import type { AgentTransport } from "../agent/client.ts";
import type { SocketLike } from "../agent/socket.ts";
import { FakeDaemon } from "../testing/index.ts";
import { CloseCode } from "../core/protocol.ts";
import { percentile } from "./load.ts";
import { readQueryStats } from "./query-stats.ts";
import type { BenchSection } from "./run.ts";
import { callApi, ms, withStack, type BenchStack } from "./stack.ts";

const ROUND_TRIP_TIMEOUT_MS = 15_000;
/** The flooder sends its frames in bursts this often. */
const TICK_MS = 10;

interface Window {
  health: Float64Array;
  commands: Float64Array;
  roundTrips: number;
  framesSent: number;
  policyCloses: number;
  refusedReconnects: number;
  logLines: number;
  seconds: number;
}

export const floodSection: BenchSection = {
  id: "flood",
  title: "One agent socket flooding its NodeDO: /v1/health and another agent's command round trip, with and without",
  async run(ctx) {
    let logLines = 0;
    await withStack(
      ctx,
      "flood",
      async (stack) => {
        const neighbour = new FakeDaemon({
          baseUrl: stack.url,
          transport: nodeTransport(),
          role: "node",
          handlers: { "agent.ping": () => ({ pong: true }) },
        });
        const flooder = new Flooder(stack, ctx.flood.rate);
        try {
          const { token } = await callApi<{ token: string }>(stack, "joinTokens.create", { role: "node" });
          const { nodeId } = await neighbour.join(token, { hostname: "bench-neighbour" });
          await neighbour.connect(30_000);
          await flooder.start();
          const roundTrip = commandRoundTrip(stack, neighbour, nodeId);
          for (let i = 0; i < 20; i++) await roundTrip();

          const measure = async (flooding: boolean): Promise<Window> => {
            await readQueryStats(stack.url, true);
            const [lines, sent, closes, refused] = [logLines, flooder.framesSent, flooder.policyCloses, flooder.refusedReconnects];
            if (flooding) flooder.flood(true);
            const started = performance.now();
            const until = started + ctx.flood.seconds * 1000;
            const [health, commands] = await Promise.all([probe(until, () => healthOnce(stack)), probe(until, roundTrip)]);
            flooder.flood(false);
            const seconds = (performance.now() - started) / 1000;
            const roundTrips = (await readQueryStats(stack.url, true)).reduce((n, s) => n + s.count, 0);
            return {
              health,
              commands,
              roundTrips,
              framesSent: flooder.framesSent - sent,
              policyCloses: flooder.policyCloses - closes,
              refusedReconnects: flooder.refusedReconnects - refused,
              logLines: logLines - lines,
              seconds,
            };
          };
          const quiet = await measure(false);
          const flooded = await measure(true);

          const row = (label: string, w: Window) => [
            label,
            ms(percentile(w.health, 0.5)),
            ms(percentile(w.health, 0.99)),
            ms(percentile(w.commands, 0.5)),
            ms(percentile(w.commands, 0.99)),
            String(w.commands.length),
            `${w.framesSent} (${(w.framesSent / w.seconds).toFixed(0)}/s)`,
            String(w.policyCloses),
            String(w.refusedReconnects),
            String(w.logLines),
            String(w.roundTrips),
          ];
          ctx.table(
            [
              "window",
              "health p50 ms",
              "health p99 ms",
              "command p50 ms",
              "command p99 ms",
              "commands",
              "flood frames sent",
              "closed 1008",
              "reconnects refused",
              "log lines",
              "db round trips",
            ],
            [row("no flood", quiet), row(`one socket flooding (${ctx.flood.rate}/s asked)`, flooded)],
          );
          ctx.log(
            `with the flood: /v1/health p99 ${(percentile(flooded.health, 0.99) / percentile(quiet.health, 0.99)).toFixed(1)}×, ` +
              `the neighbour's command p99 ${(percentile(flooded.commands, 0.99) / percentile(quiet.commands, 0.99)).toFixed(1)}× the quiet window's; ` +
              `${flooded.roundTrips} database round trips for ${flooded.framesSent} flood frames`,
          );
          if (neighbour.disconnects.length)
            throw new Error(`the neighbour was disconnected: ${JSON.stringify(neighbour.disconnects.slice(0, 3))}`);
        } finally {
          await flooder.stop();
          await neighbour.stop();
        }
      },
      { onOutput: () => void logLines++ },
    );
  },
};

/** An agent whose socket, once welcomed, sends frames at `rate` a second while flooding is on. */
class Flooder {
  readonly daemon: FakeDaemon;
  framesSent = 0;
  policyCloses = 0;
  /** Connects the NodeDO refused while the node cooled down after a policy close (429). */
  refusedReconnects = 0;
  #socket: SocketLike | undefined;
  #flooding = false;
  #timer: ReturnType<typeof setInterval> | undefined;
  #n = 0;

  constructor(
    private readonly stack: BenchStack,
    private readonly rate: number,
  ) {
    this.daemon = new FakeDaemon({
      baseUrl: stack.url,
      transport: this.#capturing(nodeTransport()),
      role: "node",
      hostname: "bench-flooder",
    });
    this.daemon.client.on("disconnected", (e) => void (e.code === CloseCode.POLICY_VIOLATION && this.policyCloses++));
    this.daemon.client.on("connect-failed", (e) => void (e.error.status === 429 && this.refusedReconnects++));
  }

  async start(): Promise<void> {
    const { token } = await callApi<{ token: string }>(this.stack, "joinTokens.create", { role: "node" });
    await this.daemon.join(token, { hostname: "bench-flooder" });
    await this.daemon.connect(30_000);
    this.#timer = setInterval(() => this.#tick(), TICK_MS);
  }

  flood(on: boolean): void {
    this.#flooding = on;
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.daemon.stop();
  }

  #tick(): void {
    if (!this.#flooding || !this.daemon.connected || !this.#socket) return;
    for (let i = 0; i < (this.rate * TICK_MS) / 1000; i++) {
      const n = this.#n++;
      this.#socket.send(
        n % 2 === 0
          ? JSON.stringify({ t: "ack", id: String(n) })
          : JSON.stringify({ t: "result", id: String(900_000_000 + n), key: `flood-${n}`, ok: true, output: {} }),
      );
      this.framesSent++;
    }
  }

  /** The transport, keeping the socket it opened last (the one the flood goes out on). */
  #capturing(inner: AgentTransport): AgentTransport {
    return {
      fetch: inner.fetch,
      openSocket: async (url, headers) => (this.#socket = await inner.openSocket(url, headers)),
    };
  }
}

/** Runs `once` back to back until `until`; the latencies it took, sorted. */
async function probe(until: number, once: () => Promise<void>): Promise<Float64Array> {
  const samples: number[] = [];
  while (performance.now() < until) {
    const t0 = performance.now();
    await once();
    samples.push(performance.now() - t0);
  }
  return Float64Array.from(samples).sort();
}

async function healthOnce(stack: BenchStack): Promise<void> {
  const res = await fetch(`${stack.url}/v1/health`);
  await res.arrayBuffer();
  if (!res.ok) throw new Error(`GET /v1/health answered ${res.status}`);
}

/** One command to the agent and back: commands.create until its result-ack arrives. */
function commandRoundTrip(stack: BenchStack, daemon: FakeDaemon, nodeId: string): () => Promise<void> {
  const acked = new Set<string>();
  const waiting = new Map<string, () => void>();
  daemon.client.on("result-ack", ({ id }) => {
    acked.add(id);
    waiting.get(id)?.();
  });
  return async () => {
    const { id } = await callApi<{ id: string }>(stack, "commands.create", { node: nodeId, kind: "agent.ping", body: {} });
    if (!acked.has(id)) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`command ${id}: no result-ack within ${ROUND_TRIP_TIMEOUT_MS} ms`)),
          ROUND_TRIP_TIMEOUT_MS,
        );
        waiting.set(id, () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    waiting.delete(id);
    acked.delete(id);
  };
}
