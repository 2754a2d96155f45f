// Network boot for the site agent: the iPXE scripts it serves each machine: boot a kernel with
// its initrds (the provisioning ramdisk), or leave network boot for the next boot device (the
// machine's disk). Runtime-neutral.
import { AgentError } from "../contracts.ts";

export interface IpxeBoot {
  kernelUrl: string;
  /** One initrd, or several (the kernel unpacks them in order). */
  initrdUrl: string | string[];
  /** Kernel command line, e.g. "console=ttyS0 ip=dhcp". */
  cmdline: string;
}

// Whitespace would split a URL into two iPXE arguments.
const HTTP_URL = /^https?:\/\/\S+$/i;
// A newline would start a new iPXE command: a value could inject `chain`, `shell`...
const CONTROL = /[\x00-\x1f\x7f]/;

/** `#!ipxe`, kernel, initrd(s), boot. Refuses values that could change the script's shape. */
export function ipxeScript({ kernelUrl, initrdUrl, cmdline }: IpxeBoot): string {
  const initrds = typeof initrdUrl === "string" ? [initrdUrl] : initrdUrl;
  if (initrds.length === 0) throw new AgentError("INVALID_ARGUMENT", "initrdUrl names no initrd");
  for (const [name, value] of [["kernelUrl", kernelUrl], ["cmdline", cmdline], ...initrds.map((u) => ["initrdUrl", u])] as const) {
    if (typeof value !== "string" || CONTROL.test(value)) throw new AgentError("INVALID_ARGUMENT", `${name} must be one line of text`);
  }
  for (const [name, value] of [["kernelUrl", kernelUrl], ...initrds.map((u) => ["initrdUrl", u])] as const) {
    if (!HTTP_URL.test(value)) throw new AgentError("INVALID_ARGUMENT", `${name} must be an http(s) URL without spaces`);
  }
  // initrd=<name> lets an EFI-stub kernel find the initrds iPXE loaded under those names (UEFI
  // iPXE needs it: without it the kernel finds no root file system).
  const names = initrds.map((_, i) => (initrds.length === 1 ? "initrd" : `initrd${i}`));
  const args = [...names.map((n) => `initrd=${n}`), cmdline.trim()].filter(Boolean).join(" ");
  // A fetch that fails (the site agent restarting) is tried again every 5 s, not left to the
  // firmware's next boot device: the workflow waiting for the machine decides when to give up.
  return [
    "#!ipxe",
    ":load",
    `kernel ${kernelUrl} ${args} || goto retry`,
    ...initrds.map((url, i) => `initrd --name ${names[i]} ${url} || goto retry`),
    "boot || goto retry",
    ":retry",
    "imgfree",
    "echo the ramdisk did not load, trying again in 5 s",
    "sleep 5",
    "goto load",
    "",
  ].join("\n");
}

/**
 * Leaves network boot: the firmware goes on to the next boot device (the disk). `exit` must be the
 * top-level script's: one chained from another returns to its parent (PXE.md).
 */
export const IPXE_EXIT = "#!ipxe\nexit\n";
