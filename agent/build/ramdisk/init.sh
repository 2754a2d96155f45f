#!/bin/sh
# The provisioning ramdisk's init (busybox sh, PID 1). It loads the modules, watches the power
# button, takes a DHCP lease on the first NIC that gets one, reads bc.url, bc.token and
# bc.attestor from the kernel command line and runs bcd with the ramdisk role, started again
# with a backoff whenever it exits. docs/ramdisk.md describes it. The token never reaches the
# console: it goes to a file only root reads, and bcd reads it from there.
#
# With bc.mode=install (the installer ISO, agent/build/installer-iso.ts) it runs `bcd install` with
# the config the ISO's machine image put at /etc/bc-install.json, then reboots into what it wrote.
#
# With bc.mode=os on the command line the same image is the installed system (the OS image a
# deploy writes: agent/build/os-image.ts, docs/os-image.md): its URL, token and host name come
# from the config drive the ramdisk wrote (label config-2, OpenStack's layout), bcd runs as role
# node with its state on that drive, so the node keeps its identity across reboots.
export PATH=/usr/bin:/bin
export HOME=/root
umask 022

mkdir -p /proc /sys /dev /run /tmp /root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
exec </dev/console >/dev/console 2>&1

say() { echo "bc-ramdisk: $*"; }
say "$(cat /etc/bc-ramdisk)"

# Modules, in the depmod order the image builder wrote.
for module in $(cat /etc/bc-modules); do insmod "/lib/modules/$module" 2>/dev/null || say "could not load $module"; done

# Runs a command until it succeeds, every 0.1 s for up to about 5 s (devices appear as their drivers probe).
retry() {
  n=0
  until "$@"; do
    [ $((n += 1)) -lt 50 ] || return 1
    usleep 100000
  done
}

# The power button (QMP system_powerdown, a BMC's GracefulShutdown) is an input device named
# "Power Button" once button and evdev are loaded; nothing acts on it unless someone reads it.
# Its first event (one 24-byte struct input_event) powers the machine off.
for input in /sys/class/input/event*; do
  [ "$(cat "$input/device/name" 2>/dev/null)" = "Power Button" ] || continue
  dev=/dev/input/${input##*/}
  retry test -c "$dev" || continue
  (
    if dd if="$dev" of=/dev/null bs=24 count=1 2>/dev/null; then
      say "power button pressed: powering off"
      sync
      poweroff -f
    fi
    say "cannot watch the power button at $dev"
  ) &
done

# The NICs: every Ethernet interface, in name order; the first one's MAC names the ramdisk.
ip link set lo up
ethernet() {
  NICS=
  for net in /sys/class/net/*; do
    [ "$(cat "$net/type" 2>/dev/null)" = 1 ] && NICS="$NICS ${net##*/}"
  done
  [ -n "$NICS" ]
}
retry ethernet || say "no network interface"
MAC=
for nic in $NICS; do
  MAC=$(cat "/sys/class/net/$nic/address")
  break
done
HOST=ramdisk-$(echo "$MAC" | tr -d ':')
hostname "$HOST"
echo "127.0.0.1 localhost $HOST" >/etc/hosts

# DHCP on each NIC in turn until one has a lease; udhcpc then stays in the background to renew it.
delay=1
until [ -n "$LEASED" ]; do
  for nic in $NICS; do
    ip link set "$nic" up
    if udhcpc -i "$nic" -n -t 4 -T 2 -x hostname:"$HOST" -s /usr/share/udhcpc/default.script -p "/run/udhcpc.$nic.pid"; then
      LEASED=$nic
      break
    fi
  done
  if [ -z "$LEASED" ]; then
    say "no DHCP lease on${NICS:- any NIC}; trying again in ${delay}s"
    sleep "$delay"
    [ "$delay" -lt 30 ] && delay=$((delay * 2))
  fi
done

