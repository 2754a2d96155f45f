// Section "agents": how many simulated agents one `wrangler dev` holds connected with
// heartbeats, and how much memory each costs. Agents are FakeDaemons (the real AgentClient with
// an in-memory journal and `ws` sockets) living in this process; each joins with its own join
// token and keeps a socket to its own NodeDO, pinging every BENCH_AGENTS_HEARTBEAT seconds
// (answered by the runtime's auto-response, without waking the object).
//
// The ramp adds agents in steps (25, 50, 100, 200, ... up to BENCH_AGENTS_MAX). After each step
// it waits BENCH_AGENTS_HOLD seconds and checks that every agent is still connected: no
// disconnect and no failed connect since it joined, a pong during the hold, and nodes.list
// {state: "connected"} counting all of them. It stops at the cap or at the first step that
// does not hold. workerd's RSS (the processes wrangler dev runs the Worker and its Durable
// Objects in, summed) is read at the baseline and after each step: memory per agent is ΔRSS ÷
// Δagents.
import { nodeTransport } from "../agent/node-transport.ts";
import type { AgentTransport } from "../agent/client.ts";
import { FakeDaemon } from "../testing/index.ts";
import { PONG } from "../core/protocol.ts";
import { cpuLine, cpuShares, cpuSnapshot } from "./load.ts";
import { collectGarbage, descendantsFds, descendantsRss, mib, type FdCount } from "./proc.ts";
import type { BenchSection } from "./run.ts";
import { callApi, mapLimit, seconds, target, withStack, type BenchStack } from "./stack.ts";

/**
 * Agents joining and connecting at once during a ramp (each: a token, a join, a socket and its
 * hello). With the pooler each request no longer forks a backend: more in flight keeps 2 CPUs busy.
 */
const RAMP_CONCURRENCY = 16;
/** An agent that has not been welcomed this long after its join counts as failed. */
const CONNECT_TIMEOUT_MS = 30_000;
/** Stopping everyone: how long Postgres may take to record them all disconnected. */
const DISCONNECT_TIMEOUT_MS = 30_000;

class Agent {
  readonly daemon: FakeDaemon;
  /** performance.now() of the last PONG this agent received; 0 before the first. */
  lastPong = 0;
  pongs = 0;

  constructor(
    stack: BenchStack,
    readonly index: number,
    heartbeatMs: number,
  ) {
    this.daemon = new FakeDaemon({
      baseUrl: stack.url,
      transport: countingPongs(nodeTransport(), () => {
        this.pongs++;
        this.lastPong = performance.now();
      }),
      role: "node",
      hostname: `bench-agent-${index}`,
      heartbeatMs,
    });
  }

  async start(stack: BenchStack): Promise<void> {
    const { token } = await callApi<{ token: string }>(stack, "joinTokens.create", { role: "node" });
    await this.daemon.join(token);
    await this.daemon.connect(CONNECT_TIMEOUT_MS);
  }

  get counters() {
    return this.daemon.client.counters;
  }
}

interface Step {
  agents: number;
  rampSeconds: number;
  workerdBytes: number;
  workerdFds: number;
  /** This process's RSS and live JS heap (after a full GC). */
  rss: number;
  heap: number;
  pings: number;
  pongs: number;
  connectedInDb: number;
  problems: string[];
}

