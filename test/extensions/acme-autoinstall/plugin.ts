// @acme/bc-autoinstall: installs Ubuntu with its own installer from a per-machine ISO mounted
// through the BMC, written as an outside package would (public entry points only).
// SIMULATED: the ISO build and hosting are a map from digest to contents behind an unguessable
// URL; a real plugin would build an ISO and put it in the site agent's cache.
import { z } from "zod";
import { definePlugin } from "better-compute";
import { sha256Hex } from "better-compute/core";
import { renderTemplate } from "better-compute/metal";
import { defineProfile, defineStep } from "better-compute/provision";

const USER_DATA = `#cloud-config
autoinstall:
  version: 1
  identity: { hostname: {{ hostname }} }
  late-commands:
    - curtin in-target -- bcd join --attestor provisioned --token {{ token }} --role node
`;

/** Stub hosting: ISO contents by sha256 (what the site cache would serve). */
export const isos = new Map<string, string>();

/** The provisioned join token an ISO carries (what the installed system's first boot reads). */
export function tokenInIso(url: string): string | undefined {
  const sha = /\/([0-9a-f]{64})\.iso$/.exec(url)?.[1];
  const iso = sha ? isos.get(sha) : undefined;
  return iso ? /--token (bcj_[0-9a-f]{16}_[A-Za-z0-9_-]{43})/.exec(iso)?.[1] : undefined;
}

export const renderAutoinstallIso = defineStep({
  id: "autoinstall.renderIso",
  runsOn: "control-plane",
  description: "Render a per-machine autoinstall ISO holding a single-use provisioned join token",
  input: z.object({
    machine: z.string(),
    productUuid: z.string(),
    hostname: z
      .string()
      .regex(/^[a-z0-9-]{1,63}$/)
      .default("ubuntu"),
  }),
  run: async (ctx, input) => {
    // Only the machine with this product UUID can join with the token.
    const minted = await ctx.store.transaction((tx) =>
      ctx.pki.mintJoinToken(tx, {
        role: "node",
        labels: { "bc.dev/machine": input.machine },
        expect: { productUuid: input.productUuid },
        ttlSeconds: 3600,
      }),
    );
    const iso = `ISO9660 (simulated)\n/autoinstall/user-data:\n${renderTemplate(USER_DATA, { hostname: input.hostname, token: minted.token })}`;
    const sha256 = await sha256Hex(iso);
    isos.set(sha256, iso);
    const unguessable = crypto.randomUUID().replaceAll("-", "") + crypto.randomUUID().replaceAll("-", "");
    return { url: `https://site-cache.sim.test/isos/${unguessable}/${sha256}.iso`, sha256 };
  },
});

export const ubuntuAutoinstall = defineProfile({
  id: "ubuntu-24.04-autoinstall",
  version: 1,
  target: "metal",
  role: "host",
  description: "Ubuntu 24.04 installed by its own installer from a per-machine ISO",
  steps: [
    { step: "autoinstall.renderIso" },
    { step: "media.insert", fromStep: "autoinstall.renderIso" },
    { step: "management.setBootDevice", input: { device: "cd" } },
    { step: "power.setPower", input: { action: "cycle" } },
    { step: "wait.agentJoined", input: { role: "node" } },
    { step: "media.eject" },
  ],
});

export const acmeAutoinstall = definePlugin({ id: "acme-autoinstall", extensions: [renderAutoinstallIso], profiles: [ubuntuAutoinstall] });
