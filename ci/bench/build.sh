#!/usr/bin/env bash
# Layer-writing throughput: kubeslot's deterministic layer writer against
# `tar --sort=name | gzip` and `| zstd` of the same ~300 MB tree, from one run.
#
#   ci/bench/build.sh [--release] [--rootfs TAR]
#
# The tree is a Debian rootfs (ci/lib/debian-rootfs.sh, cached) unpacked
# into a temp dir, or TAR with --rootfs (ci/bench/smoke.sh passes a small
# one). Each tool runs once; the script prints MB/s of
# uncompressed input and the ratio ours/reference (>1 means we are faster),
# plus compressed sizes. Both sides use one thread: our gzip is level 6 like
# gzip's default, our zstd level 3 single-threaded like zstd's default.
# KUBESLOT_BIN_DIR=DIR takes kubeslot-builder from DIR instead of building it.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=debug rootfs_tar=''
while [ $# -gt 0 ]; do
  case $1 in
    --release) profile=release; shift ;;
    --rootfs) rootfs_tar=$2; shift 2 ;;
    *) echo "build.sh: unknown argument $1 (usage: ci/bench/build.sh [--release] [--rootfs TAR])" >&2; exit 2 ;;
  esac
done
for t in tar gzip zstd; do
  command -v "$t" >/dev/null || { echo "bench: $t is not installed: apt-get install -y $t" >&2; exit 1; }
done

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$KUBESLOT_BIN_DIR/kubeslot-builder profile="$KUBESLOT_BIN_DIR"
else
  # shellcheck disable=SC2046 # an empty word for the dev profile, `--release` otherwise
  cargo build --quiet --locked $([ "$profile" = release ] && echo --release) -p kubeslot-builder
  bin=target/$profile/kubeslot-builder
fi
[ -x "$bin" ] || { echo "bench: $bin is missing (cargo test --workspace --no-run builds it)" >&2; exit 1; }

[ -n "$rootfs_tar" ] || rootfs_tar=$(ci/lib/debian-rootfs.sh systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iproute2,iptables)
work=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/tree" "$work/out"
tar -C "$work/tree" --numeric-owner -xf "$rootfs_tar" 2>/dev/null || tar -C "$work/tree" -xf "$rootfs_tar"
bytes=$(du -sb --apparent-size "$work/tree" | cut -f1)
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')
echo "tree: $mb MB ($(find "$work/tree" | wc -l) entries) from $rootfs_tar, $profile build"

now() { date +%s.%N; }
time_it() { # command...: prints seconds (a failing command fails the bench:
  # command substitutions do not inherit set -e)
  local s e; s=$(now); "$@" >/dev/null || return; e=$(now)
  awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }'
}

ours_gz=$(time_it "$bin" --progress quiet bench-layer "$work/tree" --out "$work/out/gz" --compression gzip)
ours_zst=$(time_it "$bin" --progress quiet bench-layer "$work/tree" --out "$work/out/zst" --compression zstd)
ref_gz=$(time_it sh -c "tar --sort=name --numeric-owner -C '$work/tree' -cf - . | gzip -6 >'$work/out/ref.tar.gz'")
ref_zst=$(time_it sh -c "tar --sort=name --numeric-owner -C '$work/tree' -cf - . | zstd -3 -T1 -q >'$work/out/ref.tar.zst'")

size() { du -b "$@" | awk '{ s += $1 } END { printf "%.1f", s / 1e6 }'; }
row() { # name seconds ref_seconds size
  awk -v n="$1" -v t="$2" -v r="$3" -v mb="$mb" -v sz="$4" \
    'BEGIN { printf "%-34s %7.2f s %8.1f MB/s  ratio %.2f  (%s MB out)\n", n, t, mb / t, r / t, sz }'
}
echo
row "kubeslot layer, gzip -6"            "$ours_gz"  "$ref_gz"  "$(size "$work"/out/gz/*)"
row "tar --sort=name | gzip -6"          "$ref_gz"   "$ref_gz"  "$(size "$work/out/ref.tar.gz")"
row "kubeslot layer, zstd -3 (1 thread)" "$ours_zst" "$ref_zst" "$(size "$work"/out/zst/*)"
row "tar --sort=name | zstd -3 -T1"      "$ref_zst"  "$ref_zst" "$(size "$work/out/ref.tar.zst")"
echo
echo "ratio = reference time / our time on the same tree (>1: kubeslot is faster)"
