// better-compute/provision: steps, profiles, and the provision module that runs them.
export {
  defineProfile,
  defineStep,
  StepError,
  StepNotReady,
  stepNotReady,
  type AgentStep,
  type ControlPlaneStep,
  type ProfileDefinition,
  type ProfileStep,
  type RetryPolicy,
  type StepContext,
  type StepDefinition,
  type StepRunsOn,
} from "./contracts.ts";
export { advance, commandKey, type Advanced, type EngineContext } from "./engine.ts";
export { provisionModule, startWorkflow, wakeStalledWorkflows, type StartWorkflowInput } from "./module.ts";
export { validateProfile, type ValidationCode, type ValidationIssue } from "./validate.ts";
