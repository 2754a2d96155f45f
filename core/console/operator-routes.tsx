/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The operator's pages beside the fleet (docs/console.md): sites, pools and join tokens; hosts;
// VPS tenants and quotas; sinks and their dead letters. Registered by consoleRoutes (routes.tsx)
// with its helpers, so every page and action is the API's own method as the session's principal
// (same IAM, same audit row), every POST carries the CSRF token, and every error is the API's.
import type { Context, Hono } from "hono";
import type { Child } from "hono/jsx";
import { ComputeError, notFound } from "../errors.ts";
import type { AppEnv } from "../http.ts";
import {
  CreateTokens,
  Host,
  Hosts,
  SetQuota,
  Sinks,
  Sites,
  Tenant,
  Tenants,
  TokenCreated,
  sinkPath,
  sitesPath,
  tenantPath,
  tokenPrefix,
  type DeadLetterView,
  type HostView,
  type JoinTokenView,
  type MintedTokenView,
  type PoolView,
  type QuotaView,
  type ReservationView,
  type SinkView,
  type SiteView,
  type TenantView,
} from "./operator-pages.tsx";
import { plural } from "./components.tsx";
import type { Frame } from "./pages.tsx";
import { field, labelsField, numberField, pageOf } from "./request.ts";
import type { ConsoleSession } from "./sessions.ts";

/** What consoleRoutes lends these routes: its method call, IAM check, page frame and session checks. */
export interface ConsoleHelpers {
  /** A method as the session's principal, exactly as POST /v1/<name> with its key would run it. */
  call<T>(c: Context<AppEnv>, session: ConsoleSession, name: string, input: Record<string, unknown>): Promise<T>;
  /** Whether the session's principal may call `name` on `resource` (to offer only the actions it may take). */
  may(session: ConsoleSession, name: string, resource: string): Promise<boolean>;
  /** Whether the deployment has the method at all (a deployment without metal has no sites). */
  has(name: string): boolean;
  signedIn(c: Context<AppEnv>): Promise<ConsoleSession>;
  mutating(c: Context<AppEnv>): Promise<{ session: ConsoleSession; form: Record<string, string | File> }>;
  render(
    c: Context<AppEnv>,
    frame: Omit<Frame, "session"> & { session?: ConsoleSession },
    live: Child,
    status?: number,
    above?: Child,
    below?: Child,
  ): Promise<Response>;
  /** "Are you sure?" before a destructive POST to `action` (its button), titled "<label>?" unless told. */
  confirm(
    c: Context<AppEnv>,
    session: ConsoleSession,
    page: { text: string; action: string; label: string; back: string; title?: string },
  ): Promise<Response>;
}

/** How many dead letters one "replay all" POST re-sends at most (each in its own transaction, with its own audit row). */
const REPLAY_AT_ONCE = 200;
const AGENT_ROLES = ["node", "site", "ramdisk"] as const;

