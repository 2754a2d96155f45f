// Test PKI made with pkijs over WebCrypto, so the same fixtures are made in Node and in workerd:
// CAs, intermediates, leaf certificates (EC P-256, RSA or Ed25519 keys) and CRLs, each from the
// test's own keys.
import * as asn1js from "asn1js";
import * as pkijs from "pkijs";
import { base64, base64url, utf8 } from "../../core/encoding.ts";
import { x509popMessage } from "../../core/agents/x509pop.ts";

export type KeyKind = "ec" | "rsa" | "ed25519";

export interface Issued {
  cert: pkijs.Certificate;
  der: Uint8Array;
  pem: string;
  keys: CryptoKeyPair;
  kind: KeyKind;
}

/** generateKey parameters per kind (typed loosely: the Worker's and Node's type names differ). */
const KEY_ALGS: Record<KeyKind, { gen: { name: string } & Record<string, unknown> }> = {
  ec: { gen: { name: "ECDSA", namedCurve: "P-256" } },
  rsa: { gen: { name: "RSASSA-PKCS1-v1_5", modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: "SHA-256" } },
  ed25519: { gen: { name: "Ed25519" } },
};

export const pem = (label: string, der: Uint8Array) =>
  `-----BEGIN ${label}-----\n${base64(der)
    .replace(/(.{64})/g, "$1\n")
    .replace(/\n$/, "")}\n-----END ${label}-----\n`;

export async function pkcs8Pem(key: CryptoKey): Promise<string> {
  return pem("PRIVATE KEY", new Uint8Array((await crypto.subtle.exportKey("pkcs8", key)) as ArrayBuffer));
}

const DAY = 86_400_000;
let serial = 1000;

function name(cn: string): pkijs.RelativeDistinguishedNames {
  return new pkijs.RelativeDistinguishedNames({
    typesAndValues: [
      new pkijs.AttributeTypeAndValue({ type: "2.5.4.10", value: new asn1js.Utf8String({ value: "Better Compute tests" }) }),
      new pkijs.AttributeTypeAndValue({ type: "2.5.4.3", value: new asn1js.Utf8String({ value: cn }) }),
    ],
  });
}

/**
 * A certificate for cn: self-signed (a root CA) without issuer, else signed by issuer. CAs get
 * basicConstraints cA and keyUsage keyCertSign + cRLSign; leaves digitalSignature.
 */
export async function certificate(
  cn: string,
  opts: { issuer?: Issued; ca?: boolean; kind?: KeyKind; uris?: string[]; notBefore?: Date; notAfter?: Date } = {},
): Promise<Issued> {
  const kind = opts.kind ?? "ec";
  const keys = (await crypto.subtle.generateKey(KEY_ALGS[kind].gen as never, true, ["sign", "verify"])) as CryptoKeyPair;
  const cert = new pkijs.Certificate();
  cert.version = 2;
  cert.serialNumber = new asn1js.Integer({ value: serial++ });
  cert.subject = name(cn);
  cert.issuer = opts.issuer ? opts.issuer.cert.subject : name(cn);
  cert.notBefore.value = opts.notBefore ?? new Date(Date.now() - DAY);
  cert.notAfter.value = opts.notAfter ?? new Date(Date.now() + 365 * DAY);
  const ca = opts.ca ?? !opts.issuer;
  // keyUsage bits, first byte: digitalSignature 0x80, keyCertSign 0x04, cRLSign 0x02.
  const usage = new asn1js.BitString({ valueHex: new Uint8Array([ca ? 0x06 : 0x80]).buffer, unusedBits: ca ? 1 : 7 });
  cert.extensions = [
    new pkijs.Extension({
      extnID: "2.5.29.19",
      critical: true,
      extnValue: new pkijs.BasicConstraints({ cA: ca }).toSchema().toBER(false),
      parsedValue: new pkijs.BasicConstraints({ cA: ca }),
    }),
    new pkijs.Extension({ extnID: "2.5.29.15", critical: true, extnValue: usage.toBER(false) }),
  ];
  if (opts.uris?.length) {
    const san = new pkijs.AltName({ altNames: opts.uris.map((value) => new pkijs.GeneralName({ type: 6, value })) });
    cert.extensions.push(new pkijs.Extension({ extnID: "2.5.29.17", extnValue: san.toSchema().toBER(false) }));
  }
  // From the SPKI bytes: pkijs' importKey knows no Ed25519.
  cert.subjectPublicKeyInfo = pkijs.PublicKeyInfo.fromBER((await crypto.subtle.exportKey("spki", keys.publicKey)) as ArrayBuffer);
  await cert.sign((opts.issuer ?? { keys }).keys.privateKey, "SHA-256");
  const der = new Uint8Array(cert.toSchema(true).toBER(false));
  return { cert: pkijs.Certificate.fromBER(der), der, pem: pem("CERTIFICATE", der), keys, kind };
}

/** A CRL of issuer listing revoked, valid until nextUpdate (default a week on). */
export async function crl(issuer: Issued, revoked: Issued[], opts: { nextUpdate?: Date; signer?: Issued } = {}): Promise<string> {
  const list = new pkijs.CertificateRevocationList();
  list.version = 1;
  list.issuer = issuer.cert.subject;
  list.thisUpdate = new pkijs.Time({ type: 0, value: new Date(Date.now() - DAY) });
  list.nextUpdate = new pkijs.Time({ type: 0, value: opts.nextUpdate ?? new Date(Date.now() + 7 * DAY) });
  list.revokedCertificates = revoked.map(
    (r) =>
      new pkijs.RevokedCertificate({
        userCertificate: r.cert.serialNumber,
        revocationDate: new pkijs.Time({ type: 0, value: new Date() }),
      }),
  );
  await list.sign((opts.signer ?? issuer).keys.privateKey, "SHA-256");
  return pem("X509 CRL", new Uint8Array(list.toSchema(true).toBER(false)));
}

/** x509pop evidence as bcd makes it: the chain (leaf first) and the proof signed by key (default the leaf's). */
export async function x509popEvidence(chain: Issued[], joinKey: string, opts: { key?: Issued; timestamp?: string } = {}) {
  const signer = opts.key ?? chain[0]!;
  const timestamp = opts.timestamp ?? new Date().toISOString();
  const alg =
    signer.kind === "ec" ? { name: "ECDSA", hash: "SHA-256" } : signer.kind === "rsa" ? { name: "RSASSA-PKCS1-v1_5" } : { name: "Ed25519" };
  const signature = new Uint8Array(await crypto.subtle.sign(alg, signer.keys.privateKey, utf8(x509popMessage(joinKey, timestamp))));
  return { certificates: chain.map((c) => base64(c.der)), timestamp, signature: base64url(signature) };
}
