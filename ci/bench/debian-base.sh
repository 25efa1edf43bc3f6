#!/usr/bin/env bash
# A Debian package base from its lock against plain mmdebstrap, from one run.
#
#   ci/bench/debian-base.sh [--release] [--packages PKG,PKG...]
#
# --packages replaces the recipe's package list (smoke size, ci/bench/smoke.sh:
# `--packages base-files`, the minbase alone, Debian's floor).
#
# Locks testdata/recipes/bookworm-base.toml (amd64) against this machine's
# Debian mirror (ci/lib/debian-mirror.sh: its apt sources, or
# KUBESLOT_DEBIAN_MIRROR), warms the builder's .deb cache
# with one `base` run, then times, each once:
#   ours: `kubeslot-builder base` from the warm cache (local repository,
#         mmdebstrap, normalisation into a deterministic tar);
#   ref:  `mmdebstrap --variant=essential --include=<the same packages>`
#         straight from the machine's mirror (what a build without a lock
#         runs: it downloads every time);
#   local: the same mmdebstrap from a local repository of the cached .debs
#         (our overhead: repository, normalisation).
# Prints seconds and the ratios ref/ours and local/ours (>1: ours faster).
# KUBESLOT_BIN_DIR=DIR takes kubeslot-builder from DIR (target/debug after
# the tests) instead of building it.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=debug packages=''
while [ $# -gt 0 ]; do
  case $1 in
    --release) profile=release; shift ;;
    --packages) packages=$2; shift 2 ;;
    *) echo "debian-base.sh: unknown argument $1 (usage: ci/bench/debian-base.sh [--release] [--packages PKG,PKG...])" >&2; exit 2 ;;
  esac
done
[[ $packages =~ ^[a-z0-9.+,-]*$ ]] || { echo "debian-base.sh: --packages $packages: Debian package names, comma-separated" >&2; exit 2; }
for t in mmdebstrap apt-ftparchive; do
  command -v "$t" >/dev/null || { echo "bench: $t is not installed: apt-get install -y mmdebstrap apt-utils" >&2; exit 1; }
done
mirror=$(ci/lib/debian-mirror.sh)

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$(cd "$KUBESLOT_BIN_DIR" && pwd)/kubeslot-builder profile=$KUBESLOT_BIN_DIR
else
  # shellcheck disable=SC2046 # an empty word for the dev profile, `--release` otherwise
  cargo build --quiet --locked $([ "$profile" = release ] && echo --release) -p kubeslot-builder
  bin=$PWD/target/$profile/kubeslot-builder
fi
[ -x "$bin" ] || { echo "bench: $bin is missing (cargo test --workspace --no-run builds it)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
sed 's|^platforms = .*|platforms = ["linux/amd64"]|' testdata/recipes/bookworm-base.toml > "$work/r.toml"
if [ -n "$packages" ]; then
  list=$(printf '%s' "$packages" | sed 's/[^,][^,]*/"&"/g; s/,/, /g')
  sed -i "s|^packages = .*|packages = [$list]|" "$work/r.toml"
  grep -qxF "packages = [$list]" "$work/r.toml" || { echo "debian-base.sh: the recipe has no packages line to replace" >&2; exit 1; }
fi
"$bin" --progress quiet lock "$work/r.toml" --mirror "$mirror" >/dev/null
"$bin" --progress quiet --cache "$work/cache" base "$work/r.toml" --mirror "$mirror" -o "$work/warm.tar" >/dev/null
names=$(sed -n 's/^name = "\(.*\)"/\1/p' "$work/r.lock" | paste -sd, -)
count=$(sed -n 's/^name = "\(.*\)"/\1/p' "$work/r.lock" | wc -l)

now() { date +%s.%N; }
t0=$(now)
"$bin" --progress quiet --cache "$work/cache" base "$work/r.toml" --mirror "$mirror" -o "$work/ours.tar" >/dev/null
t1=$(now)
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential --architectures=amd64 \
  --include="$names" --aptopt='APT::Install-Recommends "false"' --format=tar \
  bookworm "$work/ref.tar" "$mirror" 2>/dev/null
t2=$(now)
mkdir "$work/repo"
i=0
for f in "$work"/cache/sha256/*; do i=$((i + 1)); ln "$f" "$work/repo/$i.deb"; done
(cd "$work/repo" && apt-ftparchive packages . > Packages 2>/dev/null &&
  apt-ftparchive -oAPT::FTPArchive::Release::Suite=bookworm release . > Release)
t3=$(now)
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential --architectures=amd64 \
  --include="$names" --aptopt='APT::Install-Recommends "false"' --format=tar \
  bookworm "$work/local.tar" "deb [trusted=yes] copy://$work/repo ./" 2>/dev/null
t4=$(now)
local=$(awk -v a="$t3" -v b="$t4" 'BEGIN { printf "%.1f", b - a }')
ours=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
ref=$(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.1f", b - a }')
same=$(cmp -s "$work/warm.tar" "$work/ours.tar" && echo "identical" || echo "DIFFERENT")
echo "debian base, bookworm amd64, $count locked packages ($profile build)"
printf 'ours (base, warm cache): %6s s   tar %s MB, %s to the warm-up run\n' "$ours" \
  "$(( $(stat -c %s "$work/ours.tar") / 1000000 ))" "$same"
printf 'ref  (mmdebstrap):       %6s s   tar %s MB\n' "$ref" "$(( $(stat -c %s "$work/ref.tar") / 1000000 ))"
printf 'local (mmdebstrap, local repo): %s s\n' "$local"
awk -v o="$ours" -v r="$ref" -v l="$local" \
  'BEGIN { printf "ratio ref/ours: %.2f   local/ours: %.2f\n", r / o, l / o }'
