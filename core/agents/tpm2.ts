// The few TPM 2.0 structures and computations the tpm attestor needs, over WebCrypto so they run
// in the Worker: reading a TPMT_PUBLIC (the AK) and a TPMS_ATTEST (a quote), an object's name,
// and MakeCredential (TPM 2.0 Part 1, "Credential Protection": the secret only the TPM holding
// the EK can recover, and only for the key with the given name). Integers are big-endian.
import { utf8 } from "../encoding.ts";

export const TPM_ALG = { RSA: 0x0001, SHA256: 0x000b, NULL: 0x0010, RSASSA: 0x0014, AES: 0x0006, CFB: 0x0043 } as const;
/** TPM_GENERATED_VALUE: the TPM signs only structures that start with it (restricted keys). */
export const TPM_GENERATED = 0xff544347;
export const TPM_ST_ATTEST_QUOTE = 0x8018;

/** TPMA_OBJECT bits an attestation key must have: a restricted signing key that never leaves its TPM. */
export const TPMA = {
  fixedTPM: 1 << 1,
  fixedParent: 1 << 4,
  sensitiveDataOrigin: 1 << 5,
  restricted: 1 << 16,
  decrypt: 1 << 17,
  sign: 1 << 18,
} as const;

/** A malformed TPM structure (the caller turns it into its refusal). */
export class TpmFormatError extends Error {}

