// The metal module: sites, pools, hardware profiles, BMC bindings and the node lifecycle.
// Methods move a machine by events of the state machine (lifecycle.ts) and start the workflow
// that does the work; the reconciler moves it on when that workflow ends, and starts
// commissioning for enrolled machines by itself.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineModule, type DriverDefinition, type DriverKind, type Module } from "better-compute";
import { ComputeError, conflict, defineMethod, invalidArgument, invalidConfig, notFound, resourceId, schemaIssues, type ModuleContext, type SecretRef, type Tx } from "better-compute/core";
import { startWorkflow, type ProfileDefinition, type StepDefinition } from "better-compute/provision";
import { bmcTls } from "./bmc-address.ts";
import { METAL_STATES, transition, type MetalEvent, type MetalState } from "./lifecycle.ts";
import { siteAndPoolActions, siteAndPoolMethods, slug, type Policy } from "./sites.ts";
import { commissionProfileFor, imageStreamDriver, ipxeDriver, metalCommands, metalProfiles, metalSteps, redfishDriver, siteAgentOf as siteAgent, waitAgentJoined, WIPE_STEP, type BmcBinding } from "./steps.ts";

export interface HardwareProfile {
  description?: string;
  /** Driver id per kind; each must be a registered driver of that kind. power's manifest validates BMC bindings. */
  drivers: Partial<Record<DriverKind, string>> & { power: string };
  /** BIOS settings staged during commissioning (applied when the ramdisk boots). */
  bios?: Record<string, string | number | boolean>;
  /** The RAID volume commissioning makes (replacing any other): level, and drives (default all). */
  raid?: { level: "RAID0" | "RAID1" | "RAID5" | "RAID10"; drives?: number | "all" };
  /** Workflow profiles for the lifecycle's own work; default metal.commission (or metal.commission.<name> with bios/raid) and metal.release. */
  profiles?: { commission?: string; release?: string };
}

export interface MetalOptions {
  hardwareProfiles?: Record<string, HardwareProfile>;
}

export const DEFAULT_HARDWARE_PROFILES: Record<string, HardwareProfile> = {
  "redfish-pxe": {
    description: "Redfish BMC, PXE into the bcd ramdisk through the site agent, image streamed from the ramdisk",
    drivers: { power: "redfish", management: "redfish", boot: "ipxe", deploy: "image-stream" },
  },
};

/** The states metal/0001 was written with (a migration's text never changes; 0003 adds rescue's). */
const FIRST_STATES = ["enrolled", "commissioning", "ready", "deploying", "deployed", "releasing", "failed", "retired"];

const SCHEMA_SQL = `
CREATE TABLE IF NOT EXISTS metal_sites (
  id text PRIMARY KEY,
  description text,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS metal_pools (
  id text PRIMARY KEY,
  site_id text NOT NULL REFERENCES metal_sites (id),
  class text NOT NULL CHECK (class IN ('metal')),
  agent text NOT NULL CHECK (agent IN ('bcd', 'none')),
  policy jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS metal_nodes (
  id text PRIMARY KEY,
  pool_id text NOT NULL REFERENCES metal_pools (id),
  site_id text NOT NULL REFERENCES metal_sites (id),
  -- The BMC binding: address and username, the password as a secret:// reference only.
  bmc jsonb NOT NULL,
  state text NOT NULL CHECK (state IN (${FIRST_STATES.map((s) => `'${s}'`).join(", ")})),
  maintenance boolean NOT NULL DEFAULT false,
  maintenance_reason text,
  role text,
  workflow_id text,
  product_uuid text,
  inventory jsonb,
  last_error jsonb,
  state_changed_at timestamptz NOT NULL DEFAULT compute_now(),
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  updated_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS metal_nodes_moving ON metal_nodes (state) WHERE state IN ('enrolled', 'commissioning', 'deploying', 'releasing');
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_bmc ON metal_nodes ((bmc->>'address')) WHERE state <> 'retired';
-- Every change of state, in order: the lifecycle's history.
CREATE TABLE IF NOT EXISTS metal_transitions (
  id bigserial PRIMARY KEY,
  node_id text NOT NULL REFERENCES metal_nodes (id),
  event text NOT NULL,
  from_state text NOT NULL,
  to_state text NOT NULL,
  workflow_id text,
  reason text,
  at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS metal_transitions_node ON metal_transitions (node_id, id);`;

