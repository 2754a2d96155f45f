// The provider contract (better-compute/vps): what a VPS provider adapter declares and does.
// A provider is code registered once (defineProvider); an account is a row validated by the
// provider's manifest. The vps.instances reconciler drives an account's client level-triggered:
// it reads the server, compares it with what the instance should be, and makes one call. Every
// call may be cut short by a crash, so each one must be safe to make again.
import type { z } from "zod";
import { ComputeError } from "better-compute/core";

/** The fetch an adapter sends every request through: the deployment's, a recording, or a replay. */
export type Fetch = (input: Request | string | URL, init?: RequestInit) => Promise<Response>;

/** What the provider sells: the ids a flavor maps onto. */
export interface ProviderOffers {
  flavors: { id: string; name: string; vcpus: number; memoryMiB: number; diskGiB: number; locations?: string[] }[];
  images: { id: string; name: string }[];
  locations: { id: string; name: string }[];
}

export interface CreateServerRequest {
  /**
   * The control plane's id for the instance, stamped on the server (a label, a tag, the name) so
   * that find() returns it: a create whose answer was lost is adopted, never made twice.
   */
  instanceId: string;
  /**
   * The server's name at the provider (RFC 1123, <= 63 characters), unique in the deployment: the
   * reconciler passes the instance id, so two tenants' "web" never clash in one account.
   */
  name: string;
  /** The hostname the tenant chose (RFC 1123); default `name`. A provider that names machines by their hostname uses it. */
  hostname?: string;
  /** Offer ids (ProviderOffers). */
  flavor: string;
  image: string;
  location?: string;
  /** Public keys the tenant logs in with (OpenSSH one-line format). */
  sshKeys: { name: string; publicKey: string }[];
  /** cloud-init user data; may carry a join token: send it to the provider and nowhere else. */
  userData?: string;
}

/**
 * A server as the provider reports it. `status` is the adapter's reading of the provider's own:
 * creating, starting, stopping and deleting are on their way; unknown is anything else.
 */
export type ServerStatus = "creating" | "running" | "starting" | "stopping" | "stopped" | "deleting" | "unknown";

export interface ProviderServer {
  /** The provider's id for it (string, whatever the provider's type). */
  id: string;
  /** The stamp read back (CreateServerRequest.instanceId), when the server carries one. */
  instanceId?: string;
  name: string;
  status: ServerStatus;
  /** Public addresses, when assigned. */
  addresses: string[];
  /**
   * A create that was cut short half-way (a provider that needs several calls to make one server):
   * find() still returns it, and calling create() again for the same instance finishes it.
   */
  incomplete?: boolean;
}

/**
 * A provider's asynchronous job (an hcloud action, a Proxmox task). A call that starts one
 * returns it; the reconciler records it and asks operation() on later passes until it ends.
 */
export interface Operation {
  id: string;
}

export type OperationState = { state: "running" } | { state: "succeeded" } | { state: "failed"; message: string };

/**
 * One account's client. Errors are ComputeErrors built with providerError(): a wrong or
 * under-privileged credential is INVALID_CONFIG (never retried), a transient failure (5xx, rate
 * limit, locked) is UNAVAILABLE with details.retryAfterSeconds, a capacity or refused request is
 * DRIVER_ERROR naming the provider and the reason. No error quotes a credential.
 */
export interface ProviderClient {
  offers(): Promise<ProviderOffers>;
  /** Starts a server. The reconciler calls find(instanceId) first, every time. */
  create(request: CreateServerRequest): Promise<{ server: ProviderServer; operation?: Operation }>;
  /** null when the server does not exist (any more). */
  get(id: string): Promise<ProviderServer | null>;
  /** The server stamped with this instance id, or null. */
  find(instanceId: string): Promise<ProviderServer | null>;
  /** Every server of the account the adapter can see. */
  list(): Promise<ProviderServer[]>;
  powerOn(id: string): Promise<Operation | void>;
  powerOff(id: string): Promise<Operation | void>;
  reboot(id: string): Promise<Operation | void>;
  /** Deleting a server that is already gone succeeds. */
  delete(id: string): Promise<Operation | void>;
  /** How a started job is doing; a provider without jobs never returns an Operation. */
  operation(id: string): Promise<OperationState>;
}

export interface ProviderDefinition<A extends z.ZodType = z.ZodType> {
  contract: "provider";
  id: string;
  version: string;
  description?: string;
  /** The account's configuration: checked when an account is created, before anything is stored. */
  manifest: A;
  /** Top-level fields of the account that hold secrets: sealed in the secret store, never echoed. */
  secretFields: string[];
  /**
   * Builds a client for one account (its secret fields already resolved). Every request goes
   * through `fetch`: a deployment passes its own, a test a recording or a replay.
   */
  client(account: z.output<A>, options: { fetch: Fetch }): ProviderClient;
}

const ID = /^[a-z][a-z0-9-]*$/;

export function defineProvider<A extends z.ZodType>(
  def: Omit<ProviderDefinition<A>, "contract" | "version"> & { version?: string },
): ProviderDefinition<A> {
  if (typeof def.id !== "string" || !ID.test(def.id))
    throw new ComputeError("INVALID_CONFIG", `provider id ${JSON.stringify(def.id)} is not valid (expected ${ID.source})`);
  return { ...def, version: def.version ?? "1", contract: "provider" };
}

// ---------------------------------------------------------------- errors

/** Why a provider call failed, as the reconciler acts on it. */
export type ProviderFailure =
  /** Wrong or insufficient credentials, a bad account setting: INVALID_CONFIG, never retried. */
  | "config"
  /** 5xx, timeouts, rate limits, a locked resource: UNAVAILABLE, retried after retryAfterSeconds. */
  | "transient"
  /** No capacity in the location, an account limit: the instance fails (DRIVER_ERROR). */
  | "capacity"
  /** The provider refused the request itself (invalid input, unknown type): DRIVER_ERROR. */
  | "rejected";

const CODE_OF: Record<ProviderFailure, "INVALID_CONFIG" | "UNAVAILABLE" | "DRIVER_ERROR"> = {
  config: "INVALID_CONFIG",
  transient: "UNAVAILABLE",
  capacity: "DRIVER_ERROR",
  rejected: "DRIVER_ERROR",
};

/**
 * The one way an adapter reports a failure. `reason` is the provider's own code
 * (e.g. resource_unavailable); the message names the provider and never a credential.
 */
export function providerError(
  provider: string,
  failure: ProviderFailure,
  message: string,
  details: { reason?: string; status?: number; retryAfterSeconds?: number } = {},
): ComputeError {
  return new ComputeError(CODE_OF[failure], `${provider}: ${message}`, { provider, failure, ...details });
}

/** The failure kind of an error a client threw (an error that is not a providerError is "transient"). */
export function failureOf(err: unknown): ProviderFailure {
  const failure = err instanceof ComputeError ? err.details?.failure : undefined;
  return failure === "config" || failure === "capacity" || failure === "rejected" || failure === "transient" ? failure : "transient";
}
