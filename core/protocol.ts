// The agent protocol: what crosses the WebSocket between an agent and its NodeDO.
//
// Frames are JSON text, one object per WebSocket message, discriminated by `t`. JSON because
// every frame is small control traffic (bulk data such as images never rides this socket),
// workerd parses it natively, and an operator can read a capture. A frame over
// MAX_FRAME_BYTES (MAX_SPEC_FRAME_BYTES for spec and status frames) closes the socket with 1009;
// anything that is not a known frame (readAgentFrame) closes it with MALFORMED_FRAME. A
// well-formed frame that is refused (a forged signature, another node's command) is answered with
// an `error` frame and the connection stays up.
import { z } from "zod";
import { base64url, sha256Hex, unbase64url, utf8 } from "./encoding.ts";
import { slugId } from "./schemas.ts";

export const PROTOCOL_VERSION = 1;
export const MAX_FRAME_BYTES = 64 * 1024;
/**
 * A NodeSpec's sections, as JSON, are at most this (setEntry refuses more), and so are a status
 * frame's: spec and status frames are the only ones allowed over MAX_FRAME_BYTES (a Worker's
 * WebSocket message is at most 1 MiB).
 */
export const MAX_SPEC_BYTES = 512 * 1024;
/** A spec or status frame: the sections and the frame's envelope. */
export const MAX_SPEC_FRAME_BYTES = MAX_SPEC_BYTES + 1024;
/** Heartbeat: the NodeDO answers this exact text without waking from hibernation. */
export const PING = '{"t":"ping"}';
export const PONG = '{"t":"pong"}';

export const CloseCode = {
  /** The frame was larger than MAX_FRAME_BYTES (RFC 6455 "message too big"). */
  FRAME_TOO_LARGE: 1009,
  /** Not JSON, or not a frame this protocol knows. */
  MALFORMED_FRAME: 4400,
  /** The hello's proof of possession did not verify (wrong key, or a nonce not issued to this socket). */
  PROOF_FAILED: 4401,
  /** A frame other than hello before the hello was accepted. */
  HELLO_REQUIRED: 4402,
  /** The node's credential was revoked. */
  REVOKED: 4403,
  /** A newer connection of the same node took over (it proved the node's key in its hello). */
  REPLACED: 4409,
  /** The socket kept exceeding its frame budget (RFC 6455 "policy violation"): docs/agent-protocol.md. */
  POLICY_VIOLATION: 1008,
} as const;

/** Codes of `error` frames: the refused frame is dropped, the connection stays. */
export const FrameError = {
  BAD_SIGNATURE: "BAD_SIGNATURE",
  NOT_YOUR_COMMAND: "NOT_YOUR_COMMAND",
  UNKNOWN_COMMAND: "UNKNOWN_COMMAND",
  UNAVAILABLE: "UNAVAILABLE",
  /** The socket sent results faster than its budget: this one was dropped; send it again after a backoff. */
  RATE_LIMITED: "RATE_LIMITED",
} as const;

const labels = z.record(z.string().max(253), z.string().max(253));
const errorBody = z.object({
  code: z.string().max(64),
  message: z.string().max(4096),
  /** The agent says running the command again cannot succeed (an untrusted certificate...): not retried. */
  permanent: z.boolean().optional(),
});

// ---------------------------------------------------------------- agent → NodeDO

export const helloFrame = z.object({
  t: z.literal("hello"),
  protocol: z.literal(PROTOCOL_VERSION),
  nonce: z.string().max(128),
  /** Ed25519 over helloMessage(nodeId, nonce, bootId), base64url. */
  signature: z.string().max(256),
  role: z.enum(["node", "site", "ramdisk"]),
  version: z.string().max(64),
  bootId: z.string().max(128),
  labels: labels.default({}),
  drivers: z
    .array(z.object({ id: z.string().max(128), version: z.string().max(64) }))
    .max(256)
    .default([]),
  /** What the machine has (a node agent's report; capacity derives allocatable resources from it). */
  resources: z
    .object({
      cpus: z.number().int().min(0).max(100_000),
      memoryMiB: z
        .number()
        .int()
        .min(0)
        .max(1 << 30),
      diskGiB: z
        .number()
        .int()
        .min(0)
        .max(1 << 30),
      /** Devices a guest can be given (GPUs...): one entry each. */
      devices: z
        .array(z.object({ id: z.string().max(128), kind: z.string().max(64), model: z.string().max(128).optional() }))
        .max(256)
        .default([]),
    })
    .optional(),
});

