// The node's credentials: its key (made once, kept in the state store, never exported again),
// the join that proves possession of it, and the short-lived credential, renewed before it
// expires on this agent's clock and retried with backoff when renewal fails.
import { z } from "zod";
import { unbase64url } from "../core/encoding.ts";
import {
  JOIN_PATH,
  RENEW_PATH,
  generateNodeKey,
  importNodeKey,
  joinMessage,
  joinResponse,
  renewMessage,
  signMessage,
  type JoinRequest,
  type NodeKeyPair,
} from "../core/protocol.ts";
import { jitterBackoff, timerDelay, type BackoffOptions } from "./backoff.ts";
import { AgentError, asAgentError, errorFromResponse, type AgentTransport } from "./contracts.ts";
import type { Plumbing } from "./events.ts";
import type { AgentIdentity, AgentStateStore, Role } from "./state.ts";

export interface CredentialsOptions {
  /** The control plane (http: or https:); join() records it in the identity for run(). */
  baseUrl?: string;
  /** Renew when this fraction of the credential's lifetime has passed. Default 2/3. */
  renewAt?: number;
  backoff?: BackoffOptions;
}

interface CredentialsDeps extends Plumbing {
  transport: AgentTransport;
  state: AgentStateStore;
  stopping: () => boolean;
  /** Stop the agent for good (REVOKED, CREDENTIAL_EXPIRED). */
  fail: (error: AgentError) => void;
}

/** What a renewal answers: the new credential (the join response's shape is accepted too). */
const renewResponse = z.object({ credential: z.string(), expiresAt: z.string(), nodeId: z.string().optional() });

/** What a join sends: the attestor's evidence (a join token...) is sent once, never stored or logged. */
export interface JoinOptions {
  /** The control plane's URL; default the client's baseUrl. */
  baseUrl?: string;
  attestor: string;
  evidence: Record<string, unknown>;
  role: Role;
  hostname?: string;
}

