// The vps.instances reconciler: makes each instance's server at its provider follow what the
// record wants, level-triggered. One step reads where the instance is (its job in flight, whether
// it has a server, the server's status) and makes the one call that moves it on.
//
// Crash safety: a step first CLAIMS the instance in a short transaction of its own (a lease), makes
// its provider calls with no transaction open (on PGlite an open transaction blocks every other
// connection), then records the outcome, its history and its events and releases the lease in one
// transaction guarded by the lease: a step that lost its lease writes nothing. A step that dies
// between the provider's answer and its commit loses nothing either: the next step asks find()
// for the server stamped with the instance's id before it ever calls create(), and adopts it.
import { sql } from "drizzle-orm";
import type { Reconciler } from "better-compute";
import { ComputeError, one, rows, type ModuleContext } from "better-compute/core";
import { failureOf, type Operation, type ProviderDefinition, type ProviderServer, type ServerStatus } from "./contracts.ts";
import type { InstanceRow, InstanceState } from "./instances.ts";
import { defaultFetch, loadAccount, openAccount, scrub, type OpenAccount, type VpsOptions } from "./methods.ts";
import { renderUserData } from "./user-data.ts";

/** How long a step holds an instance; renewed before each provider call, so a slow call keeps it. */
export const LEASE_SECONDS = 300;
/** A configuration error (a wrong token) waits this long, or until the account is updated: never a hot retry. */
const CONFIG_RETRY_SECONDS = 3600;
/** A settled instance is looked at again this often (its server may have been stopped or deleted at the provider). */
const RESYNC_SECONDS = 600;
const MAX_BACKOFF_SECONDS = 300;
/** Create jobs that may fail for one instance before it is failed (a provider that keeps failing it). */
const MAX_FAILED_CREATE_JOBS = 3;
/** Steps one reconcileInstance makes while each moves on without waiting for the provider (find, then get...). */
const MAX_STEPS = 4;
const BATCH = 200;
/** The single-use join token in a bcd instance's user data is good for this long. */
const JOIN_TOKEN_TTL_SECONDS = 3600;

export interface ReconcileOptions extends VpsOptions {
  /** Clients of this pass, by account: one per account per pass, so a spent rate limit is seen by every call. */
  accounts?: Map<string, Promise<OpenAccount>>;
}

export function instancesReconciler(options: VpsOptions): Reconciler {
  return {
    id: "vps.instances",
    async run(ctx) {
      // Accounts whose provider this deployment does not register are left alone (accounts.list shows registered: false).
      const registered = ctx.registered.extensions<ProviderDefinition>("provider").map((p) => `${p.id}@${p.version}`);
      const due = await rows<{ id: string; account: string }>(
        ctx.store.db,
        sql`
        SELECT i.id, a.id AS account FROM vps_instances i JOIN vps_pools p ON p.id = i.pool_id JOIN vps_accounts a ON a.id = p.account_id
        WHERE p.class = 'provider' AND i.state <> 'deleted' AND (i.state <> 'failed' OR i.desired = 'deleted')
          AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= compute_now())
          AND (i.lease_until IS NULL OR i.lease_until < compute_now())
          AND (a.paused_until IS NULL OR a.paused_until <= compute_now())
          AND a.provider || '@' || a.provider_version IN (SELECT jsonb_array_elements_text(${JSON.stringify(registered)}::jsonb))
        ORDER BY i.next_attempt_at NULLS FIRST, i.id LIMIT ${BATCH}`,
      );
      const accounts = new Map<string, Promise<OpenAccount>>();
      // One account's instances one after another (its rate limit is one window, and a spent one
      // pauses the rest), different accounts side by side: a slow provider does not hold up the others.
      const byAccount = new Map<string, string[]>();
      for (const { id, account } of due) byAccount.set(account, [...(byAccount.get(account) ?? []), id]);
      let changed = 0;
      await Promise.all(
        [...byAccount.values()].map(async (ids) => {
          for (const id of ids) {
            try {
              if (await reconcileInstance(ctx, id, { ...options, accounts })) changed++;
            } catch (err) {
              // Its lease runs out and a later pass takes it up.
              ctx.log.warn("reconciling a vps instance failed; a later pass retries", {
                instance: id,
                error: err instanceof Error ? err.message : String(err),
              });
            }
          }
        }),
      );
      return changed;
    },
  };
}

