// The local Postgres stack as the Worker sees it: @neondatabase/serverless over
// a WebSocket, through local/ws-bridge.ts, to PGlite served by
// local/pglite-server.ts. Runs in Node.

import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { once } from "node:events";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { Pool, neonConfig, type PoolClient } from "@neondatabase/serverless";
import WebSocket from "ws";
import { startBridge, isLoopbackHost, type Bridge } from "../../local/ws-bridge.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";

let bridge: Bridge;
let pg: PgliteServer;
const pools: Pool[] = [];

function pool(max = 10, connectionString = pg.connectionString): Pool {
  const p = new Pool({ connectionString, max });
  pools.push(p);
  return p;
}

/** What app code does: BEGIN, run fn, COMMIT; ROLLBACK and rethrow if fn throws. */
async function withTx<T>(p: Pool, fn: (c: PoolClient) => Promise<T>): Promise<T> {
  const c = await p.connect();
  try {
    await c.query("BEGIN");
    const out = await fn(c);
    await c.query("COMMIT");
    return out;
  } catch (err) {
    await c.query("ROLLBACK");
    throw err;
  } finally {
    c.release();
  }
}

beforeAll(async () => {
  [bridge, pg] = await Promise.all([startBridge(), startPglite()]);
  neonConfig.webSocketConstructor = WebSocket as unknown as typeof neonConfig.webSocketConstructor;
  neonConfig.wsProxy = (host, port) => `${bridge.url}/v1?address=${host}:${port}`;
  neonConfig.useSecureWebSocket = false;
  neonConfig.pipelineConnect = false;
});

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
  vi.restoreAllMocks();
});

afterAll(async () => {
  await bridge?.stop();
  await pg?.stop();
});

describe("neon driver -> ws-bridge -> pglite-server", () => {
  it("runs a simple query", async () => {
    const { rows } = await pool().query("select 40 + 2 as answer, current_database() as db");
    expect(rows).toEqual([{ answer: 42, db: "postgres" }]);
  });

  it("rolls back an interactive transaction that throws", async () => {
    const p = pool();
    await p.query("create table rb (id int primary key)");
    await expect(
      withTx(p, async (c) => {
        await c.query("insert into rb values ($1)", [1]);
        // Visible inside the transaction...
        expect((await c.query("select count(*)::int as n from rb")).rows[0].n).toBe(1);
        throw new Error("boom");
      }),
    ).rejects.toThrow("boom");
    // ...and gone after it.
    expect((await p.query("select count(*)::int as n from rb")).rows[0].n).toBe(0);
  });

  it("keeps 20 concurrent transactions apart", async () => {
    const p = pool(20);
    await p.query("create table tx_rows (client int, v text)");
    // Connect everyone first so the transactions really overlap.
    const clients = await Promise.all(Array.from({ length: 20 }, () => p.connect()));
    const results = await Promise.all(
      clients.map(async (c, i) => {
        try {
          await c.query("BEGIN");
          for (const k of [1, 2, 3]) await c.query("insert into tx_rows values ($1, $2)", [i, `c${i}-${k}`]);
          const { rows } = await c.query("select client, v from tx_rows where client = $1 order by v", [i]);
          // Odd clients commit, even ones roll back: a rollback that leaked into
          // another client's transaction would show up in the final count.
          await c.query(i % 2 ? "COMMIT" : "ROLLBACK");
          return rows;
        } finally {
          c.release();
        }
      }),
    );
    results.forEach((rows, i) => expect(rows).toEqual([1, 2, 3].map((k) => ({ client: i, v: `c${i}-${k}` }))));
    const { rows } = await p.query("select client, count(*)::int as n from tx_rows group by client order by client");
    expect(rows).toEqual(Array.from({ length: 10 }, (_, j) => ({ client: 2 * j + 1, n: 3 })));
  });

  it("answers 50 concurrent parameterized queries each with its own result", async () => {
    const p = pool(20);
    // Different statement shapes and parameter types, so an unnamed statement
    // or portal used by the wrong connection errors or gives a wrong answer.
    const ask = (i: number) =>
      i % 3 === 0
        ? p.query("select $1::int * 2 as n", [i])
        : i % 3 === 1
          ? p.query("select $1::int + $2::int as n", [i, i])
          : p.query("select length($1::text) * 2 as n", ["x".repeat(i)]);
    const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => ask(i)));
    expect(answers.map((r) => r.rows[0].n)).toEqual(Array.from({ length: 50 }, (_, i) => 2 * i));
  });

  it("keeps a large parameterized query whole while other connections run", async () => {
    // A message bigger than one socket read arrives in pieces; other
    // connections' statements must not run between the pieces. (This is what
    // breaks @electric-sql/pglite-socket.)
    const p = pool(6);
    const clients = await Promise.all(Array.from({ length: 6 }, () => p.connect()));
    const big = "y".repeat(1_000_000);
    try {
      for (let round = 0; round < 3; round++) {
        const [bigResult, ...small] = await Promise.all([
          clients[0]!.query("select length($1::text) as n", [big]).catch((err: Error) => {
            throw new Error(err.message.slice(0, 200)); // the message may quote the whole megabyte
          }),
          ...clients.slice(1).map(async (c, i) => {
            const got: number[] = [];
            for (let k = 0; k < 10; k++) got.push((await c.query("select $1::int * 3 as n", [i * 100 + k])).rows[0].n);
            return got;
          }),
        ]);
        expect(bigResult.rows[0].n).toBe(big.length);
        small.forEach((got, i) => expect(got).toEqual(Array.from({ length: 10 }, (_, k) => (i * 100 + k) * 3)));
      }
    } finally {
      for (const c of clients) c.release();
    }
  });

  it("never runs another connection's messages inside an unfinished Parse/Bind/Execute/Sync", async () => {
    const a = await rawClient();
    const b = await rawClient();
    try {
      // A sends only Parse for its unnamed statement, and waits.
      a.send(parse("select $1::text as a"));
      await new Promise((r) => setTimeout(r, 50));
      // B runs a whole exchange with a different unnamed statement meanwhile.
      b.send(parse("select $1::int * 10 as b"), bind(["7"]), execute(), sync());
      expect(await b.untilReady()).toMatchObject({ rows: [["70"]], errors: [] });
      // A's Bind/Execute must still see A's statement.
      a.send(bind(["from A"]), execute(), sync());
      expect(await a.untilReady()).toMatchObject({ rows: [["from A"]], errors: [], status: "I" });
    } finally {
      a.kill();
      b.kill();
    }
  });

  it("rolls back and unblocks others when a client dies mid-transaction", async () => {
    const p = pool();
    await p.query("create table dying (who text)");
    const doomed = await rawClient();
    doomed.send(query("BEGIN"));
    expect((await doomed.untilReady()).status).toBe("T");
    doomed.send(query("insert into dying values ('doomed')"));
    expect(await doomed.untilReady()).toMatchObject({ errors: [], status: "T" });

    // This one has to wait: the doomed client owns the session.
    let done = false;
    const other = p.query("insert into dying values ('other') returning who").then((r) => {
      done = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 200));
    expect(done).toBe(false);

    doomed.kill(); // drop the WebSocket without a word, like a crashed isolate
    expect((await other).rows).toEqual([{ who: "other" }]);
    expect((await p.query("select who from dying order by who")).rows).toEqual([{ who: "other" }]);
    // And the session is idle again for everyone.
    expect((await p.query("select 1 as one")).rows).toEqual([{ one: 1 }]);
  });

  it("persists data across stop/start with a dataDir", async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "pglite-test-"));
    try {
      const first = await startPglite({ dataDir });
      try {
        const p = pool(2, first.connectionString);
        await p.query("create table kept (v text)");
        await p.query("insert into kept values ($1)", ["survives restart"]);
        await p.end();
        pools.splice(pools.indexOf(p), 1);
      } finally {
        await first.stop();
      }
      const second = await startPglite({ dataDir });
      try {
        const { rows } = await pool(2, second.connectionString).query("select v from kept");
        expect(rows).toEqual([{ v: "survives restart" }]);
      } finally {
        await Promise.all(pools.splice(0).map((p) => p.end()));
        await second.stop();
      }
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  }, 20_000);
});

