// What bcd sends as a join's evidence, per attestor: the table `bcd join --attestor ID` looks up.
// Each producer declares the flags it reads (bcd parses them with its own) and builds the
// evidence; evidence is sent once and never stored or logged. A usage mistake (a missing flag) is
// a ProducerUsageError: bcd prints it with its usage and exits 2.
import { readFile } from "node:fs/promises";
import { readProductUuid } from "../roles/machine-facts.ts";
import { cloudIidProducer } from "./cloud-iid.ts";
import { flag, ProducerUsageError, type EvidenceProducer } from "./producer.ts";
import { tpmProducer } from "./tpm.ts";
import { x509popProducer } from "./x509pop.ts";

export { ProducerUsageError, type EvidenceProducer, type ProducerContext } from "./producer.ts";

/** join-token and provisioned: the single-use token, from --token, --token-file or BC_JOIN_TOKEN. */
const tokenProducer: EvidenceProducer = {
  flags: { token: { type: "string" }, "token-file": { type: "string" } },
  usage: "(--token TOKEN | --token-file FILE | $BC_JOIN_TOKEN)",
  async produce(ctx) {
    let token = flag(ctx, "token");
    const file = flag(ctx, "token-file");
    if (token === undefined && file !== undefined) token = (await readFile(file, "utf8")).trim();
    token ??= ctx.env.BC_JOIN_TOKEN;
    if (!token) throw new ProducerUsageError(`${ctx.command} needs --token, --token-file or BC_JOIN_TOKEN`);
    return { token };
  },
};

/**
 * provisioned: the token, and the machine's DMI product UUID when it has one (read from
 * /sys/class/dmi/id/product_uuid, root's alone), so a token minted with `expect: { productUuid }`
 * joins from that machine only.
 */
export const provisionedProducer: EvidenceProducer = {
  ...tokenProducer,
  async produce(ctx) {
    const productUuid = await readProductUuid();
    return { ...(await tokenProducer.produce(ctx)), ...(productUuid ? { productUuid } : {}) };
  },
};

/** Attestor id -> its producer. The order is the one bcd's usage lists. */
export const evidenceProducers: Record<string, EvidenceProducer> = {
  "join-token": tokenProducer,
  provisioned: provisionedProducer,
  x509pop: x509popProducer,
  "cloud-iid": cloudIidProducer,
  tpm: tpmProducer,
};
