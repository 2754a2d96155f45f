// The site agent's site.httpProxy command (agent/roles/http-proxy.ts, plugins/metal/http-proxy.ts)
// against real local servers: HTTPS with a self-signed certificate made by openssl at the start
// (testing/tls.ts; pinned by its SPKI, as the control plane pins a machine's), and plain HTTP. The pin is checked
// before anything is sent, redirects are refused, answers are capped, refusals reach no server,
// and a secret header's value is sent but never appears in a result or an error.
import { X509Certificate } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { AgentError, type CommandContext } from "../../agent/client.ts";
import { headerProblem, httpProxyBody } from "better-compute/metal/http-proxy";
import { httpProxyHandlers } from "../../agent/roles/http-proxy.ts";
import { spkiSha256 } from "../../agent/roles/tls-pin.ts";
import { selfSignedCertificate } from "../../testing/tls.ts";
import { agentFailure } from "../support/agent-error.ts";
import { commandContext } from "../support/command-context.ts";

const KIND = "site.httpProxy";
const SECRET = "tok-Zq83-very-secret-value";
const REF = "secret://talos-token";

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

let pin: string;
let certPem: string;
let https: Server;
let http: Server;
let httpsUrl: string;
let httpUrl: string;
const seen: Seen[] = [];
const connections = { https: 0, http: 0, tls: 0 };

/** The servers' routes, the same over http and https. */
function respond(req: IncomingMessage, res: ServerResponse, body: string) {
  seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
  switch (req.url) {
    case "/hello":
      res
        .writeHead(200, { "content-type": "application/json", "x-machine": "m1", "set-cookie": ["session=abc"] })
        .end('{"hello":"machine"}');
      return;
    case "/submit":
      res.writeHead(201, { "content-type": "text/plain" }).end(`got ${body.length} bytes`);
      return;
    case "/echo": // a machine that echoes what it was sent, secret included
      res.writeHead(200, { "x-echo": String(req.headers["x-token"]) }).end(JSON.stringify(req.headers));
      return;
    case "/redirect":
      res.writeHead(302, { location: "http://10.9.9.9/elsewhere" }).end();
      return;
    case "/big":
      res.writeHead(200, { "content-type": "application/octet-stream" }).end("x".repeat(5000));
      return;
    case "/big-stream": // no content-length: the cap is met while reading
      res.writeHead(200, { "content-type": "application/octet-stream" });
      for (let i = 0; i < 10; i++) res.write("y".repeat(500));
      res.end();
      return;
    case "/unavailable":
      res.writeHead(503, { "retry-after": "5" }).end("try later");
      return;
    case "/slow":
      return; // never answers
    default:
      res.writeHead(404).end("not found");
  }
}

function handle(req: IncomingMessage, res: ServerResponse) {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => respond(req, res, Buffer.concat(chunks).toString("utf8")));
}

async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return (server.address() as AddressInfo).port;
}

