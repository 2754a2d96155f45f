// providerConformanceCases(): what every provider adapter must do, as plain { name, run } cases
// for runConformance (better-compute/conformance). Each case cleans up what it created. The cases
// are driven by the provider's answers alone (no clocks, no random names), so a run recorded with
// recordingFetch replays offline exchange for exchange.
import type { ConformanceCase } from "better-compute/conformance";
import { ComputeError } from "better-compute/core";
import type { CreateServerRequest, Operation, ProviderClient, ProviderServer, ServerStatus } from "./contracts.ts";

export interface ProviderSubject {
  /** A client for a working account. */
  client: ProviderClient;
  /** A client for the same provider with a wrong credential: its calls must fail with INVALID_CONFIG. */
  wrongCredential?: ProviderClient;
  /** The account's secrets: no error may quote them. */
  secrets?: string[];
  /** What to create; default the first flavor, image and location offers() lists. */
  offer?: Partial<Pick<CreateServerRequest, "flavor" | "image" | "location">>;
  /** The provider takes cloud-init user data (Hetzner Robot does not); default true. */
  userData?: boolean;
  /** Milliseconds between polls of a job or a status (0 for replays and instant emulators); default 0. */
  pollMs?: number;
  /** Polls before a wait fails; default 300. */
  maxPolls?: number;
}

const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl conformance@better-compute";

/** The request each case creates with: deterministic, so recordings replay. */
async function request(subject: ProviderSubject, n: number): Promise<CreateServerRequest> {
  const offers = await subject.client.offers();
  const flavor = subject.offer?.flavor ?? offers.flavors[0]?.id;
  const image = subject.offer?.image ?? offers.images[0]?.id;
  if (!flavor || !image) throw new Error("offers() lists no flavor or no image to create with");
  const location = subject.offer?.location ?? offers.locations[0]?.id;
  return {
    instanceId: `conformance-${n}`,
    name: `bc-conformance-${n}`,
    flavor,
    image,
    ...(location ? { location } : {}),
    sshKeys: [{ name: "conformance", publicKey: KEY }],
    ...(subject.userData === false ? {} : { userData: "#cloud-config\nruncmd:\n  - echo conformance\n" }),
  };
}

const sleep = (ms: number) => (ms > 0 ? new Promise((r) => setTimeout(r, ms)) : Promise.resolve());

/** Waits for a job to end; a failed job fails the case. */
async function settle(subject: ProviderSubject, op: Operation | void, what: string): Promise<void> {
  if (!op) return;
  for (let i = 0; i < (subject.maxPolls ?? 300); i++) {
    const state = await subject.client.operation(op.id);
    if (state.state === "succeeded") return;
    if (state.state === "failed") throw new Error(`${what}: the provider's job ${op.id} failed: ${state.message}`);
    await sleep(subject.pollMs ?? 0);
  }
  throw new Error(`${what}: job ${op.id} did not end within ${subject.maxPolls ?? 300} polls`);
}

/** Polls get() until the server is in one of `statuses` (null: gone). */
async function waitFor(subject: ProviderSubject, id: string, statuses: (ServerStatus | null)[]): Promise<ProviderServer | null> {
  let last: ProviderServer | null = null;
  for (let i = 0; i < (subject.maxPolls ?? 300); i++) {
    last = await subject.client.get(id);
    if (statuses.includes(last ? last.status : null)) return last;
    await sleep(subject.pollMs ?? 0);
  }
  throw new Error(`server ${id} did not become ${statuses.join(" or ")} (last: ${last ? last.status : "gone"})`);
}

/** Creates a server for the case, runs it, and deletes whatever the case left. */
async function withServer(subject: ProviderSubject, n: number, run: (server: ProviderServer) => Promise<void>): Promise<void> {
  const created = await subject.client.create(await request(subject, n));
  try {
    await settle(subject, created.operation, "create");
    const running = await waitFor(subject, created.server.id, ["running"]);
    await run(running!);
  } finally {
    const leftover = await subject.client.find(`conformance-${n}`);
    if (leftover) {
      await settle(subject, await subject.client.delete(leftover.id), "cleanup delete");
      await waitFor(subject, leftover.id, [null]);
    }
  }
}

