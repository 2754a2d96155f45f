// The placer: given the hosts a request may go to (port.ts reads them), runs every filter on each
// (built-ins first, then the scheduler plugins'), ranks the hosts left by their scorers, and picks
// the devices (atoms) on each. Pure over what it is given: booking, and the re-check under the
// host's lock, are port.ts's.
import { z } from "zod";
import type { AtomPicker, PlacementFilter, PlacementScorer, SchedulerPluginDefinition } from "better-compute";
import { ComputeError, driverError, invalidArgument, schemaIssues, type HostView, type PlacementRequest } from "better-compute/core";
import { builtinFilters, firstFreePicker, freeDevices, strategyScorer } from "./builtins.ts";

const labels = z.record(z.string().min(1).max(253), z.string().max(253));

/** A PlacementRequest, checked before anything is read (INVALID_ARGUMENT naming the field). */
export const placementRequest = z.strictObject({
  owner: z.string().min(1).max(256),
  candidates: z.strictObject({ labels: labels.optional() }).optional(),
  nodeLabels: labels.optional(),
  runtime: z
    .string()
    .regex(/^[a-z0-9][a-z0-9.-]{0,127}$/)
    .optional(),
  vcpus: z.number().int().min(0).max(100_000),
  memoryMiB: z
    .number()
    .int()
    .min(0)
    .max(2 ** 30),
  diskGiB: z
    .number()
    .int()
    .min(0)
    .max(2 ** 30),
  devices: z.strictObject({ kind: z.string().min(1).max(64), count: z.number().int().min(1).max(256) }).optional(),
  overcommit: z
    .strictObject({ cpu: z.number().positive().max(64).optional(), memory: z.number().positive().max(64).optional() })
    .optional(),
  antiAffinity: z.strictObject({ group: z.string().min(1).max(256) }).optional(),
  strategy: z.enum(["spread", "pack"]).optional(),
  pool: z.string().min(1).max(256).optional(),
  holdId: z.string().min(1).max(64).optional(),
});

export interface PlacerDefaults {
  strategy?: "spread" | "pack";
  overcommit?: { cpu?: number; memory?: number };
}

/** Checks a request and applies the module's defaults (strategy, overcommit). */
export function parseRequest(input: unknown, defaults: PlacerDefaults): PlacementRequest {
  const parsed = placementRequest.safeParse(input);
  if (!parsed.success) throw invalidArgument("the placement request is not valid", { issues: schemaIssues(parsed.error) });
  const req = parsed.data;
  return {
    ...req,
    strategy: req.strategy ?? defaults.strategy ?? "spread",
    overcommit: {
      cpu: req.overcommit?.cpu ?? defaults.overcommit?.cpu ?? 1,
      memory: req.overcommit?.memory ?? defaults.overcommit?.memory ?? 1,
    },
  };
}

/** The built-ins and every registered scheduler plugin's parts, plugin parts named "<plugin>/<name>". */
export interface Placer {
  filters: PlacementFilter[];
  scorers: PlacementScorer[];
  pickers: AtomPicker[];
  admissions: { name: string; admit: (req: PlacementRequest) => void | string }[];
}

export function placer(plugins: readonly SchedulerPluginDefinition[]): Placer {
  const named = <T extends { name: string }>(plugin: SchedulerPluginDefinition, part: T): T => ({
    ...part,
    name: `${plugin.id}/${part.name}`,
  });
  return {
    filters: [...builtinFilters, ...plugins.flatMap((p) => (p.filters ?? []).map((f) => named(p, f)))],
    scorers: [strategyScorer, ...plugins.flatMap((p) => (p.scorers ?? []).map((s) => named(p, s)))],
    pickers: plugins.flatMap((p) => (p.atomPickers ?? []).map((a) => named(p, a))),
    admissions: plugins.flatMap((p) => (p.admission ? [{ name: p.id, admit: p.admission }] : [])),
  };
}

/** Runs the plugins' admission hooks: a refusal is FAILED_PRECONDITION with the plugin's reason. */
export function admit(p: Placer, req: PlacementRequest): void {
  for (const { name, admit } of p.admissions) {
    const refusal = guarded(name, "admission", () => admit(req));
    if (typeof refusal === "string")
      throw new ComputeError("FAILED_PRECONDITION", `scheduler plugin ${name} refused the request: ${refusal}`, {
        plugin: name,
        reason: refusal,
      });
  }
}

export type Verdict =
  | { nodeId: string; accepted: true; score: number; scores: Record<string, number>; atoms: string[] }
  | { nodeId: string; accepted: false; filter: string; reason: string };

/** One host's verdict: the first filter that refuses it, else its score and the devices picked for it. */
export function judge(p: Placer, host: HostView, req: PlacementRequest): Verdict {
  const refuse = (filter: string, reason: string): Verdict => ({ nodeId: host.nodeId, accepted: false, filter, reason });
  for (const f of p.filters) {
    const verdict = guarded(f.name, "filter", () => f.filter(host, req));
    if (verdict !== true) return refuse(f.name, typeof verdict === "string" ? verdict : "refused");
  }
  let atoms: string[] = [];
  if (req.devices) {
    const { kind, count } = req.devices;
    // A plugin's picker for the kind comes before the built-in one.
    const picker = p.pickers.find((a) => a.kind === kind) ?? firstFreePicker(kind);
    const picked = guarded(picker.name, "atom picker", () => picker.pick(host, req));
    if (picked === null) return refuse(picker.name, `found no set of ${count} ${kind} devices`);
    const free = freeDevices(host, kind);
    if (picked.length !== count || new Set(picked).size !== count || !picked.every((id) => free.includes(id)))
      return refuse(picker.name, `picked ${picked.join(", ") || "nothing"}, which is not ${count} free ${kind} devices of this host`);
    atoms = picked;
  }
  const scores: Record<string, number> = {};
  let score = 0;
  for (const s of p.scorers) {
    const value = guarded(s.name, "scorer", () => s.score(host, req));
    if (!Number.isFinite(value)) throw driverError(`scheduler scorer ${s.name} returned ${value}, not a number`);
    scores[s.name] = value;
    score += (s.weight ?? 1) * value;
  }
  return { nodeId: host.nodeId, accepted: true, score, scores, atoms };
}

/** Every host's verdict; the accepted ones best first (ties: by node id, compared by code unit like port.ts's ORDER BY ... COLLATE "C"). */
export function rank(p: Placer, hosts: readonly HostView[], req: PlacementRequest) {
  const verdicts = hosts.map((h) => judge(p, h, req));
  const accepted = verdicts
    .filter((v): v is Extract<Verdict, { accepted: true }> => v.accepted)
    .sort((a, b) => b.score - a.score || (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
  const rejected = verdicts.filter((v): v is Extract<Verdict, { accepted: false }> => !v.accepted);
  return { verdicts, accepted, rejected };
}

/** A plugin's code that throws is the plugin's failure (DRIVER_ERROR naming it), not the caller's. */
function guarded<T>(name: string, what: string, run: () => T): T {
  try {
    return run();
  } catch (err) {
    if (err instanceof ComputeError) throw err;
    throw driverError(`scheduler ${what} ${name} failed: ${err instanceof Error ? err.message : String(err)}`, { [what]: name });
  }
}
