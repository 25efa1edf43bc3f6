# shellcheck shell=bash
# shellcheck disable=SC2154 # REF_*, CONFIG_IN_OUTER: set by images.sh and activator.sh, which run.sh sources first
# Offline image bundles (issue 28; docs/host/adopt.md, "Coming from the
# unbounded agent"): container images an air-gapped host hands its node as OCI
# archives in a host directory (the config's images.bundle_dir and
# images.bundle), copied by the activator's render into a root-only
# directory (/var/lib/kubeslot/bundles/<key>), verified there before the
# machine starts, the copy bound read-only and imported into containerd's k8s.io namespace by the
# image's kubeslot-images.service before the kubelet starts. Sourced by
# run.sh.
#
# The bundle's image is named in a registry that does not exist
# (bundle.e2e.invalid) and was never pushed anywhere: the node can have it
# only from the bundle. It runs as a static pod through CRI (cri.sh's
# helpers), on the node's network (hostNetwork: this outer host shares the
# CI machine's network, where no CNI bridge may appear).
#
# A container needs runc's cgroups: for this scenario only, the node
# machines of the outer host keep nspawn's own cgroup layout
# (hybrid_cgroup_dropin of pods.sh) and the kubelet is told
# failCgroupV1: false, as in the pod outer host.

BUNDLE_NAME=bundle.e2e.invalid/e2e/bundled:1
BUNDLE_DIGEST=""

# bundle_build: the bundle's one image (busybox printing a line, from the
# test images' layout of test_images_build) as an oci-archive in the outer
# host's /srv/kubeslot-bundle, named with its full reference (what
# `ctr images import` names it by); BUNDLE_DIGEST is what index.json points at.
bundle_build() {
  local layout=$WORK/images/test/layout dir=$OUTER/srv/kubeslot-bundle
  umoci config --image "$layout:busybox" --tag bundled \
    --config.cmd /bin/sh --config.cmd -c --config.cmd 'echo hello from the offline bundle'
  mkdir -p "$dir"
  rm -f "$dir/bundled.oci.tar"
  skopeo copy --quiet "oci:$layout:bundled" "oci-archive:$dir/bundled.oci.tar:$BUNDLE_NAME"
  BUNDLE_DIGEST=$(tar -xOf "$dir/bundled.oci.tar" index.json | jq -r '.manifests[0].digest')
  [ -n "$BUNDLE_DIGEST" ] || { fail "no digest in the bundle archive's index.json"; return 1; }
  log "  bundle: $BUNDLE_NAME ($BUNDLE_DIGEST) in /srv/kubeslot-bundle/bundled.oci.tar"
}

# bundle_config IMAGE: the activator config with the bundle (and the
# kubelet on nspawn's cgroup v1 layout, see above).
bundle_config() {
  config_json "$1" /etc/kubeslot/trust/e2e.pub |
    jq --arg name "$BUNDLE_NAME" --arg digest "$BUNDLE_DIGEST" '
      .images = {bundle_dir: "/srv/kubeslot-bundle", bundle: [{file: "bundled.oci.tar", name: $name, digest: $digest}]}
      | .kubelet.config = {failCgroupV1: false}' \
      >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
}

# bundle_cgroup_layout on|off: pods.sh's TEST-ONLY hybrid_cgroup_dropin
# for the node machines of the first outer host, for this scenario only:
# later scenarios start their machines as rendered.
bundle_cgroup_layout() {
  if [ "$1" = on ]; then
    hybrid_cgroup_dropin systemd-nspawn@.service
  else
    rm -f "$OUTER/etc/systemd/system/systemd-nspawn@.service.d/zz-e2e-cgroup-layout.conf"
    outer systemctl daemon-reload
  fi
}

# The running node's image (v4) with a bundle: the new host files flip it
# into the idle slot, whose kubeslot-images imported the bundle's image
# before its kubelet started; containerd has it at the archive's digest and
# the kubelet, finding it present, runs it as a static pod, though no
# registry has it. The machine binds the verified private copy: an
# archive damaged after the render changes nothing the node imports, and
# without a copy the render refuses it, naming it, before the machine
# would start.
scenario_offline_bundle_images() {
  local rc=0
  bundle_cgroup_layout on
  bundle_checks || rc=$?
  bundle_cgroup_layout off
  return "$rc"
}

