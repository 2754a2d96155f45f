// `npm run dev` as a user runs it, for the tests that read its terminal: its output collected,
// waited on by pattern, and Ctrl-C.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { repoRoot } from "../../local/node-store.ts";

export class NpmRunDev {
  /** Everything it printed so far, stdout and stderr interleaved. */
  output = "";
  readonly process: ChildProcess;

  /** `npm run dev -- <args>` in its own process group, so Ctrl-C (SIGINT to the group) reaches npm, tsx, wrangler and bcd. */
  constructor(args: string[], env: Record<string, string>) {
    this.process = spawn("npm", ["run", "dev", ...(args.length ? ["--", ...args] : [])], {
      cwd: repoRoot,
      env: { ...process.env, ...env },
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.process.stdout!.on("data", (d) => (this.output += d));
    this.process.stderr!.on("data", (d) => (this.output += d));
  }

  get running(): boolean {
    return this.process.exitCode === null && this.process.signalCode === null;
  }

  /** Resolves with the match once the output shows it; rejects after ms or if npm run dev exits. */
  waitFor(pattern: RegExp, ms: number, what: string): Promise<RegExpExecArray> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        clearInterval(poll);
        reject(new Error(`npm run dev did not show ${what} within ${ms / 1000} s:\n${this.output}`));
      }, ms);
      const poll = setInterval(() => {
        const match = pattern.exec(this.output);
        if (match || !this.running) {
          clearInterval(poll);
          clearTimeout(timer);
          if (match) resolve(match);
          else reject(new Error(`npm run dev exited with ${this.process.exitCode ?? this.process.signalCode}:\n${this.output}`));
        }
      }, 100);
    });
  }

  /** Ctrl-C, as a terminal sends it to the whole group; resolves when npm has exited. */
  interrupt(): Promise<void> {
    if (!this.running) return Promise.resolve();
    return new Promise((resolve) => {
      this.process.once("exit", () => resolve());
      process.kill(-this.process.pid!, "SIGINT");
    });
  }
}

/**
 * Pastes a command npm run dev printed into bash, as a user would (its quoting and $(…) included),
 * with `npx better-compute` a shim (in `dir`/bin) that runs the CLI without npm's start-up.
 * Answers its output; rejects when it exits non-zero.
 */
export function pasteCommand(dir: string): (command: string, env: Record<string, string>) => Promise<string> {
  const shimDir = path.join(dir, "bin");
  fs.mkdirSync(shimDir, { recursive: true });
  fs.writeFileSync(
    path.join(shimDir, "npx"),
    `#!/bin/sh\n[ "$1" = better-compute ] || exit 127\nshift\nexec ${process.execPath} ${path.join(repoRoot, "scripts", "better-compute.mjs")} "$@"\n`,
    { mode: 0o755 },
  );
  return (command, env) => {
    const shell = spawn("bash", ["-c", `set -euo pipefail\n${command}`], {
      cwd: repoRoot,
      env: { ...process.env, PATH: `${shimDir}:${process.env.PATH}`, ...env },
      stdio: "pipe",
    });
    let text = "";
    shell.stdout.on("data", (d) => (text += d));
    shell.stderr.on("data", (d) => (text += d));
    return new Promise((resolve, reject) =>
      shell.once("exit", (code) => (code === 0 ? resolve(text) : reject(new Error(`${command} exited with ${code}:\n${text}`)))),
    );
  };
}