/** Idempotency keys longer than this are refused at enqueue: the agent could not answer them. */
export const MAX_KEY_LENGTH = 256;

export const ackFrame = z.object({ t: z.literal("ack"), id: z.string().max(64) });

export const resultFrame = z.object({
  t: z.literal("result"),
  id: z.string().max(64),
  key: z.string().max(MAX_KEY_LENGTH),
  ok: z.boolean(),
  output: z.unknown().optional(),
  error: errorBody.optional(),
  /** Ed25519 over resultMessage(...), base64url; required for attested kinds. */
  signature: z.string().max(256).optional(),
});

/**
 * What the node reached of its NodeSpec: per section, the observed entries (keyed like the
 * desired ones) and the section's error, if it could not be converged (UNSUPPORTED...).
 */
export const statusFrame = z.object({
  t: z.literal("status"),
  /** The generation of the spec the agent converged (or tried to: see each section's error). */
  generation: z.number().int().min(0),
  sections: z
    .record(
      z.string().max(64),
      z.object({ entries: z.record(z.string().max(253), z.unknown()), error: errorBody.pick({ code: true, message: true }).optional() }),
    )
    .refine((s) => Object.keys(s).length <= 64, "at most 64 sections"),
});

export const agentFrame = z.discriminatedUnion("t", [helloFrame, ackFrame, resultFrame, statusFrame]);
export type AgentFrame = z.infer<typeof agentFrame>;
export type HelloFrame = z.infer<typeof helloFrame>;
export type ResultFrame = z.infer<typeof resultFrame>;
export type StatusFrame = z.infer<typeof statusFrame>;
/** A node's observed state as the agent reports it (a status frame without its tag). */
export type NodeStatus = Omit<StatusFrame, "t">;

/** The size limit of a frame of type t: spec and status frames carry a NodeSpec, every other frame is small. */
export const frameLimit = (t: unknown) => (t === "status" || t === "spec" ? MAX_SPEC_FRAME_BYTES : MAX_FRAME_BYTES);

/** What a WebSocket message from an agent reads as: a frame, or why the socket is closed. */
export type FrameReading = { frame: AgentFrame } | { close: number; reason: string };

/**
 * Reads an agent's message strictly. The size limit is the parsed type's, and a frame that names
 * a key twice is refused: JSON.parse keeps the last of duplicated keys, so such a frame could be
 * one type to a reader of its text (`{"t":"status","t":"result"}`) and another once parsed.
 */
export function readAgentFrame(message: string | ArrayBuffer): FrameReading {
  // Counting UTF-8 bytes costs an encode: a string this short cannot be over any limit.
  const bytes =
    typeof message !== "string" ? message.byteLength : message.length * 3 <= MAX_FRAME_BYTES ? message.length : utf8(message).byteLength;
  if (bytes > MAX_SPEC_FRAME_BYTES)
    return { close: CloseCode.FRAME_TOO_LARGE, reason: `frames are limited to ${MAX_SPEC_FRAME_BYTES} bytes` };
  if (typeof message !== "string") return { close: CloseCode.MALFORMED_FRAME, reason: "frames are JSON text" };
  let json: unknown;
  try {
    json = JSON.parse(message);
  } catch {
    return { close: CloseCode.MALFORMED_FRAME, reason: "the frame is not JSON" };
  }
  const t = (json as { t?: unknown } | null)?.t;
  if (bytes > frameLimit(t)) {
    return {
      close: CloseCode.FRAME_TOO_LARGE,
      reason: `${typeof t === "string" ? t.slice(0, 40) : "such"} frames are limited to ${frameLimit(t)} bytes`,
    };
  }
  if (hasDuplicateKey(message)) return { close: CloseCode.MALFORMED_FRAME, reason: "the frame names a key twice" };
  const parsed = agentFrame.safeParse(json);
  if (!parsed.success) {
    return {
      close: CloseCode.MALFORMED_FRAME,
      reason: typeof t === "string" ? `unknown or malformed frame ${t.slice(0, 40)}` : "the frame has no type",
    };
  }
  return { frame: parsed.data };
}

