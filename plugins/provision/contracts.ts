// Steps and profiles: the contracts provisioning is written in. A step runs either in the
// control plane (run) or as one command to an agent (command); a profile is the ordered list of
// steps a workflow runs for a target.
import type { z } from "zod";
import type { AgentRole } from "better-compute";
import { ComputeError, type ErrorCode, type ModuleContext, type SecretRef } from "better-compute/core";

export type StepRunsOn = "control-plane" | AgentRole;
export const STEP_RUNS_ON: readonly StepRunsOn[] = ["control-plane", "node", "site", "ramdisk"];

export interface RetryPolicy {
  /** Attempts in all, the first included. */
  attempts: number;
  /** Wait before attempt n+1: backoffSeconds × 2^(n-1), at most maxBackoffSeconds. */
  backoffSeconds: number;
  maxBackoffSeconds?: number;
}

export interface StepContext extends ModuleContext {
  readonly workflow: { id: string; target: string; profile: string };
  readonly step: { name: string; position: number; attempt: number };
  /** Output of an earlier step of this workflow, by its name in the profile. */
  output(name: string): unknown;
}

interface StepBase<I extends z.ZodType> {
  contract: "step";
  id: string;
  version: string;
  description?: string;
  input: I;
  /** Every command kind the step sends (directly, or relayed by a control-plane step). */
  sends?: string[];
  /** Agent roles a control-plane step relays through (e.g. a site agent's httpProxy). */
  relays?: AgentRole[];
  retry?: RetryPolicy;
  /** The step fails when it has not finished this long after its attempt began. */
  deadlineSeconds?: number;
  /** How often a not-ready control-plane step is polled again. */
  pollSeconds?: number;
}

export interface ControlPlaneStep<I extends z.ZodType = z.ZodType> extends StepBase<I> {
  runsOn: "control-plane";
  /** Runs at least once per attempt (again after a crash): make it idempotent. */
  run(ctx: StepContext, input: z.output<I>): Promise<unknown>;
}

export interface AgentStep<I extends z.ZodType = z.ZodType> extends StepBase<I> {
  runsOn: AgentRole;
  /** The one command the step is: sent once per attempt (keyed by workflow, step and attempt). */
  command: {
    kind: string;
    body?: (input: z.output<I>, ctx: StepContext) => Record<string, unknown>;
    /** Secrets the agent needs, by reference: the record keeps the reference, the agent gets the value. */
    secretRefs?: (input: z.output<I>, ctx: StepContext) => SecretRef[];
  };
  /** The node that runs it; default the workflow's target. */
  target?: (input: z.output<I>, ctx: StepContext) => string | Promise<string>;
}

export type StepDefinition<I extends z.ZodType = z.ZodType> = ControlPlaneStep<I> | AgentStep<I>;

type Declared<T> = T extends unknown ? Omit<T, "contract" | "version"> & { version?: string } : never;

// Dotted; a segment after the first may start with a digit ("ubuntu-24.04-autoinstall").
const ID = /^[a-z][a-zA-Z0-9-]*(\.[a-zA-Z0-9][a-zA-Z0-9-]*)*$/;

export function defineStep<I extends z.ZodType>(def: Declared<ControlPlaneStep<I>> | Declared<AgentStep<I>>): StepDefinition<I> {
  if (!ID.test(def.id)) throw new ComputeError("INVALID_CONFIG", `step id ${JSON.stringify(def.id)} is not a dotted name`);
  return { ...def, version: def.version ?? "1", contract: "step" } as StepDefinition<I>;
}

export interface ProfileStep {
  /** The step's id. */
  step: string;
  /** Unique within the profile; default the step id. Later steps' fromStep and ctx.output use it. */
  name?: string;
  /** Static input, merged over the workflow's input. */
  input?: Record<string, unknown>;
  /** Merge this earlier step's output (an object) into the input; several: merged in the order named. */
  fromStep?: string | string[];
}

/** The earlier steps whose outputs a profile entry merges into its input, in order. */
export const fromSteps = (entry: ProfileStep): string[] =>
  entry.fromStep === undefined ? [] : typeof entry.fromStep === "string" ? [entry.fromStep] : entry.fromStep;

export interface ProfileDefinition {
  contract: "profile";
  id: string;
  version: string;
  /** What a workflow of this profile acts on ("metal", "vps", ...). */
  target: string;
  /** What the target becomes (e.g. "host"), for the module that starts it. */
  role?: string;
  description?: string;
  steps: ProfileStep[];
}

export function defineProfile(def: Omit<ProfileDefinition, "contract" | "version"> & { version?: string | number }): ProfileDefinition {
  if (!ID.test(def.id)) throw new ComputeError("INVALID_CONFIG", `profile id ${JSON.stringify(def.id)} is not a dotted name`);
  return { ...def, version: String(def.version ?? "1"), contract: "profile" };
}

/** Thrown by a control-plane step that is waiting on the world: it is polled again later. */
export class StepNotReady extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = "StepNotReady";
  }
}

export function stepNotReady(reason = "not ready yet"): never {
  throw new StepNotReady(reason);
}

/** A typed failure of a step; `retryable: false` fails the workflow without another attempt. */
export class StepError extends ComputeError {
  constructor(
    code: ErrorCode,
    message: string,
    readonly retryable = true,
    details?: Record<string, unknown>,
  ) {
    super(code, message, details);
    this.name = "StepError";
  }
}
