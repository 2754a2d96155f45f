// The vps module: tenants, quotas and flavors on pools of provider servers or of the deployment's
// hosts (class host). The methods keep the record (accounts.ts: providers and accounts; pools.ts:
// pools and flavors; tenants.ts: tenants, members, quotas, SSH keys; instances.ts: instances), the
// vps.instances reconciler (reconciler.ts) makes each provider's servers follow it, and the
// vps.hostInstances reconciler (host-instances.ts) follows what the hosts report of host pools'
// instances (the NodeSpec `instances` section the module owns). Providers are registered as the
// module's extensions.
import { defineDriver, defineModule, type Module } from "better-compute";
import { accountActions, accountMethods } from "./accounts.ts";
import { consoleCommand, hostActions, hostInstancesReconciler, hostMethods, instancesSection } from "./host-instances.ts";
import { instanceActions, instanceMethods } from "./instances.ts";
import { TENANT_ROLE, type VpsOptions } from "./methods.ts";
import { instanceMetrics } from "./metrics.ts";
import { poolActions, poolMethods } from "./pools.ts";
import { instancesReconciler } from "./reconciler.ts";
import { vpsMigrations } from "./schema.ts";
import { tenantActions, tenantMethods } from "./tenants.ts";

/**
 * The runtimes `bcd node` has built in (agent/runtimes, docs/runtimes.md), as the drivers a host pool
 * names: a host advertises each it can run in its hello (label bc.dev/driver.<id>), and the placer
 * puts a pool's guests only on hosts that do. A plugin's runtime registers its own defineDriver.
 */
export const runtimeDrivers = [
  defineDriver({ id: "qemu-microvm", kinds: ["runtime"], runsOn: "node" }),
  defineDriver({ id: "firecracker", kinds: ["runtime"], runsOn: "node" }),
];

export function vps(options: VpsOptions = {}): Module {
  return defineModule({
    id: "vps",
    description:
      "VPS from hosting providers or on the deployment's hosts: accounts, pools, tenants with quotas, flavors, SSH keys and instances",
    iam: {
      actions: { ...accountActions, ...poolActions, ...tenantActions, ...instanceActions, ...hostActions },
      // A tenant's key: its own instances and SSH keys, and what it may create them from.
      roles: { [TENANT_ROLE]: ["vps.instances.*", "vps.sshKeys.*", "vps.flavors.list", "vps.quotas.list"] },
    },
    migrations: vpsMigrations,
    api: [...accountMethods(options), ...poolMethods(options), ...tenantMethods(), ...instanceMethods(), ...hostMethods()],
    extensions: [...runtimeDrivers, ...(options.providers ?? [])],
    nodeSpecSections: [instancesSection],
    commands: [consoleCommand],
    reconcilers: [instancesReconciler(options), hostInstancesReconciler()],
    metrics: instanceMetrics,
  });
}
