// @acme/bc-talos: Talos Linux on an agentless pool, written as an outside package would (public
// entry points only). Talos manages itself through its own API and never runs bcd, so the plugin
// is one step and one profile: mount the Talos ISO, boot it, and poll the Talos API through the
// site agent until it answers.
import { z } from "zod";
import { definePlugin } from "better-compute";
import { httpViaSite } from "better-compute/metal";
import { defineProfile, defineStep, stepNotReady } from "better-compute/provision";

export const TALOS_API_PORT = 50000;

const spki = z.string().regex(/^[A-Za-z0-9+/]{43}=$/, "base64 SHA-256 of the machine certificate's SubjectPublicKeyInfo");

export const waitTalosReady = defineStep({
  id: "wait.talosReady",
  runsOn: "control-plane",
  description: "Poll the Talos API at the machine's own address, through its site agent, until it answers",
  // The declaration puts the relayed kind in the workflow's record (and quorum batch): site.httpProxy is destructive.
  relays: ["site"],
  sends: ["site.httpProxy"],
  input: z.object({
    addresses: z.array(z.string()).min(1, "the machine has no recorded address: commission it first"),
    tlsSpkiSha256: spki,
  }),
  pollSeconds: 1,
  deadlineSeconds: 900,
  run: async (ctx, input) => {
    const address = input.addresses[0]!;
    const host = address.includes(":") ? `[${address}]` : address;
    const answer = await httpViaSite(ctx, {
      url: `https://${host}:${TALOS_API_PORT}/machine/version`,
      tlsSpkiSha256: input.tlsSpkiSha256,
      poll: true,
    });
    if (!answer.ok) stepNotReady(`Talos at ${host} is not answering yet (${answer.error.code}: ${answer.error.message})`);
    if (answer.status !== 200) stepNotReady(`Talos at ${host} answered ${answer.status}`);
    const version = z.object({ version: z.string() }).parse(JSON.parse(answer.body));
    return { talosVersion: version.version };
  },
});

export const talosProfile = defineProfile({
  id: "talos-1.8",
  target: "metal",
  role: "host",
  description:
    "Boot the Talos ISO (input.url) through the BMC and wait until the Talos API answers with the pinned key (input.tlsSpkiSha256)",
  steps: [
    { step: "media.insert" },
    { step: "management.setBootDevice", name: "boot.cd", input: { device: "cd" } },
    { step: "power.setPower", name: "power.cycle", input: { action: "cycle" } },
    { step: "wait.talosReady" },
  ],
});

export const acmeTalos = definePlugin({
  id: "acme-talos",
  description: "Talos Linux on agentless metal pools",
  extensions: [waitTalosReady],
  profiles: [talosProfile],
});
