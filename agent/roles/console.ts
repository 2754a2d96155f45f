// Machines' serial consoles on the site agent (metal.bmc.console). One live connection per machine
// (IPMI allows one SOL session at a time; a BMC's Telnet port often one too), shared by every
// operator reading it: its bytes go into a bounded ring, and each read names where it left off, so
// a reader that falls behind learns how much it missed instead of holding the site agent's memory.
// A connection nobody read for a while is closed; the next read opens a new one (a new session).
import { randomUUID } from "node:crypto";
import net from "node:net";
import { AgentError } from "../contracts.ts";

/** A console connection: a BMC's Telnet port, an IPMI SOL session through a hosted driver, ... */
export interface ConsoleStream {
  onData(listener: (bytes: Buffer) => void): void;
  /** The connection ended (the BMC closed it, or it failed: err says why). */
  onEnd(listener: (err?: Error) => void): void;
  write(bytes: Buffer): void;
  close(): void;
}

export interface ConsoleRead {
  /** The connection's id: a new one means a new connection (offsets start again at 0). */
  session: string;
  /** Where the next read starts. */
  offset: number;
  /** The bytes from the read's offset, at most maxBytes. */
  data: Buffer;
  /** Bytes between the asked offset and the oldest one still kept: the reader fell behind by that much. */
  skipped: number;
  /** Why the connection ended, once it has (the next read opens a new one). */
  ended?: string;
}

interface Session {
  id: string;
  stream: ConsoleStream;
  /** The newest bytes, at most the ring's size; `start` is the offset of its first byte. */
  ring: Buffer;
  start: number;
  ended?: string;
  endReported?: boolean;
  lastRead: number;
  idleTimer?: ReturnType<typeof setTimeout>;
  waiters: Set<() => void>;
}

export interface ConsoleSessionsOptions {
  /** Bytes kept per machine; default 256 KiB. */
  ringBytes?: number;
  /** A connection nobody read for this long is closed; default 2 minutes. */
  idleMs?: number;
}

export class ConsoleSessions {
  readonly #sessions = new Map<string, Session>();
  readonly #ringBytes: number;
  readonly #idleMs: number;

  constructor(options: ConsoleSessionsOptions = {}) {
    this.#ringBytes = options.ringBytes ?? 256 * 1024;
    this.#idleMs = options.idleMs ?? 120_000;
  }

  /**
   * The bytes after `from` (a session and an offset in it), waiting up to waitMs for some when
   * there are none yet. Without `from`, or with another session's, it reads from the oldest byte
   * kept. Opens the machine's connection (with `open`) when there is none.
   */
  async read(
    key: string,
    open: () => Promise<ConsoleStream>,
    request: { from?: { session: string; offset: number }; maxBytes: number; waitMs: number; signal?: AbortSignal },
  ): Promise<ConsoleRead> {
    const session = await this.#session(key, open);
    session.lastRead = Date.now();
    const end = () => session.start + session.ring.length;
    const asked = request.from?.session === session.id ? request.from.offset : session.start;
    if (asked >= end() && !session.ended && request.waitMs > 0) await this.#wait(session, request.waitMs, request.signal);
    const from = Math.min(Math.max(asked, session.start), end());
    const data = session.ring.subarray(from - session.start, from - session.start + request.maxBytes);
    if (session.ended !== undefined && from + data.length === end()) session.endReported = true;
    return {
      session: session.id,
      offset: from + data.length,
      data: Buffer.from(data),
      skipped: Math.max(0, session.start - asked),
      ...(session.ended !== undefined ? { ended: session.ended } : {}),
    };
  }

  /** Types into the machine's console (opening its connection when there is none). */
  async write(key: string, open: () => Promise<ConsoleStream>, bytes: Buffer): Promise<{ session: string }> {
    const session = await this.#session(key, open);
    session.stream.write(bytes);
    return { session: session.id };
  }

