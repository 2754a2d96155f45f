// Node credentials: short-lived JWTs (EdDSA) signed by the control plane's key, bound to the
// agent's own Ed25519 key (claim `nk`). The signing key is made on first use and its private
// half is sealed in the secret store; verification reads only the public half.
import { sql } from "drizzle-orm";
import { decodeProtectedHeader, importJWK, jwtVerify, SignJWT, type JWK } from "jose";
import type { SecretRef, SecretStore } from "../context.ts";
import { ComputeError } from "../errors.ts";
import type { AgentRole } from "../contracts.ts";
import { one, type Store } from "../store/database.ts";

const ISSUER = "better-compute";
const AUDIENCE = "bc-agent";
export const CREDENTIAL_TTL_SECONDS = 3600;

export interface NodeIdentity {
  nodeId: string;
  role: AgentRole;
  /** The node's Ed25519 public key (raw, base64url). */
  publicKey: string;
}

interface SigningKey {
  kid: string;
  privateKey: CryptoKey;
}

async function activeSigningKey(store: Store, secrets: SecretStore): Promise<SigningKey> {
  for (let attempt = 0; attempt < 2; attempt++) {
    const row = await one<{ kid: string; private_ref: SecretRef }>(
      store.db,
      sql`SELECT kid, private_ref FROM bc_signing_keys WHERE retired_at IS NULL`,
    );
    if (row) {
      const jwk = JSON.parse(await secrets.resolve(row.private_ref)) as JWK;
      return { kid: row.kid, privateKey: (await importJWK(jwk, "EdDSA")) as CryptoKey };
    }
    // First use: make the key. Two isolates may race; the one-active index lets one win.
    const pair = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
    const kid = crypto.randomUUID();
    const publicJwk = { ...((await crypto.subtle.exportKey("jwk", pair.publicKey)) as JsonWebKey), kid, alg: "EdDSA" };
    const privateJwk = (await crypto.subtle.exportKey("jwk", pair.privateKey)) as JsonWebKey;
    await store.transaction(async (tx) => {
      const ref = await secrets.put(tx, { module: "core", name: `signing-key/${kid}`, value: JSON.stringify(privateJwk) });
      await tx.execute(sql`
        INSERT INTO bc_signing_keys (kid, public_jwk, private_ref) VALUES (${kid}, ${JSON.stringify(publicJwk)}::jsonb, ${ref})
        ON CONFLICT DO NOTHING`);
    });
  }
  throw new ComputeError("UNAVAILABLE", "could not establish the credential signing key");
}

export async function issueCredential(
  store: Store,
  secrets: SecretStore,
  node: NodeIdentity,
): Promise<{ credential: string; expiresAt: string }> {
  const key = await activeSigningKey(store, secrets);
  const now = await databaseSeconds(store);
  const exp = now + CREDENTIAL_TTL_SECONDS;
  const credential = await new SignJWT({ role: node.role, nk: node.publicKey })
    .setProtectedHeader({ alg: "EdDSA", kid: key.kid })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject(node.nodeId)
    .setJti(crypto.randomUUID())
    .setIssuedAt(now)
    .setExpirationTime(exp)
    .sign(key.privateKey);
  return { credential, expiresAt: new Date(exp * 1000).toISOString() };
}

/**
 * Verifies a node credential against the signing keys, database time, and the node's record:
 * the node must exist, not be revoked, and still hold the key the credential is bound to.
 */
export async function verifyCredential(store: Store, credential: string): Promise<NodeIdentity> {
  const refuse = (message: string) => new ComputeError("UNAUTHENTICATED", message);
  let kid: string | undefined;
  try {
    kid = decodeProtectedHeader(credential).kid;
  } catch {
    throw refuse("the credential is not a JWT");
  }
  if (!kid) throw refuse("the credential names no signing key");
  const row = await one<{ public_jwk: JWK; now: number }>(
    store.db,
    sql`
    SELECT public_jwk, extract(epoch FROM compute_now())::float8 AS now FROM bc_signing_keys WHERE kid = ${kid}`,
  );
  if (!row) throw refuse("the credential was signed by an unknown key");
  let claims: { sub?: string; role?: unknown; nk?: unknown };
  try {
    const publicKey = await importJWK(row.public_jwk, "EdDSA");
    ({ payload: claims } = await jwtVerify(credential, publicKey, {
      issuer: ISSUER,
      audience: AUDIENCE,
      currentDate: new Date(row.now * 1000),
    }));
  } catch {
    throw refuse("the credential did not verify (expired or forged)");
  }
  const record = await one<{ role: AgentRole; public_key: string; revoked_at: string | null }>(
    store.db,
    sql`SELECT role, public_key, revoked_at FROM bc_nodes WHERE id = ${claims.sub ?? ""}`,
  );
  if (!record || record.public_key !== claims.nk) throw refuse("the credential does not match a joined node");
  if (record.revoked_at) throw new ComputeError("PERMISSION_DENIED", "the node's credentials were revoked");
  return { nodeId: claims.sub!, role: record.role, publicKey: record.public_key };
}

export async function databaseSeconds(store: Store): Promise<number> {
  return Math.floor((await one<{ now: number }>(store.db, sql`SELECT extract(epoch FROM compute_now())::float8 AS now`))!.now);
}
