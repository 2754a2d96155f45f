// The `tpm` evidence producer: tpm2-tools against the machine's TPM (or swtpm, through the TCTI).
// It reads the EK certificate from its NV index, makes the EK (TCG default RSA template) and a
// fresh AK, asks the control plane for a challenge, activates the credential and quotes over the
// nonce; what it returns is the join's evidence. docs/attestor-tpm.md has the protocol.
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { base64, unbase64 } from "../../core/encoding.ts";
import { CHALLENGE_PATH, challengeResponse, type ChallengeRequest } from "../../core/protocol.ts";
import { AgentError, errorFromResponse } from "../contracts.ts";
import { flag, type EvidenceProducer } from "./producer.ts";

/** The TCG's NV index of the RSA 2048 EK certificate. */
export const EK_CERT_NV_INDEX = "0x01c00002";
/** The TPM's resource manager (the kernel's): tpm2-tools' usual TCTI on a real machine. */
export const DEFAULT_TCTI = "device:/dev/tpmrm0";

export interface TpmEvidenceOptions {
  /** The control plane (its JoinService). */
  baseUrl: string;
  /** The agent's key and role: the challenge is bound to the key, and only a join it signs can answer it. */
  publicKey: string;
  role: ChallengeRequest["role"];
  /** tpm2-tools' TCTI (TPM2TOOLS_TCTI): default device:/dev/tpmrm0; swtpm:path=SOCKET for swtpm. */
  tcti?: string;
  fetch?: typeof fetch;
}

/** bcd's `--attestor tpm`: the TPM is found through --tpm-tcti, else $TPM2TOOLS_TCTI, else the kernel's resource manager. */
export const tpmProducer: EvidenceProducer = {
  flags: { "tpm-tcti": { type: "string" } },
  usage: `[--tpm-tcti TCTI]   tpm2-tools' TCTI (default $TPM2TOOLS_TCTI or ${DEFAULT_TCTI}; swtpm:path=SOCKET for swtpm)`,
  async produce(ctx) {
    const tcti = flag(ctx, "tpm-tcti") ?? ctx.env.TPM2TOOLS_TCTI ?? DEFAULT_TCTI;
    return tpmEvidence({ baseUrl: ctx.url, publicKey: await ctx.publicKey(), role: ctx.role, tcti, fetch: ctx.fetch });
  },
};

/** Runs the TPM side of the protocol and returns the join's evidence (it answers one challenge, once). */
export async function tpmEvidence(opts: TpmEvidenceOptions): Promise<Record<string, unknown>> {
  const dir = await mkdtemp(path.join(tmpdir(), "bcd-tpm-"));
  const file = (name: string) => path.join(dir, name);
  const tpm = tpmTools(opts.tcti ?? DEFAULT_TCTI, dir);
  try {
    // Without a resource manager (swtpm, /dev/tpm0) objects stay loaded between tools: flush them.
    await tpm.flushTransient();
    await tpm.run("tpm2_nvread", EK_CERT_NV_INDEX, "-C", "o", "-o", file("ek.der"));
    await tpm.run("tpm2_createek", "-c", file("ek.ctx"), "-G", "rsa", "-u", file("ek.pub"));
    await tpm.flushTransient();
    // A restricted RSASSA-SHA256 signing key under the EK: what the attestor accepts.
    await tpm.run(
      "tpm2_createak",
      ...["-C", file("ek.ctx"), "-c", file("ak.ctx"), "-G", "rsa", "-g", "sha256", "-s", "rsassa"],
      "-u",
      file("ak.pub"),
    );
    await tpm.flushTransient();

    const request: ChallengeRequest = {
      attestor: "tpm",
      evidence: { ekCertificate: base64(await readFile(file("ek.der"))), akPublic: base64(await readFile(file("ak.pub"))) },
      publicKey: opts.publicKey,
      role: opts.role,
    };
    const { challengeId, challenge } = await askChallenge(opts, request);
    const { idObject, encryptedSecret, nonce } = challenge as Record<string, unknown>;
    if (typeof idObject !== "string" || typeof encryptedSecret !== "string" || typeof nonce !== "string" || !/^[0-9a-f]+$/.test(nonce)) {
      throw new AgentError("BAD_RESPONSE", "the tpm challenge wants { idObject, encryptedSecret, nonce }");
    }

    // tpm2-tools' credential file: magic, version 1, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET.
    await writeFile(
      file("credential"),
      Buffer.concat([Buffer.from("badcc0de00000001", "hex"), unbase64(idObject), unbase64(encryptedSecret)]),
    );
    // The EK's policy wants the endorsement hierarchy's authorization: a policy session.
    await tpm.run("tpm2_startauthsession", "--policy-session", "-S", file("session.ctx"));
    try {
      await tpm.run("tpm2_policysecret", "-S", file("session.ctx"), "-c", "e");
      await tpm.run(
        "tpm2_activatecredential",
        "-c",
        file("ak.ctx"),
        "-C",
        file("ek.ctx"),
        "-i",
        file("credential"),
        "-o",
        file("secret"),
        "-P",
        `session:${file("session.ctx")}`,
      );
    } finally {
      await tpm.run("tpm2_flushcontext", file("session.ctx")).catch(() => undefined);
      await tpm.flushTransient();
    }
    await tpm.run(
      "tpm2_quote",
      "-c",
      file("ak.ctx"),
      "-l",
      "sha256:0",
      "-q",
      nonce,
      "-g",
      "sha256",
      "-m",
      file("quote"),
      "-s",
      file("signature"),
      "-f",
      "plain",
    );
    await tpm.flushTransient();

    return {
      challengeId,
      secret: base64(await readFile(file("secret"))),
      quote: base64(await readFile(file("quote"))),
      signature: base64(await readFile(file("signature"))),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function askChallenge(opts: TpmEvidenceOptions, request: ChallengeRequest) {
  const url = opts.baseUrl.replace(/\/+$/, "") + CHALLENGE_PATH;
  let res: Response;
  try {
    res = await (opts.fetch ?? fetch)(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(request),
    });
  } catch (e) {
    throw new AgentError("UNAVAILABLE", `tpm challenge: cannot reach ${new URL(url).origin}: ${(e as Error).message}`);
  }
  if (!res.ok) throw await errorFromResponse(res, "the tpm challenge");
  const parsed = challengeResponse.safeParse(await res.json().catch(() => undefined));
  if (!parsed.success) throw new AgentError("BAD_RESPONSE", "the challenge response is not a challenge");
  return parsed.data;
}

/** tpm2-tools with the TCTI set; their output is kept out of the logs (activatecredential prints the secret). */
function tpmTools(tcti: string, cwd: string) {
  const run = (tool: string, ...args: string[]) =>
    new Promise<void>((resolve, reject) => {
      execFile(tool, args, { cwd, env: { ...process.env, TPM2TOOLS_TCTI: tcti } }, (error, _stdout, stderr) => {
        if (!error) return resolve();
        if ((error as NodeJS.ErrnoException).code === "ENOENT") {
          return reject(
            new AgentError("UNSUPPORTED", `${tool} not found: the tpm attestor needs tpm2-tools (Debian: apt-get install tpm2-tools)`),
          );
        }
        const detail = stderr.trim().split("\n").filter(Boolean).slice(-2).join("; ");
        reject(new AgentError("DRIVER_ERROR", `${tool} failed (TCTI ${tcti}): ${detail || error.message}`));
      });
    });
  return { run, flushTransient: () => run("tpm2_flushcontext", "-t") };
}
