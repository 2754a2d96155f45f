// profiles.validate: resolve every step of a profile against what the deployment registered,
// third-party steps included, and say what would go wrong before any workflow runs.
import type { RegisteredView } from "better-compute/core";
import { fromSteps, STEP_RUNS_ON, type ProfileDefinition, type StepDefinition } from "./contracts.ts";

export type ValidationCode =
  "UNKNOWN_STEP" | "UNDECLARED_COMMAND" | "UNKNOWN_COMMAND_KIND" | "UNKNOWN_ROLE" | "BAD_FROM_STEP" | "DUPLICATE_NAME";

export interface ValidationIssue {
  /** The profile entry's name (its step id unless named). */
  step: string;
  position: number;
  code: ValidationCode;
  message: string;
}

/** The newest registered version of each step id. */
export function stepsById(registered: RegisteredView): Map<string, StepDefinition> {
  const byId = new Map<string, StepDefinition>();
  for (const step of registered.extensions<StepDefinition>("step")) {
    const known = byId.get(step.id);
    if (!known || step.version.localeCompare(known.version, undefined, { numeric: true }) > 0) byId.set(step.id, step);
  }
  return byId;
}

export function findProfile(registered: RegisteredView, id: string, version?: string): ProfileDefinition | undefined {
  return registered
    .extensions<ProfileDefinition>("profile")
    .filter((p) => p.id === id && (version === undefined || p.version === version))
    .sort((a, b) => b.version.localeCompare(a.version, undefined, { numeric: true }))[0];
}

export function validateProfile(registered: RegisteredView, profile: ProfileDefinition): ValidationIssue[] {
  const steps = stepsById(registered);
  const issues: ValidationIssue[] = [];
  const seen = new Set<string>();
  profile.steps.forEach((entry, position) => {
    const name = entry.name ?? entry.step;
    const issue = (code: ValidationCode, message: string) => issues.push({ step: name, position, code, message });
    if (seen.has(name)) issue("DUPLICATE_NAME", `two entries are named ${name}; name one of them`);
    for (const from of fromSteps(entry)) {
      if (!seen.has(from)) issue("BAD_FROM_STEP", `fromStep ${from} names no earlier step of the profile`);
    }
    seen.add(name);

    const step = steps.get(entry.step);
    if (!step) return issue("UNKNOWN_STEP", `no registered module provides step ${entry.step}`);
    if (!STEP_RUNS_ON.includes(step.runsOn))
      issue("UNKNOWN_ROLE", `step ${step.id} runs on ${String(step.runsOn)}, a role no agent can have`);
    for (const role of step.relays ?? []) {
      if (!STEP_RUNS_ON.includes(role) || (role as string) === "control-plane")
        issue("UNKNOWN_ROLE", `step ${step.id} relays through ${String(role)}, a role no agent can have`);
    }
    const sends = new Set(step.sends ?? []);
    if (step.runsOn !== "control-plane" && "command" in step && !sends.has(step.command.kind)) {
      issue("UNDECLARED_COMMAND", `step ${step.id} sends ${step.command.kind} but does not declare it in sends`);
    }
    const kinds = step.runsOn !== "control-plane" && "command" in step ? [...sends, step.command.kind] : [...sends];
    for (const kind of new Set(kinds)) {
      if (!registered.commandKind(kind))
        issue("UNKNOWN_COMMAND_KIND", `step ${step.id} sends ${kind}, which no registered module declares`);
    }
  });
  return issues;
}