/**
 * Moves one instance on now, whatever its next_attempt_at: up to a few steps, while each makes
 * progress without waiting for the provider. Returns whether it recorded anything. A caller
 * outside the reconciler (a test) runs ctx.afterCommit() after it (a deleted bcd instance's node
 * is revoked).
 */
export async function reconcileInstance(ctx: ModuleContext, id: string, options: ReconcileOptions = {}): Promise<boolean> {
  const accounts = options.accounts ?? new Map<string, Promise<OpenAccount>>();
  let changed = false;
  for (let i = 0; i < MAX_STEPS; i++) {
    const outcome = await step(ctx, id, { ...options, accounts });
    changed ||= outcome.recorded;
    if (!outcome.again) break;
  }
  return changed;
}

// ---------------------------------------------------------------- one step

type Claimed = InstanceRow & {
  lease: string;
  /** reboot_requested_at as text, exact to the microsecond, to compare with at record time. */
  reboot_seen: string | null;
  agent: "none" | "bcd";
  location: string | null;
  account_id: string;
  offer: string | null;
  image: string | null;
};

interface HistoryEntry {
  call: string;
  outcome: "ok" | "error";
  detail: Record<string, unknown>;
}

/** What a step records; a field left out keeps its value. */
interface Outcome {
  state?: InstanceState;
  /** null forgets the server (a create job that failed): the next step finds or creates again. */
  providerId?: string | null;
  addresses?: string[];
  /** The provider's job a call started (its start is recorded on database time); null clears it. */
  pendingOp?: { id: string; call: string } | null;
  /** The reboot asked for was made. */
  rebooted?: boolean;
  /** null clears it; a successful call clears it anyway unless one is given. */
  lastError?: Record<string, unknown> | null;
  attempts?: number;
  /** Seconds until the next look; default 0 (the next pass). */
  nextInSeconds?: number;
  /** Pause every instance of the account this long (its rate limit is spent). */
  pauseAccountSeconds?: number;
  /** Take the next step now (the provider needs no time for it). */
  again?: boolean;
}

class LeaseLost extends Error {}

/** A provider call's failure, with the call it came from. */
class CallFailed extends Error {
  constructor(
    readonly call: string,
    readonly error: unknown,
  ) {
    super(`${call} failed`);
  }
}

const NOTHING = { recorded: false, again: false };

async function claim(ctx: ModuleContext, id: string): Promise<Claimed | undefined> {
  const claimed = await ctx.store.transaction(async (tx) => {
    return one<InstanceRow & { lease: string; reboot_seen: string | null }>(
      tx,
      sql`
      UPDATE vps_instances SET lease_until = compute_now() + make_interval(secs => ${LEASE_SECONDS})
      WHERE id = ${id} AND state <> 'deleted' AND (state <> 'failed' OR desired = 'deleted')
        AND (lease_until IS NULL OR lease_until < compute_now())
        -- Host pools' instances are the host reconciler's (host-instances.ts).
        AND pool_id IN (SELECT id FROM vps_pools WHERE class = 'provider')
      RETURNING *, lease_until::text AS lease, reboot_requested_at::text AS reboot_seen`,
    );
  });
  if (!claimed) return undefined;
  const pool = await one<Pick<Claimed, "agent" | "location" | "account_id" | "offer" | "image">>(
    ctx.store.db,
    sql`
      SELECT p.agent, p.location, p.account_id, f.offer, f.image
      FROM vps_pools p LEFT JOIN vps_flavors f ON f.id = ${claimed.flavor_id} AND f.pool_id = p.id WHERE p.id = ${claimed.pool_id}`,
  );
  if (!pool) {
    // Pools with instances cannot be deleted; a row edited by hand can still get here.
    await ctx.store.db.execute(
      sql`UPDATE vps_instances SET lease_until = NULL WHERE id = ${id} AND lease_until = ${claimed.lease}::timestamptz`,
    );
    throw new ComputeError("FAILED_PRECONDITION", `instance ${id}'s pool ${claimed.pool_id} does not exist`);
  }
  return { ...claimed, ...pool };
}

