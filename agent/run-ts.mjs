// Runs a TypeScript entry of this package with tsx (the package ships its sources, not a build).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

export function runTs(entry, args) {
  const tsx = createRequire(import.meta.url).resolve("tsx/cli");
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
  const child = spawn(process.execPath, [tsx, path.join(root, entry), ...args], { stdio: "inherit" });
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal));
  child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
}
