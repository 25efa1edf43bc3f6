#!/usr/bin/env bash
# End-to-end scenarios (docs/testing.md, "End-to-end tests"): real node images built by
# kubeslot-builder, signed and pushed to a local docker-registry, activated
# by the real kubeslot-activator inside an outer systemd host container
# (systemd-nspawn, driven with nsenter), with real machined, nspawn machines
# and containerd. One function per scenario; a summary line at the end; the
# exit status is non-zero when any scenario failed.
#
#   ci/e2e/run.sh [SCENARIO...]       (default: all, in order)
#   ci/e2e/run.sh --slot-sensitive    (the scenarios whose outcome can depend
#                                      on the slot mode: what ci/test.sh runs
#                                      a second time with KUBESLOT_E2E_SLOTS=copy)
#
# The scenarios from activate_v1 on build on each other (a node's life):
# name them in order, starting with activate_v1. Needs root, the tools
# ci/setup.sh installs, and a free 127.0.0.1:10248 (the node machines use the
# host network). Everything lives in a temp dir removed by a trap.
# Environment: KUBESLOT_E2E_KEEP=1 keeps the work dir and its logs;
# KUBESLOT_E2E_TMPFS=0|1 (default: tmpfs when 6 GiB are available);
# KUBESLOT_E2E_TMP=DIR (default /var/tmp); KUBESLOT_E2E_NETWORK=host|veth (the config's
# "network"; veth machines fail the activator's gate); KUBESLOT_E2E_SLOTS=overlay|copy
# (the config's slots.mode; unset: the activator's default, overlay where the
# outer host can); KUBESLOT_E2E_LAYER_CACHE=DIR (the node images' base layer
# cache, `kubeslot-builder build --layer-cache`; default: one in the work
# dir; ci/test.sh gives both of its passes one). ci/e2e/README.md has the details.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPO=$PWD
E2E_TESTDATA=$REPO/testdata/e2e
# shellcheck source=ci/e2e/lib.sh
. "$REPO/ci/e2e/lib.sh"
# shellcheck source=ci/e2e/cgroup.sh
. "$REPO/ci/e2e/cgroup.sh"
# shellcheck source=ci/e2e/images.sh
. "$REPO/ci/e2e/images.sh"
# shellcheck source=ci/e2e/activator.sh
. "$REPO/ci/e2e/activator.sh"
# shellcheck source=ci/e2e/host.sh
. "$REPO/ci/e2e/host.sh"
# shellcheck source=ci/e2e/gpu.sh
. "$REPO/ci/e2e/gpu.sh"
# shellcheck source=ci/e2e/pods.sh
. "$REPO/ci/e2e/pods.sh"
# shellcheck source=ci/e2e/cri.sh
. "$REPO/ci/e2e/cri.sh"
# shellcheck source=ci/e2e/bundle.sh
. "$REPO/ci/e2e/bundle.sh"
# shellcheck source=ci/e2e/proxy.sh
. "$REPO/ci/e2e/proxy.sh"
# shellcheck source=ci/e2e/keyless.sh
. "$REPO/ci/e2e/keyless.sh"
# shellcheck source=ci/e2e/follow.sh
. "$REPO/ci/e2e/follow.sh"
# shellcheck source=ci/e2e/security.sh
. "$REPO/ci/e2e/security.sh"
# shellcheck source=ci/e2e/api.sh
. "$REPO/ci/e2e/api.sh"
# shellcheck source=ci/e2e/drain.sh
. "$REPO/ci/e2e/drain.sh"

OUTER_PKGS=systemd,systemd-sysv,dbus,systemd-container,iproute2,iptables,procps
# The node: Debian trixie (its systemd 257 still boots on this hybrid-cgroup
# host when told to, see hand_nspawn) with containerd, runc and the CNI
# plugins from Debian testing (forky: containerd 2.1+, runc 1.3+, CNI 1.9+,
# what the production config needs). testing's own systemd (258+) has no
# cgroup v1 at all, and bookworm's C library is too old for testing's runc.
NODE_SUITE=trixie
NODE_PKGS=systemd,systemd-sysv,dbus,containerd/forky,runc/forky,containernetworking-plugins/forky,iproute2,iptables

