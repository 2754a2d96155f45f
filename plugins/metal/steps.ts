// Metal's built-in steps, command kinds, drivers and profiles. BMC steps run on the machine's
// site agent (its node id and the BMC binding are in every metal workflow's input, put there by
// the module); ramdisk steps run on the ramdisk that PXE-booted on the machine in this workflow.
// Network boot: before the machine PXE-boots, the control plane mints the ramdisk's single-use
// token and tells the site agent what the machine boots (docs/netboot.md); a deploy has the site
// cache the image and the ramdisk write it with a config drive holding the installed system's token.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineDriver, type CommandKind } from "better-compute";
import { ComputeError, one, SECRET_REF, type ModuleContext, type SecretRef, type Tx } from "better-compute/core";
import { defineProfile, defineStep, StepError, stepNotReady, type StepContext } from "better-compute/provision";
import { bmcAddress, bmcTls, bmcTlsProblem } from "./bmc-address.ts";
import { HTTP_PROXY_KIND, httpProxyBody } from "./http-proxy.ts";

const secretRef = z.string().regex(SECRET_REF, "a secret:// reference");

/** A Redfish BMC: the system it drives is named in the address (the site agent checks it with the same rules). */
export const redfishAddress = bmcAddress;

const bindingShape = {
  driver: z.string(),
  address: redfishAddress,
  username: z.string().min(1).max(128),
  password: secretRef,
  tls: bmcTls.optional(),
};
const tlsFitsAddress = (b: { address: string; tls?: z.infer<typeof bmcTls> }, ctx: z.RefinementCtx) => {
  const problem = bmcTlsProblem(b.address, b.tls);
  if (problem) ctx.addIssue({ code: "custom", path: ["tls"], message: problem });
};
/** A Redfish BMC binding: its address, its username, the password by reference, and how to trust its certificate (tls). */
export const bmcBinding = z.object(bindingShape).superRefine(tlsFitsAddress);
/**
 * A BMC binding as a workflow carries it: the power driver's manifest checked it at enroll (a
 * Redfish URL, an IPMI host and cipher suite, ...), so only what every driver shares is read here;
 * the rest travels to the site agent as it is.
 */
export const anyBmcBinding = z
  .object({ driver: z.string().min(1), address: z.string().min(1), username: z.string(), password: secretRef })
  .catchall(z.unknown());
export type BmcBinding = z.infer<typeof anyBmcBinding> & { tls?: z.infer<typeof bmcTls> };

/** What metal puts into every workflow it starts. */
const machineInput = z.object({ machine: z.string(), siteAgent: z.string(), bmc: anyBmcBinding });

export const redfishDriver = defineDriver({
  id: "redfish",
  kinds: ["power", "management", "media"],
  runsOn: "site",
  // Strict: a field another driver's binding takes (hetzner-robot's rescueKeys) is refused, not dropped.
  manifest: z.strictObject({ ...bindingShape, driver: z.literal("redfish") }).superRefine(tlsFitsAddress),
  secretFields: ["password"],
});
export const ipxeDriver = defineDriver({ id: "ipxe", kinds: ["boot"], runsOn: "site" });
export const imageStreamDriver = defineDriver({ id: "image-stream", kinds: ["deploy"], runsOn: "ramdisk" });

