// The web console in a real browser (Debian's Chromium, driven by playwright-core) against
// `npm run dev`: signing in with the admin key (by keyboard), the fleet filling up and the three
// simulated machines reaching ready live, a machine deployed from its page with its workflow's
// steps completing live, undeployed after a confirmation, both found in the audit log; its serial
// console's empty state, retire's confirmation, the fleet searched. A tenant signs in to its own
// instances (another tenant's not among them) and creates one. Then the security checks: a
// tenant's session refused an operator page, a POST without the CSRF token
// refused, no key, password, session id or token in any page's HTML, in cookies other than the
// opaque session id, in the browser's storage or in the stack's log lines; no CSP violation; and
// axe-core on every page: no serious or critical violation. A screenshot of each page is written
// to test-output/console/ (or $BC_CONSOLE_SCREENSHOTS), named as docs/console.md lists them;
// BC_CONSOLE_README_SHOT=docs/images/console-fleet.png writes the README's picture too. A machine's
// page shows the hardware commissioning found. Then GET /metrics of the same stack (done-when 5 of
// issue 33), read by Prometheus' own parser: its machines by state are metal.nodes.list's, and a key
// without metrics.read is refused.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawnSync } from "node:child_process";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, expect, it, onTestFailed } from "vitest";
import { freePort } from "../../local/stack.ts";
import { repoRoot } from "../../local/node-store.ts";
import { SIM_BMC_PASSWORD } from "../../testing/metal-sim.ts";
import { NpmRunDev } from "../support/npm-run-dev.ts";
import {
  axeContext,
  chromiumMissing as missing,
  launchChromium,
  seriousViolations,
  signIn as signInByKeyboard,
} from "../support/chromium.ts";

if (missing) console.warn(`console-browser: skipped: ${missing}`);

const shots = process.env.BC_CONSOLE_SCREENSHOTS ?? path.join(repoRoot, "test-output", "console");
const baseDir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-console-"));
let dev: NpmRunDev | undefined;
let browser: Browser | undefined;

beforeAll(() => fs.mkdirSync(shots, { recursive: true }));
afterAll(async () => {
  await browser?.close();
  await dev?.interrupt();
  fs.rmSync(baseDir, { recursive: true, force: true });
});

/** Everything the browser was served, kept to look for secrets at the end. */
const served: string[] = [];
/** Console errors (a CSP violation is one) and uncaught page errors. */
const problems: string[] = [];
/** Every page opened, to show where each was should the test fail. */
const opened: Page[] = [];

function watch(page: Page): Page {
  opened.push(page);
  page.on("console", (m) => void (m.type() === "error" && problems.push(`${page.url()}: ${m.text()}`)));
  page.on("pageerror", (e) => problems.push(`${page.url()}: ${e.message}`));
  page.on("response", async (res) => {
    if (!res.url().includes("/console") || res.status() === 303 || (res.headers()["content-type"] ?? "").includes("event-stream")) return;
    served.push(await res.text().catch(() => ""));
  });
  return page;
}

/** A screenshot under its docs name, and axe-core's serious and critical findings on the page as it is. */
async function look(page: Page, name: string): Promise<void> {
  // A live page is shown once its event stream is open (the script then says so).
  if (await page.locator("#live-status").count())
    await page.locator("#live-status", { hasText: /^(Live|Updates paused)/ }).waitFor({ timeout: 10_000 });
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
  served.push(await page.content());
  expect(await seriousViolations(page), name).toEqual([]);
}

/** Signs in by keyboard alone: Tab to the key field, type, Enter. */
const signIn = (page: Page, url: string, key: string, shot?: string) =>
  signInByKeyboard(page, url, key, shot ? () => look(page, shot) : undefined);

