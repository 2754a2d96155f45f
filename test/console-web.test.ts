// The web console's sign-in, sessions, CSRF refusal, security headers and IAM (core/console/),
// through the default deployment's compute.fetch in workerd against Postgres; no browser (the
// browser test is test/node/console-browser.test.ts). Every console request is decided by the
// same IAM and dispatch as the API: a tenant's session is refused an operator page, a viewer's
// an action, and a console action writes the same audit row an API call would. Then the next
// pages: a tenant's own instances (created from the form, stopped, deleted after asking; another
// tenant's not shown), retire after a confirmation, the serial console's empty state, the fleet's
// search and filters. Last, a deployment of its own with an identity provider's JWTs and approvers
// 2-of-3: signing in with an SSO token (a session no longer than the token), and a workflow
// awaiting approval listed and approved from the console (CSRF refused, a bad signature refused
// with the API's message, the approval recorded by workflows.approve as the session's principal).
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compute } from "../better-compute.config.ts";
import { sha256Hex } from "../core/encoding.ts";
import { betterCompute, defineSink } from "../core/index.ts";
import { createTestClient, type TestClient } from "../testing/test-client.ts";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { z } from "zod";
import { builtinIam, definePlugin } from "../core/index.ts";
import { metalModule } from "../plugins/metal/index.ts";
import { defineProfile, defineStep, provisionModule } from "../plugins/provision/index.ts";

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

