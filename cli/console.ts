// `better-compute metal console <node>`: a machine's serial console, live, through its site agent.
// It opens a session (metal.nodes.console: one audit row), then reads on from where the last read
// left off (metal.nodes.consoleRead) and writes the bytes to stdout as they come. With --write,
// what is typed goes to the machine (metal.nodes.consoleWrite, when the role allows it); Ctrl-]
// leaves. Notes (bytes missed, a reconnect) go to stderr, so stdout is the console alone.
import { ApiError, type Api } from "./api.ts";
import { splitArgs } from "./args.ts";
import { UsageError } from "./connection.ts";

export const CONSOLE_HELP = `better-compute metal console <node> [--write] [--seconds N]
  Shows the machine's serial console live (through its site agent: a Redfish BMC's Telnet console,
  an IPMI BMC's serial-over-LAN) until Ctrl-C. Opening it is recorded in the audit log.
  --write     also send what you type (needs metal.nodes.consoleWrite); Ctrl-] leaves
  --seconds   stop after N seconds (for scripts)`;

interface Chunk {
  session: string;
  connection: string | null;
  offset: number;
  data: string;
  skipped: number;
  ended: string | null;
  stale: boolean;
}

/** Ctrl-]: telnet's escape, what operators expect to leave a console with. */
const ESCAPE = 0x1d;
const RETRY_MS = 1000;

export async function metalConsole(api: Api, words: string[], tail: string[], help: boolean): Promise<number> {
  if (help) {
    console.log(CONSOLE_HELP);
    return 0;
  }
  const split = splitArgs(tail, (name) => name === "seconds");
  const unknown = split.flags.find((f) => f.name !== "write" && f.name !== "seconds");
  const [node, ...extra] = [...words, ...split.words];
  if (!node || extra.length || unknown)
    throw new UsageError(`usage: ${CONSOLE_HELP.split("\n")[0]}${unknown ? ` (unknown flag --${unknown.name})` : ""}`);
  const secondsFlag = split.flags.find((f) => f.name === "seconds")?.value;
  const seconds = secondsFlag === undefined ? Infinity : Number(secondsFlag);
  if (!(seconds > 0)) throw new UsageError("--seconds takes a number of seconds above 0");
  const typing = split.flags.some((f) => f.name === "write");

  const opened = await api.call<Chunk>("metal.nodes.console", { node });
  const stop = new AbortController();
  const timer = seconds === Infinity ? undefined : setTimeout(() => stop.abort(), seconds * 1000);
  process.once("SIGINT", () => stop.abort());
  if (typing) type(api, node, opened.session, stop);
  else process.stderr.write(`[console of ${node}: Ctrl-C leaves]\n`);

  let from: { connection: string; offset: number } | undefined;
  while (!stop.signal.aborted) {
    let chunk: Chunk;
    try {
      chunk = await api.call<Chunk>("metal.nodes.consoleRead", { node, session: opened.session, ...(from ?? {}) });
    } catch (e) {
      // The site agent or the API is away for a moment: say so once, and read on.
      if (!(e instanceof ApiError) || !["UNAVAILABLE", "INTERNAL"].includes(e.code)) throw e;
      process.stderr.write(`[${e.message}; trying again]\n`);
      await new Promise((r) => setTimeout(r, RETRY_MS));
      continue;
    }
    if (from && chunk.connection !== from.connection) process.stderr.write("[the console was reconnected]\n");
    if (chunk.skipped > 0) process.stderr.write(`[${chunk.skipped} bytes missed]\n`);
    if (chunk.data) process.stdout.write(Buffer.from(chunk.data, "base64"));
    if (chunk.ended !== null) {
      process.stderr.write(`[${chunk.ended}; reconnecting]\n`);
      from = undefined;
    } else if (chunk.connection !== null) from = { connection: chunk.connection, offset: chunk.offset };
  }
  clearTimeout(timer);
  if (process.stdin.isTTY) process.stdin.setRawMode(false);
  process.stdin.pause();
  return 0;
}

/** Sends what is typed: raw keystrokes from a terminal, else stdin's text as it comes. */
function type(api: Api, node: string, session: string, stop: AbortController): void {
  if (process.stdin.isTTY) process.stdin.setRawMode(true);
  process.stderr.write(`[console of ${node}: typing goes to the machine; Ctrl-] leaves]\r\n`);
  let sending = Promise.resolve();
  process.stdin.on("data", (bytes: Buffer) => {
    const escape = bytes.indexOf(ESCAPE);
    const text = (escape < 0 ? bytes : bytes.subarray(0, escape)).toString("utf8");
    if (text)
      sending = sending
        .then(() => api.call("metal.nodes.consoleWrite", { node, session, text }))
        .then(
          () => undefined,
          (e: Error) => {
            process.stderr.write(`[not sent: ${e.message}]\r\n`);
            if (e instanceof ApiError && e.code === "PERMISSION_DENIED") stop.abort();
          },
        );
    if (escape >= 0) stop.abort();
  });
}