const bmcCommand = { roles: ["site" as const] };
export const metalCommands: CommandKind[] = [
  { kind: "metal.bmc.inspect", description: "Read a system's identity and state from its BMC", ...bmcCommand },
  { kind: "metal.bmc.power", description: "Power a system on, off or cycle it", destructive: true, ...bmcCommand },
  { kind: "metal.bmc.boot", description: "Set a system's next boot device", ...bmcCommand },
  { kind: "metal.bmc.media.insert", description: "Mount an image as the system's virtual CD", ...bmcCommand },
  { kind: "metal.bmc.media.eject", description: "Eject the system's virtual CD", ...bmcCommand },
  { kind: "metal.bmc.bios", description: "Stage BIOS settings (applied at the next power-on)", ...bmcCommand },
  {
    kind: "metal.bmc.raid",
    description: "Make the controller's volume of a RAID level (replaces other volumes)",
    destructive: true,
    ...bmcCommand,
  },
  { kind: "metal.ramdisk.inventory", description: "List the machine's disks from the ramdisk", roles: ["ramdisk"] },
  {
    kind: "metal.ramdisk.wipe",
    description: "Erase every disk; the ramdisk signs what it wiped and how",
    attested: true,
    destructive: true,
    roles: ["ramdisk"],
  },
  {
    kind: "metal.ramdisk.writeImage",
    description: "Stream an image onto a disk, verified by sha256",
    destructive: true,
    roles: ["ramdisk"],
  },
  {
    kind: "metal.netboot.set",
    description: "Tell the site agent what a machine network-boots next: the ramdisk (with its join token, by reference) or its disk",
    input: z.object({
      machine: z.string().min(1).max(128),
      macs: z.array(z.string().min(1).max(32)).min(1).max(16),
      action: z.enum(["ramdisk", "disk"]),
      token: secretRef.optional(),
    }),
    roles: ["site"],
  },
  {
    kind: "metal.netboot.clear",
    description: "Forget a machine: the site's DHCP no longer answers it",
    input: z.object({ machine: z.string().min(1).max(128) }),
    roles: ["site"],
  },
  {
    kind: "metal.images.cache",
    description:
      "Mirror an image (a URL and its sha256) or a blob of the control plane's (its sha256) into the site's cache, verified; answers its URL on the provisioning network",
    input: z.union([
      z.strictObject({ url: z.string().url(), sha256: z.string().regex(/^[0-9a-fA-F]{64}$/) }),
      z.strictObject({ blob: z.string().regex(/^[0-9a-f]{64}$/) }),
    ]),
    roles: ["site"],
  },
  // Destructive: what an agentless machine's API does with a request is not known (Talos: reset, upgrade).
  {
    kind: HTTP_PROXY_KIND,
    description: "An HTTP request from the site agent to a machine's own address (httpViaSite)",
    input: httpProxyBody,
    destructive: true,
    roles: ["site"],
  },
];

type MachineInput = z.output<typeof machineInput>;

/** A site-agent step: one command for the workflow's machine to the site's agent. */
function siteStep<S extends z.ZodRawShape>(
  id: string,
  kind: string,
  shape: S,
  command: {
    body: (input: MachineInput & z.output<z.ZodObject<S>>) => Record<string, unknown>;
    secretRefs?: (input: MachineInput & z.output<z.ZodObject<S>>) => SecretRef[];
  },
  description: string,
) {
  const input = machineInput.extend(shape) as unknown as z.ZodType<MachineInput & z.output<z.ZodObject<S>>>;
  return defineStep({
    id,
    description,
    runsOn: "site",
    sends: [kind],
    input,
    // BMCs drop requests, site agents restart; each attempt is one command and shows in the workflow's steps.
    retry: { attempts: 6, backoffSeconds: 1, maxBackoffSeconds: 8 },
    deadlineSeconds: 120,
    target: (value) => value.siteAgent,
    command: { kind, ...command },
  });
}

/** A site-agent step: one BMC command for the workflow's machine (the binding, its password by reference). */
function bmcStep<S extends z.ZodRawShape>(
  id: string,
  kind: string,
  shape: S,
  body: (input: z.output<z.ZodObject<S>>) => Record<string, unknown>,
  description: string,
) {
  return siteStep(
    id,
    kind,
    shape,
    {
      // The whole binding (its driver picks the client on the site agent), the password by reference.
      body: (value) => ({ bmc: value.bmc, ...body(value) }),
      secretRefs: (value) => [value.bmc.password as SecretRef],
    },
    description,
  );
}