# ---------------------------------------------------------------- preflight

preflight() {
  [ "$(id -u)" = 0 ] || die "the e2e needs root (systemd-nspawn, cgroups, mounts)"
  local tool pkg
  while read -r tool pkg; do
    command -v "$tool" >/dev/null ||
      die "required tool '$tool' is not installed: apt-get install -y $pkg (or ci/setup.sh, as root)"
  done <<'EOF'
systemd-nspawn systemd-container
nsenter util-linux
mmdebstrap mmdebstrap
docker-registry docker-registry
skopeo skopeo
zstd zstd
tar tar
python3 python3
jq jq
openssl openssl
dpkg-deb dpkg
objdump binutils
umoci umoci
EOF
  # the cluster's view is read with the real kubectl (node_joins_api)
  [ -x "$KUBECTL" ] ||
    die "kubectl 1.36 is needed at $KUBECTL: ci/lib/kube-clients.sh (or run .ci/run)"
  # the pod scenarios' container images are made from it
  if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then
    die "a static /bin/busybox is needed for the test container images: apt-get install -y busybox-static (or ci/setup.sh, as root)"
  fi
  # The node machines share this machine's network (see write_config): the
  # fixture kubelet's port must be free, or the gate would probe someone else.
  if (exec 3<>/dev/tcp/127.0.0.1/10248) 2>/dev/null; then
    die "127.0.0.1:10248 is in use on this machine; the e2e's node machines use the host network and serve the kubelet's /healthz there (stop that process, or run with KUBESLOT_E2E_NETWORK=veth)"
  fi
}

# ---------------------------------------------------------------- inputs

# stamp_fixture SRC DST TEXT: DST is SRC with TEXT in its variant stamp
# (after the marker, NUL-padded; the marker must occur exactly once).
# The marker and the stamp's 96 bytes are STAMP_MARKER and STAMP_LEN in
# fixtures/fake-kubelet/src/main.rs.
stamp_fixture() {
  python3 - "$@" <<'PY'
import os, sys
src, dst, text = sys.argv[1:]
data = bytearray(open(src, "rb").read())
marker = b"@@fake-kubelet-variant:@@\0"
at = data.find(marker)
if at < 0 or data.find(marker, at + 1) >= 0:
    sys.exit(f"stamp_fixture: {src}: the variant marker is not there exactly once")
room = 96 - len(marker)
payload = text.encode()
if len(payload) >= room:
    sys.exit(f"stamp_fixture: {text!r} does not fit the stamp ({room - 1} bytes)")
start = at + len(marker)
data[start:start + room] = payload + bytes(room - len(payload))
with open(dst, "wb") as f:
    f.write(data)
os.chmod(dst, 0o755)
PY
}

