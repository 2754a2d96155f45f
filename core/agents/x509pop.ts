// x509pop (SPIRE's x509pop): the machine holds a private key whose certificate chains to a CA
// bundle the deployment trusts. bcd signs x509popMessage(its join key, a timestamp) with that key,
// so the proof is bound to this join: a captured proof is useless without the node's Ed25519 key
// too (JoinService checks that the join request is signed by it). The chain, every certificate's
// validity window (on database time) and the configured CRLs are checked with pkijs over WebCrypto,
// in the Worker as in Node. Node id and labels come from the certificate.
import * as asn1js from "asn1js";
import * as pkijs from "pkijs";
import { defineAttestor, type AgentRole, type AttestationResult, type AttestorDefinition } from "../contracts.ts";
import { hex, unbase64, unbase64url, utf8 } from "../encoding.ts";
import { ComputeError, invalidConfig } from "../errors.ts";
import { databaseSeconds } from "./credentials.ts";

/** How far the proof's timestamp may be from the control plane's time. */
export const X509POP_MAX_SKEW_SECONDS = 300;
/** The leaf and at most this many intermediates. */
const MAX_CHAIN = 4;
/** A URI SAN naming the node the certificate is for. */
const NODE_URI = /^bc:\/\/node\/([A-Za-z0-9][A-Za-z0-9._-]{0,62})$/;

/** What the key signs: the join's key and the time, so the proof is good for this join only. */
export const x509popMessage = (publicKey: string, timestamp: string) => `bc-x509pop/v1\n${publicKey}\n${timestamp}`;

/** The evidence bcd sends. */
export interface X509PopEvidence {
  /** DER, base64: the leaf first, then its intermediates (not the CA: the deployment has it). */
  certificates: string[];
  timestamp: string;
  /**
   * base64url: the certificate key's signature over x509popMessage, as WebCrypto makes it: ECDSA
   * (P-256 with SHA-256, P-384 with SHA-384) as r||s, RSASSA-PKCS1-v1_5 with SHA-256, or Ed25519.
   */
  signature: string;
}

/** What labels() sees of the verified leaf certificate. */
export interface X509Identity {
  /** Subject attributes by short name (CN, O, OU, C, L, ST, serialNumber); the first of each. */
  subject: Record<string, string>;
  uris: string[];
  dnsNames: string[];
  /** Hex, lower case. */
  serialNumber: string;
  /** SHA-256 of the DER certificate, hex. */
  fingerprint: string;
}

export interface X509PopOptions {
  /** PEM: the CA certificates a machine's certificate must chain to. */
  caBundle: string;
  /**
   * Certificate revocation lists, PEM or DER. A certificate its issuer's CRL lists is refused; a
   * CRL past its nextUpdate, or not signed by its issuer, refuses every certificate of that issuer.
   * An issuer with no CRL here is not checked for revocation.
   */
  crl?: string | Uint8Array | Array<string | Uint8Array>;
  /** The roles it vouches for; default ["node"]. */
  roles?: AgentRole[];
  /** Labels from the certificate, besides bc.dev/x509-cn and bc.dev/x509-serial. */
  labels?: (cert: X509Identity) => Record<string, string>;
  /** Default "x509pop"; register one per CA under different ids to tell them apart. */
  id?: string;
}

const refuse = (message: string) => new ComputeError("PERMISSION_DENIED", message);

const SUBJECT_NAMES: Record<string, string> = {
  "2.5.4.3": "CN",
  "2.5.4.5": "serialNumber",
  "2.5.4.6": "C",
  "2.5.4.7": "L",
  "2.5.4.8": "ST",
  "2.5.4.10": "O",
  "2.5.4.11": "OU",
};

/** The DER blocks of a PEM text with this label ("CERTIFICATE", "X509 CRL"). */
export function pemBlocks(text: string, label: string): Uint8Array[] {
  const re = new RegExp(`-----BEGIN ${label}-----([A-Za-z0-9+/=\\s]+?)-----END ${label}-----`, "g");
  return [...text.matchAll(re)].map((m) => unbase64(m[1]!.replace(/\s+/g, "")));
}

function parseCertificate(der: Uint8Array): pkijs.Certificate {
  return pkijs.Certificate.fromBER(der);
}