it.skipIf(missing !== undefined)(
  "an operator watches the machines reach ready, deploys and undeploys one, finds it in the audit log; a tenant is refused; nothing secret leaks",
  async () => {
    const started = Date.now();
    onTestFailed(async () => {
      for (const [i, open] of opened.entries()) {
        await open.screenshot({ path: path.join(shots, `failure-${i}.png`), fullPage: true }).catch(() => {});
        console.error(
          `console-browser: page ${i} at ${open.url()}:\n${await open
            .locator("main")
            .innerText()
            .catch(() => "?")}`,
        );
      }
      const tail = (dev?.output ?? "").split("\n").filter((line) => !/admin API key/.test(line));
      console.error(`console-browser: npm run dev's last lines:\n${tail.slice(-40).join("\n")}`);
    });
    const port = await freePort();
    dev = new NpmRunDev([], { PORT: String(port), BC_DATA_DIR: baseDir, DATABASE_URL: "" });
    browser = await launchChromium();

    // The stack answers (local.json is written) before the simulated site enrolls its machines.
    const localFile = path.join(baseDir, "dev", "local.json");
    await expect.poll(() => fs.existsSync(localFile) || !dev!.running, { timeout: 120_000, interval: 250 }).toBe(true);
    expect(dev.running, dev.output).toBe(true);
    const { url, adminKey } = JSON.parse(fs.readFileSync(localFile, "utf8")) as { url: string; adminKey: string };

    const operator = await axeContext(browser);
    const page = watch(await operator.newPage());
    await signIn(page, url, adminKey, "sign-in");
    expect(new URL(page.url()).pathname).toBe("/console/fleet");

    // The fleet fills up and reaches ready with no navigation: only the live region changes.
    let navigations = 0;
    page.on("framenavigated", (frame) => void (frame === page.mainFrame() && navigations++));
    const early = await page.locator("#live").innerText();
    if (/No machines yet/.test(early)) await look(page, "fleet-empty");
    const banner = await dev.waitFor(/Press Ctrl-C to stop\./, 120_000, "its banner");
    expect(banner).toBeTruthy();
    expect(dev.output).toContain(`web console: ${url}/console/`);
    const ready = page.locator("#live tr[data-machine] .state-ready");
    await expect.poll(() => ready.count(), { timeout: 90_000, interval: 500 }).toBe(3);
    expect(navigations).toBe(0);
    await look(page, "fleet");
    // The README's picture (docs/console.md says how to make it again): a laptop's window, not the whole page.
    const readmeShot = process.env.BC_CONSOLE_README_SHOT;
    if (readmeShot) {
      await page.setViewportSize({ width: 1280, height: 800 });
      await page.screenshot({ path: path.resolve(repoRoot, readmeShot) });
      expect(fs.statSync(path.resolve(repoRoot, readmeShot)).size).toBeLessThan(200_000);
    }
    await page.setViewportSize({ width: 390, height: 844 });
    await page.screenshot({ path: path.join(shots, "fleet-phone.png"), fullPage: true });
    await page.setViewportSize({ width: 1280, height: 720 });

    // A machine's page; deploy it with the profile and input the banner suggests.
    const deploy = /metal deploy (\S+) --profile (\S+) --input '([^']+)'/.exec(dev.output)!;
    const [, node, profile, input] = deploy;
    await page.click(`a[href="/console/machines/${node}"]`);
    await page.waitForURL(`**/console/machines/${node}`);
    await page.locator("#live-status", { hasText: "Live" }).waitFor();
    // What commissioning found: the simulated BMC's system summary and the disk its ramdisk listed.
    expect(await page.locator("#hardware-fields").innerText()).toMatch(/2 × Simulated CPU \(64 threads\)[\s\S]*64 GiB/);
    expect(await page.locator("#live tr[data-disk]").count()).toBeGreaterThan(0);
    await look(page, "machine-ready");
    await page.selectOption("#profile", profile!);
    await page.fill("#input", input!);
    // The form posts and is redirected back to the same address: wait for that navigation.
    await Promise.all([page.waitForEvent("framenavigated"), page.click("#deploy")]);
    await page.waitForLoadState();
    navigations = 0;
    await page.locator('#machine-state[data-state="deployed"]').waitFor({ timeout: 60_000 });
    const steps = page.locator("#live tr[data-step]");
    expect(await steps.count()).toBeGreaterThan(3);
    await expect.poll(() => page.locator("#live tr[data-step] .state-succeeded").count(), { timeout: 10_000 }).toBe(await steps.count());
    expect(await page.locator("#live").innerText()).toMatch(/image\.write/);
    expect(navigations).toBe(0);
    await look(page, "machine-deployed");

    // Undeploy, after its confirmation page; the release runs live to ready.
    await page.click("#undeploy");
    await page.waitForURL(`**/console/machines/${node}/undeploy`);
    await look(page, "machine-undeploy-confirm");
    await page.click("#confirm");
    await page.waitForURL(`**/console/machines/${node}`);
    await page.locator('#machine-state[data-state="ready"]').waitFor({ timeout: 60_000 });
    await look(page, "machine-released");

    // The serial console: the simulated site's BMCs have none, and the page says so.
    await page.click("#serial-console");
    await page.waitForURL(`**/console/machines/${node}/console`);
    await Promise.all([page.waitForEvent("framenavigated"), page.click("#open-console")]);
    await page.waitForLoadState();
    expect(await page.locator("main").innerText()).toMatch(/No serial console: .*console/);
    await look(page, "machine-console");

    // Retiring asks first (cancelled here: the machine stays ready).
    await page.goto(`${url}/console/machines/${node}`);
    await page.click("#retire");
    await page.waitForURL(`**/console/machines/${node}/retire`);
    await look(page, "machine-retire-confirm");
    await page.click("text=Cancel");
    await page.waitForURL(`**/console/machines/${node}`);

    // The fleet, searched by id and filtered by state.
    await page.goto(`${url}/console/fleet`);
    await page.fill("#q", node!);
    await page.selectOption("#state", "ready");
    await Promise.all([page.waitForURL(/\/console\/fleet\?/), page.click('form[role="search"] button[type="submit"]')]);
    await expect.poll(() => page.locator("#live tr[data-machine]").count()).toBe(1);
    await look(page, "fleet-filtered");

    // The audit log, filtered: both operations, by this key, with their request ids.
    await page.goto(`${url}/console/audit`);
    await look(page, "audit");
    await page.fill("#resource", `metal/nodes/${node}`);
    await page.fill("#action", "metal.*");
    await page.click('form[role="search"] button[type="submit"]');
    await page.locator('#live tr[data-action="metal.undeploy"]').waitFor();
    await page.locator('#live tr[data-action="metal.deploy"]').waitFor();
    await look(page, "audit-filtered");

    // A POST without the CSRF token is refused, with the session cookie and all.
    const forged = await operator.request.post(`${url}/console/machines/${node}/maintenance`, {
      form: { on: "true", reason: "forged" },
      maxRedirects: 0,
    });
    expect(forged.status()).toBe(403);
    expect(await forged.text()).toContain("no valid CSRF token");

    // The session cookie: the only cookie, opaque, HttpOnly, Secure (kept on http://127.0.0.1), SameSite=Strict.
    const cookies = await operator.cookies();
    expect(cookies.map((c) => c.name)).toEqual(["bc_session"]);
    expect(cookies[0]).toMatchObject({ httpOnly: true, secure: true, sameSite: "Strict", path: "/" });
    const sessionId = cookies[0]!.value;
    expect(sessionId).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(await page.evaluate(() => [(globalThis as any).localStorage.length, (globalThis as any).sessionStorage.length])).toEqual([0, 0]);

    // Two tenants offered a host pool with no host (no QEMU needed: their instances stay pending).
    const api = async <T>(name: string, input: Record<string, unknown>, key = adminKey): Promise<T> => {
      const res = await fetch(`${url}/v1/${name}`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify(input),
      });
      const body = (await res.json()) as T;
      expect(res.status, `${name}: ${JSON.stringify(body)}`).toBe(200);
      return body;
    };
    await api("vps.pools.create", {
      id: "console-vms",
      class: "host",
      hosts: { labels: { "bc.dev/console": "test" } },
      runtime: "qemu-microvm",
    });
    await api("vps.flavors.create", { id: "console-small", pool: "console-vms", vcpus: 1, memoryMiB: 128, diskGiB: 1 });
    for (const id of ["acme", "globex"]) {
      await api("vps.tenants.create", { id, name: id });
      await api("vps.quotas.set", { tenant: id, pool: "console-vms", instances: 2, vcpus: 2, memoryMiB: 256, diskGiB: 2 });
    }
    const minted = await api<{ id: string; key: string }>("iam.apiKeys.create", { name: "console tenant", roles: ["vps-tenant"] });
    const tenantKey = minted.key;
    await api("vps.tenants.addMember", { tenant: "acme", principal: `apikey:${minted.id}` });
    await api(
      "vps.sshKeys.create",
      { name: "laptop", publicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop" },
      tenantKey,
    );
    const theirs = await api<{ id: string }>("vps.instances.create", {
      tenant: "globex",
      pool: "console-vms",
      flavor: "console-small",
      name: "globex-db",
      userData: "#!/bin/sh\n",
    });

    // The tenant signs in and lands on its (empty) instances; it creates one from the page.
    const tenant = await axeContext(browser);
    const tenantPage = watch(await tenant.newPage());
    await signIn(tenantPage, url, tenantKey);
    expect(new URL(tenantPage.url()).pathname).toBe("/console/instances");
    await look(tenantPage, "tenant-instances-empty");
    expect(await tenantPage.locator("header nav a").allInnerTexts()).toEqual(["Instances"]); // no link to a page it may not open
    await tenantPage.fill("#name", "web-1");
    await tenantPage.selectOption("#flavor", "console-small");
    await tenantPage.selectOption("#ssh-keys", ["laptop"]);
    await tenantPage.fill("#user-data", '#!/bin/sh\necho "hello from $(hostname)"\n');
    await Promise.all([tenantPage.waitForURL(/\/console\/instances\/i-/), tenantPage.click("#create-instance")]);
    await tenantPage.locator('#instance-state[data-state="pending"]').waitFor();
    expect(await tenantPage.locator("main").innerText()).toMatch(/is not on a host/);
    await look(tenantPage, "tenant-instance");
    const mine = new URL(tenantPage.url()).pathname.split("/").pop()!;
    await tenantPage.click("#delete");
    await tenantPage.waitForURL(`**/console/instances/${mine}/delete`);
    await look(tenantPage, "tenant-instance-delete-confirm");
    await tenantPage.click("text=Cancel");
    await tenantPage.goto(`${url}/console/instances`);
    expect(
      await tenantPage.locator("#live tr[data-instance]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-instance"))),
    ).toEqual([mine]);
    expect(await tenantPage.content()).not.toContain(theirs.id);
    await look(tenantPage, "tenant-instances");
    // The operator sees both.
    await page.goto(`${url}/console/instances`);
    await page.locator(`#live tr[data-instance="${theirs.id}"]`).waitFor();
    await look(page, "instances");

    // An operator page asked for with the tenant's session is refused.
    const refused = await tenantPage.goto(`${url}/console/fleet`);
    expect(refused!.status()).toBe(403);
    expect(await tenantPage.locator("main").innerText()).toMatch(/may not metal\.nodes\.list/);
    await look(tenantPage, "tenant-refused");
    const tenantSession = (await tenant.cookies())[0]!.value;

    // Signing out revokes the session: the old cookie no longer opens a page.
    await page.click('header button[type="submit"]');
    await page.waitForURL("**/console/sign-in");
    const replay = await fetch(`${url}/console/fleet`, { headers: { cookie: `bc_session=${sessionId}` }, redirect: "manual" });
    expect(replay.status).toBe(303);

    // No credential anywhere it should not be. The CSRF tokens are in the pages by design; the
    // banner line that prints the admin key is the one place it belongs.
    const secrets = { adminKey, tenantKey, sessionId, tenantSession, bmcPassword: SIM_BMC_PASSWORD };
    const html = served.join("\n");
    const logs = dev.output
      .split("\n")
      .filter((line) => !/admin API key/.test(line))
      .join("\n");
    for (const [name, secret] of Object.entries(secrets)) {
      expect(html.includes(secret), `${name} in a page`).toBe(false);
      expect(logs.includes(secret), `${name} in the stack's log lines`).toBe(false);
    }
    // A CSP violation or a script error would be here; a 403 page's own status is logged by Chromium too.
    expect(problems.filter((p) => !/Failed to load resource: the server responded with a status of 403/.test(p))).toEqual([]);
    console.log(`console-browser: screenshots in ${shots}; ${((Date.now() - started) / 1000).toFixed(1)} s`);
  },
  240_000,
);

