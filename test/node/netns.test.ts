// The emulated site's network namespaces (testing/netns.ts): the host's loopback servers reach
// inside only through relays, a server inside reaches the host only through a forward, and a run
// that was killed leaves namespaces the next run removes (they are named for the pid that made
// them). Linux and root; skipped elsewhere.
import { execFile, execFileSync, spawn, spawnSync } from "node:child_process";
import { promisify } from "node:util";
import { createServer, type Server } from "node:http";
import net, { type AddressInfo } from "node:net";
import { afterAll, describe, expect, it } from "vitest";
import { canMakeNetns, makeNetns, removeLeftoverNetns, type Netns } from "../../testing/netns.ts";

const PREFIX = "bc-nstest";
const made: Netns[] = [];
if (canMakeNetns()) removeLeftoverNetns(PREFIX); // an earlier run's, killed before its afterAll
let server: Server | undefined;
afterAll(async () => {
  for (const ns of made) await ns.remove();
  server?.close();
});

const namespaces = () => execFileSync("ip", ["netns", "list"], { encoding: "utf8" });
/** GET inside the namespace with busybox wget (asynchronously: the relay's other end is this process): its body, or undefined. */
const getInside = (ns: Netns, url: string) =>
  promisify(execFile)(ns.prefix[0]!, [...ns.prefix.slice(1), "busybox", "wget", "-O", "-", url]).then(
    (run) => run.stdout,
    () => undefined,
  );

describe.skipIf(!canMakeNetns() || spawnSync("sh", ["-c", "command -v socat && command -v busybox"]).status !== 0)(
  "network namespaces",
  () => {
    it("a relay brings a loopback server inside at the same port; nothing else of the host is reachable", async () => {
      server = createServer((_req, res) => res.end("from the host"));
      await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
      const port = (server.address() as AddressInfo).port;
      const ns = makeNetns(PREFIX, "relay");
      made.push(ns);
      expect(await getInside(ns, `http://127.0.0.1:${port}/`)).toBeUndefined(); // its own loopback: nothing there yet
      await ns.relay(port, port, "127.0.0.1");
      expect(await getInside(ns, `http://127.0.0.1:${port}/`)).toBe("from the host");
      expect(execFileSync("ip", ["-n", ns.name, "route", "show"], { encoding: "utf8" }).trim()).toBe(""); // no route anywhere
    });

    it("a forward brings a server inside to the host's loopback", async () => {
      const ns = makeNetns(PREFIX, "fwd");
      made.push(ns);
      ns.ip("link", "add", "br0", "type", "bridge");
      ns.ip("addr", "add", "10.79.0.1/24", "dev", "br0");
      ns.ip("link", "set", "br0", "up");
      // A server inside: a socat answering one line to each connection.
      const inside = spawn(
        ns.prefix[0]!,
        [...ns.prefix.slice(1), "socat", "TCP-LISTEN:8780,bind=10.79.0.1,fork", "SYSTEM:echo from inside"],
        {
          stdio: "ignore",
        },
      );
      try {
        await new Promise((r) => setTimeout(r, 300));
        const port = await ns.forward("10.79.0.1", 8780);
        const got = await new Promise<string>((resolve, reject) => {
          const socket = net.connect(port, "127.0.0.1");
          let text = "";
          socket.on("data", (d: Buffer) => (text += d));
          socket.on("end", () => resolve(text));
          socket.on("error", reject);
        });
        expect(got.trim()).toBe("from inside");
      } finally {
        inside.kill("SIGKILL");
      }
    });

    it("the next run removes what a killed run left (its pid gone), and never a live run's", async () => {
      const dead = spawnSync("true").pid!; // exited: its pid names no live process
      const leftover = `${PREFIX}-left-${dead}`;
      execFileSync("ip", ["netns", "add", leftover]);
      const live = makeNetns(PREFIX, "live");
      made.push(live);
      expect(namespaces()).toContain(leftover);
      removeLeftoverNetns(PREFIX);
      expect(namespaces()).not.toContain(leftover);
      expect(namespaces()).toContain(live.name);
    });
  },
);
