// The workflow engine: advance() moves a workflow as far as it can go now and says when to
// look again. Every write is a store transaction, or a store.write where it is one statement (the
// chaos tests crash at each of them). It is level-triggered and idempotent: every transition is one
// Postgres transaction with its event, guarded by the state it expects, so running it twice, or
// again after a crash at any point, changes nothing twice. A transition is one statement where it
// can be (CTEs that write the attempt, the workflow and the event together; a step's success begins
// the next step), sent with no BEGIN and COMMIT around it, and a pass goes on from what its last
// write returned rather than reading it back. An agent step's command is keyed by
// (workflow, step, attempt) and enqueued in the same transaction that records it, so a
// resumed workflow never sends a command twice.
import { sql, type SQL } from "drizzle-orm";
import {
  canonicalJson,
  ComputeError,
  isComputeError,
  one,
  rows,
  schemaIssues,
  objectOrigin,
  sendWithCommit,
  sha256Hex,
  type ModuleContext,
  type PlatformContext,
  type SecretRef,
  type StatementEvent,
  type Tx,
} from "better-compute/core";
import { fromSteps, StepError, StepNotReady, type ProfileDefinition, type StepContext, type StepDefinition } from "./contracts.ts";
import { findProfile, stepsById } from "./validate.ts";

/** awaiting-approval: its quorum batch is not approved yet (quorum.ts); advance() runs nothing until it is. */
export type WorkflowState = "awaiting-approval" | "running" | "succeeded" | "failed" | "cancelled";
export const ATTEMPT_STATES = ["ready", "not_ready", "waiting", "scheduled", "succeeded", "failed"] as const;
type AttemptState = (typeof ATTEMPT_STATES)[number];
/** An attempt in these is over; its workflow moved on, or failed, in the same transaction. */
const FINISHED: readonly AttemptState[] = ["succeeded", "failed"];
const UNFINISHED = ATTEMPT_STATES.filter((s) => !FINISHED.includes(s));

/**
 * An attempt of a step and its legal moves, like the metal lifecycle's table: every UPDATE below
 * is guarded by its move's from-states, so running it twice, or after another runner moved the
 * attempt first, changes nothing. begin and retry insert a new attempt.
 *
 *   begin → ready → waiting (an agent step's command sent) → succeeded | failed
 *           ready → not_ready (a control-plane step not ready yet; polled again) → succeeded | failed
 *   failed (retryable) → retry: a new attempt, scheduled → ready once its backoff passed
 */
export const ATTEMPT_MOVES = {
  begin: { from: [], to: "ready" },
  retry: { from: ["failed"], to: "scheduled" },
  /** Its backoff passed. */
  start: { from: ["scheduled"], to: "ready" },
  notReady: { from: ["ready", "not_ready"], to: "not_ready" },
  send: { from: ["ready"], to: "waiting" },
  succeed: { from: UNFINISHED, to: "succeeded" },
  fail: { from: UNFINISHED, to: "failed" },
} as const satisfies Record<string, { from: readonly AttemptState[]; to: AttemptState }>;

/** The guard of a move: the attempt is in one of its from-states. */
const attemptIn = (move: keyof typeof ATTEMPT_MOVES) => sql`state = ANY(${`{${ATTEMPT_MOVES[move].from.join(",")}}`}::text[])`;

/** The provision module's context as the WorkflowDO holds it. */
export type EngineContext = PlatformContext;

export interface Advanced {
  state: WorkflowState | "missing";
  /** Look again in this many ms (null: nothing to wait for: the workflow ended, or awaits approval, whose last one wakes it). */
  wakeInMs: number | null;
}

interface WorkflowRow {
  id: string;
  profile_id: string;
  profile_version: string;
  target: string;
  state: WorkflowState;
  position: number;
  input: Record<string, unknown>;
  overdue: boolean;
  /** Its wait for an agent (ctx.nodes.wakeWhenConnected): fired once the agent connected. */
  agent_wait: "waiting" | "fired" | null;
}

