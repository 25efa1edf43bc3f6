#!/usr/bin/env bash
# Pull benchmark: a ~200 MB Debian rootfs image (one gzip layer) in a local
# docker-registry, fetched and unpacked by `kubeslot-activator unpack`, and by
# the reference pair `skopeo copy docker://… oci:…` + `umoci unpack`, from one
# run each. Prints wall times, the ratio, and the activator's peak RSS
# (`/usr/bin/time -v`). No timed assertions: this prints numbers for people.
#
#   ci/bench/fetch.sh [PKG,PKG...]      (default: systemd,dbus,iproute2)
#   ci/bench/fetch.sh --rootfs TAR      (TAR in place of the Debian rootfs;
#                                        ci/bench/smoke.sh passes a small one)
#
# KUBESLOT_BIN_DIR=DIR takes kubeslot-activator from DIR instead of
# building the release binary.
set -euo pipefail
cd "$(dirname "$0")/../.."

need() { command -v "$1" >/dev/null || { echo "fetch.sh: $1 is missing: apt-get install -y $2" >&2; exit 1; }; }
need docker-registry docker-registry
need skopeo skopeo
need umoci umoci
need python3 python3
[ -x /usr/bin/time ] || { echo "fetch.sh: /usr/bin/time is missing: apt-get install -y time" >&2; exit 1; }

if [ "${1:-}" = --rootfs ]; then
  rootfs=${2:?fetch.sh: --rootfs needs a tar}
else
  rootfs=$(ci/lib/debian-rootfs.sh "${1:-systemd,dbus,iproute2}")
fi
if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$KUBESLOT_BIN_DIR/kubeslot-activator
else
  cargo build --release -q --locked -p kubeslot-activator
  bin=target/release/kubeslot-activator
fi
[ -x "$bin" ] || { echo "fetch.sh: $bin is missing (cargo build -p kubeslot-activator)" >&2; exit 1; }

work=$(mktemp -d)
reg_pid=
cleanup() { [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/storage}}
http: {addr: 127.0.0.1:$port}
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
reg_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

image=127.0.0.1:$port/bench/node:v1
# Device nodes are never created from an image (mmdebstrap puts a few in
# /dev): drop them, then let skopeo's tarball transport make a one-layer gzip
# image of the rootfs tar.
cp "$rootfs" "$work/rootfs.tar"
# (tar --delete fails when nothing matches: a --rootfs tar may have no /dev)
if tar -tf "$work/rootfs.tar" | grep '^\./dev/.' >/dev/null; then tar -f "$work/rootfs.tar" --delete --wildcards './dev/?*'; fi
skopeo copy -q --dest-tls-verify=false "tarball:$work/rootfs.tar" "docker://$image"
echo '{"trust":{"allow_unsigned":true}}' >"$work/config.json"

elapsed() { local s=$1 e=$2; python3 -c "print(f'{($e-$s)/1e9:.2f}')"; }

sync; t0=$(date +%s%N)
/usr/bin/time -v "$bin" unpack --config "$work/config.json" "$image" "$work/ours" \
  >"$work/ours.out" 2>"$work/ours.time" || { cat "$work/ours.time" >&2; exit 1; }
t1=$(date +%s%N)
sync; t2=$(date +%s%N)
skopeo copy -q --src-tls-verify=false "docker://$image" "oci:$work/layout:v1"
umoci unpack --image "$work/layout:v1" "$work/umoci" >/dev/null 2>&1
t3=$(date +%s%N)

ours=$(elapsed "$t0" "$t1")
ref=$(elapsed "$t2" "$t3")
rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/ours.time")
size=$(stat -c %s "$rootfs")
echo "image: $(basename "$rootfs") ($((size / 1024 / 1024)) MiB uncompressed, one gzip layer)"
echo "kubeslot-activator unpack (fetch + verify + unpack): ${ours}s, peak RSS $((rss / 1024)) MiB"
echo "skopeo copy + umoci unpack:                         ${ref}s"
python3 -c "print(f'ratio activator / (skopeo+umoci): {$ours/$ref:.2f}')"
