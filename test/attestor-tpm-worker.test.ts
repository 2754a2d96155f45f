// The tpm attestor in workerd: the challenge (EK chain with pkijs, MakeCredential with WebCrypto's
// RSA-OAEP, HMAC and AES) and the join's checks run in the Worker, through JoinService's routes.
// SIMULATED: the TPM. This test plays it with keys of its own (an "EK" certificate from a test CA,
// a software AK, ActivateCredential and the quote written out below); test/node/attestor-tpm.test.ts
// proves the same code against a real TPM (swtpm).
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { betterCompute, tpmAttestor } from "../core/index.ts";
import { concat, kdfa, objectName, readRsaPublic, sized, TPM_GENERATED, TPM_ST_ATTEST_QUOTE } from "../core/agents/tpm2.ts";
import { base64, unbase64, utf8 } from "../core/encoding.ts";
import { CHALLENGE_PATH, generateNodeKey, JOIN_PATH, joinMessage, signMessage } from "../core/protocol.ts";
import { certificate } from "./support/x509.ts";

const vendor = await certificate("TPM vendor CA");
const otherVendor = await certificate("another TPM vendor CA");
const compute = betterCompute({ attestors: [tpmAttestor({ ekCaBundle: vendor.pem })] });

const u16 = (n: number) => new Uint8Array([n >> 8, n & 0xff]);
const u32 = (n: number) => new Uint8Array([n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff]);

/** A software stand-in for a TPM: an EK certified by `issuer` and a restricted RSASSA-SHA256 AK. */
async function simulatedTpm(issuer = vendor) {
  const ek = await certificate("ek", { issuer, kind: "rsa" });
  const ak = (await crypto.subtle.generateKey(
    { name: "RSASSA-PKCS1-v1_5", modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: "SHA-256" },
    true,
    ["sign", "verify"],
  )) as CryptoKeyPair;
  const modulus = unbase64(
    (((await crypto.subtle.exportKey("jwk", ak.publicKey)) as JsonWebKey).n ?? "").replace(/-/g, "+").replace(/_/g, "/"),
  );
  // TPMT_PUBLIC: RSA, SHA-256 name, fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|restricted|sign, RSASSA-SHA256.
  const area = concat(
    u16(0x0001),
    u16(0x000b),
    u32(0x00050072),
    u16(0),
    u16(0x0010),
    u16(0x0014),
    u16(0x000b),
    u16(2048),
    u32(0),
    sized(modulus),
  );
  const akPublic = sized(area);
  const name = await objectName(readRsaPublic(akPublic));
  const ekDecrypt = await crypto.subtle.importKey(
    "pkcs8",
    await crypto.subtle.exportKey("pkcs8", ek.keys.privateKey),
    { name: "RSA-OAEP", hash: "SHA-256" },
    false,
    ["decrypt"],
  );

  return {
    evidence: { ekCertificate: base64(ek.der), akPublic: base64(akPublic) },
    /** TPM2_ActivateCredential: the seed from the EK, the outer HMAC checked, the secret decrypted (AES-128-CFB). */
    async activate(challenge: { idObject: string; encryptedSecret: string }): Promise<Uint8Array> {
      const seed = new Uint8Array(
        await crypto.subtle.decrypt(
          { name: "RSA-OAEP", label: utf8("IDENTITY\0") },
          ekDecrypt,
          unbase64(challenge.encryptedSecret).subarray(2),
        ),
      );
      const idObject = unbase64(challenge.idObject).subarray(2);
      const hmacSize = (idObject[0]! << 8) | idObject[1]!;
      const integrity = idObject.subarray(2, 2 + hmacSize);
      const encIdentity = idObject.subarray(2 + hmacSize);
      const hmacKey = await crypto.subtle.importKey(
        "raw",
        await kdfa(seed, "INTEGRITY", new Uint8Array(), new Uint8Array(), 256),
        { name: "HMAC", hash: "SHA-256" },
        false,
        ["verify"],
      );
      if (!(await crypto.subtle.verify("HMAC", hmacKey, integrity, concat(encIdentity, name))))
        throw new Error("the credential's integrity check failed");
      const aes = await crypto.subtle.importKey(
        "raw",
        await kdfa(seed, "STORAGE", name, new Uint8Array(), 128),
        { name: "AES-CBC" },
        false,
        ["encrypt"],
      );
      const plain = new Uint8Array(encIdentity.length);
      let feedback = new Uint8Array(16);
      for (let at = 0; at < encIdentity.length; at += 16) {
        const block = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-CBC", iv: feedback }, aes, new Uint8Array(16)));
        for (let i = 0; i < 16 && at + i < encIdentity.length; i++) plain[at + i] = encIdentity[at + i]! ^ block[i]!;
        feedback = encIdentity.slice(at, at + 16);
      }
      return plain.subarray(2, 2 + ((plain[0]! << 8) | plain[1]!));
    },
    /** TPM2_Quote: a TPMS_ATTEST over the nonce (PCR 0 of SHA-256 selected), signed by the AK. */
    async quote(nonceHex: string): Promise<{ quote: string; signature: string }> {
      const nonce = Uint8Array.from(nonceHex.match(/../g) ?? [], (h) => parseInt(h, 16));
      const attest = concat(u32(TPM_GENERATED), u16(TPM_ST_ATTEST_QUOTE), sized(name), sized(nonce), new Uint8Array(17 + 8));
      const quoted = concat(attest, u32(1), u16(0x000b), new Uint8Array([3, 1, 0, 0]), sized(new Uint8Array(32)));
      const signature = new Uint8Array(await crypto.subtle.sign("RSASSA-PKCS1-v1_5", ak.privateKey, quoted));
      return { quote: base64(quoted), signature: base64(signature) };
    },
  };
}

