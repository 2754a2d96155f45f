// Quorum for destructive commands (docs/quorum.md). With pki.approvers set, a workflow whose
// profile sends any destructive kind starts in awaiting-approval with its batch (those kinds,
// known from the profile before anything runs) and a digest of it; approvers sign the digest with
// their Ed25519 keys (workflows.approve), and the threshold-th distinct approval releases it.
// Core's enqueue asks this module's approvals port (workflowApprovals) before it writes a
// destructive command: refused unless the batch of the workflow sending it holds the kind and was
// approved, so the engine is not the only guard.
import { sql } from "drizzle-orm";
import { z } from "zod";
import {
  canonicalJson,
  ComputeError,
  defineMethod,
  notFound,
  one,
  resourceId,
  sha256Hex,
  originObject,
  type ApprovalsPort,
  type MethodContext,
  type ModuleContext,
  type Tx,
} from "better-compute/core";
import type { ProfileDefinition } from "./contracts.ts";
import { stepsById } from "./validate.ts";

export const QUORUM_SQL = `
ALTER TABLE workflows DROP CONSTRAINT IF EXISTS workflows_state_check;
ALTER TABLE workflows ADD CONSTRAINT workflows_state_check
  CHECK (state IN ('awaiting-approval', 'running', 'succeeded', 'failed', 'cancelled'));

-- A workflow's quorum batch: the destructive kinds it may send, the digest approvers sign, the
-- threshold it was started under, and when that many approved it (core's enqueue reads this).
CREATE TABLE IF NOT EXISTS workflow_quorum (
  workflow_id text PRIMARY KEY REFERENCES workflows (id),
  digest text NOT NULL,
  kinds text[] NOT NULL,
  threshold integer NOT NULL,
  approved_at timestamptz
);

-- One row per approver that signed the batch; the signature is kept as the proof.
CREATE TABLE IF NOT EXISTS workflow_approvals (
  workflow_id text NOT NULL REFERENCES workflow_quorum (workflow_id),
  approver text NOT NULL,
  signature text NOT NULL,
  recorded_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  PRIMARY KEY (workflow_id, approver)
);`;

/** What an approver signs: this prefix, then the batch's digest. */
export const APPROVAL_CONTEXT = "bc-approve-v1";
export const approvalMessage = (digest: string) => `${APPROVAL_CONTEXT}\n${digest}`;

export interface QuorumBatch {
  kinds: string[];
  digest: string;
}

/** Every destructive kind the profile's steps declare they send, sorted; empty when none. */
export function destructiveKinds(ctx: ModuleContext, profile: ProfileDefinition): string[] {
  const steps = stepsById(ctx.registered);
  const kinds = new Set<string>();
  for (const entry of profile.steps) {
    const step = steps.get(entry.step);
    const sends = [...(step?.sends ?? []), ...(step && step.runsOn !== "control-plane" ? [step.command.kind] : [])];
    for (const kind of sends) if (ctx.registered.commandKind(kind)?.destructive) kinds.add(kind);
  }
  return [...kinds].sort();
}

/** The digest approvers sign: sha256 hex of the canonical JSON of the workflow, its profile, its subject and the kinds. */
export async function batchDigest(input: {
  workflow: string;
  profile: ProfileDefinition;
  subject: string;
  kinds: string[];
}): Promise<string> {
  return sha256Hex(
    canonicalJson({
      workflow: input.workflow,
      profile: `${input.profile.id}@${input.profile.version}`,
      subject: input.subject,
      kinds: input.kinds,
    }),
  );
}

/**
 * The batch of a workflow about to start, or undefined when it needs no approval (no approvers
 * configured, or nothing destructive to send): then it starts running as it always did.
 */
export async function quorumBatch(
  ctx: ModuleContext,
  workflow: string,
  profile: ProfileDefinition,
  subject: string,
): Promise<QuorumBatch | undefined> {
  if (!ctx.pki.approvers) return undefined;
  const kinds = destructiveKinds(ctx, profile);
  if (kinds.length === 0) return undefined;
  return { kinds, digest: await batchDigest({ workflow, profile, subject, kinds }) };
}

export async function recordBatch(ctx: ModuleContext, tx: Tx, workflow: string, batch: QuorumBatch): Promise<void> {
  const threshold = ctx.pki.approvers!.threshold;
  await tx.execute(sql`
    INSERT INTO workflow_quorum (workflow_id, digest, kinds, threshold)
    VALUES (${workflow}, ${batch.digest}, ${`{${batch.kinds.join(",")}}`}::text[], ${threshold})`);
  await ctx.events.publish(tx, {
    type: "workflow.awaiting-approval",
    subject: `workflows/${workflow}`,
    data: { digest: batch.digest, kinds: batch.kinds, threshold },
  });
}

/** As workflows.get shows it. */
export const quorumView = z.object({
  digest: z.string(),
  kinds: z.array(z.string()),
  threshold: z.number(),
  /** The approvers' keys, in the order they approved. */
  approvals: z.array(z.string()),
  approvedAt: z.string().nullable(),
});

/** A raw Ed25519 public key or signature, base64url. */
const base64url = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .regex(/^[A-Za-z0-9_-]+$/, "base64url");

