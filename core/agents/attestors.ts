// Built-in attestors. `join-token`: a single-use token an operator minted (siteTokens.create,
// joinTokens.create). `provisioned`: a single-use token a deploy minted for the OS it installs,
// which joins as that machine's node, optionally only from the expected hardware. `discovery`:
// a ramdisk joins on its site agent's signed word that it booted on that site's network.
import { sql } from "drizzle-orm";
import { defineAttestor, type AgentRole, type AttestationResult } from "../contracts.ts";
import type { ModuleContext } from "../context.ts";
import { sha256Hex } from "../encoding.ts";
import { ComputeError } from "../errors.ts";
import { discoveryAssertion, discoveryMessage, verifyMessage } from "../protocol.ts";
import { one } from "../store/database.ts";

const TOKEN = /^bcj_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/;

const refuse = (message: string) => new ComputeError("PERMISSION_DENIED", message);

/**
 * Consumes a token in its own committed transaction, whatever the outcome: a token is used up
 * by its first presentation, valid or expired. Returns its row when it was live.
 */
async function consumeToken(ctx: ModuleContext, attestor: string, evidence: Record<string, unknown>, consumer: string) {
  const match = typeof evidence.token === "string" ? TOKEN.exec(evidence.token) : null;
  if (!match) throw refuse("the evidence holds no well-formed join token");
  const [, id, secret] = match;
  const digest = await sha256Hex(secret!);
  // The digest is in the WHERE clause: a wrong secret for a known id leaves the token unused.
  const consumed = await ctx.store.transaction(async (tx) => {
    return one<{ role: AgentRole; labels: Record<string, string>; node_id: string | null; expect: Record<string, string>; live: boolean }>(
      tx,
      sql`
      UPDATE bc_join_tokens SET consumed_at = compute_now(), consumed_by = ${consumer}
      WHERE id = ${id!} AND secret_sha256 = ${digest} AND attestor = ${attestor} AND consumed_at IS NULL
      RETURNING role, labels, node_id, expect, expires_at > compute_now() AS live`,
    );
  });
  if (!consumed) throw refuse("the join token is unknown or was already used");
  if (!consumed.live) throw refuse("the join token expired (it is now used up; mint a new one)");
  return consumed;
}

export const joinTokenAttestor = defineAttestor({
  id: "join-token",
  async verify(ctx, evidence, request): Promise<AttestationResult> {
    const token = await consumeToken(ctx, "join-token", evidence, request.publicKey);
    if (token.role !== request.role) throw refuse(`the join token is for role ${token.role}, not ${request.role}`);
    return { role: token.role, labels: token.labels, ...(token.node_id ? { nodeId: token.node_id } : {}) };
  },
});

export const provisionedAttestor = defineAttestor({
  id: "provisioned",
  async verify(ctx, evidence, request): Promise<AttestationResult> {
    const token = await consumeToken(ctx, "provisioned", evidence, request.publicKey);
    if (!token.node_id) throw refuse("the provisioned token names no node");
    if (token.role !== request.role) throw refuse(`the provisioned token is for role ${token.role}, not ${request.role}`);
    for (const [field, expected] of Object.entries(token.expect)) {
      if (evidence[field] !== expected) throw refuse(`the joining machine's ${field} is not the one the token was minted for`);
    }
    return { nodeId: token.node_id, role: token.role, labels: token.labels };
  },
});

/** How old a site agent's discovery assertion may be, on database time. */
const DISCOVERY_MAX_AGE_SECONDS = 300;

export const discoveryAttestor = defineAttestor({
  id: "discovery",
  async verify(ctx, evidence, request): Promise<AttestationResult> {
    if (request.role !== "ramdisk") throw refuse("discovery joins ramdisk agents only");
    const siteNodeId = typeof evidence.siteNodeId === "string" ? evidence.siteNodeId : "";
    const assertion = discoveryAssertion.safeParse(evidence.assertion);
    if (!siteNodeId || !assertion.success || typeof evidence.signature !== "string") {
      throw refuse("discovery evidence is { siteNodeId, assertion: { publicKey, issuedAt, ... }, signature }");
    }
    if (assertion.data.publicKey !== request.publicKey) throw refuse("the site's assertion names another key");
    const site = await one<{ public_key: string; labels: Record<string, string>; now: number }>(
      ctx.store.db,
      sql`
      SELECT public_key, labels, extract(epoch FROM compute_now())::float8 AS now
      FROM bc_nodes WHERE id = ${siteNodeId} AND role = 'site' AND revoked_at IS NULL`,
    );
    if (!site) throw refuse("the vouching site agent is unknown or revoked");
    if (!(await verifyMessage(site.public_key, discoveryMessage(siteNodeId, assertion.data), evidence.signature))) {
      throw refuse("the discovery assertion is not signed by the site agent's key");
    }
    const age = site.now - Date.parse(assertion.data.issuedAt) / 1000;
    if (!(age >= -60 && age <= DISCOVERY_MAX_AGE_SECONDS)) throw refuse("the discovery assertion is stale");
    const labels: Record<string, string> = { "bc.dev/discovered-by": siteNodeId };
    if (site.labels["bc.dev/site"]) labels["bc.dev/site"] = site.labels["bc.dev/site"];
    if (assertion.data.productUuid) labels["bc.dev/product-uuid"] = assertion.data.productUuid.toLowerCase(); // SMBIOS UUIDs compare case-insensitively
    return { role: "ramdisk", labels };
  },
});

export const builtinAttestors = [joinTokenAttestor, provisionedAttestor, discoveryAttestor];
