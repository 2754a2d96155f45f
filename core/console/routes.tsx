/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The web console (docs/console.md), served by the API Worker under /console: pages rendered on
// the server from the API's own methods, called through the same dispatch as POST /v1/<name>
// (callMethod: IAM, the transaction, the audit row) as the session's principal. Signing in
// exchanges an API key for a session cookie; every POST carries the session's CSRF token; every
// response carries a strict Content-Security-Policy. Live updates: core/console/assets.ts.
import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import type { Child } from "hono/jsx";
import { callMethod, type MethodDeps } from "../api.ts";
import type { Bindings } from "../bindings.ts";
import { ComputeError, errorBody, invalidArgument, isComputeError } from "../errors.ts";
import { eventStream, watchRequest } from "../events/watch.ts";
import { checkInput, describeError, toComputeError, type AppEnv } from "../http.ts";
import { createLogger } from "../log.ts";
import type { Store } from "../store/database.ts";
import type { Approvers } from "../context.ts";
import { ApprovalBatch, Approvals, ApproveForm, approvePath, AwaitingApproval } from "./approval-pages.tsx";
import { CLIENT_JS, CSS, ICON_SVG } from "./assets.ts";
import { Confirm } from "./components.tsx";
import {
  Audit,
  AuditFilterForm,
  CreateInstance,
  ErrorPage,
  Fleet,
  FleetFilterForm,
  Home,
  Instance,
  instancePath,
  Instances,
  Layout,
  Machine,
  machinePath,
  SerialConsole,
  SignIn,
  type ConsoleTail,
  type FleetFilters,
  type FlavorView,
  type InstanceView,
  type SerialView,
  type AuditEntryView,
  type AuditFilters,
  type EventView,
  type Frame,
  type MachineView,
  type ProblemView,
} from "./pages.tsx";
import type { WorkflowView } from "../views.ts";
import { operatorBack, operatorRoutes, type ConsoleHelpers } from "./operator-routes.tsx";
import { field, jsonObject, pageOf, queryFilters } from "./request.ts";
import { closeSession, csrfMatches, findSession, openSession, SESSION_COOKIE, SESSION_SECONDS, type ConsoleSession } from "./sessions.ts";

export interface ConsoleDeps extends MethodDeps {
  /** The live-update stream's own store (it outlives the request's). */
  openStore: (env: Bindings) => Store;
  /** pki.approvers, when destructive workflows wait for approval (docs/quorum.md): the console then lists them. */
  approvers?: Approvers;
}

/** On every console response. No inline script or style anywhere, so 'self' is all a page needs. */
const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy":
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cache-control": "no-store",
};

const log = createLogger({ component: "console" });
/** The session a request was decided with, for the error page's header. */
const sessions = new WeakMap<Request, ConsoleSession>();

