// Section "commands": the command round trip, enqueue → deliver → result recorded, measured
// end to end with a real agent, beside the bare floor of the same path: a Durable Object
// WebSocket echo that does one Postgres insert per message. The ratio is what the command
// path (API envelope, transactional enqueue, the NodeDO's delivery and result intake, the
// agent's journal and signature) costs over one socket hop plus one write.
//
// One FakeDaemon (the real AgentClient, in-memory journal, `ws` sockets) runs in this process
// and answers agent.ping. Each round trip, one at a time:
//   t0  POST /v1/commands.create {node, kind: "agent.ping"}   (the API commits the row, answers,
//       and wakes the NodeDO after the response)
//       the NodeDO reads the open commands (one statement) and sends the frame; the agent journals,
//       acks, runs the handler, signs and sends the result; the NodeDO records it (one statement)
//   t1  the agent receives result-ack for that command id (the result is in Postgres)
import { sql } from "drizzle-orm";
import { WebSocket } from "ws";
import { nodeTransport } from "../agent/node-transport.ts";
import { FakeDaemon } from "../testing/index.ts";
import { one, rows } from "../core/store/database.ts";
import { openNodeStore } from "../local/node-store.ts";
import { cpuLine, cpuShares, cpuSnapshot, percentile, type CpuShare } from "./load.ts";
import { printQueryStats, readQueryStats } from "./query-stats.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { callApi, ms, target, withStack, type BenchStack } from "./stack.ts";

/** What the EchoDO (bench/echo-do.ts) inserts into, one row per message. */
const ECHO_TABLE_DDL =
  "CREATE TABLE IF NOT EXISTS bench_echo (id bigserial PRIMARY KEY, body text NOT NULL, at timestamptz NOT NULL DEFAULT compute_now())";

/** How long one round trip may take before the section gives up (the NodeDO's sweep is 30 s). */
const ROUND_TRIP_TIMEOUT_MS = 15_000;

interface CommandSample {
  /** t0 → result-ack: the figure. */
  total: number;
  /** t0 → the API's answer to commands.create. */
  http: number;
  /**
   * t0 → the command frame reached the agent. The NodeDO is woken once the API has answered, but
   * the frame can reach the agent before the client has read that answer: delivered - http may be negative.
   */
  delivered: number;
  /** command frame → the agent sent its result (journal, ack, handler, signature). */
  agent: number;
  /** result sent → result-ack (the NodeDO's recording statement). */
  recorded: number;
}

