# shellcheck shell=bash
# REPO is set by ci/e2e/run.sh, which sources this file; what it assigns
# (REF_vN, DIGEST_vN, PLATFORM_DIGEST) is read by activator.sh.
# shellcheck disable=SC2153,SC2034
# The e2e node images v1 to v7, sourced by ci/e2e/run.sh.
#
# Six images over one base: a Debian rootfs (ci/lib/debian-rootfs.sh, the
# node package list: trixie with containerd 2, runc and the CNI plugins from
# testing), a config layer (containerd's production config, the kubelet unit
# and config, the test-only units and CNI config) and a Kubernetes layer
# holding only the fixture kubelet (and the same binary as the TEST-ONLY
# crictl). A seventh, "nocni", is v1's without the CNI config
# (runtime_not_ready_fails_gate). v1 and v2 differ only in the Kubernetes layer (another kubelet
# version); v3's kubelet never turns healthy; v7's withholds the Node's Ready for 20 s; v4 is a fourth version (its
# fresh Kubernetes layer is the one the tamper scenario corrupts).
#
# The product path only: `kubeslot-builder build` makes them from
# testdata/e2e/node.toml.in, `push` uploads them, `keygen` and `sign` sign
# them and `copy` exports an air-gap archive. An independent signer
# (ci/e2e/openssl-sign.py) is its own scenario (`openssl_signer`).
#
# Sets: IMAGE_LAYOUT (an oci: layout dir with the
# tags v1..v7), and after images_push REF_v1..REF_v7 (tag references in the
# local registry), DIGEST_v1..DIGEST_v7 (what each tag resolves to there) and
# REF_UNSIGNED (v2's content under a name that has no signature).

IMAGE_REPO=kubeslot/e2e-node
# Set by images_push / images_sign, read by the scenarios.
E2E_VERSIONS=(v1 v2 v3 v4 v5 v6 v7)
REF_v1="" REF_v2="" REF_v3="" REF_v4="" REF_v5="" REF_v6="" REF_v7="" REF_UNSIGNED="" REF_nocni="" DIGEST_nocni=""
DIGEST_v1="" DIGEST_v2="" DIGEST_v3="" DIGEST_v4="" DIGEST_v5="" DIGEST_v6="" DIGEST_v7=""
export REF_v1 REF_v2 REF_v3 REF_v4 REF_v5 REF_v6 REF_v7 REF_UNSIGNED REF_nocni DIGEST_nocni DIGEST_v1 DIGEST_v2 DIGEST_v3 DIGEST_v4 DIGEST_v5 DIGEST_v6 DIGEST_v7
# Tag digest -> linux/amd64 manifest digest (equal for single-manifest images).
declare -A PLATFORM_DIGEST=()

# The small container images pods run (a busybox-static rootfs, built here):
# REGISTRY/e2e/pause:3.10.2 (the e2e images' baked sandbox image; sleeps
# until SIGTERM; also as REGISTRY/pause:3.10.2, what a mirror of
# registry.k8s.io serves) and
# REGISTRY/e2e/hello:1 (prints a line). Set by test_images_build.
PAUSE_DIGEST="" HELLO_DIGEST=""

# test_images_build: both images with umoci from Debian's busybox-static,
# pushed to the local registry; PAUSE_DIGEST and HELLO_DIGEST are their
# manifest digests there. Also the CNI plugins tarball the node images
# carry in /opt/cni/bin (Debian's plugins, from the node rootfs).
test_images_build() {
  local dir=$WORK/images/test root layout tag
  root=$dir/rootfs layout=$dir/layout
  rm -rf "$dir"; mkdir -p "$root/bin" "$root/etc" "$root/tmp"
  install -m 0755 /bin/busybox "$root/bin/busybox"
  for tag in sh sleep echo cat ping wget ip hostname; do ln -s busybox "$root/bin/$tag"; done
  echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
  tar -C "$root" --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner -cf "$dir/rootfs.tar" .
  umoci init --layout "$layout"
  umoci new --image "$layout:empty"
  umoci raw add-layer --image "$layout:empty" --tag busybox "$dir/rootfs.tar"
  # (it ends on SIGTERM as the real pause does: a sandbox's PID 1 that
  # ignored it held every node machine's shutdown for systemd's 90 s)
  umoci config --image "$layout:busybox" --tag pause \
    --config.entrypoint /bin/sh --config.entrypoint -c \
    --config.entrypoint 'trap "exit 0" TERM INT; sleep 2147483647 & wait'
  umoci config --image "$layout:busybox" --tag hello \
    --config.cmd /bin/sh --config.cmd -c --config.cmd 'echo hello from an e2e pod'
  skopeo copy --quiet --dest-tls-verify=false "oci:$layout:pause" "docker://$REGISTRY/e2e/pause:3.10.2"
  # (and as registry.k8s.io's mirror has it: a pull the pod outer's nodes
  # must never make would succeed, and only the mirror's log would tell)
  skopeo copy --quiet --dest-tls-verify=false "oci:$layout:pause" "docker://$REGISTRY/pause:3.10.2"
  skopeo copy --quiet --dest-tls-verify=false "oci:$layout:hello" "docker://$REGISTRY/e2e/hello:1"
  PAUSE_DIGEST=sha256:$(skopeo inspect --tls-verify=false --raw "docker://$REGISTRY/e2e/pause:3.10.2" | sha256sum | cut -d' ' -f1)
  HELLO_DIGEST=sha256:$(skopeo inspect --tls-verify=false --raw "docker://$REGISTRY/e2e/hello:1" | sha256sum | cut -d' ' -f1)
  log "test images: $REGISTRY/e2e/pause:3.10.2 ($PAUSE_DIGEST), $REGISTRY/e2e/hello:1 ($HELLO_DIGEST)"
  # Debian's CNI plugins, as an upstream-shaped tarball (plugins at the top).
  mkdir -p "$dir/cni"
  tar -C "$dir/cni" -xf "$NODE_TAR" --strip-components=4 \
    ./usr/lib/cni/bridge ./usr/lib/cni/host-local ./usr/lib/cni/loopback ./usr/lib/cni/portmap
  CNI_TGZ=$dir/cni-plugins.tgz
  tar -C "$dir/cni" --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner -cf - . | gzip -n >"$CNI_TGZ"
}

