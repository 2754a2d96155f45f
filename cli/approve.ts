// `better-compute workflows approve --workflow-id W --key-file approver.pem`: reads the workflow's
// quorum batch (workflows.get), signs `bc-approve-v1\n<digest>` here with the approver's Ed25519
// key (PKCS8 PEM, as `openssl genpkey -algorithm ed25519` writes it), and sends the signature
// (workflows.approve). The private key never leaves this process; see docs/quorum.md.
import { createPrivateKey, createPublicKey, sign, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";
import type { Api } from "./api.ts";
import { splitArgs } from "./args.ts";
import { UsageError } from "./connection.ts";

export const APPROVE_HELP = `better-compute workflows approve --workflow-id <id> --key-file <approver.pem>
  Signs the workflow's batch of destructive commands with an approver's Ed25519 key (PKCS8 PEM)
  and records the approval; the workflow runs once pki.approvers.threshold approvers signed.
  Shows what is approved (profile, target, destructive kinds, digest) first. The key stays here.
  Make a key:  openssl genpkey -algorithm ed25519 -out approver.pem
  Its public key for pki.approvers.keys:  better-compute workflows approve --key-file approver.pem --public-key
  (workflows approve --workflowId W --key K --signature S sends a signature made elsewhere.)`;

/** What workflows.get answers that approving needs. */
interface WorkflowToApprove {
  id: string;
  profile: string;
  version: string;
  target: string;
  state: string;
  quorum: { digest: string; kinds: string[]; threshold: number; approvals: string[] } | null;
}

interface Approved {
  state: string;
  counted: boolean;
  approvals: number;
  threshold: number;
}

/** Whether argv is this command rather than the generated one (which takes --key and --signature). */
export const isKeyFileApproval = (tail: string[]) => tail.some((t) => t === "--key-file" || t.startsWith("--key-file="));

/** The approver's key from a PKCS8 PEM file, and its public half as pki.approvers.keys lists it (raw, base64url). */
export function approverKey(file: string): { privateKey: KeyObject; publicKey: string } {
  let privateKey: KeyObject;
  try {
    privateKey = createPrivateKey(readFileSync(file));
  } catch (err) {
    throw new UsageError(`cannot read an Ed25519 private key from ${file}: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (privateKey.asymmetricKeyType !== "ed25519") throw new UsageError(`${file} holds a ${privateKey.asymmetricKeyType} key, not Ed25519`);
  const jwk = createPublicKey(privateKey).export({ format: "jwk" });
  return { privateKey, publicKey: jwk.x! };
}

/** The signature workflows.approve takes: Ed25519 over `bc-approve-v1\n<digest>`, base64url. */
export const signApproval = (privateKey: KeyObject, digest: string) =>
  sign(null, Buffer.from(`bc-approve-v1\n${digest}`), privateKey).toString("base64url");

/** `connect` is called once the key is read: a bad key file is reported before the connection is looked for. */
export async function approveCommand(connect: () => Api, tail: string[], out: (line: string) => void, json: boolean): Promise<number> {
  const split = splitArgs(tail, (name) => name !== "public-key");
  const flag = (name: string) => split.flags.find((f) => f.name === name)?.value;
  const unknown = split.flags.find((f) => !["workflow-id", "key-file", "public-key"].includes(f.name));
  const keyFile = flag("key-file");
  if (unknown || split.words.length > 1 || !keyFile)
    throw new UsageError(`usage: better-compute workflows approve --workflow-id <id> --key-file <approver.pem>`);
  const { privateKey, publicKey } = approverKey(keyFile);
  if (split.flags.some((f) => f.name === "public-key")) {
    out(publicKey);
    return 0;
  }
  const workflowId = flag("workflow-id") ?? split.words[0];
  if (!workflowId) throw new UsageError(`usage: better-compute workflows approve --workflow-id <id> --key-file <approver.pem>`);

  const api = connect();
  const wf = await api.call<WorkflowToApprove>("workflows.get", { id: workflowId });
  if (!wf.quorum)
    throw new UsageError(`workflow ${workflowId} has no batch to approve (it sends nothing destructive, or no approvers are set)`);
  if (!json) {
    out(`workflow ${wf.id}: ${wf.profile}@${wf.version} on ${wf.target} (${wf.state})`);
    out(`  destructive kinds: ${wf.quorum.kinds.join(", ")}`);
    out(`  digest:            ${wf.quorum.digest}`);
  }
  const answer = await api.call<Approved>("workflows.approve", {
    workflowId,
    key: publicKey,
    signature: signApproval(privateKey, wf.quorum.digest),
  });
  if (json) out(JSON.stringify(answer, null, 2));
  else
    out(
      `${answer.counted ? "approved" : "already approved by this key (nothing counted)"}: ${answer.approvals} of ${answer.threshold}; the workflow is ${answer.state}`,
    );
  return 0;
}
