// PGlite (real Postgres compiled to WASM) served on the Postgres wire protocol,
// so the Worker's @neondatabase/serverless driver (through ws-bridge.ts) and
// any other Postgres client can use it like a normal server.
//
// Why not @electric-sql/pglite-socket's PGLiteSocketServer? It queues every
// protocol *message* separately. PGlite is ONE backend session shared by every
// connection, so a client's Parse/Bind/Execute/Sync must run back to back: if
// another client's Parse runs in between, it replaces the unnamed statement and
// the first client binds and executes the other client's SQL. pglite-socket
// only gets this right by accident, when a client's whole exchange arrives in
// one socket read (its processing of one read never yields to other sockets).
// Anything larger than one read (~64 KiB, e.g. a big JSON parameter), or sent
// in several writes, gets other connections' messages run in between. Against
// pglite-socket 0.2.17 two tests in test/node/local-stack.test.ts fail with
// `invalid input syntax for type integer`: the client's Bind hit another
// client's statement. (Its explicit-transaction handling via isInTransaction()
// does hold up in those tests.)
//
// So this server is small and strict:
//   - each connection's messages are grouped up to a Sync ('S'), simple Query
//     ('Q') or another message after which the client waits for an answer, and
//     each group runs as one unit while holding PGlite's locks;
//   - after a group, the connection keeps holding the locks until PGlite
//     reports ReadyForQuery with status 'I' (idle). 'T'/'E' (transaction open or
//     failed) or no ReadyForQuery at all (mid-exchange) mean the session's state
//     belongs to this connection, so nobody else may run. Waiting connections
//     are served in arrival order (PGlite's mutexes are FIFO);
//   - a connection that goes away while holding the locks is rolled back first.
// Consequences: an open transaction blocks every other connection until it
// ends (like one big lock); code that holds a transaction on one connection
// while waiting for a query on another waits forever here (we log a warning).
// Session state (SET, named prepared statements, temp tables) is shared by
// all connections.

import fs from "node:fs";
import net from "node:net";
import type { AddressInfo } from "node:net";
import { PGlite } from "@electric-sql/pglite";

export interface PgliteServer {
  port: number;
  /** e.g. postgres://postgres:postgres@127.0.0.1:PORT/postgres */
  connectionString: string;
  /** The database itself, for in-process use; it shares the locks with wire clients. */
  db: PGlite;
  /** Counters for benchmarks: a round trip is one group of client messages answered. */
  stats: { connections: number; roundTrips: number };
  stop(): Promise<void>;
}

// Untyped startup-phase request codes (they arrive before the StartupMessage).
const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;

const code = (c: string) => c.charCodeAt(0);
// Frontend messages after which the client waits for the server to answer:
// Sync, Query, Flush, CopyDone, CopyFail, PasswordMessage, Terminate.
const ANSWER_POINTS = new Set(["S", "Q", "H", "c", "f", "p", "X"].map(code));
const TERMINATE = code("X");
const READY_FOR_QUERY = code("Z");
const IDLE = code("I");

const LOCK_WAIT_WARN_MS = 5000;

/** A frontend message: type byte, int32 length (including itself), body. */
function message(type: string, body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(5);
  head[0] = code(type);
  head.writeInt32BE(4 + body.length, 1);
  return Buffer.concat([head, body]);
}

// Sent on behalf of a client that vanished while owning the session: end any
// COPY (CopyFail is ignored outside COPY), leave any extended-protocol exchange
// or error state (Sync), then roll back an open transaction (a no-op otherwise).
const ABANDON = Buffer.concat([message("f", Buffer.from("client disconnected\0")), message("S"), message("Q", Buffer.from("ROLLBACK\0"))]);

/** Status byte of the last ReadyForQuery in a backend response, if any. */
function lastReadyStatus(out: Uint8Array): number | null {
  const view = Buffer.from(out.buffer, out.byteOffset, out.byteLength);
  let status: number | null = null;
  for (let off = 0; off + 5 <= view.length; off += 1 + view.readInt32BE(off + 1)) {
    if (view[off] === READY_FOR_QUERY) status = view[off + 5] ?? null;
  }
  return status;
}

/**
 * Take PGlite's transaction and query mutexes (the same order PGlite's own
 * query()/exec()/transaction() use, so in-process use of `db` coordinates with
 * wire clients) and resolve with the function that releases them.
 */
function acquire(db: PGlite): Promise<() => void> {
  return new Promise((acquired) => {
    void db._runExclusiveTransaction(() => db.runExclusive(() => new Promise<void>((release) => acquired(release))));
  });
}