export const agentsSection: BenchSection = {
  id: "agents",
  title: "Simulated agents one wrangler dev holds connected with heartbeats, and memory per agent",
  async run(ctx) {
    const { max, holdSeconds, lastHoldSeconds, heartbeatSeconds } = ctx.agents;
    // PGlite's server warns each time a connection waits over 5 s for another's transaction;
    // under a large ramp that is thousands of lines. Count them instead, and say so once.
    const waits = countWarnings(/^\[pglite-server\] a connection has waited/);
    await withStack(ctx, "agents", async (stack) => {
      const agents: Agent[] = [];
      try {
        // Baseline: the stack is up and has served a request, no agent yet.
        await callApi(stack, "nodes.list", {});
        await sleep(1000);
        const base = { workerd: descendantsRss("workerd"), fds: descendantsFds("workerd"), ...benchMemory() };
        if (base.workerd.processes === 0) ctx.log("note: no workerd process found under this one (no /proc?); memory figures are n/a");
        ctx.log(
          `baseline: workerd RSS ${mib(base.workerd.bytes).toFixed(0)} MiB (${base.workerd.processes} process${base.workerd.processes === 1 ? "" : "es"}), this process RSS ${mib(base.rss).toFixed(0)} MiB, JS heap ${mib(base.heap).toFixed(0)} MiB; workerd file descriptors ${fdLine(base.fds)}`,
        );

        const steps: Step[] = [];
        let stopped = "";
        let lastFds = base.fds;
        for (const target of rampSteps(max)) {
          // Ramp: new agents join and connect, RAMP_CONCURRENCY at a time.
          const rampStarted = performance.now();
          const rampCpu = cpuSnapshot();
          const batch = Array.from(
            { length: target - agents.length },
            (_, i) => new Agent(stack, agents.length + i, heartbeatSeconds * 1000),
          );
          agents.push(...batch);
          const problems: string[] = [];
          try {
            await mapLimit(batch, RAMP_CONCURRENCY, (a) => a.start(stack));
          } catch (err) {
            problems.push(`ramp: ${err instanceof Error ? err.message : String(err)}`);
          }
          const rampSeconds = (performance.now() - rampStarted) / 1000;
          const rampCpuLine = cpuLine(cpuShares(rampCpu, cpuSnapshot(), rampSeconds));

          // Hold, then check every agent is still there and its heartbeats are answered.
          const before = totals(agents);
          const holdStarted = performance.now();
          const holdCpu = cpuSnapshot();
          if (!problems.length) await sleep((target === max ? lastHoldSeconds : holdSeconds) * 1000);
          const holdCpuLine = problems.length
            ? "skipped"
            : cpuLine(cpuShares(holdCpu, cpuSnapshot(), (performance.now() - holdStarted) / 1000));
          const after = totals(agents);
          const notConnected = agents.filter((a) => !a.daemon.connected).length;
          const silent = agents.filter((a) => a.lastPong < holdStarted).length;
          if (notConnected) problems.push(`${notConnected} not connected`);
          if (after.disconnects) problems.push(`${after.disconnects} disconnects`);
          if (after.connectFailures) problems.push(`${after.connectFailures} failed connects`);
          if (!problems.length && silent) problems.push(`${silent} got no pong during the hold`);
          const fatal = agents.find((a) => a.daemon.fatal)?.daemon.fatal;
          if (fatal) problems.push(`fatal: ${fatal.code} ${fatal.message}`);
          let connectedInDb = -1;
          try {
            connectedInDb = await connectedNodes(stack, agents);
            if (connectedInDb !== target) problems.push(`nodes.list says ${connectedInDb} connected`);
          } catch (err) {
            problems.push(
              `nodes.list failed: ${err instanceof Error ? `${err.message}${err.cause ? ` (${String(err.cause)})` : ""}` : String(err)}`,
            );
          }
          const fds = descendantsFds("workerd");

          const step: Step = {
            agents: target,
            rampSeconds,
            workerdBytes: descendantsRss("workerd").bytes,
            workerdFds: fds.busiest,
            ...benchMemory(),
            pings: after.pings - before.pings,
            pongs: after.pongs - before.pongs,
            connectedInDb,
            problems,
          };
          steps.push(step);
          lastFds = fds;
          ctx.log(
            `${String(target).padStart(5)} agents: ${problems.length ? `did not hold (${problems.join("; ")})` : "held"}; CPU ramp: ${rampCpuLine}; hold: ${holdCpuLine}` +
              (waits.count ? `; PGlite lock waits over 5 s so far: ${waits.count}` : ""),
          );
          if (problems.length) {
            stopped = `stopped at the first step that did not hold (${target})`;
            break;
          }
        }

        // ---- figures
        const kib = (bytes: number) => (bytes / 1024).toFixed(0);
        const rows = steps.map((s, i) => {
          const prev = i === 0 ? { agents: 0, workerdBytes: base.workerd.bytes } : steps[i - 1]!;
          return [
            String(s.agents),
            s.problems.length ? "no" : "yes",
            `${s.rampSeconds.toFixed(1)}`,
            ((s.agents - prev.agents) / s.rampSeconds).toFixed(0),
            `${s.pongs}/${s.pings}`,
            s.connectedInDb < 0 ? "?" : String(s.connectedInDb),
            mib(s.workerdBytes).toFixed(0),
            kib((s.workerdBytes - base.workerd.bytes) / s.agents),
            kib((s.workerdBytes - prev.workerdBytes) / (s.agents - prev.agents)),
            String(s.workerdFds),
            ((s.workerdFds - base.fds.busiest) / s.agents).toFixed(1),
            mib(s.rss).toFixed(0),
            mib(s.heap).toFixed(0),
            kib((s.heap - base.heap) / s.agents),
          ];
        });
        ctx.table(
          [
            "agents",
            "held",
            "ramp s",
            "joins/s",
            "pongs/pings",
            "connected (db)",
            "workerd MiB",
            "KiB/agent",
            "marginal KiB/agent",
            "max fds",
            "fds/agent",
            "bench RSS MiB",
            "bench heap MiB",
            "heap KiB/agent",
          ],
          rows,
        );
        const good = steps.filter((s) => !s.problems.length);
        const best = good[good.length - 1];
        ctx.log(
          best
            ? `held: ${best.agents} agents connected with a ping every ${heartbeatSeconds} s; ${stopped || `reached the cap (BENCH_AGENTS_MAX=${max})`}`
            : `held: none; ${stopped}`,
        );
        const bestHold = best?.agents === max ? lastHoldSeconds : holdSeconds;
        ctx.log(
          `10,000 agents held 60 s: ${best ? `${best.agents} held ${bestHold} s` : "none held"} ${target("10,000 for 60 s", (best?.agents ?? 0) >= 10_000 && bestHold >= 60)}`,
        );
        if (best) {
          ctx.log(
            `memory per agent at ${best.agents}: workerd ${kib((best.workerdBytes - base.workerd.bytes) / best.agents)} KiB (ΔRSS ÷ agents over the baseline);` +
              ` this process's JS heap ${kib((best.heap - base.heap) / best.agents)} KiB (a FakeDaemon: AgentClient, its ws socket, key, timers)`,
          );
        }
        ctx.log(`workerd file descriptors at ${steps[steps.length - 1]?.agents} agents: ${fdLine(lastFds)}`);
        const last = steps[steps.length - 1];
        if (last) ctx.log(fdCeiling(base.fds, last.agents, lastFds));
        ctx.log(
          "columns: ramp s = time to join and connect that step's new agents; pongs/pings = heartbeats answered/sent during the hold;",
        );
        ctx.log(
          "  KiB/agent = (workerd RSS − baseline) ÷ agents; marginal = ΔRSS ÷ Δagents from the previous step; max fds = the most open in one workerd process, fds/agent its growth ÷ agents;",
        );
        ctx.log(
          `  bench RSS/heap = this process (the agents${stack.embedded ? ", PGlite and the bridge" : " and the bridge"}), heap after a full GC; heap KiB/agent = (heap − baseline) ÷ agents.`,
        );

        // ---- everyone leaves cleanly, and Postgres records it
        const leaving = performance.now();
        await stopAll(agents);
        const deadline = Date.now() + DISCONNECT_TIMEOUT_MS;
        let left = -1;
        while (left !== 0 && Date.now() < deadline) {
          left = await connectedNodes(stack, agents);
          if (left) await sleep(250);
        }
        ctx.log(
          `${agents.length} agents stopped (close 1000); recorded disconnected within ${seconds(leaving)} s${left ? `, except ${left} still connected after ${DISCONNECT_TIMEOUT_MS / 1000} s` : ""}`,
        );
        if (!best) throw new Error(`not even the first step (${steps[0]?.agents}) held: ${steps[0]?.problems.join("; ")}`);
        // After a step that broke (a crashed or restarted workerd never runs webSocketClose) stale
        // rows are part of the finding; when everything held, they are a bug.
        if (left && !stopped)
          throw new Error(`${left} nodes were still recorded connected ${DISCONNECT_TIMEOUT_MS / 1000} s after their agents stopped`);
      } catch (err) {
        const tail = stack.wranglerTail();
        if (tail.length) ctx.log(`last wrangler output:\n    ${tail.join("\n    ")}`);
        throw err;
      } finally {
        await stopAll(agents);
      }
    }).finally(() => waits.restore());
  },
};

