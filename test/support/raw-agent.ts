// A raw protocol peer for the workers tests: joins and speaks frames by hand, so a test can
// send exactly what a broken or hostile agent would. (FakeDaemon is the well-behaved agent.)
import type { Compute } from "../../core/compute.ts";
import {
  CONNECT_PATH,
  generateNodeKey,
  helloMessage,
  JOIN_PATH,
  joinMessage,
  PROTOCOL_VERSION,
  resultMessage,
  signMessage,
  type NodeKeyPair,
  type ServerFrame,
} from "../../core/protocol.ts";

export interface RawAgent {
  nodeId: string;
  key: NodeKeyPair;
  credential: string;
  ws: WebSocket;
  frames: ServerFrame[];
  closed: Promise<{ code: number; reason: string }>;
  send(frame: unknown): void;
  /** Resolves with the next frame matching the predicate (already received ones count). */
  next<T extends ServerFrame["t"]>(t: T, where?: (f: Extract<ServerFrame, { t: T }>) => boolean): Promise<Extract<ServerFrame, { t: T }>>;
  hello(overrides?: Record<string, unknown>): Promise<void>;
  result(
    command: { id: string; key: string },
    ok: boolean,
    output: unknown,
    options?: { signWith?: CryptoKey; unsigned?: boolean },
  ): Promise<void>;
}

export const fetcher = (compute: Compute, env: object) => (input: string, init?: RequestInit) =>
  compute.fetch(new Request(new URL(input, "http://bc.test"), init), env);

export async function joinRaw(compute: Compute, env: object, token: string, role: "node" | "site" | "ramdisk" = "site") {
  return joinWith(compute, env, { attestor: "join-token", evidence: { token }, role });
}

/** A join with any attestor; the key is made here unless given. */
export async function joinWith(
  compute: Compute,
  env: object,
  request: { attestor: string; evidence: Record<string, unknown>; role: "node" | "site" | "ramdisk"; key?: NodeKeyPair },
) {
  const key = request.key ?? (await generateNodeKey());
  const res = await fetcher(compute, env)(JOIN_PATH, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      attestor: request.attestor,
      evidence: request.evidence,
      publicKey: key.publicKey,
      role: request.role,
      signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, request.attestor, request.evidence)),
    }),
  });
  return { res, key, body: (await res.json()) as any };
}

export async function connectRaw(
  compute: Compute,
  env: object,
  joined: { nodeId: string; credential: string; key: NodeKeyPair },
): Promise<RawAgent> {
  const res = await fetcher(compute, env)(CONNECT_PATH, {
    headers: { upgrade: "websocket", authorization: `Bearer ${joined.credential}` },
  });
  if (!res.webSocket) throw new Error(`no websocket: ${res.status} ${await res.text()}`);
  const ws = res.webSocket;
  ws.accept();
  const frames: ServerFrame[] = [];
  const waiters: Array<() => void> = [];
  ws.addEventListener("message", (e) => {
    frames.push(JSON.parse(e.data as string));
    for (const w of waiters.splice(0)) w();
  });
  const closed = new Promise<{ code: number; reason: string }>((resolve) =>
    ws.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason })),
  );
  const agent: RawAgent = {
    ...joined,
    ws,
    frames,
    closed,
    send: (frame) => ws.send(typeof frame === "string" ? frame : JSON.stringify(frame)),
    async next(t, where = () => true) {
      for (;;) {
        const index = frames.findIndex((f) => f.t === t && where(f as never));
        if (index >= 0) return frames.splice(index, 1)[0] as never;
        await Promise.race([
          new Promise<void>((r) => waiters.push(r)),
          closed.then(() => Promise.reject(new Error(`socket closed while waiting for ${t}`))),
        ]);
      }
    },
    async hello(overrides = {}) {
      const challenge = await agent.next("challenge");
      const bootId = "boot-1";
      agent.send({
        t: "hello",
        protocol: PROTOCOL_VERSION,
        nonce: challenge.nonce,
        role: "site",
        version: "test",
        bootId,
        signature: await signMessage(joined.key.privateKey, helloMessage(joined.nodeId, challenge.nonce, bootId)),
        labels: {},
        drivers: [],
        ...overrides,
      });
    },
    async result(command, ok, output, options = {}) {
      const frame = {
        t: "result" as const,
        id: command.id,
        key: command.key,
        ok,
        ...(ok ? { output } : { error: output as { code: string; message: string } }),
      };
      const signature = options.unsigned
        ? undefined
        : await signMessage(options.signWith ?? joined.key.privateKey, await resultMessage(joined.nodeId, frame));
      agent.send({ ...frame, ...(signature ? { signature } : {}) });
    },
  };
  return agent;
}
