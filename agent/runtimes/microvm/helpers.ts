// Small helpers of the microvm core: the one strict size parser (FC-MEM-AND-VCPU,
// FC-DISK-FROM-CONTRACT), running host tools with argument arrays (never a shell), finding a
// VMM by the work dir its command line names (adoption, and the pid-reuse guard before a kill),
// and reading the start or the end of a log.
import { execFile } from "node:child_process";
import { open, readdir, readFile } from "node:fs/promises";
import { AgentError } from "../../contracts.ts";

const MiB = 1024 * 1024;
const UNIT_MiB: Record<string, number> = { K: 1 / 1024, M: 1, G: 1024, T: 1024 * 1024 };

/**
 * A size in MiB, the one parser for memory and disk. A plain number (or a string of digits) is
 * MiB; otherwise digits and a binary unit K, M, G or T, optionally followed by "iB" or "B"
 * ("512M", "1G", "1GiB", "2048KiB"). Anything else, zero, or a size that is not a whole number of
 * MiB is INVALID_ARGUMENT: never a silent default.
 */
export function parseSize(value: number | string, what: string): number {
  let mib: number | undefined;
  if (typeof value === "number") mib = value;
  else if (typeof value === "string") {
    const m = /^\s*(\d{1,12})\s*(?:([KMGT])(?:i?B)?)?\s*$/i.exec(value);
    if (m) mib = Number(m[1]) * UNIT_MiB[(m[2] ?? "M").toUpperCase()]!;
  }
  if (mib === undefined || !Number.isSafeInteger(mib) || mib <= 0) {
    throw new AgentError("INVALID_ARGUMENT", `${what} ${JSON.stringify(value)} is not a size (e.g. 512M, 1G, 1GiB; a plain number is MiB)`);
  }
  return mib;
}

export function mibToBytes(mib: number): number {
  return mib * MiB;
}

/** A vCPU count: an integer 1..max, as a number or a string of digits. */
export function parseVcpus(value: number | string, max: number): number {
  const n = typeof value === "number" ? value : typeof value === "string" && /^\s*\d{1,4}\s*$/.test(value) ? Number(value) : NaN;
  if (!Number.isInteger(n) || n < 1 || n > max) {
    throw new AgentError("INVALID_ARGUMENT", `vcpus ${JSON.stringify(value)} is not an integer from 1 to ${max}`);
  }
  return n;
}

/** Runs a host tool (argument array, no shell); a failure is DRIVER_ERROR with its stderr's last line. */
export function run(argv: string[], options: { timeoutMs?: number } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(argv[0]!, argv.slice(1), { timeout: options.timeoutMs ?? 30_000, encoding: "utf8" }, (err, stdout, stderr) => {
      if (!err) return resolve(stdout);
      const last = stderr.trim().split("\n").pop() || err.message;
      reject(new AgentError("DRIVER_ERROR", `${argv[0]} ${argv[1] ?? ""} failed: ${last}`.slice(0, 500)));
    });
  });
}

/** The pids whose command line names something inside workDir (a VMM started for it), oldest first. */
export async function processesNaming(workDir: string): Promise<number[]> {
  const needle = `${workDir.replace(/\/+$/, "")}/`;
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const argv = await cmdline(pid);
    if (argv?.some((arg) => arg.includes(needle))) pids.push(pid);
  }
  return pids.sort((a, b) => a - b);
}

/** Whether pid is alive and still the process whose command line names workDir (pid-reuse guard). */
export async function isVmmOf(pid: number, workDir: string): Promise<boolean> {
  const needle = `${workDir.replace(/\/+$/, "")}/`;
  return (await cmdline(pid))?.some((arg) => arg.includes(needle)) ?? false;
}

async function cmdline(pid: number): Promise<string[] | undefined> {
  try {
    const raw = await readFile(`/proc/${pid}/cmdline`, "utf8");
    return raw ? raw.split("\0").filter(Boolean) : undefined; // a zombie has an empty command line
  } catch {
    return undefined;
  }
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
  });
}

/** The host's TSC rate in kHz for `tsc_early_khz` (required under TCG: without it ~1 boot in 25 hangs calibrating). */
export async function hostTscKhz(): Promise<number | undefined> {
  try {
    const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(await readFile("/proc/cpuinfo", "utf8"));
    return m ? Math.round(Number(m[1]) * 1000) : undefined;
  } catch {
    return undefined;
  }
}

/** The last maxLines lines of text, at most maxChars characters. */
export function lastLines(text: string, maxLines: number, maxChars: number): string {
  return text.split("\n").slice(-maxLines).join("\n").slice(-maxChars);
}

/**
 * The first (`from` "start") or last ("end") maxBytes of a file; empty when it does not exist.
 * The start is cut to what was read; the end is the length the file had when looked at.
 */
export async function readPart(file: string, maxBytes: number, from: "start" | "end"): Promise<Buffer> {
  let fh;
  try {
    fh = await open(file, "r");
  } catch {
    return Buffer.alloc(0);
  }
  try {
    const size = (await fh.stat()).size;
    const buf = Buffer.alloc(Math.min(size, maxBytes));
    const { bytesRead } = await fh.read(buf, 0, buf.length, from === "start" ? 0 : size - buf.length);
    return from === "start" ? buf.subarray(0, bytesRead) : buf;
  } finally {
    await fh.close();
  }
}
