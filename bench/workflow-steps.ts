// The workflow bench's plugin: a profile of ten control-plane steps that do nothing, so the
// figures are the engine's own cost (its transactions, the WorkflowDO, its wake-ups).
import { z } from "zod";
import { definePlugin } from "better-compute";
import { defineProfile, defineStep } from "better-compute/provision";

const noop = defineStep({
  id: "bench.noop",
  runsOn: "control-plane",
  input: z.object({}),
  run: async (ctx) => ({ step: ctx.step.position }),
});

export const benchSteps = definePlugin({
  id: "bench-steps",
  extensions: [noop],
  profiles: [
    defineProfile({
      id: "bench.tenSteps",
      target: "bench",
      steps: Array.from({ length: 10 }, (_, i) => ({ step: "bench.noop", name: `noop-${i + 1}` })),
    }),
  ],
});
