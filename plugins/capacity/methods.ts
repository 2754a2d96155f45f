// The operator's methods: hosts with what they have, use and hold; cordon and maintenance; a dry
// run of a placement (capacity.explain); holds booked ahead of an instance. The CLI reaches each as
// `better-compute capacity <...>` (docs/capacity.md).
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, invalidArgument, notFound, one, rows, type HostView, type MethodDefinition, type Tx } from "better-compute/core";
import { placementRequest } from "./placer.ts";
import { readHosts } from "./port.ts";

export const capacityActions = {
  "capacity.hosts.list": "List hosts with their resources, use and schedulability",
  "capacity.hosts.get": "Read a host: resources, use, free, reservations, cordon and maintenance",
  "capacity.hosts.cordon": "Stop placing anything new on a host",
  "capacity.hosts.uncordon": "Place on a cordoned host again",
  "capacity.hosts.maintenance": "Put a host in maintenance, or take it out",
  "capacity.explain": "Dry-run a placement: every host's verdict and the host it would pick",
  "capacity.holds.create": "Hold capacity on a host ahead of an instance, for a while",
  "capacity.holds.release": "Release a hold",
};

const nodeId = z.string().min(1).max(128);
const amounts = z.object({ vcpus: z.number(), memoryMiB: z.number(), diskGiB: z.number() });

const hostSummary = z.object({
  node: z.string(),
  hostname: z.string().nullable(),
  state: z.string(),
  /** Connected, not cordoned, not in maintenance. */
  schedulable: z.boolean(),
  cordoned: z.boolean(),
  maintenance: z.boolean(),
  reason: z.string().nullable(),
  /** What the agent reported (null: nothing yet). */
  capacity: amounts.nullable(),
  used: amounts,
  /** capacity - used, without overcommit (a pool's ratios raise CPU and memory). */
  free: amounts.nullable(),
  devices: z.array(z.object({ id: z.string(), kind: z.string(), model: z.string().optional(), used: z.boolean() })),
  reservations: z.number(),
  labels: z.record(z.string(), z.string()),
});

const reservation = z.object({
  id: z.string(),
  owner: z.string(),
  state: z.enum(["held", "active"]),
  pool: z.string().nullable(),
  vcpus: z.number(),
  memoryMiB: z.number(),
  diskGiB: z.number(),
  devices: z.array(z.string()),
  antiAffinityGroup: z.string().nullable(),
  expiresAt: z.string().nullable(),
  createdAt: z.string(),
});

const placementResult = z.object({
  placed: z.object({ nodeId: z.string(), reservationId: z.string(), atoms: z.array(z.string()) }).optional(),
  unplaceable: z.object({ rejections: z.array(z.object({ nodeId: z.string(), filter: z.string(), reason: z.string() })) }).optional(),
});

const iso = (v: unknown) => (v === null ? null : new Date(v as string).toISOString());

function summary(h: HostView): z.input<typeof hostSummary> {
  const free = h.capacity
    ? {
        vcpus: h.capacity.vcpus - h.used.vcpus,
        memoryMiB: h.capacity.memoryMiB - h.used.memoryMiB,
        diskGiB: h.capacity.diskGiB - h.used.diskGiB,
      }
    : null;
  return {
    node: h.nodeId,
    hostname: h.hostname,
    state: h.state,
    schedulable: h.state === "connected" && !h.cordoned && !h.maintenance,
    cordoned: h.cordoned,
    maintenance: h.maintenance,
    reason: h.reason,
    capacity: h.capacity,
    used: h.used,
    free,
    devices: h.devices.map((d) => ({ ...d, used: h.usedDevices.includes(d.id) })),
    reservations: h.reservations,
    labels: h.labels,
  };
}

async function hostOf(tx: Tx, node: string): Promise<HostView> {
  const [host] = await readHosts(tx, { nodeId: node });
  if (!host) throw notFound(`host ${node} does not exist (a live node of role node)`, { node });
  return host;
}

/** Writes the operator's settings for a host (the row is created on first use) and the event saying so. */
function settingMethod<I extends z.ZodObject>(
  name: string,
  description: string,
  input: I,
  change: (input: z.output<I>) => { cordoned?: boolean; maintenance?: boolean; reason: string | null; event: string },
): MethodDefinition<I, typeof hostSummary> {
  return defineMethod({
    name,
    resource: (i) => `capacity/hosts/${(i as { node: string }).node}`,
    description,
    input,
    output: hostSummary,
    handler: async (ctx, i, tx) => {
      const { node } = i as { node: string };
      await hostOf(tx, node);
      const c = change(i);
      await tx.execute(sql`
        INSERT INTO capacity_hosts (node_id, cordoned, maintenance, reason)
        VALUES (${node}, ${c.cordoned ?? false}, ${c.maintenance ?? false}, ${c.reason})
        ON CONFLICT (node_id) DO UPDATE SET
          cordoned = coalesce(${c.cordoned ?? null}::boolean, capacity_hosts.cordoned),
          maintenance = coalesce(${c.maintenance ?? null}::boolean, capacity_hosts.maintenance),
          -- One reason for both: a new one replaces it; it goes when neither is on any more.
          reason = CASE WHEN coalesce(${c.cordoned ?? null}::boolean, capacity_hosts.cordoned)
                          OR coalesce(${c.maintenance ?? null}::boolean, capacity_hosts.maintenance)
                        THEN coalesce(${c.reason}, capacity_hosts.reason) END,
          updated_at = compute_now()`);
      await ctx.events.publish(tx, { type: c.event, subject: `capacity/hosts/${node}`, data: { reason: c.reason } });
      return summary(await hostOf(tx, node));
    },
  });
}