/** Swallows console.warn lines matching pattern (counting them) until restore(). */
function countWarnings(pattern: RegExp): { readonly count: number; restore(): void } {
  const original = console.warn;
  let count = 0;
  console.warn = (...args: unknown[]) => {
    if (typeof args[0] === "string" && pattern.test(args[0])) count++;
    else original(...args);
  };
  return {
    get count() {
      return count;
    },
    restore: () => void (console.warn = original),
  };
}

/** 25, 50, 100, 200, ... below max, then max itself. */
export function rampSteps(max: number): number[] {
  const steps: number[] = [];
  for (let n = 25; n < max; n *= 2) steps.push(n);
  steps.push(max);
  return steps;
}

/** How many of these agents' nodes Postgres records connected (a DATABASE_URL may hold other runs' nodes). */
async function connectedNodes(stack: BenchStack, agents: Agent[]): Promise<number> {
  const ours = new Set(agents.map((a) => a.daemon.nodeId).filter(Boolean));
  const { nodes } = await callApi<{ nodes: { id: string }[] }>(stack, "nodes.list", { state: "connected" });
  return nodes.filter((n) => ours.has(n.id)).length;
}

function fdLine(fds: FdCount): string {
  const kinds = Object.entries(fds.kinds)
    .sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${v} ${k}`)
    .join(", ");
  return `${fds.open} open (${kinds}); the busiest process ${fds.busiest} of its limit ${fds.limit}`;
}

/**
 * How many agents each workerd process's open-file limit allows at the file descriptors per agent
 * measured: the open-file limit caps the count before memory does on a small machine.
 */
function fdCeiling(base: FdCount, agents: number, now: FdCount): string {
  const parts = Object.entries(now.perProcess)
    .sort((a, b) => b[1] - a[1])
    .map(([pid, open]) => {
      const before = base.perProcess[Number(pid)] ?? 0;
      const perAgent = (open - before) / agents;
      const ceiling = perAgent > 0 ? Math.floor((now.limit - before) / perAgent) : Infinity;
      return `pid ${pid}: ${open} open, ${perAgent.toFixed(1)}/agent → at most ${Number.isFinite(ceiling) ? ceiling : "∞"} agents`;
    });
  return `file descriptors per agent in each workerd process (busiest first; wrangler's proxy holds each agent's socket twice, in and out), against the limit of ${now.limit}: ${parts.join("; ")}`;
}

function benchMemory(): { rss: number; heap: number } {
  collectGarbage();
  const m = process.memoryUsage();
  return { rss: m.rss, heap: m.heapUsed };
}

function totals(agents: Agent[]) {
  const sum = { pings: 0, pongs: 0, disconnects: 0, connectFailures: 0 };
  for (const a of agents) {
    sum.pings += a.counters.pingsSent;
    sum.pongs += a.pongs;
    sum.disconnects += a.counters.disconnects;
    sum.connectFailures += a.counters.connectFailures;
  }
  return sum;
}

async function stopAll(agents: Agent[]): Promise<void> {
  await Promise.all(agents.map((a) => a.daemon.stop().catch(() => {})));
}

/** The transport, with a callback for every PONG the agent receives (AgentClient counts pings, not pongs). */
function countingPongs(inner: AgentTransport, onPong: () => void): AgentTransport {
  return {
    fetch: inner.fetch,
    async openSocket(url, headers) {
      const sock = await inner.openSocket(url, headers);
      return {
        send: (text) => sock.send(text),
        close: (code, reason) => sock.close(code, reason),
        terminate: () => sock.terminate(),
        listen: (handlers) =>
          sock.listen({
            message: (text) => {
              if (text === PONG) onPong();
              handlers.message(text);
            },
            close: handlers.close,
          }),
      };
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
