// A minimal QMP client (QEMU Machine Protocol, JSON lines on a unix socket): the greeting, the
// capabilities handshake, commands, and events. QEMU serves one QMP client at a time, so the
// backend keeps one connection per guest for both the exit watcher and shutdown requests.
import { connect, type Socket } from "node:net";
import { AgentError } from "../../contracts.ts";

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
}

export class QmpConnection {
  #buffer = "";
  #waiting: { resolve: (v: unknown) => void; reject: (e: Error) => void }[] = [];
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
      for (const w of this.#waiting.splice(0)) w.reject(new AgentError("UNAVAILABLE", "the QMP socket closed"));
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
    await qmp.#next(timeoutMs); // the greeting
    await qmp.execute("qmp_capabilities", undefined, timeoutMs);
    return qmp;
  }

  async execute(command: string, args?: Record<string, unknown>, timeoutMs = 5_000): Promise<unknown> {
    if (this.#closed) throw new AgentError("UNAVAILABLE", "the QMP socket is closed");
    const reply = this.#next(timeoutMs);
    this.socket.write(`${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`);
    const msg = (await reply) as { return?: unknown; error?: { desc?: string } };
    if (msg.error) throw new AgentError("DRIVER_ERROR", `QMP ${command}: ${msg.error.desc ?? "error"}`);
    return msg.return;
  }

  close(): void {
    this.socket.destroy();
  }

  #next(timeoutMs: number): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (v: unknown) => (clearTimeout(timer), resolve(v)),
        reject: (e: Error) => (clearTimeout(timer), reject(e)),
      };
      const timer = setTimeout(() => {
        this.#waiting.splice(this.#waiting.indexOf(waiter), 1);
        reject(new AgentError("UNAVAILABLE", "QMP reply timed out"));
      }, timeoutMs);
      this.#waiting.push(waiter);
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
      else this.#waiting.shift()?.resolve(msg);
    }
  }
}
