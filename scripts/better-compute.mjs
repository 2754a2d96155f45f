#!/usr/bin/env node
// better-compute: `start` and `dev` run the local stack (as npm start and npm run dev: with the
// simulated site), `bmc-emulator` a simulated BMC, `doctor` checks a deployment where it is
// configured: each through tsx, as they load TypeScript (the stack, the deployment's config).
// Every API command is the CLI in cli/ (see docs/cli.md), run from its prebuilt bundle
// (cli/bundle.mjs): plain Node, no TypeScript compiled on the way.
import { pathToFileURL } from "node:url";
import { nodeVersionProblem } from "./preflight.mjs";
import { runTs } from "../agent/run-ts.mjs";
import { buildBundle, currentBundle } from "../cli/bundle.mjs";

const problem = nodeVersionProblem(process.versions.node);
if (problem) {
  console.error(problem);
  process.exit(1);
}
const [command, ...args] = process.argv.slice(2);
if (command === "start") runTs("scripts/start.ts", args);
else if (command === "dev") runTs("scripts/start.ts", ["--site", ...args]);
else if (command === "bmc-emulator") runTs("scripts/bmc-emulator.ts", args);
else if (command === "doctor") runTs("cli/doctor.ts", args);
else await runCli();

/** cli/main.ts from its bundle, built first when missing or stale; from source with tsx when it cannot be built. */
async function runCli() {
  let bundle = currentBundle();
  if (!bundle) {
    try {
      bundle = await buildBundle();
    } catch (err) {
      const why = (err instanceof Error ? err.message : String(err)).split("\n")[0];
      console.error(`better-compute: the CLI's bundle could not be built (${why}); running it from source with tsx, slower`);
      return runTs("cli/main.ts", process.argv.slice(2));
    }
  }
  // In this process: main.ts reads its arguments from process.argv as it would under tsx.
  await import(pathToFileURL(bundle).href);
}