build_binaries() {
  log "building kubeslot-activator, kubeslot-builder and the fixture kubelets"
  # --workspace --tests: the feature set `cargo test --workspace` built with
  # (dev-dependencies unify features), so after the test command this
  # builds only what the tests do not: the fixture kubelet's plain binary
  # (--bins, a few seconds); `-p ... ` alone rebuilt ~200 crates (3 min on
  # 2 cores).
  cargo build --quiet --locked --workspace --tests --bins
  ACTIVATOR=$REPO/target/debug/kubeslot-activator
  BUILDER=$REPO/target/debug/kubeslot-builder
  # The outer host gets the activator as a host does: the Debian package
  # (of this debug binary), installed with dpkg -i after boot.
  DEB=$("$REPO/ci/deb/build.sh" --binary "$ACTIVATOR" --compress gzip --out "$WORK/kubeslot-activator.deb")
  # The fixture kubelet in seven variants: v1, v2, v4, v5, v6, v7 (other versions,
  # so only the Kubernetes layer differs) and v3 (never healthy), copies of
  # the one binary the workspace build made, each with its variant written
  # into the binary's stamp (fixtures/fake-kubelet/src/main.rs, STAMP): no
  # build per variant, no second target dir.
  # v7 withholds the Node's Ready for 20 s after its start
  # (cluster_gate_waits_for_ready).
  local variant version unhealthy ready
  while read -r variant version unhealthy ready; do
    mkdir -p "$WORK/kubelet/$variant"
    stamp_fixture "$REPO/target/debug/fake-kubelet" "$WORK/kubelet/$variant/kubelet" \
      "$version $([ "$unhealthy" = 1 ] && echo never-healthy || echo healthy)${ready:+ $ready}"
  done <<'EOF'
v1 v1.35.0-e2e.1 0
v2 v1.35.1-e2e.2 0
v3 v1.35.2-e2e.3 1
v4 v1.35.3-e2e.4 0
v5 v1.35.4-e2e.5 0
v6 v1.35.5-e2e.6 0
v7 v1.35.6-e2e.7 0 ready-after=20
EOF
}

rootfs_tars() {
  OUTER_TAR=$("$REPO/ci/lib/debian-rootfs.sh" "$OUTER_PKGS")
  NODE_TAR=$("$REPO/ci/lib/debian-rootfs.sh" --suite "$NODE_SUITE" "$NODE_PKGS")
}

# ---------------------------------------------------------------- scenarios

