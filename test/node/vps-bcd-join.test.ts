// An `agent: bcd` pool's instance joins as a node, end to end: the vps module creates the server at
// the Hetzner Cloud emulator with a single-use provisioned token in its cloud-init user data, the
// test plays cloud-init for it (writes the token file, runs the runcmd commands with the real bcd
// CLI against the control plane over real HTTP), and the node joins with the instance's labels.
// The token is used up by that join and appears nowhere but the create's user_data.
// SIMULATED: the provider (the emulator) and the instance's cloud-init (this test, paths under a
// temporary root). The control plane is the real betterCompute (vps module, JoinService) on PGlite,
// in process (testing/metal-sim-control-plane.ts), served over node:http for bcd.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it } from "vitest";
import { hetznerCloudProvider } from "better-compute/hetzner-cloud";
import { startHetznerCloudEmulator, type HetznerCloudEmulator } from "better-compute/testing/hetzner-cloud";
import { vps } from "better-compute/vps";
import { recordingFetch } from "better-compute/vps/record-replay";
import { inProcessControlPlane, type SimControlPlane } from "../../testing/metal-sim-control-plane.ts";
import { runBcd } from "../../local/bcd-process.ts";
import { eventually } from "../support/eventually.ts";

const HCLOUD_TOKEN = "hcloud-bcd-join-token-Qw7Er4Ty1Ui8";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

let emu: HetznerCloudEmulator;
let cp: SimControlPlane;
let http: Server;
let agentUrl: string;
const recorder = recordingFetch(globalThis.fetch);
const temps: string[] = [];

beforeAll(async () => {
  emu = await startHetznerCloudEmulator({ token: HCLOUD_TOKEN });
  // bcd reaches the control plane over real HTTP; its URL goes into the user data, so it is known first.
  http = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const response = await cp.transport.fetch(`${cp.baseUrl}${req.url}`, {
      method: req.method!,
      headers: req.headers as Record<string, string>,
      ...(chunks.length ? { body: Buffer.concat(chunks) } : {}),
    });
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  });
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  agentUrl = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  cp = await inProcessControlPlane({ modules: [vps({ providers: [hetznerCloudProvider], agentUrl, fetch: recorder.fetch })] });
}, 60_000);

