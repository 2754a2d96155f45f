// A deployment for test/node/ramdisk-image.test.ts (startStack's main): the default modules plus a
// test plugin of two methods a real deployment would reach through its workflows' steps, which
// the public API does not offer an operator on purpose. `ramdiskTest.provisionedToken` mints a
// provisioned ramdisk token bound to a product UUID (ctx.pki.mintJoinToken, as a deploy does);
// `ramdiskTest.writeImage` seals the config drive's join token and sends metal.ramdisk.writeImage
// with it as a secret reference (commands.create carries no secret references).
import { z } from "zod";
import { betterCompute, definePlugin } from "../../core/index.ts";
import { defineMethod, resourceId } from "../../core/public.ts";
import { metalModule } from "../../plugins/metal/index.ts";
import { provisionModule } from "../../plugins/provision/index.ts";
import { deploymentEntry } from "../../workers/api/entry.ts";

const provisionedToken = defineMethod({
  name: "ramdiskTest.provisionedToken",
  input: z.object({ productUuid: z.string().min(1) }),
  output: z.object({ token: z.string(), nodeId: z.string() }),
  handler: async (ctx, input, tx) => {
    const minted = await ctx.pki.mintJoinToken(tx, { role: "ramdisk", expect: { productUuid: input.productUuid } });
    return { token: minted.token, nodeId: minted.nodeId };
  },
});

const writeImage = defineMethod({
  name: "ramdiskTest.writeImage",
  resource: (input) => `nodes/${input.node}`,
  input: z.object({ node: resourceId, body: z.record(z.string(), z.unknown()), joinToken: z.string().min(1) }),
  output: z.object({ id: z.string() }),
  handler: async (ctx, input, tx) => {
    const ref = await ctx.secrets.put(tx, { module: "ramdisk-test", name: `config-drive/${crypto.randomUUID()}`, value: input.joinToken });
    const configDrive = { ...(input.body.configDrive as Record<string, unknown>), joinToken: ref };
    const command = await ctx.commands.enqueue(tx, {
      nodeId: input.node,
      kind: "metal.ramdisk.writeImage",
      key: `ramdisk-test:${crypto.randomUUID()}`,
      body: { ...input.body, configDrive },
      secretRefs: [ref],
      deadlineSeconds: 600,
    });
    return { id: command.id };
  },
});

const ramdiskTest = definePlugin({
  id: "ramdisk-test",
  description: "Test methods for the ramdisk image test",
  iam: {
    actions: {
      "ramdiskTest.provisionedToken": "Mint a provisioned ramdisk token",
      "ramdiskTest.writeImage": "Write an image with a config drive",
    },
  },
  api: [provisionedToken, writeImage],
});

const entry = deploymentEntry(betterCompute({ modules: [provisionModule(), metalModule()], plugins: [ramdiskTest] }));
export const NodeDO = entry.NodeDO;
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;
export default entry.handler;