export function operatorRoutes(app: Hono<AppEnv>, h: ConsoleHelpers): void {
  const { call, may, signedIn, mutating, render, confirm } = h;

  // ---------------------------------------------------------------- sites, pools and join tokens

  app.get(sitesPath, async (c) => {
    const session = await signedIn(c);
    const metal = h.has("metal.sites.list");
    const sites = metal ? (await call<{ sites: SiteView[] }>(c, session, "metal.sites.list", {})).sites : undefined;
    const pools = metal ? (await call<{ pools: PoolView[] }>(c, session, "metal.pools.list", {})).pools : undefined;
    const state = c.req.query("state") || undefined;
    const page = pageOf(c);
    const { tokens, next } = await call<{ tokens: JoinTokenView[]; next: string | null }>(c, session, "joinTokens.list", {
      ...(state ? { state } : {}),
      ...page,
    });
    const [revoke, site, join] = await Promise.all([
      may(session, "joinTokens.revoke", "*"),
      may(session, "siteTokens.create", "*"),
      may(session, "joinTokens.create", "*"),
    ]);
    return render(
      c,
      { title: "Sites, pools and join tokens", session, subjects: page.after ? undefined : "metal/sites/ metal/pools/ joinTokens/ nodes/" },
      <Sites sites={sites} pools={pools} tokens={tokens} next={next} state={state} revoke={revoke} />,
      200,
      undefined,
      <CreateTokens sites={sites} site={site} join={join} roles={AGENT_ROLES} csrf={session.csrf} />,
    );
  });

  // A new token is on this answer and nowhere else: not in a redirect, not in a later page (the
  // API never returns it again); every console response is Cache-Control: no-store.
  app.post(`${sitesPath}/site-token`, async (c) => {
    const { session, form } = await mutating(c);
    const site = field(form, "site") ?? "";
    const ttlSeconds = numberField(form, "ttlSeconds");
    const minted = await call<MintedTokenView>(c, session, "siteTokens.create", {
      site,
      ...(ttlSeconds !== undefined ? { ttlSeconds } : {}),
    });
    return render(
      c,
      { title: "Site token created", session },
      <TokenCreated minted={minted} role="site" site={site} labels={{ "bc.dev/site": site }} />,
    );
  });

  app.post(`${sitesPath}/join-token`, async (c) => {
    const { session, form } = await mutating(c);
    const role = field(form, "role") ?? "";
    const labels = labelsField(field(form, "labels") ?? "");
    const ttlSeconds = numberField(form, "ttlSeconds");
    const minted = await call<MintedTokenView>(c, session, "joinTokens.create", {
      role,
      ...(Object.keys(labels).length ? { labels } : {}),
      ...(ttlSeconds !== undefined ? { ttlSeconds } : {}),
    });
    return render(c, { title: "Join token created", session }, <TokenCreated minted={minted} role={role} labels={labels} />);
  });

  app.get(`${sitesPath}/tokens/:id/revoke`, async (c) => {
    const session = await signedIn(c);
    const id = c.req.param("id");
    const resource = `joinTokens/${id}`;
    // No method reads one token: the confirmation asks IAM first, as the revoke itself will.
    if (!(await may(session, "joinTokens.revoke", resource)))
      throw new ComputeError("PERMISSION_DENIED", `${session.principal.id} may not joinTokens.revoke on ${resource}`);
    return confirm(c, session, {
      text: `Revoke join token ${tokenPrefix(id)}? It can no longer join; an agent that already joined with it is not affected (revoke that node instead). This cannot be undone.`,
      action: `${sitesPath}/tokens/${encodeURIComponent(id)}/revoke`,
      label: `Revoke ${tokenPrefix(id)}`,
      back: sitesPath,
    });
  });

  app.post(`${sitesPath}/tokens/:id/revoke`, async (c) => {
    const { session } = await mutating(c);
    await call(c, session, "joinTokens.revoke", { id: c.req.param("id") });
    return c.redirect(sitesPath, 303);
  });

  // ---------------------------------------------------------------- hosts

  app.get("/console/hosts", async (c) => {
    const session = await signedIn(c);
    const { hosts } = await call<{ hosts: HostView[] }>(c, session, "capacity.hosts.list", {});
    return render(c, { title: "Hosts", session, subjects: "capacity/hosts/ nodes/ vps/instances/" }, <Hosts hosts={hosts} />);
  });

  app.get("/console/hosts/:node", async (c) => {
    const session = await signedIn(c);
    const node = c.req.param("node");
    const host = await call<HostView & { reservationList: ReservationView[] }>(c, session, "capacity.hosts.get", { node });
    return render(
      c,
      { title: `Host ${host.node}`, session, subjects: `capacity/hosts/${host.node} nodes/${host.node} vps/instances/` },
      <Host host={host} />,
    );
  });

  // ---------------------------------------------------------------- VPS tenants and quotas

  app.get("/console/tenants", async (c) => {
    const session = await signedIn(c);
    const { tenants } = await call<{ tenants: TenantView[] }>(c, session, "vps.tenants.list", {});
    const { quotas } = await call<{ quotas: QuotaView[] }>(c, session, "vps.quotas.list", {});
    return render(
      c,
      { title: "VPS tenants", session, subjects: "vps/tenants/ vps/instances/" },
      <Tenants tenants={tenants} quotas={quotas} />,
    );
  });

  app.get("/console/tenants/:id", async (c) => {
    const session = await signedIn(c);
    const tenant = await call<TenantView>(c, session, "vps.tenants.get", { id: c.req.param("id") });
    const { quotas } = await call<{ quotas: QuotaView[] }>(c, session, "vps.quotas.list", { tenant: tenant.id });
    const setQuota = await may(session, "vps.quotas.set", `vps/tenants/${tenant.id}`);
    // The pools to offer, when the role may list them; else the form takes a pool's id.
    const pools =
      setQuota && (await may(session, "vps.pools.list", "*"))
        ? (await call<{ pools: { id: string }[] }>(c, session, "vps.pools.list", {})).pools.map((p) => p.id)
        : undefined;
    return render(
      c,
      { title: `Tenant ${tenant.id}`, session, subjects: `vps/tenants/${tenant.id} vps/instances/` },
      <Tenant tenant={tenant} quotas={quotas} />,
      200,
      undefined,
      setQuota ? <SetQuota tenant={tenant.id} pools={pools} csrf={session.csrf} /> : undefined,
    );
  });

  app.post("/console/tenants/:id/quotas", async (c) => {
    const { session, form } = await mutating(c);
    const tenant = c.req.param("id");
    const sizes: Record<string, unknown> = {};
    for (const name of ["instances", "vcpus", "memoryMiB", "diskGiB"]) sizes[name] = numberField(form, name);
    await call(c, session, "vps.quotas.set", { tenant, pool: field(form, "pool") ?? "", ...sizes });
    return c.redirect(tenantPath(tenant), 303);
  });

  // ---------------------------------------------------------------- sinks and dead letters

  app.get("/console/sinks", async (c) => {
    const session = await signedIn(c);
    const { sinks } = await call<{ sinks: SinkView[] }>(c, session, "events.sinks.list", {});
    const page = pageOf(c);
    const { deadLetters, next } = await call<{ deadLetters: DeadLetterView[]; next: string | null }>(
      c,
      session,
      "events.deadLetters.list",
      page,
    );
    const replay = await may(session, "events.deadLetters.replay", "*");
    // Any event moves a sink's lag: the first page follows them all (as the audit log's does).
    return render(
      c,
      { title: "Sinks", session, subjects: page.after ? undefined : "*" },
      <Sinks sinks={sinks} deadLetters={deadLetters} next={next} replay={replay} csrf={session.csrf} />,
    );
  });

  app.post("/console/sinks/dead-letters/:id/replay", async (c) => {
    const { session } = await mutating(c);
    await call(c, session, "events.deadLetters.replay", { id: c.req.param("id") });
    return c.redirect("/console/sinks", 303);
  });

  /** The sink of that id as events.sinks.list answers it, or NOT_FOUND. */
  const sinkOf = async (c: Context<AppEnv>, session: ConsoleSession, id: string) => {
    const { sinks } = await call<{ sinks: SinkView[] }>(c, session, "events.sinks.list", {});
    const sink = sinks.find((s) => s.id === id);
    if (!sink) throw notFound(`sink ${id} is not registered in this deployment`);
    return sink;
  };

  // Replaying every dead letter of a sink re-sends them all: the page asks first, saying how many.
  app.get("/console/sinks/:sink/replay", async (c) => {
    const session = await signedIn(c);
    const sink = await sinkOf(c, session, c.req.param("sink"));
    if (!(await may(session, "events.deadLetters.replay", "*")))
      throw new ComputeError("PERMISSION_DENIED", `${session.principal.id} may not events.deadLetters.replay on deadLetters/*`);
    const n = sink.deadLetters;
    const title = `Replay the dead letters of ${sink.id}?`;
    if (n === 0)
      return render(
        c,
        { title, session },
        <p class="empty">
          Sink {sink.id} has no dead letter to replay. <a href="/console/sinks">Back to the sinks</a>
        </p>,
      );
    const some = n > REPLAY_AT_ONCE ? `the oldest ${REPLAY_AT_ONCE} of its ${n} dead letters` : `its ${plural(n, "dead letter")}`;
    return confirm(c, session, {
      title,
      text: `Replay ${some} to sink ${sink.id}? Each is delivered to the sink again, oldest first, outside its cursor: the receiver gets rows it refused before, after newer ones. Each replay is recorded in the audit log; a refusal stops the rest.`,
      action: `${sinkPath(sink.id)}/replay`,
      label: `Replay ${Math.min(n, REPLAY_AT_ONCE)} dead letter${n === 1 ? "" : "s"}`,
      back: "/console/sinks",
    });
  });

  app.post("/console/sinks/:sink/replay", async (c) => {
    const { session } = await mutating(c);
    const sink = c.req.param("sink");
    // Each replay is the API's own call (its transaction, its audit row); one the sink refuses again stops the rest.
    let replayed = 0;
    while (replayed < REPLAY_AT_ONCE) {
      const { deadLetters } = await call<{ deadLetters: DeadLetterView[] }>(c, session, "events.deadLetters.list", {
        sink,
        limit: Math.min(100, REPLAY_AT_ONCE - replayed),
      });
      if (deadLetters.length === 0) break;
      for (const d of deadLetters) await call(c, session, "events.deadLetters.replay", { id: d.id });
      replayed += deadLetters.length;
    }
    return c.redirect("/console/sinks", 303);
  });
}

/** Where an error page on one of these pages leads back to (routes.tsx's onError), or undefined. */
export function operatorBack(path: string): { href: string; label: string } | undefined {
  const tenant = /^\/console\/tenants\/([^/]+)\/./.exec(path)?.[1];
  if (tenant) return { href: tenantPath(decodeURIComponent(tenant)), label: `Back to tenant ${decodeURIComponent(tenant)}` };
  const host = /^\/console\/hosts\/./.test(path);
  if (host) return { href: "/console/hosts", label: "Back to the hosts" };
  if (/^\/console\/tenants\/./.test(path)) return { href: "/console/tenants", label: "Back to the tenants" };
  if (/^\/console\/sites\/./.test(path)) return { href: sitesPath, label: "Back to sites and join tokens" };
  if (/^\/console\/sinks\/./.test(path)) return { href: "/console/sinks", label: "Back to the sinks" };
  return undefined;
}