export const commandsSection: BenchSection = {
  id: "commands",
  title: "Command round trip (enqueue → deliver → result recorded) vs bare DO WebSocket echo + one insert",
  async run(ctx) {
    await withStack(ctx, "commands", async (stack) => {
      const n = ctx.commands;
      const warmup = Math.min(50, Math.max(5, Math.ceil(n / 20)));
      const db = await openNodeStore(stack.databaseUrl);
      const daemon = new FakeDaemon({
        baseUrl: stack.url,
        transport: nodeTransport(),
        role: "node",
        handlers: { "agent.ping": () => ({ pong: true }) },
      });
      try {
        await db.db.execute(sql.raw(ECHO_TABLE_DDL));
        const { token } = await callApi<{ token: string }>(stack, "joinTokens.create", { role: "node" });
        const { nodeId } = await daemon.join(token, { hostname: "bench-commands" });
        await daemon.connect(30_000);

        // ---- the command round trip
        const at = { command: new Map<string, number>(), result: new Map<string, number>(), ack: new Map<string, number>() };
        const waiting = new Map<string, () => void>();
        daemon.client.on("command", (f) => at.command.set(f.id, performance.now()));
        daemon.client.on("result", (r) => void (at.result.has(r.id) || at.result.set(r.id, performance.now())));
        daemon.client.on("result-ack", ({ id }) => {
          at.ack.set(id, performance.now());
          waiting.get(id)?.();
        });
        const roundTrip = async (): Promise<CommandSample> => {
          const t0 = performance.now();
          const { id } = await callApi<{ id: string }>(stack, "commands.create", { node: nodeId, kind: "agent.ping", body: {} });
          const http = performance.now() - t0;
          if (!at.ack.has(id)) {
            await new Promise<void>((resolve, reject) => {
              const timer = setTimeout(() => {
                waiting.delete(id);
                reject(
                  new Error(
                    `command ${id}: no result-ack within ${ROUND_TRIP_TIMEOUT_MS} ms (delivered: ${at.command.has(id)}, result sent: ${at.result.has(id)})`,
                  ),
                );
              }, ROUND_TRIP_TIMEOUT_MS);
              waiting.set(id, () => {
                clearTimeout(timer);
                waiting.delete(id);
                resolve();
              });
            });
          }
          const [tc, tr, ta] = [at.command.get(id)!, at.result.get(id)!, at.ack.get(id)!];
          for (const m of Object.values(at)) m.delete(id);
          return { total: ta - t0, http, delivered: tc - t0, agent: tr - tc, recorded: ta - tr };
        };
        for (let i = 0; i < warmup; i++) await roundTrip();
        await readQueryStats(stack.url, true);
        const commands = await measure(n, roundTrip);
        const commandQueries = await readQueryStats(stack.url, true);

        // ---- the bare floor: one DO, one socket, one insert per message
        const echo = await openEcho(stack);
        let echoes: Measured<number>;
        try {
          const echoOnce = async (i: number) => {
            const t0 = performance.now();
            await echo.roundTrip(`m${i}`);
            return performance.now() - t0;
          };
          for (let i = 0; i < warmup; i++) await echoOnce(-i - 1);
          echoes = await measure(n, echoOnce);
        } finally {
          echo.close();
        }

        // ---- figures
        const totals = sorted(commands.samples.map((s) => s.total));
        const echoSorted = sorted(echoes.samples);
        const row = (label: string, values: Float64Array, elapsed: number) => [
          label,
          String(values.length),
          ms(percentile(values, 0.5)),
          ms(percentile(values, 0.9)),
          ms(percentile(values, 0.99)),
          ms(values[values.length - 1]!),
          (values.length / elapsed).toFixed(0),
        ];
        ctx.table(
          ["path", "round trips", "p50 ms", "p90 ms", "p99 ms", "max ms", "per s"],
          [
            row("command (commands.create → result-ack)", totals, commands.seconds),
            row("bare (DO ws echo + 1 INSERT)", echoSorted, echoes.seconds),
          ],
        );
        const p50 = percentile(totals, 0.5) / percentile(echoSorted, 0.5);
        const p99 = percentile(totals, 0.99) / percentile(echoSorted, 0.99);
        ctx.log(
          `ratio command / bare: p50 ${p50.toFixed(1)}× ${target("≤ 2×", p50 <= 2)}, p99 ${p99.toFixed(1)}× ${target("≤ 3×", p99 <= 3)} (p50 ${ms(percentile(totals, 0.5) - percentile(echoSorted, 0.5))} ms over the bare path)`,
        );
        ctx.log("where a command's time goes (p50 and p99 of each consecutive segment; per command they add up to its total):");
        const segments: [string, (s: CommandSample) => number][] = [
          ["t0 → the API answers commands.create (new pool, auth, IAM, enqueue transaction)", (s) => s.http],
          ["→ the command frame reaches the agent (wake-up, the NodeDO's delivery statement)", (s) => s.delivered - s.http],
          ["→ the agent sends its result (journal, ack, handler, Ed25519 signature)", (s) => s.agent],
          ["→ result-ack (the NodeDO's recording statement)", (s) => s.recorded],
        ];
        const width = Math.max(...segments.map(([label]) => label.length));
        for (const [label, pick] of segments) {
          const v = sorted(commands.samples.map(pick));
          ctx.log(`  ${label.padEnd(width)}  p50 ${ms(percentile(v, 0.5)).padStart(7)}  p99 ${ms(percentile(v, 0.99)).padStart(7)} ms`);
        }
        printQueryStats(
          ctx,
          "where the database time goes, per query kind (the Worker's and the NodeDO's round trips while measuring; ms from send to answer)",
          commandQueries,
          { count: n, unit: "command" },
        );
        ctx.log("CPU while measuring (100% = one core):");
        ctx.log(`  commands: ${cpuLine(commands.cpu)}`);
        ctx.log(`  bare:     ${cpuLine(echoes.cpu)}`);

        // ---- every command was recorded succeeded, every echo was inserted
        const states = await rows<{ state: string; n: number }>(
          db.db,
          sql`SELECT state, count(*)::int AS n FROM bc_commands WHERE node_id = ${nodeId} GROUP BY state ORDER BY state`,
        );
        const inserted = Number((await one<{ n: number }>(db.db, sql`SELECT count(*)::int AS n FROM bench_echo`))!.n);
        const succeeded = states.find((s) => s.state === "succeeded")?.n ?? 0;
        ctx.log(
          `recorded: ${states.map((s) => `${s.n} ${s.state}`).join(", ")} of ${warmup + n} commands (${warmup} warm-up); ${inserted} echo rows of ${warmup + n}`,
        );
        if (succeeded !== warmup + n || states.length !== 1)
          throw new Error(`expected all ${warmup + n} commands succeeded, found ${JSON.stringify(states)}`);
        if (inserted !== warmup + n) throw new Error(`expected ${warmup + n} bench_echo rows, found ${inserted}`);
        if (daemon.serverErrors.length || daemon.disconnects.length) {
          throw new Error(
            `the agent saw ${daemon.serverErrors.length} error frames and ${daemon.disconnects.length} disconnects: ${JSON.stringify([...daemon.serverErrors, ...daemon.disconnects].slice(0, 3))}`,
          );
        }
      } catch (err) {
        reportTail(ctx, stack);
        throw err;
      } finally {
        await daemon.stop();
        await db.close();
      }
    });
  },
};

