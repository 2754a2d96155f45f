// What every `npm run <build>` script does: read --cache-dir and its own flags, run the build with
// its progress on stderr, print what it made as JSON on stdout, and exit 1 with the error's code
// and message when it fails.
import { parseArgs } from "node:util";
import { AgentError } from "../agent/contracts.ts";

type StringFlags = Record<string, { type: "string"; multiple?: boolean }>;

export async function runBuild<F extends StringFlags>(
  flags: F,
  build: (
    values: { [K in keyof F | "cache-dir"]?: F[K] extends { multiple: true } ? string[] : string },
    log: (msg: string) => void,
  ) => Promise<object>,
): Promise<void> {
  const { values } = parseArgs({ options: { "cache-dir": { type: "string" }, ...flags } });
  try {
    const made = await build(values as never, (msg) => console.error(msg));
    console.log(JSON.stringify(made, null, 2));
  } catch (e) {
    console.error(e instanceof AgentError ? `${e.code}: ${e.message}` : e);
    process.exitCode = 1;
  }
}

/** The build's own --cache-dir, when given (each builder has its default). */
export const cacheDirOf = (values: { "cache-dir"?: string }) => (values["cache-dir"] ? { cacheDir: values["cache-dir"] } : {});
