// The webhook sink (core/events/webhook-sink.ts) against real receivers: Node HTTP and HTTPS servers
// that check every delivery's signature with the exported verifyWebhookSignature, as an operator's
// receiver would. Registration refuses URLs that reach private or local addresses (SSRF) and
// secrets that are not references; a redirect, a non-2xx answer, a silent receiver and a refused
// connection are failures with typed errors; the secret is in no error, no log line and no header.
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, request as httpsRequest } from "node:https";
import type { AddressInfo } from "node:net";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import {
  betterCompute,
  verifyWebhookSignature,
  webhookSink,
  type SinkContext,
  type SinkEvent,
  type WebhookSinkOptions,
} from "better-compute";
import { ComputeError } from "better-compute/core";
import { drainSinks } from "../../core/events/dispatch.ts";
import { createLogger } from "../../core/log.ts";
import { applyMigrations } from "../../core/store/migrate.ts";
import { selfSignedCertificate } from "../../testing/tls.ts";
import { coreMigrations, openNodeStore, type NodeStore } from "../../local/node-store.ts";
import { startPglite, type PgliteServer } from "../../local/pglite-server.ts";

const SECRET = "whsec-Qm81Zx0Lp3Vb7Nc2-never-shown";
const env = { HOOK_SECRET: SECRET };

/** Resolves env: references as the dispatcher's SinkContext does; the secret store is not needed here. */
const sinkContext = (): SinkContext => ({
  env: env as SinkContext["env"],
  secret: async (ref) => {
    const value = ref.startsWith("env:") ? (env as Record<string, string>)[ref.slice(4)] : undefined;
    if (value === undefined) throw new ComputeError("INVALID_CONFIG", `secret reference ${ref} is not set`);
    return value;
  },
  log: createLogger({ test: "webhook-sink" }),
});

const events = (from: number, count: number): SinkEvent[] =>
  Array.from({ length: count }, (_, i) => ({
    id: from + i,
    eventId: `00000000-0000-4000-8000-${String(from + i).padStart(12, "0")}`,
    type: "node.joined",
    module: "agents",
    subject: `node:n${from + i}`,
    data: { hostname: `n${from + i}` },
    occurredAt: "2026-11-01T00:00:00.000Z",
  }));

interface Delivery {
  headers: IncomingMessage["headers"];
  body: string;
  /** What verifyWebhookSignature said about it, with the receiver's copy of the secret. */
  verified: boolean;
}

interface Receiver {
  url: string;
  deliveries: Delivery[];
}

type Answer = (req: IncomingMessage, res: ServerResponse) => void;

const servers: Server[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  await Promise.all(servers.splice(0).map((s) => new Promise<void>((resolve) => (s.closeAllConnections(), s.close(() => resolve())))));
});

/** A receiver that records every request, checks its signature, and answers with `answer` (default 204). */
async function receiver(answer: Answer = (_req, res) => res.writeHead(204).end(), tls?: { key: string; cert: string }): Promise<Receiver> {
  const deliveries: Delivery[] = [];
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks).toString("utf8");
      const verified = await verifyWebhookSignature(
        SECRET,
        String(req.headers["x-bc-timestamp"] ?? ""),
        body,
        String(req.headers["x-bc-signature"] ?? ""),
      );
      deliveries.push({ headers: req.headers, body, verified });
      answer(req, res);
    });
  };
  const server = tls ? createHttpsServer(tls, handle) : createHttpServer(handle);
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `${tls ? "https" : "http"}://127.0.0.1:${port}/hooks/bc?token=receiver-path-token`, deliveries };
}

/** A sink for a local receiver: loopback over http needs both allowances. */
const localSink = (url: string, extra: Partial<WebhookSinkOptions> = {}) =>
  webhookSink({ id: "hooks", url, secret: "env:HOOK_SECRET", allowHttp: true, allowPrivate: true, ...extra });

async function failure(promise: Promise<unknown>): Promise<ComputeError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ComputeError);
  return err as ComputeError;
}

/** Everything an error shows a caller or a log: its message, details and JSON. */
const shown = (err: ComputeError) => `${err.message} ${JSON.stringify(err.details)} ${JSON.stringify(err)}`;