describe("the console's operator pages: sites and join tokens, hosts, tenants, sinks", () => {
  const ok = async <T = Record<string, unknown>>(name: string, input: Record<string, unknown>): Promise<T> => {
    const res = await client.call(name, input);
    expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
    return res.body as T;
  };
  const TOKEN = /bcj_([0-9a-f]{16})_[A-Za-z0-9_-]{43}/;
  const occurrences = (text: string, part: string) => text.split(part).length - 1;

  it("renders the four pages for an admin, with their links in the navigation and empty states saying what to do", async () => {
    const { cookie } = await signIn(client.key);
    const sites = await get("/console/sites", cookie);
    expect(sites.status).toBe(200);
    const html = await sites.text();
    for (const href of ["/console/sites", "/console/hosts", "/console/tenants", "/console/sinks"]) expect(html).toContain(`href="${href}"`);
    expect(html).toContain(`data-site="console-${run}"`);
    expect(html).toMatch(
      new RegExp(`data-pool="console-${run}-pool"><th scope="row">console-${run}-pool</th><td>console-${run}</td><td>redfish-pxe</td>`),
    );
    expect(html).toContain("Create site token");
    expect(html).toContain("Create join token");
    for (const path of ["/console/hosts", "/console/tenants"]) expect((await get(path, cookie)).status, path).toBe(200);
    // The default deployment registers no sink.
    const sinks = await get("/console/sinks", cookie);
    expect(sinks.status).toBe(200);
    expect(await sinks.text()).toContain("No sinks.</strong> A sink is code the deployment registers");
    // A viewer reads them all, and is offered no action.
    const viewer = await signIn(await client.mintKey(["viewer"]));
    const seen = await (await get("/console/sites", viewer.cookie)).text();
    expect(seen).toContain(`data-site="console-${run}"`);
    expect(seen).not.toContain("Create site token");
    expect(seen).not.toContain("Revoke…");
  });

  it("shows a new join token once, on the answer to its POST (not cached), and only its id in every list afterwards", async () => {
    const { cookie } = await signIn(client.key);
    const csrf = csrfOf(await (await get("/console/sites", cookie)).text());
    expect((await post("/console/sites/site-token", { site: `console-${run}` }, cookie)).status).toBe(403); // no CSRF token

    const created = await post("/console/sites/site-token", { site: `console-${run}`, ttlSeconds: "900", csrf }, cookie);
    expect(created.status).toBe(200);
    expect(created.headers.get("cache-control")).toBe("no-store");
    expect(created.headers.get("location")).toBeNull();
    const answer = await created.text();
    const [token, id] = TOKEN.exec(answer)!;
    expect(occurrences(answer, token)).toBe(1);
    expect(answer).toContain("Copy the token now: it is shown this once.");
    const listed = await ok<{ tokens: { id: string; role: string; labels: Record<string, string>; state: string }[] }>("joinTokens.list", {
      role: "site",
      limit: 100,
    });
    expect(listed.tokens.find((t) => t.id === id)).toMatchObject({
      role: "site",
      labels: { "bc.dev/site": `console-${run}` },
      state: "active",
    });

    // A node's token with labels typed one a line.
    const node = await post("/console/sites/join-token", { role: "node", labels: "bc.dev/pool=console\r\nrack = r1\r\n", csrf }, cookie);
    expect(node.status).toBe(200);
    const nodeAnswer = await node.text();
    const [nodeToken, nodeId] = TOKEN.exec(nodeAnswer)!;
    expect(occurrences(nodeAnswer, nodeToken)).toBe(1);
    const nodes = await ok<{ tokens: { id: string; labels: Record<string, string> }[] }>("joinTokens.list", { role: "node", limit: 100 });
    expect(nodes.tokens.find((t) => t.id === nodeId)?.labels).toEqual({ "bc.dev/pool": "console", rack: "r1" });
    const badLabels = await post("/console/sites/join-token", { role: "node", labels: "no-equals-sign", csrf }, cookie);
    expect(badLabels.status).toBe(400);
    expect(await badLabels.text()).toContain("a label is key=value, one a line");

    // Every later page: the id, never the token.
    const secret = (t: string) => t.slice(t.lastIndexOf("_") + 1);
    for (const path of ["/console/sites", "/console/sites?state=active", "/console/audit", "/console/sites?part=live"]) {
      const page = await (await get(path, cookie)).text();
      expect(page.includes(secret(token)), path).toBe(false);
      expect(page.includes(secret(nodeToken)), path).toBe(false);
    }
    const list = await (await get("/console/sites", cookie)).text();
    expect(list).toContain(`data-token="${id}"`);
    expect(list).toContain(`bcj_${id}_…`);

    // Revoked after a confirmation page.
    const confirm = await (await get(`/console/sites/tokens/${id}/revoke`, cookie)).text();
    expect(confirm).toContain(`Revoke join token bcj_${id}_…?`);
    expect((await post(`/console/sites/tokens/${id}/revoke`, {}, cookie)).status).toBe(403); // no CSRF token
    const revoked = await post(`/console/sites/tokens/${id}/revoke`, { csrf }, cookie);
    expect(revoked.status).toBe(303);
    expect(revoked.headers.get("location")).toBe("/console/sites");
    const after = await ok<{ tokens: { id: string; state: string }[] }>("joinTokens.list", { state: "revoked", limit: 100 });
    expect(after.tokens.some((t) => t.id === id)).toBe(true);
    const { body } = await client.call("audit.list", { resource: `joinTokens/${id}`, order: "desc", limit: 1 });
    expect(body.entries[0]).toMatchObject({ action: "joinTokens.revoke", requestId: revoked.headers.get("x-request-id") });
  });

  it("shows a host's capacity, used and total, and what is placed on it", async () => {
    const host = `h-console-${run}`;
    const labels = { "console-host": run };
    await client.store.db.execute(sql`
      INSERT INTO bc_nodes (id, role, public_key, labels, attestor, state, resources)
      VALUES (${host}, 'node', 'inserted-by-test', ${JSON.stringify(labels)}::jsonb, 'test', 'connected',
              ${JSON.stringify({ cpus: 8, memoryMiB: 16384, diskGiB: 200, devices: [] })}::jsonb)`);
    const hold = await ok<{ placed?: { nodeId: string } }>("capacity.holds.create", {
      owner: `console-test/${run}`,
      candidates: { labels },
      vcpus: 2,
      memoryMiB: 1024,
      diskGiB: 10,
      ttlSeconds: 600,
    });
    expect(hold.placed?.nodeId).toBe(host);
    const { cookie } = await signIn(client.key);
    const list = await (await get("/console/hosts", cookie)).text();
    expect(list).toMatch(new RegExp(`data-host="${host}">.*?<td>yes</td><td>2 / 8</td><td>1024 / 16384 MiB</td><td>10 / 200 GiB</td>`));
    const page = await get(`/console/hosts/${host}`, cookie);
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).toContain(`console-test/${run}`);
    expect(html).toContain('<span class="state state-held">held</span>');
    expect(html).toContain('<th scope="row">vCPUs</th><td>8</td><td>2</td><td>6</td>');
    const missing = await get(`/console/hosts/h-none-${run}`, cookie);
    expect(missing.status).toBe(404);
    expect(await missing.text()).toContain("Back to the hosts");
  });

  it("lists tenants with their quotas and instances, and sets a quota from a tenant's page", async () => {
    const pool = `console-${run}-ops`;
    const tenant = `ops-${run}`;
    await ok("vps.pools.create", { id: pool, class: "host", hosts: { labels: { "bc.dev/console-ops": run } }, runtime: "qemu-microvm" });
    await ok("vps.flavors.create", { id: `${pool}-small`, pool, vcpus: 1, memoryMiB: 128, diskGiB: 1 });
    await ok("vps.tenants.create", { id: tenant, name: "Ops tenant" });
    const { cookie } = await signIn(client.key);
    const empty = await (await get(`/console/tenants/${tenant}`, cookie)).text();
    expect(empty).toContain("No members: nobody acts for this tenant yet.");
    expect(empty).toContain("No pool is offered to this tenant");
    expect(empty).toContain(`<option value="${pool}">${pool}</option>`);

    const csrf = csrfOf(empty);
    const quota = { pool, instances: "3", vcpus: "4", memoryMiB: "512", diskGiB: "10" };
    expect((await post(`/console/tenants/${tenant}/quotas`, quota, cookie)).status).toBe(403); // no CSRF token
    const set = await post(`/console/tenants/${tenant}/quotas`, { ...quota, csrf }, cookie);
    expect(set.status).toBe(303);
    expect(set.headers.get("location")).toBe(`/console/tenants/${tenant}`);
    const { quotas } = await ok<{ quotas: unknown[] }>("vps.quotas.list", { tenant });
    expect(quotas).toEqual([
      {
        tenant,
        pool,
        quota: { instances: 3, vcpus: 4, memoryMiB: 512, diskGiB: 10 },
        usage: { instances: 0, vcpus: 0, memoryMiB: 0, diskGiB: 0 },
      },
    ]);
    const refused = await post(`/console/tenants/${tenant}/quotas`, { ...quota, instances: "lots", csrf }, cookie);
    expect(refused.status).toBe(400);
    const refusal = await refused.text();
    expect(refusal).toContain("instances");
    expect(refusal).toContain(refused.headers.get("x-request-id")!);
    expect(refusal).toContain(`Back to tenant ${tenant}`);

    const instance = await ok<{ id: string }>("vps.instances.create", {
      tenant,
      pool,
      flavor: `${pool}-small`,
      name: "ops-1",
      userData: "#!/bin/sh\n",
    });
    const page = await (await get(`/console/tenants/${tenant}`, cookie)).text();
    expect(page).toContain(
      `<tr data-quota="${pool}"><th scope="row">${pool}</th><td>1 / 3</td><td>1 / 4</td><td>128 / 512 MiB</td><td>1 / 10 GiB</td></tr>`,
    );
    expect(page).toContain(`href="/console/instances?tenant=${tenant}"`);
    const list = await (await get("/console/tenants", cookie)).text();
    expect(list).toMatch(
      new RegExp(`data-tenant="${tenant}">.*?<td>Ops tenant</td><td>0</td><td><a [^>]*>1</a></td><td>${pool}: 1 / 3</td>`),
    );
    // The instances page filtered by the tenant: its instance, no other tenant's.
    const instances = await (await get(`/console/instances?tenant=${tenant}`, cookie)).text();
    expect(instances).toContain(`data-instance="${instance.id}"`);
    expect(instances.match(/data-instance="/g)).toHaveLength(1);
    expect(instances).toContain(`Instances of tenant ${tenant}`);
  });

  it("refuses a tenant's session these pages and their actions with the API's 403", async () => {
    const tenant = await signIn(await client.mintKey(["vps-tenant"]));
    for (const [path, method] of [
      ["/console/sites", "metal.sites.list"],
      ["/console/hosts", "capacity.hosts.list"],
      [`/console/hosts/h-console-${run}`, "capacity.hosts.get"],
      ["/console/tenants", "vps.tenants.list"],
      [`/console/tenants/ops-${run}`, "vps.tenants.get"],
      ["/console/sinks", "events.sinks.list"],
      [`/console/sites/tokens/0123456789abcdef/revoke`, "joinTokens.revoke"],
    ]) {
      const res = await get(path!, tenant.cookie);
      expect(res.status, path).toBe(403);
      const html = await res.text();
      expect(html, path).toContain(`may not ${method}`);
      expect(html, path).toContain(res.headers.get("x-request-id")!);
    }
    // Its own page's CSRF token does not make an operator's action its own.
    const csrf = csrfOf(await (await get("/console/sites", tenant.cookie)).text());
    const minted = await post("/console/sites/join-token", { role: "node", csrf }, tenant.cookie);
    expect(minted.status).toBe(403);
    const html = await minted.text();
    expect(html).toContain("may not joinTokens.create");
    expect(html).not.toMatch(TOKEN);
    expect(
      (
        await post(
          `/console/tenants/ops-${run}/quotas`,
          { pool: "x", instances: "9", vcpus: "9", memoryMiB: "9", diskGiB: "9", csrf },
          tenant.cookie,
        )
      ).status,
    ).toBe(403);
  });

  it("shows each sink's lag and its dead letters, replays one, and replays a sink's all after asking", async () => {
    // A deployment with a sink of its own (that takes everything), on the same database.
    const sinkId = `console-sink-${run}`;
    const delivered: unknown[] = [];
    const withSink = betterCompute({
      sinks: { events: [defineSink({ id: sinkId, kind: "events", deliver: async (batch) => void delivered.push(...batch) })] },
    });
    const sinkClient = await createTestClient(withSink, env);
    try {
      // Three events the sink refused for good, as the dispatcher leaves them.
      await sinkClient.store.db.execute(sql`
        INSERT INTO bc_sink_dead_letters (sink, source, position, record_id, attempts, last_error)
        SELECT ${sinkId}, 'events', outbox_seq, id, 5, 'the receiver answered 503' FROM bc_events
        WHERE outbox_seq IS NOT NULL ORDER BY outbox_seq DESC LIMIT 3`);
      const request = (path: string, init: RequestInit = {}) => sinkClient.request(path, init);
      const signedIn = await request("/console/session", { method: "POST", body: new URLSearchParams({ key: sinkClient.key }) });
      const cookie = /^(bc_session=[^;]+)/.exec(signedIn.headers.get("set-cookie")!)![1]!;
      const page = await (await request("/console/sinks", { headers: { cookie } })).text();
      expect(page).toContain(`data-sink="${sinkId}"`);
      expect(page).toMatch(new RegExp(`data-sink="${sinkId}">.*?<td>events</td><td>\\d+ rows</td>`));
      expect(page).toContain(`Replay the 3 dead letters of ${sinkId}`);
      const ids = [...page.matchAll(/data-dead-letter="(\d+)"/g)].map((m) => m[1]!);
      expect(ids).toHaveLength(3);
      expect(page).toContain("the receiver answered 503");

      const form = (fields: Record<string, string>) => ({ method: "POST", body: new URLSearchParams(fields), headers: { cookie } });
      const csrf = csrfOf(page);
      expect((await request(`/console/sinks/dead-letters/${ids[0]}/replay`, form({}))).status).toBe(403); // no CSRF token
      const one = await request(`/console/sinks/dead-letters/${ids[0]}/replay`, form({ csrf }));
      expect(one.status).toBe(303);
      expect(delivered).toHaveLength(1);
      const confirm = await (await request(`/console/sinks/${sinkId}/replay`, { headers: { cookie } })).text();
      expect(confirm).toContain(`Replay its 2 dead letters to sink ${sinkId}?`);
      expect(delivered).toHaveLength(1); // asking re-sends nothing
      const all = await request(`/console/sinks/${sinkId}/replay`, form({ csrf }));
      expect(all.status).toBe(303);
      expect(delivered).toHaveLength(3);
      const open = await sinkClient.call("events.deadLetters.list", { sink: sinkId });
      expect(open.body.deadLetters).toEqual([]);
      const after = await (await request("/console/sinks", { headers: { cookie } })).text();
      expect(after).toContain("No dead letters: every sink took everything it was sent");
    } finally {
      await sinkClient.close();
    }
  });
});

describe("the console with SSO and quorum approvals", () => {
  // A deployment of its own: bearer JWTs from an identity provider beside API keys, and approvers
  // 2-of-3 (docs/quorum.md), with a profile whose one step declares a destructive kind.
  const issuer = "https://idp.console.test";
  const audience = "better-compute";
  const approvalProfile = definePlugin({
    id: "console-approvals",
    extensions: [
      defineStep({
        id: "consoleTest.powerCycle",
        runsOn: "control-plane",
        sends: ["metal.bmc.power"],
        input: z.object({}),
        run: async () => ({}),
      }),
    ],
    profiles: [defineProfile({ id: "console-test.cycle", target: "metal", steps: [{ step: "consoleTest.powerCycle" }] })],
  });
  let sso: TestClient;
  let token: (claims: Record<string, unknown>, expiresIn?: string, key?: CryptoKey) => Promise<string>;
  let stranger: CryptoKey;
  const approvers: { publicKey: string; privateKey: CryptoKey }[] = [];
  const b64url = (bytes: ArrayBuffer) =>
    btoa(String.fromCharCode(...new Uint8Array(bytes)))
      .replace(/\+/g, "-")
      .replace(/\//g, "_")
      .replace(/=+$/, "");
  const signDigest = async (who: { privateKey: CryptoKey }, digest: string) =>
    b64url(await crypto.subtle.sign({ name: "Ed25519" }, who.privateKey, new TextEncoder().encode(`bc-approve-v1\n${digest}`)));
  const quorumMachine = `m-quorum-${run}`;
  const ssoGet = (path: string, cookie?: string) => sso.request(path, { headers: cookie ? { cookie } : {} });
  const ssoPost = (path: string, fields: Record<string, string>, cookie?: string) =>
    sso.request(path, { method: "POST", body: new URLSearchParams(fields), headers: cookie ? { cookie } : {} });
  const ssoSignIn = async (key: string) => {
    const res = await ssoPost("/console/session", { key });
    expect(res.status, await res.clone().text()).toBe(303);
    const setCookie = res.headers.get("set-cookie")!;
    const id = /^bc_session=([^;]+)/.exec(setCookie)![1]!;
    return { cookie: `bc_session=${id}`, id, setCookie };
  };

  beforeAll(async () => {
    const idp = await generateKeyPair("ES256");
    stranger = (await generateKeyPair("ES256")).privateKey;
    const jwk = { ...(await exportJWK(idp.publicKey)), kid: "idp-1", alg: "ES256" };
    token = (claims, expiresIn = "5m", key = idp.privateKey) =>
      new SignJWT(claims)
        .setProtectedHeader({ alg: "ES256", kid: "idp-1" })
        .setIssuer(issuer)
        .setAudience(audience)
        .setSubject("alice")
        .setIssuedAt()
        .setExpirationTime(expiresIn)
        .sign(key);
    for (let i = 0; i < 3; i++) {
      const pair = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
      approvers.push({
        publicKey: b64url((await crypto.subtle.exportKey("raw", pair.publicKey)) as ArrayBuffer),
        privateKey: pair.privateKey,
      });
    }
    const deployment = betterCompute({
      modules: [provisionModule(), metalModule()],
      plugins: [approvalProfile],
      iam: builtinIam({ jwt: { issuer, audience, jwks: { keys: [jwk] } } }),
      pki: { approvers: { keys: approvers.map((a) => a.publicKey), threshold: 2 } },
    });
    sso = await createTestClient(deployment, env);
    const ok = async (name: string, input: Record<string, unknown>) => {
      const res = await sso.call(name, input);
      expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(200);
      return res.body;
    };
    await ok("metal.sites.create", { id: `quorum-${run}` });
    await ok("metal.pools.create", { id: `quorum-${run}-pool`, site: `quorum-${run}`, policy: { hardwareProfile: "redfish-pxe" } });
    await ok("metal.enroll", {
      id: quorumMachine,
      pool: `quorum-${run}-pool`,
      bmc: { address: `https://192.0.2.79/redfish/v1/Systems/${run}`, username: "admin", password: "console-bmc-password" },
    });
  });
  afterAll(() => sso?.close());

  it("signs in with an SSO bearer token (a JWT) instead of an API key: a session no longer than the token, the token nowhere", async () => {
    const jwt = await token({ roles: ["admin"] }, "10m");
    const { cookie, id, setCookie } = await ssoSignIn(jwt);
    const maxAge = Number(/; Max-Age=(\d+)/.exec(setCookie)![1]);
    expect(maxAge).toBeGreaterThan(500);
    expect(maxAge).toBeLessThanOrEqual(600); // the token's ten minutes, not the session's twelve hours
    expect(setCookie).not.toContain(jwt);
    const { rows } = await sso.store.db.execute(
      sql`SELECT principal, expires_at < compute_now() + interval '11 minutes' AS capped FROM bc_console_sessions WHERE id_sha256 = ${await sha256Hex(id)}`,
    );
    expect(rows).toEqual([{ principal: "jwt:alice", capped: true }]);
    const fleet = await ssoGet("/console/fleet", cookie);
    expect(fleet.status).toBe(200);
    const html = await fleet.text();
    expect(html).toContain('Signed in as <span class="mono">jwt:alice</span>');
    expect(html).toContain(quorumMachine);
    expect(html).not.toContain(jwt);
    expect(html).toContain('href="/console/approvals"'); // approvers are set here
    // The default deployment has none: no Approvals page in its navigation.
    const plain = await signIn(client.key);
    expect(await (await get("/console/fleet", plain.cookie)).text()).not.toContain('href="/console/approvals"');

    // A token another key signed, or an expired one, is refused like a wrong key, and not echoed.
    for (const bad of [await token({ roles: ["admin"] }, "5m", stranger), await token({ roles: ["admin"] }, "-1m")]) {
      const res = await ssoPost("/console/session", { key: bad });
      expect(res.status).toBe(401);
      expect(res.headers.get("set-cookie")).toBeNull();
      const page = await res.text();
      expect(page).toContain("the bearer token did not verify");
      expect(page).not.toContain(bad);
    }
  });

  it("lists a workflow awaiting approval, on its page and its machine's; an approval posted with the CSRF token is recorded through workflows.approve", async () => {
    const started = await sso.call("workflows.start", { profile: "console-test.cycle", target: quorumMachine });
    expect(started.status, JSON.stringify(started.body)).toBe(200);
    const workflow = started.body.id as string;
    const { cookie } = await ssoSignIn(await token({ roles: ["admin"] }));

    const list = await (await ssoGet("/console/approvals", cookie)).text();
    expect(list).toContain(`data-workflow="${workflow}"`);
    expect(list).toMatch(new RegExp(`data-workflow="${workflow}"[\\s\\S]*?metal\\.bmc\\.power[\\s\\S]*?0 of 2 approvals`));
    expect(list).toContain(`href="/console/machines/${quorumMachine}"`);

    const machinePage = await (await ssoGet(`/console/machines/${quorumMachine}`, cookie)).text();
    expect(machinePage).toContain("Awaits approval");
    expect(machinePage).toContain("0 of 2 approvals");
    expect(machinePage).toContain(`href="/console/workflows/${workflow}/approve"`);
    // Never inspected (its site has no agent): the hardware section's empty state.
    expect(machinePage).toContain("Not inspected yet: inspection runs during commissioning.");

    const path = `/console/workflows/${workflow}/approve`;
    const page = await (await ssoGet(path, cookie)).text();
    const { body: wf } = await sso.call("workflows.get", { id: workflow });
    expect(wf.state).toBe("awaiting-approval");
    const digest = wf.quorum.digest as string;
    expect(page).toContain(digest);
    expect(page).toContain('name="signature"');
    expect(page).toContain("openssl pkeyutl -sign -rawin -inkey approver.pem -in batch.txt"); // docs/quorum.md's, with the digest
    const csrf = csrfOf(page);
    const [first, second] = approvers;
    const fields = { key: first!.publicKey, signature: await signDigest(first!, digest) };

    // Without the CSRF token: refused before workflows.approve runs.
    expect((await ssoPost(path, fields, cookie)).status).toBe(403);
    // A signature by another approver's key: the API refuses it, and the page says why.
    const forged = await ssoPost(path, { ...fields, signature: await signDigest(second!, digest), csrf }, cookie);
    expect(forged.status).toBe(403);
    expect(await forged.text()).toContain("the signature does not verify");
    const none = await sso.store.db.execute(sql`SELECT count(*)::int AS n FROM workflow_approvals WHERE workflow_id = ${workflow}`);
    expect(none.rows).toEqual([{ n: 0 }]);

    const res = await ssoPost(path, { ...fields, csrf }, cookie);
    expect(res.status, await res.clone().text()).toBe(303);
    expect(res.headers.get("location")).toBe(`${path}?counted=yes`);
    const after = await sso.call("workflows.get", { id: workflow });
    expect(after.body).toMatchObject({ state: "awaiting-approval", quorum: { approvals: [first!.publicKey], threshold: 2 } });
    const recorded = await sso.store.db.execute(sql`SELECT approver, recorded_by FROM workflow_approvals WHERE workflow_id = ${workflow}`);
    expect(recorded.rows).toEqual([{ approver: first!.publicKey, recorded_by: "jwt:alice" }]);
    const { body: audit } = await sso.call("audit.list", { resource: `workflows/${workflow}`, action: "workflows.approve" });
    expect(audit.entries).toEqual([expect.objectContaining({ actor: "jwt:alice", requestId: res.headers.get("x-request-id") })]);
    const done = await (await ssoGet(`${path}?counted=yes`, cookie)).text();
    expect(done).toContain("Your approval was counted: 1 of 2 approvals.");
    expect(done).toContain(first!.publicKey);

    // A viewer sees the batch but is not offered the form (it may not workflows.approve).
    const viewer = await ssoSignIn(await token({ roles: ["viewer"] }));
    const viewed = await (await ssoGet(path, viewer.cookie)).text();
    expect(viewed).toContain(digest);
    expect(viewed).not.toContain('name="signature"');
  });
});