async function step(ctx: ModuleContext, id: string, options: ReconcileOptions & { accounts: Map<string, Promise<OpenAccount>> }) {
  const row = await claim(ctx, id);
  if (!row) return NOTHING;
  let lease = row.lease;
  const history: HistoryEntry[] = [];
  let account: OpenAccount | undefined;
  let providerName = "the provider";

  /** Keeps the lease for the next call; a step that lost it stops before calling. */
  const renew = async () => {
    const renewed = await one<{ lease: string }>(
      ctx.store.db,
      sql`
      UPDATE vps_instances SET lease_until = compute_now() + make_interval(secs => ${LEASE_SECONDS})
      WHERE id = ${id} AND lease_until = ${lease}::timestamptz RETURNING lease_until::text AS lease`,
    );
    const next = renewed?.lease;
    if (!next) throw new LeaseLost();
    lease = next;
  };

  /** One provider call, recorded in the step's history. */
  const call = async <T>(name: string, fn: () => Promise<T>, detail: (result: T) => Record<string, unknown>): Promise<T> => {
    await renew();
    await options.hooks?.beforeCall?.(name, id);
    let result: T;
    try {
      result = await fn();
    } catch (err) {
      throw new CallFailed(name, err);
    }
    history.push({ call: name, outcome: "ok", detail: detail(result) });
    await options.hooks?.afterCall?.(name, id);
    return result;
  };

  /** Records the outcome and releases the lease, in one transaction guarded by the lease. */
  const record = async (outcome: Outcome) => {
    const secrets = account?.secrets ?? [];
    await ctx.store.transaction(async (tx) => {
      const state = outcome.state ?? row.state;
      const lastError = outcome.lastError !== undefined ? outcome.lastError : history.length ? null : row.last_error;
      const updated = await tx.execute(sql`
        UPDATE vps_instances SET
          state = ${state},
          provider_id = ${outcome.providerId === undefined ? row.provider_id : outcome.providerId},
          addresses = ${outcome.addresses ? sql`ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(outcome.addresses)}::jsonb))` : sql`addresses`},
          pending_op = ${
            outcome.pendingOp === undefined
              ? sql`pending_op`
              : outcome.pendingOp === null
                ? null
                : sql`jsonb_build_object('id', ${outcome.pendingOp.id}::text, 'call', ${outcome.pendingOp.call}::text, 'startedAt', compute_now())`
          },
          reboot_requested_at = CASE WHEN ${outcome.rebooted === true} AND reboot_requested_at = ${row.reboot_seen}::timestamptz
                                     THEN NULL ELSE reboot_requested_at END,
          attempts = ${outcome.attempts ?? 0},
          last_error = ${lastError === null ? null : scrub(JSON.stringify(lastError), secrets)}::jsonb,
          -- A method that changed what is wanted during the step gets the next look at once.
          next_attempt_at = CASE WHEN desired <> ${row.desired} OR reboot_requested_at IS DISTINCT FROM ${row.reboot_seen}::timestamptz
                                 THEN compute_now() ELSE compute_now() + make_interval(secs => ${outcome.nextInSeconds ?? 0}) END,
          state_changed_at = CASE WHEN state <> ${state} THEN compute_now() ELSE state_changed_at END,
          updated_at = compute_now(),
          lease_until = NULL
        WHERE id = ${id} AND lease_until = ${lease}::timestamptz
        RETURNING id`);
      if (updated.rows.length === 0) throw new LeaseLost();
      for (const entry of history) {
        await tx.execute(sql`
          INSERT INTO vps_instance_history (instance_id, call, outcome, detail)
          VALUES (${id}, ${entry.call}, ${entry.outcome}, ${scrub(JSON.stringify(entry.detail), secrets)}::jsonb)`);
      }
      if (outcome.pauseAccountSeconds)
        await tx.execute(sql`
          UPDATE vps_accounts SET paused_until = greatest(coalesce(paused_until, compute_now()), compute_now() + make_interval(secs => ${outcome.pauseAccountSeconds}))
          WHERE id = ${row.account_id}`);
      if (state !== row.state) {
        await ctx.events.publish(tx, {
          type: `vps.instance.${state}`,
          subject: `vps/instances/${id}`,
          data: {
            from: row.state,
            providerId: outcome.providerId === undefined ? row.provider_id : outcome.providerId,
            ...(outcome.addresses ? { addresses: outcome.addresses } : {}),
            ...(state === "failed" && lastError ? { error: { code: lastError.code, message: lastError.message } } : {}),
          },
        });
        // A bcd instance's node must not outlive it.
        if (state === "deleted" && row.agent === "bcd")
          await ctx.nodes.revoke(tx, { role: "node", labels: { "bc.dev/vps-instance": id } }, `vps instance ${id} was deleted`);
      }
    });
    return { recorded: true, again: outcome.again === true };
  };

  let outcome: Outcome;
  try {
    const paused = await one<{ seconds: number }>(
      ctx.store.db,
      sql`
        SELECT greatest(0, ceil(extract(epoch FROM paused_until - compute_now())))::int AS seconds FROM vps_accounts
        WHERE id = ${row.account_id} AND paused_until > compute_now()`,
    );
    if (paused) {
      await ctx.store.db.execute(sql`
        UPDATE vps_instances SET lease_until = NULL, next_attempt_at = compute_now() + make_interval(secs => ${paused.seconds})
        WHERE id = ${id} AND lease_until = ${lease}::timestamptz`);
      return NOTHING;
    }
    const accountId = row.account_id;
    let opening = options.accounts.get(accountId);
    if (!opening) {
      opening = loadAccount(ctx.store.db, accountId).then((a) => openAccount(ctx, a, options.fetch ?? defaultFetch));
      options.accounts.set(accountId, opening);
    }
    account = await opening;
    providerName = account.provider.id;
    outcome = await decide(ctx, row, account, call, options);
  } catch (err) {
    if (err instanceof LeaseLost) return NOTHING;
    if (err instanceof CallFailed) outcome = failed(providerName, err, history, account?.secrets ?? [], row.attempts);
    // Not the provider's answer but ours (the account's provider is gone, its config no longer fits, a
    // bcd pool without agentUrl): wait like a configuration error. Anything else is a crash.
    else if (err instanceof ComputeError && (err.code === "INVALID_CONFIG" || err.code === "FAILED_PRECONDITION"))
      outcome = { lastError: { code: err.code, message: err.message, failure: "config" }, nextInSeconds: CONFIG_RETRY_SECONDS };
    else throw err;
  }
  try {
    return await record(outcome);
  } catch (err) {
    if (err instanceof LeaseLost) return NOTHING;
    throw err;
  }
}

