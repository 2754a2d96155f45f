// The store: drizzle with interactive transactions, on one of two drivers.
// - A Hyperdrive binding (env.HYPERDRIVE, the production setup: docs/operations.md): node-postgres
//   over TCP (cloudflare:sockets) to Hyperdrive, which keeps pooled connections to Neon. Locally
//   wrangler dev emulates the binding with a TCP connection to the stack's localConnectionString.
// - Otherwise DATABASE_URL through @neondatabase/serverless's Pool (Postgres over WebSocket); locally
//   the same driver reaches a plain Postgres (or PGlite) through a WebSocket-to-TCP bridge.
// Both hand callers the same Db and Tx: @neondatabase/serverless is a fork of node-postgres, and
// drizzle's two sessions build the same results ({ rows, rowCount, fields }) with the same type parsers.
import { neonConfig, Pool, type PoolClient } from "@neondatabase/serverless";
import { sql, type ExtractTablesWithRelations, type SQL } from "drizzle-orm";
import { drizzle, type NeonDatabase } from "drizzle-orm/neon-serverless";
import type { NeonTransaction } from "drizzle-orm/neon-serverless";
import { drizzle as drizzleNodePostgres } from "drizzle-orm/node-postgres";
import pg from "pg";
import type { Bindings } from "../bindings.ts";
import { ComputeError, invalidConfig } from "../errors.ts";

export type Db = NeonDatabase<Record<string, never>>;
/** The transaction handed to handlers and ports: state, events, work and commands share it. */
export type Tx = NeonTransaction<Record<string, never>, ExtractTablesWithRelations<Record<string, never>>>;

/** What a statement returns (its rows). */
export type StatementResult = Awaited<ReturnType<Db["execute"]>>;

/** A connection to the system of record, opened per request (or per Durable Object). */
export interface Store {
  readonly db: Db;
  /**
   * An interactive transaction. Its BEGIN is held back until fn sends its first statement, so a
   * transaction that sends none costs no round trip (see lazyTransactions).
   */
  transaction<T>(fn: (tx: Tx) => Promise<T>): Promise<T>;
  /**
   * A write that is one statement (CTEs included): atomic on its own, so it is sent alone, with no
   * BEGIN and COMMIT around it (one round trip instead of three). A commit boundary like a
   * transaction's: the chaos harnesses crash before and after it.
   */
  write(statement: SQL): Promise<StatementResult>;
  close(): Promise<void>;
}

/** What sends a statement: the store's db or a transaction (execute), or the store itself (store.write). */
export type Runner = Pick<Db | Tx, "execute"> | Pick<Store, "write">;

/**
 * A statement's rows, as the type its caller names: the columns the statement selects (or
 * returns), with the types the driver parses them to (a bigint comes back as a string, a json
 * column parsed). Nothing checks them at run time. Given the store, the statement is sent as a
 * one-statement write (store.write).
 */
export async function rows<T extends object = Record<string, unknown>>(runner: Runner, statement: SQL): Promise<T[]> {
  const result = "write" in runner ? await runner.write(statement) : await runner.execute(statement);
  // The one cast: what the statement selects is known to its caller only (drizzle's execute<TRow> is the same cast).
  return result.rows as T[];
}

/** A statement's first row, or undefined when it has none (see rows). */
export async function one<T extends object = Record<string, unknown>>(runner: Runner, statement: SQL): Promise<T | undefined> {
  return (await rows<T>(runner, statement))[0];
}

/** The database port: how the platform opens a Store from the Worker's environment. */
export interface DatabasePort {
  open(env: Bindings): Store;
}

