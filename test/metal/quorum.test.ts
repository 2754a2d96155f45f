// Quorum for destructive commands (docs/quorum.md), on Walkthrough 1 (acme-autoinstall's Ubuntu
// deploy) with pki.approvers 2-of-3: the deploy waits in awaiting-approval, one approval is not
// enough, the second (made by the CLI, as docs/quorum.md shows) releases it, and each
// destructive command is sent once; forged, replayed, other-batch, unknown-key and duplicate
// approvals count nothing; an undeclared destructive kind is refused at enqueue with no command
// row, as are an operator's commands.create and another module's enqueue. Commissioning's second
// approval is made in the web console, in Chromium (axe-core on its pages). SIMULATED: the
// machine, its disk and BMC (createMetalSim); Postgres, the engine, metal, the agents and the CLI
// over HTTP are real.
import { execFile } from "node:child_process";
import { createHash, generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { sql } from "drizzle-orm";
import { z } from "zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute, definePlugin } from "better-compute";
import { createMetalSim, type MetalSim } from "better-compute/testing/metal";
import { metalModule } from "better-compute/metal";
import { defineProfile, defineStep, provisionModule } from "better-compute/provision";
import { repoRoot } from "../../local/node-store.ts";
import { acmeAutoinstall, tokenInIso } from "../extensions/acme-autoinstall/plugin.ts";
import { axeContext, chromiumMissing, launchChromium, seriousViolations, signIn } from "../support/chromium.ts";

const PROFILE = "ubuntu-24.04-autoinstall";

interface Approver {
  publicKey: string;
  privateKey: KeyObject;
}
const newApprover = (): Approver => {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  return { publicKey: publicKey.export({ format: "jwk" }).x!, privateKey };
};
const signDigest = (who: Approver, digest: string) =>
  sign(null, Buffer.from(`bc-approve-v1\n${digest}`), who.privateKey).toString("base64url");

/** A control-plane step that power-cycles the machine without declaring metal.bmc.power in sends. */
const sneaky = definePlugin({
  id: "sneaky",
  extensions: [
    defineStep({
      id: "sneaky.powerCycle",
      runsOn: "control-plane",
      input: z.object({ siteAgent: z.string() }),
      run: (ctx, input) =>
        ctx.store.transaction((tx) =>
          ctx.commands.enqueue(tx, {
            nodeId: input.siteAgent,
            kind: "metal.bmc.power",
            key: `sneaky:${ctx.workflow.id}`,
            body: { action: "cycle" },
          }),
        ),
    }),
  ],
  profiles: [defineProfile({ id: "sneaky.cycle", target: "metal", steps: [{ step: "sneaky.powerCycle" }] })],
});

/** A refusal's code and message (fails the test when the call succeeds). */
async function refusal(promise: Promise<unknown>): Promise<{ code: string; message: string }> {
  const outcome = await promise.then(
    (value) => ({ ok: true as const, value }),
    (err: unknown) => ({ ok: false as const, err: err as { code: string; message: string } }),
  );
  if (outcome.ok) throw new Error(`expected a refusal, got ${JSON.stringify(outcome.value)}`);
  return outcome.err;
}

/** Runs bash in dir with the CLI as `better-compute`, as the docs' blocks are run (test/node/docs.test.ts). */
function bash(script: string, dir: string, env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  const cli = `better-compute() { node ${JSON.stringify(path.join(repoRoot, "scripts", "better-compute.mjs"))} "$@"; }`;
  return new Promise((resolve) => {
    execFile(
      "bash",
      ["-c", ["set -euo pipefail", cli, script].join("\n")],
      { cwd: dir, env: { ...process.env, BC_URL: "", BC_API_KEY: "", BC_DATA_DIR: dir, ...env }, timeout: 120_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

/** docs/quorum.md's shell block that starts with the given comment line. */
function docsBlock(firstLine: RegExp): string {
  const blocks = [...fs.readFileSync(path.join(repoRoot, "docs/quorum.md"), "utf8").matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map(
    (m) => m[1]!,
  );
  const block = blocks.find((b) => firstLine.test(b.split("\n")[0]!));
  if (!block) throw new Error(`docs/quorum.md has no shell block starting ${firstLine}`);
  return block;
}

type WorkflowView = {
  state: string;
  quorum: { digest: string; kinds: string[]; threshold: number; approvals: string[]; approvedAt: string | null } | null;
};

describe("quorum 2-of-3 on Walkthrough 1", () => {
  let sim: MetalSim;
  let server: http.Server;
  let url: string;
  let apiKey: string;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-quorum-"));
  const [first, second] = [newApprover(), newApprover()];
  /** The third approver: its key made with the commands docs/quorum.md shows. */
  let third: string;
  const outsider = newApprover();

  const get = (id: string) => sim.call<WorkflowView & Record<string, unknown>>("workflows.get", { id });
  const approve = (workflowId: string, key: string, signature: string) =>
    sim.call<{ state: string; counted: boolean; approvals: number; threshold: number }>("workflows.approve", {
      workflowId,
      key,
      signature,
    });
  const count = async (query: ReturnType<typeof sql>) => ((await sim.store.db.execute(query)).rows[0] as { n: number }).n;
  /** The machine's current workflow once it exists and is in the state. */
  const workflowOf = async (node: string, state: string) => {
    for (let i = 0; i < 600; i++) {
      const id = ((await sim.call("metal.nodes.get", { node })) as { workflow?: string | null }).workflow;
      if (id && (await get(id)).state === state) return id;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`machine ${node} has no workflow in ${state}`);
  };
  /** Approves with the first two approvers, through the API. */
  const approveTwice = async (id: string) => {
    const { quorum } = await get(id);
    await approve(id, first.publicKey, signDigest(first, quorum!.digest));
    return approve(id, second.publicKey, signDigest(second, quorum!.digest));
  };

  beforeAll(async () => {
    const made = await bash(docsBlock(/^# not run here: writes a key file/), dir);
    expect(made.code, made.stderr).toBe(0);
    // OpenSSL's line and the CLI's: the same public key.
    const [byOpenssl, byCli] = made.stdout.trim().split("\n").slice(-2);
    expect(byCli).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(byOpenssl).toBe(byCli);
    third = byCli!;

    sim = await createMetalSim({
      modules: [acmeAutoinstall, sneaky],
      pki: { approvers: { keys: [first.publicKey, second.publicKey, third], threshold: 2 } },
      install: ({ image }) => {
        const token = tokenInIso(image);
        return token ? { token } : undefined;
      },
    });
    apiKey = (await sim.control.compute!.mintApiKey(sim.store, { name: "quorum-cli", roles: ["admin"] })).key;
    // The CLI talks HTTP: serve the in-process control plane on a port.
    server = http.createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const response = await sim.control.transport.fetch(`${sim.control.baseUrl}${req.url}`, {
        method: req.method!,
        headers: req.headers as Record<string, string>,
        ...(req.method === "POST" ? { body: Buffer.concat(chunks) } : {}),
      });
      res.writeHead(response.status, Object.fromEntries(response.headers));
      res.end(Buffer.from(await response.arrayBuffer()));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }, 120_000);
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await sim?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("commissioning waits for its approval too; two approvals release it to ready", async () => {
    await sim.enroll(sim.machines[0]!, { id: "m-q" });
    const commission = await workflowOf("m-q", "awaiting-approval");
    const wf = await get(commission);
    expect(wf.quorum).toMatchObject({ kinds: ["metal.bmc.power", "metal.ramdisk.wipe"], threshold: 2, approvals: [], approvedAt: null });
    expect(await count(sql`SELECT count(*)::int AS n FROM bc_commands WHERE origin = ${`workflow:${commission}`}`)).toBe(0);
    if (chromiumMissing) {
      console.warn(`quorum: the console's approval pages not checked in a browser: ${chromiumMissing}`);
      expect((await approveTwice(commission)).state).toBe("running");
    } else {
      // One approval through the API, the second in the web console, in Chromium, as an approver would.
      await approve(commission, first.publicKey, signDigest(first, wf.quorum!.digest));
      const browser = await launchChromium();
      try {
        const page = await (await axeContext(browser)).newPage();
        await signIn(page, url, apiKey);
        await page.goto(`${url}/console/approvals`);
        const row = page.locator("tr", { hasText: commission });
        await expect.poll(() => row.innerText()).toContain("1 of 2");
        expect(await seriousViolations(page), "the approvals page").toEqual([]);
        await row.getByRole("link", { name: commission }).click();
        await page.waitForURL((u) => u.pathname.endsWith(`/workflows/${commission}/approve`));
        expect(await seriousViolations(page), "the approve page").toEqual([]);
        await page.getByLabel(/Your public key/).fill(second.publicKey);
        await page.getByLabel(/Signature/).fill(signDigest(second, wf.quorum!.digest));
        await page.getByRole("button", { name: "Approve", exact: true }).click();
        await page.waitForURL((u) => u.searchParams.get("counted") === "yes");
        expect(await page.locator("main").innerText()).toContain("Your approval was counted");
      } finally {
        await browser.close();
      }
      expect((await get(commission)).quorum!.approvals).toEqual([first.publicKey, second.publicKey]);
    }
    const ready = await sim.waitForState("m-q", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
  }, 90_000);

  it("the deploy waits in awaiting-approval; one approval is not enough; bad approvals count nothing; the CLI's releases it", async () => {
    const seenBefore = sim.commandsSeen.length;
    const { workflow } = await sim.call<{ workflow: string }>("metal.deploy", { node: "m-q", profile: PROFILE });
    const waiting = await get(workflow);
    expect(waiting.state).toBe("awaiting-approval");
    expect(waiting.quorum).toMatchObject({ kinds: ["metal.bmc.power"], threshold: 2, approvals: [] });
    const digest = waiting.quorum!.digest;
    // The digest as docs/quorum.md defines it, recomputed by an approver who wants to check what they sign.
    const canonical = JSON.stringify({ kinds: ["metal.bmc.power"], profile: `${PROFILE}@1`, subject: "m-q", workflow });
    expect(digest).toBe(createHash("sha256").update(canonical).digest("hex"));
    expect(
      (await sim.call<{ workflows: { id: string; state: string }[] }>("workflows.list", { state: "awaiting-approval" })).workflows,
    ).toEqual([expect.objectContaining({ id: workflow, state: "awaiting-approval" })]);

    const once = await approve(workflow, first.publicKey, signDigest(first, digest));
    expect(once).toMatchObject({ counted: true, approvals: 1, threshold: 2, state: "awaiting-approval" });

    const commission = (await sim.store.db.execute(sql`SELECT id FROM workflows WHERE target = 'm-q' AND profile_id = 'metal.commission'`))
      .rows[0] as { id: string };
    const commissionDigest = (await get(commission.id)).quorum!.digest;
    const forged = signDigest(outsider, digest); // a valid signature, by a key that is not an approver's
    const refused = [
      // forged: the second approver's key with someone else's signature
      await refusal(approve(workflow, second.publicKey, forged)),
      // replayed: the second approver's signature over the commissioning batch
      await refusal(approve(workflow, second.publicKey, signDigest(second, commissionDigest))),
      // another batch: signed over a digest that is not this workflow's
      await refusal(approve(workflow, second.publicKey, signDigest(second, "0".repeat(64)))),
      // not an approver
      await refusal(approve(workflow, outsider.publicKey, forged)),
    ];
    expect(refused.map((r) => r.code)).toEqual(["PERMISSION_DENIED", "PERMISSION_DENIED", "PERMISSION_DENIED", "PERMISSION_DENIED"]);
    // The first approver again (its signature replayed): answered, counted nothing.
    expect(await approve(workflow, first.publicKey, signDigest(first, digest))).toMatchObject({ counted: false, approvals: 1 });

    const stillWaiting = await get(workflow);
    expect(stillWaiting.state).toBe("awaiting-approval");
    expect(stillWaiting.quorum!.approvals).toEqual([first.publicKey]);
    expect(await count(sql`SELECT count(*)::int AS n FROM bc_commands WHERE origin = ${`workflow:${workflow}`}`)).toBe(0);
    expect((await sim.call<{ state: string }>("metal.nodes.get", { node: "m-q" })).state).toBe("deploying");

    // The second approval, as an approver makes it: docs/quorum.md's block, the CLI signing with the key file.
    const cli = await bash(docsBlock(/^# not run here: needs a deployment with pki.approvers/), dir, {
      BC_URL: url,
      BC_API_KEY: apiKey,
      WORKFLOW: workflow,
    });
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toContain(digest);
    expect(cli.stdout).toContain("approved: 2 of 2; the workflow is running");

    const deployed = await sim.waitForState("m-q", ["deployed", "failed"]);
    expect(deployed.state, JSON.stringify(deployed.lastError)).toBe("deployed");
    const done = await get(workflow);
    expect(done.state).toBe("succeeded");
    expect(done.quorum!.approvals).toEqual([first.publicKey, third]);
    expect(done.quorum!.approvedAt).not.toBeNull();

    // Each destructive command of the batch was sent once, and the agent ran it once.
    const destructive = await sim.store.db.execute(sql`
      SELECT kind, count(*)::int AS n FROM bc_commands WHERE origin = ${`workflow:${workflow}`} AND destructive GROUP BY kind`);
    expect(destructive.rows).toEqual([{ kind: "metal.bmc.power", n: 1 }]);
    expect(sim.commandsSeen.slice(seenBefore).filter((c) => c.kind === "metal.bmc.power" && c.body.action === "cycle")).toHaveLength(1);

    // Two counted approvals: two events; every accepted call has its audit row, the refused ones none.
    const events = await sim.store.db.execute(sql`
      SELECT data->>'approver' AS approver, (data->>'released')::boolean AS released FROM bc_events
      WHERE type = 'workflow.approved' AND subject = ${`workflows/${workflow}`} ORDER BY id`);
    expect(events.rows).toEqual([
      { approver: first.publicKey, released: false },
      { approver: third, released: true },
    ]);
    expect(
      await count(
        sql`SELECT count(*)::int AS n FROM bc_audit WHERE action = 'workflows.approve' AND resource = ${`workflows/${workflow}`}`,
      ),
    ).toBe(3);
  }, 90_000);

  it("release waits too; once approved (the second signature made with OpenSSL, as the console shows it), the machine is ready again", async () => {
    const { workflow } = await sim.call<{ workflow: string }>("metal.undeploy", { node: "m-q" });
    const { state, quorum } = await get(workflow);
    expect(state).toBe("awaiting-approval");
    expect(await approve(workflow, first.publicKey, signDigest(first, quorum!.digest))).toMatchObject({ counted: true, approvals: 1 });
    // docs/quorum.md's OpenSSL block (the one the console's approval page fills in), with the third approver's key file.
    const signed = await bash(docsBlock(/^# not run here: needs approver\.pem and a workflow's digest/), dir, { DIGEST: quorum!.digest });
    expect(signed.code, signed.stderr).toBe(0);
    const [signature, publicKey] = signed.stdout.trim().split("\n");
    expect(publicKey).toBe(third);
    expect(await approve(workflow, publicKey!, signature!)).toMatchObject({ counted: true, approvals: 2, state: "running" });
    const ready = await sim.waitForState("m-q", ["ready", "failed"]);
    expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
  }, 90_000);

  it("a step that sends an undeclared destructive kind fails at enqueue, PERMISSION_DENIED, with no command created", async () => {
    const siteAgent = sim.site.agentNodeId!;
    const { id } = await sim.call<{ id: string }>("workflows.start", { profile: "sneaky.cycle", target: "m-q", input: { siteAgent } });
    let wf = await get(id);
    for (let i = 0; i < 600 && wf.state === "running"; i++) {
      await new Promise((r) => setTimeout(r, 50));
      wf = await get(id);
    }
    expect(wf.quorum).toBeNull(); // nothing declared destructive: no batch, it ran at once
    expect(wf.state).toBe("failed");
    expect(wf.error).toMatchObject({ code: "PERMISSION_DENIED", step: "sneaky.powerCycle", attempt: 1 });
    expect(
      await count(
        sql`SELECT count(*)::int AS n FROM bc_commands WHERE origin = ${`workflow:${id}`} OR idempotency_key = ${`sneaky:${id}`}`,
      ),
    ).toBe(0);
  }, 60_000);

  it("an operator's commands.create and a module's own enqueue of a destructive kind are refused, with no command row", async () => {
    const siteAgent = sim.site.agentNodeId!;
    const before = await count(sql`SELECT count(*)::int AS n FROM bc_commands`);
    const operator = await refusal(sim.call("commands.create", { node: siteAgent, kind: "metal.bmc.power", body: { action: "off" } }));
    expect(operator.code).toBe("PERMISSION_DENIED");
    // Not destructive: still sent as before.
    await sim.call("commands.create", { node: siteAgent, kind: "metal.bmc.inspect", body: {} });

    const ctx = sim.control.compute!.moduleContext("metal", {}, sim.store);
    const approved = (
      (
        await sim.store.db.execute(
          sql`SELECT workflow_id FROM workflow_quorum WHERE approved_at IS NOT NULL AND kinds = '{metal.bmc.power}' LIMIT 1`,
        )
      ).rows[0] as { workflow_id: string }
    ).workflow_id;
    const enqueue = (kind: string, origin?: string) =>
      refusal(
        sim.store.transaction((tx) =>
          ctx.commands.enqueue(tx, {
            nodeId: siteAgent,
            kind,
            key: `module:${crypto.randomUUID()}`,
            body: {},
            ...(origin ? { origin } : {}),
          }),
        ),
      );
    expect((await enqueue("metal.bmc.power")).code).toBe("PERMISSION_DENIED");
    // In the name of an approved workflow, a kind its batch does not hold.
    expect((await enqueue("metal.ramdisk.wipe", `workflow:${approved}`)).code).toBe("PERMISSION_DENIED");
    expect(await count(sql`SELECT count(*)::int AS n FROM bc_commands`)).toBe(before + 1);
  });

  it("an awaiting-approval workflow can be cancelled, and approving it then is FAILED_PRECONDITION", async () => {
    const { workflow } = await sim.call<{ workflow: string }>("metal.deploy", { node: "m-q", profile: PROFILE });
    expect((await sim.call<{ state: string }>("workflows.cancel", { id: workflow })).state).toBe("cancelled");
    const { quorum } = await get(workflow);
    expect((await refusal(approve(workflow, first.publicKey, signDigest(first, quorum!.digest)))).code).toBe("FAILED_PRECONDITION");
    expect(await count(sql`SELECT count(*)::int AS n FROM bc_commands WHERE origin = ${`workflow:${workflow}`}`)).toBe(0);
  });
});

describe("pki.approvers is checked when betterCompute() runs", () => {
  const keys = [newApprover(), newApprover(), newApprover()].map((a) => a.publicKey);
  const compose =
    (approvers: { keys: string[]; threshold: number }, modules = [provisionModule(), metalModule()]) =>
    () =>
      betterCompute({ secret: "quorum-config-secret-0123456789abcdef", modules, pki: { approvers } });

  it("refuses a threshold out of range, a duplicate or malformed key, and approvers without workflows: INVALID_CONFIG", () => {
    const cases: [{ keys: string[]; threshold: number }, RegExp, ReturnType<typeof provisionModule>[]?][] = [
      [{ keys, threshold: 0 }, /threshold must be an integer from 1 to the number of keys \(3\), not 0/],
      [{ keys, threshold: 4 }, /threshold .* not 4/],
      [{ keys, threshold: 1.5 }, /threshold/],
      [{ keys: [keys[0]!, keys[1]!, keys[0]!], threshold: 2 }, /keys\[2\] is listed twice/],
      [{ keys: [keys[0]!, "not-a-key"], threshold: 1 }, /keys\[1\] is not an Ed25519 public key/],
      [{ keys, threshold: 2 }, /needs the provision module/, [metalModule()]],
    ];
    for (const [approvers, message, modules] of cases) {
      let error: { code?: string; message?: string } | undefined;
      try {
        compose(approvers, modules)();
      } catch (err) {
        error = err as { code: string; message: string };
      }
      expect(error, JSON.stringify(approvers)).toMatchObject({ code: "INVALID_CONFIG", message: expect.stringMatching(message) });
    }
    expect(compose({ keys, threshold: 3 })).not.toThrow();
  });
});
