// What an evidence producer is: bcd builds a join's evidence with one (agent/attestation/index.ts
// is the table of them, by attestor id).
import type { Role } from "../state.ts";

export interface ProducerContext {
  /** The bcd command ("join" or "start"), for messages. */
  command: string;
  /** The control plane's URL. */
  url: string;
  role: Role;
  /**
   * The node's Ed25519 public key (raw, base64url), made and saved on first call: evidence that
   * can be bound to the join should be (a captured proof is then useless to another key).
   */
  publicKey(): Promise<string>;
  /** bcd's parsed flags (each producer reads those it declares). */
  flags: Record<string, string | boolean | string[] | undefined>;
  env: NodeJS.ProcessEnv;
  fetch: typeof fetch;
}

export interface EvidenceProducer {
  /** The flags it reads, as node:util parseArgs declares them (producers may share one). */
  flags: Record<string, { type: "string" | "boolean" }>;
  /** Its lines of bcd's usage. */
  usage: string;
  produce(ctx: ProducerContext): Promise<Record<string, unknown>>;
}

export class ProducerUsageError extends Error {}

/** A flag's string value, or undefined. */
export const flag = (ctx: ProducerContext, name: string): string | undefined =>
  typeof ctx.flags[name] === "string" ? (ctx.flags[name] as string) : undefined;
