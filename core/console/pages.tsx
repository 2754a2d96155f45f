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
  state: string;
  position: number;
  error: unknown;
  createdBy: string;
  createdAt: string;
  finishedAt: string | null;
  steps: { position: number; name: string; step: string; attempts: AttemptView[] }[];
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
}

export const Layout: FC<PropsWithChildren<Frame & { live: Child }>> = ({ title, session, subjects, live, children }) => (
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
        {subjects && (
          <p id="live-status" role="status">
            Connecting for live updates…
          </p>
        )}
        {children}
        <div id="live" data-subjects={subjects}>
          {live}
        </div>
      </main>
    </body>
  </html>
);

// ------------------------------------------------------------------ small parts

const Time: FC<{ at: string | null }> = ({ at }) =>
  at ? <time datetime={at}>{at.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time> : <>–</>;

/** A table that may scroll sideways on a phone: a labelled region keyboard users can focus and scroll. */
const TableBox: FC<PropsWithChildren<{ label: string }>> = ({ label, children }) => (
  <div class="table" role="region" aria-label={label} tabindex={0}>
    {children}
  </div>
);

const State: FC<{ state: string }> = ({ state }) => <span class={`state state-${state}`}>{state}</span>;

/** A value the API answered as JSON (an error, event data), shown compactly. */
const Json: FC<{ value: unknown }> = ({ value }) =>
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
      Sign in with an API key. The key is exchanged for a session of 12 hours: it is not kept in this page, in the browser's storage or in
      the session cookie.
    </p>
    <form class="stack" method="post" action="/console/session">
      <label for="key">API key</label>
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

export const Fleet: FC<{ machines: MachineView[] }> = ({ machines }) => {
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
  const sorted = [...machines].sort((a, b) => urgency(a) - urgency(b) || a.id.localeCompare(b.id));
  return (
    <>
      <Counts label="By state" counts={tally(machines, (m) => (m.maintenance ? `${m.state} (maintenance)` : m.state))} />
      <Counts label="By pool" counts={tally(machines, (m) => m.pool)} />
      <Counts label="By site" counts={tally(machines, (m) => m.site)} />
      <h2>Machines</h2>
      <TableBox label="Machines">
        <table>
          <caption>
            {machines.length} machine{machines.length === 1 ? "" : "s"}: failed and in maintenance first
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
    </>
  );
};

// ------------------------------------------------------------------ a machine

export interface MachineActions {
  deploy: boolean;
  undeploy: boolean;
  maintenance: boolean;
}

export const Machine: FC<{
  machine: MachineView;
  workflow?: WorkflowView;
  history: EventView[];
  actions: MachineActions;
  profiles: { id: string; description?: string }[];
  csrf: string;
}> = ({ machine: m, workflow, history, actions, profiles, csrf }) => {
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

      {(actions.deploy || actions.undeploy || actions.maintenance) && (
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
            {!canDeploy && !canUndeploy && !actions.maintenance && <p>No action fits the machine's state now.</p>}
          </div>
        </section>
      )}

      <section aria-labelledby="workflow">
        <h2 id="workflow">{workflow ? `Workflow ${workflow.profile}` : "Workflow"}</h2>
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
    <div class="panel">
      <p>
        Undeploy <strong>{machine.id}</strong>? Its disks are wiped (an attested wipe) before it is ready again, and the system installed on
        it is gone. This cannot be undone.
      </p>
      <form class="inline" method="post" action={`${path}/undeploy`}>
        <input type="hidden" name="csrf" value={csrf} />
        <button id="confirm" type="submit" class="danger">
          Undeploy {machine.id}
        </button>
      </form>{" "}
      <a class="button secondary" href={path}>
        Cancel
      </a>
    </div>
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
