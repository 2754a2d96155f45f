// The registry: everything a deployment registers, checked once when betterCompute() runs.
// It refuses what it cannot check, with INVALID_CONFIG naming the offender.
import type {
  CommandKind,
  Extension,
  MethodDefinition,
  Migration,
  Module,
  NodeSpecSection,
  SchedulerPluginDefinition,
  SinkDefinition,
} from "./contracts.ts";
import { invalidConfig } from "./errors.ts";
import type { ResolvedCatalog } from "./iam.ts";

export interface RegistryInput {
  modules?: Module[];
  plugins?: Module[];
  drivers?: Extension[];
  providers?: Extension[];
  attestors?: Extension[];
  scheduler?: { plugins?: SchedulerPluginDefinition[] };
  sinks?: { events?: SinkDefinition[]; audit?: SinkDefinition[]; usage?: unknown[] };
}

export interface RegisteredMethod {
  method: MethodDefinition;
  module: Module;
}

export interface RegisteredCommandKind {
  command: CommandKind;
  module: Module;
}

export interface RegisteredNodeSpecSection {
  section: NodeSpecSection;
  module: Module;
}

export interface Registry {
  /** In registration order: the built-in modules first, then modules, then plugins. */
  modules: Module[];
  methods: ReadonlyMap<string, RegisteredMethod>;
  commandKinds: ReadonlyMap<string, RegisteredCommandKind>;
  /** NodeSpec sections by name, with the module that owns (and alone writes) each. */
  nodeSpecSections: ReadonlyMap<string, RegisteredNodeSpecSection>;
  catalog: ResolvedCatalog;
  /** Module migrations, each module's in name order, modules in registration order. */
  migrations: Migration[];
  /** Every extension by kind:id@version, from options and from modules' `extensions`. */
  extensions: ReadonlyMap<string, Extension>;
  /** Extensions of one contract ("driver", "sink", ...), wherever they were registered. */
  byContract<T extends Extension>(contract: T["contract"]): T[];
}