// The machine's own IP addresses, as its BMC reported them: the only hosts httpViaSite may reach.
const ADDRESSES_SQL = `ALTER TABLE metal_nodes ADD COLUMN IF NOT EXISTS addresses text[] NOT NULL DEFAULT '{}';`;

// Rescue's states.
const RESCUE_SQL = `
ALTER TABLE metal_nodes DROP CONSTRAINT IF EXISTS metal_nodes_state_check;
ALTER TABLE metal_nodes ADD CONSTRAINT metal_nodes_state_check CHECK (state IN (${METAL_STATES.map((s) => `'${s}'`).join(", ")}));
DROP INDEX IF EXISTS metal_nodes_moving;
CREATE INDEX metal_nodes_moving ON metal_nodes (state) WHERE state IN ('enrolled', 'commissioning', 'deploying', 'releasing', 'rescuing', 'unrescuing');`;

// One machine per BMC and per product UUID among the machines in service. The BMC's address
// compares without a trailing slash (metal_nodes_bmc compared it as given).
const UNIQUE_MACHINE_SQL = `
DROP INDEX IF EXISTS metal_nodes_bmc;
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_bmc_address ON metal_nodes ((rtrim(bmc->>'address', '/'))) WHERE state <> 'retired';
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_product_uuid ON metal_nodes ((lower(product_uuid))) WHERE state <> 'retired';`;

/** States a workflow drives the machine through. */
const TRANSITIONAL: readonly MetalState[] = ["commissioning", "deploying", "releasing", "rescuing", "unrescuing"];

const metalNode = z.object({
  id: z.string(),
  pool: z.string(),
  site: z.string(),
  state: z.enum(METAL_STATES),
  maintenance: z.boolean(),
  maintenanceReason: z.string().nullable(),
  role: z.string().nullable(),
  workflow: z.string().nullable(),
  productUuid: z.string().nullable(),
  addresses: z.array(z.string()),
  bmc: z.object({ driver: z.string(), address: z.string(), username: z.string() }),
  lastError: z.unknown().nullable(),
});

interface NodeRow {
  id: string;
  pool_id: string;
  site_id: string;
  state: MetalState;
  maintenance: boolean;
  maintenance_reason: string | null;
  role: string | null;
  workflow_id: string | null;
  product_uuid: string | null;
  addresses: string[];
  bmc: BmcBinding;
  last_error: unknown;
  policy: Policy;
  pool_agent: "bcd" | "none";
}

const toNode = (r: NodeRow): z.input<typeof metalNode> => ({
  id: r.id, pool: r.pool_id, site: r.site_id, state: r.state, maintenance: r.maintenance, maintenanceReason: r.maintenance_reason,
  role: r.role, workflow: r.workflow_id, productUuid: r.product_uuid, addresses: r.addresses,
  bmc: { driver: r.bmc.driver, address: r.bmc.address, username: r.bmc.username }, lastError: r.last_error ?? null,
});

/** What a NodeRow holds, from metal_nodes n joined with its pool p. */
const NODE_COLUMNS = sql`n.*, p.policy, p.agent AS pool_agent`;

async function loadNode(tx: Pick<Tx, "execute">, id: string, lock = false): Promise<NodeRow> {
  const found = await tx.execute(sql`
    SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id WHERE n.id = ${id} ${lock ? sql`FOR UPDATE OF n` : sql``}`);
  const row = found.rows[0] as NodeRow | undefined;
  if (!row) throw notFound(`metal node ${id} does not exist`);
  return row;
}

