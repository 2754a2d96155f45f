// The live view of a workflow and of a machine settling: successive answers of workflows.get
// and metal.nodes.get are compared and each change becomes one line (a step starting,
// waiting, succeeding or failing; each attempt and retry with its error). Plain lines, no
// escape codes, so a terminal, a CI log and a test read the same thing.
import type { AttemptView, WorkflowView } from "../core/views.ts";
import type { Api } from "./api.ts";
import { compact } from "./format.ts";

export type { WorkflowView };

export const WORKFLOW_ENDED = new Set(["succeeded", "failed", "cancelled"]);

/** The lines for what changed from prev to next (prev undefined: everything so far). */
export function workflowLines(prev: WorkflowView | undefined, next: WorkflowView): string[] {
  const lines: string[] = [];
  if (!prev) lines.push(`workflow ${next.id}: ${next.profile}@${next.version} on ${next.target}, ${next.state}, created ${next.createdAt}`);
  const before = new Map<string, AttemptView>();
  for (const step of prev?.steps ?? []) for (const a of step.attempts) before.set(`${step.position}:${a.attempt}`, a);

  for (const step of next.steps) {
    const label = `[${step.position + 1}] ${step.name}${step.name === step.step ? "" : ` (${step.step})`}`;
    for (const a of step.attempts) {
      const old = before.get(`${step.position}:${a.attempt}`);
      const nth = a.attempt > 1 ? ` attempt ${a.attempt}` : "";
      if (!old && a.state === "scheduled") lines.push(`  ↻ ${label}${nth} scheduled (retry)`);
      // An attempt that failed without a start time never began (its input was refused).
      const started = a.state !== "scheduled" && (a.startedAt !== null || a.state !== "failed");
      if (started && (!old || old.state === "scheduled")) lines.push(`  ▸ ${label}${nth} started`);
      if (a.state === "not_ready" && (old?.state !== "not_ready" || errorText(old.error) !== errorText(a.error))) {
        lines.push(`    … ${label} not ready: ${errorMessage(a.error)}`);
      }
      if (a.state === "waiting" && old?.state !== "waiting")
        lines.push(`    … ${label} sent command ${a.commandId}, waiting for the agent's result`);
      if (a.state === "succeeded" && old?.state !== "succeeded") {
        lines.push(`  ✔ ${label} succeeded${nth ? ` on${nth}` : ""}${duration(a.startedAt, a.finishedAt)}`);
      }
      if (a.state === "failed" && old?.state !== "failed") lines.push(`  ✖ ${label}${nth} failed: ${errorText(a.error)}`);
    }
  }

  if (next.state === "awaiting-approval" && prev?.state !== next.state)
    lines.push(`  ⏸ awaiting approval (docs/quorum.md): better-compute workflows approve ${next.id} --key-file <approver.pem>`);
  if (next.state !== prev?.state && WORKFLOW_ENDED.has(next.state)) {
    const took = duration(next.createdAt, next.finishedAt);
    if (next.state === "succeeded") lines.push(`✔ workflow ${next.id} succeeded${took}`);
    else lines.push(`✖ workflow ${next.id} ${next.state}${took}${next.error ? `: ${errorText(next.error)}` : ""}`);
  }
  return lines;
}

/** `CODE message` of a recorded error ({code, message, details?}), or its compact form. */
export function errorText(error: unknown): string {
  if (error && typeof error === "object" && "message" in error) {
    const { code, message } = error as { code?: unknown; message?: unknown };
    return `${typeof code === "string" ? `${code} ` : ""}${String(message)}`;
  }
  return compact(error);
}

const errorMessage = (error: unknown) =>
  error && typeof error === "object" && "message" in error ? String((error as { message: unknown }).message) : compact(error);

function duration(from: string | null, to: string | null): string {
  if (!from || !to) return "";
  const ms = Date.parse(to) - Date.parse(from);
  return Number.isFinite(ms) && ms >= 0 ? ` (${(ms / 1000).toFixed(1)} s)` : "";
}

export interface Follow {
  /** Where each progress line goes. */
  out: (line: string) => void;
  pollMs?: number;
  /** Aborts the wait (Ctrl-C); the workflow goes on. */
  signal?: AbortSignal;
}

const DEFAULT_POLL_MS = 1000;

/** Follows a workflow until it ends; answers its last state. */
export async function followWorkflow(api: Api, id: string, follow: Follow): Promise<WorkflowView> {
  let prev: WorkflowView | undefined;
  for (;;) {
    const next = await api.call<WorkflowView>("workflows.get", { id });
    workflowLines(prev, next).forEach(follow.out);
    prev = next;
    if (WORKFLOW_ENDED.has(next.state)) return next;
    await sleep(follow.pollMs ?? DEFAULT_POLL_MS, follow.signal);
  }
}

/**
 * States a machine passes through on its way somewhere; any other state is where it settled:
 * metal's TRANSITIONAL_STATES, written out rather than imported, which would bundle the control
 * plane into the CLI (test/node/cli-offline.test.ts checks they agree). Enrolled machines move on by
 * themselves too: commissioning starts once their site has an agent.
 */
export const MACHINE_MOVING: ReadonlySet<string> = new Set([
  "enrolled",
  "commissioning",
  "deploying",
  "releasing",
  "rescuing",
  "unrescuing",
]);

export interface MachineView {
  id: string;
  state: string;
  workflow: string | null;
  maintenanceReason?: string | null;
  lastError?: unknown;
  [key: string]: unknown;
}

/**
 * Follows a machine until it settles, and the workflows driving it on the way. `nodeParam` is
 * the name metal.nodes.get takes the machine's id by (node, or id before the rename).
 */
export async function waitForMachine(
  api: Api,
  machine: { id: string; nodeParam: string; expect: string },
  follow: Follow,
): Promise<{ node: MachineView; ok: boolean }> {
  let state: string | undefined;
  let workflow: { id: string; prev?: WorkflowView } | undefined;
  for (;;) {
    const node = await api.call<MachineView>("metal.nodes.get", { [machine.nodeParam]: machine.id });
    const moving = MACHINE_MOVING.has(node.state);
    const change =
      node.state === state ? undefined : state ? `machine ${node.id}: ${state} → ${node.state}` : `machine ${node.id}: ${node.state}`;
    state = node.state;
    // Told in the order it happened: a machine sets off, its workflow runs, then it settles.
    if (change && moving) follow.out(change);
    if (node.workflow && node.workflow !== workflow?.id) workflow = { id: node.workflow };
    if (workflow && !(workflow.prev && WORKFLOW_ENDED.has(workflow.prev.state))) {
      const next = await api.call<WorkflowView>("workflows.get", { id: workflow.id });
      workflowLines(workflow.prev, next).forEach(follow.out);
      workflow.prev = next;
    }
    if (change && !moving) follow.out(change);
    if (!moving) {
      const ok = node.state === machine.expect;
      if (ok) follow.out(`✔ machine ${node.id} is ${node.state}`);
      else
        follow.out(
          `✖ machine ${node.id}: ${node.state}, not ${machine.expect}${node.maintenanceReason ? `: ${node.maintenanceReason}` : node.lastError ? `: ${errorText(node.lastError)}` : ""}`,
        );
      return { node, ok };
    }
    await sleep(follow.pollMs ?? DEFAULT_POLL_MS, follow.signal);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
  });
}
