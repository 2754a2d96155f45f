// The one way to run the real `bcd` CLI in a child process of its own (`node --import tsx agent/bcd.ts …`
// from the repository root, or an installed build's launcher): npm run dev's site agent and VM host,
// the bench, and the tests that need the real thing. startBcd runs `bcd start`; spawnBcd any other long-running command (`bcd run`);
// runBcd a one-shot command (`bcd join`) and answers its exit code and output.
//
// A join token reaches bcd only in its environment (BC_JOIN_TOKEN), never on its command line; one
// set in this process's environment is not passed on.
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { createInterface } from "node:readline";
import { repoRoot } from "./node-store.ts";
import { formatLogLine } from "./stack.ts";
import { stopChild } from "./child.ts";

export interface BcdSpawnOptions {
  /**
   * The bcd to run: an installed launcher (`/usr/bin/bcd`, or a build's `root/usr/bin/bcd`: see
   * agent/build/bcd.ts), or the argv that runs it (`["ip", "netns", "exec", NS, launcher]`).
   * Default the repository's agent/bcd.ts under tsx.
   */
  bcd?: string | string[];
  /** More environment over this process's; a variable given as undefined is removed (e.g. a test hook it must not inherit). */
  env?: Record<string, string | undefined>;
  /**
   * When given, each line bcd writes is printed, one readable line under tag (`  [tag] …`), and not
   * kept: for a bcd that runs for as long as the developer likes. Without it, output() has it all.
   */
  print?: (line: string) => void;
  tag?: string;
  /** Its own process group, so a Ctrl-C reaches this process first, which then stops bcd itself. */
  detached?: boolean;
  /** How long stop() waits after SIGTERM before SIGKILL (5 s unless given). */
  stopGraceMs?: number;
}

export interface BcdStartOptions extends BcdSpawnOptions {
  url: string;
  role: "site" | "node";
  stateDir: string;
  /** The name it joins under (the machine's own unless given). */
  hostname?: string;
  /** The join token: passed in the environment (BC_JOIN_TOKEN), never on the command line. */
  token: string;
  /** More `bcd start` flags (e.g. --runtime-dir, --quiet). */
  args?: string[];
}

/** How it ended: an exit code, or the signal that killed it. */
export interface BcdExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface BcdProcess {
  process: ChildProcess;
  /** What it has written so far, stdout and stderr in the order they came, or one of them ("" when printed instead). */
  output(stream?: "stdout" | "stderr"): string;
  /** Resolves once it has exited and all it wrote has been read. */
  exited: Promise<BcdExit>;
  /** SIGTERM, then SIGKILL after the grace period; resolves when it has exited. */
  stop(): Promise<void>;
}

/** `bcd start --url … --role … --state-dir …`, the token in its environment. */
export function startBcd(options: BcdStartOptions): BcdProcess {
  const args = ["start", "--url", options.url, "--role", options.role, "--state-dir", options.stateDir];
  if (options.hostname !== undefined) args.push("--hostname", options.hostname);
  return spawnBcd([...args, ...(options.args ?? [])], { ...options, env: { ...options.env, BC_JOIN_TOKEN: options.token } });
}

/** bcd with these arguments (`run --state-dir …`), running until it exits or is stopped. */
export function spawnBcd(args: string[], options: BcdSpawnOptions = {}): BcdProcess {
  // No token unless one is given: a developer's BC_JOIN_TOKEN must not reach a test's bcd.
  const env: NodeJS.ProcessEnv = { ...process.env, BC_JOIN_TOKEN: "" };
  for (const [name, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  const [program, ...prefix] = options.bcd
    ? [options.bcd].flat()
    : [process.execPath, "--import", "tsx", path.join(repoRoot, "agent", "bcd.ts")];
  const child = spawn(program!, [...prefix, ...args], {
    cwd: repoRoot,
    env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.detached ?? false,
  });
  const kept: Array<{ stream: "stdout" | "stderr"; text: string }> = [];
  const { print } = options;
  let stopping = false; // once stop() is called, its shutdown lines are not printed
  for (const stream of ["stdout", "stderr"] as const) {
    const input = child[stream]!;
    input.setEncoding("utf8"); // a character split between two reads stays whole
    if (print)
      createInterface({ input, crlfDelay: Infinity }).on("line", (line) => {
        if (line.trim() && !stopping) print(`  [${options.tag ?? "bcd"}] ${bcdLogLine(line)}`);
      });
    else input.on("data", (text: string) => kept.push({ stream, text }));
  }
  // "close", not "exit": by then its stdout and stderr have been read to their end.
  const exited = new Promise<BcdExit>((resolve) => child.once("close", (code, signal) => resolve({ code, signal })));
  return {
    process: child,
    output: (stream) =>
      kept
        .filter((chunk) => stream === undefined || chunk.stream === stream)
        .map((chunk) => chunk.text)
        .join(""),
    exited,
    stop: () => {
      stopping = true;
      return stopChild(child, options.stopGraceMs);
    },
  };
}

/** A one-shot bcd command (`join …`) to its end: its exit code (128 when a signal ended it) and what it wrote. */
export async function runBcd(
  args: string[],
  options: Pick<BcdSpawnOptions, "env" | "bcd"> = {},
): Promise<{ code: number; out: string; err: string }> {
  const bcd = spawnBcd(args, options);
  const { code } = await bcd.exited;
  return { code: code ?? 128, out: bcd.output("stdout"), err: bcd.output("stderr") };
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