interface AttemptRow {
  attempt: number;
  state: AttemptState;
  input: Record<string, unknown>;
  command_id: string | null;
  /** Its command as it stands (read with the attempt); undefined when this pass sent it. */
  command?: CommandRow | null;
  wait_ms: number | null;
  overdue: boolean;
}

interface CommandRow {
  state: string;
  result: unknown;
  error: { code: string; message: string; permanent?: boolean } | null;
}

type LoadedWorkflow = WorkflowRow & { attempt: AttemptRow | undefined };

/**
 * What one advance() pass knows, so it does not read back what it just wrote: the workflow as
 * the last transition left it, and the outputs of the steps that succeeded once they were needed.
 */
interface Pass {
  /** Set by a transition whose guarded write took effect; unset: read the workflow again. */
  next?: LoadedWorkflow;
  /** Succeeded steps' outputs by name, read on first use (a succeeded attempt never changes). */
  outputs?: Map<string, unknown>;
}

const DEFAULT_POLL_SECONDS = 5;
/** While an agent step waits, the NodeDO wakes the workflow on the result; this is the fallback. */
const WAITING_RECHECK_MS = 30_000;
const MAX_TRANSITIONS_PER_ADVANCE = 200;

export const commandKey = (workflowId: string, position: number, attempt: number) => `wf:${workflowId}:${position}:${attempt}`;

export async function advance(ctx: EngineContext, workflowId: string): Promise<Advanced> {
  const pass: Pass = {};
  for (let i = 0; i < MAX_TRANSITIONS_PER_ADVANCE; i++) {
    let loaded = pass.next;
    pass.next = undefined;
    if (!loaded) {
      // Read again: someone else may have moved it, so forget what this pass knew.
      pass.outputs = undefined;
      loaded = await loadWorkflow(ctx, pass, workflowId);
    }
    if (!loaded) return { state: "missing", wakeInMs: null };
    const { attempt, ...wf } = loaded;
    if (wf.state !== "running") return { state: wf.state, wakeInMs: null };
    if (wf.overdue) {
      await finish(ctx, wf, "failed", { code: "DEADLINE_EXCEEDED", message: "the workflow did not finish before its deadline" });
      continue;
    }
    const profile = findProfile(ctx.registered, wf.profile_id, wf.profile_version);
    if (!profile) {
      await finish(ctx, wf, "failed", {
        code: "INVALID_CONFIG",
        message: `profile ${wf.profile_id}@${wf.profile_version} is no longer registered`,
      });
      continue;
    }
    if (wf.position >= profile.steps.length) {
      await finish(ctx, wf, "succeeded", null);
      continue;
    }
    const wait = await advanceStep(ctx, pass, wf, profile, attempt);
    if (wait !== undefined) return { state: "running", wakeInMs: wait };
  }
  return { state: "running", wakeInMs: 0 };
}

/** One transition of the current step; returns how long to wait, or undefined to go on at once. */
async function advanceStep(
  ctx: EngineContext,
  pass: Pass,
  wf: WorkflowRow,
  profile: ProfileDefinition,
  attempt: AttemptRow | undefined,
): Promise<number | undefined> {
  const entry = profile.steps[wf.position]!;
  const name = entry.name ?? entry.step;
  const step = stepsById(ctx.registered).get(entry.step);
  if (!step) {
    await finish(ctx, wf, "failed", { code: "INVALID_CONFIG", message: `step ${entry.step} is no longer registered`, step: name });
    return undefined;
  }
  if (!attempt) return beginAttempt(ctx, pass, wf, profile, step);
  const at: AtStep = { wf, profile, step, attempt, name };

  switch (attempt.state) {
    case "scheduled":
      if (attempt.wait_ms! > 0) return attempt.wait_ms!;
      await ctx.store.write(sql`
        UPDATE workflow_steps SET state = ${ATTEMPT_MOVES.start.to}, started_at = compute_now(), deadline_at = ${deadlineSql(step)}
        WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt} AND ${attemptIn("start")}`);
      return undefined;
    case "not_ready":
      if (attempt.overdue)
        return failStep(
          ctx,
          wf,
          step,
          attempt,
          new StepError("DEADLINE_EXCEEDED", `step ${name} was still not ready at its deadline`, false),
        );
      // The agent it waits for has connected: look now, not at the next poll.
      if (attempt.wait_ms! > 0 && wf.agent_wait !== "fired") return attempt.wait_ms!;
      return runControlPlane(ctx, pass, at);
    case "ready":
      if (step.runsOn === "control-plane") return runControlPlane(ctx, pass, at);
      return sendCommand(ctx, pass, at);
    case "waiting":
      return checkCommand(ctx, pass, at);
    case "succeeded":
    case "failed":
      // A finished attempt whose workflow did not move on (a crash between the two cannot
      // happen: they share a transaction). Nothing to do but look again.
      return WAITING_RECHECK_MS;
  }
}

