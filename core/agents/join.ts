// JoinService and the agent gateway: the HTTPS routes an agent uses before and to open its
// WebSocket. Join: the agent proves its key (it signs the request) and an attestor vouches for
// the machine; it gets a node id and a short-lived credential bound to that key. Connect: the
// credential is checked here, the socket goes to the node's own NodeDO, which asks for proof
// of possession of the key before anything else. The API Worker serves both; the join Worker
// (workers/join) serves JoinService alone, since the gateway needs the NodeDO binding.
import { sql } from "drizzle-orm";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { Bindings } from "../bindings.ts";
import type { AttestorDefinition } from "../contracts.ts";
import type { BlobStore, PlatformContext } from "../context.ts";
import { hex } from "../encoding.ts";
import { ComputeError, invalidArgument, notFound } from "../errors.ts";
import {
  CHALLENGE_PATH,
  challengeRequest,
  BLOBS_PATH,
  CONNECT_PATH,
  JOIN_PATH,
  joinMessage,
  joinRequest,
  RENEW_PATH,
  renewMessage,
  renewRequest,
  verifyMessage,
  type ChallengeResponse,
  type JoinResponse,
} from "../protocol.ts";
import type { Registry } from "../registry.ts";
import { one, type Store } from "../store/database.ts";
import { SHA256_HEX } from "../store/blobs.ts";
import { readInput, type AppEnv } from "../http.ts";
import { databaseSeconds, issueCredential, verifyCredential } from "./credentials.ts";
import { nodeNamespace } from "./notify.ts";

const MAX_JOIN_BODY_BYTES = 16 * 1024;
const RENEW_CLOCK_SKEW_SECONDS = 300;
/** How long an agent has to answer an attestor's challenge. */
const CHALLENGE_TTL_SECONDS = 300;

export interface JoinDeps {
  registry: Registry;
  /** The agents module's context: attestors verify with it, and its secret store keeps the credential signing key. */
  agentsContext: (env: Bindings, store: Store) => PlatformContext;
}

