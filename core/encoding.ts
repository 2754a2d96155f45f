// Byte encodings and digests shared by IAM, secrets and the agent protocol (WebCrypto only,
// so the same code runs in workerd and in Node).
const encoder = new TextEncoder();

export const utf8 = (s: string) => encoder.encode(s);
export const hex = (bytes: Uint8Array) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
/** Standard base64; chunked, since spreading a large array into one call overflows the stack. */
export function base64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 8192) binary += String.fromCharCode(...bytes.subarray(i, i + 8192));
  return btoa(binary);
}
export const unbase64 = (s: string) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
export const base64url = (bytes: Uint8Array) => base64(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
export const unbase64url = (s: string) => unbase64(s.replace(/-/g, "+").replace(/_/g, "/"));

export async function sha256Hex(value: string): Promise<string> {
  return hex(new Uint8Array(await crypto.subtle.digest("SHA-256", utf8(value))));
}

/** Equal strings compare in time independent of where they differ. */
export function constantTimeEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}