# images_stage: what node_tree_fill copies into a node tree made by hand:
# the recipe's config group (units and their enable links, the kubelet and
# containerd config, the import unit, the CNI plugins), less the baked pause
# image, which only kubeslot-builder makes; and each version's kubelet.
images_stage() {
  local stage=$WORK/images/stage units=$E2E_TESTDATA/node/units files=$REPO/recipes/files v u
  rm -rf "$stage"
  mkdir -p "$stage/config/etc/systemd/system/multi-user.target.wants" \
    "$stage/config/etc/kubernetes/kubelet/config.d" "$stage/config/etc/tmpfiles.d" \
    "$stage/config/etc/containerd" "$stage/config/usr/libexec/kubeslot" "$stage/config/opt/cni/bin"
  install -m 0644 "$units/kubelet.service" "$units/kubeslot-test-cgroup-rw.service" \
    "$units/kubeslot-test-kernel-defaults.service" "$files/kubeslot-images.service" \
    "$stage/config/etc/systemd/system/"
  for u in kubelet kubeslot-images kubeslot-test-cgroup-rw kubeslot-test-kernel-defaults; do
    ln -s "/etc/systemd/system/$u.service" "$stage/config/etc/systemd/system/multi-user.target.wants/$u.service"
  done
  install -m 0644 "$files/kubelet-config.yaml" "$stage/config/etc/kubernetes/kubelet/config.yaml"
  install -m 0644 "$files/kubelet-config.d-README" "$stage/config/etc/kubernetes/kubelet/config.d/README"
  install -m 0644 "$files/kmsg.conf" "$stage/config/etc/tmpfiles.d/kmsg.conf"
  install -D -m 0644 "$files/journald-no-kmsg.conf" "$stage/config/etc/systemd/journald.conf.d/50-kubeslot-no-kmsg.conf"
  install -m 0644 "$files/containerd-config.toml" "$stage/config/etc/containerd/config.toml"
  install -m 0755 "$files/import-images" "$stage/config/usr/libexec/kubeslot/import-images"
  mkdir -p "$stage/config/usr/local/sbin" "$stage/config/etc/cni/net.d"
  # the TEST-ONLY parts node.toml.in adds (runc's path, the CNI config)
  install -m 0755 "$E2E_TESTDATA/node/runc" "$stage/config/usr/local/sbin/runc"
  install -m 0644 "$E2E_TESTDATA/node/10-e2e-bridge.conflist" "$stage/config/etc/cni/net.d/"
  tar -C "$stage/config/opt/cni/bin" -xzf "$CNI_TGZ"
  for v in "${E2E_VERSIONS[@]}"; do
    mkdir -p "$stage/kubernetes-$v/usr/bin"
    install -m 0755 "$WORK/kubelet/$v/kubelet" "$stage/kubernetes-$v/usr/bin/kubelet"
    install -m 0755 "$WORK/kubelet/$v/kubelet" "$stage/kubernetes-$v/usr/bin/crictl"
  done
}

images_build() {
  mkdir -p "$WORK/images"
  images_stage
  IMAGE_LAYOUT=$WORK/images/layout
  images_build_with_builder
  log "images ${E2E_VERSIONS[*]} built by kubeslot-builder into oci:$IMAGE_LAYOUT"
}

