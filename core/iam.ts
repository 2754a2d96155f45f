// IAM: who is calling (authenticate) and may they do this (authorize). The API envelope asks
// both before a handler's transaction opens, and never inside it.
import { and, eq, isNull } from "drizzle-orm";
import { createLocalJWKSet, createRemoteJWKSet, jwtVerify, type JSONWebKeySet, type JWTVerifyGetKey } from "jose";
import { ComputeError, invalidArgument, invalidConfig } from "./errors.ts";
import type { Store, Tx } from "./store/database.ts";
import { apiKeys } from "./store/schema.ts";
import { base64url, constantTimeEqual, hex, sha256Hex } from "./encoding.ts";

export interface Principal {
  /** "apikey:<id>", "jwt:<sub>" or "system:<name>"; recorded as the actor of audit rows and events. */
  id: string;
  roles: string[];
  /** When the credential stops being valid (a JWT's exp), if it says: a console session signed in with it ends then too. */
  expiresAt?: string;
}

/** The IAM catalog as the registry resolved it from every module. */
export interface ResolvedCatalog {
  actions: ReadonlyMap<string, { module: string; description: string; readOnly: boolean }>;
  roles: Readonly<Record<string, readonly string[]>>;
}

export interface IamPort {
  /** Returns null when the request carries no credentials; throws UNAUTHENTICATED for bad ones. */
  authenticate(request: Request, store: Store): Promise<Principal | null>;
  authorize(principal: Principal, action: string, resource: string): boolean | Promise<boolean>;
  /** Roles a key may be given. */
  roles(): string[];
}

/** The `iam` option: built once the registry knows the catalog. */
export type IamProvider = (catalog: ResolvedCatalog) => IamPort;

export interface BuiltinIamOptions {
  /** Extra roles: name → action patterns ("*", "widgets.*", "widgets.get"). */
  roles?: Record<string, string[]>;
  /** Bearer JWTs from an identity provider, verified with jose. */
  jwt?: {
    issuer?: string;
    audience?: string;
    /** A JWK set, or its URL. */
    jwks?: JSONWebKeySet | string;
    /** Claim holding the caller's roles; default "roles". */
    rolesClaim?: string;
  };
}

const KEY_PREFIX = "bck_";

/**
 * The built-in IAM: API keys (stored as SHA-256, shown once) with roles over the catalog,
 * and bearer JWTs. Two roles always exist: admin (every action) and viewer (every action
 * whose methods only read).
 */
export function builtinIam(options: BuiltinIamOptions = {}): IamProvider {
  return (catalog) => {
    const viewer = [...catalog.actions].filter(([, a]) => a.readOnly).map(([action]) => action);
    const roles: Record<string, readonly string[]> = { admin: ["*"], viewer, ...catalog.roles, ...options.roles };
    const jwtKey = options.jwt ? jwksKey(options.jwt.jwks) : undefined;

    return {
      roles: () => Object.keys(roles),
      async authenticate(request, store) {
        const header = request.headers.get("authorization");
        if (!header) return null;
        const match = /^Bearer\s+(\S+)$/i.exec(header);
        if (!match) throw unauthenticated("the Authorization header must be 'Bearer <credential>'");
        const credential = match[1]!;
        if (credential.startsWith(KEY_PREFIX)) return apiKeyPrincipal(store, credential);
        if (!jwtKey || !options.jwt) throw unauthenticated("the credential is not a valid API key");
        return jwtPrincipal(credential, jwtKey, options.jwt);
      },
      authorize(principal, action) {
        return principal.roles.some((role) => (roles[role] ?? []).some((pattern) => matches(pattern, action)));
      },
    };
  };
}

export function matches(pattern: string, action: string): boolean {
  if (pattern === "*") return true;
  if (pattern.endsWith(".*")) return action.startsWith(pattern.slice(0, -1));
  return pattern === action;
}

/** Mints an API key in the caller's transaction; the returned key is the only copy. */
export async function mintApiKey(
  tx: Tx,
  input: { name: string; roles: string[]; createdBy: string },
  knownRoles: string[],
): Promise<{ id: string; key: string }> {
  const unknown = input.roles.filter((r) => !knownRoles.includes(r));
  if (unknown.length > 0) throw invalidArgument(`unknown role(s): ${unknown.join(", ")}`, { unknownRoles: unknown, knownRoles });
  const id = hex(crypto.getRandomValues(new Uint8Array(8)));
  const secret = base64url(crypto.getRandomValues(new Uint8Array(32)));
  await tx
    .insert(apiKeys)
    .values({ id, name: input.name, roles: input.roles, createdBy: input.createdBy, secretSha256: await sha256Hex(secret) });
  return { id, key: `${KEY_PREFIX}${id}_${secret}` };
}

async function apiKeyPrincipal(store: Store, credential: string): Promise<Principal> {
  const [, id, secret] = /^bck_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/.exec(credential) ?? [];
  if (!id || !secret) throw unauthenticated("the credential is not a valid API key");
  const [row] = await store.db
    .select({ secretSha256: apiKeys.secretSha256, roles: apiKeys.roles })
    .from(apiKeys)
    .where(and(eq(apiKeys.id, id), isNull(apiKeys.revokedAt)));
  // Compare digests in constant time, and do the work even for an unknown id.
  const presented = await sha256Hex(secret);
  if (!constantTimeEqual(presented, row?.secretSha256 ?? "0".repeat(64)) || !row) {
    throw unauthenticated("the API key is unknown or revoked");
  }
  return { id: `apikey:${id}`, roles: row.roles };
}

async function jwtPrincipal(token: string, key: JWTVerifyGetKey, jwt: NonNullable<BuiltinIamOptions["jwt"]>): Promise<Principal> {
  try {
    const { payload } = await jwtVerify(token, key, { issuer: jwt.issuer, audience: jwt.audience });
    const claim = payload[jwt.rolesClaim ?? "roles"];
    const roles = Array.isArray(claim) ? claim.filter((r): r is string => typeof r === "string") : [];
    if (!payload.sub) throw new Error("no subject");
    return { id: `jwt:${payload.sub}`, roles, ...(payload.exp ? { expiresAt: new Date(payload.exp * 1000).toISOString() } : {}) };
  } catch {
    // jose's reason may describe the token; say only that it did not verify.
    throw unauthenticated("the bearer token did not verify");
  }
}

function jwksKey(jwks: JSONWebKeySet | string | undefined): JWTVerifyGetKey {
  if (typeof jwks === "string") return createRemoteJWKSet(new URL(jwks));
  if (jwks) return createLocalJWKSet(jwks);
  throw invalidConfig("iam.jwt needs jwks (a JWK set or its URL)");
}

const unauthenticated = (message: string) => new ComputeError("UNAUTHENTICATED", message);