interface Measured<T> {
  samples: T[];
  seconds: number;
  cpu: CpuShare[];
}

/** Runs `once` n times in a row, with the CPU each process of the tree spent meanwhile. */
async function measure<T>(n: number, once: (i: number) => Promise<T>): Promise<Measured<T>> {
  const before = cpuSnapshot();
  const started = performance.now();
  const samples: T[] = [];
  for (let i = 0; i < n; i++) samples.push(await once(i));
  const seconds = (performance.now() - started) / 1000;
  return { samples, seconds, cpu: cpuShares(before, cpuSnapshot(), seconds) };
}

const sorted = (values: number[]) => Float64Array.from(values).sort();

/** A `ws` client to GET /bench/echo: send one message, wait for the same text back. */
async function openEcho(stack: BenchStack): Promise<{ roundTrip(text: string): Promise<void>; close(): void }> {
  const ws = new WebSocket(`${stack.url.replace(/^http/, "ws")}/bench/echo`, { perMessageDeflate: false });
  await new Promise<void>((resolve, reject) => {
    ws.once("open", () => resolve());
    ws.once("error", reject);
    ws.once("unexpected-response", (_req, res) => reject(new Error(`/bench/echo refused the upgrade with HTTP ${res.statusCode}`)));
  });
  let pending: { text: string; resolve: () => void; reject: (e: Error) => void } | undefined;
  ws.on("message", (data) => {
    const text = data.toString();
    const p = pending;
    pending = undefined;
    if (!p) return;
    if (text === p.text) p.resolve();
    else p.reject(new Error(`/bench/echo answered ${JSON.stringify(text.slice(0, 200))} to ${JSON.stringify(p.text)}`));
  });
  ws.on("close", (code) => pending?.reject(new Error(`/bench/echo closed with ${code}`)));
  return {
    roundTrip: (text) =>
      new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`/bench/echo: no echo within ${ROUND_TRIP_TIMEOUT_MS} ms`)), ROUND_TRIP_TIMEOUT_MS);
        pending = { text, resolve: () => (clearTimeout(timer), resolve()), reject: (e) => (clearTimeout(timer), reject(e)) };
        ws.send(text);
      }),
    close: () => ws.close(1000),
  };
}

function reportTail(ctx: BenchContext, stack: BenchStack): void {
  const tail = stack.wranglerTail();
  if (tail.length) ctx.log(`last wrangler output:\n    ${tail.join("\n    ")}`);
}