describe("ws-bridge", () => {
  /** A loopback TCP echo server standing in for Postgres. */
  async function echoServer() {
    const conns: net.Socket[] = [];
    const server = net.createServer((s) => {
      conns.push(s);
      s.on("error", () => {});
      s.pipe(s);
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    const port = (server.address() as net.AddressInfo).port;
    return { port, conns, stop: () => new Promise((r) => server.close(r)) };
  }

  it("pipes binary both ways and closes each side when the other closes", async () => {
    const echo = await echoServer();
    try {
      const allBytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
      // Client closes first: the bridge must drop its TCP connection.
      const ws = new WebSocket(`ws://${bridge.url}/v1?address=127.0.0.1:${echo.port}`);
      await once(ws, "open");
      ws.send(allBytes);
      const [echoed, isBinary] = (await once(ws, "message")) as [Buffer, boolean];
      expect(isBinary).toBe(true);
      expect(Buffer.compare(echoed, allBytes)).toBe(0);
      const serverSide = echo.conns[0]!;
      ws.terminate();
      await once(serverSide, "close");

      // Server closes first: the bridge must close the WebSocket.
      const ws2 = new WebSocket(`ws://${bridge.url}/v1?address=localhost:${echo.port}`);
      await once(ws2, "open");
      ws2.send(Buffer.from("ping"));
      expect(((await once(ws2, "message")) as [Buffer])[0].toString()).toBe("ping");
      echo.conns[1]!.destroy();
      await once(ws2, "close");
    } finally {
      await echo.stop();
    }
  });

  it("only treats loopback addresses as loopback", () => {
    for (const h of ["127.0.0.1", "127.1.2.3", "localhost", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"]) {
      expect(isLoopbackHost(h), h).toBe(true);
    }
    for (const h of [
      "10.0.0.1",
      "0.0.0.0",
      "128.0.0.1",
      "::",
      "::ffff:10.0.0.1",
      "example.com",
      "localhost.example.com",
      "127.0.0.1.nip.io",
      "",
    ]) {
      expect(isLoopbackHost(h), h).toBe(false);
    }
  });

  it("refuses non-loopback targets without trying to connect", async () => {
    // Intercept every outgoing TCP connection. The test's own WebSocket
    // clients (to the bridge's port) pass through unrecorded; anything else is
    // recorded, and only loopback is actually attempted, even if the bridge
    // were wrong.
    const realConnect = net.connect;
    const attempts: string[] = [];
    vi.spyOn(net, "connect").mockImplementation(((opts: net.TcpNetConnectOpts) => {
      if (Number(opts.port) === bridge.port) return realConnect(opts); // ws passes the port as a string
      attempts.push(`${opts.host}:${opts.port}`);
      if (opts.host !== "127.0.0.1") throw new Error(`test blocked a connection to ${opts.host}`);
      return realConnect(opts);
    }) as typeof net.connect);

    for (const address of ["10.0.0.1:5432", "example.com:5432", "[::ffff:10.0.0.1]:5432", "127.0.0.1.nip.io:5432"]) {
      const ws = new WebSocket(`ws://${bridge.url}/v1?address=${address}`);
      const [code, reason] = (await once(ws, "close")) as [number, Buffer];
      expect(code, address).toBe(1008);
      expect(reason.toString()).toMatch(/loopback/);
    }
    const ws = new WebSocket(`ws://${bridge.url}/v1`);
    expect(((await once(ws, "close")) as [number])[0]).toBe(1008);
    expect(attempts).toEqual([]);

    // Control: the interception does see the bridge's real connections.
    const echo = await echoServer();
    try {
      const ok = new WebSocket(`ws://${bridge.url}/v1?address=127.0.0.1:${echo.port}`);
      await once(ok, "open");
      ok.send(Buffer.from("hi"));
      await once(ok, "message");
      ok.terminate();
      expect(attempts).toEqual([`127.0.0.1:${echo.port}`]);
    } finally {
      await echo.stop();
    }
  });
});

// --- A tiny raw wire-protocol client over the bridge, for precise message order.

const cstr = (s: string) => Buffer.from(`${s}\0`);
const i16 = (n: number) => Buffer.from([(n >> 8) & 0xff, n & 0xff]);
const i32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
};
const frame = (type: string, ...parts: Buffer[]) => {
  const body = Buffer.concat(parts);
  return Buffer.concat([Buffer.from(type), i32(body.length + 4), body]);
};
const query = (sql: string) => frame("Q", cstr(sql));
const parse = (sql: string) => frame("P", cstr(""), cstr(sql), i16(0));
const bind = (params: string[]) =>
  frame("B", cstr(""), cstr(""), i16(0), i16(params.length), ...params.flatMap((v) => [i32(Buffer.byteLength(v)), Buffer.from(v)]), i16(0));
const execute = () => frame("E", cstr(""), i32(0));
const sync = () => frame("S");

interface Reply {
  rows: (string | null)[][];
  errors: string[];
  status: string;
}

async function rawClient() {
  const ws = new WebSocket(`ws://${bridge.url}/v1?address=127.0.0.1:${pg.port}`);
  await once(ws, "open");
  let buf = Buffer.alloc(0);
  let onData: (() => void) | null = null;
  ws.on("message", (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    onData?.();
  });

  /** Read backend messages up to and including the next ReadyForQuery. */
  const untilReady = async (): Promise<Reply> => {
    const reply: Reply = { rows: [], errors: [], status: "" };
    for (let off = 0; ;) {
      while (buf.length - off < 5 || buf.length - off < 1 + buf.readInt32BE(off + 1)) {
        await new Promise<void>((r) => (onData = r));
      }
      const type = String.fromCharCode(buf[off]!);
      const body = buf.subarray(off + 5, off + 1 + buf.readInt32BE(off + 1));
      off += 1 + buf.readInt32BE(off + 1);
      if (type === "D") {
        const row: (string | null)[] = [];
        for (let n = body.readInt16BE(0), p = 2; n > 0; n--) {
          const len = body.readInt32BE(p);
          row.push(len < 0 ? null : body.subarray(p + 4, p + 4 + len).toString());
          p += 4 + Math.max(len, 0);
        }
        reply.rows.push(row);
      } else if (type === "E") {
        const m = body
          .toString()
          .split("\0")
          .find((f: string) => f.startsWith("M"));
        reply.errors.push(m?.slice(1) ?? "error");
      } else if (type === "Z") {
        reply.status = String.fromCharCode(body[0]!);
        buf = buf.subarray(off);
        return reply;
      }
    }
  };

  const startup = Buffer.concat([i32(196608), cstr("user"), cstr("postgres"), cstr("database"), cstr("postgres"), Buffer.from([0])]);
  ws.send(Buffer.concat([i32(startup.length + 4), startup]));
  expect((await untilReady()).status).toBe("I");

  return {
    send: (...frames: Buffer[]) => ws.send(Buffer.concat(frames)),
    untilReady,
    kill: () => ws.terminate(),
  };
}
