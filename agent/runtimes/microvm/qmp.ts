// A minimal QMP client (QEMU Machine Protocol, JSON lines on a unix socket): the greeting, the
// capabilities handshake, commands, and events. QEMU serves one QMP client at a time, so the
// backend keeps one connection per guest for both the exit watcher and shutdown requests. Each
// command carries an id and its reply is matched by it, so a reply that comes after its command
// timed out is dropped instead of answering the next command.
import { connect, type Socket } from "node:net";
import { AgentError } from "../../contracts.ts";

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
}

interface Waiter {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
}

export class QmpConnection {
  #buffer = "";
  /** The greeting's waiter (the one message without an id), then each command's by its id. */
  #greeting: Waiter | undefined;
  readonly #pending = new Map<string, Waiter>();
  #lastId = 0;
  #closed = false;
  readonly closed: Promise<void>;

  private constructor(
    private readonly socket: Socket,
    private readonly onEvent: (event: QmpEvent) => void,
  ) {
    this.closed = new Promise((resolve) => socket.once("close", () => resolve()));
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => this.#read(chunk));
    socket.on("error", () => {}); // surfaced as close
    socket.once("close", () => {
      this.#closed = true;
      const waiters = [...this.#pending.values(), ...(this.#greeting ? [this.#greeting] : [])];
      this.#pending.clear();
      this.#greeting = undefined;
      for (const w of waiters) w.reject(new AgentError("UNAVAILABLE", "the QMP socket closed"));
    });
  }

  /** Connects, reads the greeting and negotiates capabilities. */
  static async open(socketPath: string, onEvent: (event: QmpEvent) => void = () => {}, timeoutMs = 5_000): Promise<QmpConnection> {
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = connect(socketPath);
      const timer = setTimeout(() => (s.destroy(), reject(new AgentError("UNAVAILABLE", "QMP connect timed out"))), timeoutMs);
      s.once("connect", () => (clearTimeout(timer), resolve(s)));
      s.once("error", (e) => (clearTimeout(timer), reject(new AgentError("UNAVAILABLE", `QMP connect failed: ${e.message}`))));
    });
    const qmp = new QmpConnection(socket, onEvent);
    await qmp.#await(
      timeoutMs,
      (w) => (qmp.#greeting = w),
      () => (qmp.#greeting = undefined),
    );
    await qmp.execute("qmp_capabilities", undefined, timeoutMs);
    return qmp;
  }

  async execute(command: string, args?: Record<string, unknown>, timeoutMs = 5_000): Promise<unknown> {
    if (this.#closed) throw new AgentError("UNAVAILABLE", "the QMP socket is closed");
    const id = `bc-${++this.#lastId}`;
    const reply = this.#await(
      timeoutMs,
      (w) => this.#pending.set(id, w),
      () => this.#pending.delete(id),
    );
    this.socket.write(`${JSON.stringify({ execute: command, ...(args ? { arguments: args } : {}), id })}\n`);
    const msg = (await reply) as { return?: unknown; error?: { desc?: string } };
    if (msg.error) throw new AgentError("DRIVER_ERROR", `QMP ${command}: ${msg.error.desc ?? "error"}`);
    return msg.return;
  }

  close(): void {
    this.socket.destroy();
  }

  /** A message for the waiter `register` files, or a timeout (after which `forget` drops the waiter). */
  #await(timeoutMs: number, register: (w: Waiter) => void, forget: () => void): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        forget();
        reject(new AgentError("UNAVAILABLE", "QMP reply timed out"));
      }, timeoutMs);
      register({ resolve: (v) => (clearTimeout(timer), resolve(v)), reject: (e) => (clearTimeout(timer), reject(e)) });
    });
  }

  #read(chunk: string): void {
    this.#buffer += chunk;
    let nl: number;
    while ((nl = this.#buffer.indexOf("\n")) >= 0) {
      const line = this.#buffer.slice(0, nl).trim();
      this.#buffer = this.#buffer.slice(nl + 1);
      if (!line) continue;
      let msg: Record<string, unknown>;
      try {
        msg = JSON.parse(line) as Record<string, unknown>;
      } catch {
        continue;
      }
      if (typeof msg.event === "string") this.onEvent(msg as unknown as QmpEvent);
      else if ("QMP" in msg) {
        const w = this.#greeting;
        this.#greeting = undefined;
        w?.resolve(msg);
      } else if (typeof msg.id === "string") {
        const w = this.#pending.get(msg.id);
        this.#pending.delete(msg.id);
        w?.resolve(msg);
      }
    }
  }
}