describe("webhook sink: delivery", () => {
  it("POSTs the batch as JSON, signed so the receiver's verifyWebhookSignature accepts it, with a stable delivery id", async () => {
    const hook = await receiver();
    const sink = localSink(hook.url);
    expect(sink).toMatchObject({ contract: "sink", kind: "events", id: "hooks", version: "1" });

    const batch = events(7, 3);
    await sink.deliver(batch, sinkContext());
    await sink.deliver(batch, sinkContext());

    expect(hook.deliveries).toHaveLength(2);
    const [first, again] = hook.deliveries;
    expect(first!.verified).toBe(true);
    expect(JSON.parse(first!.body)).toEqual({ events: batch });
    expect(first!.headers["content-type"]).toBe("application/json");
    expect(first!.headers["x-bc-signature"]).toMatch(/^v1=[0-9a-f]{64}$/);
    // A redelivery of the same events carries the same id: the receiver dedupes by it.
    expect(first!.headers["x-bc-delivery"]).toBe("hooks:7-9");
    expect(again!.headers["x-bc-delivery"]).toBe("hooks:7-9");
    // The secret itself never travels.
    expect(JSON.stringify(hook.deliveries)).not.toContain(SECRET);
  });

  it("verifyWebhookSignature refuses another secret, a changed body, a changed timestamp and an old delivery", async () => {
    const hook = await receiver();
    await localSink(hook.url).deliver(events(1, 2), sinkContext());
    const { headers, body } = hook.deliveries[0]!;
    const timestamp = String(headers["x-bc-timestamp"]);
    const signature = String(headers["x-bc-signature"]);

    expect(await verifyWebhookSignature(SECRET, timestamp, body, signature)).toBe(true);
    expect(await verifyWebhookSignature(SECRET, timestamp, new TextEncoder().encode(body), signature)).toBe(true);
    expect(await verifyWebhookSignature("another-secret", timestamp, body, signature)).toBe(false);
    expect(await verifyWebhookSignature(SECRET, timestamp, body.replace('"n1"', '"n9"'), signature)).toBe(false);
    expect(await verifyWebhookSignature(SECRET, String(Number(timestamp) + 1), body, signature)).toBe(false);
    expect(await verifyWebhookSignature(SECRET, timestamp, body, signature.replace("v1=", "v2="))).toBe(false);
    expect(await verifyWebhookSignature(SECRET, timestamp, body, "garbage")).toBe(false);
    // Captured and replayed ten minutes later: too old, though the signature is right.
    const later = Number(timestamp) + 600;
    expect(await verifyWebhookSignature(SECRET, timestamp, body, signature, { nowSeconds: later })).toBe(false);
    expect(await verifyWebhookSignature(SECRET, timestamp, body, signature, { nowSeconds: later, toleranceSeconds: 900 })).toBe(true);
  });

  it("delivers over https to a receiver whose certificate the sink's fetch trusts", async () => {
    const cert = selfSignedCertificate("hooks.example", { altNames: ["IP:127.0.0.1"] });
    const hook = await receiver(undefined, cert);
    const sink = webhookSink({ id: "hooks", url: hook.url, secret: "env:HOOK_SECRET", allowPrivate: true, fetch: httpsFetch(cert.cert) });
    await sink.deliver(events(1, 1), sinkContext());
    expect(hook.deliveries).toHaveLength(1);
    expect(hook.deliveries[0]!.verified).toBe(true);
  });

  it("sends an audit sink's rows the same way, and the operator's extra headers", async () => {
    const hook = await receiver();
    const sink = localSink(hook.url, { kind: "audit", headers: { "x-tenant": "acme" } });
    expect(sink.kind).toBe("audit");
    await sink.deliver(events(1, 1), sinkContext());
    expect(hook.deliveries[0]!.verified).toBe(true);
    expect(hook.deliveries[0]!.headers["x-tenant"]).toBe("acme");
  });
});

