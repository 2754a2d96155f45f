-- The web console's sessions (core/console/sessions.ts). Signing in exchanges an API key (or a
-- bearer token) for a random session id that lives only in the browser's HttpOnly cookie: the
-- table keeps its SHA-256, the principal and roles the credential had, the CSRF token every
-- mutating console request must carry, and a fixed expiry. Signing out deletes the row.
CREATE TABLE IF NOT EXISTS bc_console_sessions (
  id_sha256 text PRIMARY KEY,
  principal text NOT NULL,
  roles text[] NOT NULL,
  csrf text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  expires_at timestamptz NOT NULL
);
-- Expired sessions are swept at each sign-in.
CREATE INDEX IF NOT EXISTS bc_console_sessions_expires ON bc_console_sessions (expires_at);