/**
 * The stack the first test started; a stack of its own when a later test runs alone (or the
 * first one's stopped): its URL, admin key and an API call that expects a 200.
 */
async function devStack() {
  const localFile = path.join(baseDir, "dev", "local.json");
  if (!dev?.running) {
    fs.rmSync(localFile, { force: true });
    dev = new NpmRunDev([], { PORT: String(await freePort()), BC_DATA_DIR: baseDir, DATABASE_URL: "" });
  }
  await dev.waitFor(/Press Ctrl-C to stop\./, 180_000, "its banner");
  const { url, adminKey } = JSON.parse(fs.readFileSync(localFile, "utf8")) as { url: string; adminKey: string };
  const api = async <T>(name: string, input: Record<string, unknown>): Promise<T> => {
    const res = await fetch(`${url}/v1/${name}`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      body: JSON.stringify(input),
    });
    const body = (await res.json()) as T;
    expect(res.status, `${name}: ${JSON.stringify(body)}`).toBe(200);
    return body;
  };
  return { url, adminKey, api };
}

/** Debian's python3-prometheus-client, the Prometheus project's own OpenMetrics parser (.ci/run installs it). */
const PYTHON = "/usr/bin/python3";
const metricsParser = spawnSync(PYTHON, ["-c", "import prometheus_client.openmetrics.parser"]).status === 0;
if (!metricsParser) console.warn("console-browser: the /metrics test is skipped: apt-get install python3-prometheus-client");

