#!/usr/bin/env bash
# Prints the path of a cached Debian bookworm rootfs tarball made by
# mmdebstrap from this machine's Debian mirror (ci/lib/debian-mirror.sh:
# its apt sources, or KUBESLOT_DEBIAN_MIRROR), building it first
# when it is missing. Tests and benchmarks share it, so a rootfs is built once
# per machine and package list.
#
#   ci/lib/debian-rootfs.sh [--suite bookworm] [--variant minbase] PKG[,PKG...]
#
# A package written PKG/SUITE comes from another suite of the same mirror
# (e.g. containerd/forky on a trixie base): that suite is added to the
# sources, and the base suite stays apt's default release, so everything
# else (and every dependency the base can satisfy) comes from the base.
#
# The suite defaults to bookworm (this machine's release); another Debian
# suite (trixie, or testing: forky for the e2e node's containerd 2) comes
# from the same mirror, checked against the machine's debian-archive-keyring.
# Release files are not refused for their Valid-Until: testing's InRelease
# expires a week after it is signed, and a mirror that is a dated snapshot
# serves an expired one (the signature is still checked). The cache key is a hash of the suite, the variant,
# the sorted package list and this script, so a changed list or recipe rebuilds. The cache directory is
# $KUBESLOT_TEST_CACHE (default /var/cache/kubeslot-test). The tar is written
# to a temp name and renamed, so a killed build never leaves a half file.
set -euo pipefail

suite=bookworm
variant=minbase
while :; do
  case ${1:-} in
    --suite) suite=$2; shift 2 ;;
    --variant) variant=$2; shift 2 ;;
    *) break ;;
  esac
done
pkgs=$(printf '%s' "${1:-}" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)

command -v mmdebstrap >/dev/null || {
  echo "debian-rootfs: mmdebstrap is not installed: apt-get install -y mmdebstrap (or ci/setup.sh, as root)" >&2
  exit 1
}

# The machine's Debian mirror (its apt sources, or KUBESLOT_DEBIAN_MIRROR
# where those name none: never written in the repo).
mirror=$("$(dirname "$0")/debian-mirror.sh")
# Every suite is checked against Debian's archive keys by name (signed-by),
# not against whatever this machine's apt trusts: on an Ubuntu machine apt
# trusts Ubuntu's keys only. The same path exists in the tree (apt depends
# on debian-archive-keyring), so the tree's apt keeps checking them.
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -s "$keyring" ] || {
  echo "debian-rootfs: no $keyring: apt-get install -y debian-archive-keyring (or ci/setup.sh, as root)" >&2
  exit 1
}

cache=${KUBESLOT_TEST_CACHE:-/var/cache/kubeslot-test}
mkdir -p "$cache"
key=$( { echo "$suite"; echo "$variant"; echo "$pkgs"; cat "$0"; } | sha256sum | cut -c1-16)
out="$cache/rootfs-$suite-$variant-$key.tar"
if [ ! -s "$out" ]; then
  tmp="$out.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  echo "debian-rootfs: building $out ($suite, $variant, ${pkgs:-no extra packages})" >&2
  sources=("deb [signed-by=$keyring] $mirror $suite main")
  for extra in $(printf '%s' "$pkgs" | tr ',' '\n' | sed -n 's|^[^/]*/||p' | sort -u); do
    sources+=("deb [signed-by=$keyring] $mirror $extra main")
  done
  SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant="$variant" \
    --aptopt='Acquire::Check-Valid-Until "false"' --aptopt="APT::Default-Release \"$suite\"" \
    ${pkgs:+--include="$pkgs"} --format=tar "$suite" "$tmp" "${sources[@]}" >&2
  mv -f "$tmp" "$out"
  trap - EXIT
fi
echo "$out"
