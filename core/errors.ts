// The error model: every failure a caller sees is a ComputeError with a typed code.
// The HTTP layer maps the code to a status and a JSON body {code, message, details, requestId};
// nothing else (no stack, no driver message) leaves the process, and no error quotes more than
// a clipped piece of a caller's long value.

export const errorStatus = {
  INVALID_ARGUMENT: 400,
  FAILED_PRECONDITION: 400,
  UNAUTHENTICATED: 401,
  PERMISSION_DENIED: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  PAYLOAD_TOO_LARGE: 413,
  RESOURCE_EXHAUSTED: 429,
  INVALID_CONFIG: 500,
  INTERNAL: 500,
  UNSUPPORTED: 501,
  DRIVER_ERROR: 502,
  UNAVAILABLE: 503,
  DEADLINE_EXCEEDED: 504,
} as const;

export type ErrorCode = keyof typeof errorStatus;

export type ErrorDetails = Record<string, unknown>;

export class ComputeError extends Error {
  readonly code: ErrorCode;
  readonly details: ErrorDetails | undefined;

  constructor(code: ErrorCode, message: string, details?: ErrorDetails) {
    super(message);
    this.name = "ComputeError";
    this.code = code;
    this.details = details;
  }

  get status(): number {
    return errorStatus[this.code];
  }

  toJSON(): { code: ErrorCode; message: string; details?: ErrorDetails } {
    return this.details === undefined
      ? { code: this.code, message: this.message }
      : { code: this.code, message: this.message, details: this.details };
  }
}

export function isComputeError(err: unknown): err is ComputeError {
  return err instanceof ComputeError;
}

/** How much of a caller's value an error quotes: a key, an id. */
const MAX_QUOTED = 64;
const MAX_QUOTED_PATH = 200;
/** Any input string longer than this is quoted only clipped by an error body. */
export const MAX_ECHOED = 200;
const MAX_MESSAGE = 1000;

/** A schema failure's issues as error details: where (dotted path), what, and zod's code. */
export function schemaIssues(error: { issues: readonly { path: readonly PropertyKey[]; message: string; code: string }[] }) {
  return error.issues.map((i) => ({ path: issuePath(i.path), message: i.message, code: i.code }));
}

/** A path into a caller's value, dotted; its keys are the caller's and may be long: each is clipped, and the whole. */
export function issuePath(path: readonly PropertyKey[]): string {
  return clip(path.map((key) => clip(String(key))).join("."), MAX_QUOTED_PATH);
}

/** A value quoted in an error: at most `max` characters, and how long it was. */
export function clip(value: string, max = MAX_QUOTED): string {
  return value.length <= max ? value : `${value.slice(0, max)}…(${value.length} characters)`;
}

/**
 * An error's body as the caller sees it. Whatever code wrote the message or details (a plugin's
 * handler may quote a 10,000-character id), every long input string in them is clipped and the
 * message is bounded: an error never echoes a caller's value back whole.
 */
export function errorBody(error: ComputeError, longInputs: readonly string[], requestId: string) {
  // The longest first: a shorter input may be part of a longer one.
  const inputs = [...longInputs].sort((a, b) => b.length - a.length);
  const scrub = (text: string, max: number) =>
    clip(
      inputs.reduce((out, input) => (out.includes(input) ? out.split(input).join(clip(input)) : out), text),
      max,
    );
  const scrubValue = (value: unknown, depth: number): unknown => {
    if (typeof value === "string") return scrub(value, MAX_MESSAGE);
    if (value === null || typeof value !== "object" || depth > 8) return value;
    if (Array.isArray(value)) return value.map((v) => scrubValue(v, depth + 1));
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [scrub(k, MAX_QUOTED_PATH), scrubValue(v, depth + 1)]));
  };
  const message = scrub(error.message, MAX_MESSAGE);
  return error.details === undefined
    ? { code: error.code, message, requestId }
    : { code: error.code, message, details: scrubValue(error.details, 0) as ErrorDetails, requestId };
}

/** Shorthands, so call sites read as the failure they report. */
export const invalidArgument = (message: string, details?: ErrorDetails) => new ComputeError("INVALID_ARGUMENT", message, details);
export const invalidConfig = (message: string, details?: ErrorDetails) => new ComputeError("INVALID_CONFIG", message, details);
export const notFound = (message: string, details?: ErrorDetails) => new ComputeError("NOT_FOUND", message, details);
export const conflict = (message: string, details?: ErrorDetails) => new ComputeError("CONFLICT", message, details);
export const unsupported = (message: string, details?: ErrorDetails) => new ComputeError("UNSUPPORTED", message, details);
export const driverError = (message: string, details?: ErrorDetails) => new ComputeError("DRIVER_ERROR", message, details);
