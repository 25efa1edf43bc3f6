# shellcheck shell=bash
# REF_vN/DIGEST_vN are assigned by images.sh (printf -v), sourced first by run.sh;
# grep | wc -l counts stay as written (a style note only).
# shellcheck disable=SC2154,SC2126
# The activator scenarios, sourced by ci/e2e/run.sh: the real
# kubeslot-activator binary (installed in the outer host from its Debian
# package, ci/deb/build.sh, with dpkg -i: /usr/bin/kubeslot-activator and the
# shipped units) driven through nsenter against the outer's real systemd and
# machined, with images from the local registry.
#
# Scenarios run in order and build on each other (v1 on kube1, v2 flips to
# kube2, ...), like a node's life. Assertions use ground truth first (which
# systemd-nspawn@ unit is active, what the machine's kubelet answers, what the
# registry served) and the activator's own status/report second.

CONFIG_IN_OUTER=/etc/kubeslot/activator.json
ACT_RUNS=0

# The preflight checks this machine fails for reasons a real host would not
# have, each ignored in the e2e config (write_config) and nowhere else:
#  * cgroup-v2: this CI machine boots a hybrid v1/v2 cgroup layout (E2E.md);
#    the node machines still boot and their fixture kubelet answers, only
#    pods could not run (the smoke scenario runs one in the hybrid layout).
#  * sysctl-*: the outer host is a container: its /proc/sys is read-only
#    and holds this CI machine's values (vm.overcommit_memory=0,
#    kernel.panic=1, ...), which the tests must not change;
#    systemd-sysctl cannot write a read-only /proc/sys, so the activator's
#    drop-in cannot take effect there. The fixture kubelet checks them
#    inside each node machine, where the TEST-ONLY unit
#    kubeslot-test-kernel-defaults shows it the wanted values. (The unit
#    tests check both on fake /proc trees.)
#  * dev-kmsg: nspawn gives the outer no /dev/kmsg character device.
# preflight_fails drops one of these to prove a refusal on real grounds.
E2E_PREFLIGHT_IGNORE='["cgroup-v2", "sysctl-*", "dev-kmsg"]'

# ---------------------------------------------------------------- helpers

# act_setup: the cluster CA (a real self-signed certificate), the trusted
# public key, the content the config refers to.
act_setup() {
  mkdir -p "$OUTER/etc/kubeslot/trust"
  # the cluster CA: the fixture API server's (apiserver_start), which its
  # kubelets must trust
  cp "$WORK/apiserver/pki/ca.crt" "$WORK/ca.crt"
  install -m 0644 "$WORK/keys/e2e.pub" "$OUTER/etc/kubeslot/trust/e2e.pub"
  # the unbounded agent's KUBELET_EXTRA_ARGS convention, on the host side
  # (expect_rendered finds the flag on the kubelet's command line)
  printf 'KUBELET_EXTRA_ARGS="--v=3"\n' >"$OUTER/etc/kubeslot/default-kubelet"
}

# write_config IMAGE: the activator config inside the outer host.
# The node uses the host network, as in production ("network": "host",
# VirtualEthernet=no): the activator's health gate GETs
# 127.0.0.1:10248/healthz from the host's own network namespace (a plain
# TcpStream in activator/src/gate/health.rs), which a machine on a private veth
# does not share, so with "veth" every gate fails. The outer shares this
# machine's network, so preflight requires 127.0.0.1:10248 to be free here.
# KUBESLOT_E2E_NETWORK=veth writes "veth" instead (design_files proves both
# modes by hand). The gate: 2 good probes 500 ms apart within 20 s
# (E2E_HEALTH_TIMEOUT=SECONDS instead). The preflight ignores
# E2E_PREFLIGHT_IGNORE (PREFLIGHT_IGNORE=JSON replaces it). E2E_CLUSTER=JSON
# adds it as the config's `cluster` section (ci/e2e/drain.sh).
write_config() {
  config_json "$1" /etc/kubeslot/trust/e2e.pub >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
}

# config_json IMAGE KEY: the config text, trusting the public key file KEY
# (a path inside the outer host); for an oci:/oci-archive: IMAGE or one in
# REGISTRY/IMAGE_REPO, trust.identity is REGISTRY/IMAGE_REPO.
config_json() {
  local image=$1 trust
  trust=$(jq -n --arg key "$2" '{public_keys: [$key]}')
  # A layout or archive names no repository: the host is told which one
  # the signatures must name (the registry images' own repository, which
  # `kubeslot-builder sign` signed and archives carry unchanged).
  # A registry image of that repository gets it too (the default would
  # be the same), so `unpack` of an archive with this config checks it.
  case $image in
    oci:* | oci-archive:* | "$REGISTRY/$IMAGE_REPO":* | "$REGISTRY/$IMAGE_REPO"@*)
      trust=$(jq --arg id "$REGISTRY/$IMAGE_REPO" '.identity = $id' <<<"$trust") ;;
  esac
  jq -n --arg image "$image" --arg ca "$(cat "$WORK/ca.crt")" --argjson trust "$trust" --arg api "$APISERVER" \
    --argjson ignore "${PREFLIGHT_IGNORE:-$E2E_PREFLIGHT_IGNORE}" \
    --arg network "${KUBESLOT_E2E_NETWORK:-host}" --arg slots "${KUBESLOT_E2E_SLOTS:-}" \
    --argjson cluster "${E2E_CLUSTER:-null}" --argjson health_timeout "${E2E_HEALTH_TIMEOUT:-20}" '{
    image: $image,
    trust: $trust,
    kubelet: {
      api_server: $api,
      ca_data: $ca,
      bootstrap_token: "abcdef.0123456789abcdef",
      cluster_dns: ["10.96.0.10"],
      node_name: "e2e-node",
      labels: {"kubeslot.io/e2e": "true"},
      taints: ["kubeslot.io/e2e=true:NoSchedule"]
    },
    gpu: "off",
    network: $network,
    nameservers: ["192.0.2.53"],
    health: {timeout_secs: $health_timeout, successes: 2, interval_ms: 500},
    preflight: {ignore: $ignore}
  } + (if $slots == "" then {} else {slots: {mode: $slots}} end)
    + (if $cluster == null then {} else {cluster: $cluster} end)'
}

# tree_cat MACHINE PATH: a file of MACHINE's tree as the outer host sees it
# (an overlay slot is a mount in the outer's mount namespace, not visible
# under $OUTER from here).
tree_cat() { outer cat "/var/lib/machines/$1/$2"; }

# staging_dirs: staging dirs of slot trees (copy mode) and of the layer
# store (overlay mode) under the outer's root.
staging_dirs() {
  find "$OUTER/var/lib/machines" -maxdepth 1 -name '.*staging*'
  [ ! -d "$OUTER/var/lib/kubeslot/layers" ] || find "$OUTER/var/lib/kubeslot/layers" -maxdepth 1 -name '.staging-*'
}

# act ARGS...: runs the activator in the outer host; its output goes to a
# numbered log (printed on failure by the caller) and ACT_LOG names it.
act() {
  ACT_RUNS=$((ACT_RUNS + 1))
  ACT_LOG=$WORK/logs/activator-${E2E_SCENARIO:-setup}-$ACT_RUNS-$1.log
  log "  kubeslot-activator $*"
  outer kubeslot-activator "$@" >"$ACT_LOG" 2>&1
}

# act_bg ARGS...: the same in the background; ACT_PID is nsenter's PID and
# act_child_pid finds the activator process below it (to SIGKILL it).
act_bg() {
  ACT_RUNS=$((ACT_RUNS + 1))
  ACT_LOG=$WORK/logs/activator-${E2E_SCENARIO:-setup}-$ACT_RUNS-$1.log
  log "  kubeslot-activator $* (background)"
  # created empty before the job starts: a caller polling it must not find
  # it missing or holding another run's lines
  : >"$ACT_LOG"
  outer kubeslot-activator "$@" >>"$ACT_LOG" 2>&1 &
  ACT_PID=$!
}

# act_error: the error line of the last run's output (progress lines, which
# name digests too, are not evidence of what the error says).
act_error() { grep '^error: ' "$ACT_LOG" | tail -n1; }

