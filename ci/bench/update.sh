#!/usr/bin/env bash
# Update benchmark (issue 20): a v1 -> v2 update that changes only the
# Kubernetes layer, overlay slots against copy slots, in the same run.
#
# Images: a Debian rootfs (ci/lib/debian-rootfs.sh, /dev dropped) as the
# base layer and a "Kubernetes" layer (a kubelet-sized file of noise plus a
# version file), v2 with another noise seed: two gzip OCI layouts sharing the
# base blob. Per mode, the real `kubeslot-activator activate` (with
# "slots": {"mode": MODE}) runs v1 into kube1, then v2 into kube2, against a
# temporary --root on this disk, with fake `systemctl`/`machinectl` first on
# PATH (the systemd boundary: the fake mounts a slot's mount unit for real
# and serves /healthz for a started machine). Preflight is ignored (a temp
# root is no host).
#
# Measured for the v2 run, per mode:
#   * bytes written: the kernel's per-process I/O accounting of the activator
#     (getrusage ru_oublock x 512, i.e. /proc/<pid>/io write_bytes, read with
#     wait4), and the same less the blob bytes the content store received
#     (report.json downloads.bytes_fetched): what staging the slot wrote;
#   * time from "verified" to "ready to start": report.json's `stage` phase
#     plus `render` (resolve and verify end before it; the machine is
#     started after it);
#   * bytes read during staging: report.json's `stage` phase `read_bytes`
#     (the activator's /proc/self/io rchar: every read(2), page cache
#     included), against the blobs it unpacked (compressed) and the
#     uncompressed bytes of the layers: staging reads each blob once and,
#     since the unpacker hashes files as it writes them (issue 30), no
#     unpacked file again to record it;
#   * disk used by both slots (du -s, hard links counted once): overlay the
#     layer store plus both uppers, copy both trees.
# Prints the ratios against the targets: bytes written <= 1.05 x the changed
# layer's uncompressed size; both slots' disk <= 1.1 x (one image + the
# changed layer). No timed assertion: numbers for people.
#
#   ci/bench/update.sh [--rootfs TAR] [KUBE_MB]
#
# KUBE_MB: the Kubernetes layer's noise (default 96). --rootfs TAR: TAR in
# place of the Debian rootfs as the base layer. Smoke size
# (ci/bench/smoke.sh): a small TAR and KUBE_MB 1. KUBESLOT_BIN_DIR=DIR takes
# kubeslot-activator and examples/make_layout from DIR (target/debug after
# the tests) instead of building them (release).
#
# Needs root (mount), python3, gzip, tar; run under flock /tmp/kubeslot-e2e.lock
# (it binds a free port and mounts overlays). Work files go to
# $BENCH_DIR (default: a temp dir under /var/tmp, a real disk: tmpfs has no
# block I/O accounting).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

rootfs=''
if [ "${1:-}" = --rootfs ]; then rootfs=${2:?update bench: --rootfs needs a tar}; shift 2; fi
kube_mb=${1:-96}
[[ $kube_mb =~ ^[1-9][0-9]*$ ]] || { echo "update bench: KUBE_MB $kube_mb is not a whole number of MB" >&2; exit 2; }
for t in python3:python3 gzip:gzip tar:tar mount:mount umount:mount du:coreutils mountpoint:util-linux; do
  command -v "${t%%:*}" >/dev/null || { echo "update bench: ${t%%:*} missing: apt-get install -y ${t#*:}" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "update bench: needs root (overlay mounts)" >&2; exit 1; }

