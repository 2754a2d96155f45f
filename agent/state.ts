// What the agent keeps across restarts: its key, its identity, the command journal, and the
// NodeSpec it was last sent (a node agent converges it again after a restart, offline or not).
// The journal makes commands at-most-once per idempotency key: `started` is written before
// a handler runs and `done` (with the result frame as sent) after, so a redelivery is
// answered from the record and a command the agent died in is reported, never rerun.
// MemoryState has no Node built-ins (it runs in workerd); FileState (file-state.ts) is the
// durable one `bcd` uses.
import type { NodeSpec, ResultFrame } from "../core/protocol.ts";

export type Role = "node" | "site" | "ramdisk";

export interface AgentIdentity {
  nodeId: string;
  role: Role;
  /** Short-lived bearer credential (a JWT bound to the node key). Never logged. */
  credential: string;
  expiresAt: string;
  /** When this credential was received (ISO): renewal is due at 2/3 of obtainedAt..expiresAt. */
  obtainedAt?: string;
  /** The control plane this identity belongs to, so `bcd run` needs no --url. */
  baseUrl?: string;
}

export interface JournalStart {
  key: string;
  /** The command id of the delivery that ran it. */
  id: string;
  kind: string;
}

export type JournalRecord =
  (JournalStart & { state: "started"; at: string }) | (JournalStart & { state: "done"; at: string; result: ResultFrame });

export interface AgentStateStore {
  /** The node's Ed25519 private key as a JWK (has `x`, the public half), or null before the first join. */
  loadKey(): Promise<JsonWebKey | null>;
  saveKey(privateJwk: JsonWebKey): Promise<void>;
  loadIdentity(): Promise<AgentIdentity | null>;
  saveIdentity(identity: AgentIdentity): Promise<void>;
  /** The latest record for an idempotency key, or null if the agent never saw it. */
  journal(key: string): Promise<JournalRecord | null>;
  /** Durable before it resolves: the handler runs only after this. */
  journalStarted(entry: JournalStart): Promise<void>;
  /** Durable before it resolves: the result is sent only after this. */
  journalDone(entry: JournalStart & { result: ResultFrame }): Promise<void>;
  /** Every key's latest record, in the order keys were first seen. */
  entries(): Promise<JournalRecord[]>;
  /** The desired NodeSpec last saved, or null (a node agent that never got one). */
  loadDesiredSpec(): Promise<NodeSpec | null>;
  /** Durable and atomic before it resolves: the node role converges only what it saved. */
  saveDesiredSpec(spec: NodeSpec): Promise<void>;
}

const clone = <T>(value: T): T => JSON.parse(JSON.stringify(value)) as T;

/** Keeps everything in memory; share one instance between clients to simulate a restart. */
export class MemoryState implements AgentStateStore {
  #key: JsonWebKey | null = null;
  #identity: AgentIdentity | null = null;
  #journal = new Map<string, JournalRecord>();
  #spec: NodeSpec | null = null;

  async loadKey() {
    return this.#key && clone(this.#key);
  }
  async saveKey(privateJwk: JsonWebKey) {
    this.#key = clone(privateJwk);
  }
  async loadIdentity() {
    return this.#identity && clone(this.#identity);
  }
  async saveIdentity(identity: AgentIdentity) {
    this.#identity = clone(identity);
  }
  async journal(key: string) {
    const rec = this.#journal.get(key);
    return rec ? clone(rec) : null;
  }
  async journalStarted(entry: JournalStart) {
    this.#journal.set(entry.key, { ...clone(entry), state: "started", at: new Date().toISOString() });
  }
  async journalDone(entry: JournalStart & { result: ResultFrame }) {
    this.#journal.set(entry.key, { ...clone(entry), state: "done", at: new Date().toISOString() });
  }
  async entries() {
    return [...this.#journal.values()].map(clone);
  }
  async loadDesiredSpec() {
    return this.#spec && clone(this.#spec);
  }
  async saveDesiredSpec(spec: NodeSpec) {
    this.#spec = clone(spec);
  }
}