# act_child_pid: the activator process below ACT_PID (the background job is
# a subshell running `outer`, whose nsenter forks the activator into the
# outer's PID namespace); matched by its executable, searched breadth first.
act_child_pid() {
  local queue=("$ACT_PID") pid child
  while [ ${#queue[@]} -gt 0 ]; do
    pid=${queue[0]}; queue=("${queue[@]:1}")
    if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /usr/bin/kubeslot-activator ]; then
      echo "$pid"; return 0
    fi
    for child in $(ps -o pid= --ppid "$pid"); do queue+=("$child"); done
  done
  return 1
}

show_log() { sed 's/^/    | /' "$ACT_LOG" >&2; }

unit_active() { outer systemctl is-active --quiet "systemd-nspawn@$1.service"; }

# active_machines: the node machines whose nspawn unit is active.
active_machines() {
  local m out=""
  for m in kube1 kube2; do unit_active "$m" && out="$out $m"; done
  echo "${out# }"
}

# flatten FILE: every JSON scalar as `path=value` lines (the checks below
# then do not depend on how deep a field sits).
flatten() {
  jq -r 'paths(scalars) as $p | "\($p | map(tostring) | join("."))=\(getpath($p))"' "$1"
}

status_json() {
  local out=$WORK/logs/status-${E2E_SCENARIO:-setup}-$ACT_RUNS.json
  outer kubeslot-activator status --json >"$out" 2>"$out.err" ||
    { fail "status --json failed: $(cat "$out.err")"; return 1; }
  jq -e . "$out" >/dev/null || { fail "status --json is not JSON: $(head -c 300 "$out")"; return 1; }
  echo "$out"
}

report_file() { echo "$OUTER/var/lib/kubeslot/report.json"; }

# expect_running MACHINE KUBELET_VERSION: the machine is up, its containerd
# answers, its kubelet is healthy and has the expected version, and the other
# slot is not running.
expect_running() {
  local m=$1 version=$2 other cri got
  other=kube1; [ "$m" = kube1 ] && other=kube2
  check "systemd-nspawn@$m active" unit_active "$m" || return 1
  check_unit_inactive "systemd-nspawn@$other.service" || return 1
  check "kubelet healthy in $m" machine_wait_healthy "$m" 30 || return 1
  got=$(outer systemd-run -M "$m" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null)
  check_eq "kubelet version in $m" "$got" "Kubernetes $version" || return 1
  cri=$(outer systemd-run -M "$m" --quiet --wait --pipe crictl version </dev/null) ||
    { fail "crictl version in $m"; return 1; }
  check "containerd answers CRI v1 in $m" grep -qx 'RuntimeApiVersion:  v1' <<<"$cri"
}

# expect_status MACHINE DIGEST: `status --json` ({"state": ..., "report":
# ...}) names MACHINE as the active slot, with status "active" and DIGEST (or
# its linux/amd64 manifest digest) as its image, and no pending flip.
expect_status() {
  local file pdigest got
  file=$(status_json) || return 1
  pdigest=${PLATFORM_DIGEST[$2]:-$2}
  got=$(jq -r --arg m "$1" '[.state.active, .state.slots[$m].status, .state.slots[$m].digest, (.state.pending != null)] | map(tostring) | join(" ")' "$file")
  case $got in
    "$1 active $2 false" | "$1 active $pdigest false") log "  ok: status --json: $got" ;;
    *) sed 's/^/    | /' "$file" >&2
       fail "status --json: expected '$1 active $2 false' (active, its status, its digest, pending), got '$got'"
       return 1 ;;
  esac
}

