// EchoDO: the bare baseline of the command round trip (bench only). One object holds a
// hibernatable WebSocket, as NodeDO does, and for each message does exactly one Postgres
// INSERT (through a pool opened like NodeDO's: postgres().open(env), one per object, reused)
// and sends the message back. No parsing, no validation, no transaction, no signature: the
// cheapest socket round trip that records something in Postgres. Its table, bench_echo, is
// created by the section before it connects (bench/commands.ts).
import { DurableObject } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { postgres, type Store } from "../core/store/database.ts";

export class EchoDO extends DurableObject {
  #store: Store | undefined;

  private get store(): Store {
    return (this.#store ??= postgres().open(this.env as object));
  }

  override async fetch(request: Request): Promise<Response> {
    if (request.headers.get("upgrade")?.toLowerCase() !== "websocket") return new Response("send Upgrade: websocket", { status: 426 });
    const pair = new WebSocketPair();
    this.ctx.acceptWebSocket(pair[1]);
    return new Response(null, { status: 101, webSocket: pair[0] });
  }

  override async webSocketMessage(ws: WebSocket, message: string | ArrayBuffer): Promise<void> {
    const body = typeof message === "string" ? message : new TextDecoder().decode(message);
    try {
      await this.store.db.execute(sql`INSERT INTO bench_echo (body) VALUES (${body})`);
    } catch (err) {
      // The client compares what comes back with what it sent: this fails its round trip.
      ws.send(`error: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    ws.send(message);
  }

  override async webSocketClose(ws: WebSocket, code: number, reason: string): Promise<void> {
    try {
      ws.close(code === 1005 || code === 1006 ? 1000 : code, reason);
    } catch {
      // already closed
    }
  }
}
