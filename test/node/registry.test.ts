// betterCompute() checks every registration when it runs and refuses what it cannot check,
// with INVALID_CONFIG naming the offender.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { betterCompute, defineAttestor, defineDriver, defineModule, definePlugin, defineSchedulerPlugin, defineSink } from "better-compute";
import { ComputeError, defineMethod } from "better-compute/core";

const ping = (name = "acme.ping", action = "acme.ping") =>
  defineMethod({ name, action, readOnly: true, input: z.object({}), output: z.object({}), handler: async () => ({}) });

const acme = (overrides: Partial<Parameters<typeof defineModule>[0]> = {}) =>
  definePlugin({ id: "acme", iam: { actions: { "acme.ping": "Ping" } }, api: [ping()], ...overrides });

function refusal(fn: () => unknown): ComputeError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ComputeError);
    expect((err as ComputeError).code).toBe("INVALID_CONFIG");
    return err as ComputeError;
  }
  throw new Error("expected INVALID_CONFIG, but the configuration was accepted");
}

describe("registration", () => {
  it("accepts a valid configuration and lists what it registered", () => {
    const redfish = defineDriver({ id: "redfish", kinds: ["power", "management"], runsOn: "site" });
    const compute = betterCompute({
      plugins: [acme({ extensions: [defineSchedulerPlugin({ id: "rack-spread" })] })],
      drivers: [redfish],
      sinks: { events: [defineSink({ kind: "events", id: "warehouse", deliver: async () => {} })] },
    });
    expect(compute.registry.modules.map((m) => m.id)).toEqual(["core", "agents", "audit", "sinks", "acme"]);
    expect([...compute.registry.methods.keys()]).toContain("acme.ping");
    expect([...compute.registry.extensions.keys()].sort()).toEqual([
      "attestor:discovery@1",
      "attestor:join-token@1",
      "attestor:provisioned@1",
      "driver:redfish@1",
      "scheduler-plugin:rack-spread@1",
      "sink:warehouse@1",
    ]);
    expect(compute.registry.byContract("driver")).toEqual([redfish]);
  });

  it("refuses a duplicate kind:id@version, wherever the two were registered", () => {
    const driver = defineDriver({ id: "redfish", kinds: ["power"], runsOn: "site" });
    const err = refusal(() => betterCompute({ drivers: [driver], plugins: [acme({ extensions: [driver] })] }));
    expect(err.message).toContain("driver:redfish@1");
    expect(err.details).toEqual({ duplicate: "driver:redfish@1" });
    // Another version of the same driver is a different registration.
    expect(() =>
      betterCompute({ drivers: [driver, defineDriver({ id: "redfish", version: "2", kinds: ["power"], runsOn: "site" })] }),
    ).not.toThrow();
  });

  it("refuses a module registered twice, even under another version", () => {
    expect(refusal(() => betterCompute({ plugins: [acme(), acme()] })).message).toContain("module:acme@1");
    expect(refusal(() => betterCompute({ modules: [defineModule({ id: "acme" })], plugins: [acme({ version: "2" })] })).message).toContain(
      "acme",
    );
  });

  it("refuses a module that takes the core module's id", () => {
    expect(refusal(() => betterCompute({ modules: [defineModule({ id: "core" })] })).message).toContain("module:core@1");
  });

  it("refuses two methods with one name", () => {
    const other = definePlugin({ id: "other", api: [ping()] });
    expect(refusal(() => betterCompute({ plugins: [acme(), other] })).message).toContain("method:acme.ping");
  });

  it("refuses a method whose action is missing from the IAM catalog", () => {
    const err = refusal(() => betterCompute({ plugins: [acme({ api: [ping("acme.pong", "acme.pong")] })] }));
    expect(err.message).toContain("acme.pong");
    expect(err.details).toEqual({ method: "acme.pong", action: "acme.pong" });
  });

  it("refuses an IAM action declared by two modules", () => {
    const other = definePlugin({ id: "other", iam: { actions: { "acme.ping": "Mine too" } } });
    expect(refusal(() => betterCompute({ plugins: [acme(), other] })).details).toEqual({ duplicate: "action:acme.ping" });
  });

  it("refuses a migration named for another module", () => {
    const err = refusal(() => betterCompute({ plugins: [acme({ migrations: [{ name: "metal/0001_steal", sql: "SELECT 1" }] })] }));
    expect(err.details).toEqual({ migration: "metal/0001_steal", module: "acme" });
  });

  it("refuses a command kind two modules declare, and an attestor that takes a built-in's id", () => {
    const kinds = (id: string) => definePlugin({ id, commands: [{ kind: "bmc.setPower" }] });
    expect(refusal(() => betterCompute({ plugins: [kinds("one"), kinds("two")] })).details).toEqual({ duplicate: "command:bmc.setPower" });
    const impostor = defineAttestor({ id: "join-token", verify: async () => ({ role: "node" }) });
    expect(refusal(() => betterCompute({ attestors: [impostor] })).details).toEqual({ duplicate: "attestor:join-token@1" });
  });

  it("refuses usage sinks and a sink listed under the wrong kind", () => {
    expect(refusal(() => betterCompute({ sinks: { usage: [{}] } })).message).toContain("usage");
    const audit = defineSink({ kind: "audit", id: "siem", deliver: async () => {} });
    expect(refusal(() => betterCompute({ sinks: { events: [audit] } })).message).toContain("siem");
  });

  it("refuses an extension passed in the wrong option", () => {
    const sink = defineSink({ kind: "events", id: "warehouse", deliver: async () => {} });
    expect(refusal(() => betterCompute({ drivers: [sink as never] })).message).toContain("not a driver");
  });

  it("refuses ids and names it cannot route or key", () => {
    refusal(() => definePlugin({ id: "Acme Widgets" }));
    refusal(() =>
      defineMethod({ name: "ping", action: "acme.ping", input: z.object({}), output: z.object({}), handler: async () => ({}) }),
    );
    refusal(() => defineDriver({ id: "", kinds: ["power"], runsOn: "site" }));
    refusal(() => betterCompute({ limits: { maxBodyBytes: 0 } }));
  });
});