# expect_rendered MACHINE: the host files the activator rendered for MACHINE
# take effect on real systemd and nspawn: the drop-in's restart policy and
# its Requires= on kubeslot-render@MACHINE (which ran and succeeded), the
# .nspawn's PrivateUsers=no (identity uid map) and VirtualEthernet=no (the
# host's network namespace), and inside the machine the bound host files
# (read-only), hostname, resolv.conf and the kubelet drop-in, whose
# $KUBELET_ARGS reach the kubelet process.
expect_rendered() {
  local m=$1 got leader
  got=$(outer systemctl show "systemd-nspawn@$m.service" -p Restart -p RestartUSec -p StartLimitIntervalUSec --value | paste -sd' ')
  check_eq "rendered drop-in: Restart RestartSec StartLimitIntervalSec of $m" "$got" "on-failure 10s 0" || return 1
  check "rendered drop-in: $m requires kubeslot-render@$m" grep -q "kubeslot-render@$m.service" \
    <<<"$(outer systemctl show "systemd-nspawn@$m.service" -p Requires --value)" || return 1
  got=$(outer systemctl show "kubeslot-render@$m.service" -p Result -p ExecMainStatus --value | paste -sd' ')
  check_eq "kubeslot-render@$m ran before the start" "$got" "success 0" || return 1
  check "kubeslot-render@$m has run" test "$(outer systemctl show "kubeslot-render@$m.service" -p ExecMainStartTimestampMonotonic --value)" != 0 || return 1
  leader=$(outer machinectl show "$m" -p Leader --value)
  check_eq "uid map of $m (rendered PrivateUsers=no)" "$(outer cat "/proc/$leader/uid_map" | tr -s ' ' | sed 's/^ //')" "0 0 4294967295" || return 1
  check_eq "network namespace of $m (rendered VirtualEthernet=no)" "$(outer readlink "/proc/$leader/ns/net")" "$(outer readlink /proc/1/ns/net)" || return 1
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(outer systemd-run -M "$m" --quiet --wait --pipe sh -c '
    cat /etc/hostname
    grep -c "^nameserver 192.0.2.53$" /etc/resolv.conf
    touch /etc/kubeslot/host/x 2>/dev/null && echo host-files-writable || echo host-files-read-only
    systemctl show kubelet -p DropInPaths --value | tr " " "
" | grep -c "/kubelet.service.d/20-kubeslot.conf$"
    tr "\0" "\n" </proc/$(systemctl show kubelet -p MainPID --value)/cmdline | grep -c "^--hostname-override=e2e-node$"
    tr "\0" "\n" </proc/$(systemctl show kubelet -p MainPID --value)/cmdline | tail -n1
    stat -f -c %T /sys/fs/bpf
  ' </dev/null | paste -sd' ')
  check_eq "in $m: hostname, resolv.conf, host files, kubelet drop-in, kubelet args, the host's extra args last, private bpffs" \
    "$got" "e2e-node 1 host-files-read-only 1 1 --v=3 bpf_fs" || return 1
  check "the outer host mounted $m's bpffs before its start (run-bpffs-$m.mount)" \
    outer findmnt -n -t bpf "/run/bpffs/$m"
}

# flip_watch OLD NEW FILE: records (ms) when OLD's unit stops being active
# and when NEW's kubelet first answers /healthz. Runs in the background.
flip_watch() {
  local old=$1 new=$2 file=$3 t_stop="" t_healthy="" deadline=$((SECONDS + 180))
  while [ $SECONDS -lt $deadline ]; do
    if [ -z "$t_stop" ] && ! unit_active "$old"; then
      t_stop=$(now_ms)
    fi
    if [ -n "$t_stop" ] && [ "$(machine_probe "$new" /healthz)" = ok ]; then
      t_healthy=$(now_ms)
      break
    fi
    sleep 0.05
  done
  echo "$t_stop $t_healthy" >"$file"
}

# print_downtime FILE NEW LABEL: the measured downtime beside the kubelet's
# own start (from the fixture's /startz); also kept in WORK/downtime.txt for
# the summary.
print_downtime() {
  local t_stop t_healthy startz started serving line
  read -r t_stop t_healthy <"$1" || true
  if [ -z "$t_stop" ] || [ -z "$t_healthy" ]; then
    fail "flip downtime not measured (old stopped at '${t_stop}', new healthy at '${t_healthy}')"
    return 1
  fi
  startz=$(machine_probe "$2" /startz) || { fail "no /startz from $2"; return 1; }
  started=$(jq -r .started_unix_ms <<<"$startz")
  serving=$(jq -r .serving_unix_ms <<<"$startz")
  line="FLIP DOWNTIME ($3): $((t_healthy - t_stop)) ms from old machine stopped to new kubelet healthy; the new kubelet process started at +$((started - t_stop)) ms and listened at +$((serving - t_stop)) ms"
  echo "$line"
  echo "$line" >>"$WORK/downtime.txt"
}

# ---------------------------------------------------------------- scenarios

# hand_nspawn MACHINE: the .nspawn file DESIGN.md section 5 prescribes (with a
# private veth, as the e2e config asks), written by hand for the scenarios
# that run before `activate` renders it. Without the rendered drop-in these
# machines get nspawn's own cgroup layout, which on this hybrid CI host is
# cgroup v1: a kubelet config drop-in bound in (as the activator binds its
# own) says failCgroupV1: false, which the kubelet (and its fixture) want
# before they run there.
hand_nspawn() {
  mkdir -p "$OUTER/etc/systemd/nspawn" "$OUTER/etc/kubeslot/e2e"
  printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n' \
    >"$OUTER/etc/kubeslot/e2e/40-allow-cgroup-v1.conf"
  cat >"$OUTER/etc/systemd/nspawn/$1.nspawn" <<'EOF2'
[Exec]
Boot=yes
# TEST-ONLY: the node's systemd (257) refuses to boot on this host's
# hybrid cgroup layout unless told so (systemd reads a machine's argv as
# its kernel command line)
Parameters=SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1
Capability=all
PrivateUsers=no
SystemCallFilter=@keyring bpf perf_event_open

[Network]
VirtualEthernet=yes

[Files]
BindReadOnly=/etc/kubeslot/e2e/40-allow-cgroup-v1.conf:/etc/kubernetes/kubelet/config.d/40-allow-cgroup-v1.conf
EOF2
  outer systemctl daemon-reload
}

machine_stop() {
  outer machinectl stop "$1" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while unit_active "$1" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  ! unit_active "$1"
}

# The activator's fetch/verify/unpack path on its own (`unpack --root /`,
# the host's content store), before `activate` exists: v1 from the registry
# into kube1 boots and is healthy; v2 into kube2 downloads only v2's new
# layer and boots; a tampered v4 layer is refused and never stored; v1 from
# an oci-archive with an empty store unpacks the same tree. The host is left
# empty again for the activate scenarios.
scenario_unpack_and_boot() {
  act_setup
  write_config "$REF_v1"
  local mark got changed t0
  t0=$(now_ms)
  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v1" /var/lib/machines/kube1 ||
    { show_log; fail "unpack v1 exited non-zero"; return 1; }
  log "  unpack v1 (download + verify + unpack) took $(($(now_ms) - t0)) ms"
  hand_nspawn kube1
  outer systemctl start systemd-nspawn@kube1.service
  expect_running kube1 v1.35.0-e2e.1 || return 1

  # v2 into kube2 while kube1 runs, then a flip by hand: the platform's
  # downtime floor, printed beside the activator's own flip later.
  changed=$(comm -13 <(layer_digests "$REF_v1" | sort) <(layer_digests "$REF_v2" | sort) | sort)
  mark=$(registry_log_lines)
  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v2" /var/lib/machines/kube2 ||
    { show_log; fail "unpack v2 exited non-zero"; return 1; }
  got=$(registry_blob_gets "$mark" | grep -Fxf <(layer_digests "$REF_v2") | sort || true)
  # shellcheck disable=SC2086,SC2116 # echo unquoted: the lists compared as one line of words
  check_eq "layer blobs downloaded for v2" "$(echo $got)" "$(echo $changed)" || return 1
  hand_nspawn kube2
  local watch=$WORK/flip-manual.txt watcher
  flip_watch kube1 kube2 "$watch" &
  watcher=$!
  check "kube1 stops" machine_stop kube1 || return 1
  outer systemctl start systemd-nspawn@kube2.service
  wait "$watcher" || true
  expect_running kube2 v1.35.1-e2e.2 || return 1
  print_downtime "$watch" kube2 "by hand: machinectl stop + systemctl start" || return 1
  check "kube2 stops" machine_stop kube2 || return 1

  local layer hex data rc=0
  layer=$(kube_layer "$REF_v4")
  hex=${layer#sha256:}
  data=$WORK/registry/storage/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex/data
  cp "$data" "$WORK/v4-layer.orig"
  tamper_file "$data"
  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v4" /var/tmp/v4-tree || rc=$?
  cp "$WORK/v4-layer.orig" "$data"
  [ $rc != 0 ] || { show_log; fail "a tampered layer was unpacked"; return 1; }
  log "  tampered v4 refused: $(act_error)"
  check "error names the layer digest" grep -q "$hex" <<<"$(act_error)" || { show_log; return 1; }
  check "no tampered blob in the content store" test ! -e "$OUTER/var/lib/kubeslot/blobs/sha256/$hex" || return 1
  check "no v4 tree" test ! -e "$OUTER/var/tmp/v4-tree/usr" || return 1

  # Unsigned: refused by the default policy (keys configured, no signature).
  rc=0
  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_UNSIGNED" /var/tmp/unsigned-tree || rc=$?
  [ $rc != 0 ] || { show_log; fail "an unsigned image was unpacked"; return 1; }
  log "  unsigned image refused: $(act_error)"
  check "error names the missing signature" grep -qi 'signature' <<<"$(act_error)" || { show_log; return 1; }
  check "no unsigned tree" test ! -e "$OUTER/var/tmp/unsigned-tree/usr" || return 1

  archive_with_signature v1 "$OUTER/var/tmp/node-v1.tar" || { fail "no oci-archive of v1"; return 1; }
  act unpack --config "$CONFIG_IN_OUTER" "oci-archive:/var/tmp/node-v1.tar:v1" /var/tmp/v1-from-archive ||
    { show_log; fail "unpack from oci-archive exited non-zero"; return 1; }
  check "archive tree has the v1 kubelet" cmp "$OUTER/var/tmp/v1-from-archive/usr/bin/kubelet" "$WORK/kubelet/v1/kubelet" || return 1
  # (usr/bin and the units: booting kube1 changed parts of its /etc)
  local d
  for d in usr/bin etc/systemd/system; do
    check "archive tree equals the registry tree in /$d" \
      diff -r --no-dereference -q "$OUTER/var/tmp/v1-from-archive/$d" "$OUTER/var/lib/machines/kube1/$d" || return 1
  done

  rm -rf --one-file-system "$OUTER/var/lib/machines/kube1" "$OUTER/var/lib/machines/kube2" \
    "$OUTER/var/tmp/v1-from-archive" "$OUTER/var/tmp/v4-tree" "$OUTER/var/tmp/node-v1.tar" \
    "$OUTER/var/tmp/unsigned-tree" \
    "$OUTER/var/lib/kubeslot" "$OUTER"/etc/systemd/nspawn/kube?.nspawn
  outer systemctl daemon-reload
}

# store_is_clean: every blob in the content store hashes to its name (a
# killed download must never leave a wrong blob under a good name).
store_is_clean() {
  local f bad=0
  for f in "$OUTER"/var/lib/kubeslot/blobs/sha256/*; do
    [ -f "$f" ] || continue
    case ${f##*/} in .*) continue ;; esac
    [ "$(sha256sum <"$f" | cut -d' ' -f1)" = "${f##*/}" ] || { log "  bad blob $f"; bad=1; }
  done
  return $bad
}

# wait_for_path GLOB TIMEOUT_S: until something matches GLOB (while ACT_PID runs).
wait_for_path() {
  local deadline=$((SECONDS + $2)) f
  while [ $SECONDS -lt $deadline ] && kill -0 "$ACT_PID" 2>/dev/null; do
    for f in $1; do [ -e "$f" ] && { echo "$f"; return 0; }; done
    sleep 0.02
  done
  return 1
}

# activate_killed_when WHAT CMD...: `activate` in the background, SIGKILLed
# as soon as CMD succeeds (polled every 20 ms, 180 s at most); fails, naming
# WHAT, when CMD never succeeds while the activator runs.
activate_killed_when() {
  local what=$1; shift
  act_bg activate
  local deadline=$((SECONDS + 180))
  while [ $SECONDS -lt $deadline ] && kill -0 "$ACT_PID" 2>/dev/null && ! "$@"; do
    sleep 0.02
  done
  if ! "$@" || ! kill -0 "$ACT_PID" 2>/dev/null; then
    wait "$ACT_PID" || true; show_log
    fail "the activator never got to: $what (or ended before the kill)"; return 1
  fi
  kill_activator || return 1
  log "  killed with $what; running now: '$(active_machines)'"
}

unit_inactive() { ! unit_active "$1"; }

# kill_activator: SIGKILL the running background activator.
kill_activator() {
  local pid
  pid=$(act_child_pid) || { fail "no activator process below $ACT_PID"; return 1; }
  kill -KILL "$pid"
  wait "$ACT_PID" 2>/dev/null || true
  log "  SIGKILLed the activator (pid $pid)"
}

