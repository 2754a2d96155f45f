// Network namespaces for the emulated site and the network tests: made by the test (or `npm run
// dev -- --emulated`), holding every address, lease and broadcast of the emulated provisioning
// network, and removed afterwards. Nothing in them is routed to the host's own networks: what
// must cross (the control plane, the BMC emulator, an image server, all on this host's loopback)
// crosses through relays over unix sockets (`relay`), never through an interface of the host.
// A run that was killed leaves its namespaces behind: the next one removes those whose process
// is gone (their names end in the pid that made them). Linux, root (ip netns).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";

export interface Netns {
  name: string;
  /** `ip -n <name> ...` */
  ip(...args: string[]): void;
  /** The argv prefix that runs a command inside it. */
  prefix: string[];
  /**
   * Makes the host's 127.0.0.1:<hostPort> reachable inside the namespace at <bind>:<port> (every
   * address of the namespace by default), through a unix socket: socat listens inside, this
   * process connects on the host.
   */
  relay(port: number, hostPort: number, bind?: string): Promise<void>;
  /**
   * The other way: address:port inside the namespace, reachable from this host at 127.0.0.1:<the
   * port answered> (each connection a socat inside that connects to it). What a BMC on the
   * management network uses to download virtual media from the site agent.
   */
  forward(address: string, port: number): Promise<number>;
  /** Stops the relays and removes the namespace with everything in it. */
  remove(): Promise<void>;
}

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: "pipe" });

/** Whether namespaces can be made here: Linux, root, iproute2. */
export function canMakeNetns(): boolean {
  if (process.platform !== "linux" || process.getuid?.() !== 0) return false;
  try {
    execFileSync("ip", ["netns", "list"], { stdio: "pipe" });
    return true;
  } catch {
    return false;
  }
}

/** Removes the namespaces named `<prefix>-<label>-<pid>` whose pid is not a live process (a killed run's). */
export function removeLeftoverNetns(prefix: string): void {
  for (const line of execFileSync("ip", ["netns", "list"], { encoding: "utf8" }).split("\n")) {
    const m = new RegExp(`^(${prefix}-[a-z0-9]+-(\\d+))\\b`).exec(line);
    if (!m) continue;
    let alive = true;
    try {
      process.kill(Number(m[2]), 0);
    } catch {
      alive = false;
    }
    if (alive) continue; // a live run's (this one's too)
    killInside(m[1]!);
    ip("netns", "del", m[1]!);
  }
}

/** Kills every process still running inside the namespace (dnsmasq, QEMU, socat of a killed run). */
function killInside(name: string): void {
  const pids = execFileSync("ip", ["netns", "pids", name], { encoding: "utf8" }).split("\n").filter(Boolean);
  for (const pid of pids) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // gone
    }
  }
}

/** A new namespace `<prefix>-<label>-<pid>` with its loopback up. */
export function makeNetns(prefix: string, label: string): Netns {
  const name = `${prefix}-${label}-${process.pid}`;
  ip("netns", "add", name);
  ip("-n", name, "link", "set", "lo", "up");
  const sockets = mkdtempSync(path.join(tmpdir(), `${name}-`));
  const servers: net.Server[] = [];
  const relays: ChildProcess[] = [];
  return {
    name,
    prefix: ["ip", "netns", "exec", name],
    ip: (...args) => void ip("-n", name, ...args),
    async relay(port, hostPort, bind) {
      const socket = path.join(sockets, `${port}.sock`);
      const server = net.createServer((conn) => {
        const upstream = net.connect(hostPort, "127.0.0.1");
        conn.pipe(upstream).pipe(conn);
        for (const end of [conn, upstream]) end.on("error", () => (conn.destroy(), upstream.destroy()));
      });
      await new Promise<void>((resolve, reject) => server.once("error", reject).listen(socket, resolve));
      servers.push(server);
      const listen = `TCP-LISTEN:${port},fork,reuseaddr${bind ? `,bind=${bind}` : ""}`;
      const socat = spawn("ip", ["netns", "exec", name, "socat", listen, `UNIX-CONNECT:${socket}`], { stdio: "ignore" });
      relays.push(socat);
      // Listening once a connection inside gets through to the socket (socat takes a moment to bind).
      for (let tries = 0; ; tries++) {
        const ok = await new Promise<boolean>((resolve) => {
          const probe = spawn("ip", ["netns", "exec", name, "socat", "-u", "OPEN:/dev/null", `TCP:${bind ?? "127.0.0.1"}:${port}`], {
            stdio: "ignore",
          });
          probe.once("exit", (code) => resolve(code === 0));
        });
        if (ok) break;
        if (socat.exitCode !== null || tries > 50) throw new Error(`the relay to port ${hostPort} did not start inside ${name}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async forward(address, port) {
      const server = net.createServer((conn) => {
        const socat = spawn("ip", ["netns", "exec", name, "socat", "STDIO", `TCP:${address}:${port}`], {
          stdio: ["pipe", "pipe", "ignore"],
        });
        relays.push(socat);
        conn.pipe(socat.stdin!);
        socat.stdout!.pipe(conn);
        const end = () => (conn.destroy(), socat.kill("SIGKILL"));
        conn.on("error", end).on("close", end);
        socat.on("exit", () => conn.end());
      });
      await new Promise<void>((resolve, reject) => server.once("error", reject).listen(0, "127.0.0.1", resolve));
      servers.push(server);
      return (server.address() as net.AddressInfo).port;
    },
    async remove() {
      for (const r of relays) r.kill("SIGKILL");
      for (const s of servers) s.close();
      try {
        killInside(name);
        ip("netns", "del", name);
      } finally {
        rmSync(sockets, { recursive: true, force: true });
      }
    },
  };
}
