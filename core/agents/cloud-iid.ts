// cloud-iid: a cloud instance's identity document, signed by its provider, vouches for the machine.
// The format built is GCP's instance identity token: an RS256 JWT from the metadata server
// (.../service-accounts/default/identity?audience=...&format=full), verified with jose against
// the JWKS the attestor is configured with (Google's, https://www.googleapis.com/oauth2/v3/certs).
// bcd asks for it with an audience that binds it to this join: the configured audience, then
// `#bc-join/v1/<join key>/<nonce>`. So a leaked token is useless to any other key, and a
// (instance id, nonce) is accepted once (bc_attestation_replay) while the token lives.
import { sql } from "drizzle-orm";
import { createLocalJWKSet, createRemoteJWKSet, errors, jwtVerify, type JSONWebKeySet, type JWTPayload } from "jose";
import { defineAttestor, type AgentRole, type AttestationResult, type AttestorDefinition } from "../contracts.ts";
import { ComputeError, invalidConfig } from "../errors.ts";
import { databaseSeconds } from "./credentials.ts";

export const GCP_ISSUER = "https://accounts.google.com";
/** The suffix bcd appends to the configured audience: the join key and a nonce. */
const BINDING = /^bc-join\/v1\/([A-Za-z0-9_-]{43})\/([A-Za-z0-9_-]{16,128})$/;

/** The audience bcd asks the metadata server for. */
export const cloudIidAudience = (audience: string, publicKey: string, nonce: string) => `${audience}#bc-join/v1/${publicKey}/${nonce}`;

export interface CloudIidOptions {
  gcp?: {
    /** Google's signing keys: a JWKS, or the https URL to fetch it from (cached, refreshed when a kid is unknown). */
    jwks: JSONWebKeySet | string;
    /** The audience instances ask for: usually the control plane's URL (bcd's default). */
    audience: string;
    /** Only instances of these projects (project id); default any. */
    projects?: string[];
  };
  /** The roles it vouches for; default ["node"]. */
  roles?: AgentRole[];
  /** Default "cloud-iid". */
  id?: string;
}

/** The evidence bcd sends. */
export interface CloudIidEvidence {
  provider: "gcp";
  token: string;
}

interface GcpClaims extends JWTPayload {
  google?: {
    compute_engine?: { instance_id?: unknown; instance_name?: unknown; project_id?: unknown; zone?: unknown };
  };
}

const refuse = (message: string) => new ComputeError("PERMISSION_DENIED", message);

export function cloudIidAttestor(options: CloudIidOptions): AttestorDefinition {
  const id = options.id ?? "cloud-iid";
  const gcp = options.gcp;
  if (!gcp) throw invalidConfig(`${id}: configure at least one provider (gcp)`);
  if (typeof gcp.audience !== "string" || gcp.audience === "" || gcp.audience.includes("#")) {
    throw invalidConfig(`${id}: gcp.audience must be a non-empty string without '#' (e.g. the control plane's URL)`);
  }
  let keys: ReturnType<typeof createLocalJWKSet> | ReturnType<typeof createRemoteJWKSet>;
  try {
    if (typeof gcp.jwks === "string") {
      const url = new URL(gcp.jwks);
      if (url.protocol !== "https:") throw new Error("a JWKS URL must be https");
      keys = createRemoteJWKSet(url);
    } else keys = createLocalJWKSet(gcp.jwks);
  } catch (e) {
    throw invalidConfig(`${id}: gcp.jwks is not a JWKS or an https URL: ${(e as Error).message}`);
  }
  const roles = options.roles ?? ["node"];

  return defineAttestor({
    id,
    async verify(ctx, evidence, request): Promise<AttestationResult> {
      if (!roles.includes(request.role)) throw refuse(`${id} vouches for roles ${roles.join(", ")}, not ${request.role}`);
      const { provider, token } = evidence as Partial<CloudIidEvidence>;
      if (provider !== "gcp" || typeof token !== "string" || token.length > 8192) {
        throw refuse(`cloud-iid evidence is { provider: "gcp", token } (the metadata server's instance identity token)`);
      }
      const now = await databaseSeconds(ctx.store);
      let claims: GcpClaims;
      try {
        ({ payload: claims } = await jwtVerify<GcpClaims>(token, keys, {
          issuer: GCP_ISSUER,
          algorithms: ["RS256"],
          currentDate: new Date(now * 1000),
          requiredClaims: ["exp", "aud"],
        }));
      } catch (e) {
        throw refuse(`the instance identity token is refused: ${joseReason(e)}`);
      }

      const aud = Array.isArray(claims.aud) ? (claims.aud.length === 1 ? claims.aud[0] : undefined) : claims.aud;
      const prefix = `${gcp.audience}#`;
      const binding = aud?.startsWith(prefix) ? BINDING.exec(aud.slice(prefix.length)) : null;
      if (!binding) throw refuse(`the instance identity token is for another audience (expected ${prefix}bc-join/v1/<key>/<nonce>)`);
      const [, boundKey, nonce] = binding;
      if (boundKey !== request.publicKey) throw refuse("the instance identity token was issued for another join key");

      const instance = claims.google?.compute_engine;
      const instanceId = instance?.instance_id;
      if (typeof instanceId !== "string" || !instanceId)
        throw refuse("the token has no google.compute_engine.instance_id (ask for format=full)");
      const project = typeof instance?.project_id === "string" ? instance.project_id : "";
      if (gcp.projects && !gcp.projects.includes(project)) throw refuse(`instances of project ${project || "(none)"} may not join`);

      // Once per (instance, nonce); the row outlives the token, so a replay is refused for as long as it could verify.
      const fresh = await ctx.store.transaction(async (tx) => {
        await tx.execute(sql`DELETE FROM bc_attestation_replay WHERE expires_at < compute_now()`);
        const inserted = await tx.execute(sql`
          INSERT INTO bc_attestation_replay (attestor, instance_id, nonce, expires_at)
          VALUES (${id}, ${`gcp:${instanceId}`}, ${nonce!}, to_timestamp(${claims.exp!}))
          ON CONFLICT DO NOTHING RETURNING 1`);
        return inserted.rows.length === 1;
      });
      if (!fresh) throw refuse(`instance ${instanceId} already joined with this nonce: a replayed token`);

      const labels: Record<string, string> = { "bc.dev/cloud": "gcp", "bc.dev/gcp-instance-id": instanceId };
      if (project) labels["bc.dev/gcp-project"] = project;
      if (typeof instance?.zone === "string") labels["bc.dev/gcp-zone"] = instance.zone;
      if (typeof instance?.instance_name === "string") labels["bc.dev/gcp-instance-name"] = instance.instance_name;
      return { role: request.role, labels };
    },
  });
}

/** Why jose refused the token, in words that never quote it. */
function joseReason(e: unknown): string {
  if (e instanceof errors.JWTExpired) return "it expired";
  if (e instanceof errors.JWSSignatureVerificationFailed) return "its signature does not verify";
  if (e instanceof errors.JWKSNoMatchingKey) return "it is signed by a key not in the configured JWKS";
  if (e instanceof errors.JOSEAlgNotAllowed) return "it is not RS256";
  if (e instanceof errors.JWTClaimValidationFailed) return `its ${e.claim} claim is not valid (${e.reason})`;
  if (e instanceof errors.JWKSTimeout || e instanceof errors.JWKSInvalid) return "the configured JWKS could not be read";
  return "it is not a well-formed JWT";
}
