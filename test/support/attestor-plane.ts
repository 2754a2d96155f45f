// A control plane for attestor tests: the real betterCompute (JoinService and the API) with the
// attestors under test, on PGlite, served over node:http so the real bcd CLI joins it in a
// process of its own. Nothing is simulated but the machine's hardware and cloud.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { sql } from "drizzle-orm";
import { betterCompute, type Extension } from "better-compute";
import { callApi } from "../../testing/metal-sim-control-plane.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startPglite } from "../../local/pglite-server.ts";

export interface AttestorPlane {
  /** The control plane's URL (http://127.0.0.1:PORT). */
  url: string;
  store: NodeStore;
  call<T>(method: string, input?: Record<string, unknown>): Promise<T>;
  /** POST a JSON body to a path of the control plane. */
  post(path: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }>;
  /** Moves compute_now() forward. */
  advanceClock(seconds: number): Promise<void>;
  stop(): Promise<void>;
}

export async function attestorPlane(attestors: Extension[]): Promise<AttestorPlane> {
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  try {
    const pglite = await startPglite();
    cleanup.push(() => pglite.stop());
    const store = await openNodeStore(pglite.connectionString);
    cleanup.push(() => store.close());
    const secret = "attestor-plane-deployment-secret-0123456789";
    const compute = betterCompute({ secret, attestors });
    await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
    const adminKey = (await compute.mintApiKey(store, { name: "attestor-tests", roles: ["admin"] })).key;
    const env = { DATABASE_URL: pglite.connectionString, BC_DB_WS_PROXY: store.bridge, BC_SECRET: secret };

    const http: Server = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const response = await compute.fetch(
        new Request(`http://bc.test${req.url}`, {
          method: req.method!,
          headers: req.headers as Record<string, string>,
          ...(chunks.length ? { body: Buffer.concat(chunks) } : {}),
        }),
        env,
      );
      res.writeHead(response.status, Object.fromEntries(response.headers));
      res.end(Buffer.from(await response.arrayBuffer()));
    });
    await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
    cleanup.push(async () => {
      http.closeAllConnections();
      await new Promise((resolve) => http.close(resolve));
    });
    const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;

    return {
      url,
      store,
      call: (method, input) => callApi(url, adminKey, method, input),
      async post(path, body) {
        const res = await fetch(url + path, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        return { status: res.status, body: (await res.json()) as Record<string, unknown> };
      },
      async advanceClock(seconds) {
        await store.db.execute(sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${seconds})`);
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The real bcd CLI in a process of its own, to its end. */
export { runBcd as bcd } from "../../local/bcd-process.ts";
