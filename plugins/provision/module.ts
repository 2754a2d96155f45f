// The provision module: workflows of steps, their tables, and the methods to validate profiles
// and to start, follow and cancel workflows. The WorkflowDO (durable-objects/workflow.ts) runs
// advance() from engine.ts.
import { sql } from "drizzle-orm";
import { z } from "zod";
import { defineModule, type Module } from "better-compute";
import {
  ComputeError,
  defineGetMethod,
  defineMethod,
  invalidArgument,
  newestFirst,
  nextCursor,
  notFound,
  one,
  pageLimit,
  resourceId,
  rows,
  schemaIssues,
  type ModuleContext,
  type PlatformContext,
  type Tx,
} from "better-compute/core";
import { METRICS_SQL, workflowMetrics } from "./metrics.ts";
import { approveMethod, QUORUM_SQL, quorumBatch, quorumView, recordBatch, workflowApprovals } from "./quorum.ts";
import { findProfile, stepsById, validateProfile } from "./validate.ts";

const WORKFLOWS_SQL = `
CREATE TABLE IF NOT EXISTS workflows (
  id text PRIMARY KEY,
  profile_id text NOT NULL,
  profile_version text NOT NULL,
  target text NOT NULL,
  state text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
  position integer NOT NULL DEFAULT 0,
  input jsonb NOT NULL DEFAULT '{}'::jsonb,
  error jsonb,
  deadline timestamptz,
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  updated_at timestamptz NOT NULL DEFAULT compute_now(),
  finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS workflows_running ON workflows (updated_at) WHERE state = 'running';

-- Every attempt of every step: its input (and digest), result or error, and timings.
CREATE TABLE IF NOT EXISTS workflow_steps (
  workflow_id text NOT NULL REFERENCES workflows (id),
  position integer NOT NULL,
  attempt integer NOT NULL,
  name text NOT NULL,
  step_id text NOT NULL,
  state text NOT NULL CHECK (state IN ('ready', 'not_ready', 'waiting', 'scheduled', 'succeeded', 'failed')),
  input jsonb NOT NULL,
  input_digest text NOT NULL,
  output jsonb,
  error jsonb,
  command_id bigint,
  polls integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz,
  deadline_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  started_at timestamptz,
  finished_at timestamptz,
  PRIMARY KEY (workflow_id, position, attempt)
);`;

// workflows.list pages newest first, of one target or all.
const WORKFLOWS_LIST_SQL = `
CREATE INDEX IF NOT EXISTS workflows_created ON workflows (created_at, id);
CREATE INDEX IF NOT EXISTS workflows_target ON workflows (target, created_at, id);`;

export interface StartWorkflowInput {
  profile: string;
  version?: string;
  target: string;
  input?: Record<string, unknown>;
  deadlineSeconds?: number;
  createdBy: string;
}

/**
 * Starts a workflow in the caller's transaction. Every step input that does not wait for an
 * earlier step's output is checked against its schema first: a bad input fails here, before
 * anything is written or sent. Under pki.approvers a workflow with destructive kinds to send
 * starts in awaiting-approval, with its quorum batch (quorum.ts).
 */
export async function startWorkflow(ctx: ModuleContext, tx: Tx, input: StartWorkflowInput): Promise<{ id: string }> {
  const profile = findProfile(ctx.registered, input.profile, input.version);
  if (!profile) throw notFound(`no profile ${input.profile}${input.version ? `@${input.version}` : ""} is registered`);
  const issues = validateProfile(ctx.registered, profile);
  if (issues.length > 0)
    throw new ComputeError("FAILED_PRECONDITION", `profile ${profile.id}@${profile.version} does not validate`, { issues });
  const steps = stepsById(ctx.registered);
  const inputIssues = profile.steps.flatMap((entry) => {
    if (entry.fromStep) return [];
    const parsed = steps.get(entry.step)!.input.safeParse({ ...input.input, ...entry.input });
    return parsed.success ? [] : [{ step: entry.name ?? entry.step, issues: schemaIssues(parsed.error) }];
  });
  if (inputIssues.length > 0) throw invalidArgument(`the input breaks the schema of step ${inputIssues[0]!.step}`, { steps: inputIssues });

  const id = `wf-${crypto.randomUUID()}`;
  const batch = await quorumBatch(ctx, id, profile, input.target);
  await tx.execute(sql`
    INSERT INTO workflows (id, profile_id, profile_version, target, input, deadline, created_by${batch ? sql`, state` : sql``})
    VALUES (${id}, ${profile.id}, ${profile.version}, ${input.target}, ${JSON.stringify(input.input ?? {})}::jsonb,
            CASE WHEN ${input.deadlineSeconds ?? null}::float8 IS NULL THEN NULL ELSE compute_now() + make_interval(secs => ${input.deadlineSeconds ?? 0}) END,
            ${input.createdBy}${batch ? sql`, 'awaiting-approval'` : sql``})`);
  await ctx.events.publish(tx, {
    type: "workflow.started",
    subject: `workflows/${id}`,
    data: { profile: profile.id, version: profile.version, target: input.target },
  });
  // Awaiting approval, it runs nothing: the threshold-th approval wakes it.
  if (batch) await recordBatch(ctx, tx, id, batch);
  else ctx.wake.workflow(id);
  return { id };
}