export function consoleRoutes(deps: ConsoleDeps): Hono<AppEnv> {
  const app = new Hono<AppEnv>();

  /** A method as the session's principal, exactly as POST /v1/<name> with its key would run it. */
  const call = async <T,>(c: Context<AppEnv>, session: ConsoleSession, name: string, input: Record<string, unknown>): Promise<T> => {
    const entry = deps.registry.methods.get(name);
    if (!entry) throw new ComputeError("NOT_FOUND", `this deployment has no method ${name}`);
    return (await callMethod(c, deps, entry, session.principal, checkInput(c, entry.method.input, input))) as T;
  };
  /** Whether the session's principal may call `name` on `resource` (to offer only the actions it may take). */
  const may = async (session: ConsoleSession, name: string, resource: string) => {
    const entry = deps.registry.methods.get(name);
    return entry !== undefined && (await deps.iam.authorize(session.principal, entry.method.action, resource));
  };
  /** "Are you sure?" before a destructive POST to `action`, titled with its button's label unless told. */
  const confirm: ConsoleHelpers["confirm"] = (c, session, { title, ...page }) =>
    render(c, { title: title ?? `${page.label}?`, session }, <Confirm {...page} csrf={session.csrf} />);

  app.get("/", (c) => c.redirect("/console/", 302));

  app.use("/console/*", async (c, next) => {
    await next();
    for (const [name, value] of Object.entries(SECURITY_HEADERS)) c.res.headers.set(name, value);
  });
  app.post(
    "/console/*",
    bodyLimit({
      maxSize: deps.maxBodyBytes,
      onError: () => {
        throw new ComputeError("PAYLOAD_TOO_LARGE", `the request body is larger than ${deps.maxBodyBytes} bytes`);
      },
    }),
    async (c, next) => {
      // Defence in depth beside SameSite=Strict and the CSRF token: a browser says which site's page
      // posts. Sec-Fetch-Site first: under Referrer-Policy no-referrer Chromium sends Origin: null.
      const site = c.req.header("sec-fetch-site");
      const origin = c.req.header("origin");
      if ((site && site !== "same-origin" && site !== "none") || (origin && origin !== "null" && origin !== new URL(c.req.url).origin))
        throw new ComputeError("PERMISSION_DENIED", "the request comes from another site's page");
      await next();
    },
  );

  app.get("/console/app.js", (c) => c.body(CLIENT_JS, 200, { "content-type": "text/javascript; charset=utf-8" }));
  app.get("/console/app.css", (c) => c.body(CSS, 200, { "content-type": "text/css; charset=utf-8" }));
  app.get("/console/icon.svg", (c) => c.body(ICON_SVG, 200, { "content-type": "image/svg+xml" }));

  // ---------------------------------------------------------------- signing in and out

  app.get("/console/sign-in", async (c) => {
    if (await findSession(c.get("store"), getCookie(c, SESSION_COOKIE))) return c.redirect("/console/", 303);
    return render(c, { title: "Sign in" }, <SignIn />);
  });

  app.post("/console/session", async (c) => {
    const form = await c.req.parseBody();
    const key = typeof form.key === "string" ? form.key.trim() : "";
    const refused = (message: string) => {
      const problem: ProblemView = { status: 401, code: "UNAUTHENTICATED", message, requestId: c.get("requestId") };
      // The form comes back empty: the key is never written into a page.
      return render(c, { title: "Sign in" }, <SignIn problem={problem} />, 401);
    };
    // An API key, or where the IAM takes them an SSO bearer token (a JWT).
    if (!/^[\x21-\x7e]{1,8192}$/.test(key)) return refused("enter an API key or a token");
    // The IAM port decides, as for any API call: the key as a bearer credential.
    const asBearer = new Request(c.req.url, { headers: { authorization: `Bearer ${key}` } });
    let principal;
    try {
      principal = await deps.iam.authenticate(asBearer, c.get("store"));
    } catch (err) {
      if (isComputeError(err) && err.code === "UNAUTHENTICATED") return refused(err.message);
      throw err;
    }
    if (!principal) return refused("enter an API key or a token");
    // Signing in again replaces the browser's session rather than leaving the old one alive.
    await closeSession(c.get("store"), getCookie(c, SESSION_COOKIE));
    const { id } = await openSession(c.get("store"), principal);
    // A token that expires sooner ends the session sooner (openSession); the cookie goes with it.
    const left = principal.expiresAt ? Math.ceil((Date.parse(principal.expiresAt) - Date.now()) / 1000) : SESSION_SECONDS;
    setCookie(c, SESSION_COOKIE, id, {
      httpOnly: true,
      secure: true,
      sameSite: "Strict",
      path: "/",
      maxAge: Math.max(1, Math.min(SESSION_SECONDS, left)),
    });
    return c.redirect("/console/", 303);
  });

  app.post("/console/sign-out", async (c) => {
    const id = getCookie(c, SESSION_COOKIE);
    // A session that is already gone has nothing to protect: the cookie is cleared all the same.
    if (await findSession(c.get("store"), id)) await mutating(c);
    await closeSession(c.get("store"), id);
    deleteCookie(c, SESSION_COOKIE, { httpOnly: true, secure: true, sameSite: "Strict", path: "/" });
    return c.redirect("/console/sign-in", 303);
  });

  // ---------------------------------------------------------------- pages

  app.get("/console", (c) => c.redirect("/console/", 302));
  app.get("/console/", async (c) => {
    const session = await signedIn(c);
    if (await may(session, "metal.nodes.list", "*")) return c.redirect("/console/fleet", 303);
    if (await may(session, "vps.instances.list", "*")) return c.redirect("/console/instances", 303);
    return render(c, { title: "Signed in", session }, <Home principal={session.principal} />);
  });

  app.get("/console/fleet", async (c) => {
    const session = await signedIn(c);
    const filters: FleetFilters = queryFilters(c, ["q", "state", "pool", "site"]);
    const { q, ...byMethod } = filters;
    // metal.nodes.list filters by state, pool and site (and answers at most 1000); the id search and the pages are the console's.
    const { nodes } = await call<{ nodes: MachineView[] }>(c, session, "metal.nodes.list", byMethod);
    const machines = q ? nodes.filter((m) => m.id.toLowerCase().includes(q.toLowerCase())) : nodes;
    const page = Math.max(0, Number.parseInt(c.req.query("page") ?? "0", 10) || 0);
    const pageHref = (n: number) => `/console/fleet?${new URLSearchParams({ ...filters, page: String(n) })}`;
    return render(
      c,
      { title: "Fleet", session, subjects: "metal/nodes/" },
      <Fleet machines={machines} filtered={Object.keys(filters).length > 0} page={page} pageHref={pageHref} />,
      200,
      <FleetFilterForm filters={filters} states={enumOf("metal.nodes.list", "state")} />,
    );
  });

  app.get("/console/machines/:node", async (c) => {
    const session = await signedIn(c);
    const id = c.req.param("node");
    const machine = await call<MachineView>(c, session, "metal.nodes.get", { node: id });
    const resource = `metal/nodes/${machine.id}`;
    // The sections another role may not read are left out rather than refusing the page.
    const optional = async <T,>(name: string, input: Record<string, unknown>, resourceOf: string): Promise<T | undefined> =>
      (await may(session, name, resourceOf)) ? call<T>(c, session, name, input) : undefined;
    const { events: history = [] } =
      (await optional<{ events: EventView[] }>("events.list", { subject: resource, order: "desc", limit: 50 }, "*")) ?? {};
    // The running workflow, else the last one that ran on it.
    const workflowId =
      machine.workflow ??
      (await optional<{ workflows: { id: string }[] }>("workflows.list", { target: machine.id, limit: 1 }, "*"))?.workflows[0]?.id;
    const workflow = workflowId ? await optional<WorkflowView>("workflows.get", { id: workflowId }, `workflows/${workflowId}`) : undefined;
    const notice =
      workflow?.state === "awaiting-approval" && workflow.quorum ? (
        <AwaitingApproval workflow={workflow} mayApprove={await may(session, "workflows.approve", `workflows/${workflow.id}`)} />
      ) : undefined;
    const actions = {
      deploy: await may(session, "metal.deploy", resource),
      undeploy: await may(session, "metal.undeploy", resource),
      maintenance: await may(session, "metal.nodes.maintenance", resource),
      rescue: await may(session, "metal.rescue", resource),
      retire: await may(session, "metal.nodes.retire", resource),
      recommission: await may(session, "metal.nodes.recommission", resource),
      console: (await may(session, "metal.nodes.console", resource)) && (await may(session, "metal.nodes.consoleRead", resource)),
    };
    return render(
      c,
      { title: `Machine ${machine.id}`, session, subjects: `${resource} workflows/` },
      <Machine
        machine={machine}
        workflow={workflow}
        history={history}
        actions={actions}
        profiles={deployProfiles()}
        csrf={session.csrf}
        notice={notice}
      />,
    );
  });

  app.post("/console/machines/:node/deploy", async (c) => {
    const { session, form } = await mutating(c);
    const node = c.req.param("node");
    await call(c, session, "metal.deploy", { node, profile: field(form, "profile"), input: jsonObject(field(form, "input") ?? "{}") });
    return c.redirect(machinePath(node), 303);
  });

  app.post("/console/machines/:node/maintenance", async (c) => {
    const { session, form } = await mutating(c);
    const node = c.req.param("node");
    const reason = field(form, "reason");
    await call(c, session, "metal.nodes.maintenance", { node, on: field(form, "on") === "true", ...(reason ? { reason } : {}) });
    return c.redirect(machinePath(node), 303);
  });

  // Undeploy, rescue and retire ask first (undeploying wipes its disks, rescue stops the installed system, retiring is for good);
  // unrescue and recommission do not.
  const confirmable: Record<string, { label: string; text: string }> = {
    undeploy: {
      label: "Undeploy",
      text: "Its disks are wiped (an attested wipe) before it is ready again, and the system installed on it is gone. This cannot be undone.",
    },
    rescue: {
      label: "Rescue",
      text: "It reboots into the rescue ramdisk: the system installed on it stops until it is unrescued (its disk is untouched).",
    },
    retire: {
      label: "Retire",
      text: "It leaves service for good: it can only come back by enrolling its BMC again as a new machine.",
    },
  };
  app.get("/console/machines/:node/:action{undeploy|rescue|retire}", async (c) => {
    const session = await signedIn(c);
    const action = c.req.param("action");
    const { label, text } = confirmable[action]!;
    const machine = await call<MachineView>(c, session, "metal.nodes.get", { node: c.req.param("node") });
    const path = machinePath(machine.id);
    const what = `${label} ${machine.id}`;
    return confirm(c, session, { text: `${what}? ${text}`, action: `${path}/${action}`, label: what, back: path });
  });
  const lifecycle: Record<string, string> = {
    undeploy: "metal.undeploy",
    rescue: "metal.rescue",
    unrescue: "metal.unrescue",
    retire: "metal.nodes.retire",
    recommission: "metal.nodes.recommission",
  };
  app.post("/console/machines/:node/:action{undeploy|rescue|unrescue|retire|recommission}", async (c) => {
    const { session } = await mutating(c);
    const node = c.req.param("node");
    await call(c, session, lifecycle[c.req.param("action")]!, { node });
    return c.redirect(machinePath(node), 303);
  });

  // The serial console: opening it (a POST: metal.nodes.console writes an audit row) leads to its
  // page, which reads it (metal.nodes.consoleRead) from the session's start on every refresh.
  app.get("/console/machines/:node/console", async (c) => {
    const session = await signedIn(c);
    const node = c.req.param("node");
    await call(c, session, "metal.nodes.get", { node });
    const consoleSession = c.req.query("session");
    let view: SerialView | undefined;
    if (consoleSession) {
      const connection = c.req.query("connection");
      view = await orReason(async () => {
        const read = await call<{ data: string; ended: string | null; stale: boolean }>(c, session, "metal.nodes.consoleRead", {
          node,
          session: consoleSession,
          ...(connection ? { connection, offset: 0 } : {}),
        });
        return {
          text: new TextDecoder().decode(Uint8Array.from(atob(read.data), (ch) => ch.charCodeAt(0))),
          ended: read.ended,
          stale: read.stale,
        };
      });
    }
    const live = view && !("problem" in view);
    return render(
      c,
      { title: `Serial console of ${node}`, session, poll: live ? 3000 : undefined },
      <SerialConsole node={node} view={view} csrf={session.csrf} />,
    );
  });
  app.post("/console/machines/:node/console", async (c) => {
    const { session } = await mutating(c);
    const node = c.req.param("node");
    const noConsole = (view: SerialView) =>
      render(c, { title: `Serial console of ${node}`, session }, <SerialConsole node={node} view={view} csrf={session.csrf} />);
    const opened = await orReason(() => call<{ session: string }>(c, session, "metal.nodes.console", { node }));
    if ("problem" in opened) return noConsole(opened);
    // The first read fixes the connection; every later one reads it from its start.
    const first = await orReason(() =>
      call<{ connection: string | null }>(c, session, "metal.nodes.consoleRead", { node, session: opened.session }),
    );
    if ("problem" in first) return noConsole(first);
    const q = new URLSearchParams({ session: opened.session, ...(first.connection ? { connection: first.connection } : {}) });
    return c.redirect(`${machinePath(node)}/console?${q}`, 303);
  });

  // ---------------------------------------------------------------- instances (a tenant's own; an operator's all)

  app.get("/console/instances", async (c) => {
    const session = await signedIn(c);
    // ?tenant=: one tenant's (the tenants' pages link here); a tenant's own session sees its own either way.
    const { tenant } = queryFilters(c, ["tenant"]);
    const { instances, next } = await call<{ instances: InstanceView[]; next: string | null }>(c, session, "vps.instances.list", {
      ...(tenant ? { tenant } : {}),
      ...pageOf(c),
    });
    // An operator (who may list tenants) sees every tenant's, and creates for one through the API; a tenant its own.
    const operator = await may(session, "vps.tenants.list", "*");
    const create = !operator && (await may(session, "vps.instances.create", "*"));
    const { flavors = [] } = create ? await call<{ flavors: FlavorView[] }>(c, session, "vps.flavors.list", {}) : {};
    const { sshKeys = [] } = create ? await call<{ sshKeys: { name: string }[] }>(c, session, "vps.sshKeys.list", {}) : {};
    return render(
      c,
      { title: tenant ? `Instances of tenant ${tenant}` : "Instances", session },
      <Instances instances={instances} next={next} operator={operator} tenant={tenant} />,
      200,
      undefined,
      create ? <CreateInstance flavors={flavors} sshKeys={sshKeys.map((k) => k.name)} csrf={session.csrf} /> : undefined,
    );
  });

  app.post("/console/instances", async (c) => {
    const { session } = await mutating(c);
    const form = await c.req.parseBody({ all: true });
    // The flavor names its pool; a tenant may list the flavors offered to it (not get one).
    const { flavors } = await call<{ flavors: FlavorView[] }>(c, session, "vps.flavors.list", {});
    const flavor = flavors.find((f) => f.id === field(form as Record<string, string>, "flavor"));
    if (!flavor) throw invalidArgument("choose a flavor offered to you");
    const keys = ([] as unknown[]).concat(form.sshKeys ?? []).filter((k): k is string => typeof k === "string");
    const userData = field(form as Record<string, string>, "userData");
    const created = await call<InstanceView>(c, session, "vps.instances.create", {
      pool: flavor.pool,
      flavor: flavor.id,
      name: field(form as Record<string, string>, "name") ?? "",
      sshKeys: keys,
      ...(userData ? { userData: userData.replaceAll("\r\n", "\n") } : {}),
    });
    return c.redirect(instancePath(created.id), 303);
  });

  app.get("/console/instances/:id", async (c) => {
    const session = await signedIn(c);
    const instance = await call<InstanceView>(c, session, "vps.instances.get", { id: c.req.param("id") });
    const tail: ConsoleTail = await orReason(async () => {
      const read = await call<{ console: string | null; at: string | null; stale: boolean }>(c, session, "vps.instances.console", {
        id: instance.id,
        maxBytes: 4096,
      });
      return { text: read.console, at: read.at, stale: read.stale };
    }, true);
    return render(
      c,
      { title: `Instance ${instance.name}`, session, poll: 5000 },
      <Instance instance={instance} tail={tail} csrf={session.csrf} />,
    );
  });

  app.get("/console/instances/:id/delete", async (c) => {
    const session = await signedIn(c);
    const instance = await call<InstanceView>(c, session, "vps.instances.get", { id: c.req.param("id") });
    const path = instancePath(instance.id);
    return confirm(c, session, {
      text: `Delete instance ${instance.id} (${instance.name})? Its server and its disk are deleted; this cannot be undone.`,
      action: `${path}/delete`,
      label: `Delete ${instance.name}`,
      back: path,
    });
  });

  app.post("/console/instances/:id/:action{start|stop|reboot|delete}", async (c) => {
    const { session } = await mutating(c);
    const id = c.req.param("id");
    await call(c, session, `vps.instances.${c.req.param("action")}`, { id });
    return c.redirect(instancePath(id), 303);
  });

  app.get("/console/audit", async (c) => {
    const session = await signedIn(c);
    const filters: AuditFilters = queryFilters(c, ["actor", "action", "resource"]);
    const page = pageOf(c);
    const { entries, next } = await call<{ entries: AuditEntryView[]; next: string | null }>(c, session, "audit.list", {
      ...filters,
      ...page,
      order: "desc",
    });
    // Only the first page moves: a later one is a fixed slice of the past.
    return render(
      c,
      { title: "Audit log", session, subjects: page.after ? undefined : "*" },
      <Audit entries={entries} next={next} filters={filters} />,
      200,
      <AuditFilterForm filters={filters} />,
    );
  });

  // ---------------------------------------------------------------- quorum approvals (docs/quorum.md)

  app.get("/console/approvals", async (c) => {
    const session = await signedIn(c);
    const { workflows, next } = await call<{ workflows: { id: string }[]; next: string | null }>(c, session, "workflows.list", {
      state: "awaiting-approval",
      ...pageOf(c),
    });
    // Each one's batch and its approvals so far: workflows.get (a page holds at most PAGE_SIZE).
    const detailed: WorkflowView[] = [];
    for (const { id } of workflows) detailed.push(await call<WorkflowView>(c, session, "workflows.get", { id }));
    return render(
      c,
      { title: "Approvals", session, subjects: "workflows/" },
      <Approvals workflows={detailed} next={next} configured={deps.approvers !== undefined} targetHref={targetHref} />,
    );
  });

  app.get("/console/workflows/:id/approve", async (c) => {
    const session = await signedIn(c);
    const workflow = await call<WorkflowView>(c, session, "workflows.get", { id: c.req.param("id") });
    const counted = c.req.query("counted");
    const mayApprove = await may(session, "workflows.approve", `workflows/${workflow.id}`);
    return render(
      c,
      { title: `Approve workflow ${workflow.id}`, session, subjects: `workflows/${workflow.id}` },
      <ApprovalBatch
        workflow={workflow}
        href={targetHref(workflow)}
        counted={counted === "yes" || counted === "no" ? counted : undefined}
      />,
      200,
      undefined,
      mayApprove ? <ApproveForm workflow={workflow} csrf={session.csrf} /> : undefined,
    );
  });

  // The signature is what counts: workflows.approve checks it against pki.approvers.keys, called as the session's principal.
  app.post("/console/workflows/:id/approve", async (c) => {
    const { session, form } = await mutating(c);
    const id = c.req.param("id");
    const approved = await call<{ counted: boolean }>(c, session, "workflows.approve", {
      workflowId: id,
      key: field(form, "key")?.trim() ?? "",
      signature: field(form, "signature")?.trim() ?? "",
    });
    return c.redirect(`${approvePath(id)}?counted=${approved.counted ? "yes" : "no"}`, 303);
  });

  // ---------------------------------------------------------------- live updates

  app.get("/console/events", async (c) => {
    c.set("method", "events.watch");
    const session = await signedIn(c);
    const { filter, after } = watchRequest(c);
    if (!(await deps.iam.authorize(session.principal, "events.list", "*")))
      throw new ComputeError("PERMISSION_DENIED", `${session.principal.id} may not events.list on *`);
    return eventStream(c, deps.openStore(c.env ?? {}), filter, after, { announce: true, typed: false });
  });

  // Sites and join tokens, hosts, VPS tenants and quotas, sinks: core/console/operator-routes.tsx.
  operatorRoutes(app, { call, may, render, confirm, signedIn, mutating, has: (name) => deps.registry.methods.has(name) });

  app.all("/console/*", (c) => {
    throw new ComputeError("NOT_FOUND", `the console has no page ${new URL(c.req.url).pathname}`);
  });

  // ---------------------------------------------------------------- errors, as pages

  app.onError(async (err, c) => {
    const error = toComputeError(err);
    const body = errorBody(error, c.get("longInputs") ?? [], c.get("requestId"));
    if (error.status >= 500)
      log.error("request failed", {
        requestId: c.get("requestId"),
        path: new URL(c.req.url).pathname,
        code: error.code,
        ...describeError(err),
      });
    const problem: ProblemView = { status: error.status, code: error.code, message: body.message, requestId: body.requestId };
    const path = new URL(c.req.url).pathname;
    // What a script asked for (a live region, the event stream) gets the status and the message alone.
    if (c.req.query("part") || path === "/console/events")
      return c.text(`${problem.message} (request ${problem.requestId})`, error.status as 400);
    if (error.code === "UNAUTHENTICATED") return c.redirect("/console/sign-in", 303);
    const machine = /^\/console\/machines\/([^/]+)\/./.exec(path)?.[1];
    const instance = /^\/console\/instances\/([^/]+)\/./.exec(path)?.[1];
    const workflow = c.req.method === "POST" ? /^\/console\/workflows\/([^/]+)\/approve$/.exec(path)?.[1] : undefined;
    const back = machine
      ? { href: `/console/machines/${machine}`, label: `Back to machine ${decodeURIComponent(machine)}` }
      : instance
        ? { href: `/console/instances/${instance}`, label: `Back to instance ${decodeURIComponent(instance)}` }
        : workflow
          ? { href: `/console/workflows/${workflow}/approve`, label: `Back to workflow ${decodeURIComponent(workflow)}` }
          : operatorBack(path);
    const session = sessions.get(c.req.raw);
    return render(c, { title: titleFor(error), session }, <ErrorPage problem={problem} back={back} />, error.status);
  });

  // ---------------------------------------------------------------- helpers

  /** The whole page, or its #live region alone when the client script asks (?part=live). */
  async function render(
    c: Context<AppEnv>,
    frame: Omit<Frame, "session"> & { session?: ConsoleSession },
    live: Child,
    status = 200,
    above?: Child,
    below?: Child,
  ): Promise<Response> {
    if (c.req.query("part") === "live") return c.html(String(await live), status as 200);
    const { session: signedInAs, ...rest } = frame;
    const session = signedInAs && { principal: signedInAs.principal, csrf: signedInAs.csrf, links: await links(signedInAs) };
    const page = (
      <Layout {...rest} session={session} live={live} below={below}>
        {above}
      </Layout>
    );
    return c.html(`<!DOCTYPE html>${await page}`, status as 200);
  }

  /** The navigation: only the pages the session's roles may open. */
  async function links(session: ConsoleSession): Promise<{ href: string; label: string }[]> {
    const pages = [
      { href: "/console/fleet", label: "Fleet", method: "metal.nodes.list" },
      { href: "/console/instances", label: "Instances", method: "vps.instances.list" },
      { href: "/console/audit", label: "Audit log", method: "audit.list" },
      { href: "/console/sites", label: "Sites", method: "metal.sites.list" },
      { href: "/console/hosts", label: "Hosts", method: "capacity.hosts.list" },
      { href: "/console/tenants", label: "Tenants", method: "vps.tenants.list" },
      { href: "/console/sinks", label: "Sinks", method: "events.sinks.list" },
      // Only where workflows wait for approval (pki.approvers).
      ...(deps.approvers ? [{ href: "/console/approvals", label: "Approvals", method: "workflows.list" }] : []),
    ];
    const allowed = await Promise.all(pages.map((p) => may(session, p.method, "*")));
    return pages.filter((_, i) => allowed[i]).map(({ href, label }) => ({ href, label }));
  }

  async function signedIn(c: Context<AppEnv>): Promise<ConsoleSession> {
    const session = await findSession(c.get("store"), getCookie(c, SESSION_COOKIE));
    if (!session) throw new ComputeError("UNAUTHENTICATED", "sign in to use the console");
    sessions.set(c.req.raw, session);
    return session;
  }

  /** A POST of a signed-in session that carries its CSRF token (form field csrf, or header x-csrf-token). */
  async function mutating(c: Context<AppEnv>): Promise<{ session: ConsoleSession; form: Record<string, string | File> }> {
    const session = await signedIn(c);
    const form = await c.req.parseBody();
    const presented = c.req.header("x-csrf-token") ?? field(form, "csrf");
    if (!csrfMatches(session, presented))
      throw new ComputeError("PERMISSION_DENIED", "the request carries no valid CSRF token: reload the page and try again");
    return { session, form };
  }

  /**
   * A method's answer, or the API's refusal as a sentence to show in its place: no console here
   * (UNSUPPORTED, or UNAVAILABLE: no site agent to reach it) or, with `any`, every refusal.
   */
  async function orReason<T>(run: () => Promise<T>, any = false): Promise<T | { problem: string }> {
    try {
      return await run();
    } catch (err) {
      if (isComputeError(err) && (any ? err.status < 500 : err.code === "UNSUPPORTED" || err.code === "UNAVAILABLE"))
        return { problem: err.message };
      throw err;
    }
  }

  /** The values a method's input field takes, when it is an enum (the fleet's state filter). */
  function enumOf(name: string, fieldName: string): string[] {
    const shape = (deps.registry.methods.get(name)?.method.input as { shape?: Record<string, { unwrap?: () => { options?: string[] } }> })
      ?.shape;
    return shape?.[fieldName]?.unwrap?.().options ?? [];
  }

  /** A workflow's target's page: a metal profile's target is a machine. */
  function targetHref(wf: { profile: string; target: string }): string | undefined {
    const profile = deps.registry
      .byContract<{ contract: "profile"; id: string; version: string; target?: string }>("profile")
      .find((p) => p.id === wf.profile);
    return profile?.target === "metal" ? machinePath(wf.target) : undefined;
  }

  /** The profiles a machine may be deployed with: metal's, with a role to end in. */
  function deployProfiles(): { id: string; description?: string }[] {
    type Profile = { contract: "profile"; id: string; version: string; target?: string; role?: string; description?: string };
    return deps.registry
      .byContract<Profile>("profile")
      .filter((p) => p.target === "metal" && p.role)
      .map((p) => ({ id: p.id, description: p.description }));
  }

  return app;
}

function titleFor(error: ComputeError): string {
  if (error.code === "PERMISSION_DENIED") return "Not allowed";
  if (error.code === "NOT_FOUND") return "Not found";
  return error.status >= 500 ? "Something went wrong" : "The request was refused";
}
