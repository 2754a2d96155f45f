// The `tpm` attestor: the machine's TPM vouches for it. Two round trips (docs/attestor-tpm.md):
//   1. challenge: the agent sends its EK certificate (from the TPM's NV index) and a fresh AK's
//      public area. The EK certificate must chain to a configured CA; the AK must be a restricted
//      signing key that never leaves its TPM. The control plane makes a credential (a random
//      secret) that only the TPM holding that EK can activate, and only for that AK, plus a nonce.
//   2. join: the agent answers with the activated secret (so the AK lives beside the EK) and a quote
//      over the nonce signed by the AK (so it is fresh). The node id derives from the EK: the same
//      TPM joins as the same node, and a revoked node stays revoked.
import * as pkijs from "pkijs";
import { defineAttestor, type AgentRole, type AttestationResult, type AttestorDefinition } from "../contracts.ts";
import { base64, base64url, constantTimeEqual, hex, unbase64 } from "../encoding.ts";
import { ComputeError, invalidConfig } from "../errors.ts";
import { databaseSeconds } from "./credentials.ts";
import { pemBlocks } from "./x509pop.ts";
import {
  makeCredential,
  objectName,
  readAttest,
  readRsaPublic,
  TPM_ALG,
  TPM_GENERATED,
  TPM_ST_ATTEST_QUOTE,
  TPMA,
  TpmFormatError,
} from "./tpm2.ts";

export interface TpmAttestorOptions {
  /** PEM: the CA certificates (roots and intermediates) that issue the EK certificates to trust, e.g. the TPM vendors'. */
  ekCaBundle: string;
  /** The roles a TPM-attested agent may join as (default: node). */
  roles?: AgentRole[];
  /** Labels every node it joins gets. */
  labels?: Record<string, string>;
}

/** The label that names the node's TPM: the SHA-256 of its EK public key (SPKI DER), hex. */
export const TPM_EK_LABEL = "bc.dev/tpm-ek";
const RSA_ENCRYPTION = "1.2.840.113549.1.1.1";
const AK_ATTRIBUTES = TPMA.fixedTPM | TPMA.fixedParent | TPMA.sensitiveDataOrigin | TPMA.restricted | TPMA.sign;

const refuse = (message: string) => new ComputeError("PERMISSION_DENIED", message);

/** What the attestor keeps between the challenge and the join (no secret: its digest). */
interface ChallengeState {
  ek: string;
  akPublic: string;
  nonce: string;
  secretSha256: string;
}

