# shellcheck shell=bash
# REF_*, PAUSE_DIGEST, ... are set by images.sh, which run.sh sources first.
# shellcheck disable=SC2154
# The pod scenarios, sourced by ci/e2e/run.sh: static pods the fixture
# kubelet runs through CRI (RunPodSandbox, PullImage, CreateContainer,
# StartContainer) on the node image's own containerd 2 with the production
# config (runc, CNI bridge networking), inside node machines the real
# kubeslot-activator activated, with the pod image pulled through the
# registry mirror the activator rendered, and the baked pause image as the
# sandbox. The CRI scenarios themselves are in cri.sh.
#
# They get an outer host of their own (booted by the first of them, stopped
# by the last), with a private network namespace (systemd-nspawn
# --private-network): the CNI bridge, its routes and any iptables rule stay
# in that namespace, never on this machine. Nothing there reaches this
# machine's network, so two docker-registry processes of this run serve the
# run's registry storage inside it (started with `nsenter -n` into its
# namespace): one on the same 127.0.0.1 port as the run's registry (so the
# node image references, signatures and identities are the same), and one
# TLS mirror with a certificate from a test CA, on 127.0.0.1:5443 there.
# Pods name their images `registry.e2e.invalid/...`: a name that resolves
# nowhere, so a pull works only through the rendered hosts.toml (mirror and
# CA). The node machine shares that namespace (VirtualEthernet=no, as in
# production); an address on its loopback device gives the node its IP
# (198.51.100.10, kubelet.node_ip).
#
# Two test-only adjustments, both in the pod outer host only: the node
# machines keep nspawn's own cgroup layout (a drop-in unsets the rendered
# SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: on this hybrid-cgroup host the v2
# hierarchy has no controllers, and runc needs them, see E2E.md; and it
# passes SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1 to the machine's systemd 257,
# which refuses a hybrid layout otherwise), and the host config's
# kubelet.config says failCgroupV1: false, which a kubelet on cgroup v1
# needs.
#
# State between the scenarios lives in the pod outer host and in
# WORK/pods/ (PIDs), not in shell variables.

POD_NODE_IP=198.51.100.10
POD_MIRROR=127.0.0.1:5443
POD_REGISTRY_NAME=registry.e2e.invalid

# pods_enter: points the outer helpers (outer, act, write_config, ...) at
# the pod outer host; fails when it is not booted.
pods_enter() {
  [ -s "$WORK/pods/leader.pid" ] || { fail "the pod outer host is not booted (run pod_runs first)"; return 1; }
  OUTER=$WORK/pod-outer
  OUTER_LEADER=$(cat "$WORK/pods/leader.pid")
  OUTER_NSPAWN_PID=$(cat "$WORK/pods/nspawn.pid")
}

# pods_registry CONFIG LOG: a docker-registry in the pod outer's network
# namespace; its PID is appended to WORK/pods/registries.pid.
pods_registry() {
  nsenter -t "$OUTER_LEADER" -n docker-registry serve "$1" >>"$2" 2>&1 </dev/null &
  echo $! >>"$WORK/pods/registries.pid"
}

