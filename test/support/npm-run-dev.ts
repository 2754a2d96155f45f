// `npm run dev` as a user runs it, for the tests that read its terminal: its output collected,
// waited on by pattern, and Ctrl-C.
import { spawn, type ChildProcess } from "node:child_process";
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
