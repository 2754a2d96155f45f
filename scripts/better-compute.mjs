#!/usr/bin/env node
// better-compute: `start` and `dev` run the local stack (as npm start and npm run dev: with the
// simulated site), `bmc-emulator` a simulated BMC; `doctor` and every API command are the CLI in
// cli (see docs/cli.md).
import { nodeVersionProblem } from "./preflight.mjs";
import { runTs } from "../agent/run-ts.mjs";

const problem = nodeVersionProblem(process.versions.node);
if (problem) {
  console.error(problem);
  process.exit(1);
}
const [command, ...args] = process.argv.slice(2);
if (command === "start") runTs("scripts/start.ts", args);
else if (command === "dev") runTs("scripts/start.ts", ["--site", ...args]);
else if (command === "bmc-emulator") runTs("scripts/bmc-emulator.ts", args);
else runTs("cli/main.ts", process.argv.slice(2));
