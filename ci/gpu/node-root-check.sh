#!/usr/bin/env bash
# The real-GPU check that needs no systemd and no network (docs/host/gpu.md,
# "On a GPU host"): does a kubeslot node get a working GPU on this host, as far as
# the host side (discovery, binds) and the image (kubeslot-nvidia-setup)
# decide it?
#
#   ci/gpu/node-root-check.sh --prepare DIR    (any build machine)
#   DIR/node-root-check.sh [--ignore CHECK]... [--driver-root PATH]
#                                              (on the GPU host, as root)
#
# --prepare builds the NVIDIA test image (testdata/e2e/node-nvidia.toml.in
# on a Debian trixie minbase root; a placeholder kubelet, as nothing here
# runs one), signs it, and writes into DIR (missing or empty; at most
# 64 MiB in all): the image as an oci-archive, its public key, a test
# cluster CA, the release kubeslot-activator, the CUDA probe
# (ci/gpu/cuda-probe.c, built with cc against glibc: the node image's
# trixie glibc runs it, which prepare checks), this script and SHA256SUMS.
# Needs cargo, cc, objdump, openssl, mmdebstrap and this machine's Debian
# mirror (ci/lib/debian-rootfs.sh).
#
# Run from DIR on a GPU host as root, it changes nothing on the host
# outside a scratch directory (KUBESLOT_CHECK_TMP, default /var/tmp) and
# the mounts it makes there, which it removes:
#   1. records the driver version, the GPUs on the PCI bus, the device
#      nodes and the driver's entries in the loader cache;
#   2. runs `kubeslot-activator preflight` (the systemd checks ignored, and
#      the --ignore ones) and `plan`, whose .nspawn file names the binds;
#   3. verifies and unpacks the image with `kubeslot-activator unpack`;
#   4. applies the plan's GPU binds into a chroot of the tree as
#      systemd-nspawn would (proc, read-only sys, a tmpfs /dev with the
#      basic nodes, a tmpfs /run, each device and directory bind,
#      read-only where the plan says);
#   5. runs the image's kubeslot-nvidia-setup there, then `nvidia-smi -L`
#      and the CUDA probe (NVML, cuInit, a context, 64 MiB copied and read
#      back, a PTX kernel JIT-compiled, launched and every result checked).
# --driver-root PATH sets the config's gpu.driver_root (a driver tree such
# as the GPU operator's; by default the activator finds it).
#
# Exit status: 0 every step passed; 77 no GPU here (no /dev/nvidia<N> and
# no NVIDIA GPU on the PCI bus: nothing done); 1 a step failed (it is
# named). ci/gpu/check.sh is the check for hosts with systemd and network
# (a real pod through containerd and CDI).
set -euo pipefail

# The image's identity in its signature, and the config's node name.
IDENTITY=kubeslot.invalid/node-root-check/gpu
IMAGE_TAG="gpu-check"
MAX_BYTES=$((64 * 1024 * 1024))
# What --prepare writes, and the run checks is there.
FILES=(node-root-check.sh kubeslot-activator node-nvidia.tar node.pub cluster-ca.crt cuda-probe cuda-probe.c)

