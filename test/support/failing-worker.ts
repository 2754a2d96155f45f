// A deployment for test/node/stack-logs.test.ts: the default modules plus one method that logs
// at info and then fails unexpectedly (a 500), run by `wrangler dev` (startStack's main).
import { z } from "zod";
import { betterCompute, definePlugin } from "../../core/index.ts";
import { defineMethod } from "../../core/public.ts";
import { metalModule } from "../../plugins/metal/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";

const explode = defineMethod({
  name: "acme.explode",
  input: z.object({}),
  output: z.object({}),
  handler: async (ctx) => {
    ctx.log.info("acme.explode is about to fail", { routine: true });
    throw new Error("the acme widget store fell over");
  },
});

const acmeFailing = definePlugin({ id: "acme-failing", iam: { actions: { "acme.explode": "Fail on purpose" } }, api: [explode] });

const entry = deploymentEntry(betterCompute({ modules: [provisionModule(), metalModule()], plugins: [acmeFailing] }));
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
