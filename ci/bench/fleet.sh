#!/usr/bin/env bash
# Fleet benchmark: what N hosts picking up a new image at the same moment do
# to one registry, and whether they all converge when it rate-limits.
#
#   ci/bench/fleet.sh [--hosts N] [--image-mb M] [--parallel P] [--topologies 1,2,3]
#
# One signed image, built and signed by kubeslot-builder (a base layer of
# about 3/4 of M MB of random bytes and a Kubernetes layer of about 1/4), in
# two versions: v2 changes only the Kubernetes layer (and the small SBOM
# layer and config that name the kubelet). It sits in a real Debian
# docker-registry on 127.0.0.1 (the origin). N simulated hosts, each a real
# `kubeslot-activator fetch` with its own --root, content store and slot
# (staging only: no machine is started), fetch v1, then v2, in three
# topologies, each with fresh hosts:
#   1  every host -> the origin;
#   2  every host -> a pull-through cache (docker-registry with
#      `proxy: remoteurl:` the origin, cold at the start), the activator's
#      `mirrors` entry for the origin -> the origin;
#   2w the same, but one canary host fetches first and the others start
#      when it is done (its requests count too);
#   2n every host -> Debian's nginx as the mirror, caching what is
#      addressed by digest (blobs, manifests) with `proxy_cache_lock` (one
#      request fills the cache, the others wait for it) -> the origin;
#   3  every host -> Debian's nginx with `limit_req` (GET/HEAD, one shared
#      bucket, --rate per second) answering 429 with `Retry-After: 1` ->
#      the origin. The hosts name the limiter as their registry (it stands
#      for the origin's own rate limit, so there is no unlimited way
#      around it) and set `trust.identity` to the origin's repository, the
#      one the image was signed for, as a site reaching its registry
#      through a proxy address does.
# It prints, per topology and round, from the access logs and the hosts'
# report.json: origin bytes out, bytes and requests per host, the time
# until the last host converged, failures, and the ratios: origin bytes /
# (new bytes x hosts) for 1, origin bytes / new bytes for 2, 2w and 2n
# (1.0 = each layer leaves the origin once), 429s answered and time waited for 3
# (target: 0 failures). New bytes: the config and layers of the round's
# image that the hosts do not already have. A host converged when it
# exited 0 with outcome `staged` and its report.json names the round's
# image (`digest`: the platform manifest; `index_digest`, when present: the
# index the tag points at). Exit status 1 when any host of any round did
# not converge (the table is printed first, then the first failure).
#
# Options: --hosts N (default 200); --image-mb M (default 4, 1 from 300
# hosts on); --parallel P activator processes at once (default min(N,200));
# --rate R requests/s through the limiter (default N/5, at least 20);
# --timeout S per host process (default 600); --deadline S passed to the
# hosts' `download.deadline_secs` (default: not set); --keep leaves the
# work directory (logs, host roots) for a look. Smoke size (ci/bench/smoke.sh):
# --hosts 5 --image-mb 1. KUBESLOT_BIN_DIR=DIR takes kubeslot-activator and
# kubeslot-builder from DIR (e.g. target/debug after the tests) instead of
# building them (release activator, debug builder). Host roots live on a
# private tmpfs (size-capped; a plain directory when it cannot be mounted).
# Loopback only. Every process it starts (registries, nginx, hosts) is
# stopped and every file removed on exit, also on INT/TERM.
#
# Heavy: run it under the shared lock, `flock /tmp/kubeslot-e2e.lock
# ci/bench/fleet.sh`. Needs docker-registry, nginx (nginx-light), python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

keep=0 hosts=200 image_mb='' parallel='' rate='' timeout=600 deadline=0 topologies=1,2,2w,2n,3
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --image-mb) image_mb=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --topologies) topologies=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fleet.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$hosts" "$timeout" "$deadline" ${image_mb:+"$image_mb"} ${parallel:+"$parallel"} ${rate:+"$rate"}; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "fleet.sh: $v is not a whole number" >&2; exit 2; }
done
if [ "$hosts" -lt 1 ] || [ "$hosts" -gt 5000 ]; then echo "fleet.sh: --hosts must be 1..5000" >&2; exit 2; fi
[ -n "$image_mb" ] || { if [ "$hosts" -ge 300 ]; then image_mb=1; else image_mb=4; fi; }
[ "$image_mb" -ge 1 ] || { echo "fleet.sh: --image-mb must be at least 1" >&2; exit 2; }
[ -n "$parallel" ] || parallel=$(( hosts < 200 ? hosts : 200 ))
[ -n "$rate" ] || rate=$(( hosts / 5 > 20 ? hosts / 5 : 20 ))

