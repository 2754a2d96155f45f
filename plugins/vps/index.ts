// better-compute/vps: VPS from hosting providers. vps({ providers }) is the module; defineProvider
// and the types around it are the contract an adapter implements, providerConformanceCases() what
// it must pass (with runConformance from better-compute/conformance), ProviderHttp the HTTP it
// speaks through. The record/replay transport is better-compute/vps/record-replay.
export { vps } from "./module.ts";
export type { CallHooks, VpsOptions } from "./methods.ts";
export { LEASE_SECONDS, reconcileInstance, type ReconcileOptions } from "./reconciler.ts";
export { INSTANCE_STATES, type InstanceState } from "./instances.ts";
export {
  CONSOLE_KIND,
  DEFAULT_IMAGE,
  DEFAULT_RUNTIME,
  INSTANCES_SECTION,
  MAX_CONSOLE_BYTES,
  MAX_USER_DATA_BYTES,
  reconcileHostInstance,
} from "./host-instances.ts";
/** The `instances` entry is the node role's as much as vps's: it lives in better-compute/core. */
export { instanceEntry, type InstanceEntry } from "better-compute/core";
export { renderUserData, type UserDataInput } from "./user-data.ts";
export {
  defineProvider,
  failureOf,
  providerError,
  type CreateServerRequest,
  type Fetch,
  type Operation,
  type OperationState,
  type ProviderClient,
  type ProviderDefinition,
  type ProviderFailure,
  type ProviderOffers,
  type ProviderServer,
  type ServerStatus,
} from "./contracts.ts";
export { providerConformanceCases, type ProviderSubject } from "./conformance.ts";
export { ProviderHttp, type Classified, type HttpRequest, type HttpResponse, type ProviderHttpOptions } from "./http.ts";
