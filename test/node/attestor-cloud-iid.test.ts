// cloud-iid, end to end: the real bcd CLI fetches GCP's instance identity token from a metadata
// endpoint and joins the real JoinService (test/support/attestor-plane.ts) with it; every kind of
// bad token is refused with PERMISSION_DENIED, joining nothing.
// SIMULATED: the GCP metadata server (a node:http endpoint here, speaking its identity path and
// Metadata-Flavor header) and Google's signing key (the test's own RSA key, in the attestor's JWKS).
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { exportJWK, generateKeyPair, SignJWT, type JWTPayload } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cloudIidAttestor } from "better-compute";
import { generateNodeKey, JOIN_PATH, joinMessage, signMessage } from "../../core/protocol.ts";
import { attestorPlane, bcd, type AttestorPlane } from "../support/attestor-plane.ts";

const AUDIENCE = "https://compute.example.test";
const PROJECT = "bc-test-project";
const IDENTITY_PATH = "/computeMetadata/v1/instance/service-accounts/default/identity";

type Signer = Awaited<ReturnType<typeof generateKeyPair>>["privateKey"];
let google: Signer;
let impostor: Signer;
let plane: AttestorPlane;
let metadata: Server;
let metadataUrl: string;
/** What the fake metadata server answers: a token for the audience it is asked for, made by this. */
let mint: (audience: string) => Promise<string>;
/** The audiences the metadata server was asked for, and the tokens it gave. */
const issued: Array<{ audience: string; token: string }> = [];
const temps: string[] = [];

const instance = (overrides: Record<string, unknown> = {}) => ({
  instance_creation_timestamp: 1_760_000_000,
  instance_id: "4567890123456789012",
  instance_name: "web-1",
  project_id: PROJECT,
  project_number: 424242424242,
  zone: "europe-west1-b",
  ...overrides,
});

/** A token like the metadata server's (format=full), signed by key with kid "google-1". */
function gcpToken(key: Signer, claims: JWTPayload & { aud: string }, lifetime = { from: 0, to: 3600 }): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ azp: "117", google: { compute_engine: instance() }, ...claims })
    .setProtectedHeader({ alg: "RS256", kid: "google-1", typ: "JWT" })
    .setIssuer("https://accounts.google.com")
    .setSubject("117")
    .setIssuedAt(now + lifetime.from)
    .setExpirationTime(now + lifetime.to)
    .sign(key);
}

const honest = (audience: string) => gcpToken(google, { aud: audience });

beforeAll(async () => {
  ({ privateKey: google } = await generateKeyPair("RS256", { extractable: true }));
  ({ privateKey: impostor } = await generateKeyPair("RS256"));
  const jwk = await exportJWK(google);
  const publicJwk = { kty: jwk.kty!, n: jwk.n!, e: jwk.e!, kid: "google-1", alg: "RS256", use: "sig" };
  plane = await attestorPlane([cloudIidAttestor({ gcp: { jwks: { keys: [publicJwk] }, audience: AUDIENCE, projects: [PROJECT] } })]);

  mint = honest;
  metadata = createServer((req, res) => {
    const url = new URL(req.url!, "http://metadata");
    if (req.headers["metadata-flavor"] !== "Google") return void res.writeHead(403).end("Missing Metadata-Flavor:Google header.");
    if (url.pathname !== IDENTITY_PATH || url.searchParams.get("format") !== "full") return void res.writeHead(404).end();
    const audience = url.searchParams.get("audience")!;
    void mint(audience).then((token) => {
      issued.push({ audience, token });
      res.writeHead(200, { "content-type": "text/html" }).end(token);
    });
  });
  await new Promise<void>((resolve) => metadata.listen(0, "127.0.0.1", resolve));
  metadataUrl = `http://127.0.0.1:${(metadata.address() as AddressInfo).port}${IDENTITY_PATH}`;
}, 60_000);

afterAll(async () => {
  metadata?.closeAllConnections();
  await new Promise((resolve) => metadata?.close(resolve));
  await plane?.stop();
  for (const dir of temps) fs.rmSync(dir, { recursive: true, force: true });
});

function stateDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-cloud-iid-"));
  temps.push(dir);
  return dir;
}

const join = (state: string) =>
  bcd([
    "join",
    ...["--url", plane.url, "--attestor", "cloud-iid", "--role", "node", "--state-dir", state],
    ...["--audience", AUDIENCE, "--metadata-url", metadataUrl],
  ]);

const iidNodes = async () => (await plane.store.db.execute(sql`SELECT id FROM bc_nodes WHERE attestor = 'cloud-iid'`)).rows.length;