need() { command -v "$1" >/dev/null || { echo "fleet.sh: $1 is missing: apt-get install -y $2" >&2; exit 1; }; }
need docker-registry docker-registry
need nginx nginx-light
need python3 python3

log() { printf 'fleet: %s\n' "$*" >&2; }

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin_dir=$(cd "$KUBESLOT_BIN_DIR" && pwd)
  activator=$bin_dir/kubeslot-activator builder=$bin_dir/kubeslot-builder
  build="binaries from $KUBESLOT_BIN_DIR"
else
  log "building kubeslot-activator (release) and kubeslot-builder"
  cargo build --release -q --locked -p kubeslot-activator
  cargo build -q --locked -p kubeslot-builder
  activator=$repo/target/release/kubeslot-activator builder=$repo/target/debug/kubeslot-builder
  build="release activator"
fi
for b in "$activator" "$builder"; do
  [ -x "$b" ] || { echo "fleet.sh: $b is missing (build it: cargo test --workspace --no-run)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/var/tmp}/kubeslot-fleet.XXXXXX")
pids=() mounted='' launcher=''
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Everything below runs whatever fails (a killed child's wait is non-zero).
  set +e
  # The host launcher kills its activator processes on TERM.
  [ -n "$launcher" ] && kill "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then
    echo "fleet.sh: --keep: the work dir $work stays${mounted:+ (hosts on a tmpfs: umount $mounted)}" >&2
  else
    [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 150); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "fleet.sh: nothing listens on 127.0.0.1:$1 ($2); its log:" >&2
  cat "$3" >&2
  exit 1
}

# registry NAME PORT [EXTRA-YAML]: a docker-registry with its access log
# (stdout) in WORK/NAME.access.log; its PID goes to pids.
registry() {
  local name=$1 port=$2
  mkdir -p "$work/$name"
  cat >"$work/$name.yml" <<EOF
version: 0.1
log: {level: error, accesslog: {disabled: false}}
storage: {filesystem: {rootdirectory: $work/$name}, delete: {enabled: true}}
http: {addr: 127.0.0.1:$port}
${3:-}
EOF
  docker-registry serve "$work/$name.yml" >"$work/$name.access.log" 2>"$work/$name.err" &
  pids+=($!)
  wait_port "$port" "docker-registry $name" "$work/$name.err"
}

stop_last() { local p=${pids[-1]}; kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; unset 'pids[-1]'; }

# Host roots: a private, size-capped tmpfs (every write of a host is an
# fsync'd blob or an unpacked tree: on disk, the fleet would measure the
# disk).
mkdir -p "$work/hosts"
cap_mb=$(( hosts * image_mb * 3 + 256 ))
if mount -t tmpfs -o "size=${cap_mb}m,mode=0755" kubeslot-fleet "$work/hosts" 2>/dev/null; then
  mounted=$work/hosts
else
  log "cannot mount a tmpfs (not root?): host roots go to $work/hosts on disk"
fi

origin_port=$(free_port)
registry origin "$origin_port"
origin=127.0.0.1:$origin_port

# --- the image: base (random, ~3/4 M) + Kubernetes layer (random, ~1/4 M)
img=$work/image
mkdir -p "$img/base/usr/lib/fleet" "$img/base/etc"
base_kb=$(( image_mb * 1024 * 3 / 4 ))
kube_kb=$(( image_mb * 1024 - base_kb ))
head -c "$(( base_kb * 1024 ))" /dev/urandom >"$img/base/usr/lib/fleet/payload"
echo fleet >"$img/base/etc/hostname"
tar -C "$img/base" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@1700000000 -czf "$img/base.tar.gz" .
for v in v1 v2; do
  head -c "$(( kube_kb * 1024 ))" /dev/urandom >"$img/kubelet-$v"
  cat >"$img/node-$v.toml" <<EOF
name = "kubeslot-fleet-node"
tag = "$v"
platforms = ["linux/amd64"]
source_date_epoch = 1700000000