# The activator's unpack path killed twice: mid-download (a partial blob in
# the store) and mid-unpack (a staging dir being filled). Each time the
# target does not exist afterwards, the store holds only good blobs, and the
# next run completes: the tree appears and boots.
scenario_unpack_killed() {
  act_setup
  write_config "$REF_v1"
  rm -rf "$OUTER/var/lib/kubeslot" "$OUTER/var/lib/machines/kube1"
  local target=/var/lib/machines/kube1 found
  act_bg unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v1" "$target"
  found=$(wait_for_path "$OUTER/var/lib/kubeslot/blobs/sha256/.partial-*" 60) ||
    { wait "$ACT_PID" || true; show_log; fail "never saw a partial blob while downloading"; return 1; }
  kill_activator || return 1
  log "  killed while ${found##*/} was downloading"
  check "no tree after the kill mid-download" test ! -e "$OUTER$target" || return 1
  check "store holds only good blobs" store_is_clean || return 1

  act_bg unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v1" "$target"
  found=$(wait_for_path "$OUTER/var/lib/machines/.staging-kube1-*/usr/bin" 120) ||
    { wait "$ACT_PID" || true; show_log; fail "never saw the staging tree filling"; return 1; }
  kill_activator || return 1
  log "  killed while ${found%/usr/bin} was being filled"
  check "no tree after the kill mid-unpack" test ! -e "$OUTER$target" || return 1
  check "store holds only good blobs" store_is_clean || return 1

  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v1" "$target" ||
    { show_log; fail "unpack after the kills exited non-zero"; return 1; }
  check_eq "stale staging dirs after the next run" \
    "$(find "$OUTER/var/lib/machines" -maxdepth 1 -name '.staging-*' | wc -l)" 0 || return 1
  check "store holds only good blobs" store_is_clean || return 1
  hand_nspawn kube1
  outer systemctl start systemd-nspawn@kube1.service
  expect_running kube1 v1.35.0-e2e.1 || return 1
  check "kube1 stops" machine_stop kube1 || return 1
  rm -rf --one-file-system "$OUTER/var/lib/machines/kube1" "$OUTER/var/lib/kubeslot" \
    "$OUTER/etc/systemd/nspawn/kube1.nspawn"
  outer systemctl daemon-reload
}

# design_files MACHINE VIRTUAL_ETHERNET: the host files of DESIGN.md
# section 5, by hand, as the activator is to render them (no GPU, no extra
# devices; VirtualEthernet=no is production's host network, yes the test's
# private veth): the .nspawn file, the systemd-nspawn@ drop-in, the
# host-rendered files bound read-only and the node state bound read-write.
design_files() {
  local m=$1 veth=$2
  mkdir -p "$OUTER/etc/systemd/nspawn" "$OUTER/etc/systemd/system/systemd-nspawn@$m.service.d" \
    "$OUTER/etc/kubeslot/host/$m" "$OUTER/var/lib/kubeslot/node/kubelet" "$OUTER/var/lib/kubeslot/node/containerd"
  echo "host-rendered for $m" >"$OUTER/etc/kubeslot/host/$m/marker"
  cat >"$OUTER/etc/systemd/nspawn/$m.nspawn" <<EOF2
[Exec]
Boot=yes
Capability=all
PrivateUsers=no
SystemCallFilter=@keyring bpf perf_event_open

[Network]
VirtualEthernet=$veth

[Files]
BindReadOnly=/lib/modules
BindReadOnly=/etc/kubeslot/host/$m:/etc/kubeslot/host
Bind=/var/lib/kubeslot/node/kubelet:/var/lib/kubelet
Bind=/var/lib/kubeslot/node/containerd:/var/lib/containerd
EOF2
  cat >"$OUTER/etc/systemd/system/systemd-nspawn@$m.service.d/override.conf" <<EOF2
[Unit]
StartLimitIntervalSec=0

[Service]
Restart=on-failure
RestartSec=10s
ExecStartPre=-/usr/bin/machinectl terminate $m
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
EOF2
  outer systemctl daemon-reload
}

# DESIGN.md section 5's files, written by hand, work on real systemd 252:
# the drop-in's keys take effect, the machine boots with the binds, the
# host-rendered dir is read-only inside, and node state under
# /var/lib/kubeslot/node survives a flip from kube1 to kube2. The reference
# the activator's renderer is compared against.
scenario_design_files() {
  local m got
  [ -d "$OUTER/var/lib/machines/kube1" ] || node_tree_fill "$OUTER/var/lib/machines/kube1" "$NODE_TAR" "$WORK/kubelet/v1/kubelet"
  [ -d "$OUTER/var/lib/machines/kube2" ] || node_tree_fill "$OUTER/var/lib/machines/kube2" "$NODE_TAR" "$WORK/kubelet/v2/kubelet"
  design_files kube1 no
  design_files kube2 yes
  got=$(outer systemctl show systemd-nspawn@kube1.service -p Restart -p RestartUSec -p StartLimitIntervalUSec --value | paste -sd' ')
  check_eq "drop-in: Restart RestartSec StartLimitIntervalSec" "$got" "on-failure 10s 0" || return 1
  check "drop-in: environment" bash -c "nsenter -t $OUTER_LEADER -m -u -i -n -p -C -- systemctl show systemd-nspawn@kube1.service -p Environment | grep -q 'SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 SYSTEMD_NSPAWN_API_VFS_WRITABLE=network'" || return 1
  outer systemctl start systemd-nspawn@kube1.service ||
    { outer journalctl -u systemd-nspawn@kube1 --no-pager -n 12 -o cat >&2; fail "systemd-nspawn@kube1 does not start"; return 1; }
  expect_running kube1 v1.35.0-e2e.1 || return 1
  got=$(outer systemd-run -M kube1 --quiet --wait --pipe sh -c 'cat /etc/kubeslot/host/marker; touch /etc/kubeslot/host/x 2>/dev/null && echo writable || echo read-only; echo state-from-kube1 >/var/lib/kubelet/identity; stat -fc %T /sys/fs/cgroup' </dev/null | paste -sd' ')
  check_eq "kube1 sees host files read-only, cgroup fs" "$got" "host-rendered for kube1 read-only cgroup2fs" || return 1
  # VirtualEthernet=no in the file wins over the stock unit's --network-veth:
  # kube1 shares the outer's network namespace, and its kubelet answers on
  # the outer's own 127.0.0.1:10248 (what a host-side health gate probes).
  local leader
  leader=$(outer machinectl show kube1 -p Leader --value)
  check_eq "kube1 network namespace (VirtualEthernet=no)" "$(outer readlink "/proc/$leader/ns/net")" "$(outer readlink /proc/1/ns/net)" || return 1
  check_eq "kube1 /healthz from the outer's own 127.0.0.1:10248" "$(outer /usr/local/bin/e2e-probe --probe /healthz 2>&1)" ok || return 1
  check "kube1 stops" machine_stop kube1 || return 1
  outer systemctl start systemd-nspawn@kube2.service
  expect_running kube2 v1.35.1-e2e.2 || return 1
  got=$(outer systemd-run -M kube2 --quiet --wait --pipe cat /var/lib/kubelet/identity /etc/kubeslot/host/marker </dev/null | paste -sd' ')
  check_eq "kube2 keeps kube1's node state, sees its own host files" "$got" "state-from-kube1 host-rendered for kube2" || return 1
  # VirtualEthernet=yes: a private namespace; the outer's 127.0.0.1:10248
  # does not reach kube2's kubelet.
  leader=$(outer machinectl show kube2 -p Leader --value)
  check "kube2 has its own network namespace (VirtualEthernet=yes)" test "$(outer readlink "/proc/$leader/ns/net")" != "$(outer readlink /proc/1/ns/net)" || return 1
  # (refused, as the probe says: a probe that could not run says otherwise)
  local probe
  probe=$(outer /usr/local/bin/e2e-probe --probe /healthz 2>&1) || true
  check "kube2's kubelet is not on the outer's 127.0.0.1:10248" \
    grep -q 'probe http://127.0.0.1:10248/healthz: Connection refused' <<<"$probe" || { echo "$probe" >&2; return 1; }
  check "kube2 stops" machine_stop kube2 || return 1
  rm -rf --one-file-system "$OUTER/var/lib/machines/kube1" "$OUTER/var/lib/machines/kube2" \
    "$OUTER/var/lib/kubeslot" "$OUTER/etc/kubeslot/host" "$OUTER"/etc/systemd/nspawn/kube?.nspawn \
    "$OUTER"/etc/systemd/system/systemd-nspawn@kube?.service.d
  outer systemctl daemon-reload
}

# ---------------------------------------------------------------- activate
#
# The node's life, in this order (each scenario starts from what the one
# before left, and reads which machine runs from systemd, not from memory):
#
#   (host.sh: unmanaged_machine_refused, adopt_unbounded leave an empty host)
#   activate_v1             empty host -> kube1 = v1
#   activate_v2_flip        kube1 -> kube2 = v2 (only v2's new layers downloaded)
#   reboot                  (host.sh) power off, boot: kube2 runs again
#   unsigned_refused        kube2 keeps running
#   preflight_fails         (host.sh) v4 refused by preflight; kube2 keeps running
#   rollback                kube2 -> kube1 = v1, no download (v2 marked bad)
#   activate_v3_rolls_back  kube1 -> kube2 = v3, gate fails, kube1 again
#   kill_mid_unpack         v4 into kube2, killed while staging; rerun commits
#   tampered_refused        v5 with a corrupted layer; kube2 keeps running
#   kill_mid_flip           v1 into kube1, killed with kube2 stopped; rerun converges
#   kill_mid_gate           v5 into the idle slot, killed in its health gate; rerun commits
#   config_change_activates the shipped .path unit runs the .service on a config write (v4)
#   reboot_mid_flip         (host.sh) v5 into the idle slot, power loss in its gate; boot rolls back
#   airgap_archive          v6 (or a release not running) from an oci-archive, registry stopped, empty store
#
# Why this order: a failed v3 is staged into the idle slot, so `rollback`
# (to the slot holding v1) must come before it; and a refused tampered image
# leaves the idle slot marked dirty (its tree is emptied by the next run, see
# docs/host/activation.md), so it comes after the rollback too.

