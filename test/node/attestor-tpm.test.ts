// The tpm attestor against a real TPM: swtpm (socket mode, in a temporary directory), its EK
// certificate made by swtpm_setup with a local CA this test owns, tpm2-tools driven by bcd's
// producer. The control plane is the real betterCompute JoinService on PGlite, served over HTTP;
// `bcd join --attestor tpm` runs as a process of its own. Each kind of bad evidence is refused
// with PERMISSION_DENIED: an EK from another CA, a wrong activated secret, a quote over another
// nonce, a tampered quote, a replayed or expired challenge, a challenge answered by another key.
// SIMULATED: the TPM is swtpm (a software TPM; the protocol and the tools are the real ones).
// Skipped, with the reason printed, only where swtpm or tpm2-tools cannot be found.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { X509Certificate, createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tpmAttestor, TPM_EK_LABEL } from "better-compute";
import { tpmEvidence } from "../../agent/attestation/tpm.ts";
import { AgentError } from "../../agent/contracts.ts";
import { base64, unbase64 } from "../../core/encoding.ts";
import { generateNodeKey, JOIN_PATH, joinMessage, signMessage, type NodeKeyPair } from "../../core/protocol.ts";
import { attestorPlane, bcd, type AttestorPlane } from "../support/attestor-plane.ts";

const TOOLS = ["swtpm", "swtpm_setup", "swtpm_localca", "tpm2_createak", "tpm2_activatecredential", "tpm2_quote", "tpm2_nvread"];
const missing = TOOLS.filter((tool) => {
  try {
    execFileSync("sh", ["-c", `command -v ${tool}`], { stdio: "ignore" });
    return false;
  } catch {
    return true;
  }
});
if (missing.length > 0) {
  console.log(
    `attestor-tpm: SKIPPED, not found: ${missing.join(", ")} (Debian: apt-get install swtpm swtpm-tools tpm2-tools libtss2-tcti-swtpm0)`,
  );
}

const temps: string[] = [];
const cleanup: Array<() => Promise<unknown> | void> = [];

interface Tpm {
  tcti: string;
  /** The CA that issued its EK certificate (root and issuer, PEM). */
  caBundle: string;
  /** The EK certificate's public key, SHA-256 of its SPKI DER (what the node's label holds). */
  ekDigest: string;
}

/** A manufactured swtpm: EK certificate in its NV index from a fresh local CA, served on a Unix socket. */
async function startSwtpm(): Promise<Tpm> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-tpm-"));
  temps.push(dir);
  const ca = path.join(dir, "ca");
  const state = path.join(dir, "state");
  fs.mkdirSync(ca);
  fs.mkdirSync(state);
  const file = (name: string, text: string) => (fs.writeFileSync(path.join(ca, name), text), path.join(ca, name));
  const localca = file(
    "localca.conf",
    `statedir = ${ca}\nsigningkey = ${ca}/signkey.pem\nissuercert = ${ca}/issuercert.pem\ncertserial = ${ca}/certserial\n`,
  );
  const options = file("localca.options", "--platform-manufacturer BetterCompute\n--platform-version 2.1\n--platform-model test\n");
  const setup = file(
    "swtpm_setup.conf",
    `create_certs_tool = swtpm_localca\ncreate_certs_tool_config = ${localca}\ncreate_certs_tool_options = ${options}\nactive_pcr_banks = sha256\n`,
  );
  execFileSync("swtpm_setup", ["--tpm2", "--tpmstate", state, "--create-ek-cert", "--config", setup, "--overwrite"], { stdio: "pipe" });

  const socket = path.join(dir, "tpm.sock");
  // The swtpm TCTI finds the control channel at <socket>.ctrl.
  const child: ChildProcess = spawn(
    "swtpm",
    [
      ...["socket", "--tpm2", "--tpmstate", `dir=${state}`, "--flags", "not-need-init,startup-clear"],
      ...["--server", `type=unixio,path=${socket}`, "--ctrl", `type=unixio,path=${socket}.ctrl`],
    ],
    { stdio: "ignore" },
  );
  cleanup.push(() => void child.kill("SIGKILL"));
  for (let i = 0; i < 100 && !(fs.existsSync(socket) && fs.existsSync(`${socket}.ctrl`)); i++) await new Promise((r) => setTimeout(r, 50));
  const tcti = `swtpm:path=${socket}`;

  const ekDer = path.join(dir, "ek.der");
  execFileSync("tpm2_nvread", ["0x01c00002", "-C", "o", "-o", ekDer], { env: { ...process.env, TPM2TOOLS_TCTI: tcti }, stdio: "pipe" });
  const spki = new X509Certificate(fs.readFileSync(ekDer)).publicKey.export({ type: "spki", format: "der" });
  return {
    tcti,
    caBundle:
      fs.readFileSync(path.join(ca, "swtpm-localca-rootca-cert.pem"), "utf8") + fs.readFileSync(path.join(ca, "issuercert.pem"), "utf8"),
    ekDigest: createHash("sha256").update(spki).digest("hex"),
  };
}