/** Whether an object anywhere in the JSON text names a key twice. The text must be valid JSON. */
export function hasDuplicateKey(text: string): boolean {
  // One entry per open container: the keys seen so far of an object, null for an array.
  const open: (Set<string> | null)[] = [];
  let expectKey = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: its closing quote is the next one not escaped (preceded by an even run of backslashes).
      let end = i;
      for (;;) {
        end = text.indexOf('"', end + 1);
        let backslashes = 0;
        while (text.charCodeAt(end - 1 - backslashes) === 0x5c) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      if (expectKey) {
        // A key with escapes is compared as what it means: "a" and "\u0061" are the same key.
        const raw = text.slice(i + 1, end);
        const key = raw.includes("\\") ? (JSON.parse(text.slice(i, end + 1)) as string) : raw;
        const keys = open[open.length - 1]!;
        if (keys.has(key)) return true;
        keys.add(key);
        expectKey = false;
      }
      i = end;
    } else if (c === 0x7b) {
      open.push(new Set());
      expectKey = true;
    } else if (c === 0x5b) {
      open.push(null);
    } else if (c === 0x7d || c === 0x5d) {
      open.pop();
    } else if (c === 0x2c) {
      expectKey = open[open.length - 1] != null;
    }
  }
  return false;
}

// ---------------------------------------------------------------- NodeDO → agent

export const challengeFrame = z.object({ t: z.literal("challenge"), protocol: z.literal(PROTOCOL_VERSION), nonce: z.string() });
export const welcomeFrame = z.object({ t: z.literal("welcome"), nodeId: z.string(), sessionId: z.string() });
export const commandFrame = z.object({
  t: z.literal("command"),
  id: z.string().max(64),
  seq: z.number().int(),
  kind: z.string().max(128),
  /** Idempotency key: the agent runs a key at most once, and answers a redelivery from its record. */
  key: z.string().max(MAX_KEY_LENGTH),
  body: z.record(z.string(), z.unknown()),
  /** The result must be signed with the node's key. */
  attested: z.boolean(),
  deadline: z.string().nullable(),
  /** Values of the command's secret references (secret://id → value), for this delivery only: never journaled. */
  secrets: z.record(z.string(), z.string()).optional(),
});
export const resultAckFrame = z.object({ t: z.literal("result-ack"), id: z.string() });
export const errorFrame = z.object({ t: z.literal("error"), code: z.string(), message: z.string(), ref: z.string().optional() });

/** The node's desired state (NodeSpec): every section is a map of entries keyed by name. Sent when its generation is newer than what this socket was sent. */
export const specFrame = z.object({
  t: z.literal("spec"),
  generation: z.number().int().min(1),
  sections: z.record(z.string(), z.record(z.string(), z.unknown())),
});

export const serverFrame = z.discriminatedUnion("t", [challengeFrame, welcomeFrame, commandFrame, resultAckFrame, errorFrame, specFrame]);
export type ServerFrame = z.infer<typeof serverFrame>;
export type CommandFrame = z.infer<typeof commandFrame>;
export type SpecFrame = z.infer<typeof specFrame>;
/** A node's desired state as the agent receives it (a spec frame without its tag). */
export type NodeSpec = Omit<SpecFrame, "t">;

const sizeText = (unit: string) => z.string().regex(new RegExp(`^[1-9][0-9]{0,11}${unit}$`));

