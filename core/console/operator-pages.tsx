/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The operator's pages beside the fleet (docs/console.md): sites, pools and join tokens; hosts with
// their capacity and what is placed on them; VPS tenants with their members and quotas; sinks with
// their lag and dead letters. Rendered on the server from what the API's methods answered, in the
// style of pages.tsx. A join token is shown once, on the page answering the POST that minted it
// (TokenCreated): no other page has it, and the API does not return it again.
import type { FC } from "hono/jsx";
import { DataTable, Empty, FilterForm, Json, MorePage, plural, PostButton, PostForm, Section, State, Submit, Time } from "./components.tsx";
import { instancePath } from "./pages.tsx";

// ------------------------------------------------------------------ what the methods answer

export interface SiteView {
  id: string;
  description: string | null;
  pools: number;
  machines: number;
  agent: string | null;
  createdAt: string;
}
export interface PoolView {
  id: string;
  site: string;
  agent: string;
  policy: Record<string, unknown>;
  machines: number;
  createdAt: string;
}
export interface JoinTokenView {
  id: string;
  attestor: string;
  role: string;
  labels: Record<string, string>;
  node: string | null;
  state: string;
  createdBy: string;
  createdAt: string;
  expiresAt: string;
  usedAt: string | null;
  usedBy: string | null;
  revokedAt: string | null;
}
export interface MintedTokenView {
  id: string;
  token: string;
  expiresAt: string;
}
interface Amounts {
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
}
export interface HostView {
  node: string;
  hostname: string | null;
  state: string;
  schedulable: boolean;
  cordoned: boolean;
  maintenance: boolean;
  reason: string | null;
  capacity: Amounts | null;
  used: Amounts;
  free: Amounts | null;
  devices: { id: string; kind: string; model?: string; used: boolean }[];
  reservations: number;
  labels: Record<string, string>;
}
export interface ReservationView {
  id: string;
  owner: string;
  state: string;
  pool: string | null;
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
  devices: string[];
  antiAffinityGroup: string | null;
  expiresAt: string | null;
  createdAt: string;
}
export interface TenantView {
  id: string;
  name: string;
  members: string[];
  instances: number;
  createdAt: string;
}
interface Sizes {
  instances: number;
  vcpus: number;
  memoryMiB: number;
  diskGiB: number;
}
export interface QuotaView {
  tenant: string;
  pool: string;
  quota: Sizes;
  usage: Sizes;
}
export interface SinkView {
  id: string;
  version: string;
  source: string;
  cursor: string;
  lag: { behind: number; oldestAt: string | null; oldestAgeSeconds: number | null };
  attempts: number;
  nextAttemptAt: string | null;
  lastError: string | null;
  lastDeliveredAt: string | null;
  deadLetters: number;
}
export interface DeadLetterView {
  id: string;
  sink: string;
  source: string;
  recordId: string;
  position: string;
  attempts: number;
  lastError: string;
  createdAt: string;
  replayedAt: string | null;
  replayedBy: string | null;
}

// ------------------------------------------------------------------ small parts

/** A token as the lists show it: its id inside the token's shape, never the secret part. */
export const tokenPrefix = (id: string) => `bcj_${id}_…`;
const labelsText = (labels: Record<string, string>) =>
  Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(", ") || "–";
const fleetHref = (filter: "site" | "pool", id: string) => `/console/fleet?${new URLSearchParams({ [filter]: id })}`;
const ago = (seconds: number | null) =>
  seconds === null
    ? "caught up"
    : seconds < 120
      ? `${seconds} s`
      : seconds < 7200
        ? `${Math.round(seconds / 60)} min`
        : `${Math.round(seconds / 3600)} h`;
/** "used / total" of a resource, or what is used when the host reported nothing yet. */
const usedOf = (used: number, total: number | undefined, unit = "") =>
  total === undefined ? `${used}${unit} / ?` : `${used} / ${total}${unit}`;

