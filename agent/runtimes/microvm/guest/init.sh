#!/bin/sh
# The bc-guest init (busybox sh, PID 1). It reads the NoCloud seed (the vfat drive labelled
# CIDATA), names the guest, configures eth0 by MAC, creates SSH host keys, prints ONE report line
# `bc-report <json>` on the console (the host's only channel), runs the user data when it is a
# `#!` script, then idles until asked to stop. docs/guest-image.md describes it.
export PATH=/bin:/usr/bin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu
umask 022

say() { echo "bc-guest: $*" >/dev/console; }

# Stopping: busybox `poweroff` (no -f) signals PID 1 with USR2, `halt` with USR1; the ACPI power
# button (QMP system_powerdown) runs `poweroff` through acpid; firecracker's SendCtrlAltDel and
# a host SIGTERM arrive as TERM/INT and reboot, which exits the VMM (reboot=k, -no-reboot).
stop_now() {
  sync
  umount /mnt/root 2>/dev/null
  "$@"
}
trap 'stop_now poweroff -f' USR1 USR2
trap 'stop_now reboot -f' TERM INT

mkdir -p /proc /sys /dev /run /tmp /mnt/seed /mnt/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

# Modules, in the depmod order the image builder wrote.
while read -r module; do
  insmod "/lib/modules/$module" 2>/dev/null || say "could not load $module"
done </etc/bc-modules

# Waits up to about 5 s for a condition (devices appear as their drivers probe).
wait_for() {
  tries=50
  while ! "$@"; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || return 1
    usleep 100000
  done
}

find_seed() { SEED_DEV=$(findfs LABEL=CIDATA 2>/dev/null || findfs LABEL=cidata 2>/dev/null); [ -n "$SEED_DEV" ]; }
wait_for find_seed || say "no seed drive labelled CIDATA"
if [ -n "$SEED_DEV" ]; then
  mount -t vfat -o ro "$SEED_DEV" /mnt/seed || say "could not mount the seed $SEED_DEV"
fi

# `key: value` of meta-data, without quotes.
meta() { [ -f /mnt/seed/meta-data ] && sed -n "s/^$1:[[:space:]]*//p" /mnt/seed/meta-data | head -n 1 | tr -d "\"'\r"; }
INSTANCE_ID=$(meta instance-id)
HOSTNAME=$(meta local-hostname)
[ -n "$HOSTNAME" ] || HOSTNAME=$INSTANCE_ID
if [ -n "$HOSTNAME" ]; then
  hostname "$HOSTNAME"
  echo "$HOSTNAME" >/etc/hostname
  echo "127.0.1.1 $HOSTNAME" >>/etc/hosts
fi

# network-config in the layout the runtime writes (version 2, one ethernet matched by MAC).
MAC=
ADDRESS=
GATEWAY=
NAMESERVERS=
if [ -f /mnt/seed/network-config ]; then
  while IFS='=' read -r key value; do
    case $key in
      MAC) MAC=$value ;;
      ADDRESS) ADDRESS=${value%%,*} ;;
      GATEWAY) GATEWAY=$value ;;
      DNS) NAMESERVERS=$(echo "$value" | tr ',' ' ') ;;
    esac
  done <<EOF
$(awk '
  /^[[:space:]]*macaddress:/ { v = $2; gsub(/"/, "", v); print "MAC=" tolower(v) }
  /^[[:space:]]*gateway4:/ { v = $2; gsub(/"/, "", v); print "GATEWAY=" v }
  /^[[:space:]]*nameservers:/ { ns = 1; next }
  /^[[:space:]]*addresses:/ { v = $0; sub(/^[^[]*\[/, "", v); sub(/\].*$/, "", v); gsub(/[ "]/, "", v); print (ns ? "DNS=" : "ADDRESS=") v }
' /mnt/seed/network-config)
EOF
fi
ip link set lo up
IFACE=
find_iface() {
  for dev in /sys/class/net/*; do
    [ "$(cat "$dev/address" 2>/dev/null)" = "$MAC" ] && IFACE=${dev##*/} && return 0
  done
  return 1
}
if [ -n "$MAC" ]; then
  if wait_for find_iface; then
    ip link set "$IFACE" up
    [ -n "$ADDRESS" ] && ip addr add "$ADDRESS" dev "$IFACE"
    [ -n "$GATEWAY" ] && ip route add default via "$GATEWAY"
  else
    say "no interface with MAC $MAC"
    ADDRESS=
  fi
fi

# The resolver names the configured nameservers, else the gateway (FC-RESOLVER-GATEWAY).
write_resolver() {
  : >/etc/resolv.conf
  for ns in ${NAMESERVERS:-$GATEWAY}; do echo "nameserver $ns" >>/etc/resolv.conf; done
}
write_resolver

# The root disk: its size as the guest sees it, and mounted read-write at /mnt/root.
DISK_BYTES=
KEY_DIR=/etc/dropbear
if wait_for test -e /sys/block/vda/size; then
  DISK_BYTES=$(($(cat /sys/block/vda/size) * 512))
  if mount -t ext4 /dev/vda /mnt/root 2>/dev/null; then KEY_DIR=/mnt/root/etc/dropbear; else say "could not mount the root disk"; fi
fi

# SSH host keys: created on the first boot of this disk and kept on it, so a reboot keeps them;
# the image carries none, so no two guests share one. Reported without their comment.
mkdir -p "$KEY_DIR"
HOST_KEYS=
for type in ed25519 ecdsa; do
  key=$KEY_DIR/dropbear_${type}_host_key
  [ -s "$key" ] || dropbearkey -t "$type" -f "$key" >/dev/null 2>&1 || { say "could not create the $type host key"; continue; }
  line=$(dropbearkey -y -f "$key" 2>/dev/null | awk '/^(ssh|ecdsa)-/ { print $1 " " $2; exit }')
  [ -n "$line" ] && HOST_KEYS="$HOST_KEYS${HOST_KEYS:+,}\"$line\""
done

USER_DATA=/mnt/seed/user-data
USER_DATA_SHA256=
[ -f "$USER_DATA" ] && USER_DATA_SHA256=$(sha256sum "$USER_DATA" | cut -d ' ' -f 1)

# A JSON string: quotes and backslashes escaped, control characters dropped.
json() { printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
REPORT="{\"instanceId\":$(json "$INSTANCE_ID"),\"hostname\":$(json "$HOSTNAME"),\"userDataSha256\":$(json "$USER_DATA_SHA256"),\"hostKeys\":[$HOST_KEYS]"
[ -n "$ADDRESS" ] && REPORT="$REPORT,\"address\":$(json "$ADDRESS"),\"mac\":$(json "$MAC")"
[ -n "$DISK_BYTES" ] && REPORT="$REPORT,\"diskBytes\":$DISK_BYTES"
echo "bc-report $REPORT}"

# The ACPI power button (QMP system_powerdown) runs /etc/acpi/PWRF/00000080: poweroff.
acpid -c /etc/acpi -l /dev/null -p /run/acpid.pid || say "acpid did not start"

# The user data runs only when it is a script; anything else (cloud-config) is only hashed.
if [ "$(head -c 2 "$USER_DATA" 2>/dev/null)" = "#!" ]; then
  cp "$USER_DATA" /run/user-data
  chmod 700 /run/user-data
  sh /run/user-data </dev/null &
  wait $!
  write_resolver
fi

# Idle; `wait` returns on a signal, so the traps above run at once.
while :; do
  sleep 3600 &
  wait $!
done