afterAll(async () => {
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
  await cp?.stop();
  await emu?.stop();
  for (const dir of temps) fs.rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-vps-bcd-"));
  temps.push(dir);
  return dir;
}

/**
 * The cloud-config renderUserData writes (plugins/vps/user-data.ts), read back: top-level keys with
 * JSON scalars, lists of JSON values, and write_files entries. Any other line throws, so nothing
 * the test does not expect can hide in the document.
 */
function parseCloudConfig(text: string): Record<string, unknown> {
  const lines = text.split("\n");
  if (lines.shift() !== "#cloud-config") throw new Error("user data does not start with #cloud-config");
  if (lines.pop() !== "") throw new Error("user data does not end with a newline");
  const doc: Record<string, unknown> = {};
  let list: unknown[] | undefined;
  let entry: Record<string, unknown> | undefined;
  const set = (into: Record<string, unknown>, key: string, value: unknown) => {
    if (key in into) throw new Error(`user data repeats ${key}`);
    into[key] = value;
  };
  for (const line of lines) {
    let m: RegExpExecArray | null;
    if ((m = /^([a-z_]+): (.+)$/.exec(line))) {
      set(doc, m[1]!, JSON.parse(m[2]!));
      list = entry = undefined;
    } else if ((m = /^([a-z_]+):$/.exec(line))) {
      set(doc, m[1]!, (list = []));
      entry = undefined;
    } else if (list && (m = /^ {2}- ([a-z_]+): (.+)$/.exec(line))) list.push((entry = { [m[1]!]: JSON.parse(m[2]!) }));
    else if (list && (m = /^ {2}- (.+)$/.exec(line))) {
      list.push(JSON.parse(m[1]!));
      entry = undefined;
    } else if (entry && (m = /^ {4}([a-z_]+): (.+)$/.exec(line))) set(entry, m[1]!, JSON.parse(m[2]!));
    else throw new Error(`user data line not understood: ${line}`);
  }
  return doc;
}

it("an agent: bcd pool's instance joins as its node with the token from its user data, which is used up and shown nowhere else", async () => {
  await cp.call("vps.accounts.create", { id: "hc", provider: "hetzner-cloud", config: { token: HCLOUD_TOKEN, endpoint: emu.url } });
  await cp.call("vps.pools.create", { id: "hc-fsn", account: "hc", agent: "bcd", location: "fsn1" });
  await cp.call("vps.tenants.create", { id: "acme", name: "Acme" });
  await cp.call("vps.quotas.set", { tenant: "acme", pool: "hc-fsn", instances: 2, vcpus: 4, memoryMiB: 8192, diskGiB: 100 });
  await cp.call("vps.flavors.create", { id: "small", pool: "hc-fsn", offer: "cx22", image: "debian-12" });
  await cp.call("vps.sshKeys.create", { tenant: "acme", name: "alice", publicKey: KEY });
  const { id } = await cp.call<{ id: string }>("vps.instances.create", {
    tenant: "acme",
    pool: "hc-fsn",
    flavor: "small",
    name: "web-1",
    sshKeys: ["alice"],
  });
  // The control plane's reconciler tick drives it (as the cron does).
  const running = await eventually(
    () => cp.call<{ state: string; nodeId: string | null }>("vps.instances.get", { id }),
    (i) => i.state === "running",
    "the instance running",
  );
  expect(running.nodeId).toBeNull(); // nothing joined yet

  // The user data, exactly: host name, keys, the token file, and the commands that join and start bcd.
  const [server, ...others] = emu.servers();
  expect(others).toEqual([]);
  const userData = parseCloudConfig(emu.userData(server!.id)!);
  const token = (userData.write_files as { content: string }[] | undefined)?.[0]?.content ?? "";
  expect(token).toMatch(/^bcj_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$/);
  const joinCommand = [
    "bcd",
    "join",
    "--url",
    agentUrl,
    "--attestor",
    "provisioned",
    "--token-file",
    "/etc/bcd/join-token",
    "--role",
    "node",
    "--state-dir",
    "/var/lib/bcd",
  ];
  expect(userData).toEqual({
    hostname: "web-1",
    ssh_authorized_keys: [KEY],
    write_files: [{ path: "/etc/bcd/join-token", permissions: "0600", content: token }],
    runcmd: [joinCommand, ["rm", "-f", "/etc/bcd/join-token"], ["systemctl", "enable", "--now", "bcd.service"]],
  });
  const secret = token.slice(21); // bcj_<id>_<secret>: the whole secret half (base64url may hold "_")
  const tokenId = token.slice(4, 20);

  // cloud-init, played: the instance's / is a temporary directory.
  const root = tempDir();
  const onInstance = (p: string) => path.join(root, p);
  for (const file of userData.write_files as { path: string; permissions: string; content: string }[]) {
    fs.mkdirSync(path.dirname(onInstance(file.path)), { recursive: true });
    fs.writeFileSync(onInstance(file.path), file.content, { mode: Number.parseInt(file.permissions, 8) });
  }
  const [join, remove, enable] = (userData.runcmd as string[][]).map((command) =>
    command.map((arg) => (arg.startsWith("/") ? onInstance(arg) : arg)),
  );

  // Presented as an operator's join token (bcd's default attestor), it is refused and stays usable.
  const elsewhere = tempDir();
  const withoutAttestor = join!.filter((arg, i) => arg !== "--attestor" && join![i - 1] !== "--attestor");
  const asJoinToken = await runBcd(withoutAttestor.slice(1).map((arg) => (arg === onInstance("/var/lib/bcd") ? elsewhere : arg)));
  expect(asJoinToken.code).toBe(1);
  expect(asJoinToken.err).toContain("bcd: join failed: PERMISSION_DENIED: the join token is unknown or was already used");

  const joined = await runBcd(join!.slice(1));
  expect(joined.code, joined.err).toBe(0);
  const nodeId = /^joined as (\S+) \(node\)/.exec(joined.out)?.[1];
  expect(nodeId).toBeDefined();
  execFileSync(remove![0]!, remove!.slice(1));
  expect(fs.existsSync(onInstance("/etc/bcd/join-token"))).toBe(false);
  // `systemctl enable --now bcd.service` needs systemd: its unit runs `bcd run --state-dir /var/lib/bcd`,
  // which test/node/agent-bcd.test.ts and test/node/bcd-stack.test.ts run.
  expect(enable).toEqual(["systemctl", "enable", "--now", "bcd.service"]);

  // The node is the one the token was minted for, with the instance's labels.
  const node = await cp.call<{ role: string; attestor: string; labels: Record<string, string>; revoked: boolean }>("nodes.get", {
    node: nodeId,
  });
  expect(node).toMatchObject({ role: "node", attestor: "provisioned", revoked: false });
  expect(node.labels).toMatchObject({ "bc.dev/vps-instance": id, "bc.dev/vps-pool": "hc-fsn" });
  const minted = (await cp.store.db.execute(sql`SELECT node_id, consumed_at FROM bc_join_tokens WHERE id = ${tokenId}`)).rows[0] as {
    node_id: string;
    consumed_at: string | null;
  };
  expect(minted.node_id).toBe(nodeId);
  expect(minted.consumed_at).not.toBeNull();
  expect(await cp.call("vps.instances.get", { id })).toMatchObject({ state: "running", nodeId });

  // Used up: the same token again (another machine, a replayed user data) is refused.
  const again = tempDir();
  fs.writeFileSync(path.join(again, "join-token"), token);
  const second = await runBcd(
    join!
      .slice(1)
      .map(
        (arg) => ({ [onInstance("/etc/bcd/join-token")]: path.join(again, "join-token"), [onInstance("/var/lib/bcd")]: again })[arg] ?? arg,
      ),
  );
  expect(second.code).toBe(1);
  expect(second.err).toContain("bcd: join failed: PERMISSION_DENIED: the join token is unknown or was already used");

  // The token is nowhere but the create's user_data: not in bcd's output or state, the module's
  // tables, the events, an answer, or any other request to or answer from the provider.
  for (const run of [asJoinToken, joined, second]) expect(run.out + run.err).not.toContain(secret);
  for (const file of fs.readdirSync(onInstance("/var/lib/bcd")))
    expect(fs.readFileSync(path.join(onInstance("/var/lib/bcd"), file), "utf8")).not.toContain(secret);
  const stored = await cp.store.db.execute(sql`
    SELECT (SELECT coalesce(string_agg(row_to_json(e)::text, ' '), '') FROM bc_events e) AS events,
           (SELECT coalesce(string_agg(row_to_json(h)::text, ' '), '') FROM vps_instance_history h) AS history,
           (SELECT coalesce(string_agg(row_to_json(i)::text, ' '), '') FROM vps_instances i) AS instances,
           (SELECT coalesce(string_agg(row_to_json(t)::text, ' '), '') FROM bc_join_tokens t) AS tokens`);
  expect(JSON.stringify(stored.rows)).not.toContain(secret);
  expect(JSON.stringify(await cp.call("vps.instances.get", { id }))).not.toContain(secret);
  expect(JSON.stringify(await cp.call("vps.instances.history", { instance: id }))).not.toContain(secret);
  const creates = recorder.exchanges.filter((e) => e.request.method === "POST" && e.request.path === "/v1/servers");
  expect(creates).toHaveLength(1);
  const createBody = JSON.parse(creates[0]!.request.body!) as { user_data: string };
  expect(createBody.user_data).toContain(secret);
  const withoutUserData = recorder.exchanges.map((e) =>
    e === creates[0] ? { ...e, request: { ...e.request, body: { ...createBody, user_data: "" } } } : e,
  );
  expect(JSON.stringify(withoutUserData)).not.toContain(secret);
}, 120_000);