export const approveMethod = defineMethod({
  name: "workflows.approve",
  resource: (input) => `workflows/${input.workflowId}`,
  description:
    "Approve a workflow's batch of destructive commands: an approver's Ed25519 signature over bc-approve-v1\\n<digest> (better-compute workflows approve signs it)",
  input: z.object({
    workflowId: resourceId,
    /** The approver's public key, as listed in pki.approvers.keys. */
    key: base64url(64),
    signature: base64url(128),
  }),
  output: z.object({
    workflowId: z.string(),
    state: z.string(),
    digest: z.string(),
    /** False when this key had approved already: nothing was counted. */
    counted: z.boolean(),
    approvals: z.number(),
    threshold: z.number(),
  }),
  handler: (ctx, input, tx) => approve(ctx, tx, input),
});

async function approve(ctx: MethodContext, tx: Tx, input: { workflowId: string; key: string; signature: string }) {
  const approvers = ctx.pki.approvers;
  if (!approvers) throw new ComputeError("FAILED_PRECONDITION", "no approvers are configured (pki.approvers): nothing needs approval");
  if (!approvers.keys.includes(input.key))
    throw new ComputeError("PERMISSION_DENIED", "the key is not one of pki.approvers.keys: nothing was counted", {
      workflow: input.workflowId,
    });
  // The batch's row, locked: two approvals at once are counted one after the other, so the
  // threshold-th one sees the others and releases the workflow.
  const row = await one<{ state: string; digest: string; threshold: number; approved: boolean }>(
    tx,
    sql`
    SELECT w.state, q.digest, q.threshold, q.approved_at IS NOT NULL AS approved
    FROM workflow_quorum q JOIN workflows w ON w.id = q.workflow_id
    WHERE q.workflow_id = ${input.workflowId} FOR UPDATE OF q`,
  );
  if (!row) {
    if ((await tx.execute(sql`SELECT 1 FROM workflows WHERE id = ${input.workflowId}`)).rows.length === 0)
      throw notFound(`workflow ${input.workflowId} does not exist`);
    throw new ComputeError(
      "FAILED_PRECONDITION",
      `workflow ${input.workflowId} has no batch to approve: it sends nothing destructive, or started before pki.approvers was set`,
      {
        workflow: input.workflowId,
      },
    );
  }
  if (!(await verifyApproval(input.key, row.digest, input.signature)))
    throw new ComputeError(
      "PERMISSION_DENIED",
      `the signature does not verify over workflow ${input.workflowId}'s batch (${APPROVAL_CONTEXT}, digest ${row.digest}): nothing was counted`,
      { workflow: input.workflowId, digest: row.digest },
    );
  if (row.state !== "awaiting-approval" && row.state !== "running")
    throw new ComputeError("FAILED_PRECONDITION", `workflow ${input.workflowId} is ${row.state}: there is nothing left to approve`, {
      workflow: input.workflowId,
      state: row.state,
    });

  const inserted = await tx.execute(sql`
    INSERT INTO workflow_approvals (workflow_id, approver, signature, recorded_by)
    VALUES (${input.workflowId}, ${input.key}, ${input.signature}, ${ctx.principal.id})
    ON CONFLICT DO NOTHING RETURNING approver`);
  const counted = inserted.rows.length > 0;
  const counts = await one<{ n: number }>(
    tx,
    sql`SELECT count(*)::int AS n FROM workflow_approvals WHERE workflow_id = ${input.workflowId}`,
  );
  const approvals = counts!.n;
  const releases = counted && !row.approved && approvals >= row.threshold;
  let state = row.state;
  if (releases) {
    await tx.execute(sql`UPDATE workflow_quorum SET approved_at = compute_now() WHERE workflow_id = ${input.workflowId}`);
    const moved = await tx.execute(sql`
      UPDATE workflows SET state = 'running', updated_at = compute_now() WHERE id = ${input.workflowId} AND state = 'awaiting-approval' RETURNING id`);
    if (moved.rows.length) state = "running";
    ctx.wake.workflow(input.workflowId);
  }
  if (counted)
    await ctx.events.publish(tx, {
      type: "workflow.approved",
      subject: `workflows/${input.workflowId}`,
      data: { approver: input.key, digest: row.digest, approvals, threshold: row.threshold, released: releases },
    });
  return { workflowId: input.workflowId, state, digest: row.digest, counted, approvals, threshold: row.threshold };
}

/**
 * The module's approvals port: a destructive kind is approved only when it is enqueued by a
 * workflow (its origin) whose approved batch holds that kind. Anything else, an operator's
 * commands.create or another module's enqueue, is refused.
 */
export function workflowApprovals(): ApprovalsPort {
  return {
    async check(tx, command) {
      const origin = originObject(command.origin);
      const workflowId = origin?.kind === "workflow" ? origin.name : undefined;
      const approved =
        workflowId !== undefined &&
        (
          await tx.execute(sql`
            SELECT 1 FROM workflow_quorum WHERE workflow_id = ${workflowId} AND approved_at IS NOT NULL AND ${command.kind} = ANY(kinds)`)
        ).rows.length > 0;
      if (approved) return { approved: true };
      return {
        approved: false,
        message: `${command.kind} is destructive: with pki.approvers set it is sent only by a workflow whose approved batch holds it`,
        ...(workflowId ? { details: { workflow: workflowId } } : {}),
      };
    },
  };
}

/** Ed25519 (WebCrypto, in the Worker) over approvalMessage(digest); anything malformed is simply false. */
export async function verifyApproval(key: string, digest: string, signature: string): Promise<boolean> {
  try {
    const publicKey = await crypto.subtle.importKey("raw", unbase64url(key), { name: "Ed25519" }, false, ["verify"]);
    return await crypto.subtle.verify(
      { name: "Ed25519" },
      publicKey,
      unbase64url(signature),
      new TextEncoder().encode(approvalMessage(digest)),
    );
  } catch {
    return false;
  }
}

const unbase64url = (s: string) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