/** `builtins` are the platform's own modules (core, agents), registered first, on the same contract. */
export function buildRegistry(builtins: Module[], input: RegistryInput): Registry {
  const keys = new Set<string>();
  const claim = (key: string, where: string) => {
    if (keys.has(key)) throw invalidConfig(`duplicate registration ${key} (${where})`, { duplicate: key });
    keys.add(key);
  };

  if (input.sinks?.usage?.length) {
    throw invalidConfig("usage sinks are not supported: usage goes to IAM billing", { option: "sinks.usage" });
  }

  const modules = [...builtins, ...(input.modules ?? []), ...(input.plugins ?? [])];
  const extensions = new Map<string, Extension>();
  const addExtension = (ext: Extension, where: string, expected?: string) => {
    if (expected && ext.contract !== expected) {
      throw invalidConfig(`${where} holds a ${ext.contract} (${ext.id}), not a ${expected}`, { extension: `${ext.contract}:${ext.id}` });
    }
    const key = `${ext.contract}:${ext.id}@${ext.version}`;
    claim(key, where);
    extensions.set(key, ext);
  };

  const actions = new Map<string, { module: string; description: string; readOnly: boolean }>();
  const roles: Record<string, string[]> = {};
  const migrations: Migration[] = [];
  const commandKinds = new Map<string, RegisteredCommandKind>();
  const nodeSpecSections = new Map<string, RegisteredNodeSpecSection>();

  const moduleVersions = new Map<string, string>();
  for (const mod of modules) {
    // One version of a module per deployment: its routes and tables have one owner.
    const registered = moduleVersions.get(mod.id);
    if (registered !== undefined) {
      throw invalidConfig(`duplicate registration module:${mod.id}@${mod.version} (${mod.id}@${registered} is already registered)`, {
        duplicate: `module:${mod.id}@${mod.version}`,
      });
    }
    moduleVersions.set(mod.id, mod.version);
    for (const [action, description] of Object.entries(mod.iam?.actions ?? {})) {
      const owner = actions.get(action);
      if (owner)
        throw invalidConfig(`IAM action ${action} is declared by both ${owner.module} and ${mod.id}`, { duplicate: `action:${action}` });
      actions.set(action, { module: mod.id, description, readOnly: true });
    }
    for (const [role, patterns] of Object.entries(mod.iam?.roles ?? {})) {
      roles[role] = [...(roles[role] ?? []), ...patterns];
    }
    const own = [...(mod.migrations ?? [])].sort((a, b) => a.name.localeCompare(b.name));
    for (const m of own) {
      if (!m.name.startsWith(`${mod.id}/`)) {
        throw invalidConfig(`migration ${m.name} of module ${mod.id} is named for another module (expected "${mod.id}/...")`, {
          migration: m.name,
          module: mod.id,
        });
      }
      claim(`migration:${m.name}`, `module ${mod.id}`);
      migrations.push(m);
    }
    for (const ext of mod.extensions ?? []) addExtension(ext, `module ${mod.id}`);
    for (const profile of mod.profiles ?? []) addExtension(profile, `module ${mod.id} (profiles)`, "profile");
    for (const command of mod.commands ?? []) {
      if (!/^[a-z][a-zA-Z0-9]*(\.[a-z][a-zA-Z0-9]*)+$/.test(command.kind)) {
        throw invalidConfig(`command kind ${JSON.stringify(command.kind)} of module ${mod.id} is not a dotted name`, {
          command: command.kind,
        });
      }
      claim(`command:${command.kind}`, `module ${mod.id}`);
      commandKinds.set(command.kind, { command, module: mod });
    }
    for (const section of mod.nodeSpecSections ?? []) {
      if (!/^[a-z][a-z0-9-]{0,63}$/.test(section.name)) {
        throw invalidConfig(`NodeSpec section ${JSON.stringify(section.name)} of module ${mod.id} is not a name ([a-z][a-z0-9-]*)`, {
          section: section.name,
        });
      }
      claim(`nodeSpecSection:${section.name}`, `module ${mod.id}`);
      nodeSpecSections.set(section.name, { section, module: mod });
    }
  }

  const methods = new Map<string, RegisteredMethod>();
  for (const mod of modules) {
    for (const method of mod.api ?? []) {
      claim(`method:${method.name}`, `module ${mod.id}`);
      const action = actions.get(method.action);
      if (!action) {
        throw invalidConfig(
          `method ${method.name} of module ${mod.id} uses action ${method.action}, which no module's IAM catalog declares`,
          { method: method.name, action: method.action },
        );
      }
      // An action is read-only (granted to viewer) only if every method using it is.
      action.readOnly &&= method.readOnly === true;
      methods.set(method.name, { method, module: mod });
    }
  }

  for (const ext of input.drivers ?? []) addExtension(ext, "drivers", "driver");
  for (const ext of input.providers ?? []) addExtension(ext, "providers", "provider");
  for (const ext of input.attestors ?? []) addExtension(ext, "attestors", "attestor");
  for (const ext of input.scheduler?.plugins ?? []) addExtension(ext, "scheduler.plugins", "scheduler-plugin");
  for (const kind of ["events", "audit"] as const) {
    for (const sink of input.sinks?.[kind] ?? []) {
      addExtension(sink, `sinks.${kind}`, "sink");
      if (sink.kind !== kind) throw invalidConfig(`sink ${sink.id} is a ${sink.kind} sink, listed under sinks.${kind}`, { sink: sink.id });
    }
  }

  return {
    modules,
    methods,
    commandKinds,
    nodeSpecSections,
    catalog: { actions, roles },
    migrations,
    extensions,
    byContract: <T extends Extension>(contract: T["contract"]) => [...extensions.values()].filter((e): e is T => e.contract === contract),
  };
}
