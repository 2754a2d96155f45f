// The web console's sign-in, sessions, CSRF refusal, security headers and IAM (core/console/),
// through the default deployment's compute.fetch in workerd against Postgres; no browser (the
// browser test is test/node/console-browser.test.ts). Every console request is decided by the
// same IAM and dispatch as the API: a tenant's session is refused an operator page, a viewer's
// an action, and a console action writes the same audit row an API call would. Then the next
// pages: a tenant's own instances (created from the form, stopped, deleted after asking; another
// tenant's not shown), retire after a confirmation, the serial console's empty state, the fleet's
// search and filters.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { sha256Hex } from "../core/encoding.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";

let client: TestClient;
const run = Math.random().toString(36).slice(2, 8);
const machine = `m-console-${run}`;
beforeAll(async () => {
  client = await createTestClient(compute, env);
  // A site with no agent: the machine stays enrolled, and nothing but this file moves it.
  expect((await client.call("metal.sites.create", { id: `console-${run}` })).status).toBe(200);
  expect(
    (
      await client.call("metal.pools.create", {
        id: `console-${run}-pool`,
        site: `console-${run}`,
        policy: { hardwareProfile: "redfish-pxe" },
      })
    ).status,
  ).toBe(200);
  const enrolled = await client.call("metal.enroll", {
    id: machine,
    pool: `console-${run}-pool`,
    bmc: { address: `https://192.0.2.77/redfish/v1/Systems/${run}`, username: "admin", password: "console-bmc-password" },
  });
  expect(enrolled.status, JSON.stringify(enrolled.body)).toBe(200);
});
afterAll(() => client?.close());

const get = (path: string, cookie?: string) => client.request(path, { headers: cookie ? { cookie } : {} });
const post = (path: string, fields: Record<string, string>, cookie?: string, headers: Record<string, string> = {}) =>
  client.request(path, { method: "POST", body: new URLSearchParams(fields), headers: { ...(cookie ? { cookie } : {}), ...headers } });

/** Signs in with `key`; answers the cookie header to send and the session id it carries. */
async function signIn(key: string): Promise<{ cookie: string; id: string; setCookie: string }> {
  const res = await post("/console/session", { key });
  expect(res.status).toBe(303);
  expect(res.headers.get("location")).toBe("/console/");
  const setCookie = res.headers.get("set-cookie")!;
  const id = /^bc_session=([^;]+)/.exec(setCookie)![1]!;
  return { cookie: `bc_session=${id}`, id, setCookie };
}

/** The CSRF token a page's forms carry. */
const csrfOf = (html: string) => /name="csrf" value="([^"]+)"/.exec(html)![1]!;