/** Where a pass is: the workflow, its profile, the current step (its definition and its name in the profile) and its attempt. */
interface AtStep {
  wf: WorkflowRow;
  profile: ProfileDefinition;
  step: StepDefinition;
  attempt: AttemptRow;
  name: string;
}

/** A step's first attempt, its input computed (and checked against the step's schema) but not yet written. */
interface NextAttempt {
  position: number;
  name: string;
  step: StepDefinition;
  input: Record<string, unknown>;
  digest: string;
  /** The input breaks the step's schema: the attempt is recorded, then failed. */
  issues?: ReturnType<typeof schemaIssues>;
}

/** The first attempt of the step at position; `finished` is the step that succeeds with it, its output not yet in Postgres. */
async function nextAttempt(
  ctx: EngineContext,
  pass: Pass,
  wf: WorkflowRow,
  profile: ProfileDefinition,
  position: number,
  step: StepDefinition,
  finished?: { name: string; output: unknown },
): Promise<NextAttempt> {
  const entry = profile.steps[position]!;
  const name = entry.name ?? entry.step;
  let outputs: Awaited<ReturnType<typeof outputsOf>> | undefined;
  const earlier: Record<string, unknown> = {};
  for (const from of fromSteps(entry)) {
    const output = from === finished?.name ? finished.output : (outputs ??= await outputsOf(ctx, pass, wf.id)).get(from);
    Object.assign(earlier, asObject(output));
  }
  const merged = { ...wf.input, ...entry.input, ...earlier };
  const parsed = step.input.safeParse(merged);
  const input = parsed.success ? (parsed.data as Record<string, unknown>) : merged;
  const digest = await sha256Hex(canonicalJson(input));
  return { position, name, step, input, digest, ...(parsed.success ? {} : { issues: schemaIssues(parsed.error) }) };
}

/** The INSERT of the attempt as ready, as the CTE `began`; `when` guards it on an earlier CTE of the same statement. */
function beginSql(wf: WorkflowRow, next: NextAttempt, when: SQL = sql``): SQL {
  return sql`began AS (
      INSERT INTO workflow_steps (workflow_id, position, attempt, name, step_id, state, input, input_digest, started_at, deadline_at)
      SELECT ${wf.id}, ${next.position}, 1, ${next.name}, ${next.step.id}, ${ATTEMPT_MOVES.begin.to}, ${JSON.stringify(next.input)}::jsonb, ${next.digest},
             compute_now(), ${deadlineSql(next.step)} ${when}
      ON CONFLICT DO NOTHING RETURNING attempt)`;
}

const startedEvent = (next: NextAttempt): WorkflowEvent => ({
  from: "began",
  type: "workflow.step.started",
  data: { step: next.name, position: next.position, attempt: 1 },
});

/** The attempt as it stands once begun. */
const begunAttempt = (next: NextAttempt): AttemptRow => ({
  attempt: 1,
  state: ATTEMPT_MOVES.begin.to,
  input: next.input,
  command_id: null,
  wait_ms: null,
  overdue: false,
});