export const sitesPath = "/console/sites";
export const hostPath = (node: string) => `/console/hosts/${encodeURIComponent(node)}`;
export const tenantPath = (id: string) => `/console/tenants/${encodeURIComponent(id)}`;
export const sinkPath = (id: string) => `/console/sinks/${encodeURIComponent(id)}`;

// ------------------------------------------------------------------ sites, pools and join tokens

export const TOKEN_STATES = ["active", "used", "expired", "revoked"] as const;

export const Sites: FC<{
  sites?: SiteView[];
  pools?: PoolView[];
  tokens: JoinTokenView[];
  next: string | null;
  state?: string;
  revoke: boolean;
}> = ({ sites, pools, tokens, next, state, revoke }) => (
  <>
    <Section id="sites" title="Sites">
      {!sites ? (
        <p>This deployment has no metal module: it has no sites or pools. Join tokens (below) still join hosts and other agents.</p>
      ) : sites.length === 0 ? (
        <Empty>
          <strong>No sites yet.</strong> Create one with <code>metal.sites.create</code> (or <code>better-compute metal sites create</code>
          ), then mint its site token below and start its site agent with it; docs/metal.md walks through it.
        </Empty>
      ) : (
        <DataTable
          label="Sites"
          caption={`${plural(sites.length, "site")}, by id`}
          columns={["Site", "Site agent", "Pools", "Machines", { label: "Description", wide: true }, { label: "Created", wide: true }]}
        >
          {sites.map((s) => (
            <tr data-site={s.id}>
              <th scope="row">{s.id}</th>
              <td class="mono">{s.agent ?? "none: mint a site token below"}</td>
              <td>{s.pools}</td>
              <td>
                <a href={fleetHref("site", s.id)} aria-label={`${plural(s.machines, "machine")} in site ${s.id}`}>
                  {s.machines}
                </a>
              </td>
              <td class="wide">{s.description ?? "–"}</td>
              <td class="wide">
                <Time at={s.createdAt} />
              </td>
            </tr>
          ))}
        </DataTable>
      )}
    </Section>

    {pools && (
      <Section id="pools" title="Pools">
        {pools.length === 0 ? (
          <Empty>
            <strong>No pools yet.</strong> A pool groups a site's machines under a hardware profile: create one with{" "}
            <code>metal.pools.create</code> (docs/metal.md), then enroll machines into it.
          </Empty>
        ) : (
          <DataTable
            label="Pools"
            caption={`${plural(pools.length, "pool")}, by id`}
            columns={["Pool", "Site", "Hardware profile", "Agent", "Machines"]}
          >
            {pools.map((p) => (
              <tr data-pool={p.id}>
                <th scope="row">{p.id}</th>
                <td>{p.site}</td>
                <td>{String(p.policy.hardwareProfile ?? "–")}</td>
                <td>{p.agent}</td>
                <td>
                  <a href={fleetHref("pool", p.id)} aria-label={`${plural(p.machines, "machine")} in pool ${p.id}`}>
                    {p.machines}
                  </a>
                </td>
              </tr>
            ))}
          </DataTable>
        )}
      </Section>
    )}

    <Section id="tokens" title="Join tokens">
      <FilterForm action={sitesPath} label="Filter the join tokens">
        <div>
          <label for="token-state">State</label>
          <select id="token-state" name="state">
            <option value="">any</option>
            {TOKEN_STATES.map((s) => (
              <option value={s} selected={s === state}>
                {s}
              </option>
            ))}
          </select>
        </div>
      </FilterForm>
      {tokens.length === 0 ? (
        <Empty>
          {state
            ? `No ${state} join token. `
            : "No join tokens yet. An agent (a site agent, a host's bcd) joins with a single-use token: create one below. "}
          A new token is shown once, on the page that answers its creation; this list shows only its id, state and expiry.
        </Empty>
      ) : (
        <DataTable
          label="Join tokens"
          caption={`${plural(tokens.length, "join token")}, newest first (never the token itself)`}
          columns={[
            "Token",
            "Role",
            "State",
            "Expires",
            { label: "Labels", wide: true },
            { label: "Created by", wide: true },
            "Used by",
            revoke && "Action",
          ]}
        >
          {tokens.map((t) => (
            <tr data-token={t.id}>
              <th scope="row" class="mono">
                {tokenPrefix(t.id)}
              </th>
              <td>
                {t.role}
                {t.attestor !== "join-token" && <span class="mono"> ({t.attestor})</span>}
              </td>
              <td>
                <State state={t.state} />
              </td>
              <td>
                <Time at={t.expiresAt} />
              </td>
              <td class="mono wide">{labelsText(t.labels)}</td>
              <td class="wide">
                <span class="mono">{t.createdBy}</span>, <Time at={t.createdAt} />
              </td>
              <td class="mono">{t.usedBy ?? "–"}</td>
              {revoke && (
                <td>
                  {t.state === "active" || t.state === "expired" ? (
                    <a href={`${sitesPath}/tokens/${encodeURIComponent(t.id)}/revoke`} aria-label={`Revoke ${tokenPrefix(t.id)}`}>
                      Revoke…
                    </a>
                  ) : (
                    "–"
                  )}
                </td>
              )}
            </tr>
          ))}
        </DataTable>
      )}
      {next && <MorePage href={`${sitesPath}?${new URLSearchParams({ ...(state ? { state } : {}), after: next })}`}>Older tokens</MorePage>}
    </Section>
  </>
);

