// @acme/bc-autoinstall: installs an OS with its own installer from a per-machine ISO mounted
// through the BMC, written as an outside package would (public entry points only). Two profiles:
// - ubuntu-24.04-autoinstall, for the simulated site. SIMULATED: the ISO and its hosting are a
//   map from digest to contents behind an unguessable URL.
// - bc-os.autoinstall, real (the emulated site, docs/emulated-site.md): the ISO is the installer
//   ISO (npm run installer-iso) with its machine window holding this machine's install config
//   (a single-use join token, the OS image on the site's cache), kept in ctx.blobs, mirrored by
//   the site agent by its digest, inserted through the BMC and booted; the installer writes the
//   image and a config drive and reboots, and the installed system joins with the token.
import { z } from "zod";
import { definePlugin } from "better-compute";
import { sha256Bytes, sha256Hex } from "better-compute/core";
import { installConfigImage, MACHINE_IMAGE_BYTES, renderTemplate } from "better-compute/metal";
import { defineProfile, defineStep, StepError, type StepContext } from "better-compute/provision";

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

/** The machine an ISO is rendered for, and the name its installed system takes. */
const machineInput = (hostname: string) =>
  z.object({
    machine: z.string(),
    productUuid: z.string(),
    hostname: z
      .string()
      .regex(/^[a-z0-9-]{1,63}$/)
      .default(hostname),
  });

/** The single-use token the installed system joins with: only the machine with this product UUID can use it, within the hour. */
const nodeToken = (ctx: StepContext, input: { machine: string; productUuid: string }) =>
  ctx.store.transaction(async (tx) => {
    const minted = await ctx.pki.mintJoinToken(tx, {
      role: "node",
      labels: { "bc.dev/machine": input.machine },
      expect: { productUuid: input.productUuid },
      ttlSeconds: 3600,
    });
    return minted.token;
  });

export const renderAutoinstallIso = defineStep({
  id: "autoinstall.renderIso",
  runsOn: "control-plane",
  description: "Render a per-machine autoinstall ISO holding a single-use provisioned join token",
  input: machineInput("ubuntu"),
  run: async (ctx, input) => {
    const token = await nodeToken(ctx, input);
    const iso = `ISO9660 (simulated)\n/autoinstall/user-data:\n${renderTemplate(USER_DATA, { hostname: input.hostname, token })}`;
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

const sha256 = z.string().regex(/^[0-9a-f]{64}$/);

export const renderInstallerIso = defineStep({
  id: "autoinstall.renderInstallerIso",
  runsOn: "control-plane",
  description:
    "Render this machine's installer ISO: the installer ISO (input.installer) with its machine window holding the install config, a single-use join token inside; kept in ctx.blobs",
  input: machineInput("bc-host").extend({
    /** The installer ISO (an ImageSource) and where its machine window is (its build's manifest). */
    installer: z.object({
      url: z.string().url(),
      sha256,
      machineImage: z.object({ offset: z.number().int().nonnegative(), bytes: z.literal(MACHINE_IMAGE_BYTES) }),
    }),
    /** The control plane's URL as the installed system reaches it. */
    joinUrl: z.string().url(),
    /** The OS image on the site's cache (fromStep: the image.cache step that mirrored it). */
    url: z.string().url(),
    sha256,
  }),
  run: async (ctx, input) => {
    const res = await fetch(input.installer.url);
    if (!res.ok) throw new StepError("DRIVER_ERROR", `the installer ISO answered ${res.status}`);
    const iso = new Uint8Array(await res.arrayBuffer());
    const got = await sha256Bytes(iso);
    if (got !== input.installer.sha256)
      throw new StepError("DRIVER_ERROR", `the installer ISO's sha256 is ${got}, not ${input.installer.sha256}`, false);
    const { offset } = input.installer.machineImage;
    if (offset + MACHINE_IMAGE_BYTES > iso.length || iso.subarray(offset, offset + MACHINE_IMAGE_BYTES).some((b) => b !== 0))
      throw new StepError("INVALID_ARGUMENT", `the installer ISO has no empty machine window at ${offset}`, false);
    const token = await nodeToken(ctx, input);
    const image = { url: input.url, sha256: input.sha256 };
    iso.set(installConfigImage({ url: input.joinUrl, token, hostname: input.hostname, image }), offset);
    const blob = await ctx.blobs.put(iso);
    return { image: { blob: blob.sha256 } };
  },
});

/** The real one: deploy input { image: { url, sha256 } (the OS image), installer: { url, sha256, machineImage }, joinUrl, hostname? }. */
export const bcOsAutoinstall = defineProfile({
  id: "bc-os.autoinstall",
  version: 1,
  target: "metal",
  role: "host",
  description: "The bc-os image installed by the installer ISO, rendered per machine, through virtual media",
  steps: [
    // The site's DHCP answers the machine (the installer fetches the image), and its network boot leaves it to its disk.
    { step: "netboot.disk" },
    { step: "image.cache", name: "os.cache" },
    { step: "autoinstall.renderInstallerIso", fromStep: "os.cache" },
    { step: "image.cache", name: "iso.cache", fromStep: "autoinstall.renderInstallerIso" },
    { step: "media.insert", fromStep: "iso.cache" },
    { step: "management.setBootDevice", input: { device: "cd" } },
    { step: "power.setPower", input: { action: "cycle" } },
    { step: "wait.agentJoined", input: { role: "node" } },
    { step: "media.eject" },
  ],
});

export const acmeAutoinstall = definePlugin({
  id: "acme-autoinstall",
  extensions: [renderAutoinstallIso, renderInstallerIso],
  profiles: [ubuntuAutoinstall, bcOsAutoinstall],
});
