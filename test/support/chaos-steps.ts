// The five-step workflow the chaos test crashes at every boundary: three control-plane steps
// and two agent steps, the second destructive.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { definePlugin } from "../../core/index.ts";
import { defineProfile, defineStep } from "../../plugins/provision/index.ts";

/** A control-plane step whose runs are counted (it runs at least once per attempt). */
const mark = (id: string) =>
  defineStep({
    id,
    runsOn: "control-plane",
    input: z.object({}),
    run: async (ctx) => {
      await ctx.store.db.execute(sql`INSERT INTO chaos_runs (workflow_id, step) VALUES (${ctx.workflow.id}, ${id})`);
      return { done: id };
    },
  });

export const chaosSteps = definePlugin({
  id: "chaos-steps",
  migrations: [
    {
      name: "chaos-steps/0001_runs",
      sql: "CREATE TABLE IF NOT EXISTS chaos_runs (id serial PRIMARY KEY, workflow_id text NOT NULL, step text NOT NULL)",
    },
  ],
  commands: [
    { kind: "chaos.inventory", input: z.object({}), roles: ["node"] },
    { kind: "chaos.wipe", input: z.object({ disk: z.string() }), attested: true, destructive: true, roles: ["node"] },
  ],
  extensions: [
    mark("chaos.prepare"),
    mark("chaos.plan"),
    mark("chaos.report"),
    defineStep({
      id: "chaos.inventory",
      runsOn: "node",
      sends: ["chaos.inventory"],
      input: z.object({}),
      command: { kind: "chaos.inventory" },
    }),
    defineStep({
      id: "chaos.wipe",
      runsOn: "node",
      sends: ["chaos.wipe"],
      input: z.object({ disk: z.string() }),
      command: { kind: "chaos.wipe", body: (input) => ({ disk: input.disk }) },
    }),
  ],
  profiles: [
    defineProfile({
      id: "chaos.five",
      target: "node",
      steps: [
        { step: "chaos.prepare" },
        { step: "chaos.inventory" },
        { step: "chaos.plan" },
        { step: "chaos.wipe", fromStep: "chaos.inventory" },
        { step: "chaos.report" },
      ],
    }),
  ],
});