/** Computes and checks the first attempt's input, and records the attempt as ready (or failed). */
async function beginAttempt(
  ctx: EngineContext,
  pass: Pass,
  wf: WorkflowRow,
  profile: ProfileDefinition,
  step: StepDefinition,
): Promise<undefined> {
  const next = await nextAttempt(ctx, pass, wf, profile, wf.position, step);
  const result = await one<{ began: number }>(
    ctx.store,
    sql`
    WITH ${beginSql(wf, next)}, ${eventsSql(ctx, wf.id, [startedEvent(next)])}
    SELECT count(*)::int AS began FROM began`,
  );
  const began = result!.began > 0;
  if (next.issues) {
    const row = (await loadAttempt(ctx, wf.id, wf.position))!;
    await failStep(
      ctx,
      wf,
      step,
      row,
      new StepError("INVALID_ARGUMENT", `the input of step ${next.name} does not match its schema`, false, { issues: next.issues }),
    );
  } else if (began) {
    pass.next = { ...wf, attempt: begunAttempt(next) };
  }
  return undefined;
}

async function runControlPlane(ctx: EngineContext, pass: Pass, { wf, profile, step, attempt, name }: AtStep): Promise<number | undefined> {
  if (step.runsOn !== "control-plane") return undefined;
  let output: unknown;
  const stepCtx = await stepContext(ctx, pass, wf, step, attempt, name);
  try {
    output = await step.run(stepCtx, attempt.input);
  } catch (err) {
    if (err instanceof StepNotReady) {
      const poll = step.pollSeconds ?? DEFAULT_POLL_SECONDS;
      await ctx.store.write(sql`
        UPDATE workflow_steps SET state = ${ATTEMPT_MOVES.notReady.to}, polls = polls + 1, error = ${JSON.stringify({ code: "NOT_READY", message: err.reason })}::jsonb,
               next_attempt_at = compute_now() + make_interval(secs => ${poll})
        WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt} AND ${attemptIn("notReady")}
          AND EXISTS (SELECT 1 FROM workflows WHERE id = ${wf.id} AND state = 'running')`);
      await stepCtx.afterCommit();
      return poll * 1000;
    }
    await stepCtx.afterCommit();
    return failStep(ctx, wf, step, attempt, err);
  }
  await stepCtx.afterCommit();
  await succeedStep(ctx, pass, wf, profile, attempt, name, output);
  return undefined;
}

async function sendCommand(ctx: EngineContext, pass: Pass, { wf, step, attempt, name }: AtStep): Promise<undefined> {
  if (step.runsOn === "control-plane") return undefined;
  const stepCtx = await stepContext(ctx, pass, wf, step, attempt, name);
  let target: string;
  let body: Record<string, unknown>;
  let secretRefs: SecretRef[];
  try {
    target = step.target ? await step.target(attempt.input, stepCtx) : wf.target;
    body = step.command.body ? step.command.body(attempt.input, stepCtx) : attempt.input;
    secretRefs = step.command.secretRefs?.(attempt.input, stepCtx) ?? [];
  } catch (err) {
    await failStep(ctx, wf, step, attempt, err);
    return undefined;
  }
  try {
    const sent = await ctx.store.transaction(async (tx) => {
      const command = await ctx.commands.enqueue(tx, {
        nodeId: target,
        kind: step.command.kind,
        key: commandKey(wf.id, wf.position, attempt.attempt),
        body,
        secretRefs,
        origin: objectOrigin("workflow", wf.id),
        ...(step.deadlineSeconds ? { deadlineSeconds: step.deadlineSeconds } : {}),
      });
      // Sent with the COMMIT: its answer is not waited for. Guarded as every transition is, so if
      // another pass moved the attempt first it changes nothing (the enqueue was the same command).
      await sendWithCommit(
        tx,
        sql`
        WITH sent AS (
          UPDATE workflow_steps SET state = ${ATTEMPT_MOVES.send.to}, command_id = ${command.id}::bigint
          WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt} AND ${attemptIn("send")}
          RETURNING attempt),
        ${eventsSql(ctx, wf.id, [{ from: "sent", type: "workflow.step.sent", data: { step: name, kind: step.command.kind, node: target, command: command.id } }])}
        SELECT count(*)::int AS sent FROM sent`,
      );
      return command.id;
    });
    // The command has no result yet: the pass waits for it (if another pass sent it first, so does that one).
    pass.next = { ...wf, attempt: { ...attempt, state: ATTEMPT_MOVES.send.to, command_id: sent } };
  } catch (err) {
    // Refused at enqueue (unknown node, a body that breaks the kind's schema, a destructive kind
    // outside an approved batch): nothing was sent. Anything else (the database failed, perhaps
    // after the commit) is not the step's failure: the pass fails, and the next one resumes from
    // what Postgres holds.
    if (!isEnqueueRefusal(err)) throw err;
    await failStep(ctx, wf, step, attempt, finalIfDenied(err));
    return undefined;
  }
  await ctx.afterCommit();
  return undefined;
}