function stop(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

beforeAll(async () => {
  const tls = selfSignedCertificate();
  pin = tls.spkiSha256;
  certPem = tls.cert;
  https = createHttpsServer({ key: tls.key, cert: tls.cert }, handle);
  https.on("connection", () => connections.https++);
  https.on("secureConnection", () => connections.tls++);
  http = createServer(handle);
  http.on("connection", () => connections.http++);
  httpsUrl = `https://127.0.0.1:${await listen(https)}`;
  httpUrl = `http://127.0.0.1:${await listen(http)}`;
});

afterAll(async () => {
  await Promise.all([stop(https), stop(http)]);
});

beforeEach(() => {
  seen.length = 0;
  connections.https = connections.http = connections.tls = 0;
});

function ctx(secrets: Record<string, string> = { [REF]: SECRET }, signal = new AbortController().signal) {
  return commandContext(KIND, secrets, signal);
}

function run(body: Record<string, unknown>, context = ctx(), options?: Parameters<typeof httpProxyHandlers>[0]) {
  return httpProxyHandlers({ timeoutMs: 5_000, ...options })[KIND]!(body, context) as Promise<any>;
}

/** A pin of the right shape that is not the server's. */
const wrongPin = () => (pin.startsWith("A") ? "B" : "A") + pin.slice(1);

describe("site.httpProxy", () => {
  it("GETs over https when the pin matches, answering status, headers (no set-cookie) and body", async () => {
    expect(spkiSha256(new Uint8Array(new X509Certificate(certPem).raw))).toBe(pin);
    const answer = await run({ url: `${httpsUrl}/hello`, tlsSpkiSha256: pin, headers: { accept: "application/json" } });
    expect(answer).toMatchObject({ status: 200, body: '{"hello":"machine"}' });
    expect(answer.headers).toMatchObject({ "content-type": "application/json", "x-machine": "m1" });
    expect(answer.headers["set-cookie"]).toBeUndefined();
    expect(Object.keys(answer.headers).every((k) => k === k.toLowerCase())).toBe(true);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ method: "GET", url: "/hello", body: "" });
    expect(seen[0]!.headers.accept).toBe("application/json");
  });

  it("refuses a certificate that does not match the pin before sending anything, secrets included", async () => {
    const e = await agentFailure(
      run({ url: `${httpsUrl}/submit`, method: "POST", body: "payload", tlsSpkiSha256: wrongPin(), secretHeaders: { "x-token": REF } }),
    );
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toContain("certificate does not match the pinned SPKI");
    expect(e.message).toContain(`POST ${httpsUrl}/submit`);
    expect(e.message).not.toContain(SECRET);
    await new Promise((r) => setTimeout(r, 100)); // time for the server to read anything sent
    expect(connections.https).toBe(1); // it connected: it is the pin that refused the server
    expect(seen).toEqual([]);
  });

  it("POSTs a body and a secret header the server receives; the value is in no answer", async () => {
    const answer = await run({
      url: `${httpsUrl}/submit`,
      method: "POST",
      body: "a".repeat(1000),
      tlsSpkiSha256: pin,
      headers: { "content-type": "text/plain" },
      secretHeaders: { "X-Token": REF },
    });
    expect(answer).toMatchObject({ status: 201, body: "got 1000 bytes" });
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ method: "POST", url: "/submit", body: "a".repeat(1000) });
    expect(seen[0]!.headers["x-token"]).toBe(SECRET);
    expect(seen[0]!.headers["content-type"]).toBe("text/plain");
    expect(JSON.stringify(answer)).not.toContain(SECRET);

    // A machine that echoes the secret back: redacted from the answer's headers and body.
    const echoed = await run({ url: `${httpUrl}/echo`, secretHeaders: { "x-token": REF } });
    expect(seen[1]!.headers["x-token"]).toBe(SECRET);
    expect(echoed.status).toBe(200);
    expect(echoed.headers["x-echo"]).toBe("[redacted]");
    expect(JSON.stringify(echoed)).not.toContain(SECRET);
  });

  it("never follows a redirect", async () => {
    const e = await agentFailure(run({ url: `${httpUrl}/redirect` }));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.message).toBe(`GET ${httpUrl}/redirect was answered 302: redirect to http://10.9.9.9/elsewhere refused`);
    expect(seen.map((s) => s.url)).toEqual(["/redirect"]);
  });

  it("refuses an answer over the cap, announced or streamed", async () => {
    const big = await agentFailure(run({ url: `${httpsUrl}/big`, tlsSpkiSha256: pin, maxResponseBytes: 1000 }));
    expect(big.code).toBe("DRIVER_ERROR");
    expect(big.message).toContain("over 1000 bytes");
    const streamed = await agentFailure(run({ url: `${httpUrl}/big-stream` }, ctx(), { maxResponseBytes: 1200 }));
    expect(streamed.code).toBe("DRIVER_ERROR");
    expect(streamed.message).toContain("over 1200 bytes");
    // Under the cap, the same answers arrive whole.
    expect((await run({ url: `${httpUrl}/big-stream` }, ctx(), { maxResponseBytes: 5000 })).body).toBe("y".repeat(5000));
  });

  it("answers a 503 (or any non-redirect status) as a result", async () => {
    const answer = await run({ url: `${httpUrl}/unavailable`, method: "DELETE" });
    expect(answer).toEqual({ status: 503, headers: expect.objectContaining({ "retry-after": "5" }), body: "try later" });
    expect(seen[0]!.method).toBe("DELETE");
  });

  it("reports a refused connection and a timeout as DRIVER_ERROR naming the method and URL", async () => {
    const closed = createServer();
    const port = await listen(closed);
    await stop(closed);
    const refused = await agentFailure(
      run({ url: `http://127.0.0.1:${port}/x`, method: "PUT", body: "b", secretHeaders: { "x-token": REF } }),
    );
    expect(refused.code).toBe("DRIVER_ERROR");
    expect(refused.message).toContain(`PUT http://127.0.0.1:${port}/x failed`);
    expect(refused.message).toContain("ECONNREFUSED");
    expect(refused.message).not.toContain(SECRET);

    const t0 = performance.now();
    const slow = await agentFailure(run({ url: `${httpsUrl}/slow`, tlsSpkiSha256: pin, timeoutMs: 300 }));
    expect(slow.code).toBe("DRIVER_ERROR");
    expect(slow.message).toBe(`GET ${httpsUrl}/slow got no answer within 300 ms`);
    expect(performance.now() - t0).toBeLessThan(3_000);
    expect(seen.map((s) => s.url)).toEqual(["/slow"]);
  });

  it("ends the request when the command's signal aborts, with the signal's reason", async () => {
    const controller = new AbortController();
    const pending = agentFailure(run({ url: `${httpUrl}/slow` }, ctx(undefined, controller.signal)));
    await new Promise((r) => setTimeout(r, 100));
    controller.abort(new AgentError("INTERRUPTED", "the agent is stopping"));
    const e = await pending;
    expect(e.code).toBe("INTERRUPTED");
  });

  it("refuses each bad request with INVALID_ARGUMENT naming the field; no server sees anything", async () => {
    const refusals: Array<[Record<string, unknown>, RegExp, CommandContext?]> = [
      [{ url: `http://localhost:${new URL(httpUrl).port}/hello` }, /url: the host must be an IP address, not the name localhost/],
      [{ url: `http://user:pw@127.0.0.1:${new URL(httpUrl).port}/hello` }, /url: must not carry a username or password/],
      [{ url: "ftp://127.0.0.1/x" }, /url: must be http: or https:/],
      [{ url: `${httpUrl}/hello`, headers: { Host: "10.0.0.9" } }, /headers\.Host: the header Host is set by the agent/],
      [{ url: `${httpUrl}/hello`, headers: { "Transfer-Encoding": "chunked" } }, /headers\.Transfer-Encoding:/],
      [{ url: `${httpUrl}/hello`, headers: { "proxy-authorization": "x" } }, /headers\.proxy-authorization:/],
      [{ url: `${httpUrl}/hello`, secretHeaders: { Connection: REF } }, /secretHeaders\.Connection:/],
      [{ url: `${httpUrl}/hello`, headers: { "x-a": "1\r\nx-injected: 1" } }, /headers\.x-a: the value of the header x-a holds CR, LF/],
      [{ url: `${httpUrl}/hello`, headers: { "bad name": "1" } }, /not an HTTP token/],
      [
        { url: `${httpUrl}/hello`, headers: { "X-Token": "1" }, secretHeaders: { "x-token": REF } },
        /secretHeaders\.x-token: the header x-token is given twice/,
      ],
      [{ url: `${httpUrl}/hello`, secretHeaders: { "x-token": SECRET } }, /secretHeaders\.x-token: must be a secret:\/\/<id> reference/],
      [{ url: `${httpsUrl}/hello` }, /tlsSpkiSha256: required for https:/],
      [{ url: `${httpUrl}/hello`, tlsSpkiSha256: pin }, /tlsSpkiSha256: only for https:/],
      [{ url: `${httpsUrl}/hello`, tlsSpkiSha256: "c2hhMjU2Ly9ub3QtYS1waW4=" }, /tlsSpkiSha256: must be the base64 SHA-256/],
      [{ url: `${httpUrl}/hello`, method: "PATCH" }, /method:/],
      [{ url: `${httpUrl}/hello`, body: "x".repeat(64 * 1024 + 1) }, /body: at most 65536 bytes/],
      [{ url: `${httpUrl}/hello`, timeoutMs: 60_001 }, /timeoutMs:/],
      [{ url: `${httpUrl}/hello`, maxResponseBytes: 48 * 1024 + 1 }, /maxResponseBytes:/],
      [{ url: `${httpUrl}/hello`, followRedirects: true }, /followRedirects/],
      [
        { url: `${httpUrl}/hello`, secretHeaders: { "x-token": "secret://absent" } },
        /site\.httpProxy: the command carries no value for secret:\/\/absent/,
      ],
      [
        { url: `${httpUrl}/hello`, secretHeaders: { "x-token": REF } },
        /secretHeaders\.x-token \(secret:\/\/talos-token\): the value of the header x-token holds CR, LF/,
        ctx({ [REF]: `${SECRET}\r\nx-injected: 1` }),
      ],
    ];
    for (const [body, message, context] of refusals) {
      const e = await agentFailure(run(body, context));
      expect(e.code, JSON.stringify(body)).toBe("INVALID_ARGUMENT");
      expect(e.message).toMatch(message);
      expect(e.message).not.toContain(SECRET);
    }
    expect(seen).toEqual([]);
    expect(connections).toEqual({ https: 0, http: 0, tls: 0 });
  });

  it("runs each machine's requests in its own lane, by IP", () => {
    const handler = httpProxyHandlers()[KIND]!;
    expect(handler.lane?.({ url: "https://10.0.0.5:50000/x" })).toBe("http:10.0.0.5");
    expect(handler.lane?.({ url: "http://10.0.0.5/y" })).toBe("http:10.0.0.5");
    expect(handler.lane?.({ url: "https://[fd00::5]:50000/" })).toBe("http:[fd00::5]");
    expect(handler.lane?.({ url: "not a url" })).toBeUndefined();
  });

  it("exposes the rules the control plane reuses", () => {
    expect(headerProblem("Authorization", "Bearer x")).toBeUndefined();
    for (const name of ["host", "HOST", "Content-Length", "te", "Trailer", "upgrade", "Keep-Alive", "expect", "Proxy-Connection"]) {
      expect(headerProblem(name, "v"), name).toMatch(/set by the agent/);
    }
    expect(headerProblem("x-a", "a\nb")).toMatch(/CR, LF/);
    expect(headerProblem("x-a", "a\rb")).toMatch(/CR, LF/);
    expect(headerProblem("x-a", "secret\r\n")).not.toContain("secret");
    expect(httpProxyBody.safeParse({ url: "https://[fd00::5]:50000/v1", tlsSpkiSha256: pin }).success).toBe(true);
    expect(httpProxyBody.parse({ url: "http://10.0.0.5/" }).method).toBe("GET");
  });
});