type Call = <T>(name: string, fn: () => Promise<T>, detail: (result: T) => Record<string, unknown>) => Promise<T>;

/** The instance's state as the provider's status says; undefined: keep the recorded one. */
const STATE_OF: Record<ServerStatus, InstanceState | undefined> = {
  creating: "creating",
  starting: "starting",
  running: "running",
  stopping: "stopping",
  stopped: "stopped",
  deleting: "deleting",
  unknown: undefined,
};
const SETTLED: ServerStatus[] = ["running", "stopped"];

const serverDetail = (s: ProviderServer | null) =>
  s ? { providerId: s.id, status: s.status, ...(s.incomplete ? { incomplete: true } : {}) } : { found: false };
const opDetail = (op: Operation | void) => (op ? { operation: op.id } : {});

/** The one call that moves the instance on, from where it is. */
async function decide(ctx: ModuleContext, row: Claimed, account: OpenAccount, call: Call, options: VpsOptions): Promise<Outcome> {
  const { client, provider } = account;
  const startedOp = (op: Operation | void, name: string) => (op ? { id: op.id, call: name } : null);

  // A job in flight: wait for it to end (a delete asked for meanwhile waits too).
  if (row.pending_op) {
    const op = row.pending_op;
    const state = await call(
      "operation",
      () => client.operation(op.id),
      (s) => ({ operation: op.id, of: op.call, state: s.state, ...(s.state === "failed" ? { message: s.message } : {}) }),
    );
    if (state.state === "running") return {};
    if (state.state === "succeeded") return { pendingOp: null, again: true };
    const lastError = {
      code: "DRIVER_ERROR",
      message: `${provider.id}: the ${op.call} job failed: ${state.message}`,
      provider: provider.id,
    };
    const retry = { pendingOp: null, lastError, attempts: row.attempts + 1, nextInSeconds: backoff(row.attempts + 1) };
    if (op.call !== "create") return retry;
    // A failed create job (a provider's hiccup, often) left no server or one that is off: start
    // over from find, which adopts what is there or creates again. Only repeated failures fail it.
    if ((await failedCreateJobs(ctx, row.id)) + 1 >= MAX_FAILED_CREATE_JOBS) return { state: "failed", pendingOp: null, lastError };
    return { ...retry, providerId: null, state: "pending" };
  }

  // No server known: find the one stamped with the instance's id, or create it.
  if (!row.provider_id) {
    const found = await call("find", () => client.find(row.id), serverDetail);
    // A create cut short half-way is finished by creating again, unless the instance is to go anyway.
    if (found && (!found.incomplete || row.desired === "deleted"))
      return { providerId: found.id, state: STATE_OF[found.status] ?? "creating", addresses: found.addresses, again: true };
    if (!found && row.desired === "deleted") return { state: "deleted" };
    if (!row.offer || !row.image) throw new ComputeError("FAILED_PRECONDITION", `instance ${row.id}'s flavor ${row.flavor_id} is gone`);
    const userData = renderUserData({ hostname: row.name, sshKeys: row.ssh_keys, join: await joinFor(ctx, row, options) });
    const created = await call(
      "create",
      () =>
        client.create({
          instanceId: row.id,
          // The server is named after the instance id, unique in the deployment: two tenants'
          // "web" never clash in one provider account. The hostname is the tenant's name.
          name: row.id,
          hostname: row.name,
          flavor: row.offer!,
          image: row.image!,
          ...(row.location ? { location: row.location } : {}),
          sshKeys: row.ssh_keys,
          userData,
        }),
      (c) => ({ ...serverDetail(c.server), ...opDetail(c.operation) }),
    );
    return {
      providerId: created.server.id,
      state: created.operation ? "creating" : (STATE_OF[created.server.status] ?? "creating"),
      addresses: created.server.addresses,
      pendingOp: startedOp(created.operation, "create"),
    };
  }

  const id = row.provider_id;
  const server = await call("get", () => client.get(id), serverDetail);
  if (!server) {
    if (row.desired === "deleted") return { state: "deleted", addresses: [] };
    return {
      state: "failed",
      lastError: { code: "DRIVER_ERROR", message: `the server disappeared at ${provider.id} (its id was ${id})`, provider: provider.id },
    };
  }
  const observed = { state: STATE_OF[server.status] ?? row.state, addresses: server.addresses };
  // On its way somewhere: look again next pass. A server in a status the adapter does not know, or
  // one whose create was cut short (it goes no further by itself), is not waited for when it is to be deleted.
  const moving =
    !SETTLED.includes(server.status) && !(row.desired === "deleted" && (server.status === "unknown" || server.incomplete === true));
  if (moving) return observed;

  if (row.desired === "deleted") {
    const op = await call("delete", () => client.delete(id), opDetail);
    return { ...observed, state: "deleting", pendingOp: startedOp(op, "delete"), again: !op };
  }
  if (row.desired === "running" && server.status === "stopped") {
    const op = await call("powerOn", () => client.powerOn(id), opDetail);
    return { ...observed, state: "starting", pendingOp: startedOp(op, "powerOn") };
  }
  if (row.desired === "stopped" && server.status === "running") {
    const op = await call("powerOff", () => client.powerOff(id), opDetail);
    return { ...observed, state: "stopping", pendingOp: startedOp(op, "powerOff") };
  }
  if (row.desired === "running" && row.reboot_requested_at) {
    const op = await call("reboot", () => client.reboot(id), opDetail);
    return { ...observed, rebooted: true, pendingOp: startedOp(op, "reboot") };
  }
  // Where it should be: look again after a while, in case it changed at the provider.
  return { ...observed, lastError: null, nextInSeconds: RESYNC_SECONDS };
}

