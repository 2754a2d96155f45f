// A protocol-faithful fake of the control plane's agent side, for testing agents in Node
// (test/node/agent-*.test.ts, or a manual `bcd` run): JoinService's join and renew endpoints
// and one NodeDO per node behind CONNECT_PATH, all per core/protocol.ts: challenge, hello
// verified with verifyMessage (close PROOF_FAILED otherwise), welcome, commands in seq order,
// redelivery after reconnect of whatever has no accepted result, result signatures verified
// (error frame BAD_SIGNATURE otherwise), result-ack, PING → PONG, REPLACED, REVOKED. Refusals
// answer like the real gateway and JoinService: {code, message} JSON, 401 UNAUTHENTICATED for a
// bad or expired credential, 403 PERMISSION_DENIED for a revoked node.
//
// Not the real server: credentials are opaque random strings, not JWTs, and nothing is durable.
// Knobs (redeliver, ackResults, answerPings, deliver) let a test play a misbehaving network.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import { WebSocketServer, type WebSocket } from "ws";
import { base64url } from "../core/encoding.ts";
import {
  CONNECT_PATH,
  CloseCode,
  FrameError,
  JOIN_PATH,
  MAX_FRAME_BYTES,
  PING,
  PONG,
  PROTOCOL_VERSION,
  RENEW_PATH,
  agentFrame,
  helloMessage,
  joinMessage,
  joinRequest,
  renewMessage,
  renewRequest,
  resultMessage,
  verifyMessage,
  type CommandFrame,
  type HelloFrame,
  type ResultFrame,
} from "../core/protocol.ts";

export interface FakeNode {
  nodeId: string;
  publicKey: string;
  role: "node" | "site" | "ramdisk";
  hostname?: string;
  /** Every credential issued, with its expiry (ms); an old one stays valid until it expires. */
  credentials: Map<string, number>;
  credential: string;
  expiresAt: string;
  revoked: boolean;
  socket?: WebSocket;
  seq: number;
}

export interface FakeCommand extends CommandFrame {
  nodeId: string;
  deliveries: number;
  acks: number;
  /** Results received, each with whether its signature verified. */
  results: { frame: ResultFrame; verified: boolean }[];
  /** The accepted result (first one whose signature verified). */
  result?: ResultFrame;
}

export interface FakeConnection {
  n: number;
  nodeId?: string;
  openedAt: number;
  helloAt?: number;
  closedAt?: number;
  closeCode?: number;
  /** Who closed: the server (a code it sent, or a kill) or the agent/network. */
  closedBy?: "server" | "agent";
  /** The bearer the agent presented. */
  authorization?: string;
}

export interface FakeServerOptions {
  /** Valid single-use join tokens. */
  tokens?: string[];
  /** Lifetime of issued credentials (ms). Default one hour. */
  credentialTtlMs?: number;
}

let serial = 0;
const random = (n = 18) => base64url(crypto.getRandomValues(new Uint8Array(n)));

export class FakeNodeServer {
  readonly tokens: Set<string>;
  credentialTtlMs: number;
  /** Redeliver commands without an accepted result at every welcome (the NodeDO does). */
  redeliver = true;
  /** Answer accepted results with result-ack. */
  ackResults = true;
  /** Answer PING with PONG (the NodeDO's auto-response). */
  answerPings = true;
  /** Send commands as they are enqueued; when false they wait for the next welcome (or deliverPending). */
  deliver = true;
  /** Answer this many of the next results with an UNAVAILABLE error frame instead of taking them. */
  unavailableResults = 0;
  /** Refuse every upgrade with this status and {code, message} (the NodeDO unavailable, say). */
  refuse: { status: number; code: string; message: string } | undefined;
  /** Every upgrade attempt, accepted or not, with its time and outcome status (101 = accepted). */
  readonly attempts: { at: number; status: number; authorization?: string }[] = [];

  readonly nodes = new Map<string, FakeNode>();
  readonly commands = new Map<string, FakeCommand>();
  readonly joins: { body: unknown; status: number; code?: string }[] = [];
  readonly renewals: { nodeId?: string; status: number; code?: string }[] = [];
  readonly connections: FakeConnection[] = [];
  readonly hellos: { nodeId: string; frame: HelloFrame; verified: boolean }[] = [];
  /** Every text frame received from agents (PINGs counted separately). */
  readonly received: { nodeId?: string; text: string }[] = [];
  pings = 0;
  readonly #http: Server;
  readonly #wss: WebSocketServer;
  url = "";

  private constructor(opts: FakeServerOptions) {
    this.tokens = new Set(opts.tokens ?? []);
    this.credentialTtlMs = opts.credentialTtlMs ?? 3_600_000;
    this.#wss = new WebSocketServer({ noServer: true, maxPayload: MAX_FRAME_BYTES, perMessageDeflate: false });
    this.#http = createServer((req, res) => void this.#onRequest(req, res));
    this.#http.on("upgrade", (req, socket, head) => this.#onUpgrade(req, socket, head));
  }

