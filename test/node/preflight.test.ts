// npm start and npm run dev run scripts/preflight.mjs first: a Node.js older than 22.12 is refused
// in one line before tsx or wrangler start.
import { spawnSync } from "node:child_process";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../../local/node-store.ts";

const preflight = path.join(repoRoot, "scripts", "preflight.mjs");
// Loaded by URL: the script is plain .mjs without type declarations.
const { nodeVersionProblem } = (await import(pathToFileURL(preflight).href)) as { nodeVersionProblem(version: string): string | undefined };

/** Runs the preflight on this Node, made to report another version (no older Node needed). */
function runAs(version: string) {
  const fake = `data:text/javascript,Object.defineProperty(process.versions,"node",{value:${JSON.stringify(version)}})`;
  return spawnSync(process.execPath, ["--import", fake, preflight], { encoding: "utf8" });
}

describe("the Node.js preflight", () => {
  it("refuses versions older than 22.12 and lets newer ones through", () => {
    for (const old of ["22.11.0", "22.0.0", "20.18.1", "18.20.4", "21.99.99"]) {
      expect(nodeVersionProblem(old), old).toBe(`Better Compute needs Node.js 22.12 or newer; this is v${old}`);
    }
    for (const fine of ["22.12.0", "22.12.1", "22.20.0", "23.0.0", "24.11.1"]) expect(nodeVersionProblem(fine), fine).toBeUndefined();
  });

  it("prints that one line and exits 1 on an old Node, and nothing on this one", () => {
    const old = runAs("20.11.1");
    expect(old.status).toBe(1);
    expect(old.stdout).toBe("");
    expect(old.stderr).toBe("Better Compute needs Node.js 22.12 or newer; this is v20.11.1\n");

    const current = spawnSync(process.execPath, [preflight], { encoding: "utf8" });
    expect(current.status).toBe(0);
    expect(current.stdout + current.stderr).toBe("");
  });
});