/**
 * An entry of the NodeSpec `instances` section: one guest, keyed by its name. The vps module
 * writes it (its section's schema: plugins/vps/host-instances.ts) and the node role runs it
 * (agent/roles/node.ts): the runtime's InstanceSpec (agent/runtimes/contract.ts) plus the
 * runtime (driver id) it runs on. A runtime takes more than is sent here: sizes in other units
 * or as numbers, vcpus as digits, rebootCount left out (0).
 */
export const instanceEntry = z.strictObject({
  name: slugId,
  runtime: z.string().regex(/^[a-z0-9][a-z0-9.-]{0,127}$/),
  desired: z.enum(["running", "stopped"]),
  vcpus: z.number().int().min(1),
  /** MiB: "<n>M". */
  memory: sizeText("M"),
  /** GiB: "<n>G". */
  disk: sizeText("G"),
  image: z.string().min(1).max(128),
  /** base64 of exactly the stored user data. */
  userData: z.base64(),
  userDataSha256: z.string().regex(/^[0-9a-f]{64}$/),
  /** Raised to reboot a running guest once. */
  rebootCount: z.number().int().min(0),
});
export type InstanceEntry = z.infer<typeof instanceEntry>;

// ---------------------------------------------------------------- signatures (Ed25519, WebCrypto)

/** What a hello signs: the nonce this socket was issued, bound to the node and its boot. */
export const helloMessage = (nodeId: string, nonce: string, bootId: string) =>
  `bc-hello/v${PROTOCOL_VERSION}\n${nodeId}\n${nonce}\n${bootId}`;

/** What a result signs: the command, its key, and a digest of exactly what the agent reports. */
export async function resultMessage(nodeId: string, frame: Pick<ResultFrame, "id" | "key" | "ok" | "output" | "error">): Promise<string> {
  const digest = await sha256Hex(canonicalJson(frame.ok ? (frame.output ?? null) : (frame.error ?? null)));
  return `bc-result/v${PROTOCOL_VERSION}\n${nodeId}\n${frame.id}\n${frame.key}\n${frame.ok ? "ok" : "error"}\n${digest}`;
}

/** JSON with object keys sorted at every level, so both ends digest the same bytes. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
}

export interface NodeKeyPair {
  /** Raw Ed25519 public key, base64url: what the control plane records for the node. */
  publicKey: string;
  privateKey: CryptoKey;
}

export async function generateNodeKey(): Promise<NodeKeyPair & { privateJwk: JsonWebKey }> {
  const pair = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
  const raw = new Uint8Array((await crypto.subtle.exportKey("raw", pair.publicKey)) as ArrayBuffer);
  return {
    publicKey: base64url(raw),
    privateKey: pair.privateKey,
    privateJwk: (await crypto.subtle.exportKey("jwk", pair.privateKey)) as JsonWebKey,
  };
}

export async function importNodeKey(privateJwk: JsonWebKey): Promise<NodeKeyPair> {
  const privateKey = await crypto.subtle.importKey("jwk", privateJwk, { name: "Ed25519" }, false, ["sign"]);
  if (!privateJwk.x) throw new Error("the node key has no public half");
  return { publicKey: privateJwk.x, privateKey };
}

export async function signMessage(privateKey: CryptoKey, message: string): Promise<string> {
  return base64url(new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, privateKey, utf8(message))));
}