[ -n "$rootfs" ] || rootfs=$(ci/lib/debian-rootfs.sh systemd,dbus,iproute2)
work=${BENCH_DIR:-$(mktemp -d /var/tmp/kubeslot-update-bench.XXXXXX)}
mkdir -p "$work"
srv_pid=
cleanup() {
  [ -z "$srv_pid" ] || kill "$srv_pid" 2>/dev/null || true
  for m in "$work"/*/root/var/lib/machines/kube*; do
    if [ -d "$m" ]; then umount "$m" 2>/dev/null || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin_dir=$(cd "$KUBESLOT_BIN_DIR" && pwd)
else
  echo "building (release)..." >&2
  cargo build --release --quiet --locked -p kubeslot-activator --bin kubeslot-activator
  cargo build --release --quiet --locked -p kubeslot-image --example make_layout
  bin_dir=$repo/target/release
fi
activator=$bin_dir/kubeslot-activator make_layout=$bin_dir/examples/make_layout
for b in "$activator" "$make_layout"; do
  [ -x "$b" ] || { echo "update bench: $b is missing (cargo test --workspace --no-run builds it)" >&2; exit 1; }
done

# ---------------------------------------------------------------- images
cp "$rootfs" "$work/base.tar"
if tar -tf "$work/base.tar" | grep '^\./dev/.' >/dev/null; then tar -f "$work/base.tar" --delete --wildcards './dev/?*'; fi
kube_tar() { # kube_tar OUT SEED VERSION
  local d=$work/kube-src-$2
  mkdir -p "$d/usr/bin" "$d/etc"
  python3 - "$d/usr/bin/kubelet" "$2" "$kube_mb" <<'EOF'
import random, sys
path, seed, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
with open(path, "wb") as f:
    for _ in range(mb):
        f.write(r.randbytes(1 << 20))
EOF
  chmod 0755 "$d/usr/bin/kubelet"
  echo healthy >"$d/etc/fixture-health"
  echo "$3" >"$d/etc/kubernetes-version"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@1700000000 \
    -C "$d" -cf "$1" ./usr/bin/kubelet ./etc/fixture-health ./etc/kubernetes-version
  rm -rf "$d"
}
kube_tar "$work/kube1.tar" 1 v1.35.0
kube_tar "$work/kube2.tar" 2 v1.35.1
"$make_layout" "$work/v1" v1 gzip "$work/base.tar" "$work/kube1.tar" >/dev/null
"$make_layout" "$work/v2" v2 gzip "$work/base.tar" "$work/kube2.tar" >/dev/null
changed=$(stat -c %s "$work/kube2.tar")

# ---------------------------------------------------------------- fakes
fake=$work/fake
mkdir -p "$fake/bin" "$fake/units"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$fake/bin/systemctl" <<'EOF'
#!/bin/bash
# fake systemctl: mount units mounted for real, machines recorded as active
F=$BENCH_FAKE
cmd=$1; shift
[ "${1:-}" = --quiet ] && shift
unit=${1:-}
field() { sed -n "s/^$1=//p" "$BENCH_ROOT/etc/systemd/system/$unit"; }
case "$cmd" in
  daemon-reload) ;;
  is-active) [ "$(cat "$F/units/$unit" 2>/dev/null)" = active ] ;;
  start)
    case $unit in
      *.mount) mountpoint -q "$(field Where)" || mount -t overlay overlay -o "$(field Options)" "$(field Where)" ;;
    esac
    echo active >"$F/units/$unit" ;;
  stop)
    case $unit in
      *.mount) ! mountpoint -q "$(field Where)" || umount "$(field Where)" ;;
    esac
    echo inactive >"$F/units/$unit" ;;
  enable|disable) ;;
  *) echo "fake systemctl: unexpected $cmd" >&2; exit 1 ;;
esac
EOF
cat >"$fake/bin/machinectl" <<'EOF'
#!/bin/bash
[ "$1" = show ] && [ "$(cat "$BENCH_FAKE/units/systemd-nspawn@${!#}.service" 2>/dev/null)" = active ]
EOF
chmod +x "$fake/bin/"*
python3 -c '
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$port" &
srv_pid=$!

# run MODE TAG: activate TAG in MODE's root; prints "<write bytes> <stage+render ms>"
run() {
  local mode=$1 tag=$2 root=$work/$1/root
  mkdir -p "$root/etc/kubeslot"
  python3 - "$root/etc/kubeslot/activator.json" "$work/$tag" "$tag" "$mode" "$port" <<'EOF'
import json, sys
path, layout, tag, mode, port = sys.argv[1:]
json.dump({
    "image": f"oci:{layout}:{tag}",
    "trust": {"allow_unsigned": True},
    "kubelet": {"api_server": "https://10.0.0.1:6443", "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "bootstrap_token": "abcdef.0123456789abcdef", "node_name": "bench"},
    "gpu": "off", "nameservers": ["192.0.2.53"],
    "health": {"timeout_secs": 20, "successes": 1, "interval_ms": 50,
               "kubelet_healthz_url": f"http://127.0.0.1:{port}/healthz"},
    "preflight": {"ignore": ["all"]},
    "slots": {"mode": mode},
}, open(path, "w"))
EOF
  fs_sync "$root"
  BENCH_FAKE=$fake BENCH_ROOT=$root PATH=$fake/bin:$PATH python3 - "$activator" "$root" "$work/$mode-$tag.log" <<'EOF'
import os, subprocess, sys
activator, root, log = sys.argv[1:]
with open(log, "w") as out:
    p = subprocess.Popen([activator, "activate", "--root", root, "--json"], stdout=out, stderr=out)
    _, status, ru = os.wait4(p.pid, 0)
if os.waitstatus_to_exitcode(status) != 0:
    sys.exit(f"activate failed ({log}):\n" + open(log).read()[-4000:])
print(ru.ru_oublock * 512)
EOF
}
fs_sync() { sync -f "$1" 2>/dev/null || sync; }

# phase_ms REPORT NAME: duration of a phase in report.json
phase_ms() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
from datetime import datetime
r = json.load(open(sys.argv[1]))
p = next(p for p in r["phases"] if p["name"] == sys.argv[2])
t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))
print(int((t(p["finished"]) - t(p["started"])).total_seconds() * 1000))
EOF
}
report_field() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"r": r}))' "$1" "$2"; }

declare -A written staged_bytes ms disk staged_read
for mode in overlay copy; do
  root=$work/$mode/root
  rm -rf "$fake/units" && mkdir "$fake/units" # each mode is its own host
  run "$mode" v1 >/dev/null
  written[$mode]=$(run "$mode" v2)
  report=$root/var/lib/kubeslot/report.json
  [ "$(report_field "$report" 'r["slot"]')" = kube2 ] || { echo "$mode: v2 did not go to kube2" >&2; exit 1; }
  fetched=$(report_field "$report" 'r["downloads"]["bytes_fetched"]')
  staged_bytes[$mode]=$((written[$mode] - fetched))
  ms[$mode]=$(( $(phase_ms "$report" stage) + $(phase_ms "$report" render) ))
  staged_read[$mode]=$(report_field "$report" 'next(p for p in r["phases"] if p["name"] == "stage").get("read_bytes", 0)')
  if [ "$mode" = overlay ]; then
    disk[$mode]=$(du -s -B1 "$root/var/lib/kubeslot/layers" "$root/var/lib/kubeslot/slots/kube1/upper" "$root/var/lib/kubeslot/slots/kube2/upper" | awk '{s+=$1} END {print s}')
  else
    disk[$mode]=$(du -s -B1 "$root/var/lib/machines/kube1" "$root/var/lib/machines/kube2" | awk '{s+=$1} END {print s}')
  fi
done
one_image=$(du -s -B1 "$work/copy/root/var/lib/machines/kube1" | cut -f1)
changed_disk=$(du -s -B1 "$work/overlay/root/var/lib/kubeslot/layers/$(sha256sum "$work/kube2.tar" | cut -c1-64)" | cut -f1)

mib() { python3 -c "print(f'{$1/1048576:.1f} MiB')"; }
ratio() { python3 -c "print(f'{$1/$2:.3f}' if $2 else 'n/a')"; }
echo "base layer: $(mib "$(stat -c %s "$work/base.tar")") uncompressed; changed (Kubernetes) layer: $(mib "$changed") uncompressed"
printf '%-8s %16s %22s %18s %16s %16s\n' mode "bytes written" "written less blobs" "verified->ready" "both slots' disk" "staging read"
for mode in overlay copy; do
  printf '%-8s %16s %22s %15s ms %16s %16s\n' "$mode" "$(mib "${written[$mode]}")" "$(mib "${staged_bytes[$mode]}")" "${ms[$mode]}" "$(mib "${disk[$mode]}")" "$(mib "${staged_read[$mode]}")"
done
# What staging unpacked, per mode: overlay the changed layer (the base is
# in the layer store), copy both layers; reading their blobs is part of it.
echo "overlay: staging read / changed layer uncompressed: $(ratio "${staged_read[overlay]}" "$changed") (a second read of the files would add 1.0)"
echo "copy:    staging read / both layers uncompressed: $(ratio "${staged_read[copy]}" "$(( changed + $(stat -c %s "$work/base.tar") ))") (a second read of the files would add 1.0)"
echo "overlay: staging bytes written / changed layer: $(ratio "${staged_bytes[overlay]}" "$changed") (target <= 1.05)"
echo "overlay: all bytes written (blob included) / changed layer: $(ratio "${written[overlay]}" "$changed")"
echo "overlay: both slots' disk / (one image + changed layer): $(ratio "${disk[overlay]}" "$((one_image + changed_disk))") (target <= 1.1)"
echo "copy:    staging bytes written / changed layer: $(ratio "${staged_bytes[copy]}" "$changed")"
echo "copy:    both slots' disk / (one image + changed layer): $(ratio "${disk[copy]}" "$((one_image + changed_disk))")"
echo "overlay / copy: bytes written $(ratio "${written[overlay]}" "${written[copy]}"), verified->ready $(ratio "${ms[overlay]}" "${ms[copy]}"), disk $(ratio "${disk[overlay]}" "${disk[copy]}")"