/**
 * One BMC address drives one machine: enrolling an address a machine that is not retired holds is
 * a CONFLICT naming that machine. Addresses compare as the BMC reads them (a trailing slash aside).
 */
async function refuseHeldBmc(tx: Pick<Tx, "execute">, address: string): Promise<void> {
  const found = await tx.execute(sql`
    SELECT id, state FROM metal_nodes WHERE rtrim(bmc->>'address', '/') = rtrim(${address}, '/') AND state <> 'retired' LIMIT 1`);
  const holder = found.rows[0] as { id: string; state: MetalState } | undefined;
  if (holder) throw conflict(`the BMC ${address} is held by metal node ${holder.id} (${holder.state}): retire that machine to enroll its BMC again`, { node: holder.id, state: holder.state });
}

/** The machine's ramdisks (matched by product UUID at its site) can no longer act for it. */
async function revokeRamdisks(ctx: ModuleContext, tx: Tx, node: Pick<NodeRow, "product_uuid" | "site_id">, reason: string): Promise<void> {
  if (!node.product_uuid) return;
  await ctx.nodes.revoke(tx, { role: "ramdisk", labels: { "bc.dev/product-uuid": node.product_uuid, "bc.dev/site": node.site_id } }, reason);
}

/** A step that runs on an agent of the machine (ramdisk, installed node) or waits for one to join. */
function needsAgent(ctx: ModuleContext, stepId: string): boolean {
  const step = ctx.registered.extensions<StepDefinition>("step").find((s) => s.id === stepId);
  return step !== undefined && (step.runsOn === "ramdisk" || step.runsOn === "node" || step.id === waitAgentJoined.id);
}

