// Structured logs, one JSON object per line. Fields whose names say they hold a secret are
// replaced before anything is written: secrets never reach logs. Each level goes to the console
// method of its name, so `wrangler dev --log-level warn` (and Workers Logs' level filter) still
// shows warnings and errors.

const SECRET_FIELD = /secret|token|password|passphrase|authorization|credential|private|cookie/i;

export type LogFields = Record<string, unknown>;

export interface Logger {
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
  child(fields: LogFields): Logger;
}

export function redact(value: unknown, depth = 0): unknown {
  if (depth > 6 || value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = SECRET_FIELD.test(k) ? "[redacted]" : redact(v, depth + 1);
  return out;
}

export function createLogger(base: LogFields = {}): Logger {
  const write = (level: "info" | "warn" | "error", message: string, fields?: LogFields) =>
    (level === "info" ? console.log : console[level])(JSON.stringify(redact({ level, message, ...base, ...fields })));
  return {
    info: (m, f) => write("info", m, f),
    warn: (m, f) => write("warn", m, f),
    error: (m, f) => write("error", m, f),
    child: (fields) => createLogger({ ...base, ...fields }),
  };
}
