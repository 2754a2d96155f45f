// The lifecycle table is the only place metal's rules live (issue 11, point 4): every transitional
// state has the event that settles it and a way to fail; every method that moves a machine refuses
// a state its event does not leave from, naming exactly the states the table allows; and the
// database (its state CHECK, the reconciler's index, the workflow attempts' CHECK) agrees with the
// tables, while the migrations that made it keep the text they were applied with.
import { createHash } from "node:crypto";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { metalModule } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";
import { inProcessControlPlane, type SimControlPlane } from "../../testing/metal-sim-control-plane.ts";
import {
  FLAG_CHANGES,
  METAL_STATES,
  ON_WORKFLOW_SUCCESS,
  TRANSITIONAL_STATES,
  TRANSITIONS,
  type FlagChange,
  type MetalEvent,
  type MetalState,
} from "../../plugins/metal/lifecycle.ts";
import { ATTEMPT_MOVES, ATTEMPT_STATES } from "../../plugins/provision/engine.ts";
import { refusal } from "../support/refusal.ts";

describe("the lifecycle table", () => {
  it("settles every transitional state by an event of the reconciler's that leaves from it, to a state no workflow drives; fail leaves from each", () => {
    expect(TRANSITIONAL_STATES.length).toBeGreaterThan(0);
    for (const state of TRANSITIONAL_STATES) {
      const settle = TRANSITIONS[ON_WORKFLOW_SUCCESS[state]];
      expect(settle.from, `${state} is settled by ${ON_WORKFLOW_SUCCESS[state]}`).toContain(state);
      expect(settle.by).toEqual(["reconciler"]);
      expect(TRANSITIONAL_STATES).not.toContain(settle.to);
      expect(TRANSITIONS.fail.from).toContain(state);
    }
    expect([...TRANSITIONS.fail.from].sort()).toEqual([...TRANSITIONAL_STATES].sort());
  });

  it("calls a state transitional exactly when only the reconciler moves a machine out of it", () => {
    for (const state of METAL_STATES) {
      const leaving = Object.values(TRANSITIONS).filter((t) => (t.from as readonly MetalState[]).includes(state));
      const onlyReconciler = leaving.length > 0 && leaving.every((t) => t.by.every((mover) => mover === "reconciler"));
      expect(onlyReconciler, state).toBe((TRANSITIONAL_STATES as MetalState[]).includes(state));
    }
  });

  it("gives every attempt state that is not finished a move to succeeded and to failed", () => {
    const moves = Object.values(ATTEMPT_MOVES);
    for (const state of ATTEMPT_STATES.filter((s) => s !== "succeeded" && s !== "failed")) {
      for (const end of ["succeeded", "failed"]) {
        expect(
          moves.some((m) => m.to === end && (m.from as readonly string[]).includes(state)),
          `${state} → ${end}`,
        ).toBe(true);
      }
    }
  });
});

/** The sha256 of each migration as it was applied; an applied migration's text never changes. */
const APPLIED = {
  "metal/0001_metal": "2994e5c4d1a9d23bf01406516ac059f3058948f98ec6a8d183d53bfa2c4190a6",
  "metal/0002_addresses": "257f7189d3392398a59e16c25bb393ca0f5c4003d036cb45d80c2fe6d0b5e2de",
  "metal/0003_rescue": "d13892b2b1b91d9995f38a4232e5fb8b440d7d22bc213b20b5627c72fe3f9435",
  "metal/0004_one_machine_per_bmc_and_uuid": "405ca6532be8a20b3064f44b3d058920151ac0402adfa05c927a4b146939c6c4",
  "provision/0001_workflows": "5d8bbe0c9bba15f3dc440cb3f0ad702b648b7ceef6aa66501995d62011157f4d",
  "provision/0002_workflows_list": "1d030d85e06a567f3ff14a29c38654d0944f22fe4b752e274a42cc76a846efa4",
};

describe("the migrations", () => {
  it("keep the text every applied metal and provision migration was applied with", () => {
    const registered = new Map(
      [metalModule(), provisionModule()]
        .flatMap((mod) => mod.migrations ?? [])
        .map((m) => [m.name, createHash("sha256").update(m.sql).digest("hex")]),
    );
    for (const [name, sha256] of Object.entries(APPLIED)) expect(registered.get(name), name).toBe(sha256);
  });
});

