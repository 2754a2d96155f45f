// Bearer JWTs from an identity provider, verified with jose against its JWK set.
import { env } from "cloudflare:workers";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { afterAll, beforeAll, expect, it } from "vitest";
import { betterCompute, builtinIam } from "better-compute";
import { createTestClient, type TestClient } from "better-compute/testing";

const issuer = "https://idp.example.test";
const audience = "better-compute";
let client: TestClient;
let sign: (claims: Record<string, unknown>, options?: { expiresIn?: string; issuer?: string }) => Promise<string>;
let forge: typeof sign;

beforeAll(async () => {
  const idp = await generateKeyPair("ES256");
  const stranger = await generateKeyPair("ES256");
  const jwk = { ...(await exportJWK(idp.publicKey)), kid: "idp-1", alg: "ES256" };
  const signer =
    (key: CryptoKey) =>
    (claims: Record<string, unknown>, options: { expiresIn?: string; issuer?: string } = {}) =>
      new SignJWT(claims)
        .setProtectedHeader({ alg: "ES256", kid: "idp-1" })
        .setIssuer(options.issuer ?? issuer)
        .setAudience(audience)
        .setSubject("alice")
        .setIssuedAt()
        .setExpirationTime(options.expiresIn ?? "5m")
        .sign(key);
  sign = signer(idp.privateKey);
  forge = signer(stranger.privateKey);
  const compute = betterCompute({ iam: builtinIam({ jwt: { issuer, audience, jwks: { keys: [jwk] } } }) });
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

it("accepts a valid token and takes the caller's roles from its claim", async () => {
  const res = await client.call("iam.whoami", {}, { key: await sign({ roles: ["viewer"] }) });
  expect(res).toMatchObject({ status: 200, body: { principal: "jwt:alice", roles: ["viewer"] } });
  const denied = await client.call("iam.apiKeys.create", { name: "x", roles: ["viewer"] }, { key: await sign({ roles: ["viewer"] }) });
  expect(denied.status).toBe(403);
});

it("refuses a token signed by another key, from another issuer, or expired", async () => {
  for (const token of [
    await forge({ roles: ["admin"] }),
    await sign({ roles: ["admin"] }, { issuer: "https://evil.test" }),
    await sign({ roles: ["admin"] }, { expiresIn: "-1m" }),
  ]) {
    const res = await client.call("iam.whoami", {}, { key: token });
    expect(res.status).toBe(401);
    expect(res.body).toEqual({
      code: "UNAUTHENTICATED",
      message: "the bearer token did not verify",
      requestId: res.headers.get("x-request-id"),
    });
  }
});