export async function verifyMessage(publicKey: string, message: string, signature: string): Promise<boolean> {
  try {
    const key = await crypto.subtle.importKey("raw", unbase64url(publicKey), { name: "Ed25519" }, false, ["verify"]);
    return await crypto.subtle.verify({ name: "Ed25519" }, key, unbase64url(signature), utf8(message));
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------- joining (HTTPS, JoinService)

export const JOIN_PATH = "/join/v1/join";
export const RENEW_PATH = "/join/v1/renew";
export const CONNECT_PATH = "/agent/v1/connect";
/** GET <BLOBS_PATH>/<sha256> with a site agent's credential: a blob (ctx.blobs) by its digest. */
export const BLOBS_PATH = "/agent/v1/blobs";

export const joinRequest = z.object({
  /** Which attestor verifies the evidence: "join-token", "provisioned", "discovery", ... */
  attestor: z.string().max(64),
  evidence: z.record(z.string(), z.unknown()),
  /** The agent's Ed25519 public key (raw, base64url); the credential is bound to it. */
  publicKey: z.string().regex(/^[A-Za-z0-9_-]{43}$/, "an Ed25519 public key, raw and base64url"),
  role: z.enum(["node", "site", "ramdisk"]),
  hostname: z.string().max(253).optional(),
  /** Proof of possession: Ed25519 over joinMessage(publicKey, attestor, evidence), base64url. */
  signature: z.string().max(256),
});
export type JoinRequest = z.infer<typeof joinRequest>;

export const joinResponse = z.object({
  nodeId: z.string(),
  role: z.enum(["node", "site", "ramdisk"]),
  /** Short-lived JWT bound to the agent's key; present as `Authorization: Bearer` to renew and connect. */
  credential: z.string(),
  expiresAt: z.string(),
});
export type JoinResponse = z.infer<typeof joinResponse>;

/**
 * Renewal: the current (unexpired) credential as bearer, plus a fresh signature; the answer is a
 * joinResponse. A revoked node is answered 403 PERMISSION_DENIED here and at connect. Each
 * renewal is single-use: its timestamp must be later than the node's last accepted renewal's.
 */
export const renewRequest = z.object({ timestamp: z.iso.datetime(), signature: z.string().max(256) });
export const renewResponse = joinResponse;

/**
 * A challenge-response attestor (tpm): the agent first asks for a challenge with the evidence
 * it has up front, then joins with evidence that answers it and names it (evidence.challengeId).
 * The challenge is single-use, short-lived and bound to the publicKey asked with: only a join
 * signed by that key can use it, so this request carries no signature of its own.
 */
export const CHALLENGE_PATH = "/join/v1/challenge";
export const challengeRequest = joinRequest.omit({ signature: true });
export type ChallengeRequest = z.infer<typeof challengeRequest>;
export const challengeResponse = z.object({
  challengeId: z.string(),
  expiresAt: z.string(),
  challenge: z.record(z.string(), z.unknown()),
});
export type ChallengeResponse = z.infer<typeof challengeResponse>;

/**
 * What a join signs: the attestor, the key, and a digest of the evidence it spends (a join token,
 * a challenge's answer), so a signed request cannot be taken apart and its signature reused
 * around other evidence. v2: v1 did not cover the evidence, and is refused.
 */
export async function joinMessage(publicKey: string, attestor: string, evidence: Record<string, unknown>): Promise<string> {
  return `bc-join/v2\n${attestor}\n${publicKey}\n${await sha256Hex(canonicalJson(evidence))}`;
}
export const renewMessage = (nodeId: string, timestamp: string) => `bc-renew/v${PROTOCOL_VERSION}\n${nodeId}\n${timestamp}`;

/**
 * Discovery: a site agent vouches for a machine that PXE-booted into the ramdisk on its network.
 * It signs the assertion (which names the ramdisk's own public key) with its node key; the
 * ramdisk presents it as `discovery` evidence { siteNodeId, assertion, signature }.
 */
export const discoveryAssertion = z.object({
  /** The ramdisk agent's Ed25519 public key: the assertion is useless to any other key. */
  publicKey: z.string(),
  issuedAt: z.string(),
  productUuid: z.string().max(64).optional(),
  macs: z.array(z.string().max(32)).max(64).optional(),
});
export type DiscoveryAssertion = z.infer<typeof discoveryAssertion>;
export const discoveryMessage = (siteNodeId: string, assertion: DiscoveryAssertion) =>
  `bc-discovery/v${PROTOCOL_VERSION}\n${siteNodeId}\n${canonicalJson(assertion)}`;