export const inspectBmc = bmcStep(
  "inventory.bmc",
  "metal.bmc.inspect",
  {},
  () => ({}),
  "Read the system's identity (UUID, model, firmware) from its BMC",
);
export const setPower = bmcStep(
  "power.setPower",
  "metal.bmc.power",
  { action: z.enum(["on", "off", "cycle"]) },
  (i) => ({ action: i.action }),
  "Power the machine on, off, or cycle it",
);
export const setBootDevice = bmcStep(
  "management.setBootDevice",
  "metal.bmc.boot",
  { device: z.enum(["pxe", "cd", "disk"]) },
  (i) => ({ device: i.device }),
  "Set the next boot device",
);
export const insertMedia = bmcStep(
  "media.insert",
  "metal.bmc.media.insert",
  { url: z.string().url() },
  (i) => ({ url: i.url }),
  "Mount an image (fromStep: the step that made it) as the virtual CD",
);
export const ejectMedia = bmcStep("media.eject", "metal.bmc.media.eject", {}, () => ({}), "Eject the virtual CD");

export const biosSettings = z.record(z.string().min(1).max(128), z.union([z.string().max(256), z.number(), z.boolean()]));
export const raidLayout = z.object({
  level: z.enum(["RAID0", "RAID1", "RAID5", "RAID10"]),
  drives: z.union([z.number().int().positive(), z.literal("all")]).default("all"),
});
export const applyBios = bmcStep(
  "bios.apply",
  "metal.bmc.bios",
  { attributes: biosSettings },
  (i) => ({ attributes: i.attributes }),
  "Stage the hardware profile's BIOS settings",
);
export const applyRaid = bmcStep(
  "raid.apply",
  "metal.bmc.raid",
  { raid: raidLayout },
  (i) => ({ level: i.raid.level, drives: i.raid.drives }),
  "Make the hardware profile's RAID volume",
);

/**
 * Records what inspection found: the ramdisk is matched to the machine by its UUID, and
 * httpViaSite reaches an agentless machine only at its recorded addresses.
 */
export const recordInventory = defineStep({
  id: "metal.recordInventory",
  runsOn: "control-plane",
  description: "Record the BMC's view of the machine (fromStep: inventory.bmc)",
  input: z
    .object({
      machine: z.string(),
      /** The SMBIOS UUID the ramdisk is matched by; none where no ramdisk boots and nothing reports one (a Robot server: its number names it). */
      uuid: z.string().min(1).optional(),
      manufacturer: z.string().optional(),
      model: z.string().optional(),
      addresses: z.array(z.string()).default([]),
    })
    .passthrough(),
  run: async (ctx, input) => {
    const { machine, ...inventory } = input;
    const uuid = input.uuid?.toLowerCase() ?? null;
    await ctx.store.transaction(async (tx) => {
      // The ramdisk is matched by this UUID: two machines in service with one would be mistaken for each other.
      const holder =
        uuid === null
          ? undefined
          : await one<{ id: string }>(
              tx,
              sql`SELECT id FROM metal_nodes WHERE lower(product_uuid) = ${uuid} AND id <> ${machine} AND state <> 'retired' LIMIT 1`,
            );
      if (holder)
        throw new StepError(
          "CONFLICT",
          `product UUID ${uuid} is already held by metal node ${holder.id}: two machines in service cannot share one (retire the other, or fix this machine's SMBIOS UUID)`,
          false,
          { node: holder.id, productUuid: uuid },
        );
      await tx.execute(sql`
        UPDATE metal_nodes SET product_uuid = ${uuid}, inventory = ${JSON.stringify(inventory)}::jsonb,
               addresses = ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(input.addresses)}::jsonb)), updated_at = compute_now()
        WHERE id = ${machine}`);
    });
    return { ...(uuid ? { productUuid: uuid } : {}), addresses: input.addresses };
  },
});

/** The site's agent (connected first, then the latest): every BMC command and relayed request goes through it. */
export async function siteAgentOf(db: Pick<Tx, "execute">, site: string): Promise<string | undefined> {
  const found = await one<{ id: string }>(
    db,
    sql`
    SELECT id FROM bc_nodes WHERE role = 'site' AND labels->>'bc.dev/site' = ${site} AND revoked_at IS NULL
    ORDER BY (state = 'connected') DESC, connected_at DESC NULLS LAST LIMIT 1`,
  );
  return found?.id;
}

