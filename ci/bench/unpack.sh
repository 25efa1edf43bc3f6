#!/usr/bin/env bash
# shellcheck disable=SC2154 # t_*, c_*, rss_* are assigned through eval
# Unpack benchmark: one Debian rootfs image (~300 MB uncompressed, from
# ci/lib/debian-rootfs.sh), the same layer blobs unpacked by
#   * the activator's unpacker alone (image/examples/unpack_layout.rs, release),
#   * `kubeslot-activator unpack oci:DIR:TAG` (resolve, trust check, blob store
#     with its blobs already present, unpack into staging, rename),
#   * `umoci unpack` (gzip image),
#   * `gzip -dc | tar -x` and `zstd -dc | tar -x` (the floor: no checks at all),
# each followed by a sync of the target's filesystem (the unpacker ends with
# syncfs, so the references pay for writeback too). Prints wall and CPU
# times, the ratios against the references and the unpacker's peak RSS.
# With REPEAT=N the contenders take turns, N rounds of one run each (a
# shared machine's load then falls on all of them alike), and each time
# printed is the median of N (the fastest in brackets).
#
#   ci/bench/unpack.sh [PKG,PKG...]      (default: a node-like package set)
#   REPEAT=5 ci/bench/unpack.sh          (5 rounds, medians)
#   ci/bench/unpack.sh --rootfs TAR      (TAR in place of the Debian rootfs;
#                                         ci/bench/smoke.sh passes a small one)
#   BENCH_DIR=/dev/shm/b ci/bench/unpack.sh   (on a tmpfs: the disk left out)
#
# KUBESLOT_BIN_DIR=DIR takes kubeslot-activator and examples/unpack_layout,
# examples/make_layout from DIR (target/debug after the tests) instead of
# building them (release). KUBESLOT_BASELINE_UNPACK=BIN adds BIN (an
# examples/unpack_layout built from another commit, e.g. in a `git archive`
# of it) as contender base-zstd, in the same rounds, and prints our times
# against it.
#
# Needs: mmdebstrap, umoci, zstd, gzip, tar, python3, /usr/bin/time (Debian
# package `time`). Work files go to $BENCH_DIR (default: a temp dir).
set -euo pipefail
cd "$(dirname "$0")/../.."

for t in umoci zstd gzip tar python3; do
  command -v "$t" >/dev/null || { echo "unpack bench: $t missing: apt-get install -y $t" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "unpack bench: /usr/bin/time missing: apt-get install -y time" >&2; exit 1; }

if [ "${1:-}" = --rootfs ]; then
  rootfs=${2:?unpack bench: --rootfs needs a tar}
else
  rootfs=$(ci/lib/debian-rootfs.sh "${1:-systemd,dbus,iproute2,iptables,containerd,runc,openssh-server,python3,curl,less,vim-tiny}")
fi
work=${BENCH_DIR:-$(mktemp -d /var/tmp/kubeslot-bench.XXXXXX)}
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$KUBESLOT_BIN_DIR/examples activator=$KUBESLOT_BIN_DIR/kubeslot-activator
else
  echo "building the example binaries (release)..." >&2
  cargo build --release --quiet --locked -p kubeslot-activator --bin kubeslot-activator
  cargo build --release --quiet --locked -p kubeslot-image --example unpack_layout --example make_layout
  bin=target/release/examples activator=target/release/kubeslot-activator
fi
for b in "$activator" "$bin/unpack_layout" "$bin/make_layout"; do
  [ -x "$b" ] || { echo "unpack bench: $b is missing (cargo test --workspace --no-run builds it)" >&2; exit 1; }
done

# Device nodes are refused by design (an nspawn machine gets /dev from the
# host); every contender gets the same tar without them.
python3 - "$rootfs" "$work/rootfs.tar" <<'PY'
import sys, tarfile
src = tarfile.open(sys.argv[1])
with tarfile.open(sys.argv[2], "w", format=tarfile.PAX_FORMAT) as dst:
    for m in src:
        if m.ischr() or m.isblk() or m.isfifo():
            continue
        dst.addfile(m, src.extractfile(m) if m.isreg() else None)
