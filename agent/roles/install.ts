// `bcd install --config FILE`: what the installer ISO's init runs (bc.mode=install, docs/ramdisk.md).
// No control plane to answer to: the config (plugins/metal/installer-iso.ts's InstallConfig, which
// the agent may not import) names the image and the token, and the write is the ramdisk role's own
// metal.ramdisk.writeImage, run here with the token as its secret, onto the machine's first disk
// with a config drive the installed system joins with. Progress goes to `print`; the token never.
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { AgentError, type FetchLike } from "../contracts.ts";
import { ramdiskHandlers, shownUrl, type RamdiskDisks } from "./ramdisk.ts";
import { parseBody } from "./site.ts";

const installConfig = z.object({
  url: z.url({ protocol: /^https?$/ }),
  // Checked for its type only: no message may quote it.
  token: z.string().min(1),
  hostname: z.string().min(1),
  image: z.object({ url: z.url({ protocol: /^https?$/ }), sha256: z.string() }),
});

/** The token's name in the write's secrets. */
const TOKEN_REF = "secret://install-token";

export interface InstallOptions {
  /** This machine's disks (blockDevices()); the first one listed is written. */
  disks: RamdiskDisks;
  /** The DMI product UUID, for the config drive's meta_data.json. */
  productUuid?: string;
  fetch?: FetchLike;
  /** One line per phase. */
  print: (line: string) => void;
  signal?: AbortSignal;
}

export interface InstallResult {
  device: string;
  format: string;
  bytes: number;
  sha256: string;
  written: { bytes: number; sha256: string };
  configDrive: { partition: string; label: string; offsetBytes: number; sizeBytes: number; files: string[] };
}

export async function install(configFile: string, opts: InstallOptions): Promise<InstallResult> {
  const text = await readFile(configFile, "utf8").catch((e: NodeJS.ErrnoException) => {
    throw new AgentError("INVALID_ARGUMENT", `cannot read ${configFile}: ${e.code ?? e.message}`);
  });
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    // Not JSON.parse's message: it quotes the file, token and all.
    throw new AgentError("INVALID_ARGUMENT", `${configFile} is not JSON`);
  }
  const config = parseBody(configFile, installConfig, raw);
  const { disks, print } = opts;
  const [disk] = await disks.list();
  if (!disk) throw new AgentError("DRIVER_ERROR", "this machine has no disk to install onto");
  print(`${configFile}: ${shownUrl(config.image.url)} onto ${disk.device} (${disk.sizeBytes} bytes) as ${config.hostname}`);

  // The handler's steps, each announced as the disk is reached.
  const announced: RamdiskDisks = {
    list: () => disks.list(),
    wipe: (device, method) => disks.wipe(device, method),
    write: (device, chunks) => {
      print(`fetching the image and writing it to ${device}`);
      return disks.write(device, chunks);
    },
    ...(disks.addConfigDrive
      ? {
          addConfigDrive: (device: string, imageBytes: number, files: Record<string, string>) => {
            print(`image written (${imageBytes} bytes), its sha256 matches; adding the config drive`);
            return disks.addConfigDrive!(device, imageBytes, files);
          },
        }
      : {}),
  };
  const writeImage = ramdiskHandlers({
    disks: announced,
    ...(opts.productUuid ? { productUuid: opts.productUuid } : {}),
    ...(opts.fetch ? { fetch: opts.fetch } : {}),
  })["metal.ramdisk.writeImage"]!;
  const body = {
    url: config.image.url,
    sha256: config.image.sha256,
    device: disk.device,
    configDrive: { hostname: config.hostname, controlPlaneUrl: config.url, joinToken: TOKEN_REF },
  };
  const result = (await writeImage(body, {
    id: "install",
    key: "install",
    kind: "bcd install",
    seq: 0,
    attested: false,
    deadline: null,
    signal: opts.signal ?? new AbortController().signal,
    secrets: { [TOKEN_REF]: config.token },
  })) as InstallResult;
  print(
    `installed ${result.device}: ${result.bytes} bytes fetched (${result.format}, sha256 ${result.sha256}), ` +
      `${result.written.bytes} written; config drive ${result.configDrive.partition} (${result.configDrive.label})`,
  );
  return result;
}