export interface PostgresOptions {
  /** Connection string (over WebSocket); default: env.DATABASE_URL when no HYPERDRIVE is bound. */
  url?: string;
  /** A Hyperdrive binding (its connectionString, over TCP); default: env.HYPERDRIVE. Ignored when url is given. */
  hyperdrive?: { connectionString: string };
  /** host:port of a local WebSocket-to-TCP bridge; default: env.BC_DB_WS_PROXY. Unset for Neon. */
  wsProxy?: string;
  /** Connections per Store (per request); default 4. */
  maxConnections?: number;
  /**
   * Name every statement that has parameters, so each connection parses and plans it once and then
   * only binds and executes it (see namedStatements). Default off: it pays only on connections kept
   * across many statements (a pool every request shares, as the metal simulation's), and the server
   * must keep each connection's statements apart: Postgres directly, a pooler in session mode, or
   * pgbouncer 1.21+ with max_prepared_statements. Not the local PGlite server, whose one session
   * every connection shares (a second connection's Parse of the same name fails).
   */
  preparedStatements?: boolean;
  /**
   * On the Hyperdrive/TCP path: write a transaction's BEGIN (and a statement sendWithCommit holds)
   * together with the statement after it, in one round trip instead of two (node-postgres's pipeline
   * mode; see lazyTransactions). Default on. The WebSocket driver always sends them one by one.
   */
  pipeline?: boolean;
  /**
   * TEST AND BENCH HOOK: called once per message the driver sends and waits on (every statement,
   * a transaction's BEGIN and COMMIT included): a Postgres round trip, with its text, and a promise
   * of its duration in ms (from the send to the answer, an error included). Unset in production.
   */
  onRoundTrip?: RoundTripHook;
}

export type RoundTripHook = (statement: string, answeredMs: Promise<number>) => void;

export function postgres(options: PostgresOptions = {}): DatabasePort {
  return {
    open(env) {
      const hyperdrive = options.url === undefined ? (options.hyperdrive ?? env.HYPERDRIVE) : undefined;
      if (hyperdrive !== undefined) {
        const url = nonEmpty((hyperdrive as { connectionString?: unknown } | null)?.connectionString);
        if (!url) throw invalidConfig("the HYPERDRIVE binding has no connectionString: bind a Hyperdrive config (docs/operations.md)");
        const pipeline = options.pipeline ?? true;
        return openStore(new pg.Pool({ connectionString: url, max: options.maxConnections ?? 4, pipeline }), options);
      }
      const url = options.url ?? nonEmpty(env.DATABASE_URL);
      if (!url) throw invalidConfig("no database configured: bind HYPERDRIVE, set DATABASE_URL or pass database: postgres({ url })");
      const wsProxy = options.wsProxy ?? nonEmpty(env.BC_DB_WS_PROXY);
      if (wsProxy) useBridge(wsProxy);
      return openStore(new Pool({ connectionString: url, max: options.maxConnections ?? 4 }), options);
    },
  };
}

/** Points the driver at a local bridge (plain ws:// on loopback, no pipelined auth). */
export function useBridge(bridge: string): void {
  neonConfig.wsProxy = (host, port) => `${bridge}/v1?address=${host}:${port}`;
  neonConfig.useSecureWebSocket = false;
  neonConfig.pipelineConnect = false;
  neonConfig.pipelineTLS = false;
}

type Client = PoolClient | pg.PoolClient;

function openStore(pool: Pool | pg.Pool, { onRoundTrip, preparedStatements }: PostgresOptions): Store {
  // An idle client that drops (server restart, bridge gone) must not crash the isolate.
  pool.on("error", () => {});
  pool.on("connect", (client: Client) => {
    if (preparedStatements) namedStatements(client);
    if (onRoundTrip) timeQueries(client, onRoundTrip);
    lazyTransactions(client, (client as { pipeline?: boolean }).pipeline === true); // outermost, so the hook sees only what is sent
  });
  // The same drizzle database on either driver (see the top of this file): only the types' names differ.
  const db: Db = pool instanceof Pool ? drizzle({ client: pool }) : (drizzleNodePostgres({ client: pool }) as unknown as Db);
  let closed: Promise<void> | undefined;
  return {
    db,
    transaction: (fn) => db.transaction(fn),
    write: (statement) => db.execute(statement),
    close: () => (closed ??= pool.end().catch(() => {})),
  };
}

/** Marks a statement that sendWithCommit holds back until the transaction's next statement or its COMMIT. */
const WITH_COMMIT = "/* sent with COMMIT */ ";

/**
 * Runs `statement` in the transaction without waiting for it: it is held until the transaction's
 * next statement or its COMMIT and goes in the same round trip (or alone, a one-statement write,
 * when the transaction sends nothing else); a ROLLBACK drops it. Its result is not seen, and its
 * failure is the failure of the statement (or COMMIT) it went with. On the WebSocket driver, which
 * does not pipeline, a statement with parameters costs its own round trip when it is released; a
 * string (no parameters: quote every value in it with literal()) is sent with the COMMIT in one
 * simple query. Outside a store's transaction it runs at once.
 */
export async function sendWithCommit(tx: Tx, statement: string | SQL): Promise<void> {
  await tx.execute(typeof statement === "string" ? sql.raw(WITH_COMMIT + statement) : sql`${sql.raw(WITH_COMMIT)}${statement}`);
}