describe("webhook sink: failures", () => {
  it("a redirect is a failure and is not followed", async () => {
    const elsewhere = await receiver();
    const hook = await receiver((_req, res) => res.writeHead(302, { location: elsewhere.url }).end());
    const err = await failure(localSink(hook.url).deliver(events(1, 2), sinkContext()));
    expect(err.code).toBe("DRIVER_ERROR");
    expect(err.message).toMatch(/redirected \(302\)/);
    expect(err.details).toMatchObject({ status: 302, delivery: "hooks:1-2" });
    expect(hook.deliveries).toHaveLength(1);
    expect(elsewhere.deliveries).toHaveLength(0);
  });

  it("a non-2xx answer is a failure naming the status and quoting only a short prefix of the body", async () => {
    // A receiver that echoes far too much, the secret among it.
    const hook = await receiver((_req, res) => res.writeHead(500).end(`upstream exploded ${SECRET} ${"x".repeat(5000)}`));
    const err = await failure(localSink(hook.url).deliver(events(1, 1), sinkContext()));
    expect(err.code).toBe("DRIVER_ERROR");
    expect(err.message).toContain("answered 500: upstream exploded [redacted]");
    expect(err.message.length).toBeLessThan(400);
    expect(shown(err)).not.toContain(SECRET);
    // The URL's path and query (a receiver's own token may be there) are not named, only its origin.
    expect(shown(err)).not.toContain("receiver-path-token");
    expect(err.details).toMatchObject({ sink: "hooks", origin: new URL(hook.url).origin, status: 500 });
  });

  it("a receiver that does not answer in time is DEADLINE_EXCEEDED; one that is not listening is DRIVER_ERROR", async () => {
    const silent = await receiver(() => {});
    const slow = await failure(localSink(silent.url, { timeoutMs: 200 }).deliver(events(1, 1), sinkContext()));
    expect(slow.code).toBe("DEADLINE_EXCEEDED");
    expect(slow.message).toContain("did not answer within 200 ms");

    const closed = await receiver();
    const url = closed.url;
    await new Promise<void>((resolve) => servers.pop()!.close(() => resolve()));
    const refused = await failure(localSink(url).deliver(events(1, 1), sinkContext()));
    expect(refused.code).toBe("DRIVER_ERROR");
    expect(refused.message).toContain("ECONNREFUSED");
  });

  it("an unset secret reference fails the delivery naming the reference, before anything is sent", async () => {
    const hook = await receiver();
    const sink = webhookSink({ id: "hooks", url: hook.url, secret: "env:NOT_SET", allowHttp: true, allowPrivate: true });
    const err = await failure(sink.deliver(events(1, 1), sinkContext()));
    expect(err.code).toBe("INVALID_CONFIG");
    expect(err.message).toContain("env:NOT_SET");
    expect(hook.deliveries).toHaveLength(0);
  });

  it("the secret is in no log line and no error, whatever happens", async () => {
    const lines: string[] = [];
    for (const level of ["log", "info", "warn", "error", "debug"] as const) {
      vi.spyOn(console, level).mockImplementation((...args: unknown[]) => void lines.push(args.map(String).join(" ")));
    }
    const ok = await receiver();
    const echo = await receiver((req, res) => res.writeHead(401).end(`bad signature ${String(req.headers["x-bc-signature"])} ${SECRET}`));
    const errors: ComputeError[] = [];
    await localSink(ok.url).deliver(events(1, 2), sinkContext());
    errors.push(await failure(localSink(echo.url).deliver(events(3, 1), sinkContext())));
    for (const err of errors) sinkContext().log.error("delivery failed", { error: err.toJSON() });

    expect(lines.length).toBeGreaterThan(0);
    expect(lines.join("\n")).not.toContain(SECRET);
    expect(errors.map(shown).join("\n")).not.toContain(SECRET);
  });
});