/** A bcd pool's instance joins as a node: a single-use token minted (and committed) for this create. */
async function joinFor(ctx: ModuleContext, row: Claimed, options: VpsOptions) {
  if (row.agent !== "bcd") return undefined;
  if (!options.agentUrl)
    throw new ComputeError("INVALID_CONFIG", "an agent: bcd pool needs vps({ agentUrl }) in the deployment's config", {
      failure: "config",
    });
  const minted = await ctx.store.transaction((tx) =>
    ctx.pki.mintJoinToken(tx, {
      role: "node",
      labels: { "bc.dev/vps-instance": row.id, "bc.dev/vps-pool": row.pool_id },
      ttlSeconds: JOIN_TOKEN_TTL_SECONDS,
    }),
  );
  return { url: options.agentUrl, token: minted.token };
}

/** 2, 4, 8 ... seconds, capped. */
const backoff = (attempts: number) => Math.min(MAX_BACKOFF_SECONDS, 2 ** attempts);

/** What a failed call records, as its failure says: never a hot retry. */
function failed(provider: string, err: CallFailed, history: HistoryEntry[], secrets: string[], attempts: number): Outcome {
  const error = errorOf(err.error, provider, err.call, secrets);
  history.push({ call: err.call, outcome: "error", detail: error });
  switch (failureOf(err.error)) {
    case "config":
      return { lastError: error, nextInSeconds: CONFIG_RETRY_SECONDS };
    case "transient": {
      const retryAfter = typeof error.retryAfterSeconds === "number" ? error.retryAfterSeconds : undefined;
      // The whole account waits out a spent rate limit, so no other instance of it calls before the reset.
      const rateLimited = retryAfter !== undefined && /rate/i.test(String(error.reason ?? ""));
      return {
        lastError: error,
        attempts: attempts + 1,
        // The provider's reset when it gives one, and never sooner than the backoff: a failing provider is asked less and less.
        nextInSeconds: Math.max(retryAfter ?? 0, backoff(attempts + 1)),
        ...(rateLimited ? { pauseAccountSeconds: retryAfter } : {}),
      };
    }
    default:
      // Capacity or a refusal: a create will not succeed by itself; any other call waits like a configuration error.
      if (err.call === "create") return { state: "failed", lastError: { ...error, code: "DRIVER_ERROR" } };
      return { lastError: error, nextInSeconds: CONFIG_RETRY_SECONDS };
  }
}