describe("the console's sign-in and sessions", () => {
  it("serves the sign-in page with a strict Content-Security-Policy and sends a page without a session there", async () => {
    const res = await get("/console/sign-in");
    expect(res.status).toBe(200);
    const csp = res.headers.get("content-security-policy")!;
    for (const directive of ["default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"])
      expect(csp).toContain(directive);
    expect(res.headers.get("x-content-type-options")).toBe("nosniff");
    expect(res.headers.get("referrer-policy")).toBe("no-referrer");
    const html = await res.text();
    expect(html).toMatch(/^<!DOCTYPE html><html lang="en">/);
    expect(html).toContain("<main");
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)/); // no inline script: the CSP would refuse it
    expect(html).not.toMatch(/\sstyle=/);

    for (const path of ["/console/", "/console/fleet", `/console/machines/${machine}`, "/console/audit"]) {
      const page = await get(path);
      expect(page.status, path).toBe(303);
      expect(page.headers.get("location")).toBe("/console/sign-in");
    }
    expect((await get("/")).headers.get("location")).toBe("/console/");
    const script = await get("/console/app.js");
    expect(script.headers.get("content-type")).toMatch(/^text\/javascript/);
    expect(script.headers.get("content-security-policy")).toContain("default-src 'self'");
  });

  it("exchanges an API key for an HttpOnly, Secure, SameSite=Strict session cookie whose id is stored only hashed", async () => {
    const { id, setCookie, cookie } = await signIn(client.key);
    expect(id).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(setCookie).toMatch(/; HttpOnly/);
    expect(setCookie).toMatch(/; Secure/);
    expect(setCookie).toMatch(/; SameSite=Strict/);
    expect(setCookie).toMatch(/; Path=\//);
    expect(setCookie).toMatch(/; Max-Age=43200/);
    expect(setCookie).not.toContain(client.key);
    const { rows } = await client.store.db.execute(
      sql`SELECT id_sha256, principal FROM bc_console_sessions WHERE id_sha256 = ${await sha256Hex(id)}`,
    );
    expect(rows).toHaveLength(1);
    const { rows: plain } = await client.store.db.execute(sql`SELECT 1 FROM bc_console_sessions WHERE id_sha256 = ${id}`);
    expect(plain).toHaveLength(0);

    const home = await get("/console/", cookie);
    expect(home.status).toBe(303);
    expect(home.headers.get("location")).toBe("/console/fleet");
    const fleet = await get("/console/fleet", cookie);
    expect(fleet.status).toBe(200);
    const html = await fleet.text();
    expect(html).toContain(machine);
    expect(html).not.toContain(client.key);
    expect(html).not.toContain(id);
  });

  it("refuses a wrong key without echoing it, and a revoked key's session at once", async () => {
    const wrong = `bck_0123456789abcdef_${"A".repeat(43)}`;
    const res = await post("/console/session", { key: wrong });
    expect(res.status).toBe(401);
    expect(res.headers.get("set-cookie")).toBeNull();
    const html = await res.text();
    expect(html).toContain("the API key is unknown or revoked");
    expect(html).not.toContain(wrong);

    // Another site's page cannot sign the browser in (login CSRF): the browser says where the post comes from.
    const crossSite = await post("/console/session", { key: client.key }, undefined, { "sec-fetch-site": "cross-site" });
    expect(crossSite.status).toBe(403);
    expect(crossSite.headers.get("set-cookie")).toBeNull();

    const key = await client.mintKey(["viewer"]);
    const { cookie } = await signIn(key);
    expect((await get("/console/fleet", cookie)).status).toBe(200);
    const keyId = /^bck_([0-9a-f]{16})_/.exec(key)![1]!;
    expect((await client.call("iam.apiKeys.revoke", { id: keyId })).status).toBe(200);
    expect((await get("/console/fleet", cookie)).headers.get("location")).toBe("/console/sign-in");
  });

  it("signs out: the session is deleted server-side and the cookie cleared", async () => {
    const { cookie, id } = await signIn(client.key);
    const csrf = csrfOf(await (await get("/console/fleet", cookie)).text());
    expect((await post("/console/sign-out", {}, cookie)).status).toBe(403); // sign-out is a mutation too
    const out = await post("/console/sign-out", { csrf }, cookie);
    expect(out.status).toBe(303);
    expect(out.headers.get("location")).toBe("/console/sign-in");
    expect(out.headers.get("set-cookie")).toMatch(/^bc_session=; Max-Age=0/);
    const { rows } = await client.store.db.execute(sql`SELECT 1 FROM bc_console_sessions WHERE id_sha256 = ${await sha256Hex(id)}`);
    expect(rows).toHaveLength(0);
    expect((await get("/console/fleet", cookie)).headers.get("location")).toBe("/console/sign-in");
  });
});