const reason = z.string().min(1).max(500);
const requestFields = placementRequest.omit({ owner: true, holdId: true });

export function capacityMethods(): MethodDefinition<any, any>[] {
  return [
    defineMethod({
      name: "capacity.hosts.list",
      readOnly: true,
      description: "Hosts (live nodes of role node) with what they report, use and hold; labels narrows the list",
      input: z.object({ labels: z.record(z.string().max(253), z.string().max(253)).optional() }),
      output: z.object({ hosts: z.array(hostSummary) }),
      handler: async (_ctx, input, tx) => ({ hosts: (await readHosts(tx, { labels: input.labels })).map(summary) }),
    }),
    defineMethod({
      name: "capacity.hosts.get",
      readOnly: true,
      resource: (input) => `capacity/hosts/${input.node}`,
      description: "A host: resources, use, free, its reservations and holds, cordon and maintenance",
      input: z.object({ node: nodeId }),
      output: hostSummary.extend({ reservationList: z.array(reservation) }),
      handler: async (_ctx, input, tx) => {
        const host = await hostOf(tx, input.node);
        const reservations = await rows(
          tx,
          sql`
          SELECT id, owner, state, pool, vcpus, memory_mib, disk_gib, devices, anti_affinity_group, expires_at, created_at
          FROM capacity_reservations r WHERE node_id = ${input.node} AND (r.state = 'active' OR r.expires_at > compute_now())
          ORDER BY created_at, id`,
        );
        const reservationList = reservations.map((r) => ({
          id: r.id as string,
          owner: r.owner as string,
          state: r.state as "held" | "active",
          pool: r.pool as string | null,
          vcpus: Number(r.vcpus),
          memoryMiB: Number(r.memory_mib),
          diskGiB: Number(r.disk_gib),
          devices: r.devices as string[],
          antiAffinityGroup: r.anti_affinity_group as string | null,
          expiresAt: iso(r.expires_at),
          createdAt: iso(r.created_at)!,
        }));
        return { ...summary(host), reservationList };
      },
    }),
    settingMethod(
      "capacity.hosts.cordon",
      "Place nothing new on the host (what it runs stays); the reason is shown",
      z.object({ node: nodeId, reason }),
      (i) => ({
        cordoned: true,
        reason: i.reason,
        event: "capacity.host.cordoned",
      }),
    ),
    settingMethod("capacity.hosts.uncordon", "Place on the host again", z.object({ node: nodeId }), () => ({
      cordoned: false,
      reason: null,
      event: "capacity.host.uncordoned",
    })),
    settingMethod(
      "capacity.hosts.maintenance",
      "Put the host in maintenance (on: true, with a reason) or take it out (on: false); nothing is placed on it meanwhile",
      z.object({ node: nodeId, on: z.boolean(), reason: reason.optional() }),
      (i) => {
        if (i.on && !i.reason) throw invalidArgument("maintenance on needs a reason (shown to whoever asks why nothing lands there)");
        return {
          maintenance: i.on,
          reason: i.on ? i.reason! : null,
          event: i.on ? "capacity.host.maintenance.on" : "capacity.host.maintenance.off",
        };
      },
    ),
    defineMethod({
      name: "capacity.explain",
      readOnly: true,
      description:
        "Dry-run a placement request: each host's verdict (the filter that refused it, or its scores) and the host it would pick",
      input: requestFields,
      output: z.object({
        verdicts: z.array(
          z.object({
            nodeId: z.string(),
            accepted: z.boolean(),
            score: z.number().optional(),
            scores: z.record(z.string(), z.number()).optional(),
            filter: z.string().optional(),
            reason: z.string().optional(),
          }),
        ),
        pick: z.string().nullable(),
      }),
      handler: (ctx, input, tx) => ctx.capacity.explain(tx, input),
    }),
    defineMethod({
      name: "capacity.holds.create",
      description:
        "Hold capacity for ttlSeconds: placed like an instance, counted until it expires, consumed by a reserve naming it (holdId); owner defaults to holds/<id>",
      input: requestFields.extend({ owner: z.string().min(1).max(256).optional(), ttlSeconds: z.number().int().min(1).max(604_800) }),
      output: placementResult,
      handler: async (ctx, input, tx) => {
        const owner = input.owner ?? `holds/${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
        return ctx.capacity.hold(tx, { ...input, owner });
      },
    }),
    defineMethod({
      name: "capacity.holds.release",
      resource: (input) => `capacity/holds/${input.id}`,
      description: "Release a hold (by the id holds.create answered as reservationId); an expired or consumed one is NOT_FOUND",
      input: z.object({ id: z.string().min(1).max(64) }),
      output: z.object({ id: z.string(), released: z.boolean() }),
      handler: async (ctx, input, tx) => {
        const hold = await one<{ owner: string }>(
          tx,
          sql`
          SELECT owner FROM capacity_reservations r WHERE id = ${input.id} AND state = 'held' AND r.expires_at > compute_now()`,
        );
        if (!hold) throw notFound(`hold ${input.id} does not exist (expired, released, or consumed by a reservation)`, { id: input.id });
        return { id: input.id, released: await ctx.capacity.release(tx, hold.owner) };
      },
    }),
  ];
}
