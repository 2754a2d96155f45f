// NodeDO: one per agent (idFromName(nodeId)), whatever its role. It holds the agent's
// hibernatable WebSocket, asks for proof of possession of the node key, delivers the node's
// commands in order and takes each result once; it sends the node's NodeSpec when it changes
// and records the status the agent reports (core/agents/node-specs.ts). Postgres is the
// record: every transition is written there with its event before it is acknowledged, and
// after an eviction the object rebuilds everything it needs from Postgres and the socket's
// attachment. Like the WorkflowDO it is built over the deployment's compute (nodeObject), so it
// reads the record through the deployment's database port and resolves secrets through its
// secret store.
import { DurableObject } from "cloudflare:workers";
import type { Bindings, WakeableObject } from "../core/bindings.ts";
import type { Compute } from "../core/compute.ts";
import type { SecretStore } from "../core/context.ts";
import { createLogger, type Logger } from "../core/log.ts";
import {
  challengeFrame,
  CloseCode,
  FrameError,
  helloMessage,
  PING,
  PONG,
  PROTOCOL_VERSION,
  readAgentFrame,
  verifyMessage,
  type HelloFrame,
  type ResultFrame,
  type ServerFrame,
  type StatusFrame,
} from "../core/protocol.ts";
import type { Store } from "../core/store/database.ts";
import { base64url } from "../core/encoding.ts";
import { wakeObjects } from "../core/agents/notify.ts";
import { SocketBudget, type BudgetedKind } from "../core/agents/frame-budget.ts";
import {
  nextDelivery,
  recordConnected,
  recordDisconnected,
  recordRateLimited,
  recordResults,
  waitingObject,
  type ArrivedResult,
  type SessionRef,
} from "../core/agents/sessions.ts";
import { recordStatus } from "../core/agents/node-specs.ts";
import { setAlarm } from "./alarm.ts";
import { SerialBatches } from "./serial.ts";

/** The sweep re-reads Postgres while an agent is connected: a missed poke costs at most this. */
const SWEEP_MS = 30_000;
/** A socket that has not said hello by then is closed. */
const HELLO_TIMEOUT_MS = 30_000;
/**
 * Sockets still waiting for their hello, at most: a newer one closes the oldest. Only a socket
 * whose hello proved the node's key replaces the live one, so a stolen credential without its key
 * opens at most this many short-lived sockets and displaces nothing.
 */
const MAX_UNPROVEN_SOCKETS = 4;
/**
 * After a socket was closed for its frame budget, the node's new sockets are refused (429) this
 * long: an agent that floods and reconnects at once would otherwise cost a hello, a recorded
 * connection and another burst of frames each time.
 */
const POLICY_COOLDOWN_MS = 10_000;
/** Storage key: until when (epoch ms) the node's sockets are refused after a policy close. */
const COOLDOWN_KEY = "cooldown-until";
const DELIVERY_BATCH = 100;
/**
 * An idle object closes its Postgres connection after this: an open socket keeps workerd from
 * evicting the object (hibernating its WebSocket), so with one NodeDO per connected agent idle
 * connections would cost every agent a connection, its file descriptors and the object's memory.
 * Short enough that the object is evicted soon after each sweep, long enough that a steady stream
 * of results and deliveries keeps its connection.
 */
const IDLE_CLOSE_MS = 1_000;

/** Per-socket state, kept with the socket across hibernation (serializeAttachment). */
interface Attachment {
  nodeId: string;
  publicKey: string;
  sessionId: string;
  /** The challenge's nonce until a hello answers it; null afterwards, so it cannot be replayed. */
  nonce: string | null;
  ready: boolean;
  openedAt: number;
  /** Highest command seq sent on this socket. */
  sentSeq: number;
  /** The NodeSpec generation last sent on this socket (absent: none yet). */
  sentSpecGeneration?: number;
  /** The agent boot its hello named: recorded with its status. */
  bootId?: string;
}

/** The socket's state. accept() attaches it before the socket can deliver an event, so every socket of this object has one. */
function attachmentOf(ws: WebSocket): Attachment {
  return ws.deserializeAttachment() as Attachment;
}

function updateAttachment(ws: WebSocket, patch: Partial<Attachment>): void {
  ws.serializeAttachment({ ...attachmentOf(ws), ...patch } satisfies Attachment);
}