const post = async (path: string, body: unknown) => {
  const res = await compute.fetch(
    new Request(`https://join.example.test${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    }),
    env,
  );
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

describe("the tpm attestor in the Worker", () => {
  it("challenges a TPM whose EK chains to the vendor CA and joins it with the activated secret and the quote", async () => {
    const tpm = await simulatedTpm();
    const key = await generateNodeKey();
    const asked = await post(CHALLENGE_PATH, { attestor: "tpm", evidence: tpm.evidence, publicKey: key.publicKey, role: "node" });
    expect(asked.status, JSON.stringify(asked.body)).toBe(200);
    const { challengeId, challenge } = asked.body as {
      challengeId: string;
      challenge: { idObject: string; encryptedSecret: string; nonce: string };
    };

    const secret = await tpm.activate(challenge);
    const evidence = { challengeId, secret: base64(secret), ...(await tpm.quote(challenge.nonce)) };
    const join = {
      attestor: "tpm",
      publicKey: key.publicKey,
      role: "node",
      signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, "tpm", evidence)),
    };
    const joined = await post(JOIN_PATH, { ...join, evidence });
    expect(joined.status, JSON.stringify(joined.body)).toBe(200);
    expect(joined.body.nodeId).toMatch(/^tpm-[0-9a-f]{24}$/);

    const replayed = await post(JOIN_PATH, { ...join, evidence });
    expect(replayed).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
  });

  it("refuses an EK certificate from another vendor's CA", async () => {
    const tpm = await simulatedTpm(otherVendor);
    const key = await generateNodeKey();
    const asked = await post(CHALLENGE_PATH, { attestor: "tpm", evidence: tpm.evidence, publicKey: key.publicKey, role: "node" });
    expect(asked).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
  });

  it("refuses a bundle with no CA at configuration, and a challenge for an attestor that takes none", async () => {
    expect(() => tpmAttestor({ ekCaBundle: "not a certificate" })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
    const key = await generateNodeKey();
    const asked = await post(CHALLENGE_PATH, { attestor: "join-token", evidence: {}, publicKey: key.publicKey, role: "node" });
    expect(asked.body).toMatchObject({ code: "FAILED_PRECONDITION" });
  });
});