export async function startPglite(opts: { dataDir?: string; port?: number; host?: string } = {}): Promise<PgliteServer> {
  if (opts.dataDir) fs.mkdirSync(opts.dataDir, { recursive: true });
  // No dataDir: in-memory database, gone on stop().
  const db = await PGlite.create(opts.dataDir ? { dataDir: opts.dataDir } : {});

  const sockets = new Set<net.Socket>();
  const sessions = new Set<Promise<void>>();
  const stats = { connections: 0, roundTrips: 0 };

  const server = net.createServer((socket) => {
    sockets.add(socket);
    stats.connections++;
    const session = serve(db, socket, stats).finally(() => {
      sockets.delete(socket);
      sessions.delete(session);
    });
    sessions.add(session);
  });

  const host = opts.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const urlHost = host.includes(":") ? `[${host}]` : host;

  return {
    port,
    connectionString: `postgres://postgres:postgres@${urlHost}:${port}/postgres`,
    db,
    stats,
    async stop() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      });
      await Promise.all(sessions); // each rolls back and releases what it held
      await db.close();
    },
  };
}

/** One client connection: split its bytes into groups, run each group exclusively. */
async function serve(db: PGlite, socket: net.Socket, stats: { roundTrips: number }): Promise<void> {
  socket.setNoDelay(true);
  let buf = Buffer.alloc(0);
  let startedUp = false;
  let closed = false;
  const groups: Buffer[] = [];
  let wake: (() => void) | null = null;
  const notify = () => {
    wake?.();
    wake = null;
  };

  // Cut complete groups off the front of `buf`.
  const split = () => {
    let off = 0;
    let cut = 0;
    while (!startedUp) {
      // Startup phase: untyped messages, int32 length then int32 code.
      if (buf.length - off < 8) break;
      const len = buf.readInt32BE(off);
      if (len < 8) return void socket.destroy(); // malformed; never loop on it
      if (buf.length - off < len) break;
      const req = buf.readInt32BE(off + 4);
      if (req === CANCEL_REQUEST) return void socket.destroy(); // nothing to cancel: one backend, no PIDs
      if (req === SSL_REQUEST || req === GSSENC_REQUEST)
        socket.write("N"); // no encryption, carry on
      else {
        groups.push(buf.subarray(off, off + len)); // StartupMessage: PGlite answers it
        startedUp = true;
      }
      off = cut = off + len;
    }
    while (startedUp && buf.length - off >= 5) {
      const len = buf.readInt32BE(off + 1);
      if (len < 4) return void socket.destroy(); // malformed
      const end = off + 1 + len;
      if (end > buf.length) break;
      if (buf[off] === TERMINATE && cut < off) groups.push(buf.subarray(cut, off)); // keep X on its own
      if (ANSWER_POINTS.has(buf[off]!)) {
        groups.push(buf.subarray(buf[off] === TERMINATE ? off : cut, end));
        cut = end;
      }
      off = end;
    }
    buf = buf.subarray(cut);
  };

  socket.on("data", (chunk) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    split();
    if (groups.length) notify();
  });
  socket.on("error", () => socket.destroy()); // 'close' follows
  socket.on("close", () => {
    closed = true;
    notify();
  });

  const nextGroup = async (): Promise<Buffer | null> => {
    while (!groups.length && !closed) await new Promise<void>((r) => (wake = r));
    return closed ? null : groups.shift()!;
  };

  let release: (() => void) | null = null; // set while this connection owns PGlite
  try {
    for (let group = await nextGroup(); group; group = await nextGroup()) {
      if (group[0] === TERMINATE) break;
      if (!release) {
        const slow = setTimeout(
          () => console.warn(`[pglite-server] a connection has waited ${LOCK_WAIT_WARN_MS} ms for another connection's open transaction`),
          LOCK_WAIT_WARN_MS,
        );
        release = await acquire(db);
        clearTimeout(slow);
        if (closed) break;
      }
      const out = await db.execProtocolRaw(group);
      stats.roundTrips++;
      if (socket.writable && out.length) socket.write(out);
      if (lastReadyStatus(out) === IDLE) {
        release();
        release = null;
      }
    }
  } catch (err) {
    console.error("[pglite-server] connection failed:", err);
  } finally {
    if (release) {
      // Left while owning the session (mid-transaction or mid-exchange): clean
      // up so the next owner finds it idle.
      await db.execProtocolRaw(ABANDON).catch((err) => console.error("[pglite-server] rollback failed:", err));
      release();
    }
    socket.destroy();
  }
}
