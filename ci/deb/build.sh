#!/usr/bin/env bash
# Builds the Debian package of kubeslot-activator with dpkg-deb (no
# debhelper, no cargo-deb): the binary at /usr/bin, the shipped units under
# /usr/lib/systemd/system (enabled on installation by the maintainer
# scripts beside this file), a documented example config and README.Debian
# under /usr/share/doc/kubeslot-activator.
#
#   ci/deb/build.sh [--binary FILE] [--out FILE] [--compress xz|gzip]
#
# Without --binary it builds the release binary (cargo build --release).
# The binary is packaged stripped of its symbol table and debug sections
# (strip --strip-all, as Debian's dh_strip does): the release profile
# already strips it, and a debug binary handed in (the e2e's) is stripped
# here, so no package carries a .symtab (activator/tests/package.rs).
# --compress gzip (xz by default) for a quick test package: xz takes 11 s
# on an 18 MB debug binary here, gzip 1 s.
# The version is the crate's, the architecture dpkg's; Depends names the
# glibc the binary needs (its newest GLIBC_ symbol version, and 2.36 when
# its relocations are packed, DT_RELR). With the same
# binary the package is byte for byte the same: owners root, modes from
# umask 022 whatever the caller's, mtimes SOURCE_DATE_EPOCH (default: the
# last commit's time).
set -euo pipefail
# directories made on the way (install -D, mkdir) take their mode from the
# umask: fixed, so two builds are identical anywhere
umask 022
cd "$(dirname "$0")/../.."
REPO=$PWD

binary=""
out=""
compress=xz
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --compress) compress=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ci/deb/build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in dpkg-deb dpkg objdump strip; do
  command -v "$tool" >/dev/null ||
    { echo "ci/deb/build.sh: $tool is missing: apt-get install -y dpkg binutils" >&2; exit 1; }
done
if [ -z "$binary" ]; then
  cargo build --release --locked -p kubeslot-activator >&2
  binary=$REPO/target/release/kubeslot-activator
fi
[ -x "$binary" ] || { echo "ci/deb/build.sh: $binary is not an executable" >&2; exit 1; }

version=$(cargo pkgid -p kubeslot-activator | sed 's/.*[@#]//')
arch=$(dpkg --print-architecture)
out=${out:-$REPO/target/deb/kubeslot-activator_${version}_${arch}.deb}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)}

# The newest glibc symbol version the binary uses: the libc6 it needs.
glibc=$(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
headers=$(objdump -p "$binary")
# Packed relative relocations (DT_RELR, activator/build.rs) need a loader
# that knows them: glibc 2.36 (the binary names GLIBC_ABI_DT_RELR).
if grep -q 'GLIBC_ABI_DT_RELR' <<<"$headers"; then
  glibc=$(printf '%s\n' "$glibc" 2.36 | sed '/^$/d' | sort -V | tail -n1)
fi
depends="systemd (>= 247), systemd-container"
[ -n "$glibc" ] && depends="libc6 (>= $glibc), $depends"
if grep -q 'NEEDED *libgcc_s' <<<"$headers"; then depends="libgcc-s1, $depends"; fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
doc=$pkg/usr/share/doc/kubeslot-activator
install -d -m 0755 "$pkg/usr/bin"
strip --strip-all -o "$pkg/usr/bin/kubeslot-activator" "$binary"
chmod 0755 "$pkg/usr/bin/kubeslot-activator"
for unit in kubeslot-activator.service kubeslot-activator.path \
  kubeslot-activator-follow.service kubeslot-activator-follow.timer; do
  install -D -m 0644 "$REPO/activator/units/$unit" "$pkg/usr/lib/systemd/system/$unit"
done
install -D -m 0644 "$REPO/activator/dist/activator.example.json" "$doc/examples/activator.json"
install -D -m 0644 "$REPO/activator/dist/README.Debian" "$doc/README.Debian"
cat >"$doc/copyright" <<EOC
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: kubeslot

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
EOC
chmod 0644 "$doc/copyright"
mkdir -p "$pkg/DEBIAN"
for script in postinst prerm postrm; do
  install -m 0755 "$REPO/ci/deb/$script" "$pkg/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<EOC
Package: kubeslot-activator
Version: $version
Architecture: $arch
Maintainer: kubeslot maintainers <kubeslot@users.noreply.github.com>
Installed-Size: $size
Depends: $depends
Section: admin
Priority: optional
Description: activate signed kubeslot node images in systemd-nspawn slots
 kubeslot-activator verifies a signed, reproducible Kubernetes node image
 (fail closed), unpacks it into the inactive of two systemd-nspawn machines
 (kube1, kube2), renders the host's files, flips the node to it behind a
 health gate and commits or rolls back. Crash-safe; nothing from an image
 runs on the host.
EOC
(cd "$pkg" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/md5sums"
find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$(dirname "$out")"
case $compress in xz|gzip) ;; *) echo "ci/deb/build.sh: --compress xz or gzip, not $compress" >&2; exit 2 ;; esac
dpkg-deb --root-owner-group "-Z$compress" --build "$pkg" "$out" >/dev/null
echo "$out"