let cp: SimControlPlane;
beforeAll(async () => {
  cp = await inProcessControlPlane({});
  // A site with no agent: enrolled machines stay enrolled, and nothing but this file moves them.
  await cp.call("metal.sites.create", { id: "table" });
  await cp.call("metal.pools.create", { id: "table-metal", site: "table", policy: { hardwareProfile: "redfish-pxe" } });
  await cp.call("metal.enroll", {
    id: "m-table",
    pool: "table-metal",
    bmc: { address: "https://192.0.2.40/redfish/v1/Systems/1", username: "admin", password: "not-a-real-one" },
  });
}, 60_000);
afterAll(() => cp?.stop());

const rows = async <T>(query: ReturnType<typeof sql>) => (await cp.store.db.execute(query)).rows as T[];
/** The quoted states in a CHECK or an index predicate, as Postgres prints it back. */
const quoted = (definition: string) => [...definition.matchAll(/'([a-z_]+)'/g)].map((m) => m[1]!).sort();

describe("the database agrees with the tables", () => {
  it("metal_nodes allows exactly the table's states, and the reconciler's index holds enrolled and the transitional states", async () => {
    const [check] = await rows<{ def: string }>(
      sql`SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname = 'metal_nodes_state_check'`,
    );
    expect(quoted(check!.def)).toEqual([...METAL_STATES].sort());
    const [moving] = await rows<{ def: string }>(sql`SELECT indexdef AS def FROM pg_indexes WHERE indexname = 'metal_nodes_moving'`);
    expect(quoted(moving!.def)).toEqual(["enrolled", ...TRANSITIONAL_STATES].sort());
  });

  it("workflow_steps allows exactly the attempt states", async () => {
    const [check] = await rows<{ def: string }>(sql`
      SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
      WHERE c.conrelid = 'workflow_steps'::regclass AND c.contype = 'c' AND a.attname = 'state'`);
    expect(quoted(check!.def)).toEqual([...ATTEMPT_STATES].sort());
  });
});

describe("a method called in a state its event does not leave from", () => {
  const cases: { method: string; event: MetalEvent | FlagChange; input: Record<string, unknown> }[] = [
    { method: "metal.deploy", event: "deploy", input: { profile: "metal.deploy.image-stream", input: {} } },
    { method: "metal.undeploy", event: "undeploy", input: {} },
    { method: "metal.rescue", event: "rescue", input: {} },
    { method: "metal.unrescue", event: "unrescue", input: {} },
    { method: "metal.nodes.recommission", event: "recommission", input: {} },
    { method: "metal.nodes.retire", event: "retire", input: { reason: "a test" } },
    { method: "metal.nodes.maintenance", event: "maintenance.on", input: { on: true, reason: "a test" } },
    { method: "metal.nodes.maintenance", event: "maintenance.off", input: { on: false } },
  ];
  const allowed = (event: MetalEvent | FlagChange): readonly MetalState[] =>
    (event in FLAG_CHANGES ? FLAG_CHANGES[event as FlagChange] : TRANSITIONS[event as MetalEvent]).from;

  it.each(cases)(
    "$method ($event) is FAILED_PRECONDITION naming exactly the states the table allows, and writes nothing",
    async ({ method, event, input }) => {
      const wrong = METAL_STATES.filter((s) => !allowed(event).includes(s));
      expect(wrong.length).toBeGreaterThan(0);
      for (const state of wrong) {
        // Held in that state by this test alone (no workflow drives it, the site has no agent).
        await cp.store.db.execute(
          sql`UPDATE metal_nodes SET state = ${state}, maintenance = false, maintenance_reason = NULL, workflow_id = NULL WHERE id = 'm-table'`,
        );
        const before = await rows(
          sql`SELECT (SELECT count(*)::int FROM metal_transitions) AS transitions, (SELECT count(*)::int FROM workflows) AS workflows`,
        );
        const err = await refusal(cp.call(method, { node: "m-table", ...input }));
        expect(err.code, `${method} in ${state}`).toBe("FAILED_PRECONDITION");
        expect(err.details).toEqual({ node: "m-table", state, allowed: allowed(event) });
        expect(err.message).toContain(`metal node m-table is ${state};`);
        const named = /needs it in state (.+?)(?:: |$)/.exec(err.message)?.[1];
        expect(named?.split(/, | or /), err.message).toEqual(allowed(event));
        expect(
          await rows(
            sql`SELECT (SELECT count(*)::int FROM metal_transitions) AS transitions, (SELECT count(*)::int FROM workflows) AS workflows`,
          ),
        ).toEqual(before);
        expect((await rows<{ state: string }>(sql`SELECT state FROM metal_nodes WHERE id = 'm-table'`))[0]!.state).toBe(state);
      }
    },
  );
});