PY
"$bin/make_layout" "$work/gz" t gzip "$work/rootfs.tar" >/dev/null
"$bin/make_layout" "$work/zst" t zstd "$work/rootfs.tar" >/dev/null
# shellcheck disable=SC2012 # blob names are sha256 hex: nothing for ls to mangle
blob() { ls -S "$1"/blobs/sha256/* | head -n1; }   # the layer is the largest blob
gzblob=$(blob "$work/gz"); zstblob=$(blob "$work/zst")
size_mb=$(( $(stat -c %s "$work/rootfs.tar") / 1000000 ))
echo "image: $size_mb MB uncompressed, gzip $(( $(stat -c %s "$gzblob") / 1000000 )) MB, zstd $(( $(stat -c %s "$zstblob") / 1000000 )) MB, $(tar -tf "$work/rootfs.tar" | wc -l) entries"

# The contenders, NAME and command; each run gets a fresh target, a sync
# before and `sync -f` of the target inside its time.
names=() cmds=()
contender() { names+=("$1"); cmds+=("$2"); }
contender ours-gzip  "$bin/unpack_layout $work/gz:t $work/out"
contender ours-zstd  "$bin/unpack_layout $work/zst:t $work/out"
if [ -n "${KUBESLOT_BASELINE_UNPACK:-}" ]; then
  [ -x "$KUBESLOT_BASELINE_UNPACK" ] || { echo "unpack bench: $KUBESLOT_BASELINE_UNPACK is not an executable" >&2; exit 1; }
  contender base-zstd "$KUBESLOT_BASELINE_UNPACK $work/zst:t $work/out"
fi
contender gzip-tar   "gzip -dc $gzblob | tar -x -C $work/out"
contender zstd-tar   "zstd -dc $zstblob | tar -x -C $work/out"
contender cmd-zstd   "rmdir $work/out && $activator unpack --config $work/cfg.json --root $work/root oci:$work/zst:t $work/out"
contender umoci-gzip "umoci unpack --image $work/gz:t $work/bundle"

# The command's content store gets the blobs once, untimed; the timed runs
# reuse them (what a host does when it re-stages a known image).
mkdir -p "$work/root"
echo '{"trust": {"allow_unsigned": true}}' > "$work/cfg.json"
"$activator" unpack --config "$work/cfg.json" --root "$work/root" "oci:$work/zst:t" "$work/warm" >/dev/null 2>&1 \
  || { echo "kubeslot-activator unpack failed" >&2; exit 1; }
rm -rf "$work/warm"

# once NAME CMD: one timed run; appends "wall cpu rss" to $work/NAME.runs.
once() {
  local name=$1 cmd=$2 secs rss usr sys
  rm -rf "$work/out" "$work/bundle"; mkdir "$work/out"; sync
  /usr/bin/time -f "%e %M %U %S" -o "$work/$name.time" bash -c "$cmd && sync -f $work" >/dev/null 2>"$work/$name.err" \
    || { echo "$name failed:" >&2; cat "$work/$name.err" >&2; exit 1; }
  read -r secs rss usr sys < "$work/$name.time"
  echo "$secs $(python3 -c "print(f'{$usr + $sys:.2f}')") $rss" >> "$work/$name.runs"
}
for _ in $(seq "${REPEAT:-1}"); do
  for i in "${!names[@]}"; do once "${names[$i]}" "${cmds[$i]}"; done
done
# Per contender: the median wall and CPU time of its runs, the fastest of
# each, and the largest RSS, as shell assignments t_NAME, c_NAME, rss_NAME.
for name in "${names[@]}"; do
  v=${name//-/_}
  read -r t c tmin cmin rss < <(python3 - "$work/$name.runs" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
wall = [float(r[0]) for r in runs]; cpu = [float(r[1]) for r in runs]
print(f"{statistics.median(wall):.2f} {statistics.median(cpu):.2f} {min(wall):.2f} {min(cpu):.2f} {max(int(r[2]) for r in runs)}")
PY
)
  printf '%-12s wall %6.2f s (%5.2f)  cpu %6.2f s (%5.2f)  peak RSS %6d KiB\n' "$name" "$t" "$tmin" "$c" "$cmin" "$rss"
  eval "t_$v=$t; c_$v=$c; rss_$v=$rss"
done

# (a tiny tree can take 0.00 s: no ratio then)
ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
echo
echo "ratios of medians, wall (cpu = user+sys of every process, steadier on a shared machine):"
echo "ours/zstd|tar    (zstd image): $(ratio "$t_ours_zstd" "$t_zstd_tar")x ($(ratio "$c_ours_zstd" "$c_zstd_tar")x)   (target <= 0.9x wall on a tmpfs)"
if [ -n "${KUBESLOT_BASELINE_UNPACK:-}" ]; then
  echo "ours/baseline    (zstd image): $(ratio "$t_ours_zstd" "$t_base_zstd")x ($(ratio "$c_ours_zstd" "$c_base_zstd")x)   (cpu target <= 1.1x)"
  echo "baseline/zstd|tar (zstd image): $(ratio "$t_base_zstd" "$t_zstd_tar")x ($(ratio "$c_base_zstd" "$c_zstd_tar")x)"
fi
echo "command/zstd|tar (zstd image, blobs in store): $(ratio "$t_cmd_zstd" "$t_zstd_tar")x ($(ratio "$c_cmd_zstd" "$c_zstd_tar")x)"
echo "ours/gzip|tar    (gzip image): $(ratio "$t_ours_gzip" "$t_gzip_tar")x ($(ratio "$c_ours_gzip" "$c_gzip_tar")x)"
echo "ours/umoci       (gzip image): $(ratio "$t_ours_gzip" "$t_umoci_gzip")x ($(ratio "$c_ours_gzip" "$c_umoci_gzip")x)"
echo "our peak RSS: gzip $(( rss_ours_gzip / 1024 )) MiB, zstd $(( rss_ours_zstd / 1024 )) MiB, command $(( rss_cmd_zstd / 1024 )) MiB   (target < 64 MiB)"