const issue = z.object({ step: z.string(), position: z.number(), code: z.string(), message: z.string() });
const attempt = z.object({
  attempt: z.number(),
  state: z.string(),
  inputDigest: z.string(),
  output: z.unknown().nullable(),
  error: z.unknown().nullable(),
  commandId: z.string().nullable(),
  polls: z.number(),
  startedAt: z.string().nullable(),
  finishedAt: z.string().nullable(),
});
const WORKFLOW_STATES = ["awaiting-approval", "running", "succeeded", "failed", "cancelled"] as const;
const workflowRow = z.object({
  id: z.string(),
  profile: z.string(),
  version: z.string(),
  target: z.string(),
  state: z.enum(WORKFLOW_STATES),
  position: z.number(),
  error: z.unknown().nullable(),
  createdBy: z.string(),
  createdAt: z.string(),
  finishedAt: z.string().nullable(),
});
const workflow = workflowRow.extend({
  steps: z.array(z.object({ position: z.number(), name: z.string(), step: z.string(), attempts: z.array(attempt) })),
  /** Its batch of destructive commands and who approved it; null when it needed no approval. */
  quorum: quorumView.nullable(),
});

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());

const toWorkflowRow = (wf: Record<string, any>): z.infer<typeof workflowRow> => ({
  id: wf.id,
  profile: wf.profile_id,
  version: wf.profile_version,
  target: wf.target,
  state: wf.state,
  position: wf.position,
  error: wf.error,
  createdBy: wf.created_by,
  createdAt: iso(wf.created_at)!,
  finishedAt: iso(wf.finished_at),
});

/** A workflow with its steps, every attempt and its quorum, or undefined. */
async function findWorkflow(tx: Tx, id: string): Promise<z.input<typeof workflow> | undefined> {
  const wf = await one<Record<string, any>>(
    tx,
    sql`
      SELECT w.*, q.digest, q.kinds, q.threshold, q.approved_at,
             array(SELECT approver FROM workflow_approvals a WHERE a.workflow_id = w.id ORDER BY a.created_at, a.approver) AS approvals
      FROM workflows w LEFT JOIN workflow_quorum q ON q.workflow_id = w.id WHERE w.id = ${id}`,
  );
  if (!wf) return undefined;
  const attempts = await rows<Record<string, any>>(
    tx,
    sql`SELECT * FROM workflow_steps WHERE workflow_id = ${id} ORDER BY position, attempt`,
  );
  type Attempt = z.infer<typeof attempt>;
  const steps = new Map<number, { position: number; name: string; step: string; attempts: Attempt[] }>();
  for (const r of attempts) {
    const entry = steps.get(r.position) ?? { position: r.position, name: r.name, step: r.step_id, attempts: [] as Attempt[] };
    entry.attempts.push({
      attempt: r.attempt,
      state: r.state,
      inputDigest: r.input_digest,
      output: r.output,
      error: r.error,
      commandId: r.command_id === null ? null : String(r.command_id),
      polls: r.polls,
      startedAt: iso(r.started_at),
      finishedAt: iso(r.finished_at),
    });
    steps.set(r.position, entry);
  }
  const quorum =
    wf.digest === null
      ? null
      : { digest: wf.digest, kinds: wf.kinds, threshold: wf.threshold, approvals: wf.approvals, approvedAt: iso(wf.approved_at) };
  return { ...toWorkflowRow(wf), steps: [...steps.values()], quorum };
}

