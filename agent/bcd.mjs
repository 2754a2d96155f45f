#!/usr/bin/env node
// bcd, the agent: see agent/bcd.ts.
import { runTs } from "./run-ts.mjs";

runTs("agent/bcd.ts", process.argv.slice(2));