# recipe_for VERSION: the node recipe of one version, from the template. The
# base tarball and the kubelet are pinned by the sha256 of the files here;
# the kubelet component's version is the one the fixture kubelet says (the
# image's dev.kubeslot.version.kubelet, which the cluster gate compares with
# the Node's kubeletVersion).
recipe_for() {
  local v=$1 recipe=$WORK/images/node-$1.toml kv
  kv=$("$WORK/kubelet/$v/kubelet" --version | cut -d' ' -f2)
  sed -e "s|@BASE_TAR@|$NODE_TAR|g" \
    -e "s|@KUBELET_VERSION@|$kv|g" \
    -e "s|@BASE_SHA256@|$(sha256sum "$NODE_TAR" | cut -d' ' -f1)|g" \
    -e "s|@TAG@|$v|g" \
    -e "s|@KUBELET_SHA256@|$(sha256sum "$WORK/kubelet/$v/kubelet" | cut -d' ' -f1)|g" \
    -e "s|@KUBELET@|$WORK/kubelet/$v/kubelet|g" \
    -e "s|@UNITS@|$E2E_TESTDATA/node/units|g" \
    -e "s|@RECIPE_FILES@|$REPO/recipes/files|g" \
    -e "s|@CNI_TGZ@|$CNI_TGZ|g" \
    -e "s|@CNI_SHA256@|$(sha256sum "$CNI_TGZ" | cut -d' ' -f1)|g" \
    -e "s|@REGISTRY@|$REGISTRY|g" \
    -e "s|@PAUSE_DIGEST@|$PAUSE_DIGEST|g" \
    "$E2E_TESTDATA/node.toml.in" >"$recipe"
  echo "$recipe"
}

# The product path: one recipe template, six builds that differ in the
# kubelet only. They share the base layer through `build --layer-cache`
# (E2E_LAYER_CACHE): the first build writes it (~9 s of zstd for the 365 MB
# node rootfs on 2 cores), the others copy it (~0.3 s).
images_build_with_builder() {
  local v recipe rc=0
  for v in "${E2E_VERSIONS[@]}"; do
    recipe=$(recipe_for "$v")
    # One layout, one tag per version (the builder adds to an existing layout).
    "$BUILDER" --progress plain build "$recipe" --layer-cache "$E2E_LAYER_CACHE" \
      --output "oci:$IMAGE_LAYOUT:$v" >"$WORK/logs/build-$v.log" 2>&1 ||
      { cat "$WORK/logs/build-$v.log" >&2; die "kubeslot-builder build $recipe failed"; }
  done
  # nocni: v1 less its CNI config (the recipe's [[files]] block for it)
  recipe=$(recipe_for v1)
  awk 'BEGIN { RS = ""; ORS = "\n\n" } !/path = "\/etc\/cni\/net.d\//' "$recipe" |
    sed 's/^tag = "v1"$/tag = "nocni"/' >"$WORK/images/node-nocni.toml"
  grep -q '/etc/cni/net.d' "$WORK/images/node-nocni.toml" || rc=$?
  [ $rc = 1 ] || die "the CNI config is still in node-nocni.toml (or it cannot be read: grep exit $rc)"
  "$BUILDER" --progress plain build "$WORK/images/node-nocni.toml" --layer-cache "$E2E_LAYER_CACHE" \
    --output "oci:$IMAGE_LAYOUT:nocni" >"$WORK/logs/build-nocni.log" 2>&1 ||
    { cat "$WORK/logs/build-nocni.log" >&2; die "kubeslot-builder build node-nocni.toml failed"; }
}

# push_one SRC REF: `kubeslot-builder push` (keeps the builder's index and
# its digest).
push_one() {
  "$BUILDER" push "$1" "$2" >>"$WORK/logs/push.log" 2>&1 ||
    { cat "$WORK/logs/push.log" >&2; die "kubeslot-builder push $1 $2 failed"; }
}

# images_push: v1..v7 into the local registry, plus an unsigned copy of v2
# for the refusal scenario.
images_push() {
  local v
  for v in "${E2E_VERSIONS[@]}"; do
    push_one "oci:$IMAGE_LAYOUT:$v" "$REGISTRY/$IMAGE_REPO:$v"
    printf -v "REF_$v" '%s' "$REGISTRY/$IMAGE_REPO:$v"
    printf -v "DIGEST_$v" 'sha256:%s' "$(skopeo inspect --tls-verify=false --raw "docker://$REGISTRY/$IMAGE_REPO:$v" | sha256sum | cut -d' ' -f1)"
    local d=DIGEST_$v
    PLATFORM_DIGEST[${!d}]=$(platform_digest "$REGISTRY/$IMAGE_REPO:$v")
  done
  push_one "oci:$IMAGE_LAYOUT:v2" "$REGISTRY/kubeslot/e2e-unsigned:v2"
  REF_UNSIGNED=$REGISTRY/kubeslot/e2e-unsigned:v2
  push_one "oci:$IMAGE_LAYOUT:nocni" "$REGISTRY/$IMAGE_REPO:nocni"
  REF_nocni=$REGISTRY/$IMAGE_REPO:nocni
  DIGEST_nocni=sha256:$(skopeo inspect --tls-verify=false --raw "docker://$REF_nocni" | sha256sum | cut -d' ' -f1)
  PLATFORM_DIGEST[$DIGEST_nocni]=$(platform_digest "$REF_nocni")
  log "pushed $REF_v1 ($DIGEST_v1), v2 ($DIGEST_v2), v3 ($DIGEST_v3)"
}

