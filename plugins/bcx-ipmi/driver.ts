// The IPMI driver as the control plane knows it: a BMC driver that runs on the site agent, in the
// bcx-ipmi plugin bcd hosts (docs/bcx.md), and the manifest metal.enroll checks a binding with.
import { z } from "zod";
import { SECRET_REF } from "better-compute/core";
import { externalDriver } from "better-compute/driver-sdk";
import { IPMI_CIPHER_SUITES, IPMI_DRIVER, IPMI_PLUGIN_VERSION, MAC, MAX_IPMI_USER_BYTES, parseIpmiAddress } from "./binding.ts";

export { IPMI_DRIVER, IPMI_PLUGIN_VERSION } from "./binding.ts";

const bytes = (s: string) => new TextEncoder().encode(s).length;

export const ipmiBinding = z.strictObject({
  driver: z.literal(IPMI_DRIVER),
  /** host[:port] of the BMC's LAN channel; port 623 when not given. */
  address: z.string().superRefine((a, ctx) => {
    const parsed = parseIpmiAddress(a);
    if (!parsed.ok) ctx.addIssue({ code: "custom", message: `the IPMI address ${parsed.problem}` });
  }),
  username: z
    .string()
    .min(1)
    .refine((u) => bytes(u) <= MAX_IPMI_USER_BYTES, `at most ${MAX_IPMI_USER_BYTES} bytes (IPMI 2.0)`),
  /** A secret:// reference (metal.enroll seals a password given in clear). */
  password: z.string().regex(SECRET_REF, "a secret:// reference, never the password itself"),
  cipherSuite: z
    .number()
    .int()
    .refine((n) => (IPMI_CIPHER_SUITES as readonly number[]).includes(n), {
      message: `one of ${IPMI_CIPHER_SUITES.join(", ")} (0 is refused: the BMC would take any password)`,
    })
    .default(3),
  /** The provisioning NICs' MACs, lower case: the site's DHCP answers only these. */
  macs: z
    .array(
      z
        .string()
        .transform((m) => m.toLowerCase())
        .pipe(z.string().regex(MAC, "a MAC address, aa:bb:cc:dd:ee:ff")),
    )
    .min(1, "at least one: the BMC does not report the machine's NICs")
    .max(16),
});
export type IpmiBinding = z.output<typeof ipmiBinding>;

/** The control plane's half of bcx-ipmi: metal's default hardware profile ipmi-pxe names it. */
export const ipmiDriver = externalDriver({
  id: IPMI_DRIVER,
  version: IPMI_PLUGIN_VERSION,
  kinds: ["power", "management"],
  runsOn: "site",
  manifest: ipmiBinding,
  secretFields: ["password"],
});
