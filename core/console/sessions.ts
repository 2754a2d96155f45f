// The console's sessions (migration core/0020): signing in exchanges a credential the IAM port
// accepts for a random id the browser keeps in an HttpOnly cookie. The table holds only the id's
// SHA-256, so a reader of the database cannot sign in with what it reads; the principal and its
// roles are the credential's at sign-in, and a session of a revoked API key is over at once.
import { sql } from "drizzle-orm";
import { base64url, constantTimeEqual, sha256Hex } from "../encoding.ts";
import type { Principal } from "../iam.ts";
import { one, type Store } from "../store/database.ts";

/** The cookie's name; its value is the session id and nothing else. */
export const SESSION_COOKIE = "bc_session";
/** Fixed, not sliding: a stolen cookie dies at a known time, and an operator signs in once a working day. */
export const SESSION_SECONDS = 12 * 60 * 60;

export interface ConsoleSession {
  principal: Principal;
  /** Every mutating console request carries it (a form field or the x-csrf-token header). */
  csrf: string;
  expiresAt: string;
}

const randomToken = () => base64url(crypto.getRandomValues(new Uint8Array(32)));
/** What a session id looks like: 32 random bytes, base64url. Anything else is never looked up. */
const SESSION_ID = /^[A-Za-z0-9_-]{43}$/;

/**
 * A new session for `principal`; the id is returned once, for the cookie. Sweeps expired sessions
 * on the way. It ends after SESSION_SECONDS, or when the credential does if that is sooner (an SSO
 * token's expiry): a session never outlives what it was signed in with.
 */
export async function openSession(store: Store, principal: Principal): Promise<{ id: string; session: ConsoleSession }> {
  const id = randomToken();
  const csrf = randomToken();
  const digest = await sha256Hex(id);
  const row = await store.transaction(async (tx) => {
    await tx.execute(sql`DELETE FROM bc_console_sessions WHERE expires_at < compute_now()`);
    return one<{ expires_at: string }>(
      tx,
      sql`INSERT INTO bc_console_sessions (id_sha256, principal, roles, csrf, expires_at)
          VALUES (${digest}, ${principal.id}, ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(principal.roles)}::jsonb)), ${csrf}, LEAST(compute_now() + make_interval(secs => ${SESSION_SECONDS}), ${principal.expiresAt ?? null}::timestamptz))
          RETURNING expires_at`,
    );
  });
  return { id, session: { principal, csrf, expiresAt: new Date(row!.expires_at).toISOString() } };
}

/** The live session a cookie names, or undefined (unknown, expired, signed out, or its API key revoked). */
export async function findSession(store: Store, id: string | undefined): Promise<ConsoleSession | undefined> {
  if (!id || !SESSION_ID.test(id)) return undefined;
  const row = await one<{ principal: string; roles: string[]; csrf: string; expires_at: string }>(
    store.db,
    sql`SELECT s.principal, s.roles, s.csrf, s.expires_at FROM bc_console_sessions s
        WHERE s.id_sha256 = ${await sha256Hex(id)} AND s.expires_at > compute_now()
          AND (NOT starts_with(s.principal, 'apikey:') OR EXISTS (
            SELECT 1 FROM bc_api_keys k WHERE k.id = substr(s.principal, 8) AND k.revoked_at IS NULL))`,
  );
  if (!row) return undefined;
  return { principal: { id: row.principal, roles: row.roles }, csrf: row.csrf, expiresAt: new Date(row.expires_at).toISOString() };
}

/** Signs out: the row goes, so the cookie names nothing even if a copy of it survives. */
export async function closeSession(store: Store, id: string | undefined): Promise<void> {
  if (!id || !SESSION_ID.test(id)) return;
  await store.db.execute(sql`DELETE FROM bc_console_sessions WHERE id_sha256 = ${await sha256Hex(id)}`);
}

/** Whether a presented CSRF token is the session's (constant time). */
export function csrfMatches(session: ConsoleSession, presented: string | undefined): boolean {
  return typeof presented === "string" && constantTimeEqual(presented, session.csrf);
}
