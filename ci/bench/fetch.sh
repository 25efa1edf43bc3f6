#!/usr/bin/env bash
# Pull benchmark: a ~200 MB Debian rootfs image (one gzip layer) in a local
# docker-registry, fetched and unpacked by `kubeslot-activator unpack`, and by
# the reference pair `skopeo copy docker://… oci:…` + `umoci unpack`, from one
# run each. Prints wall times, the ratio, and the activator's peak RSS
# (`/usr/bin/time -v`). No timed assertions: this prints numbers for people.
#
# Then the same image through a rate-limited link: nginx (`limit_rate`,
# per connection) in front of the registry, at the rate that makes
# downloading the layer take as long as the activator's unpacking of it
# (measured first: `unpack` with the blob already in its store). Prints
# download alone (curl of the layer through nginx), unpack alone, ours
# (fetch + verify + unpack through nginx into a fresh store: the layer is
# unpacked while it downloads), skopeo copy + umoci unpack through nginx,
# and ours / max(download, unpack) (issue 43's goal: at most 1.15).
# KUBESLOT_BENCH_RATE=BYTES_PER_S sets the rate instead.
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
need nginx nginx-light
need curl curl
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
reg_pid='' nginx_pid=''
cleanup() {
  [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "fetch.sh: nothing listens on 127.0.0.1:$1" >&2
  return 1
}
port=$(free_port)
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

# --- through a rate-limited link -------------------------------------------
# unpack alone: the layer already in the content store (reused after its
# hash is checked again), nothing downloaded
"$bin" unpack --config "$work/config.json" --root "$work/warm" "$image" "$work/warm-fill" >/dev/null
sync; t0=$(date +%s%N)
"$bin" unpack --config "$work/config.json" --root "$work/warm" "$image" "$work/warm-tree" >/dev/null
t1=$(date +%s%N)
unpack_alone=$(elapsed "$t0" "$t1")
layer=$(curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
  "http://127.0.0.1:$port/v2/bench/node/manifests/v1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["layers"][0]["digest"])')
layer_size=$(stat -c %s "$work/warm/var/lib/kubeslot/blobs/sha256/${layer#sha256:}")
# (nginx lets a response run a second ahead of its rate: `limit_rate` x
# (whole seconds since the request + 1); hence the + 1)
rate=${KUBESLOT_BENCH_RATE:-$(python3 -c "print(max(65536, int($layer_size / ($unpack_alone + 1))))")}

nport=$(free_port)
mkdir -p "$work/nginx"
# (nginx variables, not the shell's)
# shellcheck disable=SC2016
host_header='proxy_set_header Host $http_host;'
cat >"$work/nginx.conf" <<EOF
daemon off;
# (as root, workers would switch to an account that cannot enter WORK)
user $(id -un) $(id -gn);
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$nport;
    client_max_body_size 0;
    location / {
      proxy_pass http://127.0.0.1:$port;
      $host_header
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      limit_rate $rate;
    }
  }
}
EOF
nginx -c "$work/nginx.conf" -p "$work/nginx" 2>"$work/nginx.err" &
nginx_pid=$!
wait_port "$nport" || { cat "$work/nginx.err" >&2; exit 1; }
slow=127.0.0.1:$nport/bench/node:v1

# download alone: the layer's bytes through nginx, nothing else
t0=$(date +%s%N)
curl -sf -o /dev/null "http://127.0.0.1:$nport/v2/bench/node/blobs/$layer"
t1=$(date +%s%N)
download_alone=$(elapsed "$t0" "$t1")

sync; t0=$(date +%s%N)
/usr/bin/time -v "$bin" unpack --config "$work/config.json" --root "$work/cold" "$slow" "$work/slow-ours" \
  >"$work/slow.out" 2>"$work/slow.time" || { cat "$work/slow.time" >&2; exit 1; }
t1=$(date +%s%N)
slow_ours=$(elapsed "$t0" "$t1")
slow_rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/slow.time")

sync; t0=$(date +%s%N)
skopeo copy -q --src-tls-verify=false "docker://$slow" "oci:$work/slow-layout:v1"
umoci unpack --image "$work/slow-layout:v1" "$work/slow-umoci" >/dev/null 2>&1
t1=$(date +%s%N)
slow_ref=$(elapsed "$t0" "$t1")

echo "rate-limited link: nginx limit_rate $((rate / 1024)) KiB/s, layer $((layer_size / 1024 / 1024)) MiB compressed"
echo "  download alone (curl through nginx):              ${download_alone}s"
echo "  unpack alone (kubeslot-activator, blob in store): ${unpack_alone}s"
echo "  kubeslot-activator unpack through nginx:          ${slow_ours}s, peak RSS $((slow_rss / 1024)) MiB"
echo "  skopeo copy + umoci unpack through nginx:         ${slow_ref}s"
python3 -c "print(f'  ratio ours / max(download, unpack): {$slow_ours/max($download_alone,$unpack_alone):.2f} (goal <= 1.15); ours / (skopeo+umoci): {$slow_ours/$slow_ref:.2f}')"
