// The placer's built-in filters, scorers and atom picker. They have the shape a scheduler plugin's
// have (better-compute: PlacementFilter, PlacementScorer, AtomPicker), and run before the plugins'.
// The request they see has its defaults applied (overcommit ratios, strategy: see placer.ts).
import type { AtomPicker, PlacementFilter, PlacementScorer } from "better-compute";
import type { HostView, PlacementRequest } from "better-compute/core";

export const DRIVER_LABEL_PREFIX = "bc.dev/driver.";
/** A nodeLabels value that matches any value of the label (the label must be there). */
export const ANY_VALUE = "*";

const ratio = (r: number) => r.toFixed(1);

/** Free devices of a kind on the host, in the order the agent reported them. */
export const freeDevices = (host: HostView, kind: string) =>
  host.devices.filter((d) => d.kind === kind && !host.usedDevices.includes(d.id)).map((d) => d.id);

export const builtinFilters: PlacementFilter[] = [
  {
    name: "connected",
    filter: (host) => host.state === "connected" || `its agent is ${host.state === "joined" ? "not connected yet" : "disconnected"}`,
  },
  { name: "maintenance", filter: (host) => !host.maintenance || `in maintenance${host.reason ? `: ${host.reason}` : ""}` },
  { name: "cordon", filter: (host) => !host.cordoned || `cordoned${host.reason ? `: ${host.reason}` : ""}` },
  {
    name: "labels",
    filter(host, req) {
      for (const [key, value] of Object.entries(req.nodeLabels ?? {})) {
        const has = host.labels[key];
        if (has === undefined) return `has no label ${key}`;
        if (value !== ANY_VALUE && has !== value) return `label ${key} is ${JSON.stringify(has)}, not ${JSON.stringify(value)}`;
      }
      return true;
    },
  },
  {
    name: "runtime",
    filter: (host, req) =>
      req.runtime === undefined ||
      host.labels[`${DRIVER_LABEL_PREFIX}${req.runtime}`] !== undefined ||
      `does not run ${req.runtime} (no label ${DRIVER_LABEL_PREFIX}${req.runtime})`,
  },
  {
    name: "fits",
    filter(host, req) {
      const cap = host.capacity;
      if (!cap) return "its agent reported no resources";
      const cpu = req.overcommit?.cpu ?? 1;
      const memory = req.overcommit?.memory ?? 1;
      const freeCpu = Math.floor(cap.vcpus * cpu) - host.used.vcpus;
      if (req.vcpus > freeCpu) return `needs ${req.vcpus} vCPUs, ${Math.max(0, freeCpu)} free of ${cap.vcpus} (overcommit ${ratio(cpu)})`;
      const freeMemory = Math.floor(cap.memoryMiB * memory) - host.used.memoryMiB;
      if (req.memoryMiB > freeMemory)
        return `needs ${req.memoryMiB} MiB of memory, ${Math.max(0, freeMemory)} free of ${cap.memoryMiB} (overcommit ${ratio(memory)})`;
      const freeDisk = cap.diskGiB - host.used.diskGiB;
      if (req.diskGiB > freeDisk) return `needs ${req.diskGiB} GiB of disk, ${Math.max(0, freeDisk)} free of ${cap.diskGiB}`;
      if (req.devices) {
        const free = freeDevices(host, req.devices.kind).length;
        const total = host.devices.filter((d) => d.kind === req.devices!.kind).length;
        if (req.devices.count > free) return `needs ${req.devices.count} ${req.devices.kind} devices, ${free} free of ${total}`;
      }
      return true;
    },
  },
  {
    name: "anti-affinity",
    filter: (host, req) =>
      !req.antiAffinity ||
      !host.groups.includes(req.antiAffinity.group) ||
      `already holds a reservation of anti-affinity group ${req.antiAffinity.group}`,
  },
];

/** How full the host would be with the request on it: the mean of its CPU and memory shares, 0..1. */
function utilisation(host: HostView, req: PlacementRequest): number {
  const cap = host.capacity;
  if (!cap) return 1;
  const share = (used: number, asked: number, total: number) => (total > 0 ? Math.min(1, (used + asked) / total) : 1);
  const cpu = share(host.used.vcpus, req.vcpus, cap.vcpus * (req.overcommit?.cpu ?? 1));
  const memory = share(host.used.memoryMiB, req.memoryMiB, cap.memoryMiB * (req.overcommit?.memory ?? 1));
  return (cpu + memory) / 2;
}

/** spread: the least used host first; pack: the most used first (fills hosts, keeps others empty). */
export const strategyScorer: PlacementScorer = {
  name: "strategy",
  score: (host, req) => (req.strategy === "pack" ? utilisation(host, req) : 1 - utilisation(host, req)),
};

/** The first free devices of the kind, in the order the agent reported them. */
export const firstFreePicker = (kind: string): AtomPicker => ({
  name: "first-free",
  kind,
  pick(host, req) {
    const free = freeDevices(host, kind);
    const count = req.devices?.count ?? 0;
    return free.length >= count ? free.slice(0, count) : null;
  },
});