describe.skipIf(missing.length > 0)("tpm attestor (swtpm)", () => {
  let trustedTpm: Tpm;
  let untrustedTpm: Tpm;
  let plane: AttestorPlane;

  beforeAll(async () => {
    // Two machines: one whose TPM vendor (its CA) the deployment trusts, one from another vendor.
    trustedTpm = await startSwtpm();
    untrustedTpm = await startSwtpm();
    plane = await attestorPlane([tpmAttestor({ ekCaBundle: trustedTpm.caBundle, labels: { rack: "r1" } })]);
    cleanup.push(() => plane.stop());
  }, 60_000);

  afterAll(async () => {
    for (const step of cleanup.reverse()) await step();
    for (const dir of temps) fs.rmSync(dir, { recursive: true, force: true });
  });

  /** A join as the agent sends it: signed by its key, with the evidence given. */
  async function join(key: NodeKeyPair, evidence: Record<string, unknown>) {
    const res = await fetch(plane.url + JOIN_PATH, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        attestor: "tpm",
        evidence,
        publicKey: key.publicKey,
        role: "node",
        signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, "tpm", evidence)),
      }),
    });
    return { status: res.status, body: (await res.json()) as { nodeId?: string; code?: string; message?: string } };
  }

  /** The producer's evidence for this key, from this TPM; `tamper` may change the challenge on its way to the agent. */
  function evidenceFrom(tpm: Tpm, key: NodeKeyPair, tamper?: (challenge: Record<string, unknown>) => void) {
    const tampering: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!tamper || !res.ok) return res;
      const body = (await res.json()) as { challenge: Record<string, unknown> };
      tamper(body.challenge);
      return Response.json(body);
    };
    return tpmEvidence({ baseUrl: plane.url, publicKey: key.publicKey, role: "node", tcti: tpm.tcti, fetch: tampering });
  }

  it("bcd join --attestor tpm joins the machine as the node its EK names, with the EK label", async () => {
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-tpm-bcd-"));
    temps.push(stateDir);
    const joined = await bcd([
      "join",
      "--url",
      plane.url,
      "--role",
      "node",
      "--state-dir",
      stateDir,
      "--attestor",
      "tpm",
      "--tpm-tcti",
      trustedTpm.tcti,
    ]);
    expect(joined.code, joined.err).toBe(0);

    const nodeId = `tpm-${trustedTpm.ekDigest.slice(0, 24)}`;
    const nodes = await plane.store.db.execute(sql`SELECT id, role, attestor, labels FROM bc_nodes`);
    expect(nodes.rows).toEqual([
      { id: nodeId, role: "node", attestor: "tpm", labels: { rack: "r1", [TPM_EK_LABEL]: trustedTpm.ekDigest } },
    ]);
    // The challenge is used up, and what the control plane kept of it holds no secret.
    const challenges = await plane.store.db.execute(sql`SELECT state, consumed_at IS NOT NULL AS consumed FROM bc_attestation_challenges`);
    expect(challenges.rows).toHaveLength(1);
    expect(challenges.rows[0]).toMatchObject({ consumed: true });
    expect(Object.keys((challenges.rows[0] as { state: object }).state).sort()).toEqual(["akPublic", "ek", "nonce", "secretSha256"]);

    // The same TPM with a new agent key (a reinstalled machine) joins as the same node.
    const key = await generateNodeKey();
    const rejoined = await join(key, await evidenceFrom(trustedTpm, key));
    expect(rejoined).toMatchObject({ status: 200, body: { nodeId } });
  });

  it("refuses a TPM whose EK certificate another CA issued, before any challenge", async () => {
    const key = await generateNodeKey();
    const refused = await evidenceFrom(untrustedTpm, key).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(AgentError);
    expect(refused).toMatchObject({
      code: "PERMISSION_DENIED",
      status: 403,
      message: expect.stringMatching(/does not chain to a trusted CA/),
    });
  });

  it("refuses a wrong activated secret and a tampered quote", async () => {
    const key = await generateNodeKey();
    const evidence = await evidenceFrom(trustedTpm, key);
    const wrongSecret = await join(key, { ...evidence, secret: base64(crypto.getRandomValues(new Uint8Array(32))) });
    expect(wrongSecret).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(wrongSecret.body.message).toMatch(/activated credential is wrong/);

    const fresh = await evidenceFrom(trustedTpm, key);
    const quote = unbase64(fresh.quote as string);
    quote[quote.length - 1]! ^= 1; // one bit of the PCR digest
    const tampered = await join(key, { ...fresh, quote: base64(quote) });
    expect(tampered).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(tampered.body.message).toMatch(/signature does not verify/);
  });

  it("refuses a quote over another nonce", async () => {
    const key = await generateNodeKey();
    // The agent is handed another nonce on the way (its TPM quotes what it is given).
    const evidence = await evidenceFrom(trustedTpm, key, (challenge) => (challenge.nonce = "00".repeat(32)));
    const refused = await join(key, evidence);
    expect(refused).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(refused.body.message).toMatch(/quote is over another nonce/);
  });

  it("a challenge is single-use, short-lived and answered only by the key it was issued to", async () => {
    const key = await generateNodeKey();
    const evidence = await evidenceFrom(trustedTpm, key);
    const other = await join(await generateNodeKey(), evidence);
    expect(other).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(other.body.message).toMatch(/issued to another key/);

    const fresh = await evidenceFrom(trustedTpm, key);
    expect((await join(key, fresh)).status).toBe(200);
    const replayed = await join(key, fresh);
    expect(replayed).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(replayed.body.message).toMatch(/already answered/);

    const late = await evidenceFrom(trustedTpm, key);
    await plane.advanceClock(600);
    const expired = await join(key, late);
    await plane.advanceClock(-600);
    expect(expired).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    expect(expired.body.message).toMatch(/challenge expired/);
  });
});
