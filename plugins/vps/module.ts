// The vps module: tenants, quotas and flavors on pools of provider servers. The methods keep the
// record (accounts.ts: providers and accounts; pools.ts: pools and flavors; tenants.ts: tenants,
// members, quotas, SSH keys; instances.ts: instances), and the vps.instances reconciler (reconciler.ts) makes each
// provider's servers follow it. Providers are registered as the module's extensions.
import { defineModule, type Module } from "better-compute";
import { accountActions, accountMethods } from "./accounts.ts";
import { instanceActions, instanceMethods } from "./instances.ts";
import { TENANT_ROLE, type VpsOptions } from "./methods.ts";
import { poolActions, poolMethods } from "./pools.ts";
import { instancesReconciler } from "./reconciler.ts";
import { vpsMigrations } from "./schema.ts";
import { tenantActions, tenantMethods } from "./tenants.ts";

export function vps(options: VpsOptions = {}): Module {
  return defineModule({
    id: "vps",
    description: "VPS from hosting providers: accounts, pools, tenants with quotas, flavors, SSH keys and instances",
    iam: {
      actions: { ...accountActions, ...poolActions, ...tenantActions, ...instanceActions },
      // A tenant's key: its own instances and SSH keys, and what it may create them from.
      roles: { [TENANT_ROLE]: ["vps.instances.*", "vps.sshKeys.*", "vps.flavors.list", "vps.quotas.list"] },
    },
    migrations: vpsMigrations,
    api: [...accountMethods(options), ...poolMethods(options), ...tenantMethods(), ...instanceMethods()],
    extensions: options.providers ?? [],
    reconcilers: [instancesReconciler(options)],
  });
}
