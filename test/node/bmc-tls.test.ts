// BMC TLS (agent/roles/redfish.ts, plugins/metal/bmc-address.ts): the site agent reaches an https
// BMC with a self-signed certificate (as nearly every iDRAC, iLO and XCC ships) only when the
// binding names its CA (tls.caBundle) or pins its public key (tls.spkiSha256). Otherwise the
// command fails with a DRIVER_ERROR that says which fix to make, marked permanent, before a byte
// of the request (its Authorization header) reached the BMC; on the simulated site the step fails
// at once. The BMC is the Redfish emulator (SIMULATED hardware) served over real TLS with
// certificates made by the openssl CLI.
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { RedfishClient } from "../../agent/roles/redfish.ts";
import { siteHandlers } from "../../agent/roles/site.ts";
import { startRedfishEmulator, type RedfishEmulator } from "../../testing/redfish-emulator.ts";
import { selfSignedCertificate, type SelfSignedCertificate } from "../../testing/tls.ts";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";
import { agentFailure } from "../support/agent-error.ts";
import { commandContext } from "../support/command-context.ts";

const USER = "root";
const PASS = "tls-Pa55word-never-sent";
const REF = "secret://bmc-tls";
// A BMC's certificate as they ship: self-signed; this one names 127.0.0.1, so it is also its own CA.
const bmcCert = selfSignedCertificate("bmc.example", { altNames: ["IP:127.0.0.1"] });
// Another BMC's: it names no address this test reaches.
const otherCert = selfSignedCertificate("other-bmc");

const running: RedfishEmulator[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((e) => e.stop()));
});

async function emulator(cert: SelfSignedCertificate | null = bmcCert, machines = 1) {
  const emu = await startRedfishEmulator({
    machines,
    username: USER,
    password: PASS,
    ...(cert ? { tls: { key: cert.key, cert: cert.cert } } : {}),
  });
  running.push(emu);
  return { emu, address: `${emu.url}/redfish/v1/Systems/node-1` };
}

const ctx = (kind: string) => commandContext(kind, { [REF]: PASS });

function run(address: string, tls: unknown, kind = "metal.bmc.inspect", extra: Record<string, unknown> = {}) {
  const body = { bmc: { address, username: USER, password: REF, ...(tls === undefined ? {} : { tls }) }, ...extra };
  return siteHandlers({ timeoutMs: 5_000 })[kind]!(body, ctx(kind)) as Promise<any>;
}

const FIX = "Name the CA that signed it in bmc.tls.caBundle, or pin its public key with bmc.tls.spkiSha256 (docs/bmc.md)";