export function provisionModule(): Module {
  const validate = defineMethod({
    name: "profiles.validate",
    readOnly: true,
    description: "Resolve every step of a profile against the registry and list what would go wrong",
    input: z.object({ id: resourceId, version: resourceId.optional() }),
    output: z.object({ profile: z.string(), version: z.string(), valid: z.boolean(), issues: z.array(issue) }),
    handler: async (ctx, input) => {
      const profile = findProfile(ctx.registered, input.id, input.version);
      if (!profile) throw notFound(`no profile ${input.id} is registered`);
      const issues = validateProfile(ctx.registered, profile);
      return { profile: profile.id, version: profile.version, valid: issues.length === 0, issues };
    },
  });

  const start = defineMethod({
    name: "workflows.start",
    resource: (input) => `workflows/${input.profile}/${input.target}`,
    input: z.object({
      profile: resourceId,
      version: resourceId.optional(),
      target: resourceId,
      input: z.record(z.string(), z.unknown()).default({}),
      deadlineSeconds: z.number().positive().optional(),
    }),
    output: z.object({ id: z.string() }),
    handler: (ctx, input, tx) => startWorkflow(ctx, tx, { ...input, createdBy: ctx.principal.id }),
  });

  const get = defineGetMethod({
    name: "workflows.get",
    what: "workflow",
    collection: "workflows",
    description: "A workflow with its steps, every attempt, their states and timings",
    output: workflow,
    find: findWorkflow,
  });

  const list = defineMethod({
    name: "workflows.list",
    readOnly: true,
    description: "Workflows newest first, without their steps (workflows.get has them); page with after: the previous page's next",
    input: z.object({
      /** What the workflows ran on: for metal, the machine (its node id). */
      target: resourceId.optional(),
      state: z.enum(WORKFLOW_STATES).optional(),
      profile: resourceId.optional(),
      limit: pageLimit,
      /** The next of the previous page: workflows older than this one. */
      after: resourceId.optional(),
    }),
    output: z.object({ workflows: z.array(workflowRow), next: z.string().nullable() }),
    handler: async (_ctx, input, tx) => {
      const where = sql`(${input.target ?? null}::text IS NULL OR target = ${input.target ?? null})
        AND (${input.state ?? null}::text IS NULL OR state = ${input.state ?? null})
        AND (${input.profile ?? null}::text IS NULL OR profile_id = ${input.profile ?? null})`;
      const missing = `workflow ${input.after} does not exist (after is a workflow id from a previous page)`;
      const workflows = (await newestFirst(tx, { from: sql`workflows`, table: "workflows", where, missing }, input)).map(toWorkflowRow);
      return { workflows, next: nextCursor(workflows, input.limit, (w) => w.id) };
    },
  });

  const cancel = defineMethod({
    name: "workflows.cancel",
    resource: (input) => `workflows/${input.id}`,
    description: "Stop a running or awaiting-approval workflow after its current transition (commands already sent still run)",
    input: z.object({ id: resourceId }),
    output: z.object({ id: z.string(), state: z.string() }),
    handler: async (ctx, input, tx) => {
      const updated = await tx.execute(sql`
        UPDATE workflows SET state = 'cancelled', finished_at = compute_now(), updated_at = compute_now()
        WHERE id = ${input.id} AND state IN ('running', 'awaiting-approval') RETURNING id`);
      if (updated.rows.length) await ctx.events.publish(tx, { type: "workflow.cancelled", subject: `workflows/${input.id}` });
      const row = await one<{ state: string }>(tx, sql`SELECT state FROM workflows WHERE id = ${input.id}`);
      if (!row) throw notFound(`workflow ${input.id} does not exist`);
      return { id: input.id, state: row.state };
    },
  });

  return defineModule({
    id: "provision",
    description: "Provisioning workflows: steps, profiles and the engine that runs them",
    iam: {
      actions: {
        "profiles.validate": "Validate a provisioning profile",
        "workflows.start": "Start provisioning workflows",
        "workflows.get": "Read workflows and their steps",
        "workflows.list": "List workflows",
        "workflows.cancel": "Cancel workflows",
        "workflows.approve": "Record an approver's signature over a workflow's batch of destructive commands",
      },
    },
    migrations: [
      { name: "provision/0001_workflows", sql: WORKFLOWS_SQL },
      { name: "provision/0002_workflows_list", sql: WORKFLOWS_LIST_SQL },
      { name: "provision/0003_quorum", sql: QUORUM_SQL },
      { name: "provision/0004_metrics", sql: METRICS_SQL },
    ],
    api: [validate, start, get, list, cancel, approveMethod],
    sweeps: [{ id: "wake-stalled-workflows", run: (ctx) => wakeStalledWorkflows(ctx) }],
    ports: { approvals: () => workflowApprovals() },
    metrics: workflowMetrics,
  });
}

/** The cron safety net (the module's sweep, run by compute.sweep): running workflows nobody has advanced for a while are woken. */
export async function wakeStalledWorkflows(ctx: PlatformContext, staleSeconds = 60): Promise<number> {
  const stalled = await rows<{ id: string }>(
    ctx.store.db,
    sql`
    SELECT id FROM workflows WHERE state = 'running' AND updated_at < compute_now() - make_interval(secs => ${staleSeconds}) LIMIT 500`,
  );
  for (const row of stalled) ctx.wake.workflow(row.id);
  await ctx.afterCommit();
  return stalled.length;
}
