// bcd's cloud-iid evidence: the instance identity token from the GCP metadata server, asked for
// with an audience bound to this join (the configured audience, the join key and a fresh nonce:
// core/agents/cloud-iid.ts). --metadata-url defaults to the metadata server's real address;
// --audience to the control plane's URL.
import { base64url } from "../../core/encoding.ts";
import { cloudIidAudience, type CloudIidEvidence } from "../../core/agents/cloud-iid.ts";
import { AgentError } from "../contracts.ts";
import { flag, ProducerUsageError, type EvidenceProducer } from "./producer.ts";

export const GCP_IDENTITY_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/identity";
const MAX_TOKEN_BYTES = 8192;

export const cloudIidProducer: EvidenceProducer = {
  flags: { "metadata-url": { type: "string" }, audience: { type: "string" } },
  usage: "[--audience AUD] [--metadata-url URL]   GCP's instance identity token (AUD default the --url; URL default the metadata server)",
  async produce(ctx) {
    const audience = flag(ctx, "audience") ?? ctx.url.replace(/\/+$/, "");
    if (audience.includes("#")) throw new ProducerUsageError("--audience may not contain '#'");
    const metadataUrl = flag(ctx, "metadata-url") ?? GCP_IDENTITY_URL;
    let url: URL;
    try {
      url = new URL(metadataUrl);
    } catch {
      throw new ProducerUsageError(`--metadata-url is not a URL: ${metadataUrl}`);
    }
    const nonce = base64url(crypto.getRandomValues(new Uint8Array(16)));
    url.searchParams.set("audience", cloudIidAudience(audience, await ctx.publicKey(), nonce));
    url.searchParams.set("format", "full");
    let res: Response;
    try {
      res = await ctx.fetch(url, { headers: { "Metadata-Flavor": "Google" }, signal: AbortSignal.timeout(10_000) });
    } catch (e) {
      throw new AgentError("UNAVAILABLE", `cloud-iid: cannot reach the metadata server at ${url.origin}: ${(e as Error).message}`);
    }
    const token = (await res.text()).trim();
    if (!res.ok) throw new AgentError("UNAVAILABLE", `cloud-iid: the metadata server answered HTTP ${res.status}`);
    if (!token || token.length > MAX_TOKEN_BYTES || token.split(".").length !== 3) {
      throw new AgentError("BAD_RESPONSE", "cloud-iid: the metadata server's answer is not an identity token");
    }
    const evidence: CloudIidEvidence = { provider: "gcp", token };
    return { ...evidence };
  },
};