describe("the site agent and https BMCs", () => {
  it("serves the emulator over TLS with the certificate given", async () => {
    const { emu } = await emulator();
    expect(emu.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    // Trusting the certificate as a CA: the emulator answers over TLS.
    const { request } = await import("node:https");
    const status = await new Promise<number>((resolve, reject) =>
      request(`${emu.url}/redfish/v1`, { ca: bmcCert.cert }, (res) => (res.resume(), resolve(res.statusCode ?? 0)))
        .on("error", reject)
        .end(),
    );
    expect(status).toBe(200);
  });

  it("with no tls block, a self-signed BMC is refused: DRIVER_ERROR naming the fix, permanent, nothing sent", async () => {
    const { emu, address } = await emulator();
    const e = await agentFailure(run(address, undefined));
    expect(e.code).toBe("DRIVER_ERROR");
    expect(e.permanent).toBe(true);
    expect(e.message).toBe(
      `BMC ${address} presented a certificate that is not trusted by the system's CAs (DEPTH_ZERO_SELF_SIGNED_CERT); nothing was sent. ${FIX}`,
    );
    expect(e.message).not.toContain(PASS);
    expect(emu.requests).toEqual([]); // the BMC never saw a request, so never the Authorization header
  });

  it("with the pin, it is reached; a wrong pin is refused naming both pins, before the request", async () => {
    const { emu, address } = await emulator();
    expect(await run(address, { spkiSha256: bmcCert.spkiSha256 })).toMatchObject({ systemId: "node-1", powerState: "Off" });
    expect(await run(address, { spkiSha256: bmcCert.spkiSha256 }, "metal.bmc.power", { action: "on" })).toEqual({
      powerState: "On",
      previous: "Off",
    });
    const seen = emu.requests.length;

    const e = await agentFailure(run(address, { spkiSha256: otherCert.spkiSha256 }));
    expect(e).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: true,
      message: `BMC ${address} presented a certificate whose public key does not match the pin bmc.tls.spkiSha256 ${otherCert.spkiSha256} (its pin is ${bmcCert.spkiSha256}); nothing was sent`,
    });
    expect(emu.requests.length).toBe(seen);
  });

  it("with the CA bundle, it is reached; a bundle of another CA, or a certificate for another name, is refused", async () => {
    const { emu, address } = await emulator();
    expect(await run(address, { caBundle: bmcCert.cert })).toMatchObject({ systemId: "node-1" });
    const seen = emu.requests.length;
    const e = await agentFailure(run(address, { caBundle: otherCert.cert }));
    expect(e).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: true,
      message: expect.stringContaining(`BMC ${address} presented a certificate that is not trusted by bmc.tls.caBundle (`),
    });
    expect(e.message).toContain(FIX);
    expect(emu.requests.length).toBe(seen);

    // A BMC whose certificate names another host: its CA vouches for the key, not for this address.
    const misnamed = await emulator(otherCert);
    const wrongName = await agentFailure(run(misnamed.address, { caBundle: otherCert.cert }));
    expect(wrongName).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: true,
      message: expect.stringContaining("(ERR_TLS_CERT_ALTNAME_INVALID)"),
    });
    // The pin names the key itself: no name needed.
    expect(await run(misnamed.address, { spkiSha256: otherCert.spkiSha256 })).toMatchObject({ systemId: "node-1" });
    // Both given: both are checked.
    expect(await agentFailure(run(address, { caBundle: bmcCert.cert, spkiSha256: otherCert.spkiSha256 }))).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: true,
    });
    expect(await run(address, { caBundle: bmcCert.cert, spkiSha256: bmcCert.spkiSha256 })).toMatchObject({ systemId: "node-1" });
  });

  it("a server that speaks no TLS at that address is a DRIVER_ERROR, not permanent", async () => {
    const { emu } = await emulator(null);
    const e = await agentFailure(
      run(`${emu.url.replace("http:", "https:")}/redfish/v1/Systems/node-1`, { spkiSha256: bmcCert.spkiSha256 }),
    );
    expect(e).toMatchObject({
      code: "DRIVER_ERROR",
      permanent: false,
      message: expect.stringContaining("did not answer GET /redfish/v1/Systems/node-1"),
    });
  });

  it("refuses a tls block for an http BMC and a malformed one, before any connection", async () => {
    const { emu, address } = await emulator(null);
    expect(await agentFailure(run(address, { spkiSha256: bmcCert.spkiSha256 }))).toMatchObject({
      code: "INVALID_ARGUMENT",
      message: `BMC ${address}: tls is only for https BMC addresses`,
    });
    for (const tls of [{}, { spkiSha256: "abc" }, { caBundle: "not a certificate" }, { spkiSha256: bmcCert.spkiSha256, verify: false }]) {
      expect(await agentFailure(run(address, tls)), JSON.stringify(tls)).toMatchObject({
        code: "INVALID_ARGUMENT",
        message: expect.stringContaining("bmc.tls"),
      });
    }
    expect(emu.requests).toEqual([]);
  });

  it("writes nothing to a BMC it does not trust: not even the request line", async () => {
    // A raw TLS listener that records every byte it is sent after the handshake.
    const { createServer } = await import("node:tls");
    let received = 0;
    const server = createServer({ key: bmcCert.key, cert: bmcCert.cert }, (socket) =>
      socket.on("data", (d: Buffer) => (received += d.length)),
    );
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    try {
      const port = (server.address() as { port: number }).port;
      const address = `https://127.0.0.1:${port}/redfish/v1/Systems/node-1`;
      for (const tls of [undefined, { spkiSha256: otherCert.spkiSha256 }, { caBundle: otherCert.cert }]) {
        expect(await agentFailure(run(address, tls))).toMatchObject({ code: "DRIVER_ERROR", permanent: true });
      }
      expect(received).toBe(0);
      // The listener does count: trusted (the right pin), the request is written (and never answered).
      const trusting = new RedfishClient(
        { address, username: USER, password: PASS, tls: { spkiSha256: bmcCert.spkiSha256 } },
        { timeoutMs: 300 },
      );
      expect(await agentFailure(trusting.inspect())).toMatchObject({
        code: "DRIVER_ERROR",
        permanent: false,
        message: expect.stringContaining("no answer within 300 ms"),
      });
      expect(received).toBeGreaterThan(0);
    } finally {
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

describe("on the simulated site: enroll with tls, and a BMC that is not trusted", () => {
  let sim: MetalSim;
  let bmc: RedfishEmulator;
  beforeAll(async () => {
    sim = await createMetalSim({ machines: 1 });
    bmc = await startRedfishEmulator({ machines: 2, username: USER, password: PASS, tls: { key: bmcCert.key, cert: bmcCert.cert } });
  }, 60_000);
  afterAll(async () => {
    await sim?.stop();
    await bmc?.stop();
  });

  const enroll = (id: string, system: string, tls?: unknown) =>
    sim.call<{ state: string; workflow: string }>("metal.enroll", {
      id,
      pool: sim.site.pool,
      bmc: { address: `${bmc.url}/redfish/v1/Systems/${system}`, username: USER, password: PASS, ...(tls ? { tls } : {}) },
    });

  it("a BMC enrolled without tls fails at once: one attempt, DRIVER_ERROR saying it is not trusted", async () => {
    await enroll("m-untrusted", "node-1");
    const node = await sim.waitForState("m-untrusted", ["failed"]);
    const error = node.lastError as { code: string; message: string; step: string; details: Record<string, unknown>; workflow: string };
    expect(error).toMatchObject({ code: "DRIVER_ERROR", step: "inspect", details: { agentCode: "DRIVER_ERROR", permanent: true } });
    expect(error.message).toContain("presented a certificate that is not trusted by the system's CAs");
    expect(error.message).toContain("bmc.tls.spkiSha256");
    const wf = await sim.call<{ steps: { name: string; attempts: unknown[] }[] }>("workflows.get", { id: error.workflow });
    expect(wf.steps.find((s) => s.name === "inspect")!.attempts).toHaveLength(1);
  }, 60_000);

  it("a BMC enrolled with its pin is inspected; the pin is stored with the binding and sent with each command", async () => {
    const enrolled = await enroll("m-pinned", "node-2", { spkiSha256: bmcCert.spkiSha256 });
    const machine = bmc.machines.get("node-2")!;
    await expect
      .poll(
        async () =>
          (
            await sim.call<{ steps: { name: string; attempts: { state: string; output: any }[] }[] }>("workflows.get", {
              id: enrolled.workflow,
            })
          ).steps[0]?.attempts.at(-1),
        { timeout: 30_000, interval: 200 },
      )
      .toMatchObject({ state: "succeeded", output: { uuid: machine.uuid } });
    const [row] = (await sim.store.db.execute(sql`SELECT bmc FROM metal_nodes WHERE id = 'm-pinned'`)).rows as {
      bmc: Record<string, unknown>;
    }[];
    expect(row!.bmc.tls).toEqual({ spkiSha256: bmcCert.spkiSha256 });
    const sent = sim.commandsSeen.filter(
      (c) => c.kind.startsWith("metal.bmc.") && (c.body.bmc as { address: string }).address.endsWith("/node-2"),
    );
    expect(sent.length).toBeGreaterThan(0);
    for (const c of sent) expect((c.body.bmc as { tls?: unknown }).tls).toEqual({ spkiSha256: bmcCert.spkiSha256 });
  }, 60_000);

  it("metal.enroll refuses a tls block for an http BMC and a malformed pin, writing nothing", async () => {
    const before = (await sim.store.db.execute(sql`SELECT count(*)::int AS n FROM metal_nodes`)).rows[0];
    const refusal = (p: Promise<unknown>) =>
      p.then(
        () => undefined,
        (e: { code?: string; details?: unknown }) => e,
      );
    const http = await refusal(
      sim.call("metal.enroll", {
        pool: sim.site.pool,
        bmc: { address: sim.machines[0]!.address, username: USER, password: PASS, tls: { spkiSha256: bmcCert.spkiSha256 } },
      }),
    );
    expect(http).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(JSON.stringify(http)).toContain("tls is only for https BMC addresses");
    const badPin = await refusal(enroll("m-badpin", "node-1", { spkiSha256: "sha256//not-base64" }));
    expect(badPin).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(JSON.stringify(badPin)).toContain("SubjectPublicKeyInfo");
    expect((await sim.store.db.execute(sql`SELECT count(*)::int AS n FROM metal_nodes`)).rows[0]).toEqual(before);
  });
});