it.skipIf(missing !== undefined || !metricsParser)(
  "GET /metrics of the dev stack, read by Prometheus' parser, counts its machines by state as metal.nodes.list does; a key without metrics.read is refused",
  async () => {
    const { url, adminKey, api } = await devStack();
    type Node = { site: string; pool: string; state: string };
    const byState = async () => {
      const { nodes } = await api<{ nodes: Node[] }>("metal.nodes.list", {});
      const counts: Record<string, number> = {};
      for (const n of nodes.filter((n) => n.state !== "retired"))
        counts[`${n.site}/${n.pool}/${n.state}`] = (counts[`${n.site}/${n.pool}/${n.state}`] ?? 0) + 1;
      return counts;
    };
    // Its three machines ready: the first test waited for it; alone, this one does.
    await expect
      .poll(
        async () =>
          Object.entries(await byState())
            .filter(([k]) => k.endsWith("/ready"))
            .reduce((n, [, v]) => n + v, 0),
        {
          timeout: 120_000,
          interval: 1000,
        },
      )
      .toBe(3);

    const mint = async (roles: string[]) => (await api<{ key: string }>("iam.apiKeys.create", { name: `console-${roles[0]}`, roles })).key;
    const metricsKey = await mint(["metrics"]);
    const scrape = async (key?: string) =>
      fetch(`${url}/metrics`, {
        headers: { accept: "application/openmetrics-text; version=1.0.0", ...(key ? { authorization: `Bearer ${key}` } : {}) },
      });
    /** bc_metal_machines as Prometheus' parser reads it: site/pool/state → machines, the zero series left out. */
    const scraped = async () => {
      const res = await scrape(metricsKey);
      expect(res.status).toBe(200);
      const parsed = spawnSync(PYTHON, [path.join(repoRoot, "test", "support", "openmetrics-parse.py")], {
        input: await res.text(),
        encoding: "utf8",
      });
      expect(parsed.status, parsed.stderr).toBe(0);
      const families = JSON.parse(parsed.stdout) as { name: string; samples: { labels: Record<string, string>; value: number }[] }[];
      const machines = families.find((f) => f.name === "bc_metal_machines");
      expect(machines, "the bc_metal_machines family").toBeDefined();
      return Object.fromEntries(
        machines!.samples.filter((s) => s.value > 0).map((s) => [`${s.labels.site}/${s.labels.pool}/${s.labels.state}`, s.value]),
      );
    };
    const sorted = (r: Record<string, number>) => JSON.stringify(Object.entries(r).sort(([a], [b]) => a.localeCompare(b)));
    // The API read before and after the scrape agree (nothing moved meanwhile), and the scrape says what they say.
    await expect
      .poll(
        async () => {
          const before = await byState();
          const metrics = await scraped();
          const after = await byState();
          return sorted(before) === sorted(after) ? { api: sorted(before), metrics: sorted(metrics) } : "moving";
        },
        { timeout: 30_000, interval: 500 },
      )
      .toSatisfy((r) => typeof r === "object" && r.api === r.metrics);
    expect(Object.values(await scraped()).reduce((n, v) => n + v, 0)).toBeGreaterThanOrEqual(3);

    // Without metrics.read (a VPS tenant's key), refused in the API's error shape; without a key, 401.
    const refused = await scrape(await mint(["vps-tenant"]));
    expect(refused.status).toBe(403);
    expect(await refused.json()).toMatchObject({ code: "PERMISSION_DENIED", details: { action: "metrics.read" } });
    expect((await scrape()).status).toBe(401);
  },
  240_000,
);