async function checkCommand(ctx: EngineContext, pass: Pass, { wf, profile, step, attempt, name }: AtStep): Promise<number | undefined> {
  const command = attempt.command;
  if (command?.state === "succeeded") {
    await succeedStep(ctx, pass, wf, profile, attempt, name, command.result);
    return undefined;
  }
  if (command?.state === "failed" || command?.state === "expired") {
    const error = command.error ?? { code: "DRIVER_ERROR", message: "the agent reported no error" };
    const kind = step.runsOn === "control-plane" ? name : step.command.kind;
    // A refusal (a body the agent will never accept, a capability the machine lacks, a BMC
    // certificate it does not trust) fails the step now: another attempt would meet the same.
    const permanent = error.permanent === true || PERMANENT_AGENT_CODES.has(error.code);
    return failStep(
      ctx,
      wf,
      step,
      attempt,
      new StepError(codeOf(error.code), `${kind} failed on the agent: ${error.message}`, !permanent, {
        agentCode: error.code,
        ...(permanent ? { permanent } : {}),
      }),
    );
  }
  if (attempt.overdue)
    return failStep(ctx, wf, step, attempt, new StepError("DEADLINE_EXCEEDED", `step ${name} got no result before its deadline`, false));
  return attempt.wait_ms !== null && attempt.wait_ms > 0 ? Math.min(attempt.wait_ms, WAITING_RECHECK_MS) : WAITING_RECHECK_MS;
}

/**
 * Records the step's success and moves the workflow on, in one statement: the next step's first
 * attempt begins in it (when its input is valid: otherwise the next pass begins it and fails it),
 * or, after the last step, the workflow succeeds in it.
 */
async function succeedStep(
  ctx: EngineContext,
  pass: Pass,
  wf: WorkflowRow,
  profile: ProfileDefinition,
  attempt: AttemptRow,
  name: string,
  output: unknown,
): Promise<void> {
  const last = wf.position + 1 >= profile.steps.length;
  const nextStep = last ? undefined : stepsById(ctx.registered).get(profile.steps[wf.position + 1]!.step);
  const next = nextStep && (await nextAttempt(ctx, pass, wf, profile, wf.position + 1, nextStep, { name, output }));
  const beginsNext = next !== undefined && !next.issues;
  const events: WorkflowEvent[] = [
    { from: "done", type: "workflow.step.succeeded", data: { step: name, position: wf.position, attempt: attempt.attempt } },
    ...(last ? [{ from: "moved", type: "workflow.succeeded", data: { profile: wf.profile_id } }] : beginsNext ? [startedEvent(next)] : []),
  ];
  // One statement: no transaction around it (store.write).
  const moved = (await one<{ moved: number; began?: number }>(
    ctx.store,
    sql`
      WITH done AS (
        UPDATE workflow_steps SET state = ${ATTEMPT_MOVES.succeed.to}, output = ${JSON.stringify(output ?? null)}::jsonb, error = NULL, finished_at = compute_now()
        WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt} AND ${attemptIn("succeed")}
        RETURNING workflow_id),
      -- A wait for an agent belongs to the step that registered it.
      unwaited AS (DELETE FROM bc_agent_waits WHERE workflow_id IN (SELECT workflow_id FROM done)),
      moved AS (
        UPDATE workflows SET position = position + 1, updated_at = compute_now()
          ${last ? sql`, state = 'succeeded', finished_at = compute_now()` : sql``}
        WHERE id IN (SELECT workflow_id FROM done) AND state = 'running' AND position = ${wf.position}
        RETURNING id),
      ${beginsNext ? sql`${beginSql(wf, next, sql`WHERE EXISTS (SELECT 1 FROM moved)`)},` : sql``}
      ${eventsSql(ctx, wf.id, events)}
      SELECT (SELECT count(*) FROM moved)::int AS moved ${beginsNext ? sql`, (SELECT count(*) FROM began)::int AS began` : sql``}`,
  ))!;
  if (!moved.moved || (beginsNext && !moved.began)) return;
  pass.outputs?.set(name, output ?? null);
  pass.next = {
    ...wf,
    position: wf.position + 1,
    state: last ? "succeeded" : "running",
    agent_wait: null,
    attempt: beginsNext ? begunAttempt(next) : undefined,
  };
}