# bc.url=<control plane URL> bc.token=<single-use join token> bc.attestor=provisioned|join-token.
URL=
TOKEN=
ATTESTOR=provisioned
MODE=ramdisk
set -f # split into words, never globbed
for arg in $(cat /proc/cmdline); do
  case $arg in
    bc.url=*) URL=${arg#bc.url=} ;;
    bc.token=*) TOKEN=${arg#bc.token=} ;;
    bc.attestor=*) ATTESTOR=${arg#bc.attestor=} ;;
    bc.mode=*) MODE=${arg#bc.mode=} ;;
    bc.dd=*) DD=${arg#bc.dd=} ;;
  esac
done
set +f

# bc.dd=<MiB> (npm run bench only): the first disk's raw write speed, for the image write's to be
# compared with, measured by writing that many MiB of zeros over the disk's start before bcd
# starts (it destroys what the disk held); and how fast bcd's Node hashes that many MiB (sha256),
# which an image write must do for every byte.
if [ -n "$DD" ] && [ "$MODE" = ramdisk ]; then
  for block in /sys/block/nvme* /sys/block/vd* /sys/block/sd*; do
    [ -e "$block" ] || continue
    t0=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/zero of="/dev/${block##*/}" bs=1M count="$DD" conv=fsync 2>/dev/null
    t1=$(cut -d' ' -f1 /proc/uptime)
    say "bc.dd: $DD MiB of zeros to /dev/${block##*/} in $(awk "BEGIN { print $t1 - $t0 }") s"
    break
  done
  /usr/lib/bcd/node -e '
    const mib = Number(process.argv[1]), chunk = Buffer.alloc(2 ** 20, 1), hash = require("node:crypto").createHash("sha256");
    const t = performance.now();
    for (let i = 0; i < mib; i++) hash.update(chunk);
    hash.digest();
    console.log(`bc-ramdisk: bc.dd: sha256 of ${mib} MiB in ${((performance.now() - t) / 1000).toFixed(3)} s`);
  ' "$DD"
fi
stay() {
  while :; do
    sleep 3600 &
    wait $!
  done
}
idle() {
  say "$*: bcd is not started"
  stay
}
if [ "$MODE" = install ]; then
  # The installer ISO: the kernel unpacked the machine's own cpio (the ISO's 64 KiB window) over
  # this root, so /etc/bc-install.json says which image to write and the token the installed
  # system joins with. bcd prints its progress and its errors, never the token. A failed install
  # stays here for someone to read the console: rebooting would only boot the CD again.
  CONFIG=/etc/bc-install.json
  [ -s "$CONFIG" ] || idle "no $CONFIG: this ISO holds no machine's install config (its window is empty)"
  /usr/lib/bcd/node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$CONFIG" 2>/dev/null ||
    idle "$CONFIG is not JSON"
  if bcd install --config "$CONFIG"; then
    say "installed: rebooting"
    sync
    reboot -f
  fi
  say "the install failed (above): nothing was rebooted; the machine waits here"
  stay
fi
ROLE=ramdisk
STATE=/run/bcd
if [ "$MODE" = os ]; then
  # The installed system: everything it needs is on the config drive.
  ROLE=node
  drive=
  configdrive() { drive=$(findfs LABEL=config-2 2>/dev/null); [ -n "$drive" ]; }
  retry configdrive || idle "no config drive (a partition labelled config-2)"
  mkdir -p /mnt/config
  mount -t vfat -o umask=077,quiet "$drive" /mnt/config || idle "cannot mount the config drive $drive"
  # meta_data.json's meta holds bc.url and bc.token; read with the Node bcd runs on (no shell JSON).
  eval "$(/usr/lib/bcd/node -e '
    const m = require("/mnt/config/openstack/latest/meta_data.json");
    const q = (s) => "\x27" + String(s ?? "").replaceAll("\x27", "") + "\x27";
    console.log(`URL=${q(m.meta?.["bc.url"])} TOKEN=${q(m.meta?.["bc.token"])} OSHOST=${q(m.hostname)}`);
  ')"
  [ -n "$OSHOST" ] && HOST=$OSHOST && hostname "$HOST" && echo "127.0.0.1 localhost $HOST" >/etc/hosts
  ATTESTOR=provisioned
  STATE=/mnt/config/bcd
fi
[ -n "$URL" ] || idle "no bc.url= on the kernel command line"
[ -n "$TOKEN" ] || idle "no bc.token= on the kernel command line"
case $ATTESTOR in
  provisioned | join-token) ;;
  *) idle "bc.attestor must be provisioned or join-token" ;;
esac
TOKEN_FILE=/run/bcd-join/token
(
  umask 077
  mkdir -p /run/bcd-join
  printf '%s\n' "$TOKEN" >"$TOKEN_FILE"
)
TOKEN=

# bcd joins once (the token is single-use), then runs with the key it keeps in /run/bcd. When it
# exits it is started again: after 1 s if it had run for a minute, else after a doubling backoff
# of up to a minute (a refused join does not hammer the control plane).
delay=1
while :; do
  started=$(date +%s)
  bcd start --role "$ROLE" --url "$URL" --attestor "$ATTESTOR" --token-file "$TOKEN_FILE" --state-dir "$STATE" --hostname "$HOST"
  code=$?
  [ $(($(date +%s) - started)) -gt 60 ] && delay=1
  say "bcd exited with $code; starting it again in ${delay}s"
  sleep "$delay"
  [ "$delay" -lt 60 ] && delay=$((delay * 2))
done
