// Network boot for the site agent: the iPXE script that boots a machine into a kernel and
// initrd (the provisioning ramdisk). Runtime-neutral.
import { AgentError } from "../contracts.ts";

export interface IpxeBoot {
  kernelUrl: string;
  initrdUrl: string;
  /** Kernel command line, e.g. "console=ttyS0 ip=dhcp". */
  cmdline: string;
}

// Whitespace would split a URL into two iPXE arguments.
const HTTP_URL = /^https?:\/\/\S+$/i;
// A newline would start a new iPXE command: a value could inject `chain`, `shell`...
const CONTROL = /[\x00-\x1f\x7f]/;

/** `#!ipxe`, kernel, initrd, boot. Refuses values that could change the script's shape. */
export function ipxeScript({ kernelUrl, initrdUrl, cmdline }: IpxeBoot): string {
  for (const [name, value] of Object.entries({ kernelUrl, initrdUrl, cmdline })) {
    if (typeof value !== "string" || CONTROL.test(value)) throw new AgentError("INVALID_ARGUMENT", `${name} must be one line of text`);
  }
  for (const [name, value] of Object.entries({ kernelUrl, initrdUrl })) {
    if (!HTTP_URL.test(value)) throw new AgentError("INVALID_ARGUMENT", `${name} must be an http(s) URL without spaces`);
  }
  // initrd=<name> lets an EFI-stub kernel find the initrd iPXE loaded under that name.
  const args = ["initrd=initrd", cmdline.trim()].filter(Boolean).join(" ");
  return ["#!ipxe", `kernel ${kernelUrl} ${args}`, `initrd --name initrd ${initrdUrl}`, "boot", ""].join("\n");
}