describe("the console's actions", () => {
  it("refuses a POST without the session's CSRF token, or from another site's page, with 403", async () => {
    const { cookie } = await signIn(client.key);
    const csrf = csrfOf(await (await get(`/console/machines/${machine}`, cookie)).text());
    const path = `/console/machines/${machine}/maintenance`;
    for (const [fields, headers] of [
      [{ on: "true", reason: "no token" }, {}],
      [{ on: "true", reason: "wrong token", csrf: "x".repeat(43) }, {}],
      [{ on: "true", reason: "cross-site", csrf }, { origin: "https://evil.example" }],
    ] as const) {
      const res = await post(path, fields, cookie, headers);
      expect(res.status, JSON.stringify(fields)).toBe(403);
      expect(res.headers.get("content-security-policy")).toContain("frame-ancestors 'none'");
      const html = await res.text();
      expect(html).toContain(res.headers.get("x-request-id")!);
    }
    const { body } = await client.call("metal.nodes.get", { node: machine });
    expect(body.maintenance).toBe(false);
  });

  it("runs an action through the API's dispatch: the audit row names the session's principal and the console's request id", async () => {
    const { cookie } = await signIn(client.key);
    const page = await (await get(`/console/machines/${machine}`, cookie)).text();
    // The machine page: the BMC address, never its password.
    expect(page).toContain("192.0.2.77");
    expect(page).not.toContain("console-bmc-password");
    const res = await post(`/console/machines/${machine}/maintenance`, { on: "true", reason: "console test", csrf: csrfOf(page) }, cookie);
    expect(res.status).toBe(303);
    expect(res.headers.get("location")).toBe(`/console/machines/${machine}`);
    expect((await client.call("metal.nodes.get", { node: machine })).body).toMatchObject({
      maintenance: true,
      maintenanceReason: "console test",
    });
    const { body } = await client.call("audit.list", { resource: `metal/nodes/${machine}`, order: "desc", limit: 1 });
    const keyId = /^bck_([0-9a-f]{16})_/.exec(client.key)![1]!;
    expect(body.entries[0]).toMatchObject({
      actor: `apikey:${keyId}`,
      action: "metal.nodes.maintenance",
      requestId: res.headers.get("x-request-id"),
    });

    // The audit page finds it by its filters; an API error shows its message and request id.
    const audit = await (await get(`/console/audit?action=metal.nodes.maintenance&resource=metal/nodes/${machine}`, cookie)).text();
    expect(audit).toContain(res.headers.get("x-request-id")!);
    // A script sends the token as a header instead of a form field.
    const off = await post(`/console/machines/${machine}/maintenance`, { on: "false" }, cookie, { "x-csrf-token": csrfOf(page) });
    expect(off.status).toBe(303);
    expect((await client.call("metal.nodes.get", { node: machine })).body.maintenance).toBe(false);
    const missing = await post(`/console/machines/m-none-${run}/undeploy`, { csrf: csrfOf(page) }, cookie);
    expect(missing.status).toBe(404);
    const html = await missing.text();
    expect(html).toContain(`metal node m-none-${run} does not exist`);
    expect(html).toContain(missing.headers.get("x-request-id")!);
  });

  it("decides by the session's roles as the API would: a tenant is refused operator pages, a viewer the actions", async () => {
    const tenant = await signIn(await client.mintKey(["vps-tenant"]));
    // It lands on its instances; a key that was never made a tenant's member is told so there.
    const home = await get("/console/", tenant.cookie);
    expect(home.status).toBe(303);
    expect(home.headers.get("location")).toBe("/console/instances");
    const instances = await get("/console/instances", tenant.cookie);
    expect(instances.status).toBe(403);
    expect(await instances.text()).toContain("is not a member of any tenant");
    for (const path of ["/console/fleet", `/console/machines/${machine}`, "/console/audit"]) {
      const res = await get(path, tenant.cookie);
      expect(res.status, path).toBe(403);
      expect(await res.text()).toMatch(/may not (metal\.nodes\.list|metal\.nodes\.get|audit\.list)/);
    }
    expect((await get("/console/events", tenant.cookie)).status).toBe(403);

    const viewer = await signIn(await client.mintKey(["viewer"]));
    const page = await (await get(`/console/machines/${machine}`, viewer.cookie)).text();
    expect(page).not.toContain("Put in maintenance"); // not offered
    const res = await post(`/console/machines/${machine}/maintenance`, { on: "true", reason: "viewer", csrf: csrfOf(page) }, viewer.cookie);
    expect(res.status).toBe(403);
    expect(await res.text()).toContain("may not metal.nodes.maintenance");
  });

  it("streams events to a session as unnamed Server-Sent Events, announcing where it starts", async () => {
    const { cookie } = await signIn(client.key);
    const res = await get("/console/events", cookie);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!/event: ready\n/.test(text)) text += (await reader.read()).value ?? "";
    expect(text).toMatch(/event: ready\ndata: \{\}\nid: \d+/);
    await client.call("iam.apiKeys.create", { name: `console-${run}`, roles: ["viewer"] });
    while (!/"type":"iam\.apiKey\.created"/.test(text)) text += (await reader.read()).value ?? "";
    expect(text).not.toMatch(/event: iam\./);
    await reader.cancel();
  });
});