  static async start(opts: FakeServerOptions = {}): Promise<FakeNodeServer> {
    const server = new FakeNodeServer(opts);
    await new Promise<void>((resolve) => server.#http.listen(0, "127.0.0.1", resolve));
    server.url = `http://127.0.0.1:${(server.#http.address() as AddressInfo).port}`;
    return server;
  }

  async close(): Promise<void> {
    for (const c of this.#wss.clients) c.terminate();
    this.#wss.close();
    this.#http.closeAllConnections();
    await new Promise<void>((resolve) => this.#http.close(() => resolve()));
  }

  // ------------------------------------------------------------ test controls

  /** A new single-use join token. */
  token(): string {
    const t = `bcjt_${random()}`;
    this.tokens.add(t);
    return t;
  }

  node(nodeId: string): FakeNode {
    const n = this.nodes.get(nodeId);
    if (!n) throw new Error(`no node ${nodeId}`);
    return n;
  }

  /** Queue a command for a node; it is sent now if the node is connected and `deliver` is on. */
  enqueue(
    nodeId: string,
    cmd: { kind: string; key?: string; body?: Record<string, unknown>; attested?: boolean; deadline?: string | null; id?: string },
  ): FakeCommand {
    const node = this.node(nodeId);
    const command: FakeCommand = {
      t: "command",
      id: cmd.id ?? `cmd-${++serial}`,
      seq: ++node.seq,
      kind: cmd.kind,
      key: cmd.key ?? `key-${serial}`,
      body: cmd.body ?? {},
      attested: cmd.attested ?? true,
      deadline: cmd.deadline ?? null,
      nodeId,
      deliveries: 0,
      acks: 0,
      results: [],
    };
    this.commands.set(command.id, command);
    if (this.deliver && node.socket && this.#welcomed.has(node.socket)) this.#send(node.socket, command);
    return command;
  }

  /** Send a command frame again now (a redelivery with the same id). */
  resend(id: string): void {
    const cmd = this.commands.get(id);
    const sock = cmd && this.nodes.get(cmd.nodeId)?.socket;
    if (cmd && sock) this.#send(sock, cmd);
  }

  /** Send everything without an accepted result, in seq order. */
  deliverPending(nodeId: string): void {
    const sock = this.node(nodeId).socket;
    if (!sock) return;
    for (const cmd of this.pending(nodeId)) this.#send(sock, cmd);
  }

  pending(nodeId: string): FakeCommand[] {
    return [...this.commands.values()].filter((c) => c.nodeId === nodeId && !c.result).sort((a, b) => a.seq - b.seq);
  }

  /** Drop the node's socket without a close handshake (a network cut, server side). */
  kill(nodeId: string): void {
    const sock = this.nodes.get(nodeId)?.socket;
    if (!sock) return;
    this.#serverCloses.set(sock, 1006);
    sock.terminate();
  }

  /** Revoke the node: a live socket is closed with REVOKED, later connects and renewals are refused. */
  revoke(nodeId: string): void {
    const node = this.node(nodeId);
    node.revoked = true;
    if (node.socket) this.#close(node.socket, CloseCode.REVOKED, "revoked");
  }

  /** Send a raw text frame to the node's socket. */
  sendRaw(nodeId: string, text: string): void {
    this.node(nodeId).socket?.send(text);
  }

  /** Poll until predicate holds (5 ms steps). */
  async waitFor(predicate: () => boolean, timeoutMs = 5_000, what = "condition"): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (!predicate()) {
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  // ------------------------------------------------------------ HTTP: join and renew

  async #onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const reply = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    let raw: unknown;
    try {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      raw = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      raw = undefined;
    }
    if (req.method === "POST" && req.url === JOIN_PATH) {
      const r = await this.#join(raw);
      this.joins.push({ body: raw, status: r.status, ...(r.body.code ? { code: r.body.code as string } : {}) });
      return reply(r.status, r.body);
    }
    if (req.method === "POST" && req.url === RENEW_PATH) {
      const r = await this.#renew(req.headers.authorization, raw);
      this.renewals.push({
        ...(r.nodeId ? { nodeId: r.nodeId } : {}),
        status: r.status,
        ...(r.body.code ? { code: r.body.code as string } : {}),
      });
      return reply(r.status, r.body);
    }
    reply(404, { code: "NOT_FOUND", message: `no route ${req.method} ${req.url}` });
  }

  async #join(raw: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
    const parsed = joinRequest.safeParse(raw);
    if (!parsed.success) return { status: 400, body: { code: "INVALID_ARGUMENT", message: "not a join request" } };
    const req = parsed.data;
    if (!(await verifyMessage(req.publicKey, await joinMessage(req.publicKey, req.attestor, req.evidence), req.signature))) {
      return { status: 401, body: { code: "UNAUTHENTICATED", message: "the join signature does not verify" } };
    }
    const token = req.evidence.token;
    if (req.attestor !== "join-token" || typeof token !== "string" || !this.tokens.delete(token)) {
      return { status: 401, body: { code: "UNAUTHENTICATED", message: "the join token is invalid, expired or already used" } };
    }
    const node: FakeNode = {
      nodeId: `node-${++serial}`,
      publicKey: req.publicKey,
      role: req.role,
      ...(req.hostname !== undefined ? { hostname: req.hostname } : {}),
      credentials: new Map(),
      credential: "",
      expiresAt: "",
      revoked: false,
      seq: 0,
    };
    this.#issue(node);
    this.nodes.set(node.nodeId, node);
    return { status: 200, body: { nodeId: node.nodeId, role: node.role, credential: node.credential, expiresAt: node.expiresAt } };
  }

  async #renew(
    authorization: string | undefined,
    raw: unknown,
  ): Promise<{ status: number; nodeId?: string; body: Record<string, unknown> }> {
    const node = this.#bearer(authorization);
    if (!node) return { status: 401, body: { code: "UNAUTHENTICATED", message: "the credential is invalid or expired" } };
    if (node.revoked)
      return { status: 403, nodeId: node.nodeId, body: { code: "PERMISSION_DENIED", message: "the node's credentials were revoked" } };
    const parsed = renewRequest.safeParse(raw);
    if (!parsed.success) return { status: 400, nodeId: node.nodeId, body: { code: "INVALID_ARGUMENT", message: "not a renew request" } };
    const { timestamp, signature } = parsed.data;
    if (
      Math.abs(Date.parse(timestamp) - Date.now()) > 300_000 ||
      !(await verifyMessage(node.publicKey, renewMessage(node.nodeId, timestamp), signature))
    ) {
      return { status: 401, nodeId: node.nodeId, body: { code: "UNAUTHENTICATED", message: "the renew signature does not verify" } };
    }
    this.#issue(node);
    return {
      status: 200,
      nodeId: node.nodeId,
      body: { nodeId: node.nodeId, role: node.role, credential: node.credential, expiresAt: node.expiresAt },
    };
  }

  #issue(node: FakeNode): void {
    const expires = Date.now() + this.credentialTtlMs;
    node.credential = `bccred_${random(24)}`;
    node.expiresAt = new Date(expires).toISOString();
    node.credentials.set(node.credential, expires);
  }

  #bearer(authorization: string | string[] | undefined): FakeNode | undefined {
    const m = typeof authorization === "string" ? /^Bearer (.+)$/.exec(authorization) : null;
    if (!m) return undefined;
    for (const node of this.nodes.values()) {
      const exp = node.credentials.get(m[1]!);
      if (exp !== undefined && exp > Date.now()) return node;
    }
    return undefined;
  }