/** The agent of this role that joined for the machine during this workflow, if any. */
export async function joinedAgent(
  ctx: ModuleContext,
  workflowId: string,
  machine: string,
  role: "ramdisk" | "node",
): Promise<string | undefined> {
  const match =
    role === "ramdisk"
      ? // Vouched for by this machine's own site: another site's agent cannot claim its ramdisk.
        sql`(a.labels->>'bc.dev/product-uuid', a.labels->>'bc.dev/site') = (SELECT product_uuid, site_id FROM metal_nodes WHERE id = ${machine})`
      : sql`a.labels->>'bc.dev/machine' = ${machine}`;
  const found = await one<{ id: string }>(
    ctx.store.db,
    sql`
    SELECT a.id FROM bc_nodes a
    WHERE a.role = ${role} AND a.state = 'connected' AND a.revoked_at IS NULL AND ${match}
      AND a.joined_at >= (SELECT created_at FROM workflows WHERE id = ${workflowId})
    ORDER BY a.joined_at DESC LIMIT 1`,
  );
  return found?.id;
}

/** The labels the machine's agent of the role carries (vouched for by its attestor). */
async function agentLabels(ctx: ModuleContext, machine: string, role: "ramdisk" | "node"): Promise<Record<string, string> | undefined> {
  if (role === "node") return { "bc.dev/machine": machine };
  const row = await one<{ product_uuid: string | null; site_id: string }>(
    ctx.store.db,
    sql`SELECT product_uuid, site_id FROM metal_nodes WHERE id = ${machine}`,
  );
  return row?.product_uuid ? { "bc.dev/product-uuid": row.product_uuid, "bc.dev/site": row.site_id } : undefined;
}

export const waitAgentJoined = defineStep({
  id: "wait.agentJoined",
  runsOn: "control-plane",
  description: "Wait until an agent of the role (ramdisk after PXE, node after an install) joined for the machine and is connected",
  input: z.object({ machine: z.string(), role: z.enum(["ramdisk", "node"]) }),
  // The agent's hello wakes the workflow (wakeWhenConnected); the poll is the safety net.
  pollSeconds: 10,
  deadlineSeconds: 1800,
  run: async (ctx, input) => {
    let nodeId = await joinedAgent(ctx, ctx.workflow.id, input.machine, input.role);
    if (!nodeId) {
      const labels = await agentLabels(ctx, input.machine, input.role);
      if (labels) {
        await ctx.store.transaction((tx) => ctx.nodes.wakeWhenConnected(tx, { workflowId: ctx.workflow.id, role: input.role, labels }));
        // Look again: an agent whose hello came before the wait existed fired nothing.
        nodeId = await joinedAgent(ctx, ctx.workflow.id, input.machine, input.role);
      }
    }
    if (!nodeId) stepNotReady(`no ${input.role} agent has joined for ${input.machine} yet`);
    return { nodeId, role: input.role };
  },
});

/** Ramdisk steps run on the ramdisk that joined for the machine in this workflow. */
async function ramdiskOf(input: { machine: string }, ctx: StepContext): Promise<string> {
  const nodeId = await joinedAgent(ctx, ctx.workflow.id, input.machine, "ramdisk");
  if (!nodeId)
    throw new ComputeError(
      "FAILED_PRECONDITION",
      `no ramdisk is connected for ${input.machine}: run wait.agentJoined (role ramdisk) first`,
    );
  return nodeId;
}

export const inventoryRamdisk = defineStep({
  id: "inventory.ramdisk",
  runsOn: "ramdisk",
  description: "List the machine's disks from inside the ramdisk",
  sends: ["metal.ramdisk.inventory"],
  input: z.object({ machine: z.string() }),
  deadlineSeconds: 300,
  target: ramdiskOf,
  command: { kind: "metal.ramdisk.inventory", body: () => ({}) },
});

