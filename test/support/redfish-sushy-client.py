#!/usr/bin/python3
# OpenStack's Redfish client (Debian's python3-sushy, what Ironic drives BMCs with), unmodified,
# driving the Redfish emulator as Ironic would: a session, the system and its processors, memory,
# NICs, storage and simple storage, the managers and chassis, a boot override, virtual media
# inserted and ejected (under the System when the System links it, else under its Manager, as
# Ironic decides), and resets. Run by test/node/redfish-sushy.test.ts:
# `redfish-sushy-client.py <emulator url> <user> <password> <image url> <system id>...`; prints one
# JSON line of what it saw.
import json
import sys

import sushy
from sushy.resources.manager.virtual_media import VirtualMediaCollection

url, user, password, image = sys.argv[1:5]
system_ids = sys.argv[5:]
# The default authentication: a session (X-Auth-Token), Basic only if that fails.
root = sushy.Sushy(url + "/redfish/v1", username=user, password=password)
seen = {"systems": {}}


def virtual_media_of(system, manager):
    """The System's VirtualMedia when it links one (newer sushy: system.virtual_media), else the Manager's."""
    path = system.json.get("VirtualMedia", {}).get("@odata.id")
    if path:
        return "System", VirtualMediaCollection(system._conn, path, redfish_version=system.redfish_version, registries=system.registries)
    return "Manager", manager.virtual_media


for system_id in system_ids:
    system = root.get_system("/redfish/v1/Systems/" + system_id)
    out = {
        "uuid": system.uuid,
        "power_state": str(system.power_state.value),
        "manufacturer": system.manufacturer,
        "bios_version": system.bios_version,
        "memory_gib": system.memory_summary.size_gib,
    }
    out["processors"] = {
        "count": system.processors.summary.count,
        "models": sorted({p.model for p in system.processors.get_members()}),
        "cores": sum(p.total_cores for p in system.processors.get_members()),
    }
    memory = system._conn.get(system.json["Memory"]["@odata.id"]).json()
    out["dimms_mib"] = [system._conn.get(m["@odata.id"]).json()["CapacityMiB"] for m in memory["Members"]]
    out["nics"] = {mac: str(state.value) for mac, state in system.ethernet_interfaces.summary.items()}
    out["storage_drive_bytes"] = sorted(system.storage.drives_sizes_bytes)
    out["storage_drive_protocols"] = sorted({str(d.protocol.value) for s in system.storage.get_members() for d in s.drives})
    out["simple_storage_disk_bytes"] = sorted(system.simple_storage.disks_sizes_bytes)
    out["managers"] = [m.identity for m in system.managers]
    out["chassis"] = [{"id": c.identity, "type": str(c.chassis_type.value), "power": str(c.power_state.value)} for c in system.chassis]

    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.refresh()
    out["boot"] = {"target": str(system.boot.target.value), "enabled": str(system.boot.enabled.value)}

    manager = system.managers[0]
    where, media = virtual_media_of(system, manager)
    cd = next(m for m in media.get_members() if sushy.VIRTUAL_MEDIA_CD in m.media_types)
    cd.insert_media(image, inserted=True, write_protected=True)
    cd.refresh()
    inserted = {"where": where, "path": cd.path, "image": cd.image, "inserted": cd.inserted}
    cd.eject_media()
    cd.refresh()
    out["media"] = {**inserted, "after_eject": cd.inserted}

    system.reset_system(sushy.RESET_ON)
    system.refresh()
    out["after_on"] = str(system.power_state.value)
    system.reset_system(sushy.RESET_FORCE_OFF)
    system.refresh()
    out["after_force_off"] = str(system.power_state.value)
    # Once is spent by the boot it applied to: after On, the override is off again.
    out["boot_after_on"] = str(system.boot.enabled.value)
    seen["systems"][system_id] = out

seen["all_managers"] = sorted(m.identity for m in root.get_manager_collection().get_members())
seen["all_chassis"] = sorted(c.identity for c in root.get_chassis_collection().get_members())
seen["session_service_enabled"] = root.get_session_service().service_enabled
print(json.dumps(seen))
