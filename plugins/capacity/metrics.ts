// The capacity module's families for GET /metrics (docs/metrics.md): each host's resources as its
// agent reported them beside what its live reservations and holds use, read as capacity.hosts.list
// reads them (readHosts: every host and its live reservations summed, the fleet as it is now).
// Memory and disk in bytes, the base unit Prometheus expects.
import type { HostView, MetricFamily, ModuleContext } from "better-compute/core";
import { readHosts } from "./port.ts";

const MIB = 1024 ** 2;
const GIB = 1024 ** 3;

type Amount = "vcpus" | "memoryMiB" | "diskGiB";

const RESOURCES: { amount: Amount; name: string; what: string; unit?: string; scale: number }[] = [
  { amount: "vcpus", name: "bc_host_cpus", what: "CPUs", scale: 1 },
  { amount: "memoryMiB", name: "bc_host_memory", what: "Memory", unit: "bytes", scale: MIB },
  { amount: "diskGiB", name: "bc_host_disk", what: "Disk", unit: "bytes", scale: GIB },
];

export async function capacityMetrics(ctx: ModuleContext): Promise<MetricFamily[]> {
  const hosts = await readHosts(ctx.store.db);
  const suffix = (unit?: string) => (unit ? `_${unit}` : "");
  return RESOURCES.flatMap(({ amount, name, what, unit, scale }): MetricFamily[] => [
    {
      type: "gauge",
      name: `${name}${suffix(unit)}`,
      ...(unit ? { unit } : {}),
      help: `${what} the host's agent reported (hosts that reported none are left out)`,
      points: hosts.filter((h) => h.capacity).map((h) => point(h, h.capacity![amount] * scale)),
    },
    {
      type: "gauge",
      name: `${name}_used${suffix(unit)}`,
      ...(unit ? { unit } : {}),
      help: `${what} booked on the host by its live reservations and unexpired holds`,
      points: hosts.map((h) => point(h, h.used[amount] * scale)),
    },
  ]);
}

const point = (h: HostView, value: number) => ({ labels: { node: h.nodeId }, value });