describe("the console's next pages", () => {
  /** Answers the body of an API call made with the admin key, checking it succeeded. */
  const ok = async <T = Record<string, unknown>>(name: string, input: Record<string, unknown>, key?: string): Promise<T> => {
    const res = await client.call(name, input, key ? { key } : {});
    expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
    return res.body as T;
  };

  it("shows a tenant its own instances only, creates one from a flavor with an SSH key and user data, and deletes it after asking", async () => {
    // A host pool with no host: instances stay pending (placed once a host joins), which is all a page needs.
    const pool = `console-${run}-vms`;
    await ok("vps.pools.create", { id: pool, class: "host", hosts: { labels: { "bc.dev/console": run } }, runtime: "qemu-microvm" });
    await ok("vps.flavors.create", { id: `${pool}-small`, pool, vcpus: 1, memoryMiB: 128, diskGiB: 1 });
    for (const tenant of [`t-${run}`, `other-${run}`]) {
      await ok("vps.tenants.create", { id: tenant, name: tenant });
      await ok("vps.quotas.set", { tenant, pool, instances: 2, vcpus: 2, memoryMiB: 256, diskGiB: 2 });
    }
    const key = await ok<{ id: string; key: string }>("iam.apiKeys.create", { name: `tenant-${run}`, roles: ["vps-tenant"] });
    await ok("vps.tenants.addMember", { tenant: `t-${run}`, principal: `apikey:${key.id}` });
    await ok(
      "vps.sshKeys.create",
      { name: "laptop", publicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop" },
      key.key,
    );
    const theirs = await ok<{ id: string }>("vps.instances.create", {
      tenant: `other-${run}`,
      pool,
      flavor: `${pool}-small`,
      name: "theirs",
      userData: "#!/bin/sh\n",
    });

    const tenant = await signIn(key.key);
    expect((await get("/console/", tenant.cookie)).headers.get("location")).toBe("/console/instances");
    const empty = await (await get("/console/instances", tenant.cookie)).text();
    expect(empty).toContain("No instances yet");
    expect(empty).toContain(`${pool}-small in ${pool}`);
    expect(empty).toContain('<option value="laptop">laptop</option>');
    expect(empty).not.toContain("/console/fleet"); // no link to an operator page

    const form = new URLSearchParams({ csrf: csrfOf(empty), name: "web-1", flavor: `${pool}-small`, userData: "#!/bin/sh\r\necho hi\r\n" });
    form.append("sshKeys", "laptop");
    const created = await client.request("/console/instances", { method: "POST", body: form, headers: { cookie: tenant.cookie } });
    expect(created.status, await created.clone().text()).toBe(303);
    const path = created.headers.get("location")!;
    const id = /^\/console\/instances\/(i-[0-9a-f]+)$/.exec(path)![1]!;
    const stored = await ok<{ tenant: string; sshKeys: string[]; state: string }>("vps.instances.get", { id });
    expect(stored).toMatchObject({ tenant: `t-${run}`, sshKeys: ["laptop"], state: "pending" });

    const page = await (await get(path, tenant.cookie)).text();
    expect(page).toContain('data-state="pending"');
    expect(page).toContain("is not on a host"); // the console tail's empty state: the API's own sentence
    expect(page).toContain("has not reported its host keys yet");
    const list = await (await get("/console/instances", tenant.cookie)).text();
    expect(list).toContain(`data-instance="${id}"`);
    expect(list).not.toContain(theirs.id);
    // Another tenant's instance is not found, as through the API.
    expect((await get(`/console/instances/${theirs.id}`, tenant.cookie)).status).toBe(404);

    const confirm = await get(`${path}/delete`, tenant.cookie);
    expect(await confirm.text()).toContain(`Delete instance ${id} (web-1)?`);
    const stop = await post(`${path}/stop`, { csrf: csrfOf(page) }, tenant.cookie);
    expect(stop.status).toBe(303);
    expect(await ok<{ desired: string }>("vps.instances.get", { id })).toMatchObject({ desired: "stopped" });
    expect((await post(`${path}/delete`, {}, tenant.cookie)).status).toBe(403); // no CSRF token
    expect((await post(`${path}/delete`, { csrf: csrfOf(page) }, tenant.cookie)).status).toBe(303);
    // Never placed on a host: deleted at once.
    expect(await ok<{ state: string }>("vps.instances.get", { id })).toMatchObject({ state: "deleted" });
  });

  it("retires a machine after asking, says why there is no serial console, and filters the fleet", async () => {
    const retiring = `m-retire-${run}`;
    await ok("metal.enroll", {
      id: retiring,
      pool: `console-${run}-pool`,
      bmc: { address: `https://192.0.2.78/redfish/v1/Systems/${run}`, username: "admin", password: "console-bmc-password" },
    });
    const { cookie } = await signIn(client.key);
    const page = await (await get(`/console/machines/${retiring}`, cookie)).text();
    expect(page).toContain(`href="/console/machines/${retiring}/retire"`);
    expect(page).not.toContain(`/console/machines/${retiring}/rescue`); // only a deployed machine is rescued
    const confirm = await (await get(`/console/machines/${retiring}/retire`, cookie)).text();
    expect(confirm).toContain("It leaves service for good");
    expect((await post(`/console/machines/${retiring}/retire`, { csrf: csrfOf(confirm) }, cookie)).status).toBe(303);
    expect(await ok<{ state: string }>("metal.nodes.get", { node: retiring })).toMatchObject({ state: "retired" });

    // The site has no agent: the console cannot be reached, and the page says so instead of failing.
    const opened = await post(`/console/machines/${machine}/console`, { csrf: csrfOf(confirm) }, cookie);
    expect(opened.status).toBe(200);
    expect(await opened.text()).toContain(`No serial console: site console-${run} has no agent`);

    const filtered = await (await get(`/console/fleet?q=retire-${run}&state=retired`, cookie)).text();
    expect(filtered).toContain(`data-machine="${retiring}"`);
    expect(filtered).not.toContain(`data-machine="${machine}"`);
    expect(filtered).toContain('<option value="retired" selected="">retired</option>');
    expect(await (await get(`/console/fleet?q=nothing-${run}`, cookie)).text()).toContain("No machine matches these filters");
  });
});