export const wipeDisks = defineStep({
  id: "disk.wipe",
  runsOn: "ramdisk",
  description: "Erase every disk; the result is signed by the ramdisk's key (attested)",
  sends: ["metal.ramdisk.wipe"],
  input: z.object({ machine: z.string(), wipeMethod: z.enum(["zero", "discard"]).default("zero") }),
  deadlineSeconds: 3600,
  target: ramdiskOf,
  command: { kind: "metal.ramdisk.wipe", body: (input) => ({ method: input.wipeMethod }) },
});

export const writeImage = defineStep({
  id: "image.write",
  runsOn: "ramdisk",
  description:
    "Stream the image onto the first disk, verified against its sha256 (from the site's cache: fromStep image.cache), and a config drive with the installed system's token (fromStep os.token)",
  sends: ["metal.ramdisk.writeImage"],
  input: z.object({
    machine: z.string(),
    image: z.object({ url: z.string().url(), sha256: z.string().regex(/^[0-9a-f]{64}$/) }),
    /** The image's URL in the site's cache (image.cache's answer): the ramdisk fetches it there. */
    url: z.string().url().optional(),
    /** The installed system's join token, by reference (os.token): it goes onto the config drive. */
    osToken: secretRef.optional(),
  }),
  deadlineSeconds: 3600,
  target: ramdiskOf,
  command: {
    kind: "metal.ramdisk.writeImage",
    body: (input) => ({
      url: input.url ?? input.image.url,
      sha256: input.image.sha256,
      ...(input.osToken ? { configDrive: { hostname: input.machine, joinToken: input.osToken } } : {}),
    }),
    secretRefs: (input) => (input.osToken ? [input.osToken as SecretRef] : []),
  },
});

/** How long a ramdisk's token lives: a power cycle, PXE and the ramdisk's boot, with room for a slow machine. */
const RAMDISK_TOKEN_SECONDS = 1800;
/** How long the installed system's token lives: the image's write and the first boot. */
const OS_TOKEN_SECONDS = 3 * 3600;

/** What network boot knows the machine by: its MACs (inspection), product UUID and site. */
async function bootIdentity(tx: Tx, machine: string): Promise<{ macs: string[]; productUuid: string; site: string }> {
  const row = await one<{ macs: string[] | null; product_uuid: string | null; site_id: string }>(
    tx,
    sql`SELECT inventory->'macs' AS macs, product_uuid, site_id FROM metal_nodes WHERE id = ${machine}`,
  );
  if (!row) throw new StepError("NOT_FOUND", `metal node ${machine} does not exist`, false);
  if (!row.product_uuid)
    throw new StepError("FAILED_PRECONDITION", `metal node ${machine} has no recorded product UUID: inspect it first`, false);
  if (!row.macs?.length)
    throw new StepError(
      "FAILED_PRECONDITION",
      `the BMC of ${machine} reported no MAC address (EthernetInterfaces): the site cannot tell its network boot apart`,
      false,
    );
  return { macs: row.macs, productUuid: row.product_uuid, site: row.site_id };
}

type BootIdentity = Awaited<ReturnType<typeof bootIdentity>>;

/**
 * A control-plane step minting a single-use join token for an agent of `role` on the machine,
 * bound to its product UUID, and sealing it (secret name `<role>-token/<machine>`): only its
 * reference leaves the step, in what `answer` makes of it.
 */
function tokenStep(
  id: string,
  description: string,
  token: { role: "ramdisk" | "node"; ttlSeconds: number; labels: (machine: string, m: BootIdentity) => Record<string, string> },
  answer: (ref: SecretRef, m: BootIdentity) => Record<string, unknown>,
) {
  return defineStep({
    id,
    runsOn: "control-plane",
    description,
    input: z.object({ machine: z.string() }),
    run: (ctx, { machine }) =>
      ctx.store.transaction(async (tx) => {
        const m = await bootIdentity(tx, machine);
        const { role, ttlSeconds } = token;
        const minted = await ctx.pki.mintJoinToken(tx, {
          role,
          ttlSeconds,
          labels: token.labels(machine, m),
          expect: { productUuid: m.productUuid },
        });
        return answer(await ctx.secrets.put(tx, { module: "metal", name: `${role}-token/${machine}`, value: minted.token }), m);
      }),
  });
}

