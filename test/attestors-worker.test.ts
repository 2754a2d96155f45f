// The x509pop and cloud-iid attestors in workerd: pkijs' chain and CRL checks and jose's RS256
// verification run on the Worker's WebCrypto, through the real JoinService (test/node/attestor-*.test.ts
// join with the real bcd in Node and refuse every kind of bad evidence).
import { env } from "cloudflare:workers";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { afterAll, beforeAll, expect, it } from "vitest";
import { betterCompute, cloudIidAttestor, x509popAttestor } from "better-compute";
import { cloudIidAudience } from "../core/agents/cloud-iid.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { generateNodeKey, JOIN_PATH, joinMessage, signMessage } from "../core/protocol.ts";
import { certificate, crl, x509popEvidence, type Issued } from "./support/x509.ts";

const AUDIENCE = "https://compute.example.test";
let client: TestClient;
let root: Issued;
let issuing: Issued;
let revoked: Issued;
let google: Awaited<ReturnType<typeof generateKeyPair>>["privateKey"];

beforeAll(async () => {
  root = await certificate("Worker Root CA");
  issuing = await certificate("Worker Issuing CA", { issuer: root, ca: true });
  revoked = await certificate("revoked.worker.test", { issuer: issuing });
  const pair = await generateKeyPair("RS256", { extractable: true });
  google = pair.privateKey;
  const jwk = { ...(await exportJWK(pair.publicKey)), kid: "g1", alg: "RS256" };
  const compute = betterCompute({
    attestors: [
      x509popAttestor({ caBundle: root.pem, crl: await crl(issuing, [revoked]) }),
      cloudIidAttestor({ gcp: { jwks: { keys: [jwk] }, audience: AUDIENCE } }),
    ],
  });
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

async function join(attestor: string, evidence: (publicKey: string) => Promise<Record<string, unknown>>) {
  const key = await generateNodeKey();
  const presented = await evidence(key.publicKey);
  const res = await client.request(JOIN_PATH, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      attestor,
      evidence: presented,
      publicKey: key.publicKey,
      role: "node",
      signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, attestor, presented)),
    }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

it("x509pop verifies a chain, its CRL and the proof on the Worker's WebCrypto", async () => {
  const leaf = await certificate("w1.worker.test", { issuer: issuing, kind: "rsa", uris: ["bc://node/worker-x509-w1"] });
  expect(await join("x509pop", (k) => x509popEvidence([leaf, issuing], k))).toMatchObject({
    status: 200,
    body: { nodeId: "worker-x509-w1", role: "node" },
  });
  expect((await client.call("nodes.get", { node: "worker-x509-w1" })).body.labels).toMatchObject({ "bc.dev/x509-cn": "w1.worker.test" });
  const refused = await join("x509pop", (k) => x509popEvidence([revoked, issuing], k));
  expect(refused).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED", message: expect.stringContaining("revoked") } });
});

it("cloud-iid verifies GCP's RS256 identity token on the Worker", async () => {
  const token = (publicKey: string, key = google) =>
    new SignJWT({ google: { compute_engine: { instance_id: "99", project_id: "p" } } })
      .setProtectedHeader({ alg: "RS256", kid: "g1" })
      .setIssuer("https://accounts.google.com")
      .setAudience(cloudIidAudience(AUDIENCE, publicKey, crypto.randomUUID().replaceAll("-", "")))
      .setIssuedAt()
      .setExpirationTime("1h")
      .sign(key);
  const joined = await join("cloud-iid", async (k) => ({ provider: "gcp", token: await token(k) }));
  expect(joined).toMatchObject({ status: 200, body: { role: "node" } });
  const other = (await generateKeyPair("RS256")).privateKey;
  const forged = await join("cloud-iid", async (k) => ({ provider: "gcp", token: await token(k, other) }));
  expect(forged).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED", message: expect.stringContaining("signature") } });
});
