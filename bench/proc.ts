// The bench's process tree from /proc (Linux): which processes `wrangler dev` started (node
// for wrangler itself, workerd for the Worker and its Durable Objects) and how much memory
// each holds. Elsewhere every function answers "nothing", and the figures that need it print n/a.
import fs from "node:fs";
import v8 from "node:v8";
import vm from "node:vm";

export interface ProcessStat {
  pid: number;
  ppid: number;
  /** The kernel's short name (comm): "node", "workerd", ... */
  name: string;
  /** CPU time so far, user + system, in seconds. */
  cpuSeconds: number;
}

export interface ProcessInfo extends ProcessStat {
  /** Resident set size in bytes (VmRSS); 0 when unreadable (a zombie, gone meanwhile). */
  rssBytes: number;
}

/** USER_HZ: 100 on every Linux this runs on (glibc and musl alike). */
const CLOCK_TICKS = 100;

/** Every process on the machine as /proc/<pid>/stat shows it. */
function allProcesses(): Map<number, Omit<ProcessStat, "pid">> {
  const all = new Map<number, Omit<ProcessStat, "pid">>();
  let entries: string[];
  try {
    entries = fs.readdirSync("/proc").filter((e) => /^\d+$/.test(e));
  } catch {
    return all;
  }
  for (const pid of entries) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
      // pid (comm) state ppid … utime(14) stime(15); comm may contain spaces and parentheses.
      const close = stat.lastIndexOf(")");
      const fields = stat.slice(close + 2).split(" ");
      all.set(Number(pid), {
        ppid: Number(fields[1]),
        name: stat.slice(stat.indexOf("(") + 1, close),
        cpuSeconds: (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS,
      });
    } catch {
      // gone meanwhile
    }
  }
  return all;
}

/** This process and all its descendants (children, their children, ...) as /proc/<pid>/stat shows them. */
export function processStats(root = process.pid): ProcessStat[] {
  const all = allProcesses();
  const include = new Set([root]);
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, p] of all) {
      if (!include.has(pid) && include.has(p.ppid)) {
        include.add(pid);
        grew = true;
      }
    }
  }
  return [...include].filter((pid) => all.has(pid)).map((pid) => ({ pid, ...all.get(pid)! }));
}

/**
 * Every process on the machine with this name, ours or not (a Postgres server the bench did not
 * start), with its proportional share of memory (Pss: shared pages divided among their users, so
 * the sum over a Postgres server's processes counts its shared buffers once).
 */
export function processesNamed(name: string): (ProcessStat & { pssBytes: number })[] {
  return [...allProcesses()].filter(([, p]) => p.name === name).map(([pid, p]) => ({ pid, ...p, pssBytes: pssOf(pid) }));
}

/** This process and all its descendants, with the memory each holds. */
export function processTree(root = process.pid): ProcessInfo[] {
  return processStats(root).map((p) => ({ ...p, rssBytes: rssOf(p.pid) }));
}

/** The summed RSS of this process's descendants with this name (e.g. "workerd"), and how many there are. */
export function descendantsRss(name: string): { processes: number; bytes: number } {
  const found = processTree().filter((p) => p.pid !== process.pid && p.name === name);
  return { processes: found.length, bytes: found.reduce((sum, p) => sum + p.rssBytes, 0) };
}

export interface FdCount {
  /** Summed over the processes. */
  open: number;
  /** The most any one of them has open: what meets the per-process limit first. */
  busiest: number;
  /** Each process's count, by pid. */
  perProcess: Record<number, number>;
  /** The smallest soft limit (Max open files) among them; Infinity if unknown. */
  limit: number;
  /** What they are: socket, file (SQLite databases and their -wal/-shm...), pipe, eventfd, ... */
  kinds: Record<string, number>;
}

/** Open file descriptors of this process's descendants with this name. */
export function descendantsFds(name: string): FdCount {
  let open = 0;
  let busiest = 0;
  let limit = Infinity;
  const kinds: Record<string, number> = {};
  const perProcess: Record<number, number> = {};
  for (const p of processTree()) {
    if (p.pid === process.pid || p.name !== name) continue;
    try {
      const fds = fs.readdirSync(`/proc/${p.pid}/fd`);
      busiest = Math.max(busiest, fds.length);
      perProcess[p.pid] = fds.length;
      for (const fd of fds) {
        open++;
        let target = "?";
        try {
          target = fs.readlinkSync(`/proc/${p.pid}/fd/${fd}`);
        } catch {
          // closed meanwhile
        }
        const kind = target.startsWith("socket:")
          ? "socket"
          : target.startsWith("anon_inode:")
            ? target.slice(11).replace(/[[\]]/g, "")
            : target.startsWith("pipe:")
              ? "pipe"
              : "file";
        kinds[kind] = (kinds[kind] ?? 0) + 1;
      }
      const soft = /^Max open files\s+(\d+|unlimited)/m.exec(fs.readFileSync(`/proc/${p.pid}/limits`, "utf8"))?.[1];
      if (soft && soft !== "unlimited") limit = Math.min(limit, Number(soft));
    } catch {
      // gone, or not ours to read
    }
  }
  return { open, busiest, limit, kinds, perProcess };
}

function pssOf(pid: number): number {
  try {
    const match = /^Pss:\s+(\d+)\s+kB/m.exec(fs.readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"));
    return match ? Number(match[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

function rssOf(pid: number): number {
  try {
    const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
    return match ? Number(match[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

export const mib = (bytes: number) => bytes / 2 ** 20;

let gc: (() => void) | undefined;

/**
 * A full garbage collection in this process, so that heapUsed right after it is what is live
 * (the agents' objects), not what is waiting to be collected. Node's documented way to reach
 * gc() without starting node with --expose-gc.
 */
export function collectGarbage(): void {
  if (!gc) {
    v8.setFlagsFromString("--expose-gc");
    gc = vm.runInNewContext("gc") as () => void;
  }
  gc();
}
