// The methods that read and move machines (sites and pools are sites.ts's). Each checks the
// lifecycle table (assertCan) before it acts and moves the machine by the table's event; the
// workflow it starts does the work, and the reconciler settles the machine when that ends.
import { sql } from "drizzle-orm";
import { z } from "zod";
import type { DriverDefinition } from "better-compute";
import {
  ComputeError,
  conflict,
  defineGetMethod,
  defineListMethod,
  defineMethod,
  invalidArgument,
  invalidConfig,
  isSecretRef,
  notFound,
  one,
  resourceId,
  rows,
  schemaIssues,
  type MethodContext,
  type MethodDefinition,
  type ModuleContext,
  type SecretRef,
  type Tx,
} from "better-compute/core";
import type { ProfileDefinition, StepDefinition } from "better-compute/provision";
import { bmcTls } from "./bmc-address.ts";
import { lifecycleProfile, type HardwareProfiles } from "./hardware.ts";
import { anyOf, assertCan, isTransitional, METAL_STATES, transition, TRANSITIONS, type MetalState } from "./lifecycle.ts";
import {
  commissionIfAble,
  loadNode,
  metalNode,
  metalNodeDetail,
  NODE_COLUMNS,
  nodeDetail,
  refuseHeldBmc,
  revokeRamdisks,
  runLifecycle,
  toNode,
  type NodeRow,
} from "./nodes.ts";
import { slug, type Policy } from "./sites.ts";
import { waitAgentJoined } from "./steps.ts";

/** A step that runs on an agent of the machine (ramdisk, installed node) or waits for one to join. */
function needsAgent(ctx: ModuleContext, stepId: string): boolean {
  const step = ctx.registered.extensions<StepDefinition>("step").find((s) => s.id === stepId);
  return step !== undefined && (step.runsOn === "ramdisk" || step.runsOn === "node" || step.id === waitAgentJoined.id);
}

/** What to do first about a machine that cannot be retired yet. */
const beforeRetiring = (state: MetalState) =>
  state === "deployed"
    ? "undeploy it first"
    : state === "rescue"
      ? "unrescue and undeploy it first"
      : isTransitional(state)
        ? "wait until its workflow ends"
        : undefined;

export const nodeActions = {
  "metal.enroll": "Enroll machines by their BMC",
  "metal.nodes.get": "Read a machine",
  "metal.nodes.list": "List machines",
  "metal.deploy": "Deploy machines",
  "metal.undeploy": "Release machines (wipes their disks)",
  "metal.nodes.recommission": "Take failed machines out of maintenance",
  "metal.nodes.retire": "Take machines out of service for good",
  "metal.nodes.maintenance": "Put machines in maintenance and take them out",
  "metal.rescue": "Boot deployed machines into the ramdisk and back",
};

