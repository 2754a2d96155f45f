// A local connection pooler shaped like Hyperdrive: pgbouncer in transaction mode in front of a real
// Postgres (DATABASE_URL). Hyperdrive keeps warm connections to the origin and hands each Worker
// connection a pooled one per transaction; without a pooler every request forks a Postgres backend
// and authenticates (SCRAM). The Worker still opens a TCP connection per request, now to pgbouncer,
// which answers the startup itself. pgbouncer is Debian's package (`apt-get install pgbouncer`).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { stopChild } from "./child.ts";

export interface Pooler {
  /** The same database, user and password as the origin's URL, at the pooler's address. */
  connectionString: string;
  stop(): Promise<void>;
}

/** Where Debian installs it; PGBOUNCER names another binary. */
export function pgbouncerBinary(): string | undefined {
  const candidates = [process.env.PGBOUNCER, "/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].filter((p): p is string => !!p);
  return candidates.find((p) => fs.existsSync(p));
}

/** Starts pgbouncer for `databaseUrl` (a Postgres with a user and a password) on a free loopback port. */
export async function startPooler(databaseUrl: string, port: number): Promise<Pooler> {
  const binary = pgbouncerBinary();
  if (!binary) throw new Error("pgbouncer is not installed (apt-get install pgbouncer), or set PGBOUNCER to its path");
  const origin = new URL(databaseUrl);
  const user = decodeURIComponent(origin.username);
  const password = decodeURIComponent(origin.password);
  const database = decodeURIComponent(origin.pathname.slice(1)) || user;
  if (!user || !password) throw new Error("the pooler needs DATABASE_URL with a user and a password");

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-pooler-"));
  // pgbouncer refuses to run as root: started as root (CI), it drops to an unprivileged user.
  const runAs = process.getuid?.() === 0 ? unprivilegedUser() : undefined;
  const quote = (value: string) => `'${value.replace(/'/g, "''")}'`;
  const ini = [
    "[databases]",
    `${database} = host=${origin.hostname.replace(/^\[(.*)\]$/, "$1")} port=${origin.port || 5432} dbname=${quote(database)} user=${quote(user)} password=${quote(password)}`,
    "[pgbouncer]",
    "listen_addr = 127.0.0.1",
    `listen_port = ${port}`,
    "unix_socket_dir =",
    // The URL's password is checked, sent in clear over loopback: SCRAM here would cost each connection
    // ~8 ms of hashing that a Worker's connection to Hyperdrive, in the same data center, does not pay.
    "auth_type = plain",
    `auth_file = ${path.join(dir, "users.txt")}`,
    // One server connection per transaction, as Hyperdrive pools.
    "pool_mode = transaction",
    "default_pool_size = 20",
    "max_client_conn = 2000",
    // node-postgres sends no startup options pgbouncer rejects; other clients may.
    "ignore_startup_parameters = extra_float_digits,options",
    `logfile = ${path.join(dir, "pgbouncer.log")}`,
    "",
  ].join("\n");
  fs.writeFileSync(path.join(dir, "pgbouncer.ini"), ini, { mode: 0o600 });
  fs.writeFileSync(path.join(dir, "users.txt"), `"${user.replace(/"/g, '""')}" "${password.replace(/"/g, '""')}"\n`, { mode: 0o600 });
  if (runAs) for (const file of [dir, ...fs.readdirSync(dir).map((f) => path.join(dir, f))]) fs.chownSync(file, runAs.uid, runAs.gid);

  const child = spawn(binary, [...(runAs ? ["-u", runAs.name] : []), path.join(dir, "pgbouncer.ini")], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2000)));
  const stopOnExit = () => child.kill("SIGTERM");
  process.once("exit", stopOnExit);
  const stop = async () => {
    process.off("exit", stopOnExit);
    await stopChild(child);
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitForListen(port, child, () => stderr + readLog(dir));
  } catch (err) {
    await stop();
    throw err;
  }
  const pooled = new URL(databaseUrl);
  pooled.hostname = "127.0.0.1";
  pooled.port = String(port);
  pooled.search = "";
  return { connectionString: pooled.toString(), stop };
}

function unprivilegedUser(): { name: string; uid: number; gid: number } {
  for (const name of ["postgres", "nobody"]) {
    const id = spawnSync("id", ["-u", name], { encoding: "utf8" });
    const gid = spawnSync("id", ["-g", name], { encoding: "utf8" });
    if (id.status === 0 && gid.status === 0) return { name, uid: Number(id.stdout.trim()), gid: Number(gid.stdout.trim()) };
  }
  throw new Error("pgbouncer will not run as root and there is no postgres or nobody user to run it as");
}

function readLog(dir: string): string {
  try {
    return fs.readFileSync(path.join(dir, "pgbouncer.log"), "utf8").slice(-2000);
  } catch {
    return "";
  }
}

async function waitForListen(port: number, child: ChildProcess, output: () => string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`pgbouncer exited with ${child.exitCode}:\n${output()}`);
    const up = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => resolve(true));
      socket.once("error", () => resolve(false));
      socket.once("connect", () => socket.destroy());
    });
    if (up) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`pgbouncer did not listen on 127.0.0.1:${port} within 10 s:\n${output()}`);
}