describe("cloud-iid (GCP instance identity)", () => {
  it("bcd joins with the metadata server's token, bound to its join key and a nonce; the instance's labels come from the token", async () => {
    mint = honest;
    const state = stateDir();
    const joined = await join(state);
    expect(joined.code, joined.err).toBe(0);
    const nodeId = /^joined as (\S+) \(node\)/.exec(joined.out)?.[1];
    expect(nodeId).toBeDefined();
    const node = await plane.call<{ attestor: string; labels: Record<string, string>; publicKey?: string }>("nodes.get", { node: nodeId });
    expect(node).toMatchObject({ attestor: "cloud-iid" });
    expect(node.labels).toEqual({
      "bc.dev/cloud": "gcp",
      "bc.dev/gcp-instance-id": "4567890123456789012",
      "bc.dev/gcp-instance-name": "web-1",
      "bc.dev/gcp-project": PROJECT,
      "bc.dev/gcp-zone": "europe-west1-b",
    });
    // bcd asked for the configured audience, bound to its own key and a fresh nonce.
    const key = (await plane.store.db.execute(sql`SELECT public_key FROM bc_nodes WHERE id = ${nodeId!}`)).rows[0] as {
      public_key: string;
    };
    expect(issued.at(-1)!.audience).toMatch(new RegExp(`^${AUDIENCE}#bc-join/v1/${key.public_key}/[A-Za-z0-9_-]{22}$`));
    // The token is sent once: not in bcd's output or state.
    const token = issued.at(-1)!.token;
    expect(joined.out + joined.err).not.toContain(token.split(".")[2]);
    for (const file of fs.readdirSync(state)) expect(fs.readFileSync(path.join(state, file), "utf8")).not.toContain(token.split(".")[2]);
  });

  it("refuses a token with a bad signature, for another audience, expired, of another project, or replayed", async () => {
    const before = await iidNodes();
    const cases: Array<[string, (audience: string) => Promise<string>, string]> = [
      [
        "signed by another key",
        (aud) => gcpToken(impostor, { aud }),
        "the instance identity token is refused: its signature does not verify",
      ],
      [
        "another audience",
        (aud) => gcpToken(google, { aud: aud.replace(AUDIENCE, "https://elsewhere.example.test") }),
        "the instance identity token is for another audience",
      ],
      ["expired", (aud) => gcpToken(google, { aud }, { from: -7200, to: -3600 }), "the instance identity token is refused: it expired"],
      [
        "another project",
        (aud) => gcpToken(google, { aud, google: { compute_engine: instance({ project_id: "someone-else" }) } }),
        "instances of project someone-else may not join",
      ],
    ];
    for (const [what, token, reason] of cases) {
      mint = token;
      const refused = await join(stateDir());
      expect(refused.code, what).toBe(1);
      expect(refused.err, what).toContain(`bcd: join failed: PERMISSION_DENIED: ${reason}`);
      expect(refused.err, what).toContain("(HTTP 403)");
    }
    expect(await iidNodes()).toBe(before);

    // Replay: the same machine (same key) presents the token it joined with once more (same
    // instance id and nonce), as a copy of its evidence would.
    mint = honest;
    const state = stateDir();
    expect((await join(state)).code).toBe(0);
    const used = issued.at(-1)!.token;
    mint = async () => used;
    const replayed = await join(state);
    expect(replayed.code).toBe(1);
    expect(replayed.err).toContain(
      "bcd: join failed: PERMISSION_DENIED: instance 4567890123456789012 already joined with this nonce: a replayed token",
    );
    expect(await iidNodes()).toBe(before + 1);
  }, 120_000);

  it("refuses a token bound to another join key, and evidence that is not a token", async () => {
    mint = honest;
    const victim = stateDir();
    expect((await join(victim)).code).toBe(0);
    const stolen = issued.at(-1)!.token;
    const thief = await generateNodeKey();
    const post = (evidence: Record<string, unknown>) =>
      joinMessage(thief.publicKey, "cloud-iid", evidence)
        .then((message) => signMessage(thief.privateKey, message))
        .then((signature) =>
          plane.post(JOIN_PATH, { attestor: "cloud-iid", evidence, publicKey: thief.publicKey, role: "node", signature }),
        );
    expect(await post({ provider: "gcp", token: stolen })).toMatchObject({
      status: 403,
      body: { code: "PERMISSION_DENIED", message: "the instance identity token was issued for another join key" },
    });
    for (const evidence of [{}, { provider: "aws", token: stolen }, { provider: "gcp", token: "a.b.c" }]) {
      expect(await post(evidence)).toMatchObject({ status: 403, body: { code: "PERMISSION_DENIED" } });
    }
  });

  it("refuses a configuration without a provider, or with an audience bcd cannot bind (INVALID_CONFIG)", () => {
    expect(() => cloudIidAttestor({})).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
    expect(() => cloudIidAttestor({ gcp: { jwks: { keys: [] }, audience: "https://x#y" } })).toThrow(
      expect.objectContaining({ code: "INVALID_CONFIG" }),
    );
  });
});
