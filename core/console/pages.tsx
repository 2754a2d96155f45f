/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The console's pages, rendered on the server from what the API's methods answered (hono's JSX
// escapes every value). Each page has one #live region that the client script fetches again
// (?part=live) when an event for its subjects arrives; the rest (navigation, forms being typed
// into) stays put. No page carries a credential: only the session's CSRF token, in its forms.
import type { Child, FC, PropsWithChildren } from "hono/jsx";
import type { Principal } from "../iam.ts";
import type { WorkflowView } from "../views.ts";
import {
  CsrfField,
  DataTable,
  Empty,
  FilterForm,
  Json,
  MorePage,
  plural,
  PostButton,
  PostForm,
  Section,
  State,
  Submit,
  Time,
} from "./components.tsx";

// ------------------------------------------------------------------ what the methods answer

export interface MachineView {
  id: string;
  pool: string;
  site: string;
  state: string;
  maintenance: boolean;
  maintenanceReason: string | null;
  role: string | null;
  workflow: string | null;
  productUuid: string | null;
  addresses: string[];
  bmc: { driver: string; address: string; username: string };
  lastError: unknown;
  /** What commissioning found (metal.nodes.get only; null until inspected). */
  inventory?: InventoryView | null;
}
/** metal.nodes.get's inventory: the BMC's view, and what the ramdisk listed. */
export interface InventoryView {
  bmc: {
    manufacturer?: string;
    model?: string;
    serialNumber?: string;
    biosVersion?: string;
    bmcFirmwareVersion?: string;
    processors?: { count: number; model: string | null; threads: number | null };
    memoryGiB?: number;
    macs: string[];
    storage?: { drives: number; volumes: { id: string; level: string | null }[] };
  };
  ramdisk: {
    at: string;
    disks: { device: string; sizeBytes: number; model?: string; serial?: string; rotational?: boolean; removable?: boolean }[];
    cpus?: { count: number; model: string | null };
    memoryBytes?: number;
    nics?: { name: string; mac: string; link: string }[];
  } | null;
}
export interface EventView {
  position: string;
  type: string;
  subject: string | null;
  data: unknown;
  actor: string | null;
  requestId: string | null;
  occurredAt: string;
}
export interface AuditEntryView {
  id: string;
  actor: string;
  action: string;
  resource: string;
  method: string;
  requestId: string;
  at: string;
}
export interface ProblemView {
  status: number;
  code: string;
  message: string;
  requestId: string;
}

// ------------------------------------------------------------------ the frame

export interface Frame {
  title: string;
  /** Signed in: the principal, the CSRF token for the sign-out form, the pages its roles may open. */
  session?: { principal: Principal; csrf: string; links: { href: string; label: string }[] };
  /** The live region's subjects (prefixes, or "*"); without them the page is not live. */
  subjects?: string;
  /** Instead of events (a tenant may not read them), the live region is read again every this many ms. */
  poll?: number;
}

export const Layout: FC<PropsWithChildren<Frame & { live: Child; below?: Child }>> = ({
  title,
  session,
  subjects,
  poll,
  live,
  below,
  children,
}) => (
  <html lang="en">
    <head>
      <meta charset="utf-8" />
      <meta name="viewport" content="width=device-width, initial-scale=1" />
      <title>{`${title} · Better Compute`}</title>
      <link rel="stylesheet" href="/console/app.css" />
      <link rel="icon" href="/console/icon.svg" type="image/svg+xml" />
      <script src="/console/app.js" defer></script>
    </head>
    <body>
      <a class="skip" href="#main">
        Skip to the content
      </a>
      <header>
        <a class="brand" href="/console/">
          Better Compute
        </a>
        {session && session.links.length > 0 && (
          <nav aria-label="Console">
            <ul>
              {session.links.map((link) => (
                <li>
                  <a href={link.href}>{link.label}</a>
                </li>
              ))}
            </ul>
          </nav>
        )}
        {session && (
          <div class="who">
            <span>
              Signed in as <span class="mono">{session.principal.id}</span> ({session.principal.roles.join(", ") || "no roles"})
            </span>
            <PostButton action="/console/sign-out" csrf={session.csrf}>
              Sign out
            </PostButton>
          </div>
        )}
      </header>
      <main id="main">
        <h1>{title}</h1>
        {(subjects || poll) && (
          <p id="live-status" role="status">
            Connecting for live updates…
          </p>
        )}
        {children}
        <div id="live" data-subjects={subjects} data-poll={poll}>
          {live}
        </div>
        {below}
      </main>
    </body>
  </html>
);

// ------------------------------------------------------------------ small parts

export const machinePath = (node: string) => `/console/machines/${encodeURIComponent(node)}`;
export const instancePath = (id: string) => `/console/instances/${encodeURIComponent(id)}`;

const seconds = (from: string | null, to: string | null) =>
  from && to ? `${((Date.parse(to) - Date.parse(from)) / 1000).toFixed(1)} s` : from ? "running" : "–";

export const Problem: FC<{ problem: ProblemView }> = ({ problem }) => (
  <div class="panel error" role="alert">
    <p>
      <strong>{problem.message}</strong>
    </p>
    <p>
      {problem.code} (HTTP {problem.status}), request id <code>{problem.requestId}</code>
    </p>
  </div>
);

// ------------------------------------------------------------------ sign-in and home

export const SignIn: FC<{ problem?: ProblemView }> = ({ problem }) => (
  <>
    {problem && <Problem problem={problem} />}
    <p>
      Sign in with an API key, or with a bearer token (a JWT) from your identity provider where this deployment accepts them. It is
      exchanged for a session of 12 hours (ending sooner if the token does): it is not kept in this page, in the browser's storage or in the
      session cookie.
    </p>
    <form class="stack" method="post" action="/console/session">
      <label for="key">API key or SSO token</label>
      <input id="key" name="key" type="password" autocomplete="off" spellcheck={false} required />
      <Submit>Sign in</Submit>
    </form>
    <p>
      No key yet? <code>npm run dev</code> prints an admin key; <code>npx better-compute iam keys create</code> mints one.
    </p>
  </>
);

export const Home: FC<{ principal: Principal }> = ({ principal }) => (
  <div class="empty">
    <p>
      You are signed in as <code>{principal.id}</code> with the role(s) {principal.roles.join(", ") || "none"}, which may not list machines.
    </p>
    <p>The console's pages for your role are not built yet; the API and the CLI answer everything your key may do.</p>
  </div>
);

export const ErrorPage: FC<{ problem: ProblemView; back?: { href: string; label: string } }> = ({ problem, back }) => (
  <>
    <Problem problem={problem} />
    <p>{back ? <a href={back.href}>{back.label}</a> : <a href="/console/">Back to the console</a>}</p>
  </>
);

// ------------------------------------------------------------------ the fleet

/** Failed first, then maintenance, then machines a workflow is moving, then the rest. */
const urgency = (m: MachineView) => (m.state === "failed" ? 0 : m.maintenance ? 1 : /ing$/.test(m.state) ? 2 : 3);

const Counts: FC<{ label: string; counts: Map<string, number> }> = ({ label, counts }) => (
  <section aria-label={label}>
    <h2>{label}</h2>
    <ul class="counts">
      {[...counts].map(([name, n]) => (
        <li>
          {name}: <strong>{n}</strong>
        </li>
      ))}
    </ul>
  </section>
);

const tally = (machines: MachineView[], key: (m: MachineView) => string) => {
  const counts = new Map<string, number>();
  for (const m of machines) counts.set(key(m), (counts.get(key(m)) ?? 0) + 1);
  return new Map([...counts].sort(([a], [b]) => a.localeCompare(b)));
};

/** The fleet (filtered): counts over every machine that matches, the table a page of FLEET_PAGE at a time. */
export const FLEET_PAGE = 50;

export const Fleet: FC<{ machines: MachineView[]; filtered: boolean; page: number; pageHref: (page: number) => string }> = ({
  machines,
  filtered,
  page,
  pageHref,
}) => {
  if (machines.length === 0 && filtered)
    return (
      <Empty>
        No machine matches these filters. <a href="/console/fleet">Clear them</a> to see the whole fleet.
      </Empty>
    );
  if (machines.length === 0)
    return (
      <Empty>
        <strong>No machines yet.</strong> Create a site and a pool, then enroll a machine by its BMC (<code>metal.sites.create</code>,{" "}
        <code>metal.pools.create</code>, <code>metal.enroll</code>; docs/metal.md walks through it). It commissions by itself and shows up
        here, live. To see a simulated site instead, run <code>npm run dev</code>.
      </Empty>
    );
  const pages = Math.ceil(machines.length / FLEET_PAGE);
  const sorted = [...machines]
    .sort((a, b) => urgency(a) - urgency(b) || a.id.localeCompare(b.id))
    .slice(page * FLEET_PAGE, (page + 1) * FLEET_PAGE);
  return (
    <>
      <Counts label="By state" counts={tally(machines, (m) => (m.maintenance ? `${m.state} (maintenance)` : m.state))} />
      <Counts label="By pool" counts={tally(machines, (m) => m.pool)} />
      <Counts label="By site" counts={tally(machines, (m) => m.site)} />
      <h2>Machines</h2>
      <DataTable
        label="Machines"
        caption={`${plural(machines.length, "machine")}${pages > 1 ? `, page ${page + 1} of ${pages}` : ""}: failed and in maintenance first`}
        columns={["Machine", "State", "Pool", "Site", "Role", { label: "Workflow", wide: true }]}
      >
        {sorted.map((m) => (
          <tr data-machine={m.id}>
            <th scope="row">
              <a href={machinePath(m.id)}>{m.id}</a>
            </th>
            <td>
              <State state={m.state} />
              {m.maintenance && (
                <>
                  {" "}
                  <span class="state maint" title={m.maintenanceReason ?? undefined}>
                    maintenance
                  </span>
                </>
              )}
            </td>
            <td>{m.pool}</td>
            <td>{m.site}</td>
            <td>{m.role ?? "–"}</td>
            <td class="mono wide">{m.workflow ?? "–"}</td>
          </tr>
        ))}
      </DataTable>
      {pages > 1 && (
        <nav aria-label="Fleet pages">
          <p class="actions">
            {page > 0 && <a href={pageHref(page - 1)}>Previous page</a>}
            {page + 1 < pages && (
              <a id="next-page" href={pageHref(page + 1)}>
                Next page
              </a>
            )}
          </p>
        </nav>
      )}
    </>
  );
};

// ------------------------------------------------------------------ a machine

export interface MachineActions {
  deploy: boolean;
  undeploy: boolean;
  maintenance: boolean;
  rescue: boolean;
  retire: boolean;
  recommission: boolean;
  console: boolean;
}

export const Machine: FC<{
  machine: MachineView;
  workflow?: WorkflowView;
  history: EventView[];
  actions: MachineActions;
  profiles: { id: string; description?: string }[];
  csrf: string;
  /** Shown above its workflow's steps (that it awaits approval). */
  notice?: Child;
}> = ({ machine: m, workflow, history, actions, profiles, csrf, notice }) => {
  const path = machinePath(m.id);
  const canDeploy = actions.deploy && m.state === "ready" && !m.maintenance;
  const canUndeploy = actions.undeploy && m.state === "deployed";
  return (
    <>
      <Section id="fields" title="Machine">
        <dl class="fields">
          <dt>State</dt>
          <dd id="machine-state" data-state={m.state}>
            <State state={m.state} />
            {m.maintenance && <> in maintenance: {m.maintenanceReason ?? "no reason given"}</>}
          </dd>
          <dt>Pool / site</dt>
          <dd>
            {m.pool} / {m.site}
          </dd>
          <dt>Role</dt>
          <dd>{m.role ?? "–"}</dd>
          <dt>Product UUID</dt>
          <dd class="mono">{m.productUuid ?? "not inspected yet"}</dd>
          <dt>Addresses</dt>
          <dd class="mono">{m.addresses.length ? m.addresses.join(", ") : "–"}</dd>
          <dt>BMC</dt>
          <dd>
            <span class="mono">{m.bmc.address}</span> (driver {m.bmc.driver}, user {m.bmc.username}; its password is sealed and never shown)
          </dd>
          <dt>Last error</dt>
          <dd>
            <Json value={m.lastError} />
          </dd>
        </dl>
      </Section>

      {Object.values(actions).some(Boolean) && (
        <Section id="actions" title="Actions">
          <div class="actions">
            {canDeploy && (
              <PostForm action={`${path}/deploy`} csrf={csrf}>
                <label for="profile">Profile</label>
                <select id="profile" name="profile">
                  {profiles.map((p) => (
                    <option value={p.id}>{p.description ? `${p.id}: ${p.description}` : p.id}</option>
                  ))}
                </select>
                <label for="input">Input (JSON: what the profile's steps take)</label>
                <textarea id="input" name="input">
                  {"{}"}
                </textarea>
                <Submit id="deploy">Deploy</Submit>
              </PostForm>
            )}
            {canUndeploy && (
              <a id="undeploy" class="button danger" href={`${path}/undeploy`}>
                Undeploy…
              </a>
            )}
            {actions.maintenance && !m.maintenance && m.state !== "failed" && !/ing$/.test(m.state) && m.state !== "retired" && (
              <PostForm action={`${path}/maintenance`} csrf={csrf}>
                <input type="hidden" name="on" value="true" />
                <label for="reason">Reason for maintenance</label>
                <input id="reason" name="reason" required maxlength={500} />
                <Submit id="maintenance-on" class="secondary">
                  Put in maintenance
                </Submit>
              </PostForm>
            )}
            {actions.maintenance && m.maintenance && m.state !== "failed" && (
              <PostButton action={`${path}/maintenance`} csrf={csrf} fields={{ on: "false" }} id="maintenance-off" class="secondary">
                Take out of maintenance
              </PostButton>
            )}
            {actions.rescue && m.state === "deployed" && (
              <a id="rescue" class="button secondary" href={`${path}/rescue`}>
                Rescue…
              </a>
            )}
            {actions.rescue && m.state === "rescue" && (
              <PostButton action={`${path}/unrescue`} csrf={csrf} id="unrescue" class="secondary">
                Boot from its disk (unrescue)
              </PostButton>
            )}
            {actions.recommission && m.state === "failed" && (
              <PostButton action={`${path}/recommission`} csrf={csrf} id="recommission" class="secondary">
                Recommission
              </PostButton>
            )}
            {actions.retire && ["enrolled", "ready", "failed"].includes(m.state) && (
              <a id="retire" class="button danger" href={`${path}/retire`}>
                Retire…
              </a>
            )}
            {actions.console && (
              <a id="serial-console" class="button secondary" href={`${path}/console`}>
                Serial console
              </a>
            )}
            {!canDeploy && !canUndeploy && !actions.maintenance && <p>No action fits the machine's state now.</p>}
          </div>
        </Section>
      )}

      <Hardware inventory={m.inventory} />

      <Section id="workflow" title={workflow ? `Workflow ${workflow.profile}` : "Workflow"}>
        {notice}
        {workflow ? <Workflow workflow={workflow} /> : <p>No workflow has run on this machine yet.</p>}
      </Section>

      <Section id="history" title="Lifecycle history">
        {history.length === 0 ? (
          <p>No events yet.</p>
        ) : (
          <DataTable
            label="Lifecycle history"
            caption={`Events of metal/nodes/${m.id}, newest first`}
            columns={["When", "Event", "By", "Data"]}
          >
            {history.map((e) => (
              <tr>
                <td>
                  <Time at={e.occurredAt} />
                </td>
                <td>{e.type}</td>
                <td class="mono">{e.actor ?? "–"}</td>
                <td>
                  <Json value={e.data} />
                </td>
              </tr>
            ))}
          </DataTable>
        )}
      </Section>
    </>
  );
};

/** Bytes as a person reads them: 64 MiB, 1.9 TiB. */
const bytes = (n: number) => {
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit++;
  }
  return `${unit === 0 || Number.isInteger(n) ? n : n.toFixed(1)} ${units[unit]}`;
};

/** What commissioning found: the BMC's system summary, then what the ramdisk listed from inside the machine. */
const Hardware: FC<{ inventory: InventoryView | null | undefined }> = ({ inventory: inv }) => {
  if (!inv)
    return (
      <Section id="hardware" title="Hardware">
        <p class="empty" id="hardware-empty">
          Not inspected yet: inspection runs during commissioning.
        </p>
      </Section>
    );
  const { bmc, ramdisk } = inv;
  const cpus = ramdisk?.cpus
    ? `${ramdisk.cpus.count} CPUs${ramdisk.cpus.model ? `, ${ramdisk.cpus.model}` : ""}`
    : bmc.processors
      ? `${bmc.processors.count} × ${bmc.processors.model ?? "CPU"}${bmc.processors.threads ? ` (${bmc.processors.threads} threads)` : ""}`
      : undefined;
  const memory = ramdisk?.memoryBytes ? bytes(ramdisk.memoryBytes) : bmc.memoryGiB ? bytes(bmc.memoryGiB * 1024 ** 3) : undefined;
  const nics = ramdisk?.nics?.length ? ramdisk.nics.map((n) => `${n.name} ${n.mac} (${n.link})`) : bmc.macs;
  const firmware = [bmc.biosVersion && `BIOS ${bmc.biosVersion}`, bmc.bmcFirmwareVersion && `BMC ${bmc.bmcFirmwareVersion}`].filter(
    Boolean,
  );
  return (
    <Section id="hardware" title="Hardware">
      <dl class="fields" id="hardware-fields">
        <dt>Maker and model</dt>
        <dd>
          {[bmc.manufacturer, bmc.model].filter(Boolean).join(", ") || "not reported"}
          {bmc.serialNumber && <>, serial {bmc.serialNumber}</>}
        </dd>
        <dt>CPUs</dt>
        <dd>{cpus ?? "not reported"}</dd>
        <dt>Memory</dt>
        <dd>{memory ?? "not reported"}</dd>
        <dt>NICs</dt>
        <dd class="mono">{nics.length ? nics.join(", ") : "none reported"}</dd>
        <dt>Firmware</dt>
        <dd>{firmware.length ? firmware.join(", ") : "not reported"}</dd>
        {bmc.storage && (
          <>
            <dt>RAID controller</dt>
            <dd>
              {plural(bmc.storage.drives, "drive")}
              {bmc.storage.volumes.length > 0 &&
                `; volumes ${bmc.storage.volumes.map((v) => (v.level ? `${v.id} (${v.level})` : v.id)).join(", ")}`}
            </dd>
          </>
        )}
      </dl>
      {ramdisk ? (
        <DataTable
          label="Disks"
          caption={
            <>
              Its disks, as the ramdisk listed them <Time at={ramdisk.at} />
            </>
          }
          columns={["Device", "Size", "Model", "Serial"]}
        >
          {ramdisk.disks.map((d) => (
            <tr data-disk={d.device}>
              <td class="mono">{d.device}</td>
              <td>{bytes(d.sizeBytes)}</td>
              <td>{d.model ?? "–"}</td>
              <td class="mono">{d.serial ?? "–"}</td>
            </tr>
          ))}
        </DataTable>
      ) : (
        <p>No ramdisk has listed its disks: its pool's machines boot none (an agentless pool), or commissioning has not reached it yet.</p>
      )}
    </Section>
  );
};

const Workflow: FC<{ workflow: WorkflowView }> = ({ workflow: wf }) => (
  <>
    <p>
      <span class="mono">{wf.id}</span>: <State state={wf.state} /> started <Time at={wf.createdAt} /> by{" "}
      <span class="mono">{wf.createdBy}</span>
      {wf.finishedAt && (
        <>
          , ended <Time at={wf.finishedAt} />
        </>
      )}
    </p>
    {wf.error !== null && wf.error !== undefined && (
      <p>
        Error: <Json value={wf.error} />
      </p>
    )}
    <DataTable label="Workflow steps" caption="Its steps, in order" columns={["#", "Step", "State", "Attempts", "Took", "Error"]}>
      {wf.steps.map((s) => {
        const last = s.attempts[s.attempts.length - 1];
        return (
          <tr data-step={s.name}>
            <td>{s.position + 1}</td>
            <td>
              {s.name}
              {s.name !== s.step && <span class="mono"> ({s.step})</span>}
            </td>
            <td>{last ? <State state={last.state} /> : "pending"}</td>
            <td>{s.attempts.length}</td>
            <td>{last ? seconds(last.startedAt, last.finishedAt) : "–"}</td>
            <td>
              <Json value={last?.error} />
            </td>
          </tr>
        );
      })}
    </DataTable>
  </>
);

// ------------------------------------------------------------------ the audit log

export interface AuditFilters {
  actor?: string;
  action?: string;
  resource?: string;
}

export const AuditFilterForm: FC<{ filters: AuditFilters }> = ({ filters }) => (
  <FilterForm action="/console/audit" label="Filter the audit log">
    <div>
      <label for="actor">Actor</label>
      <input id="actor" name="actor" value={filters.actor ?? ""} placeholder="apikey:0123…" />
    </div>
    <div>
      <label for="action">Action</label>
      <input id="action" name="action" value={filters.action ?? ""} placeholder="metal.*" />
    </div>
    <div>
      <label for="resource">Resource</label>
      <input id="resource" name="resource" value={filters.resource ?? ""} placeholder="metal/nodes/*" />
    </div>
  </FilterForm>
);

export const Audit: FC<{ entries: AuditEntryView[]; next: string | null; filters: AuditFilters }> = ({ entries, next, filters }) => {
  const query = (after: string) => {
    const q = new URLSearchParams(Object.entries(filters).filter((e): e is [string, string] => !!e[1]));
    q.set("after", after);
    return `/console/audit?${q}`;
  };
  if (entries.length === 0)
    return (
      <Empty>
        No audit rows match. Every mutating call (from the API, the CLI or this console) writes one; clear the filters to see all.
      </Empty>
    );
  return (
    <>
      <DataTable
        label="Audit entries"
        caption="Mutating calls, newest first"
        columns={["When", "Actor", "Action", "Resource", "Request id"]}
      >
        {entries.map((e) => (
          <tr data-action={e.action}>
            <td>
              <Time at={e.at} />
            </td>
            <td class="mono">{e.actor}</td>
            <td>{e.action}</td>
            <td class="mono">{e.resource}</td>
            <td class="mono">{e.requestId}</td>
          </tr>
        ))}
      </DataTable>
      {next && <MorePage href={query(next)}>Older entries</MorePage>}
    </>
  );
};

// ------------------------------------------------------------------ a tenant's instances

export interface InstanceView {
  id: string;
  tenant: string;
  pool: string;
  flavor: string;
  name: string;
  state: string;
  desired: string;
  addresses: string[];
  sshKeys: string[];
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
  lastError: unknown;
  reason: string | null;
  guest: { hostname?: string; hostKeys?: string[] } | null;
  createdAt: string;
}
export interface FlavorView {
  id: string;
  pool: string;
  name: string;
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
}
/** The console tail (vps.instances.console), or why there is none. */
export type ConsoleTail = { text: string | null; at: string | null; stale: boolean } | { problem: string };

const size = (i: { vcpus: number; memoryMiB: number; diskGiB: number }) => `${i.vcpus} vCPU, ${i.memoryMiB} MiB, ${i.diskGiB} GiB`;

export const Instances: FC<{ instances: InstanceView[]; next: string | null; operator: boolean; tenant?: string }> = ({
  instances,
  next,
  operator,
  tenant,
}) =>
  instances.length === 0 && tenant && operator ? (
    <Empty>
      Tenant {tenant} has no instances. <a href="/console/instances">See every tenant's</a>.
    </Empty>
  ) : instances.length === 0 ? (
    <Empty>
      <strong>No instances yet.</strong>{" "}
      {operator
        ? "A tenant creates its own here (or with the API); an operator creates one for a tenant with vps.instances.create."
        : "Create one below from a flavor of a pool offered to you; it shows up here."}
    </Empty>
  ) : (
    <>
      <DataTable
        label="Instances"
        caption={`${plural(instances.length, "instance")}, by id`}
        columns={["Instance", "Name", "State", operator && "Tenant", "Flavor", { label: "Addresses", wide: true }]}
      >
        {instances.map((i) => (
          <tr data-instance={i.id}>
            <th scope="row">
              <a href={instancePath(i.id)}>{i.id}</a>
            </th>
            <td>{i.name}</td>
            <td>
              <State state={i.state} />
            </td>
            {operator && <td>{i.tenant}</td>}
            <td>
              {i.flavor} ({i.pool})
            </td>
            <td class="mono wide">{i.addresses.join(", ") || "–"}</td>
          </tr>
        ))}
      </DataTable>
      {next && (
        <MorePage href={`/console/instances?${new URLSearchParams({ ...(tenant ? { tenant } : {}), after: next })}`}>
          More instances
        </MorePage>
      )}
    </>
  );

export const CreateInstance: FC<{ flavors: FlavorView[]; sshKeys: string[]; csrf: string }> = ({ flavors, sshKeys, csrf }) => (
  <Section id="create" title="Create an instance">
    {flavors.length === 0 ? (
      <p>No pool is offered to you yet: an operator offers one with a quota (vps.quotas.set).</p>
    ) : (
      <PostForm action="/console/instances" csrf={csrf}>
        <label for="name">Host name</label>
        <input id="name" name="name" required maxlength={63} />
        <label for="flavor">Flavor</label>
        <select id="flavor" name="flavor">
          {flavors.map((f) => (
            <option value={f.id}>{`${f.id} in ${f.pool}: ${size(f)}`}</option>
          ))}
        </select>
        <label for="ssh-keys">SSH keys</label>
        <select id="ssh-keys" name="sshKeys" multiple size={Math.min(4, Math.max(2, sshKeys.length))}>
          {sshKeys.map((k) => (
            <option value={k}>{k}</option>
          ))}
        </select>
        <label for="user-data">User data (the bytes the guest gets; a host pool needs it, a provider's pool composes its own)</label>
        <textarea id="user-data" name="userData"></textarea>
        <Submit id="create-instance">Create</Submit>
      </PostForm>
    )}
  </Section>
);

export const Instance: FC<{ instance: InstanceView; tail: ConsoleTail; csrf: string }> = ({ instance: i, tail, csrf }) => {
  const path = instancePath(i.id);
  const gone = i.desired === "deleted" || i.state === "deleted";
  const action = (name: string, label: string) => (
    <PostButton action={`${path}/${name}`} csrf={csrf} id={name} class="secondary">
      {label}
    </PostButton>
  );
  return (
    <>
      <Section id="fields" title="Instance">
        <dl class="fields">
          <dt>State</dt>
          <dd id="instance-state" data-state={i.state}>
            <State state={i.state} /> (wanted: {i.desired}){i.reason && <>, {i.reason}</>}
          </dd>
          <dt>Name</dt>
          <dd>{i.name}</dd>
          <dt>Flavor</dt>
          <dd>
            {i.flavor} in {i.pool}: {size(i)}
          </dd>
          <dt>Addresses</dt>
          <dd class="mono">{i.addresses.join(", ") || "none yet"}</dd>
          <dt>SSH keys</dt>
          <dd>{i.sshKeys.join(", ") || "–"}</dd>
          <dt>Created</dt>
          <dd>
            <Time at={i.createdAt} />
          </dd>
          <dt>Last error</dt>
          <dd>
            <Json value={i.lastError} />
          </dd>
        </dl>
      </Section>
      {!gone && (
        <Section id="actions" title="Actions">
          <div class="actions">
            {i.desired === "stopped" ? action("start", "Start") : action("stop", "Stop")}
            {i.desired === "running" && action("reboot", "Reboot")}
            <a id="delete" class="button danger" href={`${path}/delete`}>
              Delete…
            </a>
          </div>
        </Section>
      )}
      <Section id="host-keys" title="SSH host keys">
        {i.guest?.hostKeys?.length ? (
          <pre class="mono">{i.guest.hostKeys.join("\n")}</pre>
        ) : (
          <p>The guest has not reported its host keys yet (it does once it has booted).</p>
        )}
      </Section>
      <Section id="console" title="Console">
        {"problem" in tail ? (
          <p class="empty">{tail.problem}</p>
        ) : tail.text ? (
          <>
            <p>
              The last bytes of its serial console, <Time at={tail.at} />
              {tail.stale && " (the host did not answer now: its last answer)"}
            </p>
            <pre class="console" tabindex={0} role="region" aria-label="Console output">
              {tail.text}
            </pre>
          </>
        ) : (
          <p class="empty">Nothing on its console yet.</p>
        )}
      </Section>
    </>
  );
};

// ------------------------------------------------------------------ a machine's serial console

/** What a read of the console answered, or why there is none (the simulated site's BMCs have no console). */
export type SerialView = { text: string; ended: string | null; stale: boolean } | { problem: string };

export const SerialConsole: FC<{ node: string; view?: SerialView; csrf: string }> = ({ node, view, csrf }) => {
  const path = machinePath(node);
  return (
    <>
      {!view ? (
        <form class="panel" method="post" action={`${path}/console`}>
          <CsrfField csrf={csrf} />
          <p>Opening the console is recorded in the audit log; reading it is not. The page reads on every few seconds.</p>
          <button id="open-console" type="submit">
            Open the serial console
          </button>
        </form>
      ) : "problem" in view ? (
        <p class="empty" id="console-empty">
          No serial console: {view.problem}
        </p>
      ) : (
        <>
          <pre class="console" tabindex={0} role="region" aria-label={`Serial console of ${node}`}>
            {view.text || "(nothing yet)"}
          </pre>
          {view.ended && <p>The console's connection ended ({view.ended}); the next read reconnects.</p>}
          {view.stale && <p>The site agent did not answer in time; reading again.</p>}
        </>
      )}
      <p>
        <a href={path}>Back to machine {node}</a>
      </p>
    </>
  );
};

// ------------------------------------------------------------------ the fleet's filters

export interface FleetFilters {
  q?: string;
  state?: string;
  pool?: string;
  site?: string;
}

export const FleetFilterForm: FC<{ filters: FleetFilters; states: readonly string[] }> = ({ filters, states }) => (
  <FilterForm action="/console/fleet" label="Filter the fleet">
    <div>
      <label for="q">Machine id contains</label>
      <input id="q" name="q" type="search" value={filters.q ?? ""} />
    </div>
    <div>
      <label for="state">State</label>
      <select id="state" name="state">
        <option value="">any</option>
        {states.map((s) => (
          <option value={s} selected={s === filters.state}>
            {s}
          </option>
        ))}
      </select>
    </div>
    <div>
      <label for="pool">Pool</label>
      <input id="pool" name="pool" value={filters.pool ?? ""} />
    </div>
    <div>
      <label for="site">Site</label>
      <input id="site" name="site" value={filters.site ?? ""} />
    </div>
  </FilterForm>
);
