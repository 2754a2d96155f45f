#!/usr/bin/env node
// better-compute dev [--sim N] [--port P]: the local stack (as npm start), with N simulated agents.
import { runTs } from "./run-ts.mjs";

const [command, ...args] = process.argv.slice(2);
if (command !== "dev") {
  console.error("usage: better-compute dev [--sim N] [--port P]");
  process.exit(2);
}
runTs("scripts/start.ts", args);