describe("webhook sink: through the dispatcher", () => {
  const DEPLOYMENT_SECRET = "webhook-sink-test-0123456789abcdef";
  let pglite: PgliteServer;
  let store: NodeStore;

  beforeAll(async () => {
    pglite = await startPglite();
    store = await openNodeStore(pglite.connectionString);
    await applyMigrations(store, [...coreMigrations(), ...betterCompute({ secret: DEPLOYMENT_SECRET }).migrations()]);
  }, 60_000);

  afterAll(async () => {
    await store?.close();
    await pglite?.stop();
  });

  it("delivers every published event in order, once the receiver stops refusing; no secret in the cursor, the logs or the events", async () => {
    const lines: string[] = [];
    for (const level of ["log", "info", "warn", "error", "debug"] as const) {
      vi.spyOn(console, level).mockImplementation((...args: unknown[]) => void lines.push(args.map(String).join(" ")));
    }
    // Refuses the first two deliveries, echoing the secret as a careless receiver might.
    let refusals = 2;
    const hook = await receiver((_req, res) => (refusals-- > 0 ? res.writeHead(503).end(`busy ${SECRET}`) : res.writeHead(204).end()));

    // The signing secret sealed in the secret store, the sink holding only its reference.
    const ref = await store.transaction((tx) =>
      betterCompute({ secret: DEPLOYMENT_SECRET })
        .moduleContext("core", {}, store)
        .secrets.put(tx, { module: "core", name: "hook-signing", value: SECRET }),
    );
    const compute = betterCompute({
      secret: DEPLOYMENT_SECRET,
      sinks: { events: [localSink(hook.url, { secret: `secret:${ref.slice("secret://".length)}` })] },
    });
    const ctx = compute.moduleContext("core", {}, store);
    await store.transaction(async (tx) => {
      for (let i = 1; i <= 5; i++) await ctx.events.publish(tx, { type: "test.tick", subject: `tick:${i}`, data: { i } });
    });

    let delivered = 0;
    for (let pass = 0; pass < 10 && delivered === 0; pass++) {
      const result = await drainSinks(ctx);
      delivered += result.delivered;
      if (result.delivered === 0) {
        const cursor = await store.db.execute(sql`SELECT last_error FROM bc_sink_cursors WHERE sink = 'hooks'`);
        expect(String(cursor.rows[0]!.last_error)).toContain("answered 503");
        // The backoff passes (business time moves on).
        await store.db.execute(
          sql`UPDATE bc_clock SET skew = skew + make_interval(secs => ${Math.ceil((result.nextInMs ?? 0) / 1000) + 1})`,
        );
      }
    }

    expect(delivered).toBe(5);
    expect(hook.deliveries).toHaveLength(3);
    expect(hook.deliveries.every((d) => d.verified)).toBe(true);
    // The retries are the same batch: one delivery id, the events in the order they were published.
    expect(new Set(hook.deliveries.map((d) => d.headers["x-bc-delivery"])).size).toBe(1);
    const received = JSON.parse(hook.deliveries[2]!.body).events as SinkEvent[];
    expect(received.map((e) => e.data)).toEqual([1, 2, 3, 4, 5].map((i) => ({ i })));

    const kept = await store.db.execute(sql`
      SELECT (SELECT coalesce(string_agg(data::text, ' '), '') FROM bc_events) AS events,
             (SELECT coalesce(string_agg(coalesce(last_error, ''), ' '), '') FROM bc_sink_cursors) AS cursors`);
    expect(JSON.stringify(kept.rows)).not.toContain(SECRET);
    expect(lines.join("\n")).toContain("answered 503");
    expect(lines.join("\n")).not.toContain(SECRET);
  });
});