# Before any kubeslot code: inside the outer host, a hand-written .nspawn
# with PrivateUsers=no and the stock systemd-nspawn@kube1.service boot a node
# tree; containerd answers; the fixture kubelet is healthy. This proves the
# platform the activator's rendered files rely on (DESIGN.md §5), and a
# container runs through containerd and runc (the test cgroup unit's job).
scenario_nspawn_smoke() {
  local m=kube1 tree=$OUTER/var/lib/machines/kube1 t0 t1 state leader uidmap
  node_tree_fill "$tree" "$NODE_TAR" "$WORK/kubelet/v1/kubelet"
  hand_nspawn "$m"
  t0=$(now_ms)
  outer systemctl start "systemd-nspawn@$m.service"
  state=$(machine_wait_running "$m" 60) || { fail "machine $m is '$state' after 60 s"; return 1; }
  t1=$(now_ms)
  log "  $m systemd is $state $((t1 - t0)) ms after start"
  if [ "$state" = degraded ]; then outer systemctl -M "$m" --failed --no-legend >&2 || true; fi

  # PrivateUsers=no in the .nspawn file must win over the stock unit's -U:
  # the machine's uid map is the identity.
  leader=$(outer machinectl show "$m" -p Leader --value)
  uidmap=$(outer cat "/proc/$leader/uid_map" | tr -s ' ' | sed 's/^ //')
  check_eq "uid map of $m (PrivateUsers=no)" "$uidmap" "0 0 4294967295" || return 1
  check "containerd active in $m" outer systemctl -M "$m" is-active --quiet containerd || return 1
  local cri
  cri=$(outer systemd-run -M "$m" --quiet --wait --pipe crictl version </dev/null 2>&1) || true
  check "crictl (TEST-ONLY subset) speaks CRI v1 to it" grep -qx 'RuntimeApiVersion:  v1' <<<"$cri" || { echo "$cri" >&2; return 1; }
  if [ "$E2E_CGROUP_LAYOUT" = hybrid ]; then
    check "test cgroup unit ran in $m" outer systemctl -M "$m" is-active --quiet kubeslot-test-cgroup-rw || return 1
  else
    # (no v1 controller to remount: its conditions keep it from running)
    check_eq "test cgroup unit skipped in $m (unified host)" \
      "$(outer systemctl -M "$m" show kubeslot-test-cgroup-rw -p ConditionResult --value)" no || return 1
  fi
  local ctr
  ctr=$(outer systemd-run -M "$m" --quiet --wait --pipe ctr version </dev/null) ||
    { fail "ctr version in $m"; return 1; }
  check "ctr version answers (server part)" grep -q '^Server:' <<<"$ctr" || return 1
  check "fixture kubelet healthy in $m" machine_wait_healthy "$m" 30 || return 1
  # A container through containerd and runc (what the kubelet's pods need):
  # the rootfs is the machine's own /usr, bound read-only.
  local pod
  # shellcheck disable=SC2016 # expanded by the machine's shell
  pod=$(outer systemd-run -M "$m" --quiet --wait --pipe sh -c '
    set -e
    r=/var/tmp/pod-root; mkdir -p $r/usr $r/proc $r/dev $r/sys $r/etc $r/tmp
    mount --bind /usr $r/usr; mount -o remount,bind,ro $r/usr
    for d in bin lib lib64 sbin; do ln -sfn usr/$d $r/$d; done
    ctr run --rm --rootfs $r e2e-pod /bin/sh -c "echo pod-ok"
    umount $r/usr' </dev/null 2>&1) || true
  check "ctr run (containerd + runc) works in $m" grep -qx pod-ok <<<"$pod" || { echo "$pod" >&2; return 1; }
  t1=$(now_ms)
  log "  $m: start -> kubelet healthy in $((t1 - t0)) ms"
  local version
  version=$(outer systemd-run -M "$m" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null)
  check_eq "kubelet --version in $m" "$version" "Kubernetes v1.35.0-e2e.1" || return 1

  t0=$(now_ms)
  outer machinectl stop "$m"
  local deadline=$((SECONDS + 30))
  while outer systemctl is-active --quiet "systemd-nspawn@$m.service" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  check_unit_inactive "systemd-nspawn@$m.service" || return 1
  log "  $m stopped in $(($(now_ms) - t0)) ms"
  rm -rf --one-file-system "$tree" "$OUTER/etc/systemd/nspawn/$m.nspawn"
  outer systemctl daemon-reload
}

# The images themselves: v2..v6 each differ from v1 in the Kubernetes layer
# (the kubelet) and, with kubeslot-builder, in the SBOM layer it appends
# (the SBOM lists the kubelet's version and sha256); the base and config
# layers are shared. v3's kubelet is the never-healthy build.
scenario_images() {
  local v n ref shared
  n=$(layer_digests "$REF_v1" | wc -l)
  for v in v2 v3 v4 v5 v6 v7; do
    ref=REF_$v
    check_eq "layer count of $v" "$(layer_digests "${!ref}" | wc -l)" "$n" || return 1
    check_eq "base and config layers of $v = v1's" "$(layer_digests "${!ref}" | head -n2)" "$(layer_digests "$REF_v1" | head -n2)" || return 1
    check "Kubernetes layer of $v differs from v1's" test "$(kube_layer "${!ref}")" != "$(kube_layer "$REF_v1")" || return 1
    shared=$(comm -12 <(layer_digests "$REF_v1" | sort) <(layer_digests "${!ref}" | sort) | wc -l)
    # base and config shared; kubernetes and the SBOM layer differ
    check_eq "layers $v shares with v1" "$shared" 2 || return 1
  done
  # Each fixture build says its version; the never-healthy build (v3) is
  # proven by activate_v3_rolls_back (a fixture started here would have no
  # container runtime to start with: it asks the node's over CRI first).
  for v in "${E2E_VERSIONS[@]}"; do
    check "fixture $v --version" grep -qx "Kubernetes v1\.35\.[0-9]-e2e\.${v#v}" <<<"$("$WORK/kubelet/$v/kubelet" --version)" || return 1
  done
}

# ---------------------------------------------------------------- main

SCENARIOS=(
  images
  deb_install
  nspawn_smoke
  unpack_and_boot
  unpack_killed
  openssl_signer
  design_files
  unmanaged_machine_refused
  adopt_refuses_untrusted_kubelet_flags
  adopt_unbounded
  overlay_update_writes_changed_layer_only
  overlay_rollback_is_pristine
  activate_v1
  node_joins_api
  local_user_cannot_touch_state
  activate_v2_flip
  reboot
  unsigned_refused
  preflight_fails
  rollback_refuses_changed_cni_plugin
  rollback_refuses_tampered_image
  rollback
  activate_v3_rolls_back
  kill_mid_unpack
  tampered_refused
  kill_mid_flip
  kill_mid_gate
  config_change_activates
  reboot_mid_flip
  runtime_not_ready_fails_gate
  offline_bundle_images
  egress_through_proxy
  pod_runs
  cri_static_pod
  cri_pull_through_mirror
  mirror_pull_airgapped
  cri_sandbox_pinned
  image_cache_survives_flip
  preloaded_pause
  follow_tag_updates
  expired_statement_refused
  window_closed_waits
  lease_limit_waits
  halted_rollout_waits
  flip_drains_first
  drain_blocked_by_pdb
  kill_mid_drain
  cluster_gate_waits_for_ready
  node_reports_image
  airgap_archive
  keyless_verified_offline
  gpu_setup
  gpu_cdi_injection
  gpu_setup_failure_rolls_back
)

# What the copy-mode pass of ci/test.sh leaves out: scenarios whose outcome
# does not depend on how a slot's tree is made (images, the runtime and pods
# inside a running node). Their predecessors (pod_runs, gpu_setup) still run
# in both modes.
# (cri_static_pod is not one of them although it checks inside a running
# node: it pulls the image image_cache_survives_flip finds after its flip.)
SLOT_INDEPENDENT=(
  # no slot touched: image checks, the package, a hand-written nspawn
  images deb_install nspawn_smoke design_files
  # the kubelet's API side (its state is the node's, bound into either
  # slot mode's machine the same way); activate_v2_flip checks the Node
  # after the flip only when this ran
  node_joins_api
  # `unpack` writes a plain tree whatever the config's slot mode
  unpack_and_boot unpack_killed openssl_signer
  # overlay slots whatever KUBESLOT_E2E_SLOTS says (empty host to empty host)
  overlay_update_writes_changed_layer_only overlay_rollback_is_pristine
  # a failing gate's rollback is activate_v3_rolls_back's in both modes; this
  # one's point is CRI's NetworkReady, read inside the running node
  runtime_not_ready_fails_gate
  # the bundle import runs inside the node, at its boot
  offline_bundle_images
  # the proxy carries the registry requests; the slot is made as ever
  egress_through_proxy
  # refused before any slot is touched; its flip is airgap_archive's
  keyless_verified_offline
  # adopt's and render's refusals on an unmanaged host: no slot touched
  adopt_refuses_untrusted_kubelet_flags
  # checks inside a running node
  cri_pull_through_mirror mirror_pull_airgapped cri_sandbox_pinned gpu_cdi_injection
  # a following host that waits for its window, the lease or the halt
  # touches no slot; lease_limit_waits' flip at the end is follow_tag_updates'
  window_closed_waits lease_limit_waits halted_rollout_waits
  # the drain, the cluster gate and what the cluster sees: API calls around
  # a flip, the same whatever makes the slot's tree (ci/e2e/drain.sh)
  flip_drains_first drain_blocked_by_pdb kill_mid_drain cluster_gate_waits_for_ready node_reports_image
)

SCENARIO_PID=""

# INT/TERM: stop the running scenario and its children by PID, then exit (the EXIT trap
# cleans up everything else).
on_signal() {
  if [ -n "$SCENARIO_PID" ]; then kill_tree "$SCENARIO_PID"; fi
  log "interrupted"
  exit 130
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  echo "Scenarios, in order: ${SCENARIOS[*]}"
}

main() {
  case ${1:-} in -h|--help) usage; return 0 ;; esac
  local s
  if [ "${1:-}" = --slot-sensitive ]; then
    shift
    [ $# = 0 ] || die "--slot-sensitive takes no scenario names"
    for s in "${SCENARIOS[@]}"; do
      [[ " ${SLOT_INDEPENDENT[*]} " == *" $s "* ]] || set -- "$@" "$s"
    done
    log "slot-sensitive scenarios only; left out (they do not depend on the slot mode): ${SLOT_INDEPENDENT[*]}"
  fi
  for s in "$@"; do
    declare -F "scenario_$s" >/dev/null || { usage >&2; die "unknown scenario '$s'"; }
  done
  preflight
  # unified (systemd, cgroup2 with controllers) or hybrid (these machines):
  # how the outer hosts are started and node machines' cgroups laid out
  # (ci/e2e/cgroup.sh)
  E2E_CGROUP_LAYOUT=$(cgroup_layout /) || die "this machine's cgroup layout is not one the e2e can run on (above)"
  if [ "$E2E_CGROUP_LAYOUT" = unified ]; then
    log "cgroup layout: unified (systemd is PID 1, cgroup2 with controllers): outer hosts in delegated scopes, node machines on the rendered cgroup2 layout, no test drop-in"
    # the activator's cgroup-v2 check runs for real here
    E2E_PREFLIGHT_IGNORE='["sysctl-*", "dev-kmsg"]'
  else
    log "cgroup layout: hybrid (v1 controllers): outer hosts in private child cgroups, the TEST-ONLY hybrid_cgroup_dropin where containers run"
  fi
  local wanted=("$@")
  [ ${#wanted[@]} -gt 0 ] || wanted=("${SCENARIOS[@]}")
  local started=$SECONDS
  work_init
  E2E_LAYER_CACHE=${KUBESLOT_E2E_LAYER_CACHE:-$WORK/layer-cache}
  trap cleanup EXIT
  trap on_signal INT TERM
  cgroup_init
  build_binaries
  rootfs_tars
  registry_start
  apiserver_start
  test_images_build
  images_build
  images_push
  images_sign
  outer_boot "$OUTER_TAR" \
    --bind-ro="$WORK/kubelet/v1/kubelet:/usr/local/bin/e2e-probe"
  install_deb
  log "setup done in $((SECONDS - started)) s"

  local passed=0 failed=0 failures=() t0 rc
  for s in "${wanted[@]}"; do
    log "=== scenario $s"
    t0=$SECONDS
    # Each scenario runs in a subshell with errexit on, so an unexpected
    # error fails that scenario and the next still runs; state the next
    # scenarios need lives in the outer host and the registry, not in
    # shell variables.
    # It runs in the background and is waited for, so that INT/TERM
    # interrupt the wait at once (bash defers traps while a foreground
    # child runs) and on_signal can stop it before cleanup.
    set +e
    # (each scenario's logs are named after it: logs/activator-<scenario>-N-*)
    export E2E_SCENARIO=$s
    (set -e; "scenario_$s") &
    SCENARIO_PID=$!
    wait "$SCENARIO_PID"
    rc=$?
    SCENARIO_PID=""
    set -e
    # a scenario that rebooted the outer left its new PIDs in a file
    outer_reload
    if [ $rc = 0 ]; then
      passed=$((passed + 1)); log "=== PASS $s ($((SECONDS - t0)) s)"
    else
      failed=$((failed + 1)); failures+=("$s"); log "=== FAIL $s ($((SECONDS - t0)) s)"
    fi
  done
  if [ -s "$WORK/downtime.txt" ]; then cat "$WORK/downtime.txt"; fi
  if [ -s "$WORK/cri-timings.txt" ]; then cat "$WORK/cri-timings.txt"; fi
  log "total $((SECONDS - started)) s${failures[*]:+; failed: ${failures[*]}}"
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}

main "$@"
