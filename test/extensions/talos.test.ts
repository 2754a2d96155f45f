// Walkthrough 3: Talos on an agentless pool, on a simulated site (better-compute/testing/metal).
// acme-talos is a third-party plugin (test/extensions/acme-talos/plugin.ts): one step that polls
// the Talos API through the site agent (httpViaSite), one profile. SIMULATED: the machines, their
// BMCs and Talos itself (an HTTPS server with a self-signed certificate on the machine's own
// loopback address, answering /machine/version once it has "booted"); Postgres, the engine, the
// metal module, the site agent and its site.httpProxy requests over real TLS are real.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { definePlugin } from "better-compute";
import { httpViaSite } from "better-compute/metal";
import { defineProfile, defineStep } from "better-compute/provision";
import { createMetalSim, selfSignedCertificate, SIM_BMC_PASSWORD, type MetalSim } from "better-compute/testing/metal";
import { talosEmulator } from "./acme-talos/emulator.ts";
import { acmeTalos, TALOS_API_PORT, talosProfile } from "./acme-talos/plugin.ts";

const TALOS_ISO = "https://images.example.test/talos/v1.8.0/metal-amd64.iso";
const ADDRESS = (i: number) => `127.0.0.${30 + i}`;
const PROVISIONING_CIDR = "127.0.0.33/32"; // only machine 3 may be reached over plain HTTP

const tls = selfSignedCertificate("talos");
const { os: talos, seen } = talosEmulator(tls);

// A probe as another plugin might write it: one httpViaSite request from the workflow's input.
const probeStep = defineStep({
  id: "probe.http",
  runsOn: "control-plane",
  relays: ["site"],
  sends: ["site.httpProxy"],
  input: z.object({ request: z.record(z.string(), z.unknown()) }),
  pollSeconds: 1,
  deadlineSeconds: 60,
  run: async (ctx, input) => httpViaSite(ctx, input.request as unknown as Parameters<typeof httpViaSite>[1]),
});
const probe = definePlugin({
  id: "acme-probe",
  extensions: [probeStep],
  profiles: [
    defineProfile({ id: "acme.probe", target: "metal", role: "probe", steps: [{ step: "probe.http" }] }),
    // Talos booted first, then the probe: a request to a running machine.
    defineProfile({ id: "acme.probe.booted", target: "metal", role: "probe", steps: [...talosProfile.steps, { step: "probe.http" }] }),
  ],
});

let sim: MetalSim;
const ids = ["t-0", "t-1", "t-2", "t-3"];

beforeAll(async () => {
  sim = await createMetalSim({
    modules: [acmeTalos, probe],
    machines: ids.length,
    agent: "none",
    provisioningCidrs: [PROVISIONING_CIDR],
    machineAddresses: (i) => [ADDRESS(i)],
    siteId: "talos-site",
    install: ({ image }) => (image === TALOS_ISO ? { os: talos } : undefined),
  });
  await Promise.all(ids.map((id, i) => sim.enroll(sim.machines[i]!, { id })));
  await Promise.all(ids.map((id) => sim.waitForState(id, ["ready", "failed"], 60_000)));
}, 120_000);
afterAll(() => sim?.stop());

const relayed = (workflow: string) =>
  sim.store.db.execute(
    sql`SELECT node_id, body, secret_refs, state, result, error FROM bc_commands WHERE origin = ${`workflow:${workflow}`} AND kind = 'site.httpProxy' ORDER BY id`,
  );

async function events(type: string, subject: string) {
  return (await sim.store.db.execute(sql`SELECT data FROM bc_events WHERE type = ${type} AND subject = ${subject} ORDER BY id`)).rows as {
    data: Record<string, unknown>;
  }[];
}

/** Deploys the probe with one request; answers how the workflow ended and what it relayed. */
async function probeWith(node: string, request: Record<string, unknown>, profile = "acme.probe", input: Record<string, unknown> = {}) {
  const { workflow } = await sim.call<{ workflow: string }>("metal.deploy", { node, profile, input: { ...input, request } });
  const after = await sim.waitForState(node, ["deployed", "failed"], 60_000);
  const commands = (await relayed(workflow)).rows as {
    body: Record<string, unknown> & { secretHeaders?: unknown };
    secret_refs: string[] | string;
    result: Record<string, unknown> | null;
    error: { code: string; message: string } | null;
  }[];
  const steps = (await sim.call<{ steps: { name: string; attempts: { output: unknown }[] }[] }>("workflows.get", { id: workflow })).steps;
  return {
    after,
    commands,
    workflow,
    output: steps.find((s) => s.name === "probe.http")?.attempts.at(-1)?.output as Record<string, unknown> | null,
  };
}

/** Back to ready for the next probe: release a deployed node, recommission a failed one. */
async function reset(node: string, state: string) {
  if (state === "deployed") await sim.call("metal.undeploy", { node });
  else await sim.call("metal.nodes.recommission", { node });
  expect((await sim.waitForState(node, ["ready", "failed"])).state).toBe("ready");
}

