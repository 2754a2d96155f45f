// better-compute: the root entry. Declare modules and extensions, and compose a deployment.
export { betterCompute, type Compute, type ComputeOptions, type PkiOptions } from "./compute.ts";
export type { Bindings } from "./bindings.ts";
export {
  defineAttestor,
  defineDriver,
  defineModule,
  definePlugin,
  defineSchedulerPlugin,
  defineSink,
  type AgentRole,
  type AtomPicker,
  type AttestationChallenge,
  type AttestationRequest,
  type AttestationResult,
  type CommandKind,
  type GenericExtension,
  type AttestorDefinition,
  type DriverDefinition,
  type DriverKind,
  type Extension,
  type IamCatalog,
  type Migration,
  type Module,
  type ModuleDefinition,
  type NodeSpecSection,
  type PlacementFilter,
  type PlacementScorer,
  type Reconciler,
  type ReconcileCause,
  type SchedulerPluginDefinition,
  type SinkContext,
  type SinkDefinition,
  type SinkEvent,
} from "./contracts.ts";
export { tableSink, type TableSinkOptions } from "./events/table-sink.ts";
export { verifyWebhookSignature, webhookSink, type WebhookSinkOptions } from "./events/webhook-sink.ts";
export { cloudIidAttestor, type CloudIidOptions } from "./agents/cloud-iid.ts";
export { x509popAttestor, type X509Identity, type X509PopOptions } from "./agents/x509pop.ts";
export { tpmAttestor, TPM_EK_LABEL, type TpmAttestorOptions } from "./agents/tpm.ts";
export { builtinIam, type BuiltinIamOptions, type IamPort, type IamProvider, type Principal } from "./iam.ts";
export { postgres, type DatabasePort, type PostgresOptions } from "./store/database.ts";
