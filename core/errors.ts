// The error model: every failure a caller sees is a ComputeError with a typed code.
// The HTTP layer maps the code to a status and a JSON body {code, message, details};
// nothing else (no stack, no driver message) leaves the process.

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

/** A schema failure's issues as error details: where (dotted path), what, and zod's code. */
export function schemaIssues(error: { issues: readonly { path: readonly PropertyKey[]; message: string; code: string }[] }) {
  return error.issues.map((i) => ({ path: i.path.map(String).join("."), message: i.message, code: i.code }));
}

/** Shorthands, so call sites read as the failure they report. */
export const invalidArgument = (message: string, details?: ErrorDetails) =>
  new ComputeError("INVALID_ARGUMENT", message, details);
export const invalidConfig = (message: string, details?: ErrorDetails) =>
  new ComputeError("INVALID_CONFIG", message, details);
export const notFound = (message: string, details?: ErrorDetails) =>
  new ComputeError("NOT_FOUND", message, details);
export const conflict = (message: string, details?: ErrorDetails) =>
  new ComputeError("CONFLICT", message, details);
export const unsupported = (message: string, details?: ErrorDetails) =>
  new ComputeError("UNSUPPORTED", message, details);
export const driverError = (message: string, details?: ErrorDetails) =>
  new ComputeError("DRIVER_ERROR", message, details);