export const mintRamdiskToken = tokenStep(
  "ramdisk.token",
  "Mint the single-use token the machine's ramdisk joins with (for this boot), sealed; answers its reference and the machine's MACs",
  {
    role: "ramdisk",
    ttlSeconds: RAMDISK_TOKEN_SECONDS,
    labels: (_, m) => ({ "bc.dev/site": m.site, "bc.dev/product-uuid": m.productUuid }),
  },
  (ramdiskToken, m) => ({ ramdiskToken, macs: m.macs }),
);
export const mintOsToken = tokenStep(
  "os.token",
  "Mint the single-use token the installed system joins with as the machine's node, sealed",
  { role: "node", ttlSeconds: OS_TOKEN_SECONDS, labels: (machine) => ({ "bc.dev/machine": machine }) },
  (osToken) => ({ osToken }),
);

const macs = z.array(z.string()).min(1);
export const netbootRamdisk = siteStep(
  "netboot.ramdisk",
  "metal.netboot.set",
  { macs, ramdiskToken: secretRef },
  {
    body: (i) => ({ machine: i.machine, macs: i.macs, action: "ramdisk", token: i.ramdiskToken }),
    secretRefs: (i) => [i.ramdiskToken as SecretRef],
  },
  "Have the site network-boot the machine into the ramdisk, with its token (fromStep ramdisk.token)",
);
export const netbootDisk = siteStep(
  "netboot.disk",
  "metal.netboot.set",
  { macs },
  { body: (i) => ({ machine: i.machine, macs: i.macs, action: "disk" }) },
  "Have the site's network boot leave the machine to its disk",
);
const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/);
export const cacheImage = siteStep(
  "image.cache",
  "metal.images.cache",
  // An ImageSource (a URL and its sha256), or a blob the control plane keeps (ctx.blobs: a rendered ISO).
  { image: z.union([z.object({ url: z.string().url(), sha256: sha256Hex }), z.object({ blob: sha256Hex })]) },
  { body: (i) => ("blob" in i.image ? { blob: i.image.blob } : { url: i.image.url, sha256: i.image.sha256 }) },
  "Mirror the image (input.image: { url, sha256 }, or { blob: sha256 } of ctx.blobs) into the site's cache, verified by sha256, where the machines fetch it",
);

export const metalSteps = [
  inspectBmc,
  setPower,
  setBootDevice,
  insertMedia,
  ejectMedia,
  applyBios,
  applyRaid,
  recordInventory,
  waitAgentJoined,
  inventoryRamdisk,
  wipeDisks,
  writeImage,
  mintRamdiskToken,
  mintOsToken,
  netbootRamdisk,
  netbootDisk,
  cacheImage,
];

/** The ID of the step whose attested result proves a wipe (checked in SQL before ready). */
export const WIPE_STEP = wipeDisks.id;

/** Into the ramdisk: its token, the site told what to boot, PXE, power cycle, wait for it to join. */
const pxeIntoRamdisk = [
  { step: "ramdisk.token" },
  { step: "netboot.ramdisk", fromStep: "ramdisk.token" },
  { step: "management.setBootDevice", name: "boot.pxe", input: { device: "pxe" } },
  { step: "power.setPower", name: "power.cycle", input: { action: "cycle" } },
  { step: "wait.agentJoined", name: "wait.ramdisk", input: { role: "ramdisk" } },
];
/** Out of the ramdisk: a later network boot leaves the machine to its disk (the ramdisk's token is spent). */
const netbootDiskNext = { step: "netboot.disk", fromStep: "ramdisk.token" };

