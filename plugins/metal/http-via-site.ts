// httpViaSite: how a control-plane step talks to an agentless machine (Talos's API, a BMC-less
// installer): through its site agent's site.httpProxy command, never directly. Everything that
// could point the site agent elsewhere is refused here, before a command exists: a host that is
// not one of the machine's own recorded addresses, names, credentials in the URL, plain HTTP off
// the pool's provisioning networks, forbidden headers. The agent checks the request again.
import { sql } from "drizzle-orm";
import { one, rows, type SecretRef } from "better-compute/core";
import { StepError, stepNotReady, type StepContext } from "better-compute/provision";
import { inCidr, parseIp, sameIp } from "./addresses.ts";
import { HTTP_PROXY_KIND, httpProxyBody, type HttpProxyAnswer } from "./http-proxy.ts";
import { siteAgentOf } from "./steps.ts";

export interface HttpViaSiteRequest {
  url: string;
  method?: "GET" | "POST" | "PUT" | "DELETE";
  headers?: Record<string, string>;
  /** Header values by secret reference: the command keeps the reference, the site agent gets the value. */
  secretHeaders?: Record<string, SecretRef>;
  body?: string;
  /** base64 SHA-256 of the machine certificate's SubjectPublicKeyInfo; required for https. */
  tlsSpkiSha256?: string;
  timeoutMs?: number;
  /** Names the request within the step's attempt (default "default"): one command per key. */
  key?: string;
  /** A readiness loop: each call returns the newest settled answer and sends the next request. */
  poll?: boolean;
}

/** What the site agent answered: the machine's HTTP response, or why there was none (DRIVER_ERROR...). */
export type HttpViaSiteAnswer = ({ ok: true } & HttpProxyAnswer) | { ok: false; error: { code: string; message: string } };

const refuse = (message: string): never => {
  throw new StepError("INVALID_ARGUMENT", `httpViaSite: ${message}`, false);
};

/**
 * Sends the request through the site agent of the workflow's machine and returns its answer;
 * throws StepNotReady while none has settled (the step is polled again, and woken by the result).
 * The step must declare `sends: ["site.httpProxy"]` and `relays: ["site"]`.
 */
export async function httpViaSite(ctx: StepContext, request: HttpViaSiteRequest): Promise<HttpViaSiteAnswer> {
  const { key = "default", poll = false, ...rest } = request;
  if (!/^[\w.-]{1,64}$/.test(key)) refuse(`key ${JSON.stringify(key)} is not 1 to 64 letters, digits, '.', '_' or '-'`);
  const parsed = httpProxyBody.safeParse(rest);
  if (!parsed.success) refuse(parsed.error.issues.map((i) => `${i.path.join(".") || "request"}: ${i.message}`).join("; "));
  const body = parsed.data!;

  const machine = await one<{ id: string; site_id: string; addresses: string[]; policy: { provisioningCidrs?: string[] } }>(
    ctx.store.db,
    sql`
      SELECT n.id, n.site_id, n.addresses, p.policy FROM metal_nodes n JOIN metal_pools p ON p.id = n.pool_id WHERE n.id = ${ctx.workflow.target}`,
  );
  if (!machine) return refuse(`workflow ${ctx.workflow.id} does not act on a metal machine`);

  const url = new URL(body.url);
  const host = parseIp(url.hostname)!; // the schema admits IP literals only
  if (
    !machine.addresses.some((a) => {
      const ip = parseIp(a);
      return ip !== undefined && sameIp(ip, host);
    })
  ) {
    refuse(`${url.hostname} is not an address of machine ${machine.id} (recorded: ${machine.addresses.join(", ") || "none"})`);
  }
  if (url.protocol === "http:" && !(machine.policy.provisioningCidrs ?? []).some((cidr) => inCidr(host, cidr))) {
    refuse(
      `plain HTTP to ${url.hostname} is outside the pool's provisioning networks (policy.provisioningCidrs); use https with tlsSpkiSha256`,
    );
  }

  const prefix = `wf:${ctx.workflow.id}:${ctx.step.position}:${ctx.step.attempt}:http:${key}:`;
  type Row = { idempotency_key: string; state: string; result: HttpProxyAnswer | null; error: { code: string; message: string } | null };
  const sent = await rows<Row>(
    ctx.store.db,
    sql`
    SELECT idempotency_key, state, result, error FROM bc_commands
    WHERE origin = ${`workflow:${ctx.workflow.id}`} AND kind = ${HTTP_PROXY_KIND}`,
  );
  const mine = sent
    .filter((r) => r.idempotency_key.startsWith(prefix))
    .map((r) => ({ ...r, n: Number(r.idempotency_key.slice(prefix.length)) }))
    .sort((a, b) => a.n - b.n);
  const settled = mine.filter((r) => r.state === "succeeded" || r.state === "failed" || r.state === "expired");
  const latest = mine.at(-1);

  if (!latest || (poll && settled.at(-1) === latest)) {
    const siteAgent = await siteAgentOf(ctx.store.db, machine.site_id);
    if (!siteAgent) stepNotReady(`site ${machine.site_id} has no agent to relay through`);
    const secretRefs = Object.values(body.secretHeaders ?? {}) as SecretRef[];
    await ctx.store.transaction((tx) =>
      ctx.commands.enqueue(tx, {
        nodeId: siteAgent!,
        kind: HTTP_PROXY_KIND,
        key: `${prefix}${(latest?.n ?? 0) + 1}`,
        body,
        secretRefs,
        deadlineSeconds: Math.ceil((body.timeoutMs ?? 10_000) / 1000) + 60,
        origin: `workflow:${ctx.workflow.id}`,
      }),
    );
  }

  const newest = settled.at(-1);
  if (!newest) return stepNotReady(`waiting for the site agent's answer from ${url.origin}`);
  if (newest.state === "succeeded") return { ok: true, ...newest.result! };
  return { ok: false, error: newest.error ?? { code: "DEADLINE_EXCEEDED", message: "the site agent did not answer in time" } };
}