export function x509popAttestor(options: X509PopOptions): AttestorDefinition {
  const id = options.id ?? "x509pop";
  const cas = pemBlocks(options.caBundle ?? "", "CERTIFICATE").map((der, i) => {
    try {
      return parseCertificate(der);
    } catch (e) {
      throw invalidConfig(`${id}: certificate ${i + 1} of the CA bundle does not parse: ${(e as Error).message}`);
    }
  });
  if (cas.length === 0) throw invalidConfig(`${id}: caBundle holds no PEM certificate`);
  const crls = (options.crl === undefined ? [] : Array.isArray(options.crl) ? options.crl : [options.crl]).flatMap((crl, i) => {
    const ders = typeof crl === "string" ? pemBlocks(crl, "X509 CRL") : [crl];
    if (ders.length === 0) throw invalidConfig(`${id}: crl ${i + 1} holds no PEM X509 CRL`);
    return ders.map((der) => {
      try {
        return pkijs.CertificateRevocationList.fromBER(der);
      } catch (e) {
        throw invalidConfig(`${id}: crl ${i + 1} does not parse: ${(e as Error).message}`);
      }
    });
  });
  const roles = options.roles ?? ["node"];

  return defineAttestor({
    id,
    async verify(ctx, evidence, request): Promise<AttestationResult> {
      if (!roles.includes(request.role)) throw refuse(`${id} vouches for roles ${roles.join(", ")}, not ${request.role}`);
      const { certificates, timestamp, signature } = evidence as Partial<X509PopEvidence>;
      if (
        !Array.isArray(certificates) ||
        certificates.length === 0 ||
        certificates.length > MAX_CHAIN ||
        !certificates.every((c) => typeof c === "string") ||
        typeof timestamp !== "string" ||
        typeof signature !== "string"
      ) {
        throw refuse(
          `x509pop evidence is { certificates: [leaf, ...intermediates] (DER, base64, at most ${MAX_CHAIN}), timestamp, signature }`,
        );
      }
      let chain: pkijs.Certificate[];
      try {
        chain = certificates.map((c) => parseCertificate(unbase64(c)));
      } catch {
        throw refuse("a certificate of the evidence does not parse (DER, base64)");
      }
      const leaf = chain[0]!;

      const now = await databaseSeconds(ctx.store);
      const at = Date.parse(timestamp) / 1000;
      if (!Number.isFinite(at) || Math.abs(now - at) > X509POP_MAX_SKEW_SECONDS) {
        throw refuse(`the proof's timestamp is more than ${X509POP_MAX_SKEW_SECONDS} s from the control plane's time`);
      }
      if (!(await verifyProof(leaf, x509popMessage(request.publicKey, timestamp), signature))) {
        throw refuse("the proof is not signed by the certificate's key");
      }

      // The chain, on database time. pkijs takes the last certificate given as the leaf.
      const checkDate = new Date(now * 1000);
      const engine = new pkijs.CertificateChainValidationEngine({
        trustedCerts: cas,
        certs: [...chain.slice(1).reverse(), leaf],
        checkDate,
      });
      const verdict = await engine.verify().catch((e: unknown) => ({ result: false, resultMessage: errorText(e), certificatePath: [] }));
      if (!verdict.result) throw refuse(`the certificate does not chain to the configured CA bundle: ${verdict.resultMessage}`);
      const path = (verdict.certificatePath ?? []) as pkijs.Certificate[];
      if (path[0] !== leaf) throw refuse("the certificate does not chain to the configured CA bundle");
      await checkRevocation(path, crls, checkDate);

      const identity = await identityOf(leaf, unbase64(certificates[0]!));
      const labels: Record<string, string> = { "bc.dev/x509-serial": identity.serialNumber };
      if (identity.subject.CN) labels["bc.dev/x509-cn"] = identity.subject.CN;
      Object.assign(labels, options.labels?.(identity));
      const nodeId = identity.uris.map((u) => NODE_URI.exec(u)?.[1]).find((n) => n !== undefined);
      return { role: request.role, labels, ...(nodeId ? { nodeId } : {}) };
    },
  });
}

