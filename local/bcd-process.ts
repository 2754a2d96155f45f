// A real `bcd start` child process beside the local stack (`npm run dev`'s site agent and VM host):
// its JSON log lines are printed one readable line each under a tag, and stop() ends it with
// SIGTERM, then SIGKILL after a grace period.
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { createInterface } from "node:readline";
import { repoRoot } from "./node-store.ts";
import { formatLogLine } from "./stack.ts";
import { stopChild } from "./child.ts";

export interface BcdProcessOptions {
  url: string;
  role: "site" | "node";
  stateDir: string;
  hostname: string;
  /** The join token: passed in the environment (BC_JOIN_TOKEN), never on the command line. */
  token: string;
  /** More `bcd start` flags (e.g. --runtime-dir). */
  args?: string[];
  /** Printed before each of its lines: `  [tag] …`. */
  tag: string;
  print: (line: string) => void;
  /** Its own process group, so a Ctrl-C reaches the dev process first, which then stops bcd itself. */
  detached?: boolean;
  /** How long stop() waits after SIGTERM before SIGKILL. */
  stopGraceMs: number;
}

export interface BcdProcess {
  process: ChildProcess;
  stop(): Promise<void>;
}

export function startBcd(options: BcdProcessOptions): BcdProcess {
  const bcd = path.join(repoRoot, "agent", "bcd.ts");
  const args = ["start", "--url", options.url, "--role", options.role, "--state-dir", options.stateDir, "--hostname", options.hostname];
  const child = spawn(process.execPath, ["--import", "tsx", bcd, ...args, ...(options.args ?? [])], {
    cwd: repoRoot,
    env: { ...process.env, BC_JOIN_TOKEN: options.token },
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.detached ?? false,
  });
  let stopping = false;
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream, crlfDelay: Infinity }).on("line", (line) => {
      if (line.trim() && !stopping) options.print(`  [${options.tag}] ${bcdLogLine(line)}`);
    });
  }
  return {
    process: child,
    stop: () => {
      stopping = true;
      return stopChild(child, options.stopGraceMs);
    },
  };
}

/** bcd's JSON log line as one readable line (fields named like secrets redacted); its plain lines as they are. */
function bcdLogLine(line: string): string {
  try {
    const fields = JSON.parse(line) as Record<string, unknown>;
    if (typeof fields.level === "string" && typeof fields.message === "string") return formatLogLine(fields);
  } catch {
    // a plain line ("joined as …", "bcd: …")
  }
  return line;
}
