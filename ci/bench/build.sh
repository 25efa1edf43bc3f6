#!/usr/bin/env bash
# Layer-writing throughput: kubeslot's deterministic layer writer against
# `tar --sort=name | gzip` and `| zstd` of the same ~300 MB tree, in rounds.
#
#   ci/bench/build.sh [--release] [--rootfs TAR]
#   REPEAT=5 ci/bench/build.sh --release       (rounds; default 3)
#
# The tree is a Debian rootfs (ci/lib/debian-rootfs.sh, cached) unpacked
# into a temp dir, or TAR with --rootfs (ci/bench/smoke.sh passes a small
# one). Each round runs every contender once, one after the other (paired:
# the machine is shared, so a disturbance hits a round rather than one
# contender). Our writer fsyncs its blob, so each reference's output is
# synced too (`sync FILE`). The script prints each contender's median wall and CPU
# (user+sys of every process) time, MB/s of uncompressed input, the ratio
# reference/ours (>1: we are faster) and the compressed size. Our gzip is
# level 6 like gzip's default, on one thread; our zstd is level 3 in zstd's
# multi-threaded mode on every CPU, compared with `zstd -3 -T0` (every
# core) and `zstd -3 -T1` (one worker); it also runs with one worker
# (`--zstd-workers 1`) and reports whether every zstd blob of ours had the
# same digest (the frame does not depend on the worker count; exits 1 when
# not).
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
for t in tar gzip zstd python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is not installed: apt-get install -y $t" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "bench: /usr/bin/time is missing: apt-get install -y time" >&2; exit 1; }
rounds=${REPEAT:-3}

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
mkdir "$work/tree" "$work/out" "$work/times"
tar -C "$work/tree" --numeric-owner -xf "$rootfs_tar" 2>/dev/null || tar -C "$work/tree" -xf "$rootfs_tar"
bytes=$(du -sb --apparent-size "$work/tree" | cut -f1)
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')
echo "tree: $mb MB ($(find "$work/tree" | wc -l) entries) from $rootfs_tar, $profile build, $(nproc) CPUs, $rounds rounds"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# run NAME OUTFILE COMMAND: one timed run (wall, user, sys appended to
# times/NAME); OUTFILE is emptied first (a failing command fails the bench).
run() {
  local name=$1 out=$2; shift 2
  rm -rf "$out"
  /usr/bin/time -f '%e %U %S' -a -o "$work/times/$name" sh -c "$1" >"$work/$name.stdout" 2>"$work/$name.err" \
    || { echo "build.sh: $name failed:" >&2; cat "$work/$name.err" >&2; exit 1; }
}
ours() { echo "'$bin' --progress quiet bench-layer '$work/tree' --out '$1' $2"; }
tarred="tar --sort=name --numeric-owner -C '$work/tree' -cf - ."
: >"$work/zstd-digests"
for _ in $(seq "$rounds"); do
  run ours-gz "$work/out/gz" "$(ours "$work/out/gz" '--compression gzip')"
  run ref-gz "$work/out/ref.tar.gz" "$tarred | gzip -6 >'$work/out/ref.tar.gz' && sync '$work/out/ref.tar.gz'"
  run ours-zst "$work/out/zst" "$(ours "$work/out/zst" '--compression zstd')"
  cut -d' ' -f1 "$work/ours-zst.stdout" >>"$work/zstd-digests"
  run ref-zst-t0 "$work/out/ref.tar.zst" "$tarred | zstd -3 -T0 -q >'$work/out/ref.tar.zst' && sync '$work/out/ref.tar.zst'"
  run ours-zst-1 "$work/out/zst1" "$(ours "$work/out/zst1" '--compression zstd --zstd-workers 1')"
  cut -d' ' -f1 "$work/ours-zst-1.stdout" >>"$work/zstd-digests"
  run ref-zst-t1 "$work/out/ref1.tar.zst" "$tarred | zstd -3 -T1 -q >'$work/out/ref1.tar.zst' && sync '$work/out/ref1.tar.zst'"
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# median NAME: "wall cpu" medians of NAME's runs
median() {
  python3 - "$work/times/$1" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1].isdigit()]
wall = statistics.median(float(r[0]) for r in rows)
cpu = statistics.median(float(r[1]) + float(r[2]) for r in rows)
print(f"{wall:.3f} {cpu:.3f}")
PY
}
size() { du -b "$@" | awk '{ s += $1 } END { printf "%.1f", s / 1e6 }'; }
row() { # label name ref_name size
  local t r
  read -r -a t <<<"$(median "$2")"
  read -r -a r <<<"$(median "$3")"
  awk -v n="$1" -v t="${t[0]}" -v c="${t[1]}" -v r="${r[0]}" -v rc="${r[1]}" -v mb="$mb" -v sz="$4" \
    'BEGIN { printf "%-36s %7.2f s (cpu %6.2f s) %7.1f MB/s  ratio %.2f (cpu %.2f)  %s MB out\n", n, t, c, mb / t, r / t, rc / c, sz }'
}
echo
echo "medians of $rounds rounds:"
row "kubeslot layer, gzip -6"               ours-gz    ref-gz     "$(size "$work"/out/gz/*)"
row "tar --sort=name | gzip -6"             ref-gz     ref-gz     "$(size "$work/out/ref.tar.gz")"
row "kubeslot layer, zstd -3 (every CPU)"   ours-zst   ref-zst-t0 "$(size "$work"/out/zst/*)"
row "tar --sort=name | zstd -3 -T0"         ref-zst-t0 ref-zst-t0 "$(size "$work/out/ref.tar.zst")"
row "kubeslot layer, zstd -3 (1 worker)"    ours-zst-1 ref-zst-t1 "$(size "$work"/out/zst1/*)"
row "tar --sort=name | zstd -3 -T1"         ref-zst-t1 ref-zst-t1 "$(size "$work/out/ref1.tar.zst")"
echo
echo "ratio = reference time / our time on the same tree (>1: kubeslot is faster); cpu = user+sys"
read -r -a t0 <<<"$(median ours-zst)"
read -r -a r0 <<<"$(median ref-zst-t0)"
read -r -a r1 <<<"$(median ref-zst-t1)"
awk -v a="${t0[0]}" -v b="${r0[0]}" -v c="${r1[0]}" \
  'BEGIN { printf "kubeslot zstd (every CPU) throughput: %.2fx tar | zstd -3 -T0, %.2fx tar | zstd -3 -T1\n", b / a, c / a }'
distinct=$(sort -u "$work/zstd-digests" | wc -l)
if [ "$distinct" = 1 ]; then
  echo "zstd blobs of ours: $(wc -l <"$work/zstd-digests") runs (every CPU and 1 worker), one digest: $(head -n1 "$work/zstd-digests")"
else
  echo "zstd blobs of ours: $distinct different digests over $(wc -l <"$work/zstd-digests") runs (expected one):"
  sort "$work/zstd-digests" | uniq -c
  exit 1
fi
