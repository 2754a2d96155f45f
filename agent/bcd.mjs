#!/usr/bin/env node
// bcd, the agent: see agent/bcd.ts.
import { runTs } from "../scripts/run-ts.mjs";

runTs("agent/bcd.ts", process.argv.slice(2));
