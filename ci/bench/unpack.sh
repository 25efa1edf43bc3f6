#!/usr/bin/env bash
# shellcheck disable=SC2154 # t_*, c_*, rss_* are assigned by run() through eval
# Unpack benchmark: one Debian rootfs image (~300 MB uncompressed, from
# ci/lib/debian-rootfs.sh), the same layer blobs unpacked by
#   * the activator's unpacker alone (image/examples/unpack_layout.rs, release),
#   * `kubeslot-activator unpack oci:DIR:TAG` (resolve, trust check, blob store
#     with its blobs already present, unpack into staging, rename),
#   * `umoci unpack` (gzip image),
#   * `gzip -dc | tar -x` and `zstd -dc | tar -x` (the floor: no checks at all),
# each followed by a sync of the target's filesystem (the unpacker ends with
# syncfs, so the references pay for writeback too). Prints wall times, the
# ratios against the references and the unpacker's peak RSS, from one run.
#
#   ci/bench/unpack.sh [PKG,PKG...]      (default: a node-like package set)
#   REPEAT=3 ci/bench/unpack.sh          (best of 3 per contender)
#   ci/bench/unpack.sh --rootfs TAR      (TAR in place of the Debian rootfs;
#                                         ci/bench/smoke.sh passes a small one)
#
# KUBESLOT_BIN_DIR=DIR takes kubeslot-activator and examples/unpack_layout,
# examples/make_layout from DIR (target/debug after the tests) instead of
# building them (release).
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

# run NAME CMD...: fresh target, sync before, time CMD + sync -f target;
# $REPEAT times (default 1), keeping the fastest time and the largest RSS
# (the machine is shared: the minimum is the least disturbed run).
run() {
  local name=$1; shift
  local best='' best_cpu='' worst_rss=0 secs rss usr sys
  for _ in $(seq "${REPEAT:-1}"); do
    rm -rf "$work/out"; mkdir "$work/out"; sync
    /usr/bin/time -f "%e %M %U %S" -o "$work/$name.time" bash -c "$* && sync -f $work/out" >/dev/null 2>"$work/$name.err" \
      || { echo "$name failed:" >&2; cat "$work/$name.err" >&2; exit 1; }
    read -r secs rss usr sys < "$work/$name.time"
    cpu=$(python3 -c "print(f'{$usr + $sys:.2f}')")
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(not $secs < $best)"; then best=$secs; fi
    if [ -z "$best_cpu" ] || python3 -c "import sys; sys.exit(not $cpu < $best_cpu)"; then best_cpu=$cpu; fi
    [ "$rss" -gt "$worst_rss" ] && worst_rss=$rss
  done
  printf '%-12s wall %7.2f s  cpu %7.2f s  peak RSS %6d KiB\n' "$name" "$best" "$best_cpu" "$worst_rss"
  eval "t_${name//-/_}=$best; c_${name//-/_}=$best_cpu; rss_${name//-/_}=$worst_rss"
}

run ours-gzip   "$bin/unpack_layout $work/gz:t $work/out"
run ours-zstd   "$bin/unpack_layout $work/zst:t $work/out"
run gzip-tar    "gzip -dc $gzblob | tar -x -C $work/out"
run zstd-tar    "zstd -dc $zstblob | tar -x -C $work/out"
# The command's content store gets the blobs once, untimed; the timed run
# reuses them (what a host does when it re-stages a known image).
mkdir -p "$work/root"
echo '{"trust": {"allow_unsigned": true}}' > "$work/cfg.json"
"$activator" unpack --config "$work/cfg.json" --root "$work/root" "oci:$work/zst:t" "$work/warm" >/dev/null 2>&1 \
  || { echo "kubeslot-activator unpack failed" >&2; exit 1; }
rm -rf "$work/warm"
run cmd-zstd    "rmdir $work/out && $activator unpack --config $work/cfg.json --root $work/root oci:$work/zst:t $work/out"
rm -rf "$work/bundle"
run umoci-gzip  "rm -rf $work/bundle && umoci unpack --image $work/gz:t $work/bundle"

# (a tiny tree can take 0.00 s: no ratio then)
ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
echo
echo "ratios, wall (cpu = user+sys of every process, steadier on a shared machine):"
echo "ours/zstd|tar    (zstd image): $(ratio "$t_ours_zstd" "$t_zstd_tar")x ($(ratio "$c_ours_zstd" "$c_zstd_tar")x)   (target <= 1.2x)"
echo "command/zstd|tar (zstd image, blobs in store): $(ratio "$t_cmd_zstd" "$t_zstd_tar")x ($(ratio "$c_cmd_zstd" "$c_zstd_tar")x)"
echo "ours/gzip|tar    (gzip image): $(ratio "$t_ours_gzip" "$t_gzip_tar")x ($(ratio "$c_ours_gzip" "$c_gzip_tar")x)"
echo "ours/umoci       (gzip image): $(ratio "$t_ours_gzip" "$t_umoci_gzip")x ($(ratio "$c_ours_gzip" "$c_umoci_gzip")x)"
echo "our peak RSS: gzip $(( rss_ours_gzip / 1024 )) MiB, zstd $(( rss_ours_zstd / 1024 )) MiB, command $(( rss_cmd_zstd / 1024 )) MiB   (target < 64 MiB)"