/** Commissioning; with a hardware profile's BIOS settings and RAID layout applied before the ramdisk boots (which applies the BIOS settings). */
export function commissionProfileFor(hardware?: { name: string; bios?: z.input<typeof biosSettings>; raid?: z.input<typeof raidLayout> }) {
  const configure = hardware && (hardware.bios || hardware.raid);
  return defineProfile({
    id: configure ? `metal.commission.${hardware.name}` : "metal.commission",
    target: "metal",
    description: configure
      ? `Commissioning for hardware profile ${hardware.name}: inspect, BIOS and RAID, boot the ramdisk, list and wipe the disks (attested), power off`
      : "Inspect through the BMC, boot the ramdisk, list the disks, wipe them (attested), power off",
    steps: [
      { step: "inventory.bmc", name: "inspect" },
      { step: "metal.recordInventory", fromStep: "inspect" },
      ...(hardware?.bios ? [{ step: "bios.apply", input: { attributes: hardware.bios } }] : []),
      ...(hardware?.raid ? [{ step: "raid.apply", input: { raid: hardware.raid } }] : []),
      ...pxeIntoRamdisk,
      { step: "inventory.ramdisk" },
      { step: "disk.wipe" },
      netbootDiskNext,
      { step: "power.setPower", name: "power.off", input: { action: "off" } },
    ],
  });
}

export const commissionProfile = commissionProfileFor();

// Agentless pools (agent: none): nothing boots a ramdisk, so nothing is wiped or attested; the
// pool must allow unverified release, and settling says so (node.release.unverified).
export const agentlessCommissionProfile = defineProfile({
  id: "metal.commission.agentless",
  target: "metal",
  description: "Inspect through the BMC (identity and addresses) and power off; no ramdisk, no wipe",
  steps: [
    { step: "inventory.bmc", name: "inspect" },
    { step: "metal.recordInventory", fromStep: "inspect" },
    { step: "power.setPower", name: "power.off", input: { action: "off" } },
  ],
});

export const agentlessReleaseProfile = defineProfile({
  id: "metal.release.agentless",
  target: "metal",
  description: "Eject the virtual CD and power off; the disks are not wiped (no agent can attest it)",
  steps: [{ step: "media.eject" }, { step: "power.setPower", name: "power.off", input: { action: "off" } }],
});

export const releaseProfile = defineProfile({
  id: "metal.release",
  target: "metal",
  description: "Boot the ramdisk, wipe every disk (attested), power off",
  steps: [
    ...pxeIntoRamdisk,
    { step: "disk.wipe" },
    netbootDiskNext,
    { step: "power.setPower", name: "power.off", input: { action: "off" } },
  ],
});

export const imageStreamProfile = defineProfile({
  id: "metal.deploy.image-stream",
  target: "metal",
  role: "host",
  description:
    "Boot the ramdisk, stream the image (input.image: { url, sha256 }, through the site's cache) onto the disk with a config drive, boot it, wait for its agent",
  steps: [
    ...pxeIntoRamdisk,
    { step: "image.cache" },
    { step: "os.token" },
    { step: "image.write", fromStep: ["image.cache", "os.token"] },
    netbootDiskNext,
    { step: "management.setBootDevice", name: "boot.disk", input: { device: "disk" } },
    { step: "power.setPower", name: "power.reboot", input: { action: "cycle" } },
    { step: "wait.agentJoined", name: "wait.node", input: { role: "node" } },
  ],
});

export const rescueProfile = defineProfile({
  id: "metal.rescue",
  target: "metal",
  description: "Boot a deployed machine into the ramdisk, its disk untouched; the ramdisk stays up until unrescue",
  steps: pxeIntoRamdisk,
});

export const unrescueProfile = defineProfile({
  id: "metal.unrescue",
  target: "metal",
  description: "Boot the rescued machine from its disk again",
  steps: [
    { step: "netboot.disk" },
    { step: "management.setBootDevice", name: "boot.disk", input: { device: "disk" } },
    { step: "power.setPower", name: "power.reboot", input: { action: "cycle" } },
  ],
});

export const metalProfiles = [
  commissionProfile,
  releaseProfile,
  imageStreamProfile,
  agentlessCommissionProfile,
  agentlessReleaseProfile,
  rescueProfile,
  unrescueProfile,
];