function check(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

export function providerConformanceCases(): ConformanceCase<ProviderSubject>[] {
  return [
    {
      name: "offers lists flavors with sizes, images and locations",
      async run(subject) {
        const offers = await subject.client.offers();
        check(offers.flavors.length > 0, "no flavors");
        check(offers.images.length > 0, "no images");
        for (const f of offers.flavors) {
          check(typeof f.id === "string" && f.id.length > 0, `flavor without an id: ${JSON.stringify(f)}`);
          check(f.vcpus > 0 && f.memoryMiB > 0 && f.diskGiB > 0, `flavor ${f.id} has no sizes`);
        }
      },
    },
    {
      name: "get and find of servers that do not exist return null",
      async run(subject) {
        check((await subject.client.find("conformance-missing")) === null, "find of an unknown instance id returned a server");
        const known = new Set((await subject.client.list()).map((s) => s.id));
        const unknown = ["987654321", "999999", "4242"].find((id) => !known.has(id))!;
        check((await subject.client.get(unknown)) === null, `get(${unknown}) of no server returned one`);
      },
    },
    {
      name: "a created server reaches running, carries its stamp and is found by it",
      async run(subject) {
        await withServer(subject, 1, async (server) => {
          check(server.status === "running", `status ${server.status}`);
          const found = await subject.client.find("conformance-1");
          check(found?.id === server.id, `find returned ${found?.id ?? "null"}, not ${server.id}`);
          check(found.instanceId === "conformance-1", `the server's stamp reads ${found.instanceId}`);
          check(
            (await subject.client.list()).some((s) => s.id === server.id),
            "list() does not include the server",
          );
        });
      },
    },
    {
      name: "create for an instance id that has a server returns that server, never a second",
      async run(subject) {
        await withServer(subject, 2, async (server) => {
          const again = await subject.client.create(await request(subject, 2));
          await settle(subject, again.operation, "second create");
          check(again.server.id === server.id, `a second server ${again.server.id} was created beside ${server.id}`);
          const stamped = (await subject.client.list()).filter((s) => s.instanceId === "conformance-2");
          check(stamped.length === 1, `${stamped.length} servers carry the stamp`);
        });
      },
    },
    {
      name: "power off stops the server, power on and reboot leave it running",
      async run(subject) {
        await withServer(subject, 3, async (server) => {
          await settle(subject, await subject.client.powerOff(server.id), "power off");
          await waitFor(subject, server.id, ["stopped"]);
          await settle(subject, await subject.client.powerOn(server.id), "power on");
          await waitFor(subject, server.id, ["running"]);
          await settle(subject, await subject.client.reboot(server.id), "reboot");
          await waitFor(subject, server.id, ["running"]);
        });
      },
    },
    {
      name: "delete removes the server; deleting it again succeeds",
      async run(subject) {
        await withServer(subject, 4, async (server) => {
          await settle(subject, await subject.client.delete(server.id), "delete");
          await waitFor(subject, server.id, [null]);
          check((await subject.client.find("conformance-4")) === null, "find still returns the deleted server");
          await settle(subject, await subject.client.delete(server.id), "second delete");
        });
      },
    },
    {
      name: "a wrong credential is INVALID_CONFIG naming the provider, and no error quotes a secret",
      async run(subject) {
        if (!subject.wrongCredential) throw new Error("the subject has no wrongCredential client");
        const err = await subject.wrongCredential.list().then(
          () => undefined,
          (e: unknown) => e,
        );
        check(err instanceof ComputeError, `list() with a wrong credential ${err ? `threw ${String(err)}` : "succeeded"}`);
        check(err.code === "INVALID_CONFIG", `a wrong credential is ${err.code}, not INVALID_CONFIG: ${err.message}`);
        check(
          typeof err.details?.provider === "string" && err.message.includes(String(err.details.provider)),
          `the error does not name the provider: ${err.message}`,
        );
        const text = JSON.stringify({ message: err.message, details: err.details });
        for (const secret of subject.secrets ?? []) check(!text.includes(secret), "the error quotes a secret of the account");
      },
    },
  ];
}
