// WebSocket-to-TCP bridge for local development and tests.
//
// The Worker talks to Postgres with @neondatabase/serverless, which tunnels the
// Postgres wire protocol over a WebSocket. In production Neon's proxy sits on
// the other end; locally this bridge does the same job for a Postgres (or
// PGlite) listening on this machine. Point the driver at it with:
//
//   neonConfig.wsProxy = (host, port) => `127.0.0.1:${bridgePort}/v1?address=${host}:${port}`
//   neonConfig.useSecureWebSocket = false
//   neonConfig.pipelineConnect = false
//
// Security: the target address comes from the client, so an unrestricted bridge
// would be an open TCP relay. It only ever connects to loopback addresses.

import net from "node:net";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import type { WebSocket, RawData, WebSocketServer as WebSocketServerType } from "ws";

// Loaded through require: under vitest's workers project "ws" resolves to its browser stub.
const { WebSocketServer } = createRequire(import.meta.url)("ws") as { WebSocketServer: typeof WebSocketServerType };

export interface Bridge {
  port: number;
  /** e.g. `127.0.0.1:PORT` (no scheme, as neonConfig.wsProxy wants it). */
  url: string;
  stop(): Promise<void>;
}

/** Policy-violation close code: the request was understood and refused. */
const REFUSED = 1008;

// 127.0.0.0/8 and ::1. BlockList also matches other spellings of these
// (0:0::1, ::ffff:127.0.0.1).
const LOOPBACK = new net.BlockList();
LOOPBACK.addSubnet("127.0.0.0", 8, "ipv4");
LOOPBACK.addAddress("::1", "ipv6");

/** True only for addresses that can never leave this machine. */
export function isLoopbackHost(host: string): boolean {
  if (host.toLowerCase() === "localhost") return true;
  // Any other name is refused: we never resolve DNS, so a name can't point us elsewhere.
  const family = net.isIP(host);
  if (family === 0) return false;
  return LOOPBACK.check(host, family === 6 ? "ipv6" : "ipv4");
}

/** Parse `address=host:port` (host may be `[v6]` or bare v6) from a request URL. */
export function parseTarget(reqUrl: string | undefined): { host: string; port: number } | null {
  const address = new URL(reqUrl ?? "/", "http://bridge.invalid").searchParams.get("address");
  const colon = address?.lastIndexOf(":") ?? -1;
  if (!address || colon <= 0) return null;
  const host = address.slice(0, colon).replace(/^\[(.*)\]$/, "$1");
  const portText = address.slice(colon + 1);
  const port = Number(portText);
  if (!host || !/^\d{1,5}$/.test(portText) || port < 1 || port > 65535) return null;
  return { host, port };
}

export async function startBridge(opts: { port?: number; host?: string } = {}): Promise<Bridge> {
  const listenHost = opts.host ?? "127.0.0.1";
  const wss = new WebSocketServer({ host: listenHost, port: opts.port ?? 0 });
  // Wait for listen (or fail fast, e.g. EADDRINUSE).
  await new Promise<void>((resolve, reject) => {
    wss.once("listening", resolve);
    wss.once("error", reject);
  });
  // After startup, a server error must not crash the process.
  wss.on("error", (err) => console.error("[ws-bridge] server error:", err));

  const sockets = new Set<net.Socket>();

  wss.on("connection", (ws: WebSocket, req) => {
    const target = parseTarget(req.url);
    if (!target) return ws.close(REFUSED, "missing or malformed address=host:port");
    if (!isLoopbackHost(target.host)) {
      // Refuse before any network activity: no connect, no DNS lookup.
      return ws.close(REFUSED, "only loopback addresses are allowed");
    }

    // Messages can arrive before the TCP connection is up; net.Socket buffers
    // writes until connected, so we can write straight away.
    const tcp = net.connect({ host: target.host, port: target.port });
    tcp.setNoDelay(true);
    sockets.add(tcp);

    ws.on("message", (data: RawData) => {
      const chunks = Array.isArray(data) ? data : [data];
      for (const c of chunks) tcp.write(c instanceof ArrayBuffer ? Buffer.from(c) : c);
    });
    tcp.on("data", (chunk) => {
      if (ws.readyState === ws.OPEN) ws.send(chunk, { binary: true });
    });

    // Either side ending ends the other, so neither leaks.
    ws.on("close", () => tcp.destroy());
    ws.on("error", () => tcp.destroy());
    tcp.on("close", () => {
      sockets.delete(tcp);
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close();
    });
    tcp.on("error", () => {
      // 1011 = server error; 'close' follows and cleans up.
      if (ws.readyState === ws.OPEN) ws.close(1011, "upstream connection error");
    });
  });

  const port = (wss.address() as AddressInfo).port;
  const urlHost = listenHost.includes(":") ? `[${listenHost}]` : listenHost;
  return {
    port,
    url: `${urlHost}:${port}`,
    stop: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        for (const s of sockets) s.destroy();
        wss.close(() => resolve());
      }),
  };
}