export const CreateTokens: FC<{ sites?: SiteView[]; site: boolean; join: boolean; roles: readonly string[]; csrf: string }> = ({
  sites,
  site,
  join,
  roles,
  csrf,
}) =>
  site || join ? (
    <Section id="create-token" title="Create a join token">
      <p>A token is single use and expires (10 minutes unless you say otherwise, at most 7 days). It is shown once, on the next page.</p>
      <div class="actions">
        {site && sites && (
          <PostForm action={`${sitesPath}/site-token`} csrf={csrf} aria-labelledby="site-token">
            <h3 id="site-token">For a site agent</h3>
            {sites.length === 0 ? (
              <p>No site to mint a token for: create a site first.</p>
            ) : (
              <>
                <label for="token-site">Site</label>
                <select id="token-site" name="site">
                  {sites.map((s) => (
                    <option value={s.id}>{s.agent ? `${s.id} (has agent ${s.agent})` : s.id}</option>
                  ))}
                </select>
                <label for="site-ttl">Expires after (seconds; empty: 600)</label>
                <input id="site-ttl" name="ttlSeconds" type="number" min={1} max={604800} inputmode="numeric" />
                <Submit id="create-site-token">Create site token</Submit>
              </>
            )}
          </PostForm>
        )}
        {join && (
          <PostForm action={`${sitesPath}/join-token`} csrf={csrf} aria-labelledby="join-token">
            <h3 id="join-token">For an agent of a role</h3>
            <label for="token-role">Role</label>
            <select id="token-role" name="role">
              {roles.map((r) => (
                <option value={r}>{r}</option>
              ))}
            </select>
            <label for="token-labels">Labels (one key=value a line; a host pool selects its hosts by them)</label>
            <textarea id="token-labels" name="labels" placeholder="bc.dev/pool=vms"></textarea>
            <label for="join-ttl">Expires after (seconds; empty: 600)</label>
            <input id="join-ttl" name="ttlSeconds" type="number" min={1} max={604800} inputmode="numeric" />
            <Submit id="create-join-token">Create join token</Submit>
          </PostForm>
        )}
      </div>
    </Section>
  ) : null;

