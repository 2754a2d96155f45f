// better-compute/testing: drive a deployment's API in tests the way a client would,
// through compute.fetch, with a real store and real API keys.
import type { Compute } from "../core/compute.ts";
import type { Store } from "../core/store/database.ts";

export interface CallResult<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export interface TestClient {
  readonly store: Store;
  /** An API key with the roles the client was created with (default admin). */
  readonly key: string;
  /** POST /v1/<name> with a JSON body; pass key: null to send no credentials. */
  call<T = any>(name: string, input?: unknown, options?: { key?: string | null }): Promise<CallResult<T>>;
  /** Any request against the deployment (path relative to its origin). */
  request(path: string, init?: RequestInit): Promise<Response>;
  /** Mints another key on the same deployment. */
  mintKey(roles: string[]): Promise<string>;
  close(): Promise<void>;
}

export async function createTestClient(
  compute: Compute,
  env: object,
  options: { roles?: string[]; migrate?: boolean } = {},
): Promise<TestClient> {
  const store = compute.openStore(env);
  if (options.migrate ?? true) await compute.applyModuleMigrations(store);
  const mintKey = async (roles: string[]) => (await compute.mintApiKey(store, { name: "test", roles, createdBy: "system:test" })).key;
  const key = await mintKey(options.roles ?? ["admin"]);
  const request = (path: string, init?: RequestInit) => compute.fetch(new Request(new URL(path, "http://bc.test"), init), env);
  return {
    store,
    key,
    request,
    mintKey,
    async call(name, input, callOptions = {}) {
      const credential = callOptions.key === undefined ? key : callOptions.key;
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (credential !== null) headers.authorization = `Bearer ${credential}`;
      const res = await request(`/v1/${name}`, { method: "POST", headers, body: JSON.stringify(input ?? {}) });
      return { status: res.status, body: await res.json(), headers: res.headers };
    },
    close: () => store.close(),
  };
}
