// The NoCloud seed: a vfat image labelled CIDATA holding user-data (the stored bytes verbatim:
// FC-ENRICH-ONCE, nothing here composes or edits them), meta-data (the one name as instance-id
// and local-hostname: FC-GUEST-NAME) and network-config. Written once per guest: built beside the
// target and renamed into place, so a crash leaves no half seed and an existing seed is never rewritten.
import { mkdtemp, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { run } from "./helpers.ts";
import { networkConfig, type NetworkPlan } from "./network.ts";

export interface SeedContent {
  name: string;
  userData: Uint8Array;
  network?: NetworkPlan;
}

export function metaData(name: string): string {
  return `instance-id: ${name}\nlocal-hostname: ${name}\n`;
}

/** Writes seedPath unless it exists already; returns whether it wrote it. */
export async function writeSeedOnce(seedPath: string, content: SeedContent): Promise<boolean> {
  if (await exists(seedPath)) return false;
  const dir = path.dirname(seedPath);
  const src = await mkdtemp(path.join(dir, ".seed-"));
  const tmp = `${seedPath}.tmp`;
  try {
    const files: [string, string | Uint8Array][] = [
      ["user-data", content.userData],
      ["meta-data", metaData(content.name)],
    ];
    if (content.network) files.push(["network-config", networkConfig(content.network)]);
    for (const [file, bytes] of files) await writeFile(path.join(src, file), bytes, { mode: 0o600 });
    // FAT needs room for the files plus its own tables; 1 MiB at least.
    const kib = Math.max(1024, Math.ceil((content.userData.byteLength * 1.1) / 1024) + 512);
    await rm(tmp, { force: true });
    await run(["mkfs.vfat", "-n", "CIDATA", "-C", tmp, String(kib)]);
    await run(["mcopy", "-o", "-i", tmp, ...files.map(([file]) => path.join(src, file)), "::"]);
    await rename(tmp, seedPath);
    return true;
  } finally {
    await rm(src, { recursive: true, force: true });
    await rm(tmp, { force: true });
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await stat(file);
    return true;
  } catch {
    return false;
  }
}