export function nodeMethods(hardwareProfiles: HardwareProfiles): MethodDefinition<any, any>[] {
  const profileFor = (node: NodeRow, which: Parameters<typeof lifecycleProfile>[2]) => lifecycleProfile(hardwareProfiles, node, which);

  const enroll = defineMethod({
    name: "metal.enroll",
    resource: (input) => `metal/pools/${input.pool}`,
    description: "Enroll a machine by its BMC; commissioning starts by itself (the password is sealed and never shown again)",
    input: z.object({
      id: slug.optional(),
      pool: resourceId,
      bmc: z
        .object({
          address: z.string(),
          username: z.string(),
          /** The BMC password (sealed at once) or a secret:// reference to one already stored. */
          password: z.string().min(1).max(256),
          /** How the site agent trusts an https BMC's certificate: caBundle (PEM) and/or spkiSha256 (a pin); see docs/bmc.md. */
          tls: bmcTls.optional(),
          // Other fields belong to the power driver (hetzner-robot: rescueKeys); its manifest checks them all.
        })
        .catchall(z.unknown()),
    }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      const pool = await one<{ id: string; site_id: string; policy: Policy }>(
        tx,
        sql`SELECT id, site_id, policy FROM metal_pools WHERE id = ${input.pool}`,
      );
      if (!pool) throw notFound(`pool ${input.pool} does not exist`);
      const driverId = hardwareProfiles[pool.policy.hardwareProfile]?.drivers.power;
      const driver = ctx.registered.extensions<DriverDefinition>("driver").find((d) => d.id === driverId && d.kinds.includes("power"));
      if (!driver)
        throw invalidConfig(`hardware profile ${pool.policy.hardwareProfile} names power driver ${driverId}, which is not registered`);
      await refuseHeldBmc(tx, input.bmc.address);
      const id = input.id ?? `m-${crypto.randomUUID().slice(0, 8)}`;
      const password = isSecretRef(input.bmc.password)
        ? (input.bmc.password as SecretRef)
        : await ctx.secrets.put(tx, { module: "metal", name: `bmc/${id}`, value: input.bmc.password });
      const binding = { driver: driver.id, ...input.bmc, password };
      const checked = driver.manifest?.safeParse(binding);
      if (checked && !checked.success)
        throw invalidArgument(`the BMC binding does not match driver ${driver.id}'s manifest`, { issues: schemaIssues(checked.error) });
      const inserted = await tx.execute(sql`
        INSERT INTO metal_nodes (id, pool_id, site_id, bmc, state) VALUES (${id}, ${pool.id}, ${pool.site_id}, ${JSON.stringify(binding)}::jsonb, 'enrolled')
        ON CONFLICT DO NOTHING RETURNING id`);
      if (inserted.rows.length === 0) {
        // Lost a race for the id or the BMC (the insert waited for the other transaction to commit).
        if ((await tx.execute(sql`SELECT 1 FROM metal_nodes WHERE id = ${id}`)).rows.length)
          throw conflict(`metal node ${id} already exists`, { node: id });
        await refuseHeldBmc(tx, input.bmc.address);
        throw conflict(`metal node ${id} could not be enrolled: its BMC is held by another machine`);
      }
      await ctx.events.publish(tx, {
        type: "metal.node.enrolled",
        subject: `metal/nodes/${id}`,
        data: { pool: pool.id, bmc: input.bmc.address },
      });
      const node = await loadNode(tx, id);
      // Commissioning starts now if the site has an agent (or the pool needs none); otherwise the reconciler starts it once one joins.
      await commissionIfAble(ctx, tx, hardwareProfiles, node, profileFor(node, "commission"));
      return toNode(await loadNode(tx, id));
    },
  });

  const nodesGet = defineGetMethod({
    name: "metal.nodes.get",
    what: "metal node",
    collection: "metal/nodes",
    key: "node",
    description: "A machine, with the hardware commissioning found on it (inventory: null until it was inspected)",
    output: metalNodeDetail,
    find: async (tx, id) => nodeDetail(tx, await loadNode(tx, id)),
  });

  const nodesList = defineListMethod({
    name: "metal.nodes.list",
    input: z.object({
      pool: resourceId.optional(),
      site: resourceId.optional(),
      state: z.enum(METAL_STATES).optional(),
      maintenance: z.boolean().optional(),
    }),
    items: { nodes: metalNode },
    find: async (tx, input) => {
      const nodes = await rows<NodeRow>(
        tx,
        sql`
        SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id
        WHERE (${input.pool ?? null}::text IS NULL OR n.pool_id = ${input.pool ?? null})
          AND (${input.site ?? null}::text IS NULL OR n.site_id = ${input.site ?? null})
          AND (${input.state ?? null}::text IS NULL OR n.state = ${input.state ?? null})
          AND (${input.maintenance ?? null}::boolean IS NULL OR n.maintenance = ${input.maintenance ?? null})
        ORDER BY n.created_at, n.id LIMIT 1000`,
      );
      return nodes.map(toNode);
    },
  });

  const deploy = defineMethod({
    name: "metal.deploy",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Deploy a ready machine with a profile (target metal); it ends deployed with the profile's role",
    input: z.object({
      node: resourceId,
      profile: resourceId,
      version: resourceId.optional(),
      input: z.record(z.string(), z.unknown()).default({}),
    }),
    output: z.object({ node: z.string(), workflow: z.string() }),
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      if (node.maintenance)
        throw new ComputeError(
          "FAILED_PRECONDITION",
          `metal node ${node.id} is in maintenance: ${node.maintenance_reason ?? "no reason given"}`,
        );
      assertCan(node, "deploy");
      const profile = ctx.registered
        .extensions<ProfileDefinition>("profile")
        .find((p) => p.id === input.profile && (!input.version || p.version === input.version));
      if (!profile) throw notFound(`no profile ${input.profile} is registered`);
      if (profile.target !== "metal") throw invalidArgument(`profile ${profile.id} targets ${profile.target}, not metal`);
      if (node.pool_agent === "none") {
        const needy = profile.steps.find((s) => needsAgent(ctx, s.step));
        if (needy)
          throw new ComputeError(
            "UNSUPPORTED",
            `pool ${node.pool_id} is agentless (agent: none); profile ${profile.id} needs an agent on the machine (step ${needy.name ?? needy.step})`,
          );
      }
      const wf = await runLifecycle(ctx, tx, hardwareProfiles, node, "deploy", profile.id, input.input, {
        role: profile.role ?? "host",
        version: profile.version,
        createdBy: ctx.principal.id,
      });
      return { node: node.id, workflow: wf.id };
    },
  });

  /**
   * A method that moves a machine by a lifecycle event and starts the workflow its hardware
   * profile names for it (`profile`): under the machine's row lock, `refuse` may say no first,
   * then the lifecycle table does (assertCan), then `before` readies it. Answers the machine and
   * its workflow.
   */
  const lifecycleMethod = (def: {
    name: string;
    action?: string;
    description: string;
    event: "undeploy" | "rescue" | "unrescue";
    profile: "release" | "rescue" | "unrescue";
    refuse?: (node: NodeRow, profile: string) => void;
    before?: (ctx: MethodContext, tx: Tx, node: NodeRow) => Promise<unknown>;
  }) =>
    defineMethod({
      name: def.name,
      action: def.action,
      resource: (input) => `metal/nodes/${input.node}`,
      description: def.description,
      input: z.object({ node: resourceId }),
      output: z.object({ node: z.string(), workflow: z.string() }),
      handler: async (ctx, input, tx) => {
        const node = await loadNode(tx, input.node, true);
        const profile = profileFor(node, def.profile);
        def.refuse?.(node, profile);
        assertCan(node, def.event);
        await def.before?.(ctx, tx, node);
        const wf = await runLifecycle(ctx, tx, hardwareProfiles, node, def.event, profile, {}, { createdBy: ctx.principal.id });
        return { node: node.id, workflow: wf.id };
      },
    });

  const undeploy = lifecycleMethod({
    name: "metal.undeploy",
    description: "Release a deployed machine: its disks are wiped (attested) before it is ready again",
    event: "undeploy",
    profile: "release",
    // The installed system's agent goes with its disks: it can no longer renew or reconnect.
    before: (ctx, tx, node) =>
      ctx.nodes.revoke(tx, { role: "node", labels: { "bc.dev/machine": node.id } }, `metal node ${node.id} is being released`),
  });

  const recommission = defineMethod({
    name: "metal.nodes.recommission",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Take a failed machine out of maintenance and commission it again from the start",
    input: z.object({ node: resourceId }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      assertCan(await loadNode(tx, input.node, true), "recommission");
      await transition(ctx, tx, input.node, "recommission", {
        maintenance: false,
        reason: null,
        workflowId: null,
        role: null,
        lastError: null,
      });
      const node = await loadNode(tx, input.node);
      await commissionIfAble(ctx, tx, hardwareProfiles, node, profileFor(node, "commission"));
      return toNode(await loadNode(tx, input.node));
    },
  });

  const rescue = lifecycleMethod({
    name: "metal.rescue",
    description:
      "Boot a deployed machine into the ramdisk (its disk untouched) for an operator to look into; metal.unrescue boots it from its disk again",
    event: "rescue",
    profile: "rescue",
    // metal.rescue boots the ramdisk; a hardware profile may rescue without one (hetzner-robot: Hetzner's rescue system).
    refuse: (node, profile) => {
      if (node.pool_agent === "none" && profile === TRANSITIONS.rescue.profile)
        throw new ComputeError(
          "UNSUPPORTED",
          `pool ${node.pool_id} is agentless (agent: none): no ramdisk can boot on metal node ${node.id} to rescue it`,
        );
    },
  });

  const unrescue = lifecycleMethod({
    name: "metal.unrescue",
    action: "metal.rescue",
    description: "Boot a rescued machine from its disk again; the rescue ramdisk is revoked",
    event: "unrescue",
    profile: "unrescue",
    before: (ctx, tx, node) => revokeRamdisks(ctx, tx, node, `metal node ${node.id} leaves rescue`),
  });

  const retire = defineMethod({
    name: "metal.nodes.retire",
    resource: (input) => `metal/nodes/${input.node}`,
    description: `Take a machine out of service for good (${anyOf(TRANSITIONS.retire.from)}); its BMC may be enrolled again as a new machine`,
    input: z.object({ node: resourceId, reason: z.string().min(1).max(500).optional() }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      const reason = input.reason ?? "retired by an operator";
      assertCan(node, "retire", beforeRetiring);
      await transition(ctx, tx, node.id, "retire", { workflowId: null, role: null, maintenance: false, reason });
      // Nothing may act for it again: whatever agent joined for it (an installed system, a ramdisk) is revoked.
      await ctx.nodes.revoke(tx, { role: "node", labels: { "bc.dev/machine": node.id } }, `metal node ${node.id} was retired`);
      await revokeRamdisks(ctx, tx, node, `metal node ${node.id} was retired`);
      return toNode(await loadNode(tx, node.id));
    },
  });

  const maintenance = defineMethod({
    name: "metal.nodes.maintenance",
    resource: (input) => `metal/nodes/${input.node}`,
    description:
      "Put a machine in maintenance (on, with a reason: nothing new starts on it) or take it out (off); not while a workflow drives it",
    input: z.object({ node: resourceId, on: z.boolean(), reason: z.string().min(1).max(500).optional() }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      if (input.on && !input.reason) throw invalidArgument("a reason is required to put a machine in maintenance");
      const node = await loadNode(tx, input.node, true);
      const change = input.on ? "maintenance.on" : "maintenance.off";
      assertCan(node, change, (state) => {
        if (state === "retired") return "a retired machine is out of service for good";
        // Maintenance stops nothing already running; the workflow's end decides (a failure turns maintenance on itself).
        if (isTransitional(state))
          return `maintenance does not stop its workflow ${node.workflow_id}: wait until it ends, or cancel it (workflows.cancel; the machine then ends failed, in maintenance)`;
        if (state === "failed") return "a failed machine leaves maintenance by metal.nodes.recommission";
      });
      const reason = input.on ? input.reason! : null;
      if (node.maintenance === input.on && node.maintenance_reason === reason) return toNode(node);
      await tx.execute(
        sql`UPDATE metal_nodes SET maintenance = ${input.on}, maintenance_reason = ${reason}, updated_at = compute_now() WHERE id = ${node.id}`,
      );
      await tx.execute(sql`
        INSERT INTO metal_transitions (node_id, event, from_state, to_state, workflow_id, reason)
        VALUES (${node.id}, ${change}, ${node.state}, ${node.state}, ${node.workflow_id}, ${input.reason ?? null})`);
      await ctx.events.publish(tx, {
        type: `metal.node.${change}`,
        subject: `metal/nodes/${node.id}`,
        data: { state: node.state, ...(input.reason ? { reason: input.reason } : {}) },
      });
      // Out of maintenance, an enrolled machine commissions now (as at enroll), not at the next cron pass.
      if (node.state === "enrolled" && !input.on)
        await commissionIfAble(ctx, tx, hardwareProfiles, await loadNode(tx, node.id), profileFor(node, "commission"), {
          createdBy: ctx.principal.id,
        });
      return toNode(await loadNode(tx, node.id));
    },
  });

  return [enroll, nodesGet, nodesList, deploy, undeploy, recommission, retire, maintenance, rescue, unrescue];
}