/** Revocation by the configured CRLs, for every certificate of the path but the trust anchor. */
async function checkRevocation(path: pkijs.Certificate[], crls: pkijs.CertificateRevocationList[], checkDate: Date): Promise<void> {
  for (let i = 0; i < path.length - 1; i++) {
    const cert = path[i]!;
    const issuer = path[i + 1]!;
    for (const crl of crls.filter((c) => c.issuer.isEqual(cert.issuer))) {
      if (!(await crl.verify({ issuerCertificate: issuer }).catch(() => false))) {
        throw refuse(`the configured CRL of ${describeName(cert.issuer)} is not signed by its issuer: fix the attestor's crl`);
      }
      if (crl.nextUpdate && crl.nextUpdate.value < checkDate) {
        throw refuse(`the configured CRL of ${describeName(cert.issuer)} is past its nextUpdate: give the attestor a current one`);
      }
      if (crl.isCertificateRevoked(cert)) throw refuse(`the certificate ${describeName(cert.subject)} is revoked by its issuer's CRL`);
    }
  }
}

/** The proof: the leaf's key over the message, with the algorithm its key type implies. */
async function verifyProof(leaf: pkijs.Certificate, message: string, signature: string): Promise<boolean> {
  const spki = leaf.subjectPublicKeyInfo;
  const keyType = spki.algorithm.algorithmId;
  // WebCrypto's parameter objects (the Worker's and Node's types name them differently).
  let importAlg: { name: string; namedCurve?: string; hash?: string };
  let verifyAlg: { name: string; hash?: string };
  if (keyType === "1.2.840.10045.2.1") {
    const curve = (spki.algorithm.algorithmParams as asn1js.ObjectIdentifier | undefined)?.valueBlock?.toString();
    const named = curve === "1.2.840.10045.3.1.7" ? "P-256" : curve === "1.3.132.0.34" ? "P-384" : undefined;
    if (!named) throw refuse(`the certificate's EC curve ${curve ?? "(none)"} is not supported (P-256, P-384)`);
    importAlg = { name: "ECDSA", namedCurve: named };
    verifyAlg = { name: "ECDSA", hash: named === "P-256" ? "SHA-256" : "SHA-384" };
  } else if (keyType === "1.2.840.113549.1.1.1") {
    importAlg = { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" };
    verifyAlg = { name: "RSASSA-PKCS1-v1_5" };
  } else if (keyType === "1.3.101.112") {
    importAlg = verifyAlg = { name: "Ed25519" };
  } else {
    throw refuse(`the certificate's key type ${keyType} is not supported (EC P-256/P-384, RSA, Ed25519)`);
  }
  try {
    const key = await crypto.subtle.importKey("spki", spki.toSchema().toBER(false), importAlg, false, ["verify"]);
    return await crypto.subtle.verify(verifyAlg, key, unbase64url(signature), utf8(message));
  } catch {
    return false;
  }
}

async function identityOf(cert: pkijs.Certificate, der: Uint8Array): Promise<X509Identity> {
  const subject: Record<string, string> = {};
  for (const tv of cert.subject.typesAndValues) {
    const name = SUBJECT_NAMES[tv.type];
    const value = (tv.value as { valueBlock?: { value?: unknown } }).valueBlock?.value;
    if (name && typeof value === "string" && !(name in subject)) subject[name] = value;
  }
  const uris: string[] = [];
  const dnsNames: string[] = [];
  for (const ext of cert.extensions ?? []) {
    if (ext.extnID !== "2.5.29.17" || !(ext.parsedValue instanceof pkijs.AltName)) continue;
    for (const name of ext.parsedValue.altNames) {
      if (name.type === 6 && typeof name.value === "string") uris.push(name.value);
      if (name.type === 2 && typeof name.value === "string") dnsNames.push(name.value);
    }
  }
  const fingerprint = hex(new Uint8Array(await crypto.subtle.digest("SHA-256", der)));
  return { subject, uris, dnsNames, serialNumber: hex(cert.serialNumber.valueBlock.valueHexView), fingerprint };
}

function describeName(name: pkijs.RelativeDistinguishedNames): string {
  const cn = name.typesAndValues.find((tv) => tv.type === "2.5.4.3");
  const value = (cn?.value as { valueBlock?: { value?: unknown } } | undefined)?.valueBlock?.value;
  return typeof value === "string" ? `CN=${value}` : "(no CN)";
}

function errorText(e: unknown): string {
  if (e && typeof e === "object" && "message" in e) return String((e as { message: unknown }).message);
  if (e && typeof e === "object" && "resultMessage" in e) return String((e as { resultMessage: unknown }).resultMessage);
  return String(e);
}