class Reader {
  #at = 0;
  constructor(readonly bytes: Uint8Array) {}
  #take(n: number): Uint8Array {
    if (this.#at + n > this.bytes.length) throw new TpmFormatError(`truncated TPM structure (wanted ${n} bytes at ${this.#at})`);
    const out = this.bytes.subarray(this.#at, this.#at + n);
    this.#at += n;
    return out;
  }
  u8 = () => this.#take(1)[0]!;
  u16 = () => {
    const b = this.#take(2);
    return (b[0]! << 8) | b[1]!;
  };
  u32 = () => {
    const b = this.#take(4);
    return ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0;
  };
  u64 = () => {
    const hi = this.u32();
    return hi * 2 ** 32 + this.u32();
  };
  bytesOf = (n: number) => this.#take(n);
  /** A TPM2B: a u16 size, then that many bytes. */
  sized = () => this.#take(this.u16());
  get offset() {
    return this.#at;
  }
  end(what: string) {
    if (this.#at !== this.bytes.length) throw new TpmFormatError(`${what} has ${this.bytes.length - this.#at} trailing bytes`);
  }
}

const u16 = (n: number) => new Uint8Array([(n >> 8) & 0xff, n & 0xff]);
const u32 = (n: number) => new Uint8Array([(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff]);
export const concat = (...parts: Uint8Array[]) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
};
/** A TPM2B: the bytes prefixed with their u16 size. */
export const sized = (bytes: Uint8Array) => concat(u16(bytes.length), bytes);

export interface RsaPublic {
  /** The TPMT_PUBLIC bytes (what the name digests). */
  area: Uint8Array;
  nameAlg: number;
  attributes: number;
  /** The signing scheme and its hash (TPM_ALG_NULL when the key leaves it to the caller). */
  scheme: number;
  schemeHash: number;
  modulus: Uint8Array;
  exponent: number;
}

/** Reads a TPM2B_PUBLIC (what tpm2_createak -u writes) holding an RSA key. */
export function readRsaPublic(tpm2bPublic: Uint8Array): RsaPublic {
  const outer = new Reader(tpm2bPublic);
  const area = outer.sized();
  outer.end("TPM2B_PUBLIC");
  const r = new Reader(area);
  const type = r.u16();
  if (type !== TPM_ALG.RSA) throw new TpmFormatError(`the key is of algorithm 0x${type.toString(16)}, not RSA`);
  const nameAlg = r.u16();
  const attributes = r.u32();
  r.sized(); // authPolicy
  const symmetric = r.u16();
  if (symmetric !== TPM_ALG.NULL) r.bytesOf(4); // keyBits, mode
  const scheme = r.u16();
  const schemeHash = scheme === TPM_ALG.NULL ? TPM_ALG.NULL : r.u16();
  r.u16(); // keyBits
  const exponent = r.u32() || 65537; // 0 means the default exponent
  const modulus = r.sized();
  r.end("TPMT_PUBLIC");
  return { area, nameAlg, attributes, scheme, schemeHash, modulus, exponent };
}

/** An object's name: its nameAlg, then the nameAlg digest of its TPMT_PUBLIC (SHA-256 only here). */
export async function objectName(key: Pick<RsaPublic, "area" | "nameAlg">): Promise<Uint8Array> {
  if (key.nameAlg !== TPM_ALG.SHA256) throw new TpmFormatError(`name algorithm 0x${key.nameAlg.toString(16)} is not SHA-256`);
  return concat(u16(key.nameAlg), new Uint8Array(await crypto.subtle.digest("SHA-256", key.area)));
}

export interface Attest {
  magic: number;
  type: number;
  qualifiedSigner: Uint8Array;
  extraData: Uint8Array;
  /** For a quote: the PCR digest over the selection. */
  pcrDigest: Uint8Array;
}

/** Reads a TPMS_ATTEST (what tpm2_quote -m writes). */
export function readAttest(bytes: Uint8Array): Attest {
  const r = new Reader(bytes);
  const magic = r.u32();
  const type = r.u16();
  const qualifiedSigner = r.sized();
  const extraData = r.sized();
  r.bytesOf(8 + 4 + 4 + 1); // clockInfo: clock, resetCount, restartCount, safe
  r.bytesOf(8); // firmwareVersion
  if (type !== TPM_ST_ATTEST_QUOTE) return { magic, type, qualifiedSigner, extraData, pcrDigest: new Uint8Array() };
  const selections = r.u32();
  for (let i = 0; i < selections; i++) {
    r.u16(); // hash
    r.bytesOf(r.u8()); // pcrSelect bitmap
  }
  const pcrDigest = r.sized();
  r.end("TPMS_ATTEST");
  return { magic, type, qualifiedSigner, extraData, pcrDigest };
}

async function hmacSha256(key: Uint8Array, data: Uint8Array): Promise<Uint8Array> {
  const k = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", k, data));
}

/** KDFa with HMAC-SHA256 (TPM 2.0 Part 1, 11.4.10.2): the label is NUL-terminated. */
export async function kdfa(key: Uint8Array, label: string, contextU: Uint8Array, contextV: Uint8Array, bits: number): Promise<Uint8Array> {
  const bytes = bits / 8;
  const blocks: Uint8Array[] = [];
  for (let counter = 1; blocks.length * 32 < bytes; counter++) {
    blocks.push(await hmacSha256(key, concat(u32(counter), utf8(label), new Uint8Array([0]), contextU, contextV, u32(bits))));
  }
  return concat(...blocks).subarray(0, bytes);
}

/**
 * AES-128-CFB with a zero IV, which WebCrypto lacks: each keystream block is AES(key, previous
 * ciphertext block), and one AES block is the first block of AES-CBC over zeros with that IV.
 */
export async function aesCfbEncrypt(key: Uint8Array, plaintext: Uint8Array): Promise<Uint8Array> {
  const k = await crypto.subtle.importKey("raw", key, { name: "AES-CBC" }, false, ["encrypt"]);
  const out = new Uint8Array(plaintext.length);
  let feedback = new Uint8Array(16);
  for (let at = 0; at < plaintext.length; at += 16) {
    const block = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-CBC", iv: feedback }, k, new Uint8Array(16))).subarray(0, 16);
    const n = Math.min(16, plaintext.length - at);
    for (let i = 0; i < n; i++) out[at + i] = plaintext[at + i]! ^ block[i]!;
    feedback = out.slice(at, at + 16);
  }
  return out;
}

export interface Credential {
  /** TPM2B_ID_OBJECT: the outer HMAC and the encrypted secret. */
  idObject: Uint8Array;
  /** TPM2B_ENCRYPTED_SECRET: the seed, RSA-OAEP to the EK with the label "IDENTITY". */
  encryptedSecret: Uint8Array;
}

/**
 * TPM2_MakeCredential outside a TPM, for an RSA EK made from the TCG default template (SHA-256
 * name algorithm, AES-128-CFB): only that TPM's ActivateCredential, for the object named
 * `name`, gives back `secret`.
 */
export async function makeCredential(ekSpki: Uint8Array, name: Uint8Array, secret: Uint8Array): Promise<Credential> {
  const ek = await crypto.subtle.importKey("spki", ekSpki, { name: "RSA-OAEP", hash: "SHA-256" }, false, ["encrypt"]);
  const seed = crypto.getRandomValues(new Uint8Array(32)); // the EK's name algorithm's digest size
  const encryptedSeed = new Uint8Array(await crypto.subtle.encrypt({ name: "RSA-OAEP", label: utf8("IDENTITY\0") }, ek, seed));
  const symKey = await kdfa(seed, "STORAGE", name, new Uint8Array(), 128);
  const encIdentity = await aesCfbEncrypt(symKey, sized(secret));
  const hmacKey = await kdfa(seed, "INTEGRITY", new Uint8Array(), new Uint8Array(), 256);
  const outerHmac = await hmacSha256(hmacKey, concat(encIdentity, name));
  return { idObject: sized(concat(sized(outerHmac), encIdentity)), encryptedSecret: sized(encryptedSeed) };
}
