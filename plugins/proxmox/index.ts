// better-compute/proxmox: Proxmox VE as a VPS provider (docs/providers/proxmox.md). Runtime-neutral;
// the Node-only fetch that honours an account's certificate pin is better-compute/proxmox/pinned-fetch.
export { classifyPve, DEFAULT_FLAVORS, proxmoxAccount, proxmoxProvider, type ProxmoxAccount } from "./provider.ts";
