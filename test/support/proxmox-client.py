"""Drives the Proxmox emulator with proxmoxer, unmodified (test/node/provider-proxmox.test.ts).

Run with Debian's python3 and python3-proxmoxer (1.2): token auth, verify_ssl=False (the
emulator's certificate is self-signed, as PVE's is). Lists nodes, asks nextid, clones the
template, polls the task, writes cloud-init, starts, reads the status, stops, deletes, and
reports each answer (and each ResourceException) as one JSON object on stdout.

    python3 proxmox-client.py HOST USER TOKEN_NAME TOKEN_VALUE NODE TEMPLATE_VMID
"""
import json
import sys
import time
from urllib.parse import quote

from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

host, user, token_name, token_value, node, template = sys.argv[1:7]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl python@proxmoxer"

px = ProxmoxAPI(host, user=user, token_name=token_name, token_value=token_value, verify_ssl=False)
out = {}


def failure(e):
    return {"status_code": e.status_code, "content": e.content, "errors": e.errors}


def wait(upid):
    for _ in range(400):
        task = px.nodes(node).tasks(upid).status.get()
        if task["status"] == "stopped":
            return task
        time.sleep(0.05)
    raise RuntimeError("task %s did not stop" % upid)


out["version"] = px.version.get()["version"]
out["nodes"] = [n["node"] for n in px.nodes.get()]
vmid = px.cluster.nextid.get()
out["nextid"] = vmid

upid = px.nodes(node).qemu(template).clone.post(newid=vmid, name="py-vm", full=1)
out["clone_upid"] = upid
out["clone_task"] = wait(upid)

try:
    px.nodes(node).qemu(vmid).config.put(sshkeys=KEY)
except ResourceException as e:
    out["raw_key"] = failure(e)
px.nodes(node).qemu(vmid).config.put(ciuser="debian", sshkeys=quote(KEY, safe=""), ipconfig0="ip=dhcp", tags="python;bc-test")
config = px.nodes(node).qemu(vmid).config.get()
out["config"] = {k: config.get(k) for k in ("name", "ciuser", "sshkeys", "ipconfig0", "tags")}

out["start_task"] = wait(px.nodes(node).qemu(vmid).status.start.post())
out["status_running"] = px.nodes(node).qemu(vmid).status.current.get()["status"]
out["resources"] = [r["vmid"] for r in px.cluster.resources.get(type="vm") if r.get("status") == "running"]

try:
    px.nodes(node).qemu(vmid).delete(purge=1)
except ResourceException as e:
    out["delete_running"] = failure(e)

out["stop_task"] = wait(px.nodes(node).qemu(vmid).status.stop.post())
out["status_stopped"] = px.nodes(node).qemu(vmid).status.current.get()["status"]
out["delete_task"] = wait(px.nodes(node).qemu(vmid).delete(purge=1, **{"destroy-unreferenced-disks": 1}))

try:
    px.nodes(node).qemu(vmid).status.current.get()
except ResourceException as e:
    out["gone"] = failure(e)

print(json.dumps(out))
