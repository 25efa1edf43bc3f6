#!/usr/bin/env bash
# The activator runs as root on every node: how big it is and how many crates
# it is made of, beside the builder and the reference tools that would do its
# job (skopeo to pull, umoci to unpack), measured in one run. Prints numbers
# for people; asserts nothing.
#
#   ci/bench/activator-size.sh
#
# The activator's figure is the file hosts get: /usr/bin/kubeslot-activator
# taken out of the Debian package (ci/deb/build.sh, then dpkg-deb -x); the
# binary as cargo built it is shown beside it, with whether it kept a symbol
# table (the release profile strips it: both figures are then the same).
# The builder (shipped as a plain binary) and the reference tools are
# measured stripped of symbols.
#
# The release binaries by default (built first). KUBESLOT_BIN_DIR=DIR
# measures the binaries in DIR instead (ci/bench/smoke.sh: target/debug,
# built by the tests; a debug build is larger, so its figures are no
# release's).
set -euo pipefail
cd "$(dirname "$0")/../.."

need() { command -v "$1" >/dev/null || { echo "activator-size.sh: $1 is missing: apt-get install -y $2" >&2; exit 1; }; }
need skopeo skopeo
need umoci umoci
need strip binutils
need readelf binutils
need dpkg-deb dpkg

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$KUBESLOT_BIN_DIR
else
  cargo build --release -q --locked -p kubeslot-activator -p kubeslot-builder
  bin=target/release
fi
for b in kubeslot-activator kubeslot-builder; do
  [ -x "$bin/$b" ] || { echo "activator-size.sh: $bin/$b is missing (cargo build -p $b)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# size FILE: bytes of FILE stripped of symbols (as a distro would ship it)
size() { strip -o "$work/s" "$1" && stat -c %s "$work/s"; }
# crates PKG: the third-party crates PKG links (normal dependencies only)
crates() {
  cargo tree --locked -q -p "$1" -e normal --prefix none |
    sed 's/ (.*//' | sort -u | grep -vc '^kubeslot-'
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# The package of the binary measured, and the file it installs.
deb=$(ci/deb/build.sh --binary "$bin/kubeslot-activator" --compress gzip --out "$work/activator.deb")
dpkg-deb -x "$deb" "$work/deb"
act=$(stat -c %s "$work/deb/usr/bin/kubeslot-activator")
built=$(stat -c %s "$bin/kubeslot-activator")
symtab=none
sections=$(readelf -S -W "$bin/kubeslot-activator")   # (whole: `| grep -q` and pipefail race)
if grep -q '] \.symtab ' <<<"$sections"; then symtab=present; fi
bld=$(size "$bin/kubeslot-builder")
sko=$(size "$(command -v skopeo)")
umo=$(size "$(command -v umoci)")
# (assignments, so that a failing cargo tree fails the bench)
act_crates=$(crates kubeslot-activator)
bld_crates=$(crates kubeslot-builder)
echo "kubeslot binaries from $bin"
echo "kubeslot-activator as built: $built bytes (symbol table: $symtab); in the .deb: $act bytes"
printf '%-34s %10s %8s\n' "binary (as shipped)" size crates
printf '%-34s %10s %8s\n' "kubeslot-activator (.deb)" "$(mib "$act")" "$act_crates"
printf '%-34s %10s %8s\n' "kubeslot-builder (stripped)" "$(mib "$bld")" "$bld_crates"
printf '%-34s %10s %8s\n' "skopeo + umoci (Debian, stripped)" "$(mib $((sko + umo)))" -
awk -v a="$act" -v r="$((sko + umo))" 'BEGIN { printf "activator / (skopeo + umoci): %.2fx\n", a / r }'
