// Input schemas every method author reaches for, so the same rule reads the same everywhere.
import { z } from "zod";
import type { SecretRef } from "./context.ts";

/** The longest id the API takes (a node, site, pool, workflow, key...): longer is INVALID_ARGUMENT, never a lookup. */
export const MAX_ID_LENGTH = 128;

/** Any id a method is given: 1-128 characters, no control characters (NUL included). */
export const resourceId = z
  .string()
  .min(1)
  .max(MAX_ID_LENGTH)
  .regex(/^[^\u0000-\u001f\u007f]+$/, "must not contain control characters");

/** A secret reference, "secret://<id>": how a secret travels in rows, commands, events and bodies, never its value. */
export const SECRET_REF = /^secret:\/\/[\w-]+$/;

export const isSecretRef = (value: string): value is SecretRef => SECRET_REF.test(value);
