// better-compute/core: methods, ports and errors, for module and plugin authors.
export { defineMethod, type MethodDeclaration, type MethodDefinition } from "./contracts.ts";
export {
  createOnce,
  defineDeleteMethod,
  defineGetMethod,
  defineListMethod,
  differingFields,
  refuseOtherFields,
  type CreateOnce,
} from "./methods.ts";
export { newestFirst, nextCursor, pageLimit } from "./paging.ts";
export {
  durationHistogram,
  inMetricsWindow,
  METRICS_WINDOW_SECONDS,
  poolStateGauge,
  type GaugeFamily,
  type GaugeHistogramFamily,
  type MetricFamily,
  type MetricLabels,
} from "./metrics/openmetrics.ts";
export type {
  ApprovalsPort,
  CapacityPort,
  Clock,
  CommandInput,
  CommandsPort,
  EnqueuedCommand,
  RegisteredView,
  EventInput,
  EventsPort,
  HostView,
  MethodContext,
  ModuleContext,
  NodesPort,
  NodeSpecsPort,
  NodeSpecView,
  PkiPort,
  PlacementExplanation,
  PlacementRejection,
  PlacementRequest,
  PlacementResult,
  PlatformContext,
  ProvisionedTokenInput,
  ResourceAmounts,
  SecretRef,
  SecretStore,
  BlobStore,
  StoredBlob,
  StatementEvent,
  WorkInput,
  WorkPort,
} from "./context.ts";
export {
  ComputeError,
  conflict,
  driverError,
  errorStatus,
  invalidArgument,
  invalidConfig,
  isComputeError,
  notFound,
  schemaIssues,
  unsupported,
  type ErrorCode,
  type ErrorDetails,
} from "./errors.ts";
export type { IamPort, Principal, ResolvedCatalog } from "./iam.ts";
export type { Logger } from "./log.ts";
export type { DatabasePort, Db, Runner, Store, Tx } from "./store/database.ts";
export { literal, one, rows, sendWithCommit } from "./store/database.ts";
export { isSecretRef, MAX_ID_LENGTH, resourceId, SECRET_REF, slugId } from "./schemas.ts";
export { base64, sha256Hex, utf8 } from "./encoding.ts";
export { memoryBlobs, r2Blobs, sha256Bytes } from "./store/blobs.ts";
export { canonicalJson, instanceEntry, type InstanceEntry } from "./protocol.ts";
export { objectOrigin, originObject } from "./agents/notify.ts";
export { askAgent, type AgentAnswer } from "./agents/ask.ts";