# pods_wait_port PORT: until something listens on 127.0.0.1:PORT in the pod
# outer's network namespace (10 s).
pods_wait_port() {
  local deadline=$((SECONDS + 10))
  while [ $SECONDS -lt $deadline ]; do
    nsenter -t "$OUTER_LEADER" -n bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# pods_outer_up: boots the pod outer host (private network, the activator
# bound in), its node IP, the two registries, the test CA, the drop-in that
# keeps nspawn's cgroup layout.
pods_outer_up() {
  mkdir -p "$WORK/pods"
  local dirs=() d
  # nspawn --keep-unit makes payload/ and supervisor/ below the cgroup it
  # starts in: a cgroup of its own, beside the first outer's
  for d in "${CGROUP_DIRS[@]}"; do mkdir -p "$d/pods"; dirs+=("$d/pods"); done
  CGROUP_DIRS=("${dirs[@]}")
  # (a fresh leader: the main outer's must never be taken for it)
  OUTER_LEADER="" OUTER_NSPAWN_PID=""
  OUTER_IDS=$WORK/pods/outer.ids OUTER_LOG_NAME=pod-outer-console.log \
    OUTER_ROOT=$WORK/pod-outer OUTER_NAME_WANTED=ks-pods-$$ outer_boot "$OUTER_TAR" \
    --private-network \
    --bind-ro="$ACTIVATOR:/usr/local/bin/kubeslot-activator" \
    --bind-ro="$ACTIVATOR:/usr/bin/kubeslot-activator" \
    --bind-ro="$WORK/kubelet/v1/kubelet:/usr/local/bin/e2e-probe"
  echo "$OUTER_NSPAWN_PID" >"$WORK/pods/nspawn.pid"
  echo "$OUTER_LEADER" >"$WORK/pods/leader.pid"
  # never act on this machine's own network namespace
  [ "$(readlink "/proc/$OUTER_LEADER/ns/net")" != "$(readlink /proc/self/ns/net)" ] ||
    die "the pod outer host shares this machine's network namespace"
  # the node's IP: an address of its namespace (no dummy driver here)
  nsenter -t "$OUTER_LEADER" -n ip addr add "$POD_NODE_IP/32" dev lo

  # the TLS mirror's CA and certificate (for 127.0.0.1)
  local tls=$WORK/pods/tls
  mkdir -p "$tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=kubeslot-e2e-mirror-ca -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -keyout "$tls/mirror.key" -out "$tls/mirror.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >"$tls/san.ext"
  openssl x509 -req -in "$tls/mirror.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 2 -extfile "$tls/san.ext" -out "$tls/mirror.crt" 2>/dev/null
  mkdir -p "$OUTER/etc/kubeslot"
  install -m 0644 "$tls/ca.crt" "$OUTER/etc/kubeslot/e2e-mirror-ca.pem"
  sed -e "s|^  addr: .*|  addr: $POD_MIRROR\n  tls:\n    certificate: $tls/mirror.crt\n    key: $tls/mirror.key|" \
    "$WORK/registry/config.yml" >"$WORK/pods/mirror.yml"
  pods_registry "$WORK/registry/config.yml" "$WORK/logs/registry-pods.log"
  pods_registry "$WORK/pods/mirror.yml" "$WORK/logs/registry-pods-mirror.log"
  pods_wait_port "${REGISTRY#*:}" || die "the pod outer's registry does not listen"
  pods_wait_port "${POD_MIRROR#*:}" || die "the pod outer's TLS mirror does not listen"

  hybrid_cgroup_dropin systemd-nspawn@.service
  act_setup
  log "  pod outer host up (leader $OUTER_LEADER): private network, node IP $POD_NODE_IP, registry and TLS mirror inside"
}

# hybrid_cgroup_dropin UNIT: a TEST-ONLY drop-in for UNIT (a
# systemd-nspawn@ unit or its template) in the current outer host: nspawn's
# own cgroup layout instead of the rendered cgroup2-only one, whose v2
# hierarchy has no controllers on this hybrid-cgroup CI host (runc needs
# them), and the stock command line plus SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1
# for the machine's systemd 257 (it reads its argv as its kernel command
# line and refuses a cgroup v1 layout without it). On a unified host
# (ci/e2e/cgroup.sh) nothing: the machines run as rendered.
hybrid_cgroup_dropin() {
  if [ "${E2E_CGROUP_LAYOUT:-hybrid}" = unified ]; then
    log "  $1: the rendered cgroup2 layout (unified host: no test drop-in)"
    return 0
  fi
  log "  $1: TEST-ONLY drop-in, nspawn's own cgroup layout (hybrid host)"
  local stock
  stock=$(outer systemctl cat systemd-nspawn@.service | sed -n 's/^ExecStart=//p' | head -n1)
  [ -n "$stock" ] || { fail "no ExecStart= in the outer's systemd-nspawn@.service"; return 1; }
  mkdir -p "$OUTER/etc/systemd/system/$1.d"
  cat >"$OUTER/etc/systemd/system/$1.d/zz-e2e-cgroup-layout.conf" <<EOF2
# TEST-ONLY (ci/e2e/pods.sh, hybrid_cgroup_dropin): see there.
[Service]
UnsetEnvironment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY
ExecStart=
ExecStart=$stock SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1
EOF2
  outer systemctl daemon-reload
}

# pods_cleanup: stops what pods_outer_up started (called by lib.sh's cleanup).
pods_cleanup() {
  local pid
  if [ -s "${WORK:-/nonexistent}/pods/registries.pid" ]; then
    while read -r pid; do
      kill "$pid" 2>/dev/null || true
    done <"$WORK/pods/registries.pid"
    : >"$WORK/pods/registries.pid"
  fi
  if [ -s "${WORK:-/nonexistent}/pods/nspawn.pid" ]; then
    (OUTER_NSPAWN_PID=$(cat "$WORK/pods/nspawn.pid"); OUTER_IDS=$WORK/pods/outer.ids outer_stop)
    rm -f "$WORK/pods/nspawn.pid" "$WORK/pods/leader.pid"
  fi
}

# pods_config IMAGE: the activator config of the pod outer: write_config's,
# plus the node IP, the mirror for the pods' registry name with its CA, and
# failCgroupV1: false (see the top of this file). registry.k8s.io is
# mirrored there too (an air-gapped host's mirror would have the pause
# image): nothing may pull it, and cri_sandbox_pinned reads the mirror's
# log to see that nothing did.
pods_config() {
  write_config "$1"
  jq --arg ip "$POD_NODE_IP" --arg name "$POD_REGISTRY_NAME" --arg mirror "https://$POD_MIRROR" '
    .kubelet.node_ip = $ip
    | .kubelet.config = {failCgroupV1: false}
    | .containerd.registry_mirrors = {
        ($name): {mirrors: [$mirror], ca_file: "/etc/kubeslot/e2e-mirror-ca.pem"},
        "registry.k8s.io": {mirrors: [$mirror], ca_file: "/etc/kubeslot/e2e-mirror-ca.pem"}
      }
  ' "$OUTER$CONFIG_IN_OUTER" >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
}

# The pod outer boots; v1 is activated into kube1 (the node's kubelet
# fixture starts: /dev/kmsg, the kernel defaults, the cgroup driver, CRI
# Version and the host's kubelet config drop-in all pass its checks; the
# gate saw RuntimeReady and NetworkReady) and imports the baked pause image.
# The node runs the production runtime: containerd >= 2.1, runc >= 1.3,
# CNI plugins >= 1.9, and containerd's own merged config (`containerd
# config dump`) has the production settings.
scenario_pod_runs() {
  pods_outer_up || return 1
  pods_enter || return 1
  pods_config "$REF_v1"
  act activate || { show_log; log_report; fail "activate v1 in the pod outer exited non-zero"; return 1; }
  expect_running kube1 v1.35.0-e2e.1 || return 1
  local got
  # shellcheck disable=SC2016 # expanded in the machine
  got=$(in_machine kube1 sh -c 'tr "\0" "\n" </proc/$(systemctl show kubelet -p MainPID --value)/cmdline | grep -c "^--node-ip='"$POD_NODE_IP"'$"; grep -c "\"failCgroupV1\": false" /etc/kubernetes/kubelet/config.d/50-kubeslot.conf; readlink /dev/kmsg' | paste -sd' ')
  check_eq "kubelet: --node-ip, the host's config drop-in, /dev/kmsg" "$got" "1 1 /dev/console" || return 1
  got=$(in_machine kube1 journalctl -u kubeslot-images --no-pager -o cat | grep 'registry.k8s.io/pause' || true)
  check "the pause image was imported at first boot" grep -q "registry.k8s.io/pause:3.10.2: imported ($PAUSE_DIGEST)" <<<"$got" || { echo "$got" >&2; return 1; }
  cri_expect_production_runtime kube1
}

# The rendered CA is what makes the mirror pull work: a pull with the
# rendered hosts.toml less its `ca` lines fails on the certificate, the same
# pull with it succeeds (ctr: containerd's own registry-host handling, with
# a hosts dir of the test's; the CRI pull itself is cri_pull_through_mirror).
scenario_mirror_pull_airgapped() {
  pods_enter || return 1
  local hosts out
  hosts=$(in_machine kube1 cat "/etc/containerd/certs.d/$POD_REGISTRY_NAME/hosts.toml")
  check "hosts.toml names the mirror and its CA" grep -q "^ca = \"/etc/containerd/certs.d/$POD_REGISTRY_NAME/ca.crt\"" <<<"$hosts" || { echo "$hosts" >&2; return 1; }
  # shellcheck disable=SC2016 # expanded in the machine
  out=$(in_machine kube1 sh -c '
    d=/run/e2e-hosts-no-ca/'"$POD_REGISTRY_NAME"'; mkdir -p $d
    grep -v "^ *ca = " /etc/containerd/certs.d/'"$POD_REGISTRY_NAME"'/hosts.toml >$d/hosts.toml
    ctr -n e2e-no-ca images pull --hosts-dir /run/e2e-hosts-no-ca '"$POD_REGISTRY_NAME"'/e2e/hello:1' 2>&1) &&
    { echo "$out" >&2; fail "a pull without the rendered CA succeeded"; return 1; }
  check "without the CA the pull fails on the certificate" grep -qi 'x509\|certificate' <<<"$out" || { echo "$out" >&2; return 1; }
  out=$(in_machine kube1 ctr -n e2e-with-ca images pull --hosts-dir /etc/containerd/certs.d "$POD_REGISTRY_NAME/e2e/hello:1" 2>&1) ||
    { echo "$out" >&2; fail "the same pull with the rendered hosts.toml"; return 1; }
  in_machine kube1 ctr -n e2e-with-ca images rm "$POD_REGISTRY_NAME/e2e/hello:1" >/dev/null 2>&1 || true
  log "  ok: the rendered CA is what the mirror pull needs"
}

# The flip to kube2 (v2): the image pulled on kube1 is in kube2's containerd
# (node state in /var/lib/kubeslot/node/containerd survived), and with both
# registries stopped a static pod runs from it there (the kubelet finds the
# image present and pulls nothing).
scenario_image_cache_survives_flip() {
  pods_enter || return 1
  pods_config "$REF_v2"
  act activate || { show_log; log_report; fail "activate v2 in the pod outer exited non-zero"; return 1; }
  expect_running kube2 v1.35.1-e2e.2 || return 1
  local listed
  listed=$(in_machine kube2 crictl images -o json | jq -r '.images[].repoTags[]')
  check "kube2's containerd has the image pulled on kube1" grep -qx "$POD_REGISTRY_NAME/e2e/hello:1" <<<"$listed" || { echo "$listed" >&2; return 1; }
  # no registry from here on: the container must come from the cache
  local pid
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$WORK/pods/registries.pid"
  : >"$WORK/pods/registries.pid"
  # (a registry shuts down gracefully: wait up to 10 s for the port to close)
  local deadline=$((SECONDS + 10))
  while nsenter -t "$OUTER_LEADER" -n bash -c "exec 3<>/dev/tcp/127.0.0.1/${POD_MIRROR#*:}" 2>/dev/null &&
    [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  check_refused "the mirror is down" 127.0.0.1 "${POD_MIRROR#*:}" nsenter -t "$OUTER_LEADER" -n || return 1
  cri_manifest kube2 cached <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: cached
spec:
  restartPolicy: Never
  containers:
  - name: hello
    image: $POD_REGISTRY_NAME/e2e/hello:1
EOF2
  cri_wait_log kube2 cached hello 0 'hello from an e2e pod' 60 >/dev/null || return 1
  check "the kubelet found the image present (no pull)" \
    kubelet_log_wait kube2 'Container image already present on machine.*pod="default/cached-e2e-node"' 10 || return 1
}

# The baked pause image: in kube2 its import was skipped (already there from
# kube1's first boot, node state survived), the unit finished before the
# kubelet started, the image is the pinned digest under the name
# containerd's pinned sandbox image gives, and kube2's pod sandbox runs on
# it. Last pod scenario: the pod outer host is stopped.
scenario_preloaded_pause() {
  pods_enter || return 1
  local got done_at started_at out
  got=$(in_machine kube2 journalctl -u kubeslot-images --no-pager -o cat | grep 'registry.k8s.io/pause' || true)
  check "kube2 skipped the import (kept from kube1)" grep -q "registry.k8s.io/pause:3.10.2: already imported ($PAUSE_DIGEST)" <<<"$got" || { echo "$got" >&2; return 1; }
  done_at=$(outer systemctl -M kube2 show kubeslot-images -p ExecMainExitTimestampMonotonic --value)
  started_at=$(outer systemctl -M kube2 show kubelet -p ExecMainStartTimestampMonotonic --value)
  check "the import finished before the kubelet started ($done_at <= $started_at)" test "$done_at" -le "$started_at" || return 1
  got=$(in_machine kube2 ctr -n k8s.io images ls "name==registry.k8s.io/pause:3.10.2" | awk 'NR > 1 { print $3 }')
  check_eq "registry.k8s.io/pause:3.10.2 in containerd" "$got" "$PAUSE_DIGEST" || return 1
  out=$(in_machine kube2 crictl pods -o json | jq -r '.items[] | select(.metadata.name == "cached-e2e-node") | .state')
  check_eq "kube2's pod sandbox (the pause image) is ready" "$out" SANDBOX_READY || return 1
  pods_cleanup
  rm -rf --one-file-system "$WORK/pod-outer"
}
