#!/usr/bin/env node
// Run first by `npm start` and `npm run dev`: refuses a Node.js too old for the stack in one line,
// before tsx or wrangler fail on it with a stack trace. Plain JavaScript any Node can run.
import process from "node:process";
import { fileURLToPath } from "node:url";

export const MINIMUM_NODE = "22.12.0";

/** The refusal for this Node.js version ("22.11.0"), or undefined when it is new enough. */
export function nodeVersionProblem(version) {
  const [major, minor, patch] = version.split(".").map(Number);
  const [needMajor, needMinor, needPatch] = MINIMUM_NODE.split(".").map(Number);
  const newEnough = major !== needMajor ? major > needMajor : minor !== needMinor ? minor > needMinor : patch >= needPatch;
  return newEnough ? undefined : `Better Compute needs Node.js ${MINIMUM_NODE.replace(/\.0$/, "")} or newer; this is v${version}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const problem = nodeVersionProblem(process.versions.node);
  if (problem) {
    console.error(problem);
    process.exit(1);
  }
}