/** JoinService: join (with its challenge, for challenge-response attestors) and renew. */
export function joinRoutes(deps: JoinDeps): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  const limit = bodyLimit({
    maxSize: MAX_JOIN_BODY_BYTES,
    onError: () => {
      throw new ComputeError("PAYLOAD_TOO_LARGE", `join requests are limited to ${MAX_JOIN_BODY_BYTES} bytes`);
    },
  });

  app.post(JOIN_PATH, limit, async (c) => {
    const request = await readInput(c, joinRequest);
    if (
      !(await verifyMessage(request.publicKey, await joinMessage(request.publicKey, request.attestor, request.evidence), request.signature))
    ) {
      throw new ComputeError("UNAUTHENTICATED", "the join request's signature does not verify with its public key");
    }
    const attestor = findAttestor(deps.registry, request.attestor);
    const ctx = deps.agentsContext(c.env ?? {}, c.get("store"));
    const challenge = attestor.challenge
      ? await consumeChallenge(c.get("store"), attestor.id, request.publicKey, request.evidence)
      : undefined;
    const attested = await attestor.verify(ctx, request.evidence, {
      role: request.role,
      publicKey: request.publicKey,
      hostname: request.hostname,
      ...(challenge ? { challenge } : {}),
    });
    if (attested.role !== request.role)
      throw new ComputeError("PERMISSION_DENIED", `the attestor vouched for role ${attested.role}, not ${request.role}`);

    const nodeId = attested.nodeId ?? `n-${hex(crypto.getRandomValues(new Uint8Array(8)))}`;
    await c.get("store").transaction(async (tx) => {
      const upserted = await tx.execute(sql`
        INSERT INTO bc_nodes (id, role, public_key, hostname, labels, attestor)
        VALUES (${nodeId}, ${request.role}, ${request.publicKey}, ${request.hostname ?? null},
                ${JSON.stringify(attested.labels ?? {})}::jsonb, ${attestor.id})
        ON CONFLICT (id) DO UPDATE
          SET role = excluded.role, public_key = excluded.public_key, hostname = excluded.hostname,
              labels = bc_nodes.labels || excluded.labels, attestor = excluded.attestor, joined_at = compute_now()
          WHERE bc_nodes.revoked_at IS NULL
        RETURNING id`);
      if (upserted.rows.length === 0) throw new ComputeError("PERMISSION_DENIED", `node ${nodeId} was revoked`);
      await ctx.events.publish(tx, {
        type: "node.joined",
        subject: `nodes/${nodeId}`,
        data: { role: request.role, attestor: attestor.id, hostname: request.hostname ?? null },
      });
    });
    const issued = await issueCredential(c.get("store"), ctx.secrets, { nodeId, role: request.role, publicKey: request.publicKey });
    return c.json({ nodeId, role: request.role, ...issued } satisfies JoinResponse);
  });

  app.post(CHALLENGE_PATH, limit, async (c) => {
    const request = await readInput(c, challengeRequest);
    const attestor = findAttestor(deps.registry, request.attestor);
    if (!attestor.challenge) throw new ComputeError("FAILED_PRECONDITION", `attestor ${attestor.id} takes no challenge: join directly`);
    const ctx = deps.agentsContext(c.env ?? {}, c.get("store"));
    const issued = await attestor.challenge(ctx, request.evidence, {
      role: request.role,
      publicKey: request.publicKey,
      hostname: request.hostname,
    });
    const challengeId = `ch-${hex(crypto.getRandomValues(new Uint8Array(16)))}`;
    const expiresAt = await c.get("store").transaction(async (tx) => {
      await tx.execute(sql`DELETE FROM bc_attestation_challenges WHERE expires_at < compute_now() - interval '1 day'`);
      const inserted = await one<{ expires_at: string }>(
        tx,
        sql`
        INSERT INTO bc_attestation_challenges (id, attestor, public_key, state, expires_at)
        VALUES (${challengeId}, ${attestor.id}, ${request.publicKey}, ${JSON.stringify(issued.state)}::jsonb,
                compute_now() + make_interval(secs => ${CHALLENGE_TTL_SECONDS}))
        RETURNING expires_at`,
      );
      return new Date(inserted!.expires_at).toISOString();
    });
    return c.json({ challengeId, expiresAt, challenge: issued.challenge } satisfies ChallengeResponse);
  });

  app.post(RENEW_PATH, limit, async (c) => {
    const node = await verifyCredential(c.get("store"), bearer(c.req.raw));
    const request = await readInput(c, renewRequest);
    const now = await databaseSeconds(c.get("store"));
    const at = Date.parse(request.timestamp) / 1000;
    if (!Number.isFinite(at) || Math.abs(now - at) > RENEW_CLOCK_SKEW_SECONDS) {
      throw invalidArgument(`the renewal timestamp is more than ${RENEW_CLOCK_SKEW_SECONDS} s from the control plane's time`);
    }
    if (!(await verifyMessage(node.publicKey, renewMessage(node.nodeId, request.timestamp), request.signature))) {
      throw new ComputeError("UNAUTHENTICATED", "the renewal is not signed by the node's key");
    }
    // Single use: a renewal's timestamp must be later than the last one accepted for the node, so
    // a captured request replayed within the clock skew is refused (the agent signs a new one).
    const spent = await c.get("store").write(sql`
      UPDATE bc_nodes SET renewed_through = ${request.timestamp}::timestamptz
      WHERE id = ${node.nodeId} AND (renewed_through IS NULL OR renewed_through < ${request.timestamp}::timestamptz)
      RETURNING id`);
    if (spent.rows.length === 0) throw new ComputeError("UNAUTHENTICATED", "this renewal was already used: sign a new timestamp");
    const ctx = deps.agentsContext(c.env ?? {}, c.get("store"));
    const issued = await issueCredential(c.get("store"), ctx.secrets, node);
    return c.json({ nodeId: node.nodeId, role: node.role, ...issued } satisfies JoinResponse);
  });

  return app;
}