/** Records the failure; schedules another attempt with backoff, or fails the workflow. */
async function failStep(
  ctx: EngineContext,
  wf: WorkflowRow,
  step: StepDefinition,
  attempt: AttemptRow,
  err: unknown,
): Promise<number | undefined> {
  const error = toStepError(err);
  const policy = retryPolicy(ctx, step);
  const retry = error.retryable && attempt.attempt < policy.attempts;
  const backoff = Math.min(policy.backoffSeconds * 2 ** (attempt.attempt - 1), policy.maxBackoffSeconds ?? 300);
  const recorded = { code: error.code, message: error.message, ...(error.details ? { details: error.details } : {}) };
  await ctx.store.transaction(async (tx) => {
    const updated = await one<{ name: string }>(
      tx,
      sql`
      UPDATE workflow_steps SET state = ${ATTEMPT_MOVES.fail.to}, error = ${JSON.stringify(recorded)}::jsonb, finished_at = compute_now()
      WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt} AND ${attemptIn("fail")}
      RETURNING name`,
    );
    const name = updated?.name;
    if (!name) return;
    if (retry) {
      await tx.execute(sql`
        INSERT INTO workflow_steps (workflow_id, position, attempt, name, step_id, state, input, input_digest, next_attempt_at)
        SELECT workflow_id, position, attempt + 1, name, step_id, ${ATTEMPT_MOVES.retry.to}, input, input_digest, compute_now() + make_interval(secs => ${backoff})
        FROM workflow_steps WHERE workflow_id = ${wf.id} AND position = ${wf.position} AND attempt = ${attempt.attempt}
        ON CONFLICT DO NOTHING`);
      await ctx.events.publish(tx, {
        type: "workflow.step.retrying",
        subject: `workflows/${wf.id}`,
        data: { step: name, attempt: attempt.attempt, backoffSeconds: backoff, error: recorded.code },
      });
    } else {
      await failWorkflow(ctx, tx, wf.id, { ...recorded, step: name, attempt: attempt.attempt });
    }
  });
  return retry ? backoff * 1000 : undefined;
}

function retryPolicy(ctx: ModuleContext, step: StepDefinition) {
  if (step.retry) return step.retry;
  // A step that sends a destructive kind is not repeated unless it says so.
  const destructive = (step.sends ?? []).some((kind) => ctx.registered.commandKind(kind)?.destructive);
  return { attempts: destructive ? 1 : 3, backoffSeconds: 2, maxBackoffSeconds: 300 };
}

async function finish(
  ctx: EngineContext,
  wf: WorkflowRow,
  state: "succeeded" | "failed",
  error: Record<string, unknown> | null,
): Promise<void> {
  await ctx.store.transaction(async (tx) => {
    if (state === "failed") return failWorkflow(ctx, tx, wf.id, error!);
    const updated = await tx.execute(sql`
      UPDATE workflows SET state = 'succeeded', finished_at = compute_now(), updated_at = compute_now() WHERE id = ${wf.id} AND state = 'running' RETURNING id`);
    if (updated.rows.length)
      await ctx.events.publish(tx, { type: "workflow.succeeded", subject: `workflows/${wf.id}`, data: { profile: wf.profile_id } });
    // A wait registered by the step that just succeeded (unknown when this pass loaded the workflow).
    if (updated.rows.length) await tx.execute(sql`DELETE FROM bc_agent_waits WHERE workflow_id = ${wf.id}`);
  });
}