  // ------------------------------------------------------------ the NodeDO side of the socket

  readonly #welcomed = new WeakSet<WebSocket>();
  readonly #serverCloses = new WeakMap<WebSocket, number>();

  #close(ws: WebSocket, code: number, reason: string): void {
    if (!this.#serverCloses.has(ws)) this.#serverCloses.set(ws, code);
    ws.close(code, reason);
  }

  #onUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const attempt: { at: number; status: number; authorization?: string } = { at: Date.now(), status: 101 };
    if (typeof req.headers.authorization === "string") attempt.authorization = req.headers.authorization;
    this.attempts.push(attempt);
    const refuse = (status: number, code: string, message: string) => {
      attempt.status = status;
      const body = JSON.stringify({ code, message });
      socket.end(
        `HTTP/1.1 ${status} ${status === 401 ? "Unauthorized" : status === 403 ? "Forbidden" : status === 404 ? "Not Found" : "Refused"}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    };
    if (req.url !== CONNECT_PATH) return refuse(404, "NOT_FOUND", "no such path");
    if (this.refuse) return refuse(this.refuse.status, this.refuse.code, this.refuse.message);
    const node = this.#bearer(req.headers.authorization);
    if (!node) return refuse(401, "UNAUTHENTICATED", "the credential is invalid or expired");
    if (node.revoked) return refuse(403, "PERMISSION_DENIED", "the node's credentials were revoked");
    const authorization = req.headers.authorization;
    this.#wss.handleUpgrade(req, socket, head, (ws) => this.#onSocket(ws, node, authorization));
  }

  #onSocket(ws: WebSocket, node: FakeNode, authorization: string | undefined): void {
    const conn: FakeConnection = { n: this.connections.length + 1, openedAt: Date.now(), ...(authorization ? { authorization } : {}) };
    this.connections.push(conn);
    const nonce = random();
    const close = (code: number, reason: string) => this.#close(ws, code, reason);
    ws.on("close", (code) => {
      const serverClose = this.#serverCloses.get(ws);
      conn.closedAt = Date.now();
      conn.closeCode = serverClose ?? code;
      conn.closedBy = serverClose !== undefined ? "server" : "agent";
      if (node.socket === ws) node.socket = undefined;
    });
    ws.on("error", () => {});
    this.#send(ws, { t: "challenge", protocol: PROTOCOL_VERSION, nonce });
    ws.on("message", (data, isBinary) => {
      const text = isBinary ? "" : (data as Buffer).toString("utf8");
      if (text === PING) {
        this.pings++;
        if (this.answerPings) ws.send(PONG);
        return;
      }
      this.received.push({ ...(conn.nodeId ? { nodeId: conn.nodeId } : {}), text });
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        return close(CloseCode.MALFORMED_FRAME, "not JSON");
      }
      const parsed = agentFrame.safeParse(json);
      if (!parsed.success) return close(CloseCode.MALFORMED_FRAME, "not a frame");
      const frame = parsed.data;
      if (!this.#welcomed.has(ws)) {
        if (frame.t !== "hello") return close(CloseCode.HELLO_REQUIRED, "hello first");
        void this.#onHello(ws, node, conn, nonce, frame, close);
        return;
      }
      if (frame.t === "hello") return; // a second hello is ignored
      if (frame.t === "status") return; // NodeSpecs are not served by this fake (the workers tests cover them)
      const cmd = this.commands.get(frame.id);
      if (!cmd) return this.#send(ws, { t: "error", code: FrameError.UNKNOWN_COMMAND, message: "no such command", ref: frame.id });
      if (cmd.nodeId !== node.nodeId)
        return this.#send(ws, { t: "error", code: FrameError.NOT_YOUR_COMMAND, message: "another node's command", ref: frame.id });
      if (frame.t === "ack") {
        cmd.acks++;
        return;
      }
      void this.#onResult(ws, node, cmd, frame);
    });
  }

  async #onHello(
    ws: WebSocket,
    node: FakeNode,
    conn: FakeConnection,
    nonce: string,
    frame: HelloFrame,
    close: (code: number, reason: string) => void,
  ): Promise<void> {
    const verified =
      frame.nonce === nonce && (await verifyMessage(node.publicKey, helloMessage(node.nodeId, frame.nonce, frame.bootId), frame.signature));
    this.hellos.push({ nodeId: node.nodeId, frame, verified });
    if (!verified) return close(CloseCode.PROOF_FAILED, "proof of possession failed");
    conn.nodeId = node.nodeId;
    conn.helloAt = Date.now();
    const previous = node.socket;
    node.socket = ws;
    if (previous && previous !== ws) this.#close(previous, CloseCode.REPLACED, "replaced by a newer connection");
    this.#welcomed.add(ws);
    this.#send(ws, { t: "welcome", nodeId: node.nodeId, sessionId: `sess-${conn.n}` });
    for (const cmd of this.pending(node.nodeId)) if (this.redeliver || cmd.deliveries === 0) this.#send(ws, cmd);
  }

  async #onResult(ws: WebSocket, node: FakeNode, cmd: FakeCommand, frame: ResultFrame): Promise<void> {
    if (this.unavailableResults > 0) {
      this.unavailableResults--;
      return this.#send(ws, { t: "error", code: FrameError.UNAVAILABLE, message: "try again later", ref: frame.id });
    }
    const verified =
      frame.key === cmd.key &&
      (frame.signature !== undefined
        ? await verifyMessage(node.publicKey, await resultMessage(node.nodeId, frame), frame.signature)
        : !cmd.attested);
    cmd.results.push({ frame, verified });
    if (!verified)
      return this.#send(ws, { t: "error", code: FrameError.BAD_SIGNATURE, message: "the result signature does not verify", ref: frame.id });
    cmd.result ??= frame;
    if (this.ackResults) this.#send(ws, { t: "result-ack", id: frame.id });
  }

  #send(ws: WebSocket, frame: object): void {
    if (ws.readyState !== ws.OPEN) return;
    if ((frame as { t?: unknown }).t === "command") {
      const cmd = frame as unknown as FakeCommand;
      cmd.deliveries++;
      const { t, id, seq, kind, key, body, attested, deadline, secrets } = cmd;
      ws.send(JSON.stringify({ t, id, seq, kind, key, body, attested, deadline, ...(secrets ? { secrets } : {}) }));
      return;
    }
    ws.send(JSON.stringify(frame));
  }
}