[base]
kind = "rootfs"
url = "file://$img/base.tar.gz"
sha256 = { amd64 = "sha256:$(sha256sum "$img/base.tar.gz" | cut -d' ' -f1)" }

[components.kubelet]
version = "$v"
url = "file://$img/kubelet-$v"
sha256 = { amd64 = "sha256:$(sha256sum "$img/kubelet-$v" | cut -d' ' -f1)" }
format = "binary"
group = "kubernetes"
dest = "/usr/bin/kubelet"
mode = "0755"

[[layers]]
group = "base"

[[layers]]
group = "kubernetes"
EOF
  "$builder" --progress quiet build "$img/node-$v.toml" --cache "$img/cache" \
    --output "oci:$img/layout:$v" >"$work/build-$v.log" 2>&1 || { cat "$work/build-$v.log" >&2; exit 1; }
done
"$builder" --progress quiet keygen --out "$img/key" >/dev/null
for v in v1 v2; do
  if ! "$builder" --progress quiet push "oci:$img/layout:$v" "$origin/fleet/node:$v" >>"$work/push.log" 2>&1 ||
    ! "$builder" --progress quiet sign --key "$img/key.key" "$origin/fleet/node:$v" >>"$work/push.log" 2>&1; then
    cat "$work/push.log" >&2
    exit 1
  fi
done
log "image v1/v2 ($image_mb MB) built, signed and pushed to $origin; $hosts hosts, $parallel at once"

results=$work/results.jsonl
: >"$results"
# fleet NAME IMAGE REGISTRIES-JSON LOG:ROLE... [-- FLEET.PY-OPTION...]:
# fresh hosts, rounds v1 and v2.
fleet() {
  local name=$1 image=$2 registries=$3; shift 3
  local logs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do logs+=(--log "$1"); shift; done
  [ $# -gt 0 ] && shift
  logs+=("$@")
  rm -rf "$work/hosts/"* "$work/host-logs"
  python3 "$repo/ci/bench/fleet.py" topology --name "$name" --activator "$activator" \
    --hosts-dir "$work/hosts" --hosts "$hosts" --parallel "$parallel" --timeout "$timeout" \
    --deadline "$deadline" --layout "$img/layout" --image "$image" --key "$img/key.pub" \
    --registries "$registries" --results "$results" "${logs[@]}" &
  launcher=$!
  wait "$launcher"
  launcher=
}

# (nginx variables, not the shell's)
# shellcheck disable=SC2016
proxy_common='      proxy_set_header Host $http_host;
      proxy_http_version 1.1;
      proxy_set_header Connection "";'
# nginx_conf NAME PORT HTTP-BODY: an nginx in the foreground (its PID goes
# to pids) with WORK/NAME.access.log and private temp dirs.
nginx_conf() {
  local name=$1 port=$2
  mkdir -p "$work/nginx-$name"
  cat >"$work/nginx-$name.conf" <<EOF
daemon off;
# (as root, workers would switch to an account that cannot enter WORK)
user $(id -un) $(id -gn);
worker_processes 1;
pid $work/nginx-$name/nginx.pid;
error_log $work/nginx-$name/error.log warn;
events { worker_connections 4096; }
http {
  access_log $work/$name.access.log;
  client_body_temp_path $work/nginx-$name/body;
  proxy_temp_path $work/nginx-$name/proxy;
  fastcgi_temp_path $work/nginx-$name/fastcgi;
  uwsgi_temp_path $work/nginx-$name/uwsgi;
  scgi_temp_path $work/nginx-$name/scgi;
$3
}
EOF
  : >"$work/$name.access.log"
  nginx -c "$work/nginx-$name.conf" -p "$work/nginx-$name" 2>"$work/nginx-$name.err" &
  pids+=($!)
  wait_port "$port" "nginx $name" "$work/nginx-$name.err"
}

IFS=, read -ra topo <<<"$topologies"
for t in "${topo[@]}"; do
  case $t in
    1)
      log "topology 1: $hosts hosts -> origin"
      fleet "1 direct" "$origin/fleet/node" '{}' "$work/origin.access.log:origin" "$work/origin.access.log:hosts"
      ;;
    2)
      mirror_port=$(free_port)
      registry mirror-2 "$mirror_port" "proxy: {remoteurl: http://$origin}"
      log "topology 2: $hosts hosts -> pull-through mirror 127.0.0.1:$mirror_port -> origin"
      fleet "2 mirror" "$origin/fleet/node" "{\"$origin\": {\"mirrors\": [\"127.0.0.1:$mirror_port\"]}}" \
        "$work/origin.access.log:origin" "$work/mirror-2.access.log:hosts"
      stop_last
      ;;
    2w)
      mirror_port=$(free_port)
      registry mirror-2w "$mirror_port" "proxy: {remoteurl: http://$origin}"
      log "topology 2w: 1 canary host, then $((hosts - 1)) hosts -> pull-through mirror 127.0.0.1:$mirror_port -> origin"
      fleet "2w mirror, canary first" "$origin/fleet/node" "{\"$origin\": {\"mirrors\": [\"127.0.0.1:$mirror_port\"]}}" \
        "$work/origin.access.log:origin" "$work/mirror-2w.access.log:hosts" -- --canary
      stop_last
      ;;
    2n)
      mirror_port=$(free_port)
      mkdir -p "$work/nginx-cache"
      nginx_conf cache "$mirror_port" "$(cat <<EOF
  proxy_cache_path $work/nginx-cache levels=1:2 keys_zone=blobs:10m inactive=1d use_temp_path=off;
  server {
    listen 127.0.0.1:$mirror_port;
    # Content-addressed: a blob or a manifest by digest never changes, so
    # it is cached; one request fills the cache while the others wait.
    location ~ ^/v2/.+/(blobs|manifests)/sha256: {
      proxy_pass http://$origin;
      proxy_cache blobs;
      proxy_cache_key \$uri;
      proxy_cache_valid 200 1d;
      proxy_cache_lock on;
      proxy_cache_lock_timeout 5m;
      proxy_cache_lock_age 5m;
$proxy_common
    }
    # Tags (and the .sig tags) move: always asked upstream.
    location / {
      proxy_pass http://$origin;
$proxy_common
    }
  }