/** Quotes a value for a statement sent with no parameters (sendWithCommit). */
export function literal(value: string | number | null): string {
  if (value === null) return "NULL";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new ComputeError("INTERNAL", "a literal must be a finite number");
    return String(value);
  }
  // Postgres cannot store NUL in text, and the protocol ends a query's text at one.
  if (value.includes("\0")) throw new ComputeError("INVALID_ARGUMENT", "a value has a NUL character");
  return pg.escapeLiteral(value);
}

/**
 * Marks a statement written ahead of the next one without waiting for its answer (a pipelined BEGIN
 * or held statement): the round-trip hook reports the two as one round trip.
 */
const JOINS_NEXT = Symbol("joins the next statement's round trip");

/** A query's arguments as the driver takes them: (text | config, values?, callback?). */
type QueryArgs = unknown[];

const textOf = (args: QueryArgs) => {
  const first = args[0] as string | { text: string };
  return typeof first === "string" ? first : first.text;
};

const hasParameters = ([first, second]: QueryArgs) =>
  ((Array.isArray(second) ? second : (first as { values?: unknown[] }).values)?.length ?? 0) > 0;

/** The same query, marked as written ahead of the next one (JOINS_NEXT). */
const joiningNext = ([first, ...rest]: QueryArgs): QueryArgs => [
  { ...(typeof first === "string" ? { text: first } : (first as object)), [JOINS_NEXT]: true },
  ...rest,
];

/**
 * Every transaction on this client holds its BEGIN back until its first statement, and drops BEGIN
 * and COMMIT (or ROLLBACK) when there was none: a method whose handler reads nothing costs no round
 * trip for its transaction. Statements from sendWithCommit are held too, until the next statement or
 * the COMMIT. On a pipelining client (node-postgres's pipeline mode) everything held is written
 * together with the statement that releases it, in one round trip; otherwise each waits its turn,
 * except that a held statement with no parameters rides in one simple query with the COMMIT.
 */
function lazyTransactions(client: Client, pipelining: boolean): void {
  const query = client.query.bind(client) as (...args: QueryArgs) => Promise<unknown>;
  let inTransaction = false;
  let held: QueryArgs[] = []; // not sent yet: the BEGIN (until the first statement), then sendWithCommit's
  let begun = false; // the BEGIN has been sent
  const nothing = (command: string) => Promise.resolve({ command, rows: [], rowCount: null, fields: [] });
  /** Sends what is held, then `args`, and answers with the result of `args`. */
  const release = async (args: QueryArgs): Promise<unknown> => {
    const sends = [...held, args];
    [held, begun] = [[], true];
    if (!pipelining) {
      for (const statement of sends.slice(0, -1)) await query(...statement);
      return query(...args);
    }
    // All written before any answer is read. Each statement has its own Sync, so each is answered on
    // its own: a failure aborts the transaction and what follows it fails with "transaction aborted"
    // (a COMMIT answers ROLLBACK), so the first failure is the one to report.
    const stream = (client as { connection?: { stream?: { cork?: () => void; uncork?: () => void } } }).connection?.stream;
    stream?.cork?.(); // one write on a Node socket (the Workers socket has no cork and writes in order)
    const answers = sends.map((statement, i) => query(...(i < sends.length - 1 ? joiningNext(statement) : statement)));
    stream?.uncork?.();
    const settled = await Promise.allSettled(answers);
    const failed = settled.find((outcome) => outcome.status === "rejected");
    if (failed) throw failed.reason;
    return (settled.at(-1) as PromiseFulfilledResult<unknown>).value;
  };
  client.query = (async (...args: QueryArgs) => {
    const text = textOf(args);
    if (!inTransaction && /^\s*begin\b/i.test(text)) {
      [inTransaction, held, begun] = [true, [[text]], false];
      return nothing("BEGIN");
    }
    // The transaction's end (a savepoint's is "rollback to savepoint ..." and goes on as any statement).
    const end = inTransaction ? /^\s*(commit|rollback)\s*$/i.exec(text)?.[1]?.toLowerCase() : undefined;
    if (end) {
      const [pending, sent] = [held, begun];
      [inTransaction, held, begun] = [false, [], false];
      const withCommit = sent ? pending : pending.slice(1); // without the BEGIN not sent
      if (end === "rollback" || withCommit.length === 0) return sent ? query(...args) : nothing(end.toUpperCase());
      // Alone, a held statement is a one-statement write: atomic with no BEGIN and COMMIT.
      if (!sent && withCommit.length === 1) return query(...withCommit[0]!);
      held = pending;
      const last = withCommit.at(-1)!;
      // Without pipelining, a last held statement with no parameters rides in the COMMIT's simple query.
      if (!pipelining && !hasParameters(last)) {
        held.pop();
        return release([`${textOf(last)};\n${text}`]);
      }
      return release(args);
    }
    if (inTransaction && text.startsWith(WITH_COMMIT)) {
      held.push(args);
      return nothing("WITH COMMIT");
    }
    return held.length === 0 ? query(...args) : release(args);
  }) as PoolClient["query"];
}