async function failWorkflow(ctx: ModuleContext, tx: Tx, workflowId: string, error: Record<string, unknown>): Promise<void> {
  const updated = await tx.execute(sql`
    UPDATE workflows SET state = 'failed', error = ${JSON.stringify(error)}::jsonb, finished_at = compute_now(), updated_at = compute_now()
    WHERE id = ${workflowId} AND state = 'running' RETURNING id`);
  if (updated.rows.length) await ctx.events.publish(tx, { type: "workflow.failed", subject: `workflows/${workflowId}`, data: error });
  await tx.execute(sql`DELETE FROM bc_agent_waits WHERE workflow_id = ${workflowId}`);
}

async function stepContext(
  ctx: EngineContext,
  pass: Pass,
  wf: WorkflowRow,
  step: StepDefinition,
  attempt: AttemptRow,
  name: string,
): Promise<StepContext & { afterCommit(): Promise<void> }> {
  const outputs = await outputsOf(ctx, pass, wf.id);
  const sends = new Set(step.sends ?? []);
  // A step may send only what it declared: the declaration is what quorum and audits see.
  const commands: StepContext["commands"] = {
    enqueue: (tx, command) => {
      if (!sends.has(command.kind)) {
        const message = `step ${step.id} sends ${command.kind} without declaring it in sends`;
        // Under quorum an undeclared destructive kind is outside the approved batch: refused as core would.
        if (ctx.pki.approvers && ctx.registered.commandKind(command.kind)?.destructive)
          throw new StepError("PERMISSION_DENIED", `${message}: it is destructive and not in the workflow's approved batch`, false, {
            kind: command.kind,
          });
        throw new ComputeError("FAILED_PRECONDITION", message);
      }
      return ctx.commands.enqueue(tx, { origin: objectOrigin("workflow", wf.id), ...command }).catch((err: unknown) => {
        throw finalIfDenied(err);
      });
    },
  };
  return Object.assign(Object.create(ctx) as EngineContext, {
    commands,
    workflow: { id: wf.id, target: wf.target, profile: wf.profile_id },
    step: { name, position: wf.position, attempt: attempt.attempt },
    output: (stepName: string) => outputs.get(stepName),
  });
}

/**
 * The workflow, the latest attempt of its current step and that attempt's command, in one round
 * trip; and the succeeded steps' outputs into the pass, unless the attempt waits on a command that
 * has not ended (the pass will run no step).
 */
async function loadWorkflow(ctx: ModuleContext, pass: Pass, id: string): Promise<LoadedWorkflow | undefined> {
  const row = await one<WorkflowRow & { attempt: AttemptRow | null; outputs: Record<string, unknown> | null }>(
    ctx.store.db,
    sql`
    SELECT w.id, w.profile_id, w.profile_version, w.target, w.state, w.position, w.input,
           (w.deadline IS NOT NULL AND w.deadline < compute_now()) AS overdue,
           (SELECT CASE WHEN a.fired_at IS NULL THEN 'waiting' ELSE 'fired' END FROM bc_agent_waits a WHERE a.workflow_id = w.id) AS agent_wait,
           CASE WHEN s.state = 'waiting' AND c.state NOT IN ('succeeded', 'failed', 'expired') THEN NULL ELSE
             (SELECT coalesce(json_object_agg(o.name, o.output), '{}') FROM workflow_steps o WHERE o.workflow_id = w.id AND o.state = 'succeeded') END AS outputs,
           CASE WHEN s.attempt IS NULL THEN NULL ELSE json_build_object(
             'attempt', s.attempt, 'state', s.state, 'input', s.input, 'command_id', s.command_id::text,
             'wait_ms', (extract(epoch FROM (s.next_attempt_at - compute_now())) * 1000)::float8,
             'overdue', coalesce(s.deadline_at < compute_now(), false),
             'command', CASE WHEN c.id IS NULL THEN NULL ELSE json_build_object('state', c.state, 'result', c.result, 'error', c.error) END) END AS attempt
    FROM workflows w
    LEFT JOIN LATERAL (
      SELECT * FROM workflow_steps WHERE workflow_id = w.id AND position = w.position ORDER BY attempt DESC LIMIT 1
    ) s ON true
    LEFT JOIN bc_commands c ON c.id = s.command_id
    WHERE w.id = ${id}`,
  );
  if (!row) return undefined;
  const { outputs, ...wf } = row;
  if (outputs) pass.outputs = new Map(Object.entries(outputs));
  return { ...wf, attempt: wf.attempt ?? undefined };
}

