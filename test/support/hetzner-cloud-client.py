#!/usr/bin/python3
# The official Hetzner Cloud Python client (Debian's python3-hcloud), unmodified, driving the
# emulator as a user would: catalogue, an SSH key, a server with labels and user data, its actions
# waited for, power off and on, a label-selector list, delete. Run by
# test/node/provider-hetzner-cloud.test.ts: `hetzner-cloud-client.py <api url> <token>`; prints
# one JSON line of what it saw.
import json
import sys

from hcloud import APIException, Client
from hcloud.images.domain import Image
from hcloud.locations.domain import Location
from hcloud.server_types.domain import ServerType

url, token = sys.argv[1], sys.argv[2]
client = Client(token=token, api_endpoint=url, poll_interval=0.05)
seen = {}

seen["server_types"] = sorted(t.name for t in client.server_types.get_all())
seen["locations"] = sorted(l.name for l in client.locations.get_all())
seen["images"] = sorted({i.name for i in client.images.get_all(type=["system"])})

key = client.ssh_keys.create(
    name="python-client",
    public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl python@client",
)
seen["key_fingerprint"] = client.ssh_keys.get_by_fingerprint(key.fingerprint).name

created = client.servers.create(
    name="py-server-1",
    server_type=ServerType(name="cx22"),
    image=Image(name="ubuntu-24.04"),
    location=Location(name="nbg1"),
    ssh_keys=[key],
    labels={"bc.dev/instance": "python-1", "role": "web"},
    user_data="#cloud-config\nruncmd:\n  - echo python\n",
)
seen["root_password"] = created.root_password
created.action.wait_until_finished()
for action in created.next_actions:
    action.wait_until_finished()

server = client.servers.get_by_id(created.server.id)
seen["created"] = {
    "id": server.id,
    "status": server.status,
    "ipv4": server.public_net.ipv4.ip,
    "primary_ipv4": server.public_net.primary_ipv4.id,
    "datacenter": server.datacenter.location.name,
    "server_type": server.server_type.name,
    "image": server.image.name,
}

server.power_off().wait_until_finished()
seen["after_power_off"] = client.servers.get_by_id(server.id).status
server.power_on().wait_until_finished()
seen["after_power_on"] = client.servers.get_by_id(server.id).status

seen["selected"] = [s.name for s in client.servers.get_all(label_selector="role in (web,db),bc.dev/instance")]
seen["not_selected"] = [s.name for s in client.servers.get_all(label_selector="!role")]

client.servers.delete(server).wait_until_finished()
try:
    client.servers.get_by_id(server.id)
    seen["after_delete"] = "still there"
except APIException as e:
    seen["after_delete"] = e.code

client.ssh_keys.delete(key)
seen["keys_left"] = len(client.ssh_keys.get_all())
print(json.dumps(seen))