/** The one page that shows a token: the answer to the POST that minted it. */
export const TokenCreated: FC<{ minted: MintedTokenView; role: string; site?: string; labels: Record<string, string> }> = ({
  minted,
  role,
  site,
  labels,
}) => (
  <>
    <div class="panel">
      <p>
        <strong>Copy the token now: it is shown this once.</strong> The API keeps only its digest; this page is not cached, and no other
        page or list shows it again. Lost, it cannot be read back: revoke it and create another.
      </p>
      <label for="new-token">Join token {tokenPrefix(minted.id)}</label>
      <input id="new-token" class="mono" readonly value={minted.token} autocomplete="off" spellcheck={false} />
    </div>
    <dl class="fields">
      <dt>Id</dt>
      <dd class="mono">{minted.id}</dd>
      <dt>Role</dt>
      <dd>{site ? `site (site ${site})` : role}</dd>
      <dt>Labels</dt>
      <dd class="mono">{labelsText(labels)}</dd>
      <dt>Expires</dt>
      <dd>
        <Time at={minted.expiresAt} /> (single use)
      </dd>
    </dl>
    <p>
      On the machine, write it to <code>/etc/bcd/join-token</code> (mode 600) and start bcd with <code>--role {role}</code>{" "}
      (docs/install.md); the agent presents it once to join.
    </p>
    <p>
      <a id="back-to-sites" href={sitesPath}>
        Back to sites and join tokens
      </a>
    </p>
  </>
);

// ------------------------------------------------------------------ hosts

const schedulability = (h: HostView) =>
  h.maintenance
    ? `in maintenance${h.reason ? `: ${h.reason}` : ""}`
    : h.cordoned
      ? `cordoned${h.reason ? `: ${h.reason}` : ""}`
      : h.schedulable
        ? "yes"
        : `no: ${h.state}`;

export const Hosts: FC<{ hosts: HostView[] }> = ({ hosts }) =>
  hosts.length === 0 ? (
    <Empty>
      <strong>No hosts yet.</strong> A host is a machine whose agent (bcd) joined with role <code>node</code> and reported its resources:
      create a node join token on <a href={sitesPath}>Sites and tokens</a>, install bcd with it (docs/install.md), and it shows up here. VPS
      host pools place instances on hosts whose labels they select (docs/capacity.md, docs/vms-walkthrough.md).
    </Empty>
  ) : (
    <DataTable
      label="Hosts"
      caption={`${plural(hosts.length, "host")}: used / total of what each reported (without overcommit)`}
      columns={["Host", "State", "Schedulable", "vCPUs", "Memory", "Disk", { label: "Devices", wide: true }, "Placed"]}
    >
      {hosts.map((h) => (
        <tr data-host={h.node}>
          <th scope="row">
            <a href={hostPath(h.node)}>{h.node}</a>
            {h.hostname && <span class="mono"> ({h.hostname})</span>}
          </th>
          <td>
            <State state={h.state} />
          </td>
          <td>{schedulability(h)}</td>
          <td>{usedOf(h.used.vcpus, h.capacity?.vcpus)}</td>
          <td>{usedOf(h.used.memoryMiB, h.capacity?.memoryMiB, " MiB")}</td>
          <td>{usedOf(h.used.diskGiB, h.capacity?.diskGiB, " GiB")}</td>
          <td class="wide">{h.devices.length ? `${h.devices.filter((d) => d.used).length} / ${h.devices.length}` : "–"}</td>
          <td>{plural(h.reservations, "reservation")}</td>
        </tr>
      ))}
    </DataTable>
  );

/** A reservation's owner, linked when it is a VPS instance. */
const Owner: FC<{ owner: string }> = ({ owner }) => {
  const instance = /^vps\/instances\/(.+)$/.exec(owner)?.[1];
  return instance ? (
    <a class="mono" href={instancePath(instance)}>
      {owner}
    </a>
  ) : (
    <span class="mono">{owner}</span>
  );
};