bundle_checks() {
  local before target got out
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  bundle_build || return 1
  bundle_config "$REF_v4"
  act activate || { show_log; log_report; fail "activate with an offline bundle exited non-zero"; return 1; }
  log_report
  expect_running "$target" v1.35.3-e2e.4 || return 1
  got=$(outer cat "/etc/kubeslot/host/$target/bundle-images" | grep -v '^#')
  check_eq "the rendered list for the import unit" "$got" "$BUNDLE_NAME $BUNDLE_DIGEST bundled.oci.tar" || return 1
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(in_machine "$target" sh -c 'test -r /etc/kubeslot/bundle/bundled.oci.tar && echo readable
    touch /etc/kubeslot/bundle/x 2>/dev/null && echo writable || echo read-only' | paste -sd' ')
  check_eq "the bundle dir in $target" "$got" "readable read-only" || return 1
  got=$(in_machine "$target" journalctl -u kubeslot-images --no-pager -o cat | grep -F "$BUNDLE_NAME" || true)
  check "kubeslot-images imported the bundle's image" grep -qF "$BUNDLE_NAME: imported ($BUNDLE_DIGEST)" <<<"$got" ||
    { in_machine "$target" journalctl -u kubeslot-images --no-pager -o cat >&2; return 1; }
  local done_at started_at
  done_at=$(outer systemctl -M "$target" show kubeslot-images -p ExecMainExitTimestampMonotonic --value)
  started_at=$(outer systemctl -M "$target" show kubelet -p ExecMainStartTimestampMonotonic --value)
  check "the import finished before the kubelet started ($done_at <= $started_at)" test "$done_at" -le "$started_at" || return 1
  got=$(in_machine "$target" ctr -n k8s.io images ls "name==$BUNDLE_NAME" | awk 'NR > 1 { print $3 }')
  check_eq "$BUNDLE_NAME in containerd's k8s.io namespace" "$got" "$BUNDLE_DIGEST" || return 1
  # a static pod of it (its tag is never pulled again: IfNotPresent)
  cri_manifest "$target" bundled <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: bundled
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: bundled
    image: $BUNDLE_NAME
EOF2
  # Its name resolves nowhere and no mirror serves it: a pull could only
  # fail (the pod would never run). What shows the bundle at work is the
  # kubelet's image check finding it present (first: a kubelet that pulls
  # fails here, not on the missing line below).
  check "the kubelet found the image present (no pull)" \
    kubelet_log_wait "$target" "Container image already present on machine.*pod=\"default/bundled-e2e-node\".*image=\"$BUNDLE_NAME\"" 90 || return 1
  out=$(cri_wait_log "$target" bundled bundled 0 'hello from the offline bundle' 90) || return 1
  check "the static pod printed the bundle image's line" grep -qx 'hello from the offline bundle' <<<"$out" || { echo "$out" >&2; return 1; }
  in_machine "$target" rm -f /etc/kubernetes/manifests/bundled.yaml

  # the node imports a verified private copy, not the live bundle_dir
  local nspawn copy key
  nspawn=$(outer cat "/etc/systemd/nspawn/$target.nspawn")
  copy=$(sed -n 's|^BindReadOnly=\(/var/lib/kubeslot/bundles/[0-9a-f]*\):/etc/kubeslot/bundle$|\1|p' <<<"$nspawn")
  check "$target binds the bundle's private copy" test -n "$copy" || { echo "$nspawn" >&2; return 1; }
  key=${copy##*/}
  check_eq "the copies' directory is root's alone" "$(stat -c '%U %a' "$OUTER/var/lib/kubeslot/bundles")" "root 700" || return 1
  got=$(in_machine "$target" sha256sum /etc/kubeslot/bundle/bundled.oci.tar | cut -d' ' -f1)
  check_eq "the node's archive is the verified one" "$got" "$(sha256sum <"$OUTER/srv/kubeslot-bundle/bundled.oci.tar" | cut -d' ' -f1)" || return 1

  # damaged after the render: the next render keeps the verified copy (the
  # node's archive is unchanged); without a copy, the render refuses it
  # (exit 3), naming the archive, and writes nothing
  local archive=$OUTER/srv/kubeslot-bundle/bundled.oci.tar rc=0 good
  cp "$archive" "$WORK/bundled.oci.tar.good"
  good=$(sha256sum <"$archive" | cut -d' ' -f1)
  python3 - "$archive" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
# the image config (an uncompressed JSON blob) holds the command
i = b.find(b"hello from the offline bundle")
if i < 0:
    sys.exit("no image config in " + p)
b[i] ^= 1
open(p, "wb").write(bytes(b))
EOF
  act render "$target" || { show_log; fail "render with a verified copy and a swapped original exited non-zero"; return 1; }
  got=$(sha256sum <"$OUTER$copy/bundled.oci.tar" | cut -d' ' -f1)
  check_eq "the copy is still the verified archive" "$got" "$good" || return 1
  got=$(in_machine "$target" sha256sum /etc/kubeslot/bundle/bundled.oci.tar | cut -d' ' -f1)
  check_eq "the node's archive is still the verified one" "$got" "$good" || return 1
  # the copy set aside (the machine keeps its bind): copied afresh, refused
  mv "$OUTER$copy" "$OUTER/var/lib/kubeslot/bundles/saved-$key"
  act render "$target" || rc=$?
  rm -rf "${OUTER:?}$copy"
  mv "$OUTER/var/lib/kubeslot/bundles/saved-$key" "$OUTER$copy"
  check_eq "render of a damaged bundle exits" "$rc" 3 || { show_log; return 1; }
  check "the error names the archive" grep -q "images.bundle /srv/kubeslot-bundle/bundled.oci.tar ($BUNDLE_NAME)" <<<"$(act_error)" || { show_log; return 1; }
  cp "$WORK/bundled.oci.tar.good" "$archive"
}
