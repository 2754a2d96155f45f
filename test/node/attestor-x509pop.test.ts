// x509pop, end to end: the real bcd CLI joins the real JoinService (test/support/attestor-plane.ts)
// with a certificate and its key, made by the test's own CA (test/support/x509.ts, pkijs), and
// every kind of bad evidence is refused with PERMISSION_DENIED, joining nothing.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { x509popAttestor } from "better-compute";
import { generateNodeKey, JOIN_PATH, joinMessage, signMessage } from "../../core/protocol.ts";
import { repoRoot } from "../../local/node-store.ts";
import { attestorPlane, bcd, type AttestorPlane } from "../support/attestor-plane.ts";
import { certificate, crl, pkcs8Pem, x509popEvidence, type Issued, type KeyKind } from "../support/x509.ts";

let plane: AttestorPlane;
let root: Issued;
let intermediate: Issued;
let revoked: Issued;
let staleRoot: Issued;
/** Where docs/attestors.md's openssl block ran. */
let openssl: string;
const temps: string[] = [];

/** The shell block of docs/attestors.md that makes a CA and machine certificates with openssl. */
function opensslBlock(): string {
  const doc = fs.readFileSync(path.join(repoRoot, "docs/attestors.md"), "utf8");
  const block = /```sh\n(# not run here: test\/node\/attestor-x509pop\.test\.ts[^\n]*\n[\s\S]*?)```/.exec(doc)?.[1];
  if (!block) throw new Error("docs/attestors.md has no openssl block for this test");
  return block;
}

beforeAll(async () => {
  // The CA, worker-7 and worker-8 (revoked) exactly as the docs make them.
  openssl = tempDir();
  execFileSync("bash", ["-e", "-c", opensslBlock()], { cwd: openssl, stdio: "pipe" });
  const read = (file: string) => fs.readFileSync(path.join(openssl, file), "utf8");

  root = await certificate("Test Root CA");
  intermediate = await certificate("Test Issuing CA", { issuer: root, ca: true });
  revoked = await certificate("revoked.example.test", { issuer: intermediate });
  staleRoot = await certificate("Stale CRL Root CA");
  plane = await attestorPlane([
    x509popAttestor({
      caBundle: root.pem + read("ca.pem"),
      crl: [await crl(intermediate, [revoked]), read("ca.crl")],
      labels: (cert) => ({ "example.com/org": cert.subject.O ?? "", "example.com/fingerprint": cert.fingerprint.slice(0, 16) }),
    }),
    // Another CA under another id, whose configured CRL is out of date.
    x509popAttestor({
      id: "x509pop-stale",
      caBundle: staleRoot.pem,
      crl: await crl(staleRoot, [], { nextUpdate: new Date(Date.now() - 60_000) }),
    }),
  ]);
}, 60_000);

