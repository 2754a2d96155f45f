// The per-machine part of the installer ISO (agent/build/installer-iso.ts, docs/ramdisk.md): the
// ISO is built once with a 64 KiB window of zeros that isolinux loads as a second initrd, and a
// machine's ISO is those bytes with the window replaced by a newc cpio of its files (its install
// config, join token included). Pure and Workers-safe, so the control plane renders an ISO without
// tools: no node: imports.

/** The window's size in the ISO (/bc/machine.img); the build reserves exactly this. */
export const MACHINE_IMAGE_BYTES = 64 * 1024;

/** Where the install config lands in the installer's root (the init reads /etc/bc-install.json). */
export const INSTALL_CONFIG_PATH = "etc/bc-install.json";

/** What `bcd install` reads: what to write onto the machine's first disk, and how the installed system joins. */
export interface InstallConfig {
  /** The control plane's URL the installed system joins. */
  url: string;
  /** The single-use node join token the installed system joins with. */
  token: string;
  hostname: string;
  /** The OS image (raw, gzip or zstd, with an MBR table), on the site's cache; sha256 over its bytes as served. */
  image: { url: string; sha256: string };
}

export interface CpioFile {
  /** Relative to the root ("etc/bc-install.json"); parent directories are added. */
  path: string;
  data: Uint8Array;
  /** Permission bits; default 0o644. */
  mode?: number;
}

const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;
const encoder = new TextEncoder();

/** A "newc" cpio archive (the kernel's initramfs format): the files, their parent directories first, owned by root, then TRAILER!!!. */
export function newcCpio(files: CpioFile[]): Uint8Array {
  const entries: { name: string; mode: number; data: Uint8Array }[] = [];
  const dirs = new Set<string>();
  for (const file of files) {
    const parts = file.path.replace(/^\/+/, "").split("/");
    if (parts.some((p) => p === "" || p === "." || p === ".."))
      throw new Error(`cpio: ${JSON.stringify(file.path)} is not a plain relative path`);
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join("/");
      if (!dirs.has(dir)) entries.push({ name: dir, mode: S_IFDIR | 0o755, data: new Uint8Array() });
      dirs.add(dir);
    }
    entries.push({ name: parts.join("/"), mode: S_IFREG | ((file.mode ?? 0o644) & 0o7777), data: file.data });
  }
  entries.push({ name: "TRAILER!!!", mode: 0, data: new Uint8Array() });

  const chunks: Uint8Array[] = [];
  let size = 0;
  const push = (bytes: Uint8Array) => {
    chunks.push(bytes);
    size += bytes.length;
    const pad = (4 - (size % 4)) % 4;
    if (pad) push(new Uint8Array(pad));
  };
  entries.forEach((e, i) => {
    const name = encoder.encode(`${e.name}\0`);
    const trailer = e.name === "TRAILER!!!";
    // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check
    const fields = [trailer ? 0 : i + 1, e.mode, 0, 0, 1, 0, e.data.length, 0, 0, 0, 0, name.length, 0];
    const header = encoder.encode("070701" + fields.map((n) => n.toString(16).padStart(8, "0")).join(""));
    const head = new Uint8Array(header.length + name.length);
    head.set(header);
    head.set(name, header.length);
    push(head);
    if (e.data.length) push(e.data);
  });
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** The window's bytes: the files' cpio, padded with zeros to exactly MACHINE_IMAGE_BYTES (the kernel skips the zeros). */
export function machineImage(files: CpioFile[]): Uint8Array {
  const cpio = newcCpio(files);
  if (cpio.length > MACHINE_IMAGE_BYTES)
    throw new Error(
      `the machine image's files take ${cpio.length} bytes as a cpio: more than the ISO's ${MACHINE_IMAGE_BYTES}-byte window`,
    );
  const out = new Uint8Array(MACHINE_IMAGE_BYTES);
  out.set(cpio);
  return out;
}

/** The window holding one machine's install config (mode 600: it carries the join token). */
export function installConfigImage(config: InstallConfig): Uint8Array {
  return machineImage([{ path: INSTALL_CONFIG_PATH, data: encoder.encode(JSON.stringify(config)), mode: 0o600 }]);
}