/** What the object remembers outside its sockets (storage key "session"): the session to record as ended if its socket vanishes. */
const SESSION_KEY = "session";

/** The deployment's NodeDO class (export it as NodeDO from the Worker's entry: workers/api/entry.ts). */
export function nodeObject(compute: Compute) {
  return class NodeDO extends DurableObject<Bindings> implements WakeableObject {
    #store: Store | undefined;
    #secrets: SecretStore | undefined;
    /**
     * Delivery passes, one at a time: wake-ups while a pass waits its turn share it (it reads
     * everything open when it starts).
     */
    #deliveries = new SerialBatches(async () => {
      try {
        await this.deliverOnce();
      } catch (err) {
        this.log().warn("delivery pass failed; the sweep retries", { error: errorText(err) });
      }
    });
    /** Results that arrive while a batch is being recorded wait, and are recorded together in the next statement. */
    #results = new SerialBatches((batch: ArrivedResult[]) => recordResults(this.store, batch));
    /**
     * Statuses are recorded one at a time, in the order they arrived: recorded concurrently, an
     * older one could commit last and hide the newer. Each status is whole, so of those waiting
     * their turn only the newest is recorded.
     */
    #statuses = new SerialBatches(async (batch: { ws: WebSocket; att: Attachment; frame: StatusFrame }[]) => {
      const newest = batch.at(-1)!;
      await this.saveStatus(newest.ws, newest.att, newest.frame);
    });
    /** Each socket's frame budget (core/agents/frame-budget.ts), in memory: a woken object starts them afresh. */
    #budgets = new WeakMap<WebSocket, SocketBudget>();
    /** Events in progress that may use the store; at zero the store is closed after IDLE_CLOSE_MS. */
    #busy = 0;
    #idleTimer: ReturnType<typeof setTimeout> | undefined;

    constructor(ctx: DurableObjectState, env: Bindings) {
      super(ctx, env);
      // Heartbeats are answered without waking the object.
      ctx.setWebSocketAutoResponse(new WebSocketRequestResponsePair(PING, PONG));
    }

    /** One pool per object, reused across events while they keep coming; closed when idle (IDLE_CLOSE_MS). */
    private get store(): Store {
      return (this.#store ??= compute.openStore(this.env));
    }

    /** Runs an event's work; the last one to finish schedules the store's close. */
    private async busy<T>(work: () => Promise<T>): Promise<T> {
      this.#busy++;
      clearTimeout(this.#idleTimer);
      try {
        return await work();
      } finally {
        if (--this.#busy === 0) this.#idleTimer = setTimeout(() => this.closeIdleStore(), IDLE_CLOSE_MS);
      }
    }

    private closeIdleStore(): void {
      const store = this.#store;
      // Work queued behind a batch (results, a delivery pass) counts as busy until it settles.
      if (this.#busy > 0 || !store || this.#results.waiting || this.#statuses.waiting || this.#deliveries.waiting) return;
      this.#store = undefined;
      this.#secrets = undefined;
      void store.close();
    }

    /** Resolves the secret references of commands it delivers, through the deployment's secret store. */
    private get secrets(): SecretStore {
      return (this.#secrets ??= compute.moduleContext("agents", this.env, this.store).secrets);
    }

    private log(att?: Attachment): Logger {
      return createLogger({ component: "node-do", ...(att ? { nodeId: att.nodeId, sessionId: att.sessionId } : {}) });
    }

    /** The WebSocket upgrade the gateway forwards (core/agents/join.ts): an upgrade needs fetch, not RPC. */
    override async fetch(request: Request): Promise<Response> {
      if (new URL(request.url).pathname === "/connect") return this.accept(request);
      return new Response("not found", { status: 404 });
    }

    /** Commands were enqueued, the NodeSpec changed or the node was revoked (core/agents/notify.ts): deliver, or close its socket. */
    async wake(): Promise<void> {
      await this.busy(() => this.deliver());
    }

    private async accept(request: Request): Promise<Response> {
      const cooldownUntil = (await this.ctx.storage.get<number>(COOLDOWN_KEY)) ?? 0;
      if (cooldownUntil > Date.now()) {
        const seconds = Math.ceil((cooldownUntil - Date.now()) / 1000);
        return Response.json(
          { code: "RESOURCE_EXHAUSTED", message: `this node's last socket exceeded its frame budget: reconnect after ${seconds} s` },
          { status: 429, headers: { "retry-after": String(seconds) } },
        );
      }
      const nodeId = request.headers.get("x-bc-node-id");
      const publicKey = request.headers.get("x-bc-node-key");
      if (!nodeId || !publicKey || request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
        return new Response("the gateway must forward an authenticated upgrade", { status: 400 });
      }
      // The live connection stays until this one proves the node's key (hello). Unproven sockets
      // are few: past MAX_UNPROVEN_SOCKETS the oldest goes.
      const unproven = this.ctx
        .getWebSockets()
        .filter((ws) => ws.readyState === WebSocket.OPEN && !attachmentOf(ws).ready)
        .sort((a, b) => attachmentOf(a).openedAt - attachmentOf(b).openedAt);
      for (const old of unproven.slice(0, Math.max(0, unproven.length - MAX_UNPROVEN_SOCKETS + 1))) {
        old.close(CloseCode.HELLO_REQUIRED, "a newer connection of this node is waiting for its hello");
      }

      const pair = new WebSocketPair();
      const [client, server] = [pair[0], pair[1]];
      this.ctx.acceptWebSocket(server);
      const nonce = base64url(crypto.getRandomValues(new Uint8Array(32)));
      const att: Attachment = { nodeId, publicKey, sessionId: crypto.randomUUID(), nonce, ready: false, openedAt: Date.now(), sentSeq: 0 };
      server.serializeAttachment(att);
      send(server, challengeFrame.parse({ t: "challenge", protocol: PROTOCOL_VERSION, nonce }));
      this.ctx.waitUntil(this.armSweep(HELLO_TIMEOUT_MS));
      return new Response(null, { status: 101, webSocket: client });
    }

    override async webSocketMessage(ws: WebSocket, message: string | ArrayBuffer): Promise<void> {
      await this.busy(() => this.message(ws, message));
    }

    private async message(ws: WebSocket, message: string | ArrayBuffer): Promise<void> {
      const budget = this.budgetOf(ws);
      if (budget.closed) return;
      const reading = readAgentFrame(message);
      if ("close" in reading) return ws.close(reading.close, reading.reason);
      const { frame } = reading;
      const att = attachmentOf(ws);
      if (frame.t === "hello") return this.hello(ws, att, frame);
      if (!att.ready) return ws.close(CloseCode.HELLO_REQUIRED, "say hello first");
      // Over its budget a frame is dropped before any work is done for it.
      if (!budget.admit(frame.t)) return this.overBudget(ws, att, budget, frame);
      if (frame.t === "result") return this.result(ws, att, budget, frame);
      if (frame.t === "status") return this.#statuses.add({ ws, att, frame });
      // ack: the agent journaled the command; the result is what changes the record.
    }

    private budgetOf(ws: WebSocket): SocketBudget {
      let budget = this.#budgets.get(ws);
      if (!budget) this.#budgets.set(ws, (budget = new SocketBudget(compute.frameBudgets)));
      return budget;
    }

    /** A frame over its budget: dropped (a result is answered RATE_LIMITED, so its agent sends it again later), and a strike. */
    private async overBudget(ws: WebSocket, att: Attachment, budget: SocketBudget, frame: { t: BudgetedKind; id?: string }) {
      if (frame.t === "result") {
        send(ws, { t: "error", code: FrameError.RATE_LIMITED, message: "too many results: send it again after a backoff", ref: frame.id });
      }
      await this.strike(ws, att, budget, { frame: frame.t, refused: "OVER_BUDGET" });
    }

    /**
     * A dropped frame or a refused result: logged once a period (with how many were not), and
     * when the socket's strikes run out it is closed with POLICY_VIOLATION and node.rate-limited.
     */
    private async strike(
      ws: WebSocket,
      att: Attachment,
      budget: SocketBudget,
      what: { refused: string; frame?: string; commandId?: string },
    ) {
      const strike = budget.strike(what.refused === "OVER_BUDGET" ? undefined : what.refused);
      if (strike.log) this.log(att).warn("refused a frame", { ...what, unloggedSinceLast: strike.log.suppressed });
      if (!strike.close) return;
      const summary = budget.summary();
      this.log(att).warn("closed the socket: it kept exceeding its frame budget", { ...summary });
      ws.close(CloseCode.POLICY_VIOLATION, "the socket kept exceeding its frame budget");
      await this.ctx.storage.put(COOLDOWN_KEY, Date.now() + POLICY_COOLDOWN_MS);
      try {
        await recordRateLimited(this.store, att, summary);
      } catch (err) {
        this.log(att).warn("could not record node.rate-limited", { error: errorText(err) });
      }
    }

    private async hello(ws: WebSocket, att: Attachment, frame: HelloFrame): Promise<void> {
      if (att.nonce === null || frame.nonce !== att.nonce) {
        return ws.close(CloseCode.PROOF_FAILED, "the hello does not answer this socket's challenge");
      }
      if (!(await verifyMessage(att.publicKey, helloMessage(att.nodeId, frame.nonce, frame.bootId), frame.signature))) {
        return ws.close(CloseCode.PROOF_FAILED, "the hello is not signed by the node's key");
      }
      let outcome: Awaited<ReturnType<typeof recordConnected>>;
      try {
        outcome = await recordConnected(this.store, att, frame);
      } catch (err) {
        this.log(att).warn("could not record the connection; the agent will retry", { error: errorText(err) });
        return ws.close(1011, "the control plane's database is unavailable; retry");
      }
      if (!outcome.connected) return ws.close(CloseCode.REVOKED, "the node was revoked");
      // Proven: this socket is the node's connection now. The old one's close records nothing
      // (the node's session is this one's already).
      for (const old of this.ctx.getWebSockets()) {
        if (old !== ws && old.readyState === WebSocket.OPEN && attachmentOf(old).ready)
          old.close(CloseCode.REPLACED, "replaced by a newer connection");
      }
      if (outcome.waking.length) await wakeObjects(this.env, "workflow", outcome.waking, this.log(att));
      updateAttachment(ws, { nonce: null, ready: true, bootId: frame.bootId });
      // Remembered outside the socket: if the runtime restarts, the socket (and its close event)
      // is gone, and the sweep must still record the disconnection.
      await this.ctx.storage.put<SessionRef>(SESSION_KEY, { nodeId: att.nodeId, sessionId: att.sessionId });
      send(ws, { t: "welcome", nodeId: att.nodeId, sessionId: att.sessionId });
      await this.armSweep(SWEEP_MS);
      await this.deliver();
    }

    private async result(ws: WebSocket, att: Attachment, budget: SocketBudget, frame: ResultFrame): Promise<void> {
      const refuse = (code: string, message: string) => void send(ws, { t: "error", code, message, ref: frame.id });
      try {
        const outcome = await this.#results.add({ node: att, frame });
        if ("refused" in outcome) {
          refuse(outcome.refused, outcome.message);
          return this.strike(ws, att, budget, { refused: outcome.refused, commandId: frame.id });
        }
        send(ws, { t: "result-ack", id: frame.id });
        // Whoever waits for this result (a workflow) hears of it now rather than at its next poll.
        const waiting = waitingObject(outcome);
        if (waiting) await wakeObjects(this.env, waiting.kind, [waiting.name], this.log(att));
      } catch (err) {
        this.log(att).warn("could not record a result; the agent keeps it and resends", { commandId: frame.id, error: errorText(err) });
        refuse(FrameError.UNAVAILABLE, "the result could not be recorded now; send it again after reconnecting");
      }
    }

    /**
     * The agent's observed NodeSpec: recorded for the current session; the modules owning the
     * sections whose observed state changed reconcile now rather than at the next cron sweep.
     */
    private async saveStatus(ws: WebSocket, att: Attachment, frame: StatusFrame): Promise<void> {
      let outcome: Awaited<ReturnType<typeof recordStatus>>;
      try {
        outcome = await recordStatus(this.store, { nodeId: att.nodeId, sessionId: att.sessionId, bootId: att.bootId ?? null }, frame);
      } catch (err) {
        // The agent sends its latest status again on every welcome.
        this.log(att).warn("could not record the node's status; the agent resends it after reconnecting", { error: errorText(err) });
        return ws.close(1011, "the control plane's database is unavailable; retry");
      }
      const owners = new Set(outcome.changed.flatMap((name) => compute.registry.nodeSpecSections.get(name)?.module.id ?? []));
      for (const moduleId of owners) {
        this.ctx.waitUntil(
          compute.reconcileModule(moduleId, this.env).catch((err) =>
            this.log(att).warn("a reconciler run after a status failed; the cron sweep runs it again", {
              moduleId,
              error: errorText(err),
            }),
          ),
        );
      }
    }

    /** Sends the node's open commands in seq order (see #deliveries). */
    private deliver(): Promise<void> {
      return this.#deliveries.add();
    }

    private async deliverOnce(): Promise<void> {
      const ws = this.ctx.getWebSockets().find((s) => attachmentOf(s).ready);
      if (!ws) return;
      const att = attachmentOf(ws);
      for (;;) {
        const { live, spec, frames } = await nextDelivery(
          this.store,
          att.nodeId,
          { afterSeq: att.sentSeq, specAfter: att.sentSpecGeneration ?? 0, limit: DELIVERY_BATCH },
          () => this.secrets,
        );
        if (!live) return ws.close(CloseCode.REVOKED, "the node was revoked");
        // The NodeSpec first: it is the node's desired state, commands are one-off work.
        if (spec) {
          if (!send(ws, { t: "spec", generation: spec.generation, sections: spec.sections })) return;
          att.sentSpecGeneration = spec.generation;
          updateAttachment(ws, { sentSpecGeneration: spec.generation });
        }
        if (frames.length === 0) return;
        for (const frame of frames) {
          if (!send(ws, frame)) return;
          this.budgetOf(ws).sent(1);
          att.sentSeq = Math.max(att.sentSeq, frame.seq);
        }
        updateAttachment(ws, { sentSeq: att.sentSeq });
        if (frames.length < DELIVERY_BATCH) return;
      }
    }

    override async webSocketClose(ws: WebSocket, code: number, reason: string): Promise<void> {
      // Complete the closing handshake (a no-op where the runtime already answered it).
      try {
        ws.close(code === 1005 || code === 1006 ? 1000 : code, reason);
      } catch {
        // already closed
      }
      await this.busy(() => this.disconnected(ws, code));
    }

    override async webSocketError(ws: WebSocket): Promise<void> {
      await this.busy(() => this.disconnected(ws, 1006));
    }

    private async disconnected(ws: WebSocket, code: number): Promise<void> {
      const att = attachmentOf(ws);
      if (!att.ready) return;
      await this.recordDisconnected(att, code);
    }

    private async recordDisconnected(att: SessionRef, code: number): Promise<void> {
      try {
        await recordDisconnected(this.store, att, code);
        const current = await this.ctx.storage.get<SessionRef>(SESSION_KEY);
        if (current?.sessionId === att.sessionId) await this.ctx.storage.delete(SESSION_KEY);
      } catch (err) {
        this.log().warn("could not record the disconnection; the sweep retries", { nodeId: att.nodeId, error: errorText(err) });
      }
    }

    /** The one alarm: closes sockets that never said hello, and sweeps for undelivered commands. */
    override async alarm(): Promise<void> {
      await this.busy(() => this.sweep());
    }

    private async sweep(): Promise<void> {
      const sockets = this.ctx.getWebSockets();
      for (const ws of sockets) {
        const att = attachmentOf(ws);
        if (!att.ready && Date.now() - att.openedAt >= HELLO_TIMEOUT_MS) ws.close(CloseCode.HELLO_REQUIRED, "no hello in time");
      }
      await this.deliver();
      const session = await this.ctx.storage.get<SessionRef>(SESSION_KEY);
      const live = this.ctx.getWebSockets().some((ws) => attachmentOf(ws).sessionId === session?.sessionId);
      // The session's socket vanished without a close event (the runtime restarted): record it.
      if (session && !live) await this.recordDisconnected(session, 1006);
      if (this.ctx.getWebSockets().length > 0 || (await this.ctx.storage.get(SESSION_KEY))) await this.armSweep(SWEEP_MS);
    }

    /** Wakes the object within inMs: a sooner alarm (a hello timeout, the sweep) stays. */
    private armSweep(inMs: number): Promise<void> {
      return setAlarm(this.ctx.storage, Date.now() + inMs, { keepSooner: true });
    }
  };
}

function send(ws: WebSocket, frame: ServerFrame): boolean {
  try {
    ws.send(JSON.stringify(frame));
    return true;
  } catch {
    return false;
  }
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));
