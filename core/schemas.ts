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
/**
 * An id chosen at create time that also names things on hosts (an instance's guest, a host name):
 * a DNS label, lower-case letters, digits and dashes, starting and ending with a letter or digit.
 */
export const slugId = z
  .string()
  .regex(
    /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/,
    "lower-case letters, digits and dashes, at most 63, starting and ending with a letter or digit",
  );

export const SECRET_REF = /^secret:\/\/[\w-]+$/;

export const isSecretRef = (value: string): value is SecretRef => SECRET_REF.test(value);