say() { printf '[node-root-check] %s\n' "$*"; }
# indent: stdin's lines, shown under the step that printed them
indent() { sed 's/^/[node-root-check]   /'; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

# ---------------------------------------------------------------- prepare

prepare() {
  local out=$1 repo work t base kubelet recipe glibc_image glibc_probe total
  repo=$(cd "$(dirname "$0")/../.." && pwd)
  [ -f "$repo/testdata/e2e/node-nvidia.toml.in" ] ||
    { echo "node-root-check: --prepare runs from the repository (ci/gpu/node-root-check.sh), not from a prepared dir" >&2; exit 1; }
  for t in cargo:cargo cc:gcc objdump:binutils strip:binutils openssl:openssl sha256sum:coreutils tar:tar; do
    command -v "${t%%:*}" >/dev/null ||
      { echo "node-root-check: --prepare needs ${t%%:*}: apt-get install -y ${t#*:}" >&2; exit 1; }
  done
  if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
    echo "node-root-check: $out is not empty; --prepare writes into a missing or empty directory" >&2
    exit 1
  fi
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  work=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-node-root-prepare.XXXXXX")
  # a failed prepare leaves no half-written DIR behind
  # shellcheck disable=SC2064 # expanded now, on purpose
  trap "rm -rf '$work'; [ -e '$out/SHA256SUMS' ] || rm -rf '$out'" EXIT

  # KUBESLOT_BIN_DIR: binaries already built (the test command passes its
  # debug build: no second build of the workspace in CI); otherwise the
  # release activator the GPU host runs and the debug builder.
  if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
    activator=$KUBESLOT_BIN_DIR/kubeslot-activator
    builder=$KUBESLOT_BIN_DIR/kubeslot-builder
    for b in "$activator" "$builder"; do
      [ -x "$b" ] || { echo "node-root-check: KUBESLOT_BIN_DIR has no executable $b" >&2; exit 1; }
    done
    say "using $activator and $builder (KUBESLOT_BIN_DIR)"
  else
    say "building the release kubeslot-activator and kubeslot-builder"
    (cd "$repo" && cargo build --quiet --release --locked -p kubeslot-activator &&
      cargo build --quiet --locked --workspace --bin kubeslot-builder)
    activator=$repo/target/release/kubeslot-activator
    builder=$repo/target/debug/kubeslot-builder
  fi
  base=$("$repo/ci/lib/debian-rootfs.sh" --suite trixie "")
  say "base: $base (Debian trixie minbase)"

  # nothing in the check runs a kubelet: a placeholder that says so
  kubelet=$work/kubelet
  printf '#!/bin/sh\necho "kubelet: not in the node-root check image (it runs no kubelet)" >&2\nexit 1\n' >"$kubelet"
  chmod 0755 "$kubelet"
  recipe=$work/node-nvidia.toml
  sed -e "s|@BASE_TAR@|$base|g" \
    -e "s|@BASE_SHA256@|$(sha256sum "$base" | cut -d' ' -f1)|g" \
    -e "s|@TAG@|$IMAGE_TAG|g" \
    -e "s|@KUBELET_SHA256@|$(sha256sum "$kubelet" | cut -d' ' -f1)|g" \
    -e "s|@KUBELET@|$kubelet|g" \
    -e "s|@UNITS@|$repo/testdata/e2e/node/units|g" \
    -e "s|@RECIPE_FILES@|$repo/recipes/files|g" \
    -e "s|@NVIDIA@|$repo/testdata/e2e/nvidia|g" \
    "$repo/testdata/e2e/node-nvidia.toml.in" >"$recipe"
  say "building and signing the NVIDIA test image"
  "$builder" keygen --out "$work/key" >"$work/keygen.log" 2>&1 ||
    { cat "$work/keygen.log" >&2; exit 1; }
  "$builder" --progress plain build "$recipe" --sign-key "$work/key.key" \
    --identity "$IDENTITY" --output "oci-archive:$out/node-nvidia.tar:$IMAGE_TAG" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log" >&2; exit 1; }
  cp "$work/key.pub" "$out/node.pub"
  # stripped: a debug build's symbols would not fit the 64 MiB the device
  # machine takes back
  strip -o "$out/kubeslot-activator" "$activator"
  chmod 0755 "$out/kubeslot-activator"
  install -m 0755 "$repo/ci/gpu/node-root-check.sh" "$out/node-root-check.sh"
  cp "$repo/ci/gpu/cuda-probe.c" "$out/cuda-probe.c"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj /CN=kubeslot-node-root-check -keyout "$work/ca.key" -out "$out/cluster-ca.crt" 2>/dev/null

  # The probe runs in the chroot, on the node image's glibc (trixie's), not
  # this machine's: built against this glibc, it may use no symbol version
  # newer than the image has.
  cc -O2 -Wall -Wextra -Werror -o "$out/cuda-probe" "$repo/ci/gpu/cuda-probe.c" -ldl
  glibc_image=$(tar -xOf "$base" ./var/lib/dpkg/status |
    awk '/^Package: libc6$/ { on = 1 } on && !done && /^Version:/ { sub(/-.*/, "", $2); print $2; done = 1 }')
  glibc_probe=$(objdump -T "$out/cuda-probe" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)
  if [ -z "$glibc_image" ] || [ -z "$glibc_probe" ]; then
    echo "node-root-check: cannot tell the glibc versions (image: '$glibc_image', probe needs: '$glibc_probe')" >&2
    exit 1
  fi
  if [ "$(printf '%s\n%s\n' "$glibc_probe" "$glibc_image" | sort -V | tail -n1)" != "$glibc_image" ]; then
    echo "node-root-check: cuda-probe needs glibc $glibc_probe, the node image has $glibc_image: prepare on an older build machine" >&2
    exit 1
  fi
  say "cuda-probe: needs glibc $glibc_probe, the node image has $glibc_image"

  (cd "$out" && sha256sum "${FILES[@]}" >SHA256SUMS)
  total=$(du -cb "$out"/* | tail -n1 | cut -f1)
  if [ "$total" -gt "$MAX_BYTES" ]; then
    echo "node-root-check: $out holds $total bytes, more than the $MAX_BYTES allowed" >&2
    rm -rf "$out"
    exit 1
  fi
  say "prepared $out: $total bytes ($((total / 1024 / 1024)) MiB); on a GPU host, as root: $out/node-root-check.sh"
}

# ---------------------------------------------------------------- run

STEP=start
failed() {
  echo "[node-root-check] FAILED at step '$STEP': $*" >&2
  exit 1
}
step() {
  STEP=$1
  say "== $1"
}

# The NVIDIA display controllers on the PCI bus: "ADDRESS DRIVER" lines.
pci_gpus() {
  local d drv
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    case $(cat "$d/class" 2>/dev/null) in 0x03*) ;; *) continue ;; esac
    drv=none
    [ -L "$d/driver" ] && drv=$(basename "$(readlink "$d/driver")")
    echo "${d##*/} $drv"
  done
}

MOUNTS=()
WORK=""
cleanup() {
  local rc=$? i
  set +e
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"
  done
  if [ -n "$WORK" ]; then
    if findmnt -rn -o TARGET | grep "^$WORK/" >/dev/null; then
      echo "[node-root-check] mounts under $WORK remain; not removing it" >&2
    else
      rm -rf --one-file-system "$WORK"
    fi
  fi
  exit "$rc"
}

# bind SOURCE TARGET ro|rw: a bind mount into the tree, as nspawn makes one
# (the mount point created as a directory or an empty file, like its source).
bind() {
  local src=$1 dst=$T$2 mode=$3
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")" && : >>"$dst"; fi
  mount --bind "$src" "$dst" || failed "mount --bind $src $dst"
  MOUNTS+=("$dst")
  if [ "$mode" = ro ]; then
    mount -o remount,bind,ro "$dst" || failed "remount $dst read-only"
  fi
}

# mnt TYPE OPTIONS TARGET: a file system in the tree, as nspawn mounts its API
# file systems.
mnt() {
  mkdir -p "$T$3"
  mount -t "$1" -o "$2" "$1" "$T$3" || failed "mount -t $1 on $3"
  MOUNTS+=("$T$3")
}

run_check() {
  local dir ignore=() driver_root="" gpu="" line ca key src dst t0 t1 nspawn binds=0
  dir=$(cd "$(dirname "$0")" && pwd)
  while [ $# -gt 0 ]; do
    case $1 in
      --ignore) ignore+=("--ignore" "$2"); shift 2 ;;
      --driver-root) driver_root=$2; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      *) echo "node-root-check: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
  done

  step gpu
  for d in /dev/nvidia[0-9]*; do
    if [ -c "$d" ]; then gpu=$d; break; fi
  done
  if [ -z "$gpu" ]; then
    line=$(pci_gpus | paste -sd, -)
    [ -n "$line" ] ||
      { say "no GPU here: no /dev/nvidia<N> character device and no NVIDIA GPU on the PCI bus (exit 77, nothing done)"; exit 77; }
    failed "NVIDIA GPUs on the PCI bus ($line) but no /dev/nvidia<N>: the NVIDIA kernel driver is not loaded"
  fi
  [ "$(id -u)" = 0 ] || failed "run as root (it mounts and chroots)"
  for t in chroot mount umount findmnt sha256sum; do
    command -v "$t" >/dev/null || failed "required tool '$t' is missing"
  done
  (cd "$dir" && sha256sum --quiet -c SHA256SUMS) ||
    failed "$dir is not a complete prepared dir (SHA256SUMS): make one with ci/gpu/node-root-check.sh --prepare DIR"
  ACT=$dir/kubeslot-activator

  step record
  say "kernel: $(uname -r)"
  say "driver: $(head -n1 /proc/driver/nvidia/version 2>/dev/null || echo '/proc/driver/nvidia/version missing')"
  line=$(pci_gpus | paste -sd, -)
  say "GPUs on the PCI bus (address driver): ${line:-none seen in /sys/bus/pci/devices}"
  # shellcheck disable=SC2012 # a listing for people
  { ls -l /dev/nvidia* /dev/dri 2>/dev/null || true; } | indent
  say "loader cache: $(ldconfig -p | grep -cE 'libnvidia|libcuda') NVIDIA entries"
  { ldconfig -p | grep -E 'lib(nvidia-ml|cuda)\.so' || true; } | sed 's/^[[:space:]]*//' | indent
  if command -v nvidia-smi >/dev/null; then
    say "host nvidia-smi -L: $(nvidia-smi -L 2>&1 | paste -sd';' -)"
  fi

  WORK=$(mktemp -d "${KUBESLOT_CHECK_TMP:-/var/tmp}/kubeslot-node-root-check.XXXXXX")
  trap cleanup EXIT
  T=$WORK/tree
  ca=$(awk '{ printf "%s\\n", $0 }' "$dir/cluster-ca.crt")
  key=""
  if [ -n "$driver_root" ]; then key=", \"driver_root\": \"$driver_root\""; fi
  cat >"$WORK/activator.json" <<EOF
{
  "image": "oci-archive:$dir/node-nvidia.tar:$IMAGE_TAG",
  "trust": {"public_keys": ["$dir/node.pub"], "identity": "$IDENTITY"},
  "kubelet": {"api_server": "https://192.0.2.1:6443", "ca_data": "$ca",
              "bootstrap_token": "abcdef.0123456789abcdef", "node_name": "gpu-check"},
  "nameservers": ["192.0.2.53"],
  "gpu": {"mode": "on"$key},
  "slots": {"mode": "copy"}
}
EOF

  step preflight
  "$ACT" preflight --config "$WORK/activator.json" --ignore systemd --ignore systemd-container "${ignore[@]}" ||
    failed "kubeslot-activator preflight (above; --ignore CHECK if the host is fine without it)"

  step plan
  "$ACT" plan --config "$WORK/activator.json" >"$WORK/plan.txt" 2>"$WORK/plan.err" ||
    { cat "$WORK/plan.err" >&2; failed "kubeslot-activator plan"; }
  cat "$WORK/plan.err" >&2
  head -n2 "$WORK/plan.txt" | indent
  # the .nspawn file as the plan would write it (a new file: every line "+")
  nspawn=$(awk '
    /^--- etc\/systemd\/nspawn\/kube[12]\.nspawn$/ { on = 1; next }
    /^--- etc\// { on = 0 }
    on && /^--- / && $2 != "/dev/null" { print "EXISTS"; exit }
    on && /^\+/ && !/^\+\+\+ / { print substr($0, 2) }' "$WORK/plan.txt")
  [ -n "$nspawn" ] || failed "the plan writes no .nspawn file (is this image active here already?)"
  [ "$nspawn" != EXISTS ] ||
    failed "the plan changes an existing .nspawn file: run the check on a host without kubeslot's machines"

  step unpack
  t0=$(date +%s%N)
  "$ACT" unpack --config "$WORK/activator.json" "oci-archive:$dir/node-nvidia.tar:$IMAGE_TAG" "$T" ||
    failed "kubeslot-activator unpack"
  t1=$(date +%s%N)
  say "unpacked in $(((t1 - t0) / 1000000)) ms: $(du -sh "$T" | cut -f1)"

  step binds
  # what nspawn sets up before any bind: the API file systems
  mnt proc nosuid,nodev,noexec /proc
  mnt sysfs ro,nosuid,nodev,noexec /sys
  mnt tmpfs mode=0755,nosuid /dev
  for n in null zero full random urandom tty; do bind "/dev/$n" "/dev/$n" rw; done
  mnt tmpfs mode=1777,nosuid,nodev /dev/shm
  ln -s /proc/self/fd "$T/dev/fd"
  mnt tmpfs mode=0755,nosuid,nodev /run
  # the GPU's binds; the others (kernel modules, the host files, the node
  # state) are the host's business, not the GPU's
  while IFS= read -r line; do
    case $line in
      Bind=*) mode=rw; line=${line#Bind=} ;;
      BindReadOnly=*) mode=ro; line=${line#BindReadOnly=} ;;
      *) continue ;;
    esac
    src=${line%%:*}
    dst=${line#*:}
    [ "$dst" != "$line" ] || dst=$src
    case $src:$dst in
      /dev/*) ;;
      *:/run/host-nvidia*) ;;
      *) continue ;;
    esac
    say "  $mode $src -> $dst"
    bind "$src" "$dst" "$mode"
    binds=$((binds + 1))
  done <<<"$nspawn"
  [ "$binds" -gt 0 ] || failed "the plan's .nspawn file binds no GPU (gpu \"on\")"
  sed -n 's/^# not bound: /[node-root-check]   not bound: /p' <<<"$nspawn"

  in_node() {
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CUDA_CACHE_DISABLE=1 \
      chroot "$T" "$@"
  }

  step setup
  in_node /usr/lib/kubeslot/nvidia-setup || failed "kubeslot-nvidia-setup in the node (its error is above)"
  say "ldconfig -p in the node: $(in_node ldconfig -p | grep -cE 'libnvidia|libcuda') NVIDIA entries"

  step nvidia-smi
  line=$(in_node nvidia-smi -L 2>&1) || { echo "$line" >&2; failed "nvidia-smi -L in the node"; }
  indent <<<"$line"
  grep -q '^GPU 0: ' <<<"$line" || failed "nvidia-smi -L in the node listed no GPU 0"

  step probe
  mkdir -p "$T/run/kubeslot-check"
  install -m 0755 "$dir/cuda-probe" "$T/run/kubeslot-check/cuda-probe"
  in_node /run/kubeslot-check/cuda-probe || failed "the CUDA probe in the node (its FAIL line is above)"

  STEP="passed"
  say "node-root check passed: the node's GPU works ($gpu, $binds binds)"
}

case ${1:-} in
  --prepare)
    [ $# -eq 2 ] || { usage >&2; exit 1; }
    prepare "$2"
    ;;
  -h | --help) usage ;;
  *) run_check "$@" ;;
esac
