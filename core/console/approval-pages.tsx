/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// Quorum approvals in the console (docs/quorum.md): the workflows waiting for approval, and one
// workflow's batch with the form that records an approver's signature (workflows.approve, as the
// session's principal). The console never signs: the approver's private key stays with them, and
// the page shows the bytes to sign and the commands that sign them.
import type { FC } from "hono/jsx";
import { DataTable, Empty, MorePage, plural, PostForm, Section, State, Submit, Time } from "./components.tsx";
import type { WorkflowView } from "../views.ts";

/** Where a workflow's target can be opened (a metal machine's page), if anywhere. */
export type TargetHref = (wf: WorkflowView) => string | undefined;

export const approvePath = (id: string) => `/console/workflows/${encodeURIComponent(id)}/approve`;

const Target: FC<{ wf: WorkflowView; href?: string }> = ({ wf, href }) =>
  href ? <a href={href}>{wf.target}</a> : <span class="mono">{wf.target}</span>;

/** "1 of 2 approvals". */
const count = (q: NonNullable<WorkflowView["quorum"]>) => `${q.approvals.length} of ${plural(q.threshold, "approval")}`;

/** The short note a machine's page shows above its workflow while that waits for approval. */
export const AwaitingApproval: FC<{ workflow: WorkflowView; mayApprove: boolean }> = ({ workflow: wf, mayApprove }) =>
  wf.state === "awaiting-approval" && wf.quorum ? (
    <div class="panel" id="awaiting-approval">
      <p>
        <strong>Awaits approval</strong>: {count(wf.quorum)} (it sends {wf.quorum.kinds.join(", ")}, which cannot be taken back). It runs no
        step until {plural(wf.quorum.threshold, "approver")} signed its batch.
      </p>
      {mayApprove && (
        <p>
          <a id="approve" class="button" href={approvePath(wf.id)}>
            Approve…
          </a>
        </p>
      )}
    </div>
  ) : null;

export const Approvals: FC<{ workflows: WorkflowView[]; next: string | null; configured: boolean; targetHref: TargetHref }> = ({
  workflows,
  next,
  configured,
  targetHref,
}) => {
  if (workflows.length === 0)
    return (
      <Empty>
        {configured
          ? "No workflow waits for approval. A workflow that sends a destructive command (a power cycle, a disk wipe, an image written) waits here until enough approvers signed it."
          : "No approvers are configured (pki.approvers), so no workflow waits for approval: destructive commands are sent as their workflows reach them."}
      </Empty>
    );
  return (
    <>
      <DataTable
        label="Workflows awaiting approval"
        caption={`${plural(workflows.length, "workflow")} awaiting approval, newest first`}
        columns={["Workflow", "Profile", "Target", "Destructive commands", "Approvals", { label: "Started", wide: true }]}
      >
        {workflows.map((wf) => (
          <tr data-workflow={wf.id}>
            <th scope="row">
              <a href={approvePath(wf.id)} class="mono">
                {wf.id}
              </a>
            </th>
            <td>{wf.profile}</td>
            <td>
              <Target wf={wf} href={targetHref(wf)} />
            </td>
            <td class="mono">{wf.quorum?.kinds.join(", ") ?? "–"}</td>
            <td data-approvals={wf.quorum?.approvals.length ?? 0}>{wf.quorum ? count(wf.quorum) : "–"}</td>
            <td class="wide">
              <Time at={wf.createdAt} /> by <span class="mono">{wf.createdBy}</span>
            </td>
          </tr>
        ))}
      </DataTable>
      {next && <MorePage href={`/console/approvals?after=${encodeURIComponent(next)}`}>Older workflows</MorePage>}
    </>
  );
};

/** One workflow's batch: what is approved, by whom so far, and (below it) how to sign it and the form. */
export const ApprovalBatch: FC<{ workflow: WorkflowView; href?: string; counted?: string }> = ({ workflow: wf, href, counted }) => {
  const q = wf.quorum;
  return (
    <>
      {counted && (
        <p class="panel" id="approval-result" role="status">
          {counted === "yes"
            ? `Your approval was counted: ${q ? count(q) : "recorded"}.`
            : "This key had approved already: nothing more was counted."}
          {wf.state === "running" && " The workflow has its approvals and runs."}
        </p>
      )}
      <dl class="fields">
        <dt>State</dt>
        <dd id="workflow-state" data-state={wf.state}>
          <State state={wf.state} />
        </dd>
        <dt>Profile</dt>
        <dd>
          {wf.profile}@{wf.version}
        </dd>
        <dt>Target</dt>
        <dd>
          <Target wf={wf} href={href} />
        </dd>
        <dt>Started</dt>
        <dd>
          <Time at={wf.createdAt} /> by <span class="mono">{wf.createdBy}</span>
        </dd>
        {q && (
          <>
            <dt>Destructive commands</dt>
            <dd class="mono">{q.kinds.join(", ")}</dd>
            <dt>Digest</dt>
            <dd class="mono" id="digest">
              {q.digest}
            </dd>
            <dt>Approvals</dt>
            <dd id="approvals" data-approvals={q.approvals.length}>
              {count(q)}
              {q.approvedAt && (
                <>
                  , approved <Time at={q.approvedAt} />
                </>
              )}
              {q.approvals.length > 0 && (
                <ul>
                  {q.approvals.map((key) => (
                    <li class="mono">{key}</li>
                  ))}
                </ul>
              )}
            </dd>
          </>
        )}
      </dl>
      {!q && (
        <p class="empty">
          This workflow has no batch to approve: it sends nothing destructive, or it started before pki.approvers was set.
        </p>
      )}
    </>
  );
};

export const ApproveForm: FC<{ workflow: WorkflowView; csrf: string }> = ({ workflow: wf, csrf }) => {
  const q = wf.quorum;
  if (!q || (wf.state !== "awaiting-approval" && wf.state !== "running")) return null;
  return (
    <Section id="sign" title="Approve it">
      <p>
        An approval is an Ed25519 signature by a key listed in <code>pki.approvers.keys</code> over the bytes{" "}
        <code>bc-approve-v1\n{q.digest}</code>. Your private key stays with you: sign where it is, then paste the signature here. The CLI
        does both at once: <code>better-compute workflows approve --workflow-id {wf.id} --key-file approver.pem</code>.
      </p>
      <p>With OpenSSL (3.0 or later):</p>
      <pre class="mono" tabindex={0} role="region" aria-label="Signing with OpenSSL">
        {[
          `printf 'bc-approve-v1\\n%s' ${q.digest} > batch.txt`,
          "openssl pkeyutl -sign -rawin -inkey approver.pem -in batch.txt | basenc --base64url -w0 | tr -d =; echo   # the signature",
          "openssl pkey -in approver.pem -pubout -outform DER | tail -c 32 | basenc --base64url | tr -d =   # your public key",
        ].join("\n")}
      </pre>
      <PostForm action={approvePath(wf.id)} csrf={csrf}>
        <label for="approver-key">Your public key (base64url, as pki.approvers.keys lists it)</label>
        <input id="approver-key" name="key" required maxlength={64} autocomplete="off" spellcheck={false} class="mono" />
        <label for="signature">Signature (base64url)</label>
        <input id="signature" name="signature" required maxlength={128} autocomplete="off" spellcheck={false} class="mono" />
        <Submit id="approve-submit">Approve</Submit>
      </PostForm>
    </Section>
  );
};
