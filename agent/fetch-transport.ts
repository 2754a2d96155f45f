// Platform-neutral transports (no Node built-ins, no socket library).
//
// fetchTransport: workerd. The socket is `fetch(url, { headers: { Upgrade: "websocket" } })`
// and `response.webSocket.accept()`. The fetch is injectable, so a test in the Workers pool can
// pass `SELF` / `exports.default` (an object with fetch) or a function, and the agent reaches
// the Worker without a network.
//
// webSocketTransport: runtimes with a standard global WebSocket that accepts request headers
// as `new WebSocket(url, { headers })` (Node 22's undici). Used by FakeDaemon outside workerd
// so it needs no `ws` import. A refused upgrade is reported without the server's status.
//
// Neither platform can drop a connection without a close handshake, so terminate() abandons
// the socket (see SocketLike.terminate); closeAbandoned() closes those at the end of a test.
import { AgentError, errorFromResponse, type AgentTransport, type FetchLike } from "./contracts.ts";
import { BufferedSocket, type RawSocket, type SocketLike } from "./socket.ts";

/** A fetch function, or an object with one (a service binding, `SELF`, `exports.default`). */
export type FetchSource = FetchLike | { fetch(input: string, init?: RequestInit): Promise<Response> };

export interface PortableTransport extends AgentTransport {
  /** Close the sockets terminate() abandoned. */
  closeAbandoned(): void;
}

/** Calls the source with the right `this` (workerd refuses a detached fetch). */
export function toFetch(source?: FetchSource): FetchLike {
  if (!source) return (url, init) => globalThis.fetch(url, init);
  // A binding or `exports.default` can itself be callable (it makes stubs): use its fetch first.
  const bound = (source as { fetch?: unknown }).fetch;
  if (typeof bound === "function") return (url, init) => (source as { fetch: FetchLike }).fetch(url, init);
  if (typeof source === "function") return (url, init) => source(url, init);
  throw new TypeError("fetch must be a function or an object with a fetch method");
}

interface EventSocket {
  send(text: string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (event: never) => void): void;
}

type MessageLike = { data: unknown };
type CloseLike = { code: number; reason: string };

const decoder = new TextDecoder();
const asText = (data: unknown): string =>
  typeof data === "string"
    ? data
    : data instanceof ArrayBuffer
      ? decoder.decode(data)
      : ArrayBuffer.isView(data)
        ? decoder.decode(data)
        : String(data);

function wrap(ws: EventSocket, abandoned: Set<RawSocket>): BufferedSocket {
  const raw: RawSocket = { send: (t) => ws.send(t), close: (c, r) => ws.close(c, r) };
  const sock = new BufferedSocket(raw, (r) => abandoned.add(r));
  ws.addEventListener("message", ((e: MessageLike) => sock.receive(asText(e.data))) as (event: never) => void);
  ws.addEventListener("close", ((e: CloseLike) => sock.end(e.code, e.reason)) as (event: never) => void);
  ws.addEventListener("error", ((e: { message?: string }) => sock.end(1006, e.message ?? "socket error")) as (event: never) => void);
  return sock;
}

function closeAll(abandoned: Set<RawSocket>): void {
  for (const raw of abandoned) {
    try {
      raw.close(1001, "abandoned by the agent");
    } catch {
      // already closed
    }
  }
  abandoned.clear();
}

export function fetchTransport(source?: FetchSource): PortableTransport {
  const f = toFetch(source);
  const abandoned = new Set<RawSocket>();
  return {
    fetch: f,
    async openSocket(url: string, headers: Record<string, string>): Promise<SocketLike> {
      let res: Response;
      try {
        res = await f(url.replace(/^ws/i, "http"), { headers: { ...headers, Upgrade: "websocket" } });
      } catch (e) {
        throw new AgentError("UNAVAILABLE", `cannot connect: ${(e as Error).message}`);
      }
      const ws = (res as Response & { webSocket?: (EventSocket & { accept(): void }) | null }).webSocket;
      if (res.status !== 101) throw await errorFromResponse(res, "the connection");
      if (!ws)
        throw new AgentError(
          "UNSUPPORTED",
          "this fetch cannot open WebSockets (no response.webSocket); outside workerd use nodeTransport or webSocketTransport",
        );
      ws.accept();
      return wrap(ws, abandoned);
    },
    closeAbandoned: () => closeAll(abandoned),
  };
}

export function webSocketTransport(source?: FetchSource): PortableTransport {
  const abandoned = new Set<RawSocket>();
  return {
    fetch: toFetch(source),
    openSocket(url: string, headers: Record<string, string>): Promise<SocketLike> {
      const Ctor = (globalThis as unknown as { WebSocket?: new (url: string, init: { headers: Record<string, string> }) => EventSocket })
        .WebSocket;
      if (!Ctor) return Promise.reject(new AgentError("UNSUPPORTED", "this runtime has no global WebSocket"));
      return new Promise((resolve, reject) => {
        const ws = new Ctor(url, { headers });
        let opened = false;
        ws.addEventListener("open", (() => {
          opened = true;
          resolve(sock);
        }) as (event: never) => void);
        ws.addEventListener("close", ((e: CloseLike) => {
          if (!opened) reject(new AgentError("UNAVAILABLE", `the connection was refused or failed (${e.code})`));
        }) as (event: never) => void);
        const sock = wrap(ws, abandoned);
      });
    },
    closeAbandoned: () => closeAll(abandoned),
  };
}