export const Host: FC<{ host: HostView & { reservationList: ReservationView[] } }> = ({ host: h }) => (
  <>
    <Section id="fields" title="Host">
      <dl class="fields">
        <dt>State</dt>
        <dd id="host-state" data-state={h.state}>
          <State state={h.state} />
        </dd>
        <dt>Schedulable</dt>
        <dd>{schedulability(h)}</dd>
        <dt>Hostname</dt>
        <dd class="mono">{h.hostname ?? "–"}</dd>
        <dt>Labels</dt>
        <dd class="mono">{labelsText(h.labels)}</dd>
      </dl>
    </Section>
    <Section id="capacity" title="Capacity">
      {h.capacity ? (
        <DataTable
          label="Capacity"
          caption="What its agent reported, what is placed on it and what is left (without a pool's overcommit)"
          columns={["Resource", "Total", "Used", "Free"]}
        >
          {(
            [
              ["vCPUs", "vcpus", ""],
              ["Memory", "memoryMiB", " MiB"],
              ["Disk", "diskGiB", " GiB"],
            ] as const
          ).map(([label, key, unit]) => (
            <tr>
              <th scope="row">{label}</th>
              <td>{`${h.capacity![key]}${unit}`}</td>
              <td>{`${h.used[key]}${unit}`}</td>
              <td>{h.free ? `${h.free[key]}${unit}` : "–"}</td>
            </tr>
          ))}
        </DataTable>
      ) : (
        <p>Its agent has not reported its resources yet: nothing is placed on it until it does.</p>
      )}
      {h.devices.length > 0 && (
        <DataTable label="Devices" caption="Its devices" columns={["Device", "Kind", "Model", "Used"]}>
          {h.devices.map((d) => (
            <tr>
              <th scope="row" class="mono">
                {d.id}
              </th>
              <td>{d.kind}</td>
              <td>{d.model ?? "–"}</td>
              <td>{d.used ? "yes" : "no"}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </Section>
    <Section id="placed" title="What is placed on it">
      {h.reservationList.length === 0 ? (
        <p class="empty">
          Nothing is placed on this host. A VPS host pool whose labels select it places instances here (docs/capacity.md); a hold
          (capacity.holds.create) books room ahead of one.
        </p>
      ) : (
        <DataTable
          label="Reservations and holds"
          caption={`${plural(h.reservationList.length, "reservation")} and holds, oldest first`}
          columns={["Owner", "State", "Pool", "Size", { label: "Devices", wide: true }, "Hold expires", { label: "Id", wide: true }]}
        >
          {h.reservationList.map((r) => (
            <tr data-reservation={r.id}>
              <th scope="row">
                <Owner owner={r.owner} />
              </th>
              <td>
                <State state={r.state} />
              </td>
              <td>{r.pool ?? "–"}</td>
              <td>{`${r.vcpus} vCPU, ${r.memoryMiB} MiB, ${r.diskGiB} GiB`}</td>
              <td class="mono wide">{r.devices.join(", ") || "–"}</td>
              <td>{r.state === "held" ? <Time at={r.expiresAt} /> : "–"}</td>
              <td class="mono wide">{r.id}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </Section>
    <p>
      <a href="/console/hosts">Back to the hosts</a>
    </p>
  </>
);

// ------------------------------------------------------------------ VPS tenants and quotas

const usage = (used: number, quota: number, unit = "") => `${used} / ${quota}${unit}`;
const instancesOf = (tenant: string) => `/console/instances?${new URLSearchParams({ tenant })}`;

export const Tenants: FC<{ tenants: TenantView[]; quotas: QuotaView[] }> = ({ tenants, quotas }) =>
  tenants.length === 0 ? (
    <Empty>
      <strong>No tenants yet.</strong> Create one with <code>vps.tenants.create</code>, offer it a pool with a quota (
      <code>vps.quotas.set</code>, or on its page here) and add an API key of role <code>vps-tenant</code> as its member (
      <code>vps.tenants.addMember</code>); docs/vps.md walks through it.
    </Empty>
  ) : (
    <DataTable
      label="Tenants"
      caption={`${plural(tenants.length, "tenant")}, by id; quotas as used / allowed instances per pool`}
      columns={["Tenant", "Name", "Members", "Instances", "Quotas"]}
    >
      {tenants.map((t) => {
        const own = quotas.filter((q) => q.tenant === t.id);
        return (
          <tr data-tenant={t.id}>
            <th scope="row">
              <a href={tenantPath(t.id)}>{t.id}</a>
            </th>
            <td>{t.name}</td>
            <td>{t.members.length}</td>
            <td>
              <a href={instancesOf(t.id)} aria-label={`${plural(t.instances, "instance")} of tenant ${t.id}`}>
                {t.instances}
              </a>
            </td>
            <td>
              {own.length === 0
                ? "none: no pool offered"
                : own.map((q) => `${q.pool}: ${usage(q.usage.instances, q.quota.instances)}`).join(", ")}
            </td>
          </tr>
        );
      })}
    </DataTable>
  );

export const Tenant: FC<{ tenant: TenantView; quotas: QuotaView[] }> = ({ tenant: t, quotas }) => (
  <>
    <Section id="fields" title="Tenant">
      <dl class="fields">
        <dt>Name</dt>
        <dd>{t.name}</dd>
        <dt>Instances</dt>
        <dd>
          <a id="tenant-instances" href={instancesOf(t.id)}>
            {plural(t.instances, "instance")} (not deleted)
          </a>
        </dd>
        <dt>Created</dt>
        <dd>
          <Time at={t.createdAt} />
        </dd>
      </dl>
    </Section>
    <Section id="members" title="Members">
      {t.members.length === 0 ? (
        <p class="empty">
          No members: nobody acts for this tenant yet. Mint an API key of role <code>vps-tenant</code> (<code>iam.apiKeys.create</code>) and
          add it with <code>vps.tenants.addMember</code>; that key then signs in here to its own instances.
        </p>
      ) : (
        <ul>
          {t.members.map((m) => (
            <li class="mono">{m}</li>
          ))}
        </ul>
      )}
    </Section>
    <Section id="quotas" title="Quotas">
      {quotas.length === 0 ? (
        <p class="empty">No pool is offered to this tenant: set a quota in a pool (below) and it may create instances there.</p>
      ) : (
        <DataTable
          label="Quotas"
          caption="What it holds / what it may hold, per pool"
          columns={["Pool", "Instances", "vCPUs", "Memory", "Disk"]}
        >
          {quotas.map((q) => (
            <tr data-quota={q.pool}>
              <th scope="row">{q.pool}</th>
              <td>{usage(q.usage.instances, q.quota.instances)}</td>
              <td>{usage(q.usage.vcpus, q.quota.vcpus)}</td>
              <td>{usage(q.usage.memoryMiB, q.quota.memoryMiB, " MiB")}</td>
              <td>{usage(q.usage.diskGiB, q.quota.diskGiB, " GiB")}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </Section>
  </>
);

/** vps.quotas.set for the tenant: a pool (from vps.pools.list when the role may list them) and its four limits. */
export const SetQuota: FC<{ tenant: string; pools?: string[]; csrf: string }> = ({ tenant, pools, csrf }) => {
  const number = (id: string, name: keyof Sizes, label: string) => (
    <>
      <label for={id}>{label}</label>
      <input id={id} name={name} type="number" min={0} required inputmode="numeric" />
    </>
  );
  return (
    <Section id="set-quota" title="Set a quota">
      <PostForm action={`${tenantPath(tenant)}/quotas`} csrf={csrf}>
        <p>Setting a quota offers the pool to the tenant; one below what it holds stops new instances only.</p>
        <label for="quota-pool">Pool</label>
        {pools ? (
          pools.length === 0 ? (
            <p>No VPS pool exists yet: create one with vps.pools.create (docs/vps.md).</p>
          ) : (
            <select id="quota-pool" name="pool">
              {pools.map((p) => (
                <option value={p}>{p}</option>
              ))}
            </select>
          )
        ) : (
          <input id="quota-pool" name="pool" required />
        )}
        {number("quota-instances", "instances", "Instances")}
        {number("quota-vcpus", "vcpus", "vCPUs")}
        {number("quota-memory", "memoryMiB", "Memory (MiB)")}
        {number("quota-disk", "diskGiB", "Disk (GiB)")}
        <Submit id="set-quota-button">Set quota</Submit>
      </PostForm>
    </Section>
  );
};

// ------------------------------------------------------------------ sinks

export const Sinks: FC<{ sinks: SinkView[]; deadLetters: DeadLetterView[]; next: string | null; replay: boolean; csrf: string }> = ({
  sinks,
  deadLetters,
  next,
  replay,
  csrf,
}) => (
  <>
    <Section id="sinks" title="Sinks">
      {sinks.length === 0 ? (
        <Empty>
          <strong>No sinks.</strong> A sink is code the deployment registers to receive its events or audit rows in order (a webhook, a
          SIEM, a table): add one under <code>sinks</code> in <code>better-compute.config.ts</code> and deploy; see docs/sinks.md and
          docs/sinks-webhook.md.
        </Empty>
      ) : (
        <DataTable
          label="Sinks"
          caption={`${plural(sinks.length, "sink")}: how far behind each is, and what it refused`}
          columns={[
            "Sink",
            "Source",
            "Behind",
            "Oldest waiting",
            { label: "Cursor", wide: true },
            "Retrying",
            "Last delivered",
            "Dead letters",
          ]}
        >
          {sinks.map((s) => (
            <tr data-sink={s.id}>
              <th scope="row">
                {s.id} <span class="mono">{s.version}</span>
              </th>
              <td>{s.source}</td>
              <td>{plural(s.lag.behind, "row")}</td>
              <td>{ago(s.lag.oldestAgeSeconds)}</td>
              <td class="mono wide">{s.cursor}</td>
              <td>
                {s.attempts === 0 ? (
                  "no"
                ) : (
                  <>
                    {plural(s.attempts, "failed attempt")}, next <Time at={s.nextAttemptAt} />
                    {s.lastError && (
                      <>
                        : <Json value={s.lastError} />
                      </>
                    )}
                  </>
                )}
              </td>
              <td>
                <Time at={s.lastDeliveredAt} />
              </td>
              <td>
                {s.deadLetters}
                {replay && s.deadLetters > 0 && (
                  <>
                    {" "}
                    <a href={`${sinkPath(s.id)}/replay`} aria-label={`Replay the ${plural(s.deadLetters, "dead letter")} of ${s.id}`}>
                      Replay all…
                    </a>
                  </>
                )}
              </td>
            </tr>
          ))}
        </DataTable>
      )}
    </Section>
    <Section id="dead-letters" title="Dead letters">
      {deadLetters.length === 0 ? (
        <p class="empty">
          No dead letters: every sink took everything it was sent (a sink that refuses a row its maxAttempts times leaves it here).
        </p>
      ) : (
        <DataTable
          label="Dead letters"
          caption="Rows a sink refused for good, not replayed yet, oldest first"
          columns={["Dead letter", "Sink", "Record", "Attempts", "Last error", { label: "Since", wide: true }, replay && "Action"]}
        >
          {deadLetters.map((d) => (
            <tr data-dead-letter={d.id}>
              <th scope="row" class="mono">
                {d.id}
              </th>
              <td>{d.sink}</td>
              <td class="mono">
                {d.source} {d.recordId} (position {d.position})
              </td>
              <td>{d.attempts}</td>
              <td>
                <Json value={d.lastError} />
              </td>
              <td class="wide">
                <Time at={d.createdAt} />
              </td>
              {replay && (
                <td>
                  <PostButton
                    action={`/console/sinks/dead-letters/${encodeURIComponent(d.id)}/replay`}
                    csrf={csrf}
                    class="secondary"
                    label={`Replay dead letter ${d.id}`}
                  >
                    Replay
                  </PostButton>
                </td>
              )}
            </tr>
          ))}
        </DataTable>
      )}
      {next && <MorePage href={`/console/sinks?${new URLSearchParams({ after: next })}`}>More dead letters</MorePage>}
    </Section>
  </>
);