/** An error as recorded: code, message (secrets scrubbed), failure, and the provider's reason and status. */
function errorOf(err: unknown, provider: string, call: string, secrets: string[]): Record<string, unknown> {
  const failure = failureOf(err);
  const details = err instanceof ComputeError ? (err.details ?? {}) : {};
  const message = err instanceof Error ? err.message : String(err);
  return {
    code: err instanceof ComputeError ? err.code : "UNAVAILABLE",
    // A provider's errors name it already; anything else thrown by its client is prefixed with it.
    message: scrub(message.startsWith(`${provider}:`) ? message : `${provider}: ${message}`, secrets),
    failure,
    provider,
    call,
    ...(typeof details.reason === "string" ? { reason: details.reason } : {}),
    ...(typeof details.status === "number" ? { status: details.status } : {}),
    ...(typeof details.retryAfterSeconds === "number" ? { retryAfterSeconds: details.retryAfterSeconds } : {}),
  };
}

/** The instance's create jobs that ended failed so far (its history). */
async function failedCreateJobs(ctx: ModuleContext, id: string): Promise<number> {
  const found = await one<{ n: number }>(
    ctx.store.db,
    sql`
    SELECT count(*)::int AS n FROM vps_instance_history
    WHERE instance_id = ${id} AND call = 'operation' AND detail->>'of' = 'create' AND detail->>'state' = 'failed'`,
  );
  return found!.n;
}