/** The agent gateway: a node's WebSocket, handed to its NodeDO; and the blobs a site agent fetches by digest. */
export function gatewayRoutes(deps: { blobs: (env: Bindings) => BlobStore }): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  // A rendered ISO or config drive, for a site agent's image cache (metal.images.cache { blob }):
  // named by its sha256, which the agent checks again as it stores it.
  app.get(`${BLOBS_PATH}/:sha256`, async (c) => {
    const node = await verifyCredential(c.get("store"), bearer(c.req.raw));
    if (node.role !== "site") throw new ComputeError("PERMISSION_DENIED", `blobs are for site agents; this node's role is ${node.role}`);
    const sha256 = c.req.param("sha256");
    if (!SHA256_HEX.test(sha256)) throw invalidArgument("a blob is named by its sha256: 64 lowercase hex digits");
    const blob = await deps.blobs(c.env ?? {}).get(sha256);
    if (!blob) throw notFound(`no blob ${sha256}`);
    return new Response(blob.body, {
      headers: { "content-type": "application/octet-stream", "content-length": String(blob.bytes), "cache-control": "no-store" },
    });
  });
  app.get(CONNECT_PATH, async (c) => {
    if (c.req.header("upgrade")?.toLowerCase() !== "websocket") {
      throw new ComputeError("FAILED_PRECONDITION", "the agent gateway speaks WebSocket only (send Upgrade: websocket)");
    }
    const node = await verifyCredential(c.get("store"), bearer(c.req.raw));
    const ns = nodeNamespace(c.env ?? {});
    if (!ns) throw new ComputeError("UNAVAILABLE", "this deployment has no NodeDO binding (NODE)");
    const headers = new Headers({
      upgrade: "websocket",
      "x-bc-node-id": node.nodeId,
      "x-bc-node-key": node.publicKey,
      "x-bc-node-role": node.role,
    });
    return ns.get(ns.idFromName(node.nodeId)).fetch("https://node.internal/connect", { headers });
  });

  return app;
}

function findAttestor(registry: Registry, id: string): AttestorDefinition {
  const candidates = registry.byContract<AttestorDefinition>("attestor").filter((a) => a.id === id);
  // Several versions may be registered: the newest verifies.
  const attestor = candidates.sort((a, b) => b.version.localeCompare(a.version, undefined, { numeric: true }))[0];
  if (!attestor)
    throw invalidArgument(`no attestor ${id} is registered`, {
      attestor: id,
      registered: registry.byContract("attestor").map((a) => a.id),
    });
  return attestor;
}

/**
 * Consumes the challenge the evidence names, in its own committed transaction whatever the
 * outcome (like a join token: its first presentation uses it up). Returns the attestor's state.
 */
async function consumeChallenge(store: Store, attestor: string, publicKey: string, evidence: Record<string, unknown>) {
  const id = evidence.challengeId;
  if (typeof id !== "string")
    throw new ComputeError("PERMISSION_DENIED", `attestor ${attestor} wants evidence.challengeId: ask ${CHALLENGE_PATH} first`);
  const consumed = await store.transaction(async (tx) => {
    return one<{ state: Record<string, unknown>; live: boolean }>(
      tx,
      sql`
      UPDATE bc_attestation_challenges SET consumed_at = compute_now()
      WHERE id = ${id} AND attestor = ${attestor} AND public_key = ${publicKey} AND consumed_at IS NULL
      RETURNING state, expires_at > compute_now() AS live`,
    );
  });
  if (!consumed) throw new ComputeError("PERMISSION_DENIED", "the challenge is unknown, already answered, or was issued to another key");
  if (!consumed.live) throw new ComputeError("PERMISSION_DENIED", "the challenge expired (ask for a new one)");
  return consumed.state;
}

function bearer(request: Request): string {
  const match = /^Bearer\s+(\S+)$/i.exec(request.headers.get("authorization") ?? "");
  if (!match) throw new ComputeError("UNAUTHENTICATED", "a node credential is required: send 'Authorization: Bearer <credential>'");
  return match[1]!;
}