async function loadAttempt(ctx: ModuleContext, workflowId: string, position: number): Promise<AttemptRow | undefined> {
  return one<AttemptRow>(
    ctx.store.db,
    sql`
    SELECT attempt, state, input, command_id,
           (extract(epoch FROM (next_attempt_at - compute_now())) * 1000)::float8 AS wait_ms,
           coalesce(deadline_at < compute_now(), false) AS overdue
    FROM workflow_steps
    WHERE workflow_id = ${workflowId} AND position = ${position}
    ORDER BY attempt DESC LIMIT 1`,
  );
}

/** The succeeded steps' outputs by name: read once per pass, on first use. */
async function outputsOf(ctx: ModuleContext, pass: Pass, workflowId: string): Promise<Map<string, unknown>> {
  if (pass.outputs) return pass.outputs;
  const outputs = await rows<{ name: string; output: unknown }>(
    ctx.store.db,
    sql`SELECT name, output FROM workflow_steps WHERE workflow_id = ${workflowId} AND state = 'succeeded'`,
  );
  return (pass.outputs = new Map(outputs.map((r) => [r.name, r.output])));
}

/** An event of the workflow's statement: written if its CTE `from` returned a row. */
type WorkflowEvent = Omit<StatementEvent, "subject"> & { from: string };

/** The statement's events (ctx.events.insertSql) as the CTE `events`, about the workflow. */
const eventsSql = (ctx: ModuleContext, workflowId: string, events: WorkflowEvent[]): SQL =>
  sql`events AS (${ctx.events.insertSql(events.map((e) => ({ ...e, subject: `workflows/${workflowId}` })))})`;

const ENQUEUE_REFUSALS = new Set(["INVALID_ARGUMENT", "NOT_FOUND", "CONFLICT", "FAILED_PRECONDITION", "PERMISSION_DENIED"]);
const isEnqueueRefusal = (err: unknown) => isComputeError(err) && ENQUEUE_REFUSALS.has(err.code);

/** A quorum refusal fails the step for good: another attempt would be refused the same way. */
const finalIfDenied = (err: unknown) =>
  isComputeError(err) && err.code === "PERMISSION_DENIED" && !(err instanceof StepError)
    ? new StepError(err.code, err.message, false, err.details)
    : err;

function toStepError(err: unknown): StepError {
  if (err instanceof StepError) return err;
  if (isComputeError(err))
    return new StepError(err.code, err.message, err.code !== "INVALID_ARGUMENT" && err.code !== "FAILED_PRECONDITION", err.details);
  return new StepError("INTERNAL", err instanceof Error ? err.message : String(err));
}

/** Agent codes that say another attempt cannot succeed. */
const PERMANENT_AGENT_CODES = new Set(["INVALID_ARGUMENT", "UNSUPPORTED"]);

/** The step's code for an agent's failure: the agent's own where the platform has it, DRIVER_ERROR otherwise. */
function codeOf(code: string): StepError["code"] {
  return code === "DEADLINE_EXCEEDED" || PERMANENT_AGENT_CODES.has(code) ? (code as StepError["code"]) : "DRIVER_ERROR";
}

/** The attempt's deadline, counted from when it begins. */
const deadlineSql = (step: StepDefinition) =>
  step.deadlineSeconds ? sql`compute_now() + make_interval(secs => ${step.deadlineSeconds})` : sql`NULL`;

const asObject = (v: unknown): Record<string, unknown> =>
  v && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