/** Statements one connection keeps prepared, at most: a statement whose text varies must not grow the server's memory. */
const PREPARED_PER_CONNECTION = 500;

/**
 * Gives every statement with parameters a name derived from its text. node-postgres then sends its
 * Parse once per connection and afterwards only Bind and Execute, and Postgres reuses the parsed
 * statement and, after a few runs, its plan. A name is never reused for another text (the driver
 * refuses that), so a hash collision fails loudly instead of running the wrong statement.
 */
function namedStatements(client: Client): void {
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  const named = new Set<string>();
  client.query = ((...args: unknown[]) => {
    // (text | config, values?, callback?): the pool's own query() passes a callback, a transaction's client none.
    const first = args[0] as string | { text: string; name?: string };
    const config = typeof first === "string" ? { text: first } : first;
    if (!hasParameters(args) || config.name !== undefined) return query(...args);
    const name = statementName(config.text);
    if (!named.has(name)) {
      if (named.size >= PREPARED_PER_CONNECTION) return query(...args);
      named.add(name);
    }
    return query({ ...config, name }, ...args.slice(1));
  }) as PoolClient["query"];
}

/** A statement's name: "bc_" and a 53-bit hash of its text (cyrb53; Postgres keeps 63 bytes of a name). */
function statementName(text: string): string {
  let [h1, h2] = [0xdeadbeef, 0x41c6ce57];
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return `bc_${(4294967296 * (2097151 & h2) + (h1 >>> 0)).toString(36)}`;
}

/** Reports every query the client runs, with its duration (the pool's own queries run on its clients too). */
function timeQueries(client: Client, onRoundTrip: RoundTripHook): void {
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  let ahead: string[] = []; // written ahead of the next statement, in its round trip (JOINS_NEXT)
  client.query = ((...args: unknown[]) => {
    const first = args[0] as string | { [JOINS_NEXT]?: true };
    const text = textOf(args);
    if (typeof first !== "string" && first[JOINS_NEXT]) {
      ahead.push(text);
      return query(...args);
    }
    let answered!: (ms: number) => void;
    onRoundTrip([...ahead, text].join(";\n"), new Promise<number>((resolve) => (answered = resolve)));
    ahead = [];
    const started = performance.now();
    const result = query(...args);
    const done = () => answered(performance.now() - started);
    // A promise: timed to its answer (the caller still sees its rejection). A callback query: not timed.
    if (result instanceof Promise) result.then(done, done);
    else done();
    return result;
  }) as PoolClient["query"];
}

/** A variable that is set: an empty or non-string value (a misconfigured binding) counts as unset. */
function nonEmpty(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** Postgres error → typed error, without the driver's message (it may quote row values). */
export function fromPostgresError(err: unknown): ComputeError | undefined {
  // drizzle wraps the driver's error; the SQLSTATE is on the cause.
  for (let e = err, depth = 0; e && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const mapped = fromSqlState((e as { code?: unknown }).code);
    if (mapped) return mapped;
  }
  return undefined;
}

function fromSqlState(code: unknown): ComputeError | undefined {
  if (typeof code !== "string" || !/^[0-9A-Z]{5}$/.test(code)) return undefined;
  if (code === "23505") return new ComputeError("CONFLICT", "the resource already exists");
  if (code.startsWith("23")) return new ComputeError("FAILED_PRECONDITION", "a database constraint refused the change", { sqlstate: code });
  if (code === "40001" || code === "40P01")
    return new ComputeError("UNAVAILABLE", "the transaction conflicted with another; retry", { sqlstate: code });
  if (code.startsWith("08") || code === "57P01") return new ComputeError("UNAVAILABLE", "the database is unreachable");
  return undefined;
}