describe("Walkthrough 3: Talos on an agentless pool", () => {
  it("profiles.validate resolves the plugin's profile; an agentless pool must opt in to unverified release", async () => {
    const report = await sim.call<{ issues: unknown[] }>("profiles.validate", { id: "talos-1.8" });
    expect(report.issues).toEqual([]);
    const refused = await sim
      .call("metal.pools.create", { id: "no-opt-in", site: "talos-site", agent: "none", policy: { hardwareProfile: "redfish-pxe" } })
      .catch((e: { code: string; message: string }) => e);
    expect(refused).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect((refused as { message: string }).message).toMatch(/allowUnverifiedRelease/);
  });

  it("commissions out of band: addresses from Redfish, no ramdisk, ready without a wipe only because the pool opted in", async () => {
    for (const [i, id] of ids.entries()) {
      const node = await sim.call<Record<string, unknown>>("metal.nodes.get", { node: id });
      expect(node.state, JSON.stringify(node.lastError)).toBe("ready");
      expect(node.addresses).toEqual([ADDRESS(i)]);
      expect(sim.machines[i]!.boots).toEqual([]); // never PXE-booted: nothing ran on it
      expect(await events("node.release.unverified", `metal/nodes/${id}`)).toEqual([
        { data: expect.objectContaining({ event: "commissioned", attestedWipes: 0 }) },
      ]);
    }
    const workflows = await sim.store.db.execute(
      sql`SELECT DISTINCT profile_id FROM workflows WHERE target = ANY(${`{${ids.join(",")}}`}::text[])`,
    );
    expect(workflows.rows).toEqual([{ profile_id: "metal.commission.agentless" }]);
  });

  it("deploys Talos: polls its API through the site agent at the machine's own address with the pinned key until it answers; deployed as a host", async () => {
    const machine = sim.machines[0]!;
    const { workflow } = await sim.call<{ workflow: string }>("metal.deploy", {
      node: "t-0",
      profile: "talos-1.8",
      input: { url: TALOS_ISO, tlsSpkiSha256: tls.spkiSha256 },
    });
    const node = await sim.waitForState("t-0", ["deployed", "failed"], 60_000);
    expect(node.state, JSON.stringify(node.lastError)).toBe("deployed");
    expect(node.role).toBe("host");
    expect(machine.boots).toEqual(["cd"]);

    // It polled: answers while Talos booted (503), then 200; every request went to the site agent.
    const commands = (await relayed(workflow)).rows as {
      node_id: string;
      body: { url: string; tlsSpkiSha256: string };
      result: { status: number } | null;
    }[];
    expect(commands.length).toBeGreaterThan(1);
    expect(commands.every((c) => c.node_id === sim.site.agentNodeId)).toBe(true);
    expect(
      commands.every(
        (c) => c.body.url === `https://${ADDRESS(0)}:${TALOS_API_PORT}/machine/version` && c.body.tlsSpkiSha256 === tls.spkiSha256,
      ),
    ).toBe(true);
    expect(commands.map((c) => c.result?.status)).toContain(503);
    expect(commands.filter((c) => c.result?.status === 200).length).toBeGreaterThanOrEqual(1);
    const output = (await sim.call<{ steps: { name: string; attempts: { output: unknown }[] }[] }>("workflows.get", { id: workflow })).steps
      .find((s) => s.name === "wait.talosReady")!
      .attempts.at(-1)!.output;
    expect(output).toEqual({ talosVersion: "v1.8.0" });

    // Every command of the deploy went to the site agent; no agent ever ran on the machine, so it is never a connected node.
    const targets = await sim.store.db.execute(
      sql`SELECT DISTINCT n.role FROM bc_commands c JOIN bc_nodes n ON n.id = c.node_id WHERE c.origin = ${`workflow:${workflow}`}`,
    );
    expect(targets.rows).toEqual([{ role: "site" }]);
    const agents = await sim.store.db.execute(sql`SELECT count(*)::int AS n FROM bc_nodes WHERE role <> 'site'`);
    expect(agents.rows).toEqual([{ n: 0 }]);
    expect(sim.commandsSeen.every((c) => c.role === "site")).toBe(true);
  });

  it("releases to ready without an attested wipe because the pool opted in, and says so with node.release.unverified", async () => {
    const machine = sim.machines[0]!;
    await sim.call("metal.undeploy", { node: "t-0" });
    const node = await sim.waitForState("t-0", ["ready", "failed"]);
    expect(node.state, JSON.stringify(node.lastError)).toBe("ready");
    expect(node.maintenance).toBe(false);
    expect(machine.bmc.media).toEqual({ inserted: false, image: null });
    expect(machine.bmc.power).toBe("Off");
    const unverified = await events("node.release.unverified", "metal/nodes/t-0");
    expect(unverified.at(-1)!.data).toMatchObject({ event: "released", attestedWipes: 0 });
  });

  it("a profile that needs an agent on the machine, and rescue, are refused on an agentless pool with UNSUPPORTED", async () => {
    for (const [method, input] of [
      ["metal.deploy", { node: "t-1", profile: "metal.deploy.image-stream", input: {} }],
      ["metal.rescue", { node: "t-1" }],
    ] as const) {
      const refused = await sim.call(method, input).catch((e: { code: string; message: string }) => e);
      expect(refused, method).toMatchObject({ code: "UNSUPPORTED" });
      expect((refused as { message: string }).message).toMatch(/agentless/);
    }
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "t-1" })).state).toBe("ready");
  });

  it("site.httpProxy is SSRF-bounded: each refused request fails the step with INVALID_ARGUMENT and creates no command", async () => {
    const https = (host: string, extra: Record<string, unknown> = {}) => ({
      url: `https://${host}:${TALOS_API_PORT}/machine/version`,
      tlsSpkiSha256: tls.spkiSha256,
      ...extra,
    });
    const refusals: [string, Record<string, unknown>, RegExp][] = [
      ["another node's IP", https(ADDRESS(2)), /not an address of machine t-1/],
      ["a name", https("localhost"), /IP/],
      ["credentials in the URL", https(`admin:pw@${ADDRESS(1)}`), /credentials|user/i],
      [
        "plain HTTP off the provisioning network",
        { url: `http://${ADDRESS(1)}:${TALOS_API_PORT}/machine/version` },
        /provisioning networks/,
      ],
      ["a forbidden header", https(ADDRESS(1), { headers: { Host: "elsewhere.example" } }), /host/i],
      ["a header line break", https(ADDRESS(1), { headers: { "x-talos": "a\r\nX-Injected: 1" } }), /header/i],
      ["a secret header given by value", https(ADDRESS(1), { secretHeaders: { authorization: "Bearer hunter2" } }), /secret/],
    ];
    for (const [what, request, message] of refusals) {
      const { after, commands } = await probeWith("t-1", request);
      expect(after.state, what).toBe("failed");
      expect((after.lastError as { code: string }).code, what).toBe("INVALID_ARGUMENT");
      expect((after.lastError as { message: string }).message, what).toMatch(message);
      expect(commands, what).toEqual([]);
      expect(JSON.stringify(after.lastError)).not.toContain("hunter2");
      await reset("t-1", "failed");
    }
  });

  it("plain HTTP inside the provisioning network is relayed; a redirect is DRIVER_ERROR; secret headers travel by reference", async () => {
    // Machine 3 is inside policy.provisioningCidrs: the request is sent (nothing listens there: DRIVER_ERROR from the agent).
    const plain = await probeWith("t-3", { url: `http://${ADDRESS(3)}:${TALOS_API_PORT}/machine/version` });
    expect(plain.commands).toHaveLength(1);
    expect(plain.output).toMatchObject({ ok: false, error: { code: "DRIVER_ERROR" } });
    await reset("t-3", plain.after.state as string);

    // On a booted Talos (acme.probe.booted boots it first): a redirect is refused by the site agent.
    const boot = { url: TALOS_ISO, tlsSpkiSha256: tls.spkiSha256 };
    const redirect = await probeWith(
      "t-2",
      { url: `https://${ADDRESS(2)}:${TALOS_API_PORT}/redirect`, tlsSpkiSha256: tls.spkiSha256 },
      "acme.probe.booted",
      boot,
    );
    expect(redirect.output).toMatchObject({ ok: false, error: { code: "DRIVER_ERROR", message: expect.stringMatching(/redirect/) } });
    await reset("t-2", redirect.after.state as string);

    // A secret header: the deployment's secret (the BMC password's reference stands in for a Talos token)
    // reaches Talos as a value, and is only a reference in the command and nowhere in the answer.
    const ref = (
      (await sim.store.db.execute(sql`SELECT bmc->>'password' AS ref FROM metal_nodes WHERE id = 't-2'`)).rows[0] as { ref: string }
    ).ref;
    expect(ref).toMatch(/^secret:\/\//);
    seen.length = 0;
    const secret = await probeWith(
      "t-2",
      {
        url: `https://${ADDRESS(2)}:${TALOS_API_PORT}/machine/version`,
        tlsSpkiSha256: tls.spkiSha256,
        secretHeaders: { "x-talos-token": ref },
      },
      "acme.probe.booted",
      boot,
    );
    expect(secret.output).toMatchObject({ ok: true, status: 200 });
    expect(seen.filter((r) => r.headers["x-talos-token"] === SIM_BMC_PASSWORD)).toHaveLength(1);
    const command = secret.commands.at(-1)!;
    expect(command.body.secretHeaders).toEqual({ "x-talos-token": ref });
    expect(JSON.stringify(secret.commands)).not.toContain(SIM_BMC_PASSWORD);
    expect(JSON.stringify(sim.commandsSeen)).not.toContain(SIM_BMC_PASSWORD);
  });
});
