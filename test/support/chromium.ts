// Debian's Chromium driven by playwright-core, with axe-core in every page: what the browser tests
// of the web console share (test/node/console-browser.test.ts against `npm run dev`, the quorum
// test against its in-process control plane).
import fs from "node:fs";
import { createRequire } from "node:module";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";
import { expect } from "vitest";

export const CHROMIUM = "/usr/bin/chromium";
/** Why the browser tests skip here, if they do. */
export const chromiumMissing = fs.existsSync(CHROMIUM)
  ? undefined
  : `${CHROMIUM} is missing (apt-get install --no-install-recommends chromium fonts-liberation)`;

const axeSource = fs.readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** Chromium that resolves no name but localhost: a page cannot reach anything off this machine. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ["--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"],
  });
}

/** A browser context whose pages carry axe-core before their own scripts (the CSP rightly refuses an injected <script>). */
export async function axeContext(browser: Browser): Promise<BrowserContext> {
  const context = await browser.newContext();
  await context.addInitScript({ content: axeSource });
  return context;
}

/** axe-core's serious and critical findings on the page as it is now. */
export async function seriousViolations(page: Page): Promise<{ id: string; impact: string; nodes: string[] }[]> {
  const violations = await page.evaluate(async () => {
    const win = globalThis as any; // the browser's window: this function runs there
    const found = await win.axe.run(win.document, { resultTypes: ["violations"] });
    return found.violations.map((v: any) => ({ id: v.id, impact: v.impact, nodes: v.nodes.map((n: any) => n.target.join(" ")) }));
  });
  return violations.filter((v: { impact: string }) => v.impact === "serious" || v.impact === "critical");
}

/** The id of the focused element (runs in the browser). */
const focusedId = () => (globalThis as any).document.activeElement?.id as string | undefined;

/** Signs in to the console by keyboard, as a person would: Tab to the key field, type it, Enter. */
export async function signIn(page: Page, url: string, key: string, beforeTyping?: () => Promise<void>): Promise<void> {
  await page.goto(`${url}/console/sign-in`);
  await beforeTyping?.();
  for (let i = 0; i < 6 && (await page.evaluate(focusedId)) !== "key"; i++) await page.keyboard.press("Tab");
  expect(await page.evaluate(focusedId)).toBe("key");
  await page.keyboard.type(key);
  await page.keyboard.press("Enter");
  await page.waitForURL((u) => !u.pathname.endsWith("/sign-in"));
  expect(new URL(page.url()).pathname, await page.locator("main").innerText()).not.toBe("/console/session");
}