export class Credentials {
  readonly #opts: CredentialsOptions;
  readonly #deps: CredentialsDeps;
  #key: NodeKeyPair | undefined;
  #identity: AgentIdentity | undefined;
  #renewTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(opts: CredentialsOptions, deps: CredentialsDeps) {
    this.#opts = opts;
    this.#deps = deps;
  }

  get identity(): AgentIdentity | undefined {
    return this.#identity;
  }

  /** The node's public key (raw, base64url), creating and saving the key pair if there is none. */
  async publicKey(): Promise<string> {
    return (await this.#loadOrCreateKey()).publicKey;
  }

  /** See AgentClient.join. */
  async join(opts: JoinOptions): Promise<AgentIdentity> {
    const baseUrl = opts.baseUrl ?? this.#opts.baseUrl;
    if (!baseUrl) throw new AgentError("INVALID_ARGUMENT", "join needs the control plane URL");
    const key = await this.#loadOrCreateKey();
    const request: JoinRequest = {
      attestor: opts.attestor,
      evidence: opts.evidence,
      publicKey: key.publicKey,
      role: opts.role,
      ...(opts.hostname !== undefined ? { hostname: opts.hostname } : {}),
      signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, opts.attestor, opts.evidence)),
    };
    const res = await this.#post(trimBase(baseUrl) + JOIN_PATH, request, "join");
    if (!res.ok) throw await errorFromResponse(res, "join");
    const parsed = joinResponse.safeParse(await res.json().catch(() => undefined));
    if (!parsed.success) throw new AgentError("BAD_RESPONSE", "the join response is not a join response");
    if (parsed.data.role !== opts.role) throw new AgentError("BAD_RESPONSE", `joined as ${parsed.data.role}, asked for ${opts.role}`);
    const identity: AgentIdentity = { ...parsed.data, obtainedAt: new Date(this.#deps.now()).toISOString(), baseUrl: trimBase(baseUrl) };
    await this.#deps.state.saveIdentity(identity);
    this.#identity = identity;
    this.#deps.log.info("joined", { nodeId: identity.nodeId, role: identity.role, expiresAt: identity.expiresAt, attestor: opts.attestor });
    return identity;
  }

  /** See AgentClient.renew. */
  async renew(): Promise<AgentIdentity> {
    const { state, log, counters, emit } = this.#deps;
    const identity = this.#identity ?? (await state.loadIdentity());
    if (!identity) throw new AgentError("NOT_JOINED", "the agent has not joined");
    const key = await this.#requireKey();
    const baseUrl = this.baseUrl(identity);
    const timestamp = new Date(this.#deps.now()).toISOString();
    const body = { timestamp, signature: await signMessage(key.privateKey, renewMessage(identity.nodeId, timestamp)) };
    const res = await this.#post(baseUrl + RENEW_PATH, body, "renew", identity.credential);
    if (!res.ok) throw await errorFromResponse(res, "renew");
    const parsed = renewResponse.safeParse(await res.json().catch(() => undefined));
    if (!parsed.success) throw new AgentError("BAD_RESPONSE", "the renew response has no credential");
    if (parsed.data.nodeId !== undefined && parsed.data.nodeId !== identity.nodeId)
      throw new AgentError("BAD_RESPONSE", "the renewed credential is for another node");
    const renewed: AgentIdentity = {
      ...identity,
      credential: parsed.data.credential,
      expiresAt: parsed.data.expiresAt,
      obtainedAt: new Date(this.#deps.now()).toISOString(),
    };
    await state.saveIdentity(renewed);
    this.#identity = renewed;
    counters.renewals++;
    log.info("credential renewed", { nodeId: renewed.nodeId, expiresAt: renewed.expiresAt });
    emit("renewed", { expiresAt: renewed.expiresAt });
    return renewed;
  }

  /** The saved identity and key, which run() needs: NOT_JOINED without them. */
  async load(): Promise<AgentIdentity> {
    const identity = await this.#deps.state.loadIdentity();
    if (!identity) throw new AgentError("NOT_JOINED", "the agent has not joined: no identity in its state");
    this.#identity = identity;
    await this.#requireKey();
    return identity;
  }

  /** message signed with the node key (base64url). */
  async sign(message: string): Promise<string> {
    return signMessage((await this.#requireKey()).privateKey, message);
  }

  /** The control plane URL: the baseUrl option, else the one the identity was joined at. */
  baseUrl(identity: AgentIdentity): string {
    const base = this.#opts.baseUrl ?? identity.baseUrl;
    if (!base) throw new AgentError("INVALID_ARGUMENT", "no control plane URL: pass baseUrl or join first");
    return trimBase(base);
  }

  /** Renew at renewAt of the credential's lifetime (or after retryMs, retrying a failed renewal). */
  scheduleRenewal(attempt = 0, retryMs?: number): void {
    clearTimeout(this.#renewTimer);
    const identity = this.#identity;
    if (!identity || this.#deps.stopping()) return;
    let delay = retryMs;
    if (delay === undefined) {
      const { from, expires } = localExpiry(identity, this.#deps.now());
      delay = from + (expires - from) * (this.#opts.renewAt ?? 2 / 3) - this.#deps.now();
    }
    this.#renewTimer = setTimeout(() => void this.#renewNow(attempt), timerDelay(delay));
  }

  cancelRenewal(): void {
    clearTimeout(this.#renewTimer);
  }

  async #renewNow(attempt: number): Promise<void> {
    const { stopping, fail, random, log } = this.#deps;
    if (stopping()) return;
    try {
      await this.renew();
      this.scheduleRenewal();
    } catch (e) {
      const error = asAgentError(e, "UNAVAILABLE");
      if (stopping()) return;
      if (isRevocation(error))
        return fail(new AgentError("REVOKED", `the control plane revoked this node: ${error.message}`, error.status));
      const left = localExpiry(this.#identity!, this.#deps.now()).expires - this.#deps.now();
      if (left <= 0 && (error.status === 401 || error.status === 403)) {
        return fail(
          new AgentError(
            "CREDENTIAL_EXPIRED",
            `the node's credential expired and renewal was refused (${error.code}); join again`,
            error.status,
          ),
        );
      }
      const retryMs = Math.max(1, jitterBackoff(attempt, this.#opts.backoff, random));
      log.warn("credential renewal failed; retrying", { code: error.code, status: error.status, message: error.message, retryMs });
      this.scheduleRenewal(attempt + 1, retryMs);
    }
  }

  async #post(url: string, body: unknown, what: string, bearer?: string): Promise<Response> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (bearer) headers.authorization = `Bearer ${bearer}`;
    try {
      return await this.#deps.transport.fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
    } catch (e) {
      throw new AgentError("UNAVAILABLE", `${what}: cannot reach ${originOf(url)}: ${(e as Error).message}`);
    }
  }

  async #loadOrCreateKey(): Promise<NodeKeyPair> {
    if (this.#key) return this.#key;
    const jwk = await this.#deps.state.loadKey();
    if (jwk) return (this.#key = await importNodeKey(jwk));
    const { privateJwk, publicKey } = await generateNodeKey();
    await this.#deps.state.saveKey(privateJwk);
    this.#deps.log.info("generated the node key", { publicKey });
    // Re-imported non-extractable: the private half is never exported again.
    return (this.#key = await importNodeKey(privateJwk));
  }

  async #requireKey(): Promise<NodeKeyPair> {
    if (this.#key) return this.#key;
    const jwk = await this.#deps.state.loadKey();
    if (!jwk) throw new AgentError("NOT_JOINED", "the agent has no key: join first");
    return (this.#key = await importNodeKey(jwk));
  }
}

export const trimBase = (baseUrl: string) => baseUrl.replace(/\/+$/, "");

/**
 * Whether a refused upgrade or renewal means the node was revoked: the code REVOKED, or a 403
 * PERMISSION_DENIED (what the gateway and JoinService answer for a revoked node's credential).
 */
export function isRevocation(error: AgentError): boolean {
  return error.code === "REVOKED" || (error.status === 403 && error.code === "PERMISSION_DENIED");
}

/**
 * When the credential expires on this agent's clock: obtainedAt plus the credential's own
 * lifetime (the JWT's exp − iat, both control-plane time), so a skewed agent clock does not
 * move renewal past the expiry. Falls back to expiresAt when the credential is not a JWT.
 */
export function localExpiry(identity: AgentIdentity, now: number): { from: number; expires: number } {
  const from = identity.obtainedAt ? Date.parse(identity.obtainedAt) : now;
  let lifetime = Date.parse(identity.expiresAt) - from;
  try {
    const payload = identity.credential.split(".")[1];
    if (payload) {
      const claims = JSON.parse(new TextDecoder().decode(unbase64url(payload))) as { iat?: unknown; exp?: unknown };
      if (typeof claims.iat === "number" && typeof claims.exp === "number" && claims.exp > claims.iat)
        lifetime = (claims.exp - claims.iat) * 1000;
    }
  } catch {
    // not a JWT: expiresAt it is
  }
  return { from, expires: from + lifetime };
}

function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "the control plane";
  }
}