  closeAll(): void {
    for (const key of [...this.#sessions.keys()]) this.#close(key);
  }

  async #session(key: string, open: () => Promise<ConsoleStream>): Promise<Session> {
    const live = this.#sessions.get(key);
    // An ended connection is kept until a read has reported it, so its reader learns why.
    if (live && !live.endReported) return live;
    if (live) this.#close(key);
    const stream = await open();
    const session: Session = { id: randomUUID(), stream, ring: Buffer.alloc(0), start: 0, lastRead: 0, waiters: new Set() };
    this.#sessions.set(key, session);
    stream.onData((bytes) => {
      const ring = Buffer.concat([session.ring, bytes]);
      const drop = Math.max(0, ring.length - this.#ringBytes);
      session.ring = ring.subarray(drop);
      session.start += drop;
      this.#wake(session);
    });
    stream.onEnd((err) => {
      session.ended = err?.message ?? "the console connection closed";
      this.#wake(session);
    });
    this.#armIdle(key, session);
    return session;
  }

  #armIdle(key: string, session: Session): void {
    session.idleTimer = setTimeout(() => {
      if (this.#sessions.get(key) !== session) return;
      if (Date.now() - session.lastRead >= this.#idleMs) this.#close(key);
      else this.#armIdle(key, session);
    }, this.#idleMs);
    session.idleTimer.unref?.();
  }

  #wait(session: Session, ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        session.waiters.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      session.waiters.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  #wake(session: Session): void {
    for (const w of [...session.waiters]) w();
  }

  #close(key: string): void {
    const session = this.#sessions.get(key);
    if (!session) return;
    this.#sessions.delete(key);
    clearTimeout(session.idleTimer);
    this.#wake(session);
    session.stream.close();
  }
}

const IAC = 0xff;
const SB = 0xfa;
const SE = 0xf0;
const [WILL, WONT, DO, DONT] = [0xfb, 0xfc, 0xfd, 0xfe];

/**
 * A BMC's Telnet serial console (Redfish SerialConsole.Telnet): a TCP connection whose Telnet
 * negotiation is refused (each DO answered WONT, each WILL DONT) and kept out of the console's
 * bytes; an escaped 0xFF is written as IAC IAC.
 */
export function telnetConsole(host: string, port: number, timeoutMs = 10_000): Promise<ConsoleStream> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port });
    const timer = setTimeout(
      () => socket.destroy(new Error(`the console at ${host}:${port} did not answer within ${timeoutMs / 1000} s`)),
      timeoutMs,
    );
    socket.once("error", (err) => {
      clearTimeout(timer);
      reject(new AgentError("DRIVER_ERROR", `cannot reach the serial console at ${host}:${port}: ${err.message}`));
    });
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      let state: "data" | "iac" | "option" | "sub" | "subIac" = "data";
      let verb = 0;
      const dataListeners: ((bytes: Buffer) => void)[] = [];
      const endListeners: ((err?: Error) => void)[] = [];
      let failure: Error | undefined;
      socket.on("data", (chunk: Buffer) => {
        const out: number[] = [];
        for (const b of chunk) {
          if (state === "data") b === IAC ? (state = "iac") : out.push(b);
          else if (state === "iac") {
            if (b === IAC) (out.push(IAC), (state = "data"));
            else if (b === SB) state = "sub";
            else if (b >= WILL && b <= DONT) ((verb = b), (state = "option"));
            else state = "data"; // a two-byte command (NOP, GA, ...)
          } else if (state === "option") {
            if (verb === DO) socket.write(Buffer.from([IAC, WONT, b]));
            if (verb === WILL) socket.write(Buffer.from([IAC, DONT, b]));
            state = "data";
          } else if (state === "sub") state = b === IAC ? "subIac" : "sub";
          else state = b === SE ? "data" : "sub";
        }
        if (out.length) for (const l of dataListeners) l(Buffer.from(out));
      });
      socket.on("error", (err) => (failure = err));
      socket.on("close", () => {
        for (const l of endListeners)
          l(failure ? new Error(`the serial console at ${host}:${port} failed: ${failure.message}`) : undefined);
      });
      resolve({
        onData: (l) => dataListeners.push(l),
        onEnd: (l) => endListeners.push(l),
        write: (bytes) => socket.write(Buffer.from([...bytes].flatMap((b) => (b === IAC ? [IAC, IAC] : [b])))),
        close: () => socket.destroy(),
      });
    });
  });
}
