// Join tokens: single use, short-lived, stored only as a digest. The token itself is returned
// once to whoever minted it and never written to a command, an event or a log.
import { sql } from "drizzle-orm";
import type { AgentRole } from "../contracts.ts";
import { base64url, hex, sha256Hex } from "../encoding.ts";
import { invalidArgument } from "../errors.ts";
import { one, type Tx } from "../store/database.ts";

export const DEFAULT_TOKEN_TTL_SECONDS = 600;
export const MAX_TOKEN_TTL_SECONDS = 7 * 24 * 3600;

export interface MintTokenInput {
  attestor: "join-token" | "provisioned";
  role: AgentRole;
  createdBy: string;
  ttlSeconds?: number;
  labels?: Record<string, string>;
  /** The node the token joins as (provisioned tokens always name one). */
  nodeId?: string;
  /** Evidence fields the joining machine must present with these exact values. */
  expect?: Record<string, string>;
}

export async function mintJoinToken(tx: Tx, input: MintTokenInput): Promise<{ id: string; token: string; expiresAt: string }> {
  const ttl = input.ttlSeconds ?? DEFAULT_TOKEN_TTL_SECONDS;
  if (!Number.isInteger(ttl) || ttl < 1 || ttl > MAX_TOKEN_TTL_SECONDS) {
    throw invalidArgument(`ttlSeconds must be a whole number from 1 to ${MAX_TOKEN_TTL_SECONDS}`, { ttlSeconds: ttl });
  }
  const id = hex(crypto.getRandomValues(new Uint8Array(8)));
  const secret = base64url(crypto.getRandomValues(new Uint8Array(32)));
  const row = await one<{ expires_at: string }>(
    tx,
    sql`
    INSERT INTO bc_join_tokens (id, attestor, role, secret_sha256, labels, node_id, expect, created_by, expires_at)
    VALUES (${id}, ${input.attestor}, ${input.role}, ${await sha256Hex(secret)}, ${JSON.stringify(input.labels ?? {})}::jsonb,
            ${input.nodeId ?? null}, ${JSON.stringify(input.expect ?? {})}::jsonb, ${input.createdBy},
            compute_now() + make_interval(secs => ${ttl}))
    RETURNING expires_at`,
  );
  const expiresAt = new Date(row!.expires_at).toISOString();
  return { id, token: `bcj_${id}_${secret}`, expiresAt };
}