export function metalModule(options: MetalOptions = {}): Module {
  const hardwareProfiles = { ...DEFAULT_HARDWARE_PROFILES, ...options.hardwareProfiles };
  // A hardware profile with BIOS settings or a RAID layout commissions with its own profile.
  const configured = Object.entries(hardwareProfiles).filter(([, hw]) => hw.bios || hw.raid);
  const commissionProfiles = configured.map(([name, hw]) => commissionProfileFor({ name, ...hw }));
  const lifecycleProfile = (node: Pick<NodeRow, "policy" | "pool_agent">, which: "commission" | "release") => {
    const hw = hardwareProfiles[node.policy.hardwareProfile];
    if (hw?.profiles?.[which]) return hw.profiles[which]!;
    if (node.pool_agent === "none") return `metal.${which}.agentless`;
    if (which === "release") return "metal.release";
    return hw && (hw.bios || hw.raid) ? `metal.commission.${node.policy.hardwareProfile}` : "metal.commission";
  };

  /**
   * Moves the node by event and starts the profile's workflow for it, in the caller's transaction.
   * Returns undefined (nothing written) when the node is not in a state the event leaves from.
   */
  async function runLifecycle(ctx: ModuleContext, tx: Tx, node: NodeRow, event: MetalEvent, profile: string, input: Record<string, unknown> = {}, extra: { role?: string | null; version?: string; createdBy?: string } = {}) {
    const agent = await siteAgent(tx, node.site_id);
    if (!agent) throw new ComputeError("FAILED_PRECONDITION", `site ${node.site_id} has no agent: join one with a site token (siteTokens.create)`, { site: node.site_id });
    const workflowInput = {
      ...input, machine: node.id, siteAgent: agent, bmc: node.bmc, addresses: node.addresses,
      ...(node.product_uuid ? { productUuid: node.product_uuid } : {}),
    };
    const wf = await startWorkflow(ctx, tx, { profile, ...(extra.version ? { version: extra.version } : {}), target: node.id, input: workflowInput, createdBy: extra.createdBy ?? "system:metal" });
    const moved = await transition(ctx, tx, node.id, event, { workflowId: wf.id, lastError: null, ...(extra.role !== undefined ? { role: extra.role } : {}) });
    if (!moved) throw conflict(`metal node ${node.id} is ${node.state}; ${event} needs it to be in another state`, { node: node.id, state: node.state });
    return wf;
  }

  // ------------------------------------------------------------------ methods

  const enroll = defineMethod({
    name: "metal.enroll",
    action: "metal.enroll",
    resource: (input) => `metal/pools/${input.pool}`,
    description: "Enroll a machine by its BMC; commissioning starts by itself (the password is sealed and never shown again)",
    input: z.object({
      id: slug.optional(),
      pool: resourceId,
      bmc: z.object({
        address: z.string(),
        username: z.string(),
        /** The BMC password (sealed at once) or a secret:// reference to one already stored. */
        password: z.string().min(1).max(256),
        /** How the site agent trusts an https BMC's certificate: caBundle (PEM) and/or spkiSha256 (a pin); see docs/bmc.md. */
        tls: bmcTls.optional(),
      }),
    }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      const pool = (await tx.execute(sql`SELECT id, site_id, policy FROM metal_pools WHERE id = ${input.pool}`)).rows[0] as { id: string; site_id: string; policy: Policy } | undefined;
      if (!pool) throw notFound(`pool ${input.pool} does not exist`);
      const driverId = hardwareProfiles[pool.policy.hardwareProfile]?.drivers.power;
      const driver = ctx.registered.extensions<DriverDefinition>("driver").find((d) => d.id === driverId && d.kinds.includes("power"));
      if (!driver) throw invalidConfig(`hardware profile ${pool.policy.hardwareProfile} names power driver ${driverId}, which is not registered`);
      await refuseHeldBmc(tx, input.bmc.address);
      const id = input.id ?? `m-${crypto.randomUUID().slice(0, 8)}`;
      const password = /^secret:\/\/[\w-]+$/.test(input.bmc.password)
        ? (input.bmc.password as SecretRef)
        : await ctx.secrets.put(tx, { module: "metal", name: `bmc/${id}`, value: input.bmc.password });
      const binding = { driver: driver.id, address: input.bmc.address, username: input.bmc.username, password, ...(input.bmc.tls ? { tls: input.bmc.tls } : {}) };
      const checked = driver.manifest?.safeParse(binding);
      if (checked && !checked.success) throw invalidArgument(`the BMC binding does not match driver ${driver.id}'s manifest`, { issues: schemaIssues(checked.error) });
      const inserted = await tx.execute(sql`
        INSERT INTO metal_nodes (id, pool_id, site_id, bmc, state) VALUES (${id}, ${pool.id}, ${pool.site_id}, ${JSON.stringify(binding)}::jsonb, 'enrolled')
        ON CONFLICT DO NOTHING RETURNING id`);
      if (inserted.rows.length === 0) {
        // Lost a race for the id or the BMC (the insert waited for the other transaction to commit).
        if ((await tx.execute(sql`SELECT 1 FROM metal_nodes WHERE id = ${id}`)).rows.length) throw conflict(`metal node ${id} already exists`, { node: id });
        await refuseHeldBmc(tx, input.bmc.address);
        throw conflict(`metal node ${id} could not be enrolled: its BMC is held by another machine`);
      }
      await ctx.events.publish(tx, { type: "metal.node.enrolled", subject: `metal/nodes/${id}`, data: { pool: pool.id, bmc: input.bmc.address } });
      const node = await loadNode(tx, id);
      // Commissioning starts now if the site has an agent; otherwise the reconciler starts it once one joins.
      if (await siteAgent(tx, node.site_id)) await runLifecycle(ctx, tx, node, "commission", lifecycleProfile(node, "commission"));
      return toNode(await loadNode(tx, id));
    },
  });

  const nodesGet = defineMethod({
    name: "metal.nodes.get",
    action: "metal.nodes.get",
    readOnly: true,
    resource: (input) => `metal/nodes/${input.node}`,
    input: z.object({ node: resourceId }),
    output: metalNode,
    handler: async (_ctx, input, tx) => toNode(await loadNode(tx, input.node)),
  });

  const nodesList = defineMethod({
    name: "metal.nodes.list",
    action: "metal.nodes.list",
    readOnly: true,
    input: z.object({ pool: resourceId.optional(), site: resourceId.optional(), state: z.enum(METAL_STATES).optional(), maintenance: z.boolean().optional() }),
    output: z.object({ nodes: z.array(metalNode) }),
    handler: async (_ctx, input, tx) => {
      const rows = await tx.execute(sql`
        SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id
        WHERE (${input.pool ?? null}::text IS NULL OR n.pool_id = ${input.pool ?? null})
          AND (${input.site ?? null}::text IS NULL OR n.site_id = ${input.site ?? null})
          AND (${input.state ?? null}::text IS NULL OR n.state = ${input.state ?? null})
          AND (${input.maintenance ?? null}::boolean IS NULL OR n.maintenance = ${input.maintenance ?? null})
        ORDER BY n.created_at, n.id LIMIT 1000`);
      return { nodes: (rows.rows as unknown as NodeRow[]).map(toNode) };
    },
  });

  const deploy = defineMethod({
    name: "metal.deploy",
    action: "metal.deploy",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Deploy a ready machine with a profile (target metal); it ends deployed with the profile's role",
    input: z.object({ node: resourceId, profile: resourceId, version: resourceId.optional(), input: z.record(z.string(), z.unknown()).default({}) }),
    output: z.object({ node: z.string(), workflow: z.string() }),
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      if (node.maintenance) throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is in maintenance: ${node.maintenance_reason ?? "no reason given"}`);
      if (node.state !== "ready") throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}; only a ready machine can be deployed`);
      const profile = ctx.registered.extensions<ProfileDefinition>("profile").find((p) => p.id === input.profile && (!input.version || p.version === input.version));
      if (!profile) throw notFound(`no profile ${input.profile} is registered`);
      if (profile.target !== "metal") throw invalidArgument(`profile ${profile.id} targets ${profile.target}, not metal`);
      if (node.pool_agent === "none") {
        const needy = profile.steps.find((s) => needsAgent(ctx, s.step));
        if (needy) throw new ComputeError("UNSUPPORTED", `pool ${node.pool_id} is agentless (agent: none); profile ${profile.id} needs an agent on the machine (step ${needy.name ?? needy.step})`);
      }
      const wf = await runLifecycle(ctx, tx, node, "deploy", profile.id, input.input, { role: profile.role ?? "host", version: profile.version, createdBy: ctx.principal.id });
      return { node: node.id, workflow: wf.id };
    },
  });

  const undeploy = defineMethod({
    name: "metal.undeploy",
    action: "metal.undeploy",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Release a deployed machine: its disks are wiped (attested) before it is ready again",
    input: z.object({ node: resourceId }),
    output: z.object({ node: z.string(), workflow: z.string() }),
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      if (node.state !== "deployed") throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}; only a deployed machine can be undeployed`);
      // The installed system's agent goes with its disks: it can no longer renew or reconnect.
      await ctx.nodes.revoke(tx, { role: "node", labels: { "bc.dev/machine": node.id } }, `metal node ${node.id} is being released`);
      const wf = await runLifecycle(ctx, tx, node, "undeploy", lifecycleProfile(node, "release"), {}, { createdBy: ctx.principal.id });
      return { node: node.id, workflow: wf.id };
    },
  });

  const recommission = defineMethod({
    name: "metal.nodes.recommission",
    action: "metal.nodes.recommission",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Take a failed machine out of maintenance and commission it again from the start",
    input: z.object({ node: resourceId }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      const moved = await transition(ctx, tx, input.node, "recommission", { maintenance: false, reason: null, workflowId: null, role: null, lastError: null });
      if (!moved) throw new ComputeError("FAILED_PRECONDITION", `metal node ${input.node} is not failed`);
      const node = await loadNode(tx, input.node);
      if (await siteAgent(tx, node.site_id)) await runLifecycle(ctx, tx, node, "commission", lifecycleProfile(node, "commission"));
      return toNode(await loadNode(tx, input.node));
    },
  });

  const rescue = defineMethod({
    name: "metal.rescue",
    action: "metal.rescue",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Boot a deployed machine into the ramdisk (its disk untouched) for an operator to look into; metal.unrescue boots it from its disk again",
    input: z.object({ node: resourceId }),
    output: z.object({ node: z.string(), workflow: z.string() }),
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      if (node.pool_agent === "none") throw new ComputeError("UNSUPPORTED", `pool ${node.pool_id} is agentless (agent: none): no ramdisk can boot on metal node ${node.id} to rescue it`);
      if (node.state !== "deployed") throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}; only a deployed machine can be rescued`);
      const wf = await runLifecycle(ctx, tx, node, "rescue", "metal.rescue", {}, { createdBy: ctx.principal.id });
      return { node: node.id, workflow: wf.id };
    },
  });

  const unrescue = defineMethod({
    name: "metal.unrescue",
    action: "metal.rescue",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Boot a rescued machine from its disk again; the rescue ramdisk is revoked",
    input: z.object({ node: resourceId }),
    output: z.object({ node: z.string(), workflow: z.string() }),
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      if (node.state !== "rescue") throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}; only a rescued machine can be unrescued`);
      await revokeRamdisks(ctx, tx, node, `metal node ${node.id} leaves rescue`);
      const wf = await runLifecycle(ctx, tx, node, "unrescue", "metal.unrescue", {}, { createdBy: ctx.principal.id });
      return { node: node.id, workflow: wf.id };
    },
  });

  const retire = defineMethod({
    name: "metal.nodes.retire",
    action: "metal.nodes.retire",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Take a machine out of service for good (enrolled, ready or failed); its BMC may be enrolled again as a new machine",
    input: z.object({ node: resourceId, reason: z.string().min(1).max(500).optional() }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      const node = await loadNode(tx, input.node, true);
      const reason = input.reason ?? "retired by an operator";
      const moved = await transition(ctx, tx, node.id, "retire", { workflowId: null, role: null, maintenance: false, reason });
      if (!moved) {
        const hint = node.state === "deployed" ? ": undeploy it first" : node.state === "retired" ? "" : ": wait until its workflow ends";
        throw new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}; only an enrolled, ready or failed machine can be retired${hint}`, { node: node.id, state: node.state });
      }
      // Nothing may act for it again: whatever agent joined for it (an installed system, a ramdisk) is revoked.
      await ctx.nodes.revoke(tx, { role: "node", labels: { "bc.dev/machine": node.id } }, `metal node ${node.id} was retired`);
      await revokeRamdisks(ctx, tx, node, `metal node ${node.id} was retired`);
      return toNode(await loadNode(tx, node.id));
    },
  });

  const maintenance = defineMethod({
    name: "metal.nodes.maintenance",
    action: "metal.nodes.maintenance",
    resource: (input) => `metal/nodes/${input.node}`,
    description: "Put a machine in maintenance (on, with a reason: nothing new starts on it) or take it out (off); not while a workflow drives it",
    input: z.object({ node: resourceId, on: z.boolean(), reason: z.string().min(1).max(500).optional() }),
    output: metalNode,
    handler: async (ctx, input, tx) => {
      if (input.on && !input.reason) throw invalidArgument("a reason is required to put a machine in maintenance");
      const node = await loadNode(tx, input.node, true);
      const refuse = (why: string) => new ComputeError("FAILED_PRECONDITION", `metal node ${node.id} is ${node.state}: ${why}`, { node: node.id, state: node.state });
      if (node.state === "retired") throw refuse("a retired machine is out of service for good");
      // Maintenance stops nothing already running; the workflow's end decides (a failure turns maintenance on itself).
      if (TRANSITIONAL.includes(node.state)) throw refuse(`maintenance does not stop its workflow ${node.workflow_id}: wait until it ends, or cancel it (workflows.cancel; the machine then ends failed, in maintenance)`);
      if (node.state === "failed" && !input.on) throw refuse("a failed machine leaves maintenance by metal.nodes.recommission");
      const reason = input.on ? input.reason! : null;
      if (node.maintenance === input.on && node.maintenance_reason === reason) return toNode(node);
      const change = input.on ? "maintenance.on" : "maintenance.off";
      await tx.execute(sql`UPDATE metal_nodes SET maintenance = ${input.on}, maintenance_reason = ${reason}, updated_at = compute_now() WHERE id = ${node.id}`);
      await tx.execute(sql`
        INSERT INTO metal_transitions (node_id, event, from_state, to_state, workflow_id, reason)
        VALUES (${node.id}, ${change}, ${node.state}, ${node.state}, ${node.workflow_id}, ${input.reason ?? null})`);
      await ctx.events.publish(tx, { type: `metal.node.${change}`, subject: `metal/nodes/${node.id}`, data: { state: node.state, ...(input.reason ? { reason: input.reason } : {}) } });
      // Out of maintenance, an enrolled machine commissions now (as at enroll), not at the next cron pass.
      if (node.state === "enrolled" && !input.on && (await siteAgent(tx, node.site_id))) {
        await runLifecycle(ctx, tx, await loadNode(tx, node.id), "commission", lifecycleProfile(node, "commission"), {}, { createdBy: ctx.principal.id });
      }
      return toNode(await loadNode(tx, node.id));
    },
  });

  // ------------------------------------------------------------------ reconciler

  /** Exactly one attested wipe in the workflow: a succeeded wipe step whose command's result is node-signed. */
  async function attestedWipes(tx: Tx, workflowId: string): Promise<number> {
    const found = await tx.execute(sql`
      SELECT count(*)::int AS n FROM workflow_steps s JOIN bc_commands c ON c.id = s.command_id
      WHERE s.workflow_id = ${workflowId} AND s.step_id = ${WIPE_STEP} AND s.state = 'succeeded' AND c.attested AND c.signature IS NOT NULL`);
    return (found.rows[0] as { n: number }).n;
  }

  /** Moves one node whose workflow ended; returns whether it changed. */
  async function settle(ctx: ModuleContext, node: NodeRow & { wf_state: string; wf_error: Record<string, unknown> | null }): Promise<boolean> {
    return ctx.store.transaction(async (tx) => {
      const wf = node.workflow_id!;
      // The ramdisks this workflow booted are done (a rescue's stays up until unrescue): none may act for the machine again.
      if (!(node.state === "rescuing" && node.wf_state === "succeeded")) await revokeRamdisks(ctx, tx, node, `workflow ${wf} ended`);
      if (node.wf_state !== "succeeded") {
        const error = node.wf_error ?? { code: "CANCELLED", message: `workflow ${wf} was ${node.wf_state}` };
        const reason = `${node.state} failed: ${String(error.message ?? error.code)}`;
        return (await transition(ctx, tx, node.id, "fail", { maintenance: true, reason, lastError: { ...error, workflow: wf } })) !== undefined;
      }
      const plain = { deploying: "deployed", rescuing: "rescued", unrescuing: "unrescued" } as const;
      if (node.state in plain) return (await transition(ctx, tx, node.id, plain[node.state as keyof typeof plain])) !== undefined;
      const event = node.state === "commissioning" ? "commissioned" : "released";
      const wipes = await attestedWipes(tx, wf);
      if (wipes === 1) return (await transition(ctx, tx, node.id, event, { role: null })) !== undefined;
      // Agentless machines commission and release without a wipe anyone could attest.
      if ((event === "released" || node.pool_agent === "none") && node.policy.allowUnverifiedRelease) {
        const moved = await transition(ctx, tx, node.id, event, { role: null, reason: `${event} without an attested wipe (pool policy allowUnverifiedRelease)` });
        if (moved) await ctx.events.publish(tx, { type: "node.release.unverified", subject: `metal/nodes/${node.id}`, data: { workflow: wf, event, attestedWipes: wipes } });
        return moved !== undefined;
      }
      const reason = `${wipes === 0 ? "no attested wipe" : `${wipes} attested wipes`} in workflow ${wf}; a machine reaches ready only after exactly one`;
      return (await transition(ctx, tx, node.id, "fail", { maintenance: true, reason, lastError: { code: "FAILED_PRECONDITION", message: reason, workflow: wf } })) !== undefined;
    });
  }

  const reconciler = {
    id: "metal.lifecycle",
    async run(ctx: ModuleContext & { afterCommit(): Promise<void> }) {
      let changed = 0;
      // Machines whose workflow ended.
      const ended = await ctx.store.db.execute(sql`
        SELECT ${NODE_COLUMNS}, w.state AS wf_state, w.error AS wf_error
        FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id JOIN workflows w ON w.id = n.workflow_id
        WHERE n.state IN ('commissioning', 'deploying', 'releasing', 'rescuing', 'unrescuing') AND w.state <> 'running'
        ORDER BY n.state_changed_at LIMIT 500`);
      for (const node of ended.rows as unknown as (NodeRow & { wf_state: string; wf_error: Record<string, unknown> | null })[]) {
        if (await settle(ctx, node)) changed++;
      }
      // Enrolled machines (enrolled before their site had an agent, or recommissioned): commission them.
      const enrolled = await ctx.store.db.execute(sql`
        SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id
        WHERE n.state = 'enrolled' AND NOT n.maintenance ORDER BY n.created_at LIMIT 500`);
      for (const node of enrolled.rows as unknown as NodeRow[]) {
        try {
          await ctx.store.transaction((tx) => runLifecycle(ctx, tx, node, "commission", lifecycleProfile(node, "commission")));
          changed++;
        } catch (err) {
          // No site agent yet, or someone else moved it first: the next pass looks again.
          if (!(err instanceof ComputeError)) throw err;
        }
      }
      return changed;
    },
  };

  return defineModule({
    id: "metal",
    description: "Bare-metal machines behind BMCs: sites, pools, hardware profiles and their lifecycle",
    iam: {
      actions: {
        ...siteAndPoolActions,
        "metal.enroll": "Enroll machines by their BMC",
        "metal.nodes.get": "Read a machine",
        "metal.nodes.list": "List machines",
        "metal.deploy": "Deploy machines",
        "metal.undeploy": "Release machines (wipes their disks)",
        "metal.nodes.recommission": "Take failed machines out of maintenance",
        "metal.nodes.retire": "Take machines out of service for good",
        "metal.nodes.maintenance": "Put machines in maintenance and take them out",
        "metal.rescue": "Boot deployed machines into the ramdisk and back",
      },
    },
    migrations: [
      { name: "metal/0001_metal", sql: SCHEMA_SQL },
      { name: "metal/0002_addresses", sql: ADDRESSES_SQL },
      { name: "metal/0003_rescue", sql: RESCUE_SQL },
      { name: "metal/0004_one_machine_per_bmc_and_uuid", sql: UNIQUE_MACHINE_SQL },
    ],
    api: [...siteAndPoolMethods(hardwareProfiles), enroll, nodesGet, nodesList, deploy, undeploy, recommission, retire, maintenance, rescue, unrescue],
    commands: metalCommands,
    extensions: [redfishDriver, ipxeDriver, imageStreamDriver, ...metalSteps],
    profiles: [...metalProfiles, ...commissionProfiles],
    reconcilers: [reconciler],
  });
}