# running_machine: the one node machine whose unit is active (fails when
# none or both are).
running_machine() {
  local r
  r=$(active_machines)
  case $r in
    kube1|kube2) echo "$r" ;;
    *) fail "expected exactly one running node machine, systemd says '$r'"; return 1 ;;
  esac
}

other_machine() { if [ "$1" = kube1 ]; then echo kube2; else echo kube1; fi; }

# digest_alternatives DIGEST: DIGEST and its linux/amd64 manifest digest, as
# an ERE alternation (status may name either).
digest_alternatives() {
  local p=${PLATFORM_DIGEST[$1]:-$1}
  if [ "$p" = "$1" ]; then echo "$1"; else echo "($1|$p)"; fi
}

# log_report: the report's outcome, exit code, downloads and error, one line.
log_report() {
  local f
  f=$(report_file)
  [ -s "$f" ] || { log "  (no report.json)"; return 0; }
  log "  report: $(jq -c '{command, exit_code, outcome, slot, previous_slot, recovered, downloads, error}' "$f" 2>/dev/null || head -c 400 "$f")"
}

# v1 onto an empty host, by the shipped oneshot unit
# (kubeslot-activator.service, from the package install_deb installed):
# kube1 boots, containerd answers through `systemd-run -M`, the kubelet is
# healthy; status --json names kube1 and v1's digest.
scenario_activate_v1() {
  act_setup
  write_config "$REF_v1"
  local t0
  t0=$(now_ms)
  ACT_RUNS=$((ACT_RUNS + 1))
  ACT_LOG=$WORK/logs/activator-${E2E_SCENARIO:-setup}-$ACT_RUNS-unit.log
  log "  systemctl start kubeslot-activator.service"
  outer systemctl start kubeslot-activator.service ||
    { outer journalctl -u kubeslot-activator.service --no-pager -o cat >"$ACT_LOG"; show_log; log_report
      fail "kubeslot-activator.service (activate v1) failed"; return 1; }
  outer journalctl -u kubeslot-activator.service --no-pager -o cat >"$ACT_LOG"
  log "  activate v1 onto an empty host took $(($(now_ms) - t0)) ms"
  log_report
  # unset: overlay, which the outer host can do
  check_eq "slot mode (KUBESLOT_E2E_SLOTS=${KUBESLOT_E2E_SLOTS:-})" "$(jq -r .slot_mode "$(report_file)")" "${KUBESLOT_E2E_SLOTS:-overlay}" || return 1
  expect_running kube1 v1.35.0-e2e.1 || return 1
  expect_status kube1 "$DIGEST_v1" || return 1
  expect_rendered kube1 || return 1
  # The machine's journald stays off /dev/kmsg (the console here: the
  # image's journald drop-in, ReadKMsg=no): reading it, journald spun on a
  # full core (ci/e2e/README.md, "Fixed: the kubelet's own journal lines").
  local stats ticks
  # (its /proc/PID/stat twice, 2 s apart; the sum is computed here: systemd-run
  # would expand a `${...}` in the command itself)
  # shellcheck disable=SC2016 # expanded inside the machine
  stats=$(outer systemd-run -M kube1 --quiet --wait --pipe sh -c \
    'p=$(systemctl show -p MainPID --value systemd-journald); cat /proc/$p/stat; sleep 2; cat /proc/$p/stat' </dev/null)
  ticks=$(awk 'NR == 1 { a = $14 + $15 } NR == 2 { print $14 + $15 - a }' <<<"$stats")
  check "kube1's journald is idle (CPU ticks in 2 s: ${ticks:-?}, of $(getconf CLK_TCK) per s)" \
    test "${ticks:-999}" -lt $(( $(getconf CLK_TCK) * 2 / 5 )) || return 1
  # Idempotent: the same config again changes nothing and downloads nothing.
  local mark
  mark=$(registry_log_lines)
  act activate || { show_log; fail "activate v1 again exited non-zero"; return 1; }
  check_eq "layer blobs downloaded by a second activate of v1" "$(registry_blob_gets "$mark" | grep -Fxf <(layer_digests "$REF_v1") | wc -l)" 0 || return 1
  log "  (blobs it did fetch: $(registry_blob_gets "$mark" | paste -sd' '); v1's config is $(image_blobs "$REF_v1" | head -n1))"
  expect_running kube1 v1.35.0-e2e.1
}

# v2: flip to kube2; only v2's new Kubernetes layer is downloaded; kube1's
# tree stays for rollback; the downtime is printed beside the new kubelet's
# own start.
scenario_activate_v2_flip() {
  local mark changed got watch=$WORK/flip-v2.txt
  # v2's new layers: its Kubernetes layer and the builder's SBOM layer.
  changed=$(comm -13 <(layer_digests "$REF_v1" | sort) <(layer_digests "$REF_v2" | sort) | sort)
  check "v2's Kubernetes layer is among its new layers" grep -qx "$(kube_layer "$REF_v2")" <<<"$changed" || return 1
  local base
  base=$(layer_digests "$REF_v1" | head -n1)
  check "v1's base layer is known ($base)" grep -Eqx 'sha256:[0-9a-f]{64}' <<<"$base" || return 1
  check "v2 shares v1's base layer" test -z "$(grep -Fx "$base" <<<"$changed")" || return 1
  write_config "$REF_v2"
  mark=$(registry_log_lines)
  flip_watch kube1 kube2 "$watch" &
  local watcher=$!
  act activate || { show_log; log_report; kill "$watcher" 2>/dev/null; fail "activate v2 exited non-zero"; return 1; }
  wait "$watcher" || true
  log_report
  expect_running kube2 v1.35.1-e2e.2 || return 1
  expect_status kube2 "$DIGEST_v2" || return 1
  expect_rendered kube2 || return 1
  # Layer blobs fetched from the registry (the image config is a blob too and
  # changes with the layer list; it is not a layer).
  got=$(registry_blob_gets "$mark" | grep -Fxf <(layer_digests "$REF_v2") | sort || true)
  # shellcheck disable=SC2086,SC2116 # echo unquoted: the lists compared as one line of words
  check_eq "layer blobs downloaded for v2 (registry log)" "$(echo $got)" "$(echo $changed)" || return 1
  check_eq "layer blobs the report counts as fetched" \
    "$(jq -r '.downloads.blobs_fetched' "$(report_file)")" "$(registry_blob_gets "$mark" | grep -Fxf <(image_blobs "$REF_v2") | wc -l)" || return 1
  check "kube1 tree kept for rollback" cmp -s <(tree_cat kube1 usr/bin/kubelet) "$WORK/kubelet/v1/kubelet" || return 1
  print_downtime "$watch" kube2 "kubeslot-activator activate v1 -> v2"
  # node_joins_api ran: the same Node, Ready with v2's kubelet
  if [ -s "$WORK/node-uid" ]; then node_after_flip v1.35.1-e2e.2 || return 1; fi
}

# node_snapshot: what must not change when an image is refused: the running
# machine, its kubelet's version, the active slot and digest in status, and
# the idle slot's kubelet (its tree untouched).
node_snapshot() {
  local m file
  m=$(running_machine) || return 1
  file=$(status_json) || return 1
  echo "$m" \
    "$(outer systemd-run -M "$m" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null | tr ' ' _)" \
    "$(jq -r '[.state.active, .state.slots[.state.active].digest] | join("@")' "$file")" \
    "$(tree_cat "$(other_machine "$m")" usr/bin/kubelet 2>/dev/null | sha256sum | cut -c1-16)"
}

# expect_unchanged SNAPSHOT: the node is as node_snapshot saw it, and healthy.
expect_unchanged() {
  local now
  now=$(node_snapshot) || return 1
  check_eq "running machine, kubelet, status and idle tree after the refusal" "$now" "$1" || return 1
  check "kubelet still healthy in ${1%% *}" machine_wait_healthy "${1%% *}" 10
}

