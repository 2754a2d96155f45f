// bcd's x509pop evidence: the machine's certificate chain (--x509-cert, a PEM file: the leaf, then
// its intermediates) and a signature over x509popMessage(join key, now) by its private key
// (--x509-key, PEM: EC P-256/P-384, RSA or Ed25519). See core/agents/x509pop.ts.
import { createPrivateKey, sign, type KeyObject } from "node:crypto";
import { readFile } from "node:fs/promises";
import { base64, base64url, utf8 } from "../../core/encoding.ts";
import { pemBlocks, x509popMessage, type X509PopEvidence } from "../../core/agents/x509pop.ts";
import { flag, ProducerUsageError, type EvidenceProducer } from "./producer.ts";

export const x509popProducer: EvidenceProducer = {
  flags: { "x509-cert": { type: "string" }, "x509-key": { type: "string" } },
  usage: "--x509-cert FILE --x509-key FILE   the machine's certificate chain (PEM, leaf first) and its private key (PEM)",
  async produce(ctx) {
    const certFile = flag(ctx, "x509-cert");
    const keyFile = flag(ctx, "x509-key");
    if (!certFile || !keyFile) throw new ProducerUsageError(`${ctx.command} --attestor x509pop needs --x509-cert FILE and --x509-key FILE`);
    const certificates = pemBlocks(await readFile(certFile, "utf8"), "CERTIFICATE").map(base64);
    if (certificates.length === 0) throw new ProducerUsageError(`--x509-cert ${certFile} holds no PEM certificate`);
    let key: KeyObject;
    try {
      key = createPrivateKey(await readFile(keyFile, "utf8"));
    } catch (e) {
      throw new ProducerUsageError(`--x509-key ${keyFile} is not a PEM private key: ${(e as Error).message}`);
    }
    const timestamp = new Date().toISOString();
    const message = utf8(x509popMessage(await ctx.publicKey(), timestamp));
    const evidence: X509PopEvidence = { certificates, timestamp, signature: base64url(signProof(key, message)) };
    return { ...evidence };
  },
};

/** The signature core/agents/x509pop.ts verifies: ECDSA as r||s (WebCrypto's form), RSA PKCS#1 v1.5 with SHA-256, or Ed25519. */
function signProof(key: KeyObject, message: Uint8Array): Uint8Array {
  switch (key.asymmetricKeyType) {
    case "ec": {
      const curve = key.asymmetricKeyDetails?.namedCurve;
      const hash = curve === "prime256v1" ? "sha256" : curve === "secp384r1" ? "sha384" : undefined;
      if (!hash) throw new ProducerUsageError(`the x509pop key's curve ${curve} is not supported (P-256, P-384)`);
      return sign(hash, message, { key, dsaEncoding: "ieee-p1363" });
    }
    case "rsa":
      return sign("sha256", message, key);
    case "ed25519":
      return sign(null, message, key);
    default:
      throw new ProducerUsageError(`the x509pop key's type ${key.asymmetricKeyType} is not supported (EC, RSA, Ed25519)`);
  }
}
