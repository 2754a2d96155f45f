// A machine as the metal module reads and moves it: its row, its API shape, and the moves every
// method and the reconciler share (start a lifecycle workflow, revoke its ramdisks).
import { sql } from "drizzle-orm";
import { z } from "zod";
import { ComputeError, conflict, notFound, one, type ModuleContext, type Tx } from "better-compute/core";
import { startWorkflow } from "better-compute/provision";
import { needsSiteAgent, type HardwareProfiles } from "./hardware.ts";
import { METAL_STATES, transition, type MetalEvent, type MetalState } from "./lifecycle.ts";
import type { Policy } from "./sites.ts";
import { siteAgentOf as siteAgent, type BmcBinding } from "./steps.ts";

export const metalNode = z.object({
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

const text = z.string().optional();
/**
 * What commissioning found (metal.nodes.get only): null until inspection ran. Hardware only: the
 * power, boot and media state inspection also read were that moment's and are left out.
 */
export const metalInventory = z.object({
  /** Through the BMC (inventory.bmc, recorded by metal.recordInventory): identity, firmware, the NICs' MACs, storage. */
  bmc: z.object({
    manufacturer: text,
    model: text,
    serialNumber: text,
    biosVersion: text,
    bmcFirmwareVersion: text,
    /** Its CPUs (sockets), their model and logical processors, and its memory, as the BMC's system summary says. */
    processors: z.object({ count: z.number(), model: z.string().nullable(), threads: z.number().nullable() }).optional(),
    memoryGiB: z.number().optional(),
    macs: z.array(z.string()),
    /** The drives behind the BMC's storage controllers and the volumes made of them; absent where the BMC links no Storage. */
    storage: z.object({ drives: z.number(), volumes: z.array(z.object({ id: z.string(), level: z.string().nullable() })) }).optional(),
  }),
  /**
   * From inside the machine (inventory.ramdisk, in its last commissioning): its disks, and on real
   * hardware its CPUs, memory and NICs. Null where no ramdisk ran (an agentless pool, a Robot server).
   */
  ramdisk: z
    .object({
      at: z.string(),
      disks: z.array(
        z.object({
          device: z.string(),
          sizeBytes: z.number(),
          model: text,
          serial: text,
          wwn: text,
          rotational: z.boolean().optional(),
          removable: z.boolean().optional(),
        }),
      ),
      cpus: z.object({ count: z.number(), model: z.string().nullable() }).optional(),
      memoryBytes: z.number().optional(),
      nics: z.array(z.object({ name: z.string(), mac: z.string(), link: z.string() })).optional(),
    })
    .nullable(),
});
/** metal.nodes.get's answer: the machine and what commissioning found on it. */
export const metalNodeDetail = metalNode.extend({ inventory: metalInventory.nullable() });

export interface NodeRow {
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
  /** What inspection recorded (metal.recordInventory): the BMC's view, the NICs' MACs among it. */
  inventory: ({ macs?: string[] } & Record<string, unknown>) | null;
  bmc: BmcBinding;
  last_error: unknown;
  policy: Policy;
  pool_agent: "bcd" | "none";
}

export const toNode = (r: NodeRow): z.input<typeof metalNode> => ({
  id: r.id,
  pool: r.pool_id,
  site: r.site_id,
  state: r.state,
  maintenance: r.maintenance,
  maintenanceReason: r.maintenance_reason,
  role: r.role,
  workflow: r.workflow_id,
  productUuid: r.product_uuid,
  addresses: r.addresses,
  bmc: { driver: r.bmc.driver, address: r.bmc.address, username: r.bmc.username },
  lastError: r.last_error ?? null,
});

/** The fields of a recorded value that are strings (a BMC leaves many out, or says null). */
const strings = <K extends string>(from: Record<string, unknown>, keys: readonly K[]): Partial<Record<K, string>> =>
  Object.fromEntries(keys.filter((k) => typeof from[k] === "string" && from[k] !== "").map((k) => [k, from[k]])) as Partial<
    Record<K, string>
  >;
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * The machine with what commissioning found: the BMC's view inspection recorded, and what the
 * ramdisk listed in the last inventory.ramdisk that succeeded for it (its workflow step's output).
 */
export async function nodeDetail(tx: Pick<Tx, "execute">, row: NodeRow): Promise<z.input<typeof metalNodeDetail>> {
  const node = toNode(row);
  if (!row.inventory) return { ...node, inventory: null };
  const bmc = row.inventory;
  const storage = isObject(bmc.storage) && typeof bmc.storage.drives === "number" ? bmc.storage : undefined;
  const listed = await one<{ output: unknown; finished_at: string }>(
    tx,
    sql`
    SELECT s.output, s.finished_at FROM workflows w JOIN workflow_steps s ON s.workflow_id = w.id
    WHERE w.target = ${row.id} AND s.step_id = 'inventory.ramdisk' AND s.state = 'succeeded'
    ORDER BY s.finished_at DESC LIMIT 1`,
  );
  const found = isObject(listed?.output) ? listed.output : undefined;
  const ramdisk = found && {
    at: new Date(listed!.finished_at).toISOString(),
    disks: (Array.isArray(found.disks) ? found.disks : []).filter(isObject).map((d) => ({
      device: String(d.device),
      sizeBytes: Number(d.sizeBytes ?? 0),
      ...strings(d, ["model", "serial", "wwn"] as const),
      ...(typeof d.rotational === "boolean" ? { rotational: d.rotational } : {}),
      ...(typeof d.removable === "boolean" ? { removable: d.removable } : {}),
    })),
    ...(isObject(found.cpus) && typeof found.cpus.count === "number"
      ? { cpus: { count: found.cpus.count, model: typeof found.cpus.model === "string" ? found.cpus.model : null } }
      : {}),
    ...(typeof found.memoryBytes === "number" ? { memoryBytes: found.memoryBytes } : {}),
    ...(Array.isArray(found.nics)
      ? { nics: found.nics.filter(isObject).map((n) => ({ name: String(n.name), mac: String(n.mac), link: String(n.link) })) }
      : {}),
  };
  return {
    ...node,
    inventory: {
      bmc: {
        ...strings(bmc, ["manufacturer", "model", "serialNumber", "biosVersion", "bmcFirmwareVersion"] as const),
        ...(isObject(bmc.processors) && typeof bmc.processors.count === "number"
          ? {
              processors: {
                count: bmc.processors.count,
                model: typeof bmc.processors.model === "string" ? bmc.processors.model : null,
                threads: typeof bmc.processors.threads === "number" ? bmc.processors.threads : null,
              },
            }
          : {}),
        ...(typeof bmc.memoryGiB === "number" ? { memoryGiB: bmc.memoryGiB } : {}),
        macs: Array.isArray(bmc.macs) ? bmc.macs.filter((m): m is string => typeof m === "string") : [],
        ...(storage
          ? {
              storage: {
                drives: storage.drives as number,
                volumes: (Array.isArray(storage.volumes) ? storage.volumes : [])
                  .filter(isObject)
                  .map((v) => ({ id: String(v.id), level: typeof v.level === "string" ? v.level : null })),
              },
            }
          : {}),
      },
      ramdisk: ramdisk ?? null,
    },
  };
}

/** What a NodeRow holds, from metal_nodes n joined with its pool p. */
export const NODE_COLUMNS = sql`n.*, p.policy, p.agent AS pool_agent`;

export async function loadNode(tx: Pick<Tx, "execute">, id: string, lock = false): Promise<NodeRow> {
  const row = await one<NodeRow>(
    tx,
    sql`
    SELECT ${NODE_COLUMNS} FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id WHERE n.id = ${id} ${lock ? sql`FOR UPDATE OF n` : sql``}`,
  );
  if (!row) throw notFound(`metal node ${id} does not exist`);
  return row;
}

/**
 * One BMC address drives one machine: enrolling an address a machine that is not retired holds is
 * a CONFLICT naming that machine. Addresses compare as the BMC reads them (a trailing slash aside).
 */
export async function refuseHeldBmc(tx: Pick<Tx, "execute">, address: string): Promise<void> {
  const holder = await one<{ id: string; state: MetalState }>(
    tx,
    sql`
    SELECT id, state FROM metal_nodes WHERE rtrim(bmc->>'address', '/') = rtrim(${address}, '/') AND state <> 'retired' LIMIT 1`,
  );
  if (holder)
    throw conflict(`the BMC ${address} is held by metal node ${holder.id} (${holder.state}): retire that machine to enroll its BMC again`, {
      node: holder.id,
      state: holder.state,
    });
}

/** The machine's ramdisks (matched by product UUID at its site) can no longer act for it. */
export async function revokeRamdisks(
  ctx: ModuleContext,
  tx: Tx,
  node: Pick<NodeRow, "product_uuid" | "site_id">,
  reason: string,
): Promise<void> {
  if (!node.product_uuid) return;
  await ctx.nodes.revoke(
    tx,
    { role: "ramdisk", labels: { "bc.dev/product-uuid": node.product_uuid, "bc.dev/site": node.site_id } },
    reason,
  );
}

/**
 * Commissions the node now if it can (at enroll, recommission, out of maintenance): its pool needs
 * no site agent, or its site has one (looked up once for both). Answers whether it started; if
 * not, the reconciler starts it once the site's agent joins.
 */
export async function commissionIfAble(
  ctx: ModuleContext,
  tx: Tx,
  hardwareProfiles: HardwareProfiles,
  node: NodeRow,
  profile: string,
  extra: { createdBy?: string } = {},
): Promise<boolean> {
  const agent = await siteAgent(tx, node.site_id);
  if (!agent && needsSiteAgent(ctx, hardwareProfiles, node)) return false;
  await runLifecycle(ctx, tx, hardwareProfiles, node, "commission", profile, {}, { ...extra, siteAgent: agent ?? null });
  return true;
}

/**
 * Moves the node by event and starts the profile's workflow for it, in the caller's transaction.
 * Throws when the pool needs a site agent (needsSiteAgent) and the site has none, and CONFLICT
 * (nothing written) when the node is no longer in a state the event leaves from.
 */
export async function runLifecycle(
  ctx: ModuleContext,
  tx: Tx,
  hardwareProfiles: HardwareProfiles,
  node: NodeRow,
  event: MetalEvent,
  profile: string,
  input: Record<string, unknown> = {},
  extra: { role?: string | null; version?: string; createdBy?: string; siteAgent?: string | null } = {},
) {
  // The caller may have looked the site's agent up already (null: it has none).
  const agent = extra.siteAgent !== undefined ? (extra.siteAgent ?? undefined) : await siteAgent(tx, node.site_id);
  if (!agent && needsSiteAgent(ctx, hardwareProfiles, node))
    throw new ComputeError("FAILED_PRECONDITION", `site ${node.site_id} has no agent: join one with a site token (siteTokens.create)`, {
      site: node.site_id,
    });
  const workflowInput = {
    ...input,
    machine: node.id,
    ...(agent ? { siteAgent: agent } : {}),
    bmc: node.bmc,
    addresses: node.addresses,
    macs: node.inventory?.macs ?? [],
    ...(node.product_uuid ? { productUuid: node.product_uuid } : {}),
  };
  const wf = await startWorkflow(ctx, tx, {
    profile,
    ...(extra.version ? { version: extra.version } : {}),
    target: node.id,
    input: workflowInput,
    createdBy: extra.createdBy ?? "system:metal",
  });
  const moved = await transition(ctx, tx, node.id, event, {
    workflowId: wf.id,
    lastError: null,
    ...(extra.role !== undefined ? { role: extra.role } : {}),
  });
  if (!moved)
    throw conflict(`metal node ${node.id} is ${node.state}; ${event} needs it to be in another state`, {
      node: node.id,
      state: node.state,
    });
  return wf;
}