describe("webhook sink: registration", () => {
  const register = (options: Partial<WebhookSinkOptions>) => () =>
    betterCompute({
      sinks: { events: [webhookSink({ id: "hooks", url: "https://hooks.example.com/bc", secret: "env:HOOK_SECRET", ...options })] },
    });

  function refusal(fn: () => unknown): ComputeError {
    try {
      fn();
    } catch (err) {
      expect(err).toBeInstanceOf(ComputeError);
      expect((err as ComputeError).code).toBe("INVALID_CONFIG");
      return err as ComputeError;
    }
    throw new Error("expected INVALID_CONFIG, but the configuration was accepted");
  }

  it("accepts a public https URL with a secret reference, and registers the sink", () => {
    expect([...register({})().registry.extensions.keys()]).toContain("sink:hooks@1");
    expect(() => register({ secret: "secret:hook-signing" })()).not.toThrow();
  });

  it.each([
    ["https://127.0.0.1/", "loopback"],
    ["https://127.8.9.10:8443/", "loopback"],
    ["https://0x7f.1/", "loopback"], // the URL parser's 127.0.0.1
    ["https://2130706433/", "loopback"],
    ["https://[::1]/", "loopback"],
    ["https://10.1.2.3/", "private"],
    ["https://172.16.0.1/", "private"],
    ["https://172.31.255.255/", "private"],
    ["https://192.168.1.1/", "private"],
    ["https://169.254.169.254/latest/meta-data", "link-local"],
    ["https://100.64.0.1/", "carrier-grade NAT"],
    ["https://0.0.0.0/", "unspecified"],
    ["https://[::]/", "unspecified"],
    ["https://224.0.0.1/", "multicast"],
    ["https://[ff02::1]/", "multicast"],
    ["https://[fd12:3456::1]/", "unique local"],
    ["https://[fe80::1]/", "link-local"],
    ["https://[::ffff:127.0.0.1]/", "loopback"],
    ["https://[::ffff:a9fe:a9fe]/", "link-local"],
    ["https://[64:ff9b::a00:1]/", "private"],
    ["https://[2002:c0a8:101::1]/", "private"],
    ["https://localhost/", "localhost"],
    ["https://LOCALHOST./", "localhost"],
    ["https://api.localhost/", "localhost"],
    ["https://metadata.google.internal/", ".internal"],
  ])("refuses %s (%s) unless allowPrivate", (url, what) => {
    const err = refusal(register({ url }));
    expect(err.message).toContain(what);
    expect(err.message).toContain("allowPrivate");
    expect(err.details).toMatchObject({ sink: "hooks" });
    expect(() => register({ url, allowPrivate: true })()).not.toThrow();
  });

  it.each([
    "https://8.8.8.8/",
    "https://172.32.0.1/",
    "https://[2606:4700::1111]/",
    "https://100.128.0.1/",
    "https://internal.example.com/",
  ])("accepts the public address %s", (url) => {
    expect(() => register({ url })()).not.toThrow();
  });

  it("refuses http:// unless allowHttp, and any other scheme", () => {
    expect(refusal(register({ url: "http://hooks.example.com/bc" })).message).toContain("allowHttp");
    expect(() => register({ url: "http://hooks.example.com/bc", allowHttp: true })()).not.toThrow();
    // allowHttp does not allow a private address.
    expect(refusal(register({ url: "http://127.0.0.1/", allowHttp: true })).message).toContain("loopback");
    expect(refusal(register({ url: "ftp://hooks.example.com/" })).message).toContain("https://");
    expect(refusal(register({ url: "hooks.example.com/bc" })).message).toContain("not a valid absolute URL");
  });

  it("refuses a URL with credentials without quoting them", () => {
    const err = refusal(register({ url: "https://bc:hunter2-pass@hooks.example.com/bc" }));
    expect(err.message).toContain("credentials");
    expect(shown(err)).not.toContain("hunter2-pass");
  });

  it("refuses a secret that is not a reference without quoting it", () => {
    // The value itself put where the reference goes: refused, and not repeated back.
    expect(shown(refusal(register({ secret: SECRET })))).not.toContain(SECRET);
    for (const secret of [SECRET, "env:", "env:lower-case-dash", "secret:", "vault:hook"]) {
      expect(refusal(register({ secret })).message).toContain('"env:NAME" or "secret:<id>"');
    }
  });

  it("refuses headers the sink sets itself and a timeout that is not a positive number of milliseconds", () => {
    expect(refusal(register({ headers: { "X-BC-Signature": "v1=forged" } })).message).toContain("X-BC-Signature");
    expect(refusal(register({ headers: { "Content-Type": "text/plain" } })).message).toContain("Content-Type");
    expect(refusal(register({ timeoutMs: 0 })).message).toContain("timeoutMs");
  });
});

/** Node's fetch trusts only the system's CAs; this one sends through node:https trusting `ca` (the receiver's self-signed certificate). */
function httpsFetch(ca: string) {
  return (input: string, init: RequestInit) =>
    new Promise<Response>((resolve, reject) => {
      const req = httpsRequest(
        input,
        { method: init.method, headers: init.headers as Record<string, string>, ca, signal: init.signal ?? undefined },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          // A 204 has no body, and Response refuses one for it.
          res.on("end", () => resolve(new Response(chunks.length ? Buffer.concat(chunks) : null, { status: res.statusCode })));
        },
      );
      req.on("error", reject);
      req.end(init.body as string);
    });
}
