/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The console's pages, rendered on the server from what the API's methods answered (hono's JSX
// escapes every value). Each page has one #live region that the client script fetches again
// (?part=live) when an event for its subjects arrives; the rest (navigation, forms being typed
// into) stays put. No page carries a credential: only the session's CSRF token, in its forms.
import type { Child, FC, PropsWithChildren } from "hono/jsx";
import type { Principal } from "../iam.ts";

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
export interface AttemptView {
  attempt: number;
  state: string;
  error: unknown;
  polls: number;
  startedAt: string | null;
  finishedAt: string | null;
}
export interface WorkflowView {
  id: string;
  profile: string;
  version: string;
  target: string;
  state: string;
  position: number;
  error: unknown;
  createdBy: string;
  createdAt: string;
  finishedAt: string | null;
  steps: { position: number; name: string; step: string; attempts: AttemptView[] }[];
  /** Its batch of destructive commands under pki.approvers (docs/quorum.md); null when it needs no approval. */
  quorum?: { digest: string; kinds: string[]; threshold: number; approvals: string[]; approvedAt: string | null } | null;
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
            <form class="inline" method="post" action="/console/sign-out">
              <input type="hidden" name="csrf" value={session.csrf} />
              <button type="submit">Sign out</button>
            </form>
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

export const Time: FC<{ at: string | null }> = ({ at }) =>
  at ? <time datetime={at}>{at.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time> : <>–</>;

/** A table that may scroll sideways on a phone: a labelled region keyboard users can focus and scroll. */
export const TableBox: FC<PropsWithChildren<{ label: string }>> = ({ label, children }) => (
  <div class="table" role="region" aria-label={label} tabindex={0}>
    {children}
  </div>
);

export const State: FC<{ state: string }> = ({ state }) => <span class={`state state-${state}`}>{state}</span>;

/** A value the API answered as JSON (an error, event data), shown compactly. */
export const Json: FC<{ value: unknown }> = ({ value }) =>
  value === null || value === undefined ? <>–</> : <code>{typeof value === "string" ? value : JSON.stringify(value)}</code>;

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
      <div>
        <button type="submit">Sign in</button>
      </div>
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
      <div class="empty">
        <p>
          No machine matches these filters. <a href="/console/fleet">Clear them</a> to see the whole fleet.
        </p>
      </div>
    );
  if (machines.length === 0)
    return (
      <div class="empty">
        <p>
          <strong>No machines yet.</strong> Create a site and a pool, then enroll a machine by its BMC (<code>metal.sites.create</code>,{" "}
          <code>metal.pools.create</code>, <code>metal.enroll</code>; docs/metal.md walks through it). It commissions by itself and shows up
          here, live. To see a simulated site instead, run <code>npm run dev</code>.
        </p>
      </div>
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
      <TableBox label="Machines">
        <table>
          <caption>
            {machines.length} machine{machines.length === 1 ? "" : "s"}
            {pages > 1 && `, page ${page + 1} of ${pages}`}: failed and in maintenance first
          </caption>
          <thead>
            <tr>
              <th scope="col">Machine</th>
              <th scope="col">State</th>
              <th scope="col">Pool</th>
              <th scope="col">Site</th>
              <th scope="col">Role</th>
              <th scope="col" class="wide">
                Workflow
              </th>
            </tr>
          </thead>
          <tbody>
            {sorted.map((m) => (
              <tr data-machine={m.id}>
                <th scope="row">
                  <a href={`/console/machines/${encodeURIComponent(m.id)}`}>{m.id}</a>
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
          </tbody>
        </table>
      </TableBox>
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
  const path = `/console/machines/${encodeURIComponent(m.id)}`;
  const canDeploy = actions.deploy && m.state === "ready" && !m.maintenance;
  const canUndeploy = actions.undeploy && m.state === "deployed";
  return (
    <>
      <section aria-labelledby="fields">
        <h2 id="fields">Machine</h2>
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
      </section>

      {Object.values(actions).some(Boolean) && (
        <section aria-labelledby="actions">
          <h2 id="actions">Actions</h2>
          <div class="actions">
            {canDeploy && (
              <form class="stack panel" method="post" action={`${path}/deploy`}>
                <input type="hidden" name="csrf" value={csrf} />
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
                <div>
                  <button id="deploy" type="submit">
                    Deploy
                  </button>
                </div>
              </form>
            )}
            {canUndeploy && (
              <a id="undeploy" class="button danger" href={`${path}/undeploy`}>
                Undeploy…
              </a>
            )}
            {actions.maintenance && !m.maintenance && m.state !== "failed" && !/ing$/.test(m.state) && m.state !== "retired" && (
              <form class="stack panel" method="post" action={`${path}/maintenance`}>
                <input type="hidden" name="csrf" value={csrf} />
                <input type="hidden" name="on" value="true" />
                <label for="reason">Reason for maintenance</label>
                <input id="reason" name="reason" required maxlength={500} />
                <div>
                  <button id="maintenance-on" type="submit" class="secondary">
                    Put in maintenance
                  </button>
                </div>
              </form>
            )}
            {actions.maintenance && m.maintenance && m.state !== "failed" && (
              <form class="inline" method="post" action={`${path}/maintenance`}>
                <input type="hidden" name="csrf" value={csrf} />
                <input type="hidden" name="on" value="false" />
                <button id="maintenance-off" type="submit" class="secondary">
                  Take out of maintenance
                </button>
              </form>
            )}
            {actions.rescue && m.state === "deployed" && (
              <a id="rescue" class="button secondary" href={`${path}/rescue`}>
                Rescue…
              </a>
            )}
            {actions.rescue && m.state === "rescue" && (
              <form class="inline" method="post" action={`${path}/unrescue`}>
                <input type="hidden" name="csrf" value={csrf} />
                <button id="unrescue" type="submit" class="secondary">
                  Boot from its disk (unrescue)
                </button>
              </form>
            )}
            {actions.recommission && m.state === "failed" && (
              <form class="inline" method="post" action={`${path}/recommission`}>
                <input type="hidden" name="csrf" value={csrf} />
                <button id="recommission" type="submit" class="secondary">
                  Recommission
                </button>
              </form>
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
        </section>
      )}

      <Hardware inventory={m.inventory} />

      <section aria-labelledby="workflow">
        <h2 id="workflow">{workflow ? `Workflow ${workflow.profile}` : "Workflow"}</h2>
        {notice}
        {workflow ? <Workflow workflow={workflow} /> : <p>No workflow has run on this machine yet.</p>}
      </section>

      <section aria-labelledby="history">
        <h2 id="history">Lifecycle history</h2>
        {history.length === 0 ? (
          <p>No events yet.</p>
        ) : (
          <TableBox label="Lifecycle history">
            <table>
              <caption>Events of metal/nodes/{m.id}, newest first</caption>
              <thead>
                <tr>
                  <th scope="col">When</th>
                  <th scope="col">Event</th>
                  <th scope="col">By</th>
                  <th scope="col">Data</th>
                </tr>
              </thead>
              <tbody>
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
              </tbody>
            </table>
          </TableBox>
        )}
      </section>
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
      <section aria-labelledby="hardware">
        <h2 id="hardware">Hardware</h2>
        <p class="empty" id="hardware-empty">
          Not inspected yet: inspection runs during commissioning.
        </p>
      </section>
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
    <section aria-labelledby="hardware">
      <h2 id="hardware">Hardware</h2>
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
              {bmc.storage.drives} drive{bmc.storage.drives === 1 ? "" : "s"}
              {bmc.storage.volumes.length > 0 &&
                `; volumes ${bmc.storage.volumes.map((v) => (v.level ? `${v.id} (${v.level})` : v.id)).join(", ")}`}
            </dd>
          </>
        )}
      </dl>
      {ramdisk ? (
        <TableBox label="Disks">
          <table>
            <caption>
              Its disks, as the ramdisk listed them <Time at={ramdisk.at} />
            </caption>
            <thead>
              <tr>
                <th scope="col">Device</th>
                <th scope="col">Size</th>
                <th scope="col">Model</th>
                <th scope="col">Serial</th>
              </tr>
            </thead>
            <tbody>
              {ramdisk.disks.map((d) => (
                <tr data-disk={d.device}>
                  <td class="mono">{d.device}</td>
                  <td>{bytes(d.sizeBytes)}</td>
                  <td>{d.model ?? "–"}</td>
                  <td class="mono">{d.serial ?? "–"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </TableBox>
      ) : (
        <p>No ramdisk has listed its disks: its pool's machines boot none (an agentless pool), or commissioning has not reached it yet.</p>
      )}
    </section>
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
    <TableBox label="Workflow steps">
      <table>
        <caption>Its steps, in order</caption>
        <thead>
          <tr>
            <th scope="col">#</th>
            <th scope="col">Step</th>
            <th scope="col">State</th>
            <th scope="col">Attempts</th>
            <th scope="col">Took</th>
            <th scope="col">Error</th>
          </tr>
        </thead>
        <tbody>
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
        </tbody>
      </table>
    </TableBox>
  </>
);

export const Confirm: FC<{ machine: MachineView; csrf: string }> = ({ machine, csrf }) => {
  const path = `/console/machines/${encodeURIComponent(machine.id)}`;
  return (
    <ConfirmAction
      text={`Undeploy ${machine.id}? Its disks are wiped (an attested wipe) before it is ready again, and the system installed on it is gone. This cannot be undone.`}
      action={`${path}/undeploy`}
      label={`Undeploy ${machine.id}`}
      back={path}
      csrf={csrf}
    />
  );
};

// ------------------------------------------------------------------ the audit log

export interface AuditFilters {
  actor?: string;
  action?: string;
  resource?: string;
}

export const AuditFilterForm: FC<{ filters: AuditFilters }> = ({ filters }) => (
  <form class="filters panel" method="get" action="/console/audit" role="search" aria-label="Filter the audit log">
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
    <div>
      <button type="submit">Filter</button> <a href="/console/audit">Clear</a>
    </div>
  </form>
);

export const Audit: FC<{ entries: AuditEntryView[]; next: string | null; filters: AuditFilters }> = ({ entries, next, filters }) => {
  const query = (after: string) => {
    const q = new URLSearchParams(Object.entries(filters).filter((e): e is [string, string] => !!e[1]));
    q.set("after", after);
    return `/console/audit?${q}`;
  };
  if (entries.length === 0)
    return (
      <div class="empty">
        <p>No audit rows match. Every mutating call (from the API, the CLI or this console) writes one; clear the filters to see all.</p>
      </div>
    );
  return (
    <>
      <TableBox label="Audit entries">
        <table>
          <caption>Mutating calls, newest first</caption>
          <thead>
            <tr>
              <th scope="col">When</th>
              <th scope="col">Actor</th>
              <th scope="col">Action</th>
              <th scope="col">Resource</th>
              <th scope="col">Request id</th>
            </tr>
          </thead>
          <tbody>
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
          </tbody>
        </table>
      </TableBox>
      {next && (
        <p>
          <a id="next-page" href={query(next)}>
            Older entries
          </a>
        </p>
      )}
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

const instancePath = (id: string) => `/console/instances/${encodeURIComponent(id)}`;
const size = (i: { vcpus: number; memoryMiB: number; diskGiB: number }) => `${i.vcpus} vCPU, ${i.memoryMiB} MiB, ${i.diskGiB} GiB`;

export const Instances: FC<{ instances: InstanceView[]; next: string | null; operator: boolean; tenant?: string }> = ({
  instances,
  next,
  operator,
  tenant,
}) =>
  instances.length === 0 && tenant && operator ? (
    <div class="empty">
      <p>
        Tenant {tenant} has no instances. <a href="/console/instances">See every tenant's</a>.
      </p>
    </div>
  ) : instances.length === 0 ? (
    <div class="empty">
      <p>
        <strong>No instances yet.</strong>{" "}
        {operator
          ? "A tenant creates its own here (or with the API); an operator creates one for a tenant with vps.instances.create."
          : "Create one below from a flavor of a pool offered to you; it shows up here."}
      </p>
    </div>
  ) : (
    <>
      <TableBox label="Instances">
        <table>
          <caption>
            {instances.length} instance{instances.length === 1 ? "" : "s"}, by id
          </caption>
          <thead>
            <tr>
              <th scope="col">Instance</th>
              <th scope="col">Name</th>
              <th scope="col">State</th>
              {operator && <th scope="col">Tenant</th>}
              <th scope="col">Flavor</th>
              <th scope="col" class="wide">
                Addresses
              </th>
            </tr>
          </thead>
          <tbody>
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
          </tbody>
        </table>
      </TableBox>
      {next && (
        <p>
          <a id="next-page" href={`/console/instances?${new URLSearchParams({ ...(tenant ? { tenant } : {}), after: next })}`}>
            More instances
          </a>
        </p>
      )}
    </>
  );

export const CreateInstance: FC<{ flavors: FlavorView[]; sshKeys: string[]; csrf: string }> = ({ flavors, sshKeys, csrf }) => (
  <section aria-labelledby="create">
    <h2 id="create">Create an instance</h2>
    {flavors.length === 0 ? (
      <p>No pool is offered to you yet: an operator offers one with a quota (vps.quotas.set).</p>
    ) : (
      <form class="stack panel" method="post" action="/console/instances">
        <input type="hidden" name="csrf" value={csrf} />
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
        <div>
          <button id="create-instance" type="submit">
            Create
          </button>
        </div>
      </form>
    )}
  </section>
);

export const Instance: FC<{ instance: InstanceView; tail: ConsoleTail; csrf: string }> = ({ instance: i, tail, csrf }) => {
  const path = instancePath(i.id);
  const gone = i.desired === "deleted" || i.state === "deleted";
  const action = (name: string, label: string) => (
    <form class="inline" method="post" action={`${path}/${name}`}>
      <input type="hidden" name="csrf" value={csrf} />
      <button id={name} type="submit" class="secondary">
        {label}
      </button>
    </form>
  );
  return (
    <>
      <section aria-labelledby="fields">
        <h2 id="fields">Instance</h2>
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
      </section>
      {!gone && (
        <section aria-labelledby="actions">
          <h2 id="actions">Actions</h2>
          <div class="actions">
            {i.desired === "stopped" ? action("start", "Start") : action("stop", "Stop")}
            {i.desired === "running" && action("reboot", "Reboot")}
            <a id="delete" class="button danger" href={`${path}/delete`}>
              Delete…
            </a>
          </div>
        </section>
      )}
      <section aria-labelledby="host-keys">
        <h2 id="host-keys">SSH host keys</h2>
        {i.guest?.hostKeys?.length ? (
          <pre class="mono">{i.guest.hostKeys.join("\n")}</pre>
        ) : (
          <p>The guest has not reported its host keys yet (it does once it has booted).</p>
        )}
      </section>
      <section aria-labelledby="console">
        <h2 id="console">Console</h2>
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
      </section>
    </>
  );
};

/** "Are you sure?" before a destructive action: only its button posts. */
export const ConfirmAction: FC<{ text: Child; action: string; label: string; back: string; csrf: string }> = ({
  text,
  action,
  label,
  back,
  csrf,
}) => (
  <div class="panel">
    <p>{text}</p>
    <form class="inline" method="post" action={action}>
      <input type="hidden" name="csrf" value={csrf} />
      <button id="confirm" type="submit" class="danger">
        {label}
      </button>
    </form>{" "}
    <a class="button secondary" href={back}>
      Cancel
    </a>
  </div>
);

// ------------------------------------------------------------------ a machine's serial console

/** What a read of the console answered, or why there is none (the simulated site's BMCs have no console). */
export type SerialView = { text: string; ended: string | null; stale: boolean } | { problem: string };

export const SerialConsole: FC<{ node: string; view?: SerialView; csrf: string }> = ({ node, view, csrf }) => {
  const path = `/console/machines/${encodeURIComponent(node)}`;
  return (
    <>
      {!view ? (
        <form class="panel" method="post" action={`${path}/console`}>
          <input type="hidden" name="csrf" value={csrf} />
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
  <form class="filters panel" method="get" action="/console/fleet" role="search" aria-label="Filter the fleet">
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
    <div>
      <button type="submit">Filter</button> <a href="/console/fleet">Clear</a>
    </div>
  </form>
);