it.skipIf(missing !== undefined)(
  "an operator opens sites and join tokens (a new token shown once, then revoked), hosts, tenants and a tenant's page, and sinks",
  async () => {
    const mine: Page[] = [];
    onTestFailed(async () => {
      for (const [i, open] of mine.entries()) {
        await open.screenshot({ path: path.join(shots, `failure-operator-${i}.png`), fullPage: true }).catch(() => {});
        console.error(
          `console-browser: page at ${open.url()}:\n${await open
            .locator("main")
            .innerText()
            .catch(() => "?")}`,
        );
      }
    });
    browser ??= await launchChromium();
    const { url, adminKey, api } = await devStack();

    const context = await axeContext(browser);
    const page = watch(await context.newPage());
    mine.push(page);
    await signIn(page, url, adminKey);

    // Sites and tokens, reached from the navigation by keyboard.
    const focusedHref = () => (globalThis as any).document.activeElement?.getAttribute("href") as string | null;
    for (let i = 0; i < 12 && (await page.evaluate(focusedHref)) !== "/console/sites"; i++) await page.keyboard.press("Tab");
    expect(await page.evaluate(focusedHref)).toBe("/console/sites");
    await Promise.all([page.waitForURL("**/console/sites"), page.keyboard.press("Enter")]);
    expect(await page.locator("header nav a").allInnerTexts()).toEqual(
      expect.arrayContaining(["Fleet", "Instances", "Audit log", "Sites", "Hosts", "Tenants", "Sinks"]),
    );
    await page.locator('#live tr[data-site="dev"]').waitFor();
    await look(page, "sites");

    // A node join token: shown on the answer to its POST, not cached, and in no page after it.
    await page.selectOption("#token-role", "node");
    await page.fill("#token-labels", "bc.dev/pool=console\nrack=r1");
    const [answer] = await Promise.all([
      page.waitForResponse((r) => r.url().endsWith("/console/sites/join-token") && r.request().method() === "POST"),
      page.click("#create-join-token"),
    ]);
    expect(answer.status()).toBe(200);
    expect(answer.headers()["cache-control"]).toBe("no-store");
    await page.waitForURL("**/console/sites/join-token");
    const token = await page.inputValue("#new-token");
    const [, id, secret] = /^bcj_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/.exec(token)!;
    expect((await page.content()).split(secret!).length - 1).toBe(1);
    await look(page, "sites-token-created");
    await Promise.all([page.waitForURL("**/console/sites"), page.click("#back-to-sites")]);
    const row = page.locator(`#live tr[data-token="${id}"]`);
    await row.waitFor();
    expect(await row.innerText()).toContain(`bcj_${id}_…`);
    expect(await page.content()).not.toContain(secret);
    await page.reload();
    expect(await page.content()).not.toContain(secret);
    // Revoked, after its confirmation page.
    await page.click(`#live tr[data-token="${id}"] a`);
    await page.waitForURL(`**/console/sites/tokens/${id}/revoke`);
    await Promise.all([page.waitForURL("**/console/sites"), page.click("#confirm")]);
    await page.locator(`#live tr[data-token="${id}"] .state-revoked`).waitFor();
    expect(await page.content()).not.toContain(secret);

    // Hosts: the simulated site has none (its agent is a site agent, not a host); the page says how one joins.
    await page.goto(`${url}/console/hosts`);
    const hosts = await page.locator("#live").innerText();
    if (!/data-host/.test(await page.locator("#live").innerHTML())) expect(hosts).toMatch(/No hosts yet/);
    await look(page, "hosts");

    // Tenants: the first test's two (made again here, idempotently, when it did not run).
    await api("vps.pools.create", {
      id: "console-vms",
      class: "host",
      hosts: { labels: { "bc.dev/console": "test" } },
      runtime: "qemu-microvm",
    });
    for (const tenant of ["acme", "globex"]) {
      await api("vps.tenants.create", { id: tenant, name: tenant });
      await api("vps.quotas.set", { tenant, pool: "console-vms", instances: 2, vcpus: 2, memoryMiB: 256, diskGiB: 2 });
    }
    await page.goto(`${url}/console/tenants`);
    await page.locator('#live tr[data-tenant="globex"]').waitFor();
    await look(page, "tenants");
    await Promise.all([page.waitForURL("**/console/tenants/acme"), page.click('a[href="/console/tenants/acme"]')]);
    // A quota set from its form (to four instances: the page shows it at once).
    await page.selectOption("#quota-pool", "console-vms");
    for (const [field, value] of [
      ["#quota-instances", "4"],
      ["#quota-vcpus", "4"],
      ["#quota-memory", "512"],
      ["#quota-disk", "4"],
    ] as const)
      await page.fill(field, value);
    await Promise.all([page.waitForEvent("framenavigated"), page.click("#set-quota-button")]);
    await page.waitForLoadState();
    expect(await page.locator('#live tr[data-quota="console-vms"]').innerText()).toMatch(/\/ 4\s+\S+ \/ 4\s+\S+ \/ 512 MiB/);
    await look(page, "tenant");
    await Promise.all([page.waitForURL(/\/console\/instances\?tenant=acme$/), page.click("#tenant-instances")]);
    expect(await page.locator("h1").innerText()).toBe("Instances of tenant acme");

    // Sinks: the default deployment registers none, and the page says where one is added.
    await page.goto(`${url}/console/sinks`);
    expect(await page.locator("#live").innerText()).toMatch(/No sinks\. .*better-compute\.config\.ts.*docs\/sinks\.md/s);
    await look(page, "sinks");

    // No CSP violation or script error on these pages either.
    expect(problems.filter((p) => !/Failed to load resource: the server responded with a status of 403/.test(p))).toEqual([]);
    await context.close();
  },
  300_000,
);