afterAll(async () => {
  await plane?.stop();
  for (const dir of temps) fs.rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-x509pop-"));
  temps.push(dir);
  return dir;
}

/** bcd join --attestor x509pop with this chain (leaf first) and key, in a fresh state directory. */
async function join(chain: Issued[], key: CryptoKey) {
  const dir = tempDir();
  fs.writeFileSync(path.join(dir, "chain.pem"), chain.map((c) => c.pem).join(""));
  fs.writeFileSync(path.join(dir, "key.pem"), await pkcs8Pem(key), { mode: 0o600 });
  return joinWith(path.join(dir, "chain.pem"), path.join(dir, "key.pem"));
}

function joinWith(certFile: string, keyFile: string) {
  const args = ["join", "--url", plane.url, "--attestor", "x509pop", "--role", "node", "--state-dir", path.join(tempDir(), "state")];
  return bcd([...args, "--x509-cert", certFile, "--x509-key", keyFile]);
}

const x509Nodes = async () => (await plane.store.db.execute(sql`SELECT id FROM bc_nodes WHERE attestor LIKE 'x509pop%'`)).rows.length;

describe("x509pop", () => {
  it.each<KeyKind>(["ec", "rsa", "ed25519"])(
    "bcd joins with a %s certificate that chains to the CA bundle: node id from its bc://node URI, labels from its subject",
    async (kind) => {
      const leaf = await certificate(`worker-${kind}.example.test`, { issuer: intermediate, kind, uris: [`bc://node/worker-${kind}`] });
      const joined = await join([leaf, intermediate], leaf.keys.privateKey);
      expect(joined.code, joined.err).toBe(0);
      expect(joined.out).toContain(`joined as worker-${kind} (node)`);
      const node = await plane.call<{ role: string; attestor: string; labels: Record<string, string> }>("nodes.get", {
        node: `worker-${kind}`,
      });
      expect(node).toMatchObject({ role: "node", attestor: "x509pop" });
      expect(node.labels).toEqual({
        "bc.dev/x509-cn": `worker-${kind}.example.test`,
        "bc.dev/x509-serial": expect.stringMatching(/^[0-9a-f]+$/),
        "example.com/org": "Better Compute tests",
        "example.com/fingerprint": expect.stringMatching(/^[0-9a-f]{16}$/),
      });
    },
  );

  it("the openssl-made certificate of docs/attestors.md joins; the one its CRL revokes is refused", async () => {
    const joined = await joinWith(path.join(openssl, "worker-7.pem"), path.join(openssl, "worker-7.key"));
    expect(joined.code, joined.err).toBe(0);
    expect(joined.out).toContain("joined as worker-7 (node)");
    expect(await plane.call("nodes.get", { node: "worker-7" })).toMatchObject({
      attestor: "x509pop",
      labels: { "bc.dev/x509-cn": "worker-7.example.com", "example.com/org": "Example" },
    });
    const refused = await joinWith(path.join(openssl, "worker-8.pem"), path.join(openssl, "worker-8.key"));
    expect(refused.code).toBe(1);
    expect(refused.err).toContain(
      "bcd: join failed: PERMISSION_DENIED: the certificate CN=worker-8.example.com is revoked by its issuer's CRL",
    );
    await expect(plane.call("nodes.get", { node: "worker-8" })).rejects.toMatchObject({ code: "NOT_FOUND" });
  });

  it("a certificate without a bc://node URI joins as a new node", async () => {
    const leaf = await certificate("anonymous.example.test", { issuer: intermediate });
    const joined = await join([leaf, intermediate], leaf.keys.privateKey);
    expect(joined.code, joined.err).toBe(0);
    expect(joined.out).toMatch(/joined as n-[0-9a-f]{16} \(node\)/);
  });

  it("refuses an expired certificate, a revoked one, one from another CA, and a proof by another key", async () => {
    const before = await x509Nodes();
    const expired = await certificate("expired.example.test", {
      issuer: intermediate,
      notBefore: new Date(Date.now() - 10 * 86_400_000),
      notAfter: new Date(Date.now() - 86_400_000),
    });
    const otherRoot = await certificate("Test Root CA"); // the same name, another key
    const otherIntermediate = await certificate("Test Issuing CA", { issuer: otherRoot, ca: true });
    const foreign = await certificate("foreign.example.test", { issuer: otherIntermediate });
    const good = await certificate("good.example.test", { issuer: intermediate });
    const stranger = await certificate("stranger.example.test", { issuer: intermediate });

    const cases: Array<[string, Issued[], CryptoKey, string]> = [
      ["expired", [expired, intermediate], expired.keys.privateKey, "either not yet valid or expired"],
      ["revoked", [revoked, intermediate], revoked.keys.privateKey, "CN=revoked.example.test is revoked by its issuer's CRL"],
      ["wrong chain", [foreign, otherIntermediate], foreign.keys.privateKey, "does not chain to the configured CA bundle"],
      ["self-signed", [otherRoot], otherRoot.keys.privateKey, "does not chain to the configured CA bundle"],
      ["wrong key", [good, intermediate], stranger.keys.privateKey, "the proof is not signed by the certificate's key"],
    ];
    for (const [what, chain, key, reason] of cases) {
      const refused = await join(chain, key);
      expect(refused.code, what).toBe(1);
      expect(refused.err, what).toContain("bcd: join failed: PERMISSION_DENIED: ");
      expect(refused.err, what).toContain(reason);
      expect(refused.err, what).toContain("(HTTP 403)");
    }
    expect(await x509Nodes()).toBe(before);
  }, 120_000);

  it("refuses a proof made for another join key, a stale one, and any certificate of an issuer whose CRL is out of date", async () => {
    const leaf = await certificate("replayed.example.test", { issuer: intermediate });
    const mine = await generateNodeKey();
    const thief = await generateNodeKey();
    const signed = async (key: typeof mine, attestor: string, evidence: Record<string, unknown>) =>
      plane.post(JOIN_PATH, {
        attestor,
        evidence,
        publicKey: key.publicKey,
        role: "node",
        signature: await signMessage(key.privateKey, await joinMessage(key.publicKey, attestor, evidence)),
      });

    // A captured proof is bound to the key that made it.
    const captured = await x509popEvidence([leaf, intermediate], mine.publicKey);
    const stolen = await signed(thief, "x509pop", captured);
    expect(stolen).toMatchObject({
      status: 403,
      body: { code: "PERMISSION_DENIED", message: "the proof is not signed by the certificate's key" },
    });

    // Time is the database's: an hour-old proof, or a fresh one once the clock moved on.
    const old = await x509popEvidence([leaf, intermediate], mine.publicKey, { timestamp: new Date(Date.now() - 3600_000).toISOString() });
    expect((await signed(mine, "x509pop", old)).body).toMatchObject({
      code: "PERMISSION_DENIED",
      message: expect.stringContaining("timestamp"),
    });
    await plane.advanceClock(3600);
    try {
      const fresh = await x509popEvidence([leaf, intermediate], mine.publicKey);
      expect((await signed(mine, "x509pop", fresh)).body).toMatchObject({
        code: "PERMISSION_DENIED",
        message: expect.stringContaining("timestamp"),
      });
    } finally {
      await plane.advanceClock(-3600);
    }

    // The stale CRL: its issuer's certificates are refused until the attestor gets a current one.
    const underStale = await certificate("under-stale.example.test", { issuer: staleRoot });
    const stale = await signed(mine, "x509pop-stale", await x509popEvidence([underStale], mine.publicKey));
    expect(stale.body).toMatchObject({ code: "PERMISSION_DENIED", message: expect.stringContaining("past its nextUpdate") });

    // Malformed evidence is refused the same way.
    for (const evidence of [{}, { certificates: ["not der"], timestamp: new Date().toISOString(), signature: "x" }]) {
      expect((await signed(mine, "x509pop", evidence)).status).toBe(403);
    }
    // And the genuine proof, with its own key, joins.
    expect((await signed(mine, "x509pop", await x509popEvidence([leaf, intermediate], mine.publicKey))).status).toBe(200);
  });

  it("refuses a CA bundle or CRL that does not parse when betterCompute() runs (INVALID_CONFIG)", () => {
    expect(() => x509popAttestor({ caBundle: "" })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
    expect(() => x509popAttestor({ caBundle: root.pem, crl: "not a crl" })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
  });
});