EOF
)"
      log "topology 2n: $hosts hosts -> nginx caching mirror 127.0.0.1:$mirror_port (proxy_cache_lock) -> origin"
      fleet "2n nginx cache mirror" "$origin/fleet/node" "{\"$origin\": {\"mirrors\": [\"127.0.0.1:$mirror_port\"]}}" \
        "$work/origin.access.log:origin" "$work/cache.access.log:hosts"
      stop_last
      ;;
    3)
      nginx_port=$(free_port)
      nginx_conf limiter "$nginx_port" "$(cat <<EOF
  # One bucket for every reader (a registry limiting a site behind one
  # address); uploads are not limited (the images were pushed before).
  map \$request_method \$fleet_key { GET fleet; HEAD fleet; default ""; }
  limit_req_zone \$fleet_key zone=fleet:1m rate=${rate}r/s;
  server {
    listen 127.0.0.1:$nginx_port;
    client_max_body_size 0;
    location / {
      limit_req zone=fleet burst=$(( rate / 2 + 1 )) nodelay;
      limit_req_status 429;
      proxy_pass http://$origin;
$proxy_common
    }
    error_page 429 @limited;
    location @limited {
      add_header Retry-After 1 always;
      default_type application/json;
      return 429 '{"errors":[{"code":"TOOMANYREQUESTS","message":"rate limited"}]}';
    }
  }
EOF
)"
      log "topology 3: $hosts hosts -> nginx 127.0.0.1:$nginx_port (limit_req $rate/s, 429 + Retry-After: 1) -> origin"
      fleet "3 rate-limited" "127.0.0.1:$nginx_port/fleet/node" '{}' \
        "$work/origin.access.log:origin" "$work/limiter.access.log:hosts" "$work/limiter.access.log:limiter" \
        -- --identity "$origin/fleet/node"
      stop_last
      ;;
    *) echo "fleet.sh: unknown topology $t (1, 2, 2w, 2n or 3)" >&2; exit 2 ;;
  esac
done

echo
echo "fleet: $hosts hosts, image $image_mb MB, $parallel activator processes at once, limiter $rate requests/s; $build; $(git -C "$repo" rev-parse --short HEAD)"
python3 "$repo/ci/bench/fleet.py" table --results "$results"
