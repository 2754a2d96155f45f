// SIMULATED Talos, for the plugin's tests: what a machine runs after booting the Talos ISO. Its
// API (an HTTPS server with the given certificate) listens on the machine's own address and
// answers /machine/version with 503 while it boots, then 200; /redirect answers a redirect.
import { createServer, type Server } from "node:https";
import type { AgentlessOs, SelfSignedCertificate } from "better-compute/testing/metal";
import { TALOS_API_PORT } from "./plugin.ts";

export interface TalosRequest {
  machine: string;
  method: string;
  url: string;
  headers: Record<string, unknown>;
}

export function talosEmulator(tls: SelfSignedCertificate, options: { bootMs?: number } = {}): { os: AgentlessOs; seen: TalosRequest[] } {
  const seen: TalosRequest[] = [];
  const os: AgentlessOs = {
    async start(machine) {
      const booted = Date.now() + (options.bootMs ?? 1500);
      const server: Server = createServer({ key: tls.key, cert: tls.cert }, (req, res) => {
        seen.push({ machine: machine.id, method: req.method ?? "", url: req.url ?? "", headers: req.headers });
        if (req.url === "/machine/version") {
          if (Date.now() < booted) return void res.writeHead(503).end("booting");
          return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ version: "v1.8.0" }));
        }
        if (req.url === "/redirect") return void res.writeHead(302, { location: "https://10.1.2.3/" }).end();
        res.writeHead(404).end();
      });
      await new Promise<void>((resolve) => server.listen(TALOS_API_PORT, machine.addresses[0], resolve));
      return {
        stop: () =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      };
    },
  };
  return { os, seen };
}
