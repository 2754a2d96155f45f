// Operators' serial consoles on the simulated site (plugins/metal/console.ts): opening one is an
// audit row and reading it is not, a session belongs to its machine, typing is its own action
// (the metal-console role reads and never types), and a BMC that offers no console says so,
// through the real site agent. The emulated site shows real consoles (test/node/emulated-site.test.ts).
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";

let sim: MetalSim;
let node: string;
let other: string;
beforeAll(async () => {
  sim = await createMetalSim({ machines: 2 });
  node = (await sim.enroll(sim.machines[0]!)).id;
  other = (await sim.enroll(sim.machines[1]!)).id;
}, 60_000);
afterAll(() => sim?.stop());

const audited = async (action: string) =>
  (await sim.store.db.execute(sql`SELECT actor, resource FROM bc_audit WHERE action = ${action} ORDER BY id`)).rows as {
    actor: string;
    resource: string;
  }[];
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: Error & { code?: string }) => ({ code: e.code, message: e.message }),
  );

describe("a machine's serial console", () => {
  it("opening it is an audit row, reading it is not; a simulated BMC's missing console is UNSUPPORTED, naming the BMC", async () => {
    const opened = await sim.call<Record<string, any>>("metal.nodes.console", { node });
    expect(opened).toMatchObject({ node, connection: null, data: "", stale: false });
    expect(opened.session).toMatch(/^con-/);
    expect(await audited("metal.nodes.console")).toMatchObject([{ resource: `metal/nodes/${node}` }]);

    const read = await refusal(sim.call("metal.nodes.consoleRead", { node, session: opened.session }));
    expect(read).toMatchObject({ code: "UNSUPPORTED", message: expect.stringMatching(/offers no Telnet serial console/) });
    expect(await audited("metal.nodes.consoleRead")).toEqual([]);
    // What the site agent was asked: the binding with its password by reference, never the password.
    const asked = sim.commandsSeen.filter((c) => c.kind === "metal.bmc.console");
    expect(asked.length).toBeGreaterThan(0);
    expect(asked.every((c) => String((c.body.bmc as { password: string }).password).startsWith("secret://"))).toBe(true);
  });

  it("a session is its machine's: another machine's or an unknown one is refused", async () => {
    const { session } = await sim.call<{ session: string }>("metal.nodes.console", { node });
    expect(await refusal(sim.call("metal.nodes.consoleRead", { node: other, session }))).toMatchObject({ code: "INVALID_ARGUMENT" });
    expect(await refusal(sim.call("metal.nodes.consoleRead", { node, session: "con-nope" }))).toMatchObject({ code: "NOT_FOUND" });
  });

  it("the metal-console role watches and never types; an opener types into its own session only", async () => {
    const { key } = await sim.call<{ key: string }>("iam.apiKeys.create", { name: "on-call", roles: ["metal-console"] });
    const { session } = await sim.control.callAs<{ session: string }>(key, "metal.nodes.console", { node });
    const typed = await refusal(sim.control.callAs(key, "metal.nodes.consoleWrite", { node, session, text: "root\r" }));
    expect(typed).toMatchObject({ code: "PERMISSION_DENIED" });
    // The admin may type, into a session of its own only.
    expect(await refusal(sim.call("metal.nodes.consoleWrite", { node, session, text: "root\r" }))).toMatchObject({
      code: "PERMISSION_DENIED",
    });
    const mine = await sim.call<{ session: string }>("metal.nodes.console", { node });
    expect(await refusal(sim.call("metal.nodes.consoleWrite", { node, session: mine.session, text: "root\r" }))).toMatchObject({
      code: "UNSUPPORTED",
    });
    // The audit log records what was done: a refused call leaves no row.
    expect(await audited("metal.nodes.consoleWrite")).toEqual([]);
  });
});