# images_sign: a fresh key pair (`kubeslot-builder keygen`) and signatures
# on v1..v7 (`kubeslot-builder sign`; not on the unsigned copy). Leaves the
# public key in WORK/keys/e2e.pub.
images_sign() {
  mkdir -p "$WORK/keys"
  local v ref digest
  "$BUILDER" keygen --out "$WORK/keys/e2e" >"$WORK/logs/keygen.log" 2>&1 ||
    { cat "$WORK/logs/keygen.log" >&2; die "kubeslot-builder keygen failed"; }
  for v in "${E2E_VERSIONS[@]}" nocni; do
    ref=REF_$v; digest=DIGEST_$v
    "$BUILDER" sign --key "$WORK/keys/e2e.key" "${!ref%:*}@${!digest}" >>"$WORK/logs/sign.log" 2>&1 ||
      { cat "$WORK/logs/sign.log" >&2; die "kubeslot-builder sign ${!ref} failed"; }
  done
  log "images v1..v7 signed by kubeslot-builder"
}

# openssl_sign KEY REF DIGEST: signs DIGEST of REF's repository (and its
# linux/amd64 manifest when DIGEST is an index) with ci/e2e/openssl-sign.py,
# an independent cosign-format signer made of openssl and the registry API.
openssl_sign() {
  local key=$1 repo=${2#"$REGISTRY"/} digest=$3 platform
  repo=${repo%:*}
  python3 "$REPO/ci/e2e/openssl-sign.py" "$key" "$REGISTRY" "$repo" "$digest" >>"$WORK/logs/sign.log"
  platform=$(platform_digest "$2")
  if [ "$platform" != "$digest" ]; then
    python3 "$REPO/ci/e2e/openssl-sign.py" "$key" "$REGISTRY" "$repo" "$platform" >>"$WORK/logs/sign.log"
  fi
}

# layer_digests REF: the layer digests of REF's manifest for this platform.
layer_digests() {
  skopeo inspect --tls-verify=false --format '{{range .Layers}}{{println .}}{{end}}' "docker://$1" | sed '/^$/d'
}

# kube_layer REF: the Kubernetes layer (the recipe's third layer group, after
# base and config; kubeslot-builder appends its SBOM layer after it).
kube_layer() { layer_digests "$1" | sed -n 3p; }

# image_blobs REF: the config and layer digests of REF's linux/amd64
# manifest (what an unpack downloads; signatures are other blobs).
image_blobs() {
  local repo=${1%:*} raw
  raw=$(skopeo inspect --tls-verify=false --raw "docker://$1")
  if jq -e '.manifests' <<<"$raw" >/dev/null 2>&1; then
    raw=$(skopeo inspect --tls-verify=false --raw "docker://$repo@$(platform_digest "$1")")
  fi
  jq -r '.config.digest, .layers[].digest' <<<"$raw"
}

# platform_digest REF: the digest of REF's manifest for linux/amd64 (REF's
# own digest when it is a single manifest, not an index).
platform_digest() {
  local raw
  raw=$(skopeo inspect --tls-verify=false --raw "docker://$1")
  if jq -e '.manifests' <<<"$raw" >/dev/null 2>&1; then
    jq -r '[.manifests[] | select(.platform.architecture == "amd64" and .platform.os == "linux")][0].digest' <<<"$raw"
  else
    # (hashed as served: $raw lost any trailing newline)
    skopeo inspect --tls-verify=false --raw "docker://$1" | sha256sum | sed 's/^/sha256:/; s/ .*//'
  fi
}

# archive_with_signature VERSION FILE: an oci-archive of VERSION's image,
# made by `kubeslot-builder copy`: its cosign `.sig` (and `.sbom`) travel
# inside as index.json entries named `sha256-<hex>.sig`.
archive_with_signature() {
  local v=$1 file=$2 ref
  ref=REF_$v
  "$BUILDER" copy "${!ref}" "oci-archive:$file:$v" >"$WORK/logs/copy-$v.log" 2>&1 ||
    { cat "$WORK/logs/copy-$v.log" >&2; return 1; }
}