export function tpmAttestor(options: TpmAttestorOptions): AttestorDefinition {
  const trusted = parseCertificates(options.ekCaBundle);
  const roles = options.roles ?? ["node"];

  return defineAttestor({
    id: "tpm",

    async challenge(ctx, evidence, request) {
      if (!roles.includes(request.role)) throw refuse(`the tpm attestor joins roles ${roles.join(", ")}, not ${request.role}`);
      const ekCert = certificate(bytesField(evidence, "ekCertificate"));
      await verifyChain(ekCert, trusted, new Date((await databaseSeconds(ctx.store)) * 1000));
      if (ekCert.subjectPublicKeyInfo.algorithm.algorithmId !== RSA_ENCRYPTION) {
        throw new ComputeError("UNSUPPORTED", "only RSA endorsement keys are supported (the TCG default RSA 2048 EK)");
      }
      const ekSpki = new Uint8Array(ekCert.subjectPublicKeyInfo.toSchema().toBER());
      const akPublic = bytesField(evidence, "akPublic");
      const ak = tpmStructure(() => readRsaPublic(akPublic));
      if ((ak.attributes & (AK_ATTRIBUTES | TPMA.decrypt)) !== AK_ATTRIBUTES) {
        throw refuse(
          "the AK is not a restricted signing key fixed to its TPM (fixedTPM, fixedParent, sensitiveDataOrigin, restricted, sign)",
        );
      }
      if (ak.scheme !== TPM_ALG.RSASSA || ak.schemeHash !== TPM_ALG.SHA256) throw refuse("the AK must sign with RSASSA and SHA-256");
      if (ak.nameAlg !== TPM_ALG.SHA256) throw refuse("the AK's name algorithm must be SHA-256");
      const name = await objectName(ak);

      const secret = crypto.getRandomValues(new Uint8Array(32));
      const nonce = crypto.getRandomValues(new Uint8Array(32));
      const credential = await makeCredential(ekSpki, name, secret);
      const state: ChallengeState = {
        ek: await sha256(ekSpki),
        akPublic: base64(akPublic),
        nonce: hex(nonce),
        secretSha256: await sha256(secret),
      };
      return {
        challenge: { idObject: base64(credential.idObject), encryptedSecret: base64(credential.encryptedSecret), nonce: hex(nonce) },
        state: { ...state },
      };
    },

    async verify(_ctx, evidence, request): Promise<AttestationResult> {
      const state = request.challenge as ChallengeState | undefined;
      if (!state) throw refuse("tpm evidence answers a challenge: ask for one first");
      if (!roles.includes(request.role)) throw refuse(`the tpm attestor joins roles ${roles.join(", ")}, not ${request.role}`);
      if (!constantTimeEqual(await sha256(bytesField(evidence, "secret")), state.secretSha256)) {
        throw refuse("the activated credential is wrong: the AK is not in the TPM that holds the EK");
      }
      const quote = bytesField(evidence, "quote");
      const ak = readRsaPublic(unbase64(state.akPublic));
      const akKey = await crypto.subtle.importKey(
        "jwk",
        { kty: "RSA", n: base64url(ak.modulus), e: base64url(exponentBytes(ak.exponent)), alg: "RS256", ext: true },
        { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" },
        false,
        ["verify"],
      );
      if (!(await crypto.subtle.verify("RSASSA-PKCS1-v1_5", akKey, bytesField(evidence, "signature"), quote))) {
        throw refuse("the quote's signature does not verify with the AK");
      }
      const attest = tpmStructure(() => readAttest(quote));
      if (attest.magic !== TPM_GENERATED || attest.type !== TPM_ST_ATTEST_QUOTE) throw refuse("the signed structure is not a TPM quote");
      if (hex(attest.extraData) !== state.nonce) throw refuse("the quote is over another nonce");
      return {
        nodeId: `tpm-${state.ek.slice(0, 24)}`,
        role: request.role,
        labels: { ...options.labels, [TPM_EK_LABEL]: state.ek },
      };
    },
  });
}

/** The certificates of a PEM bundle; INVALID_CONFIG when it holds none or one does not parse. */
function parseCertificates(pem: string): pkijs.Certificate[] {
  const blocks = pemBlocks(pem, "CERTIFICATE");
  if (blocks.length === 0) throw invalidConfig("tpmAttestor: ekCaBundle holds no PEM certificate");
  return blocks.map((der, i) => {
    try {
      return pkijs.Certificate.fromBER(der);
    } catch (e) {
      throw invalidConfig(`tpmAttestor: certificate ${i + 1} of ekCaBundle does not parse: ${(e as Error).message}`);
    }
  });
}

function certificate(der: Uint8Array): pkijs.Certificate {
  try {
    return pkijs.Certificate.fromBER(der);
  } catch {
    throw refuse("evidence.ekCertificate is not a DER X.509 certificate");
  }
}

async function verifyChain(ekCert: pkijs.Certificate, trusted: pkijs.Certificate[], checkDate: Date): Promise<void> {
  const engine = new pkijs.CertificateChainValidationEngine({ trustedCerts: trusted, certs: [ekCert], checkDate });
  const result = await engine.verify().catch((e: unknown) => ({ result: false, resultMessage: (e as Error).message }));
  if (!result.result) throw refuse(`the EK certificate does not chain to a trusted CA: ${result.resultMessage}`);
}

/** A base64 field of the evidence, decoded; refused when missing or not base64. */
function bytesField(evidence: Record<string, unknown>, field: string): Uint8Array {
  const value = evidence[field];
  if (typeof value === "string" && value.length > 0) {
    try {
      return unbase64(value);
    } catch {
      // refused below
    }
  }
  throw refuse(`tpm evidence wants ${field} (base64)`);
}

function tpmStructure<T>(read: () => T): T {
  try {
    return read();
  } catch (e) {
    if (e instanceof TpmFormatError) throw refuse(`a TPM structure in the evidence is malformed: ${e.message}`);
    throw e;
  }
}

const exponentBytes = (e: number) => {
  const bytes = [(e >>> 24) & 0xff, (e >>> 16) & 0xff, (e >>> 8) & 0xff, e & 0xff];
  while (bytes.length > 1 && bytes[0] === 0) bytes.shift();
  return new Uint8Array(bytes);
};

const sha256 = async (bytes: Uint8Array) => hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)));
