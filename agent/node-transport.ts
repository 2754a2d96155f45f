// The agent's transport in Node: global fetch for HTTPS, the `ws` package for the socket
// (request headers, a frame size limit, and terminate() that really drops the TCP connection).
import { WebSocket } from "ws";
import { MAX_SPEC_FRAME_BYTES } from "../core/protocol.ts";
import { AgentError, type AgentTransport, type FetchLike } from "./contracts.ts";
import { BufferedSocket, type SocketLike } from "./socket.ts";

export interface NodeTransportOptions {
  /** Default: the global fetch. */
  fetch?: FetchLike;
  /** Give up on an upgrade that has not completed in this long (ms). Default 15 000. */
  handshakeTimeoutMs?: number;
}

export function nodeTransport(opts: NodeTransportOptions = {}): AgentTransport {
  return {
    fetch: opts.fetch ?? ((url, init) => fetch(url, init)),
    openSocket: (url, headers) => openWs(url, headers, opts.handshakeTimeoutMs ?? 15_000),
  };
}

function openWs(url: string, headers: Record<string, string>, handshakeTimeout: number): Promise<SocketLike> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers, maxPayload: MAX_SPEC_FRAME_BYTES, handshakeTimeout, perMessageDeflate: false });
    const sock = new BufferedSocket({
      send: (text) => ws.send(text),
      close: (code, reason) => ws.close(code, reason),
      terminate: () => ws.terminate(),
    });
    let opened = false;
    ws.on("open", () => {
      opened = true;
      resolve(sock);
    });
    ws.on("message", (data) =>
      sock.receive(Array.isArray(data) ? Buffer.concat(data).toString("utf8") : Buffer.from(data as ArrayBuffer).toString("utf8")),
    );
    // A refused upgrade: the server's {code, message} and status, never the body itself.
    ws.on("unexpected-response", (req, res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        if ((size += c.length) <= 16_384) chunks.push(c);
      });
      res.on("end", () => {
        let code = `HTTP_${res.statusCode}`;
        let message = `the connection was refused with HTTP ${res.statusCode}`;
        try {
          const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { code?: unknown; message?: unknown };
          if (typeof body.code === "string") code = body.code;
          if (typeof body.message === "string") message = body.message;
        } catch {
          // not JSON
        }
        reject(new AgentError(code, message, res.statusCode));
        req.destroy();
      });
    });
    ws.on("error", (err) => {
      if (!opened) reject(new AgentError("UNAVAILABLE", `cannot connect: ${err.message}`));
      // once open, the close event follows
    });
    ws.on("close", (code, reason) => {
      if (!opened) reject(new AgentError("UNAVAILABLE", `the connection closed during the upgrade (${code})`));
      sock.end(code, reason.toString("utf8"));
    });
  });
}