# An image without a signature is refused before anything changes; the
# running machine keeps running, the idle slot's tree is untouched.
scenario_unsigned_refused() {
  local before
  before=$(node_snapshot) || return 1
  write_config "$REF_UNSIGNED"
  if act activate; then show_log; fail "an unsigned image was activated"; return 1; fi
  log "  unsigned refused: $(act_error)"
  check "error names the signature" grep -Eqi 'signature|signed' <<<"$(act_error)" || { show_log; return 1; }
  expect_unchanged "$before"
}

# v5's Kubernetes layer is corrupted in the registry's storage: refused by
# the digest check, never stored, the running machine keeps running.
scenario_tampered_refused() {
  local layer hex data before slots
  before=$(node_snapshot) || return 1
  slots=$(jq -c '.slots' "$OUTER/var/lib/kubeslot/state.json") || return 1
  layer=$(kube_layer "$REF_v5")
  hex=${layer#sha256:}
  data=$WORK/registry/storage/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex/data
  check "v5's layer is in registry storage" test -f "$data" || return 1
  cp "$data" "$WORK/v5-layer.orig"
  # Same size, one byte flipped in the middle.
  tamper_file "$data"
  write_config "$REF_v5"
  local rc=0
  act activate || rc=$?
  cp "$WORK/v5-layer.orig" "$data"
  if [ $rc = 0 ]; then show_log; fail "a tampered layer was activated"; return 1; fi
  log "  tampered refused: $(act_error)"
  log_report
  check "error names the tampered layer" grep -q "$hex" <<<"$(act_error)" || { show_log; return 1; }
  check "no tampered blob in the content store" test ! -e "$OUTER/var/lib/kubeslot/blobs/sha256/$hex" || return 1
  check "store holds only good blobs" store_is_clean || return 1
  # The refusal comes before the idle slot is marked dirty: its record
  # (the rollback target) is kept.
  check_eq "slot records after the refusal" "$(jq -c '.slots' "$OUTER/var/lib/kubeslot/state.json")" "$slots" || return 1
  expect_unchanged "$before"
}

# rollback: back to kube1 (v1) without a single blob download; downtime
# printed.
scenario_rollback() {
  local mark watch=$WORK/flip-rollback.txt watcher
  mark=$(registry_log_lines)
  flip_watch kube2 kube1 "$watch" &
  watcher=$!
  act rollback || { show_log; log_report; kill "$watcher" 2>/dev/null; fail "rollback exited non-zero"; return 1; }
  wait "$watcher" || true
  log_report
  expect_running kube1 v1.35.0-e2e.1 || return 1
  expect_status kube1 "$DIGEST_v1" || return 1
  check_eq "blobs downloaded by rollback" "$(registry_blob_gets "$mark" | wc -l)" 0 || return 1
  print_downtime "$watch" kube1 "kubeslot-activator rollback kube2 -> kube1"
}

# v3 never turns healthy: the gate fails, the machine that ran before comes
# back by itself, v3's digest is marked bad, the report names the failed
# check; a second activate of v3 is refused without touching a machine.
scenario_activate_v3_rolls_back() {
  local before target rc=0 t0
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  write_config "$REF_v3"
  t0=$(now_ms)
  act activate || rc=$?
  [ $rc != 0 ] || { show_log; fail "activate v3 succeeded; the health gate must fail"; return 1; }
  log "  activate v3 failed as expected (exit $rc) after $(($(now_ms) - t0)) ms: $(act_error)"
  log_report
  expect_running "$before" v1.35.0-e2e.1 || return 1
  expect_status "$before" "$DIGEST_v1" || return 1
  local flat bad
  flat=$(flatten "$(status_json)")
  bad=$(digest_alternatives "$DIGEST_v3")
  check "status marks v3 bad" grep -Eq "^state\.bad\.[0-9]+\.digest=$bad\$" <<<"$flat" || { echo "$flat" >&2; return 1; }
  check "report names the failed check (kubelet-healthz)" grep -q 'kubelet-healthz' <<<"$(jq -r .error "$(report_file)")" || return 1
  check "report carries v3's digest" grep -Eq "$bad" "$(report_file)" || return 1
  # the failed machine's last words, read before the rollback stopped it:
  # the v3 fixture's own line saying it serves /healthz unhealthy (since
  # the fixture speaks CRI it logs its runtime checks around that line, so
  # it need not be the very last one)
  local lines
  lines=$(jq -r '.diagnostics.kubelet[]?' "$(report_file)")
  log "  the report's last kubelet line of $target: $(tail -n 1 <<<"$lines")"
  check "report has kube2's containerd journal" \
    test -n "$(jq -r '(.diagnostics.containerd // [])[]' "$(report_file)")" ||
    { jq .diagnostics "$(report_file)" >&2; return 1; }
  check "report has the v3 kubelet's own line (serving /healthz unhealthy)" \
    grep -q "kubelet\[[0-9]*\]: fake-kubelet v1.35.2-e2e.3: serving /healthz on 127.0.0.1:10248 healthy=false" <<<"$lines" ||
    { jq .diagnostics "$(report_file)" >&2; return 1; }
  check_eq "diagnostics are of $target" "$(jq -r .diagnostics.machine "$(report_file)")" "$target" || return 1
  check "status shows them" grep -q "diagnostics of $target" <<<"$(outer kubeslot-activator status)" || return 1
  check "kubelet of the failed $target was v3's" cmp -s <(tree_cat "$target" usr/bin/kubelet) "$WORK/kubelet/v3/kubelet" || return 1

  # Not retried automatically: the same config again fails at once, no
  # machine is stopped or started, nothing is downloaded.
  local mark
  mark=$(registry_log_lines)
  rc=0
  act activate || rc=$?
  [ $rc != 0 ] || { show_log; fail "activate of the bad v3 succeeded"; return 1; }
  log "  v3 again refused (exit $rc): $(act_error)"
  check "the refusal names v3 as bad" grep -Eqi "failed before|failed on this host|not retried" <<<"$(act_error)" || { show_log; return 1; }
  check_eq "layer blobs downloaded by the refused retry" "$(registry_blob_gets "$mark" | grep -Fxf <(layer_digests "$REF_v3") | wc -l)" 0 || return 1
  check_eq "machine running after the refused retry" "$(active_machines)" "$before"
}

# SIGKILL while v4 is being unpacked into the idle slot (its staging dir
# exists); the running machine is untouched; the next run converges: the
# idle slot runs v4, nothing half-written is left behind.
scenario_kill_mid_unpack() {
  local before target staging
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  write_config "$REF_v4"
  act_bg activate
  # copy mode: the slot tree's staging dir as it fills; overlay: the staging
  # dir of v4's new layer (only that layer is unpacked: a short window)
  staging=$(wait_for_path "$OUTER/var/lib/machines/.*staging*/usr/bin $OUTER/var/lib/kubeslot/layers/.staging-*" 120) ||
    { wait "$ACT_PID" || true; show_log; fail "never saw a staging dir while the activator ran"; return 1; }
  kill_activator || return 1
  log "  killed while ${staging%/usr/bin} was being filled"
  check_eq "machine running after the kill" "$(active_machines)" "$before" || return 1
  check "kubelet healthy in $before after the kill" machine_wait_healthy "$before" 30 || return 1
  check "store holds only good blobs" store_is_clean || return 1
  act activate || { show_log; log_report; fail "activate after the kill exited non-zero"; return 1; }
  log_report
  expect_running "$target" v1.35.3-e2e.4 || return 1
  expect_status "$target" "$DIGEST_v4" || return 1
  check_eq "staging dirs left" "$(staging_dirs | wc -l)" 0
}

# SIGKILL mid-flip: v1 into the idle slot, the activator killed as soon as
# the running machine's unit went inactive (the new one starting or in its
# health gate). The next run converges: it finishes the flip (the new slot
# runs v1) or undoes it (the old slot runs v4 again, v1 not retried, exit
# non-zero for that reason only), and its report's `recovered` says which;
# either way exactly one machine runs, is healthy, and status agrees with
# systemd.
scenario_kill_mid_flip() {
  local before target
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  write_config "$REF_v1"
  activate_killed_when "$before stopped" unit_inactive "$before" || return 1
  check_eq "pending try recorded" "$(jq -r '.pending.phase + " " + .pending.to' "$OUTER/var/lib/kubeslot/state.json")" "trying $target" || return 1
  local rc=0 recovered
  act activate || rc=$?
  log "  the next activate exited $rc"
  log_report
  # Either way the next run says it recovered the dead run's try: a run
  # that started the flip over would end the same, and prove nothing.
  recovered=$(jq -r '.recovered // ""' "$(report_file)")
  local running
  running=$(running_machine) || { show_log; return 1; }
  if [ "$running" = "$target" ]; then
    [ $rc = 0 ] || { show_log; fail "flip finished but activate exited $rc"; return 1; }
    check "the next run says it finished the dead run's flip to $target" \
      grep -q "finished a dead run's flip to $target" <<<"$recovered" || { show_log; return 1; }
    expect_running "$target" v1.35.0-e2e.1 && expect_status "$target" "$DIGEST_v1"
  else
    # Undone: v1 used its one try; the refusal to retry is the only error.
    [ $rc = 0 ] || grep -Eqi "failed on this host|not retried|rolled back" <<<"$(act_error)" ||
      { show_log; fail "activate after the kill failed for another reason (exit $rc)"; return 1; }
    check "the next run says it rolled the dead run's flip to $target back" \
      grep -q "rolled back a dead run's flip to $target" <<<"$recovered" || { show_log; return 1; }
    expect_running "$before" v1.35.3-e2e.4 && expect_status "$before" "$DIGEST_v4"
  fi
}

# SIGKILL in the health gate: v5 (its layer intact again) into the idle
# slot, the activator killed as soon as the new machine's unit is active
# (the gate needs two good probes 500 ms apart, so it is still running).
# The next run finds the pending try, sees the new machine healthy and
# commits it: the new slot runs v5, the old one is stopped.
scenario_kill_mid_gate() {
  local before target
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  write_config "$REF_v5"
  activate_killed_when "$target's unit active" unit_active "$target" || return 1
  check_eq "pending try recorded" "$(jq -r '.pending.to // "none"' "$OUTER/var/lib/kubeslot/state.json")" "$target" || return 1
  act activate || { show_log; log_report; fail "activate after the kill exited non-zero"; return 1; }
  log_report
  check "the next run says it finished the dead run's flip" grep -qi "finished" <<<"$(jq -r '.recovered // ""' "$(report_file)")" || return 1
  expect_running "$target" v1.35.4-e2e.5 || return 1
  expect_status "$target" "$DIGEST_v5"
}

# The shipped units do the activation on a config change: with
# kubeslot-activator.path started, writing a new image reference into the
# config (temp file + rename, as a config tool does) runs
# kubeslot-activator.service by itself; `kubeslot-activator wait` then
# prints that run's report; v4 (kept in the idle slot) runs there.
scenario_config_change_activates() {
  # the units the package installed (install_deb)
  outer systemctl start kubeslot-activator.path
  local rc=0
  config_change_body || rc=$?
  # Later scenarios run the activator by hand: no automatic runs beside them.
  outer systemctl stop kubeslot-activator.path
  return $rc
}

config_change_body() {
  local before target inv0 inv state result deadline
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  inv0=$(outer systemctl show kubeslot-activator.service -p InvocationID --value)
  write_config "$REF_v4"
  log "  wrote the config (v4); waiting for kubeslot-activator.service to run"
  deadline=$((SECONDS + 120))
  while :; do
    inv=$(outer systemctl show kubeslot-activator.service -p InvocationID --value)
    state=$(outer systemctl show kubeslot-activator.service -p ActiveState --value)
    if [ "$inv" != "$inv0" ] && [ -n "$inv" ] && { [ "$state" = inactive ] || [ "$state" = failed ]; }; then break; fi
    [ $SECONDS -lt $deadline ] || { fail "kubeslot-activator.service did not run after the config change (state $state)"; return 1; }
    sleep 0.2
  done
  result=$(outer systemctl show kubeslot-activator.service -p Result --value)
  outer journalctl -u kubeslot-activator.service --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" >"$WORK/logs/activator-path-run.log" 2>&1 || true
  check_eq "result of the run the config change started" "$result" success ||
    { sed 's/^/    | /' "$WORK/logs/activator-path-run.log" >&2; log_report; return 1; }
  local waited
  waited=$(outer kubeslot-activator wait 2>&1) || { echo "$waited" >&2; fail "kubeslot-activator wait exited non-zero"; return 1; }
  log "  wait: $(head -n3 <<<"$waited" | paste -sd' ' | cut -c1-200)"
  check "wait prints the committed run" grep -qi 'committed' <<<"$waited" || { echo "$waited" >&2; return 1; }
  log_report
  expect_running "$target" v1.35.3-e2e.4 || return 1
  expect_status "$target" "$DIGEST_v4"
}

# free_version VERSION...: the first of VERSIONs the node does not run and
# this host has not marked bad (what a plain `activate` takes).
free_version() {
  local file v d
  file=$(status_json) || return 1
  for v in "$@"; do
    d=DIGEST_$v
    if ! jq -e --arg d "${PLATFORM_DIGEST[${!d}]:-${!d}}" --arg i "${!d}" \
      '[.state.slots[.state.active].digest] + [(.state.bad // [])[].digest] | any(. == $d or . == $i)' \
      "$file" >/dev/null; then
      echo "$v"
      return 0
    fi
  done
  fail "every one of $* runs here or is marked bad"
}

# Air-gapped: the registry stopped, the content store emptied, v6 (or, when
# the scenarios before took it, another release this node does not run)
# activated from an oci-archive file holding its signature. Last scenario:
# the registry stays down.
scenario_airgap_archive() {
  local v archive before after digest
  # (v7 last: its Node turns Ready late, which only a cluster gate waits for)
  v=$(free_version v6 v4 v5 v2 v1 v7) || return 1
  archive=$OUTER/var/tmp/node-$v.tar
  archive_with_signature "$v" "$archive" || { fail "no oci-archive of $v"; return 1; }
  registry_stop
  check_refused "registry is down" "${REGISTRY%:*}" "${REGISTRY#*:}" || return 1
  rm -rf "$OUTER/var/lib/kubeslot/blobs"
  before=$(running_machine) || return 1
  write_config "oci-archive:/var/tmp/node-$v.tar:$v"
  act activate || { show_log; log_report; fail "activate from oci-archive exited non-zero"; return 1; }
  log_report
  after=$(other_machine "$before")
  expect_running "$after" "$("$WORK/kubelet/$v/kubelet" --version | cut -d' ' -f2)" || return 1
  digest=DIGEST_$v
  expect_status "$after" "${!digest}"
}

# An independent signer: v1 pushed to another repository and signed there by
# ci/e2e/openssl-sign.py (openssl + the registry API, no kubeslot code) is
# accepted by a host trusting that openssl key, and refused by a host that
# trusts only the builder's key (the signature is bound to its key).
scenario_openssl_signer() {
  act_setup
  local ref=$REGISTRY/kubeslot/e2e-openssl:v1 digest
  push_one "oci:$IMAGE_LAYOUT:v1" "$ref"
  openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/keys/openssl.key" 2>/dev/null
  openssl ec -in "$WORK/keys/openssl.key" -pubout -out "$OUTER/etc/kubeslot/trust/openssl.pub" 2>/dev/null
  digest=$(skopeo inspect --tls-verify=false --raw "docker://$ref" | sha256sum | sed 's/^/sha256:/; s/ .*//')
  check_eq "pushed v1 keeps its digest" "$digest" "$DIGEST_v1" || return 1
  openssl_sign "$WORK/keys/openssl.key" "$ref" "$digest"
  config_json "$ref" /etc/kubeslot/trust/openssl.pub >"$OUTER/etc/kubeslot/openssl.json"
  config_json "$ref" /etc/kubeslot/trust/e2e.pub >"$OUTER/etc/kubeslot/builder-key.json"
  act unpack --config /etc/kubeslot/openssl.json --root / "$ref" /var/tmp/openssl-tree ||
    { show_log; fail "an openssl-signed image was refused"; return 1; }
  check "openssl-signed tree has the v1 kubelet" cmp "$OUTER/var/tmp/openssl-tree/usr/bin/kubelet" "$WORK/kubelet/v1/kubelet" || return 1
  local rc=0
  act unpack --config /etc/kubeslot/builder-key.json --root / "$ref" /var/tmp/openssl-other-key || rc=$?
  [ $rc != 0 ] || { show_log; fail "a signature by an untrusted key was accepted"; return 1; }
  log "  other key refused: $(act_error)"
  check "the refusal says no signature verifies with the trusted key" \
    grep -q "signature(s) found, none verifies with the 1 trusted key(s)" <<<"$(act_error)" || { show_log; return 1; }
  check "no tree for the untrusted signature" test ! -e "$OUTER/var/tmp/openssl-other-key/usr" || return 1
  rm -rf "$OUTER/var/tmp/openssl-tree" "$OUTER/etc/kubeslot/openssl.json" "$OUTER/etc/kubeslot/builder-key.json"
}

# ------------------------------------------------------------ overlay slots
# Both run with "slots": {"mode": "overlay"} whatever KUBESLOT_E2E_SLOTS
# says, start from an empty host (after adopt_unbounded) and leave one
# (`uninstall --purge`) for activate_v1.

# overlay_layers: "<name> <inode>" of every layer dir in the store (the
# images' metadata layers, meta-<chain id>, aside).
overlay_layers() {
  # the layer dirs (each has its record, <diff_id>.files, beside it)
  outer find /var/lib/kubeslot/layers -mindepth 1 -maxdepth 1 -type d ! -name 'meta-*' -printf '%f %i\n' | sort
}

# overlay_meta_layers: the metadata layers in the store, one per image.
overlay_meta_layers() {
  outer find /var/lib/kubeslot/layers -mindepth 1 -maxdepth 1 -type d -name 'meta-*' -printf '%f\n' | sort
}

# v1 into kube1 unpacks every layer; v2 into kube2 unpacks only the layers
# v1 lacks (the Kubernetes and SBOM layers), reuses the others as they are
# (same directory, same inode), and both slots are overlay mounts.
scenario_overlay_update_writes_changed_layer_only() {
  act_setup
  local before after changed n1 n2
  KUBESLOT_E2E_SLOTS=overlay write_config "$REF_v1"
  act activate || { show_log; log_report; fail "activate v1 (overlay) exited non-zero"; return 1; }
  log_report
  expect_running kube1 v1.35.0-e2e.1 || return 1
  check_eq "slot mode in the report" "$(jq -r .slot_mode "$(report_file)")" overlay || return 1
  check_eq "kube1 is an overlay mount" "$(outer findmnt -n -o FSTYPE /var/lib/machines/kube1)" overlay || return 1
  check "kube1's mount unit" outer test -f /etc/systemd/system/var-lib-machines-kube1.mount || return 1
  n1=$(layer_digests "$REF_v1" | wc -l)
  check_eq "layers v1 unpacked (all of them)" "$(jq -r '.downloads.layers_unpacked' "$(report_file)")" "$n1" || return 1
  before=$(overlay_layers)
  changed=$(comm -13 <(layer_digests "$REF_v1" | sort) <(layer_digests "$REF_v2" | sort) | wc -l)
  n2=$(layer_digests "$REF_v2" | wc -l)

  KUBESLOT_E2E_SLOTS=overlay write_config "$REF_v2"
  act activate || { show_log; log_report; fail "activate v2 (overlay) exited non-zero"; return 1; }
  log_report
  expect_running kube2 v1.35.1-e2e.2 || return 1
  check_eq "layers v2 unpacked (only the changed ones)" "$(jq -r '.downloads.layers_unpacked' "$(report_file)")" "$changed" || return 1
  check_eq "layers v2 reused" "$(jq -r '.downloads.layers_reused' "$(report_file)")" "$((n2 - changed))" || return 1
  after=$(overlay_layers)
  check_eq "layer dirs from v1 untouched (name and inode)" "$(comm -23 <(echo "$before") <(echo "$after") | wc -l)" 0 || return 1
  check_eq "layer dirs added by v2" "$(comm -13 <(echo "$before") <(echo "$after") | wc -l)" "$changed" || return 1
  check_eq "metadata layers (v1's and v2's)" "$(overlay_meta_layers | wc -l)" 2 || return 1
  check "kube2 mounts its metadata layer topmost" outer grep -q "^Options=lowerdir=/var/lib/kubeslot/layers/meta-" /etc/systemd/system/var-lib-machines-kube2.mount || return 1
  local top
  top=$(outer sed -n 's/^Options=lowerdir=\([^:,]*\).*/\1/p' /etc/systemd/system/var-lib-machines-kube2.mount)
  check_eq "kube2's root is its metadata layer's (mode, owner)" "$(outer stat -c '%a %u:%g' /var/lib/machines/kube2)" "$(outer stat -c '%a %u:%g' "$top")" || return 1
  check_eq "kube2 is an overlay mount" "$(outer findmnt -n -o FSTYPE /var/lib/machines/kube2)" overlay || return 1
  check "kube1 (stopped) still has v1's kubelet" cmp -s <(tree_cat kube1 usr/bin/kubelet) "$WORK/kubelet/v1/kubelet"
}

# A file the node writes in kube1 and an image file it changes are gone
# after a flip to kube2 and `rollback --clean`: kube1's upper holds neither,
# and its lowers, mounted alone, are byte for byte the verified v1 tree
# (`unpack` of v1 from the content store, copy mode).
scenario_overlay_rollback_is_pristine() {
  act_setup
  local m
  m=$(running_machine 2>/dev/null) || m=""
  if [ "$m" != kube1 ]; then
    # alone (not after overlay_update_writes_changed_layer_only): kube1 = v1
    KUBESLOT_E2E_SLOTS=overlay write_config "$REF_v1"
    act activate --force || { show_log; log_report; fail "activate v1 (overlay) exited non-zero"; return 1; }
  fi
  expect_running kube1 v1.35.0-e2e.1 || return 1
  outer systemd-run -M kube1 --quiet --wait --pipe /bin/sh -c \
    'echo node > /etc/written-by-node && echo changed >> /etc/debian_version' </dev/null ||
    { fail "could not write inside kube1"; return 1; }
  check "the node's file is in kube1's upper" outer test -f /var/lib/kubeslot/slots/kube1/upper/etc/written-by-node || return 1

  KUBESLOT_E2E_SLOTS=overlay write_config "$REF_v4"
  act activate || { show_log; log_report; fail "activate v4 (overlay) exited non-zero"; return 1; }
  expect_running kube2 v1.35.3-e2e.4 || return 1
  act rollback --clean || { show_log; log_report; fail "rollback --clean exited non-zero"; return 1; }
  log_report
  expect_running kube1 v1.35.0-e2e.1 || return 1
  check "the node's file is gone from kube1" outer test ! -e /var/lib/machines/kube1/etc/written-by-node || return 1
  check "the node's file is gone from kube1's upper" outer test ! -e /var/lib/kubeslot/slots/kube1/upper/etc/written-by-node || return 1
  check "debian_version not in kube1's upper" outer test ! -e /var/lib/kubeslot/slots/kube1/upper/etc/debian_version || return 1

  # kube1's image: its lowers (from its unit) mounted read-only alone,
  # against v1 unpacked afresh from the verified blobs.
  local lowers
  lowers=$(outer sed -n 's/^Options=\(lowerdir=[^,]*\),.*/\1/p' /etc/systemd/system/var-lib-machines-kube1.mount)
  outer rm -rf /var/tmp/v1-verified /var/tmp/kube1-lowers
  outer mkdir -p /var/tmp/kube1-lowers
  act unpack --config "$CONFIG_IN_OUTER" --root / "$REF_v1" /var/tmp/v1-verified || { show_log; fail "unpack of v1 for the comparison failed"; return 1; }
  outer mount -t overlay overlay -o "ro,$lowers" /var/tmp/kube1-lowers || { fail "mounting kube1's lowers"; return 1; }
  local rc=0
  outer diff -r --no-dereference /var/tmp/v1-verified /var/tmp/kube1-lowers >"$WORK/logs/pristine-diff.txt" 2>&1 || rc=$?
  outer umount /var/tmp/kube1-lowers
  check "kube1 shows the verified debian_version again" cmp -s <(tree_cat kube1 etc/debian_version) <(outer cat /var/tmp/v1-verified/etc/debian_version) || return 1
  outer rm -rf /var/tmp/v1-verified /var/tmp/kube1-lowers
  check_eq "differences between kube1's image and the verified v1 ($WORK/logs/pristine-diff.txt)" "$rc" 0 || { head -20 "$WORK/logs/pristine-diff.txt" >&2; return 1; }

  # Back to an empty host for activate_v1.
  # (--purge removes /etc/kubeslot too, issue 42: kept aside and put back)
  rm -rf "$WORK/etc-kubeslot.kept"
  cp -a "$OUTER/etc/kubeslot" "$WORK/etc-kubeslot.kept"
  act uninstall --purge || { show_log; fail "uninstall --purge exited non-zero"; return 1; }
  check "uninstall --purge removed /etc/kubeslot" test ! -e "$OUTER/etc/kubeslot" || return 1
  cp -a "$WORK/etc-kubeslot.kept" "$OUTER/etc/kubeslot"
  check_eq "mounts left under /var/lib/machines" "$(outer findmnt -rn -o TARGET | grep -c '^/var/lib/machines/' || true)" 0 || return 1
  check "layer store removed" outer test ! -e /var/lib/kubeslot/layers || return 1
  # uninstall disabled the package's boot-time activation; the scenarios
  # from activate_v1 on (reboot) need it, as after adopt_unbounded
  outer systemctl enable --quiet kubeslot-activator.service
  outer systemctl daemon-reload
}
