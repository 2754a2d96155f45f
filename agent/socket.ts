// The agent's view of a WebSocket: text in, text out, one close. Transports (the `ws` package
// in Node, `fetch` + `Upgrade: websocket` in workerd, the standard WebSocket class) adapt
// their socket to this through BufferedSocket, so the client never sees a platform API.
// No Node built-ins here: this file also runs inside workerd.

export interface SocketHandlers {
  message(text: string): void;
  /** Called exactly once, whatever ended the socket (a close frame, an error, terminate()). */
  close(code: number, reason: string): void;
}

export interface SocketLike {
  send(text: string): void;
  /** Close with a handshake. */
  close(code?: number, reason?: string): void;
  /**
   * Drop the connection without a close handshake where the platform can (ws: destroy the TCP
   * socket); where it cannot (workerd, the standard WebSocket class) the socket is abandoned:
   * this side stops reading it and the peer learns when the next connection replaces it.
   * Either way the handlers see close(1006) at once and nothing after.
   */
  terminate(): void;
  /** Attach the handlers; whatever arrived before is delivered now, in order. */
  listen(handlers: SocketHandlers): void;
}

/** Close code reported for a connection that ended without a close frame (RFC 6455). */
export const ABNORMAL_CLOSURE = 1006;

type Pending = { kind: "message"; text: string } | { kind: "close"; code: number; reason: string };

/** The platform half of a socket, wrapped by BufferedSocket. */
export interface RawSocket {
  send(text: string): void;
  close(code?: number, reason?: string): void;
  /** Absent: terminate() abandons the socket (see SocketLike.terminate). */
  terminate?(): void;
}

/**
 * Buffers events until listen() and guarantees one close. Adapters feed it with receive()
 * and end() from their platform's events.
 */
export class BufferedSocket implements SocketLike {
  #handlers: SocketHandlers | undefined;
  #pending: Pending[] = [];
  #closed = false;
  #abandoned = false;

  constructor(
    private readonly raw: RawSocket,
    private readonly onAbandon?: (raw: RawSocket) => void,
  ) {}

  get isClosed(): boolean {
    return this.#closed;
  }

  /** Adapter: a text message arrived. */
  receive(text: string): void {
    if (this.#closed) return;
    if (this.#handlers) this.#handlers.message(text);
    else this.#pending.push({ kind: "message", text });
  }

  /** Adapter: the socket ended (close frame, error, network). Later calls are ignored. */
  end(code: number, reason: string): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#handlers) this.#handlers.close(code, reason);
    else this.#pending.push({ kind: "close", code, reason });
  }

  listen(handlers: SocketHandlers): void {
    if (this.#handlers) throw new Error("socket handlers are already attached");
    this.#handlers = handlers;
    const pending = this.#pending;
    this.#pending = [];
    for (const p of pending) {
      if (p.kind === "message") handlers.message(p.text);
      else handlers.close(p.code, p.reason);
    }
  }

  send(text: string): void {
    if (this.#closed) throw new Error("the socket is closed");
    this.raw.send(text);
  }

  close(code?: number, reason?: string): void {
    if (this.#closed || this.#abandoned) return;
    try {
      this.raw.close(code, reason);
    } catch {
      // already closing: the platform reports the close
    }
  }

  terminate(): void {
    if (this.#closed) return;
    if (this.raw.terminate) {
      try {
        this.raw.terminate();
      } catch {
        // already gone
      }
    } else {
      this.#abandoned = true;
      this.onAbandon?.(this.raw);
    }
    this.end(ABNORMAL_CLOSURE, "terminated by the agent");
  }
}
