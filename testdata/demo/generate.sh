#!/usr/bin/env bash
# Regenerates the offline demo's stand-in artifacts: a tiny base rootfs per
# architecture and files shaped like the upstream release downloads (raw
# kubelet/kubectl/runc, containerd/CNI/crictl tarballs), laid out under
# mirror/ with the upstream URL paths so `[downloads] base_url` maps them.
# The outputs are committed and pinned by sha256 in testdata/recipes/demo.toml;
# rerun this only to change them, then update the pins from SHA256SUMS.
set -euo pipefail
cd "$(dirname "$0")"
export LC_ALL=C TZ=UTC
epoch=1700000000
tarflags=(--sort=name "--mtime=@$epoch" --owner=0 --group=0 --numeric-owner --format=gnu)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

stand_in() { # NAME VERSION ARCH: a script that behaves like `NAME --version`
  printf '#!/bin/sh\n# kubeslot demo stand-in for %s %s (%s)\necho "%s version v%s %s"\n' "$1" "$2" "$3" "$1" "$2" "$3"
}

rm -rf base mirror
mkdir -p base
for arch in amd64 arm64; do
  r=$tmp/rootfs-$arch
  mkdir -p "$r"/{etc,usr/bin,usr/lib/systemd/system,var/lib,tmp,root}
  printf 'PRETTY_NAME="kubeslot demo base"\nID=demo\nVERSION_ID=1\n' >"$r/etc/os-release"
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
  printf '#!/bin/sh\necho demo shell %s\n' "$arch" >"$r/usr/bin/sh"
  printf '#!/bin/sh\necho demo su\n' >"$r/usr/bin/su"
  ln "$r/usr/bin/sh" "$r/usr/bin/dash"          # a hard link
  ln -s usr/bin "$r/bin"                          # a symlink
  chmod 0755 "$r/usr/bin/sh"; chmod 4755 "$r/usr/bin/su"; chmod 1777 "$r/tmp"; chmod 0700 "$r/root"
  touch -d @1800000000 "$r/etc/passwd"            # newer than the epoch: gets clamped
  tar "${tarflags[@]}" -C "$r" -c . | gzip -n -9 >"base/rootfs-$arch.tar.gz"
done

k8s=mirror/release
for v in 1.36.4 1.36.3; do
  for arch in amd64 arm64; do
    d=$k8s/v$v/bin/linux/$arch; mkdir -p "$d"
    stand_in kubelet "$v" "$arch" >"$d/kubelet"
    stand_in kubectl "$v" "$arch" >"$d/kubectl"
  done
done
for arch in amd64 arm64; do
  v=2.3.4; d=mirror/containerd/containerd/releases/download/v$v; mkdir -p "$d" "$tmp/ctrd-$arch/bin"
  for b in containerd containerd-shim-runc-v2 ctr; do stand_in "$b" "$v" "$arch" >"$tmp/ctrd-$arch/bin/$b"; done
  chmod 0755 "$tmp/ctrd-$arch/bin/"*
  tar "${tarflags[@]}" -C "$tmp/ctrd-$arch" -c bin | gzip -n -9 >"$d/containerd-$v-linux-$arch.tar.gz"

  v=1.4.3; d=mirror/opencontainers/runc/releases/download/v$v; mkdir -p "$d"
  stand_in runc "$v" "$arch" >"$d/runc.$arch"

  v=1.9.1; d=mirror/containernetworking/plugins/releases/download/v$v; mkdir -p "$d" "$tmp/cni-$arch"
  for b in bridge host-local loopback portmap; do stand_in "$b" "$v" "$arch" >"$tmp/cni-$arch/$b"; done
  chmod 0755 "$tmp/cni-$arch/"*
  tar "${tarflags[@]}" -C "$tmp/cni-$arch" -c . | gzip -n -9 >"$d/cni-plugins-linux-$arch-v$v.tgz"

  v=1.36.0; d=mirror/kubernetes-sigs/cri-tools/releases/download/v$v; mkdir -p "$d" "$tmp/crictl-$arch"
  stand_in crictl "$v" "$arch" >"$tmp/crictl-$arch/crictl"; chmod 0755 "$tmp/crictl-$arch/crictl"
  tar "${tarflags[@]}" -C "$tmp/crictl-$arch" -c crictl | gzip -n -9 >"$d/crictl-v$v-linux-$arch.tar.gz"
done
find base mirror -type f | sort | xargs sha256sum >SHA256SUMS
cat SHA256SUMS
