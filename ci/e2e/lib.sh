# shellcheck shell=bash
# Shared machinery of the end-to-end scenarios, sourced by ci/e2e/run.sh:
# a temp work dir, a private cgroup, the outer systemd host container
# (booted with systemd-nspawn, driven with nsenter), a local docker-registry,
# node trees, assertions, and the cleanup trap that always runs.
#
# It owns every process and directory it creates and removes them by PID
# and by path; it never touches this machine's /etc/systemd, /var/lib/machines
# or another session's registry, containers or cgroups.

# ---------------------------------------------------------------- logging

log() { printf '[e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

now_ms() { date +%s%3N; }

# ---------------------------------------------------------------- work dir

# WORK holds everything: the outer rootfs, the registry storage, images,
# keys, logs (a few GB at the peak). It is a private tmpfs mounted on a
# mktemp dir under KUBESLOT_E2E_TMP (default /var/tmp) when the machine has
# the memory for it (MemAvailable >= 6 GiB, or KUBESLOT_E2E_TMPFS=1), else
# that disk dir itself (KUBESLOT_E2E_TMPFS=0, and always with
# KUBESLOT_E2E_KEEP=1). Measured here: removing one 370 MB node tree takes
# ~15 s on this ext4 (mounted with `discard`), and the scenarios remove
# a dozen; on tmpfs removal is free and cleanup is one umount. (fsync is a
# no-op on tmpfs: flip times printed are the platform's, not the disk's.)
WORK_TMPFS=0

work_init() {
  WORK=$(mktemp -d "${KUBESLOT_E2E_TMP:-/var/tmp}/kubeslot-e2e.XXXXXX")
  local want=${KUBESLOT_E2E_TMPFS:-auto} avail_kb
  if [ "${KUBESLOT_E2E_KEEP:-0}" = 1 ]; then want=0; fi
  if [ "$want" = auto ]; then
    avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    want=0; [ "${avail_kb:-0}" -ge $((6 * 1024 * 1024)) ] && want=1
  fi
  if [ "$want" = 1 ]; then
    mount -t tmpfs -o size=6g,mode=0700 kubeslot-e2e "$WORK" ||
      die "cannot mount a tmpfs on $WORK (KUBESLOT_E2E_TMPFS=0 uses the disk)"
    WORK_TMPFS=1
  fi
  mkdir -p "$WORK/logs"
  log "work dir $WORK ($([ $WORK_TMPFS = 1 ] && echo tmpfs || echo disk))"
}

# ---------------------------------------------------------------- cgroups
#
# systemd-nspawn --keep-unit puts its payload/ and supervisor/ cgroups (and
# the outer's systemd its own tree) below the cgroup it starts in. Starting
# it in a private child of our own cgroup, in every hierarchy, keeps those
# dirs apart from other sessions and lets cleanup remove exactly ours.

CGROUP_DIRS=()

# (unified layout: none; outer_start asks systemd for a delegated scope)
cgroup_init() {
  local line hier path ctrl dir
  [ "${E2E_CGROUP_LAYOUT:-hybrid}" = hybrid ] || return 0
  while IFS= read -r line; do
    hier=${line%%:*}; line=${line#*:}
    ctrl=${line%%:*}; path=${line#*:}
    if [ "$hier" = 0 ] && [ -f /sys/fs/cgroup/cgroup.procs ]; then
      # pure cgroup v2 (unified hierarchy mounted at /sys/fs/cgroup)
      dir=/sys/fs/cgroup$path
    elif [ "$hier" = 0 ]; then
      dir=/sys/fs/cgroup/unified$path
    else
      ctrl=${ctrl#name=}
      dir=/sys/fs/cgroup/$ctrl$path
    fi
    [ -d "$dir" ] || continue
    dir=${dir%/}/kubeslot-e2e-$$
    mkdir -p "$dir"
    CGROUP_DIRS+=("$dir")
  done < /proc/self/cgroup
}

# Removes our cgroup dirs depth first (the kernel refuses non-empty ones, so
# a still-running process keeps its dir and we say so).
cgroup_cleanup() {
  local dir deadline=$((SECONDS + 10))
  # (an outer killed at the end of its grace takes a few seconds to leave)
  while [ $SECONDS -lt $deadline ] && [ ${#CGROUP_DIRS[@]} -gt 0 ] &&
    find "${CGROUP_DIRS[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | grep -q .; do
    sleep 0.2
  done
  for dir in "${CGROUP_DIRS[@]}"; do
    [ -d "$dir" ] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$dir" ] && log "warning: cgroup $dir still busy: $(tr '\n' ' ' <"$dir/cgroup.procs" 2>/dev/null)"
  done
  return 0
}

# ---------------------------------------------------------------- outer host

OUTER=""
OUTER_NAME=""
OUTER_NSPAWN_PID=""
OUTER_LEADER=""
# The extra nspawn arguments of the first boot, used again by every reboot.
OUTER_ARGS=()

# outer_boot ROOTFS_TAR [extra nspawn args...]: extracts the outer rootfs and
# boots it with systemd as PID 1, exactly as E2E.md measured.
# OUTER_ROOT, OUTER_NAME_WANTED, OUTER_LOG_NAME and OUTER_IDS (optional)
# boot a second outer host beside the first (the pod scenarios' own,
# ci/e2e/pods.sh), with its own console log and PID file.
outer_boot() {
  local tar=$1; shift
  OUTER_ARGS=("$@")
  OUTER=${OUTER_ROOT:-$WORK/outer}
  OUTER_NAME=${OUTER_NAME_WANTED:-ks-e2e-$$}
  OUTER_LOG=$WORK/logs/${OUTER_LOG_NAME:-outer-console.log}
  mkdir -p "$OUTER"
  tar -C "$OUTER" -xpf "$tar" --numeric-owner
  # The outer needs no network config of its own (it shares the host's) and
  # no getty on the console.
  ln -sf /dev/null "$OUTER/etc/systemd/system/console-getty.service"
  # Every real host has /lib/modules (DESIGN.md section 5 binds it into the
  # machine, and nspawn refuses to start when a bind source is missing); this
  # CI machine and its minbase rootfs have none, so give the outer an empty one.
  mkdir -p "$OUTER/usr/lib/modules"
  outer_start
}

# outer_start: boots the extracted outer (again, for the reboot scenarios)
# and waits for its systemd. The PIDs go to WORK/outer.ids too: a scenario
# that reboots the outer runs in a subshell, and the scenarios after it (and
# cleanup) read them back with outer_reload.
outer_start() {
  log "booting outer host $OUTER_NAME"
  local procs=()
  local dir
  for dir in "${CGROUP_DIRS[@]}"; do procs+=("$dir/cgroup.procs"); done
  # On a unified host nspawn keeps the unit it starts in: a transient scope
  # with Delegate=yes, whose cgroup gets the controllers (systemd-run --scope
  # execs nspawn in the same process, so the PID below is still nspawn's).
  local scope=()
  if [ "${E2E_CGROUP_LAYOUT:-hybrid}" = unified ]; then
    scope=(systemd-run --quiet --scope --collect -p Delegate=yes --description="kubeslot e2e outer host $OUTER_NAME" --)
  fi
  OUTER_LEADER=""
  # The subshell moves itself into our private cgroups, then becomes nspawn.
  # shellcheck disable=SC2016
  setsid bash -c 'for f in "${@:2:$1}"; do echo $$ > "$f"; done; shift $(($1 + 1)); exec "$@"' \
    _ "${#procs[@]}" "${procs[@]}" \
    "${scope[@]}" systemd-nspawn -D "$OUTER" -M "$OUTER_NAME" --boot --register=no --keep-unit \
      --console=passive --capability=all --system-call-filter='@keyring bpf' \
      "${OUTER_ARGS[@]}" </dev/null >>"$OUTER_LOG" 2>&1 &
  OUTER_NSPAWN_PID=$!
  local deadline=$((SECONDS + 30))
  while [ -z "$OUTER_LEADER" ]; do
    OUTER_LEADER=$(ps -o pid= --ppid "$OUTER_NSPAWN_PID" | tr -d ' ' | head -n1 || true)
    kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null || { cat "$OUTER_LOG" >&2; die "outer nspawn exited"; }
    [ $SECONDS -lt $deadline ] || die "outer has no leader process after 30 s"
    [ -n "$OUTER_LEADER" ] || sleep 0.1
  done
  echo "$OUTER_NSPAWN_PID $OUTER_LEADER" >"${OUTER_IDS:-$WORK/outer.ids}"
  local state=""
  deadline=$((SECONDS + 60))
  while :; do
    state=$(outer systemctl is-system-running 2>/dev/null || true)
    case $state in running|degraded) break ;; esac
    [ $SECONDS -lt $deadline ] || die "outer systemd is '$state' after 60 s"
    sleep 0.2
  done
  log "outer host is $state (nspawn pid $OUTER_NSPAWN_PID, leader $OUTER_LEADER)"
  if [ "$state" = degraded ]; then
    outer systemctl --failed --no-legend >&2 || true
  fi
}

# outer_reload: the outer's PIDs as the last (re)boot left them.
outer_reload() {
  OUTER_NSPAWN_PID="" OUTER_LEADER=""
  if [ -s "${OUTER_IDS:-$WORK/outer.ids}" ]; then read -r OUTER_NSPAWN_PID OUTER_LEADER <"${OUTER_IDS:-$WORK/outer.ids}"; fi
  return 0
}

# outer_kill: power loss: SIGKILL to the outer's PID 1 (the kernel kills
# every process of its PID namespace, the node machines inside included),
# then to nspawn; waits until both are gone and the outer's cgroups are
# empty, and removes them so the next boot starts clean.
outer_kill() {
  log "power loss: SIGKILL to the outer's init (pid $OUTER_LEADER) and nspawn ($OUTER_NSPAWN_PID)"
  kill -KILL "$OUTER_LEADER" 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -KILL "$OUTER_NSPAWN_PID" 2>/dev/null || true
  while kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null || kill -0 "$OUTER_LEADER" 2>/dev/null; do
    [ "$(awk '{ print $3 }' "/proc/$OUTER_NSPAWN_PID/stat" 2>/dev/null)" = Z ] && break
    sleep 0.1
  done
  wait "$OUTER_NSPAWN_PID" 2>/dev/null || true
  OUTER_NSPAWN_PID="" OUTER_LEADER=""
  : >"${OUTER_IDS:-$WORK/outer.ids}"
  cgroup_reset
}

# cgroup_reset: removes what the outer left below our cgroup dirs (its
# payload/ and supervisor/ trees), keeping the dirs themselves for the next
# boot; waits up to 10 s for the kernel to empty them.
cgroup_reset() {
  local dir deadline=$((SECONDS + 10))
  for dir in "${CGROUP_DIRS[@]}"; do
    [ -d "$dir" ] || continue
    while :; do
      find "$dir" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -z "$(find "$dir" -mindepth 1 -type d -print -quit)" ] && break
      [ $SECONDS -lt $deadline ] || { log "warning: $dir still has busy children"; break; }
      sleep 0.2
    done
  done
}

# outer CMD...: runs CMD inside the outer host (all its namespaces).
outer() {
  nsenter -t "$OUTER_LEADER" -m -u -i -n -p -C -- "$@"
}

# outer_stop: SIGTERM to the nspawn process (systemd shuts down cleanly, as
# at `poweroff`), SIGKILL after OUTER_STOP_GRACE seconds (30; cleanup, which
# removes everything anyway, waits 10: a node machine with pods inside has
# held the outer's shutdown past 30 s). Its nspawn may be a child of an ended
# scenario subshell: the loop polls the PID rather than `wait`ing.
outer_stop() {
  [ -n "$OUTER_NSPAWN_PID" ] || return 0
  if kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null; then
    log "stopping outer host (nspawn pid $OUTER_NSPAWN_PID)"
    kill -TERM "$OUTER_NSPAWN_PID" 2>/dev/null || true
    local grace=${OUTER_STOP_GRACE:-30}
    local deadline=$((SECONDS + grace))
    while kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$OUTER_NSPAWN_PID" 2>/dev/null; then
      log "outer did not stop in $grace s: SIGKILL"
      kill -KILL "$OUTER_NSPAWN_PID" 2>/dev/null || true
      sleep 1
    fi
  fi
  wait "$OUTER_NSPAWN_PID" 2>/dev/null || true
  OUTER_NSPAWN_PID=""
  OUTER_LEADER=""
  [ -z "${WORK:-}" ] || : >"${OUTER_IDS:-$WORK/outer.ids}"
}

# ---------------------------------------------------------------- registry

REGISTRY_PID=""
REGISTRY=""

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# registry_start: Debian's docker-registry on a free 127.0.0.1 port with its
# storage under WORK; sets REGISTRY=127.0.0.1:PORT and REGISTRY_LOG.
registry_start() {
  local port attempt deadline
  mkdir -p "$WORK/registry/storage"
  REGISTRY_LOG=$WORK/logs/registry.log
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    cat >"$WORK/registry/config.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $WORK/registry/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
    docker-registry serve "$WORK/registry/config.yml" >>"$REGISTRY_LOG" 2>&1 </dev/null &
    REGISTRY_PID=$!
    deadline=$((SECONDS + 15))
    while [ $SECONDS -lt $deadline ] && kill -0 "$REGISTRY_PID" 2>/dev/null; do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        REGISTRY=127.0.0.1:$port
        log "registry on $REGISTRY (pid $REGISTRY_PID, attempt $attempt)"
        return 0
      fi
      sleep 0.1
    done
    kill "$REGISTRY_PID" 2>/dev/null || true
    wait "$REGISTRY_PID" 2>/dev/null || true
  done
  die "docker-registry did not start after 5 attempts (log: $REGISTRY_LOG)"
}

# registry_alive: REGISTRY_PID is still our docker-registry, not a zombie.
# By name too: pid_max is 32768 on these machines and an e2e run starts
# tens of thousands of processes, so a PID seen later may be another's.
registry_alive() {
  [ "$(cat "/proc/$REGISTRY_PID/comm" 2>/dev/null)" = docker-registry ] &&
    [ "$(awk '{ print $3 }' "/proc/$REGISTRY_PID/stat" 2>/dev/null)" != Z ]
}

# registry_stop: SIGTERM to the registry by PID, and wait until it is gone
# (SIGKILL after 10 s). Also from a scenario's subshell, where `wait` cannot
# wait for it: it polls the PID.
registry_stop() {
  [ -n "$REGISTRY_PID" ] || return 0
  if registry_alive; then
    kill "$REGISTRY_PID" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while registry_alive && [ $SECONDS -lt $deadline ]; do
      # (reaps it when it is our child; a subshell's `wait` returns at once)
      wait "$REGISTRY_PID" 2>/dev/null || true
      sleep 0.1
    done
    if registry_alive; then
      log "registry (pid $REGISTRY_PID) did not stop in 10 s: SIGKILL"
      kill -KILL "$REGISTRY_PID" 2>/dev/null || true
    fi
  fi
  wait "$REGISTRY_PID" 2>/dev/null || true
  REGISTRY_PID=""
}

# ---------------------------------------------------------------- API server

APISERVER_PID=""
APISERVER=""

# apiserver_start: the fixture API server (fixtures/fake-apiserver, the
# binary build_binaries made) on a free 127.0.0.1 port, beside the
# registry; the node machines share this network, so their kubelets reach
# it there. Its test CA, serving and admin certificates go to
# WORK/apiserver/pki (ca.crt is the cluster CA the e2e config carries);
# it accepts the config's bootstrap token, and a rollout identity
# (rollout.kubeconfig) with deploy/rollout.yaml's rules in kubeslot-system
# (the follow scenarios' rollout.limit). Sets APISERVER (https://...).
apiserver_start() {
  local dir=$WORK/apiserver deadline
  mkdir -p "$dir"
  # remove_pods_after_grace off: only a kubelet's confirmation removes a
  # deleted pod, as on a real API server; the grant is deploy/kubeslot-node.yaml's
  # ClusterRole (what the drain reads beyond the node authorizer)
  cat >"$dir/config.json" <<'EOF2'
{"bootstrap_tokens": [{"id": "abcdef", "secret": "0123456789abcdef"}],
 "client_certs": [{"name": "admin", "user": "kubeslot-e2e-admin", "groups": ["system:masters"]},
   {"name": "rollout", "user": "kubeslot:rollout:e2e-node", "groups": ["kubeslot:rollout"]}],
 "grants": [
   {"subjects": [{"kind": "Group", "name": "system:nodes"}],
    "rules": [{"verbs": ["list"], "api_groups": ["policy"], "resources": ["poddisruptionbudgets"]},
              {"verbs": ["get"], "api_groups": ["apps"], "resources": ["daemonsets"]}]},
   {"subjects": [{"kind": "Group", "name": "kubeslot:rollout"}], "namespaces": ["kubeslot-system"],
    "rules": [{"verbs": ["list", "create", "update"], "api_groups": ["coordination.k8s.io"], "resources": ["leases"]},
              {"verbs": ["get"], "api_groups": [""], "resources": ["configmaps"], "resource_names": ["kubeslot-pause"]}]},
   {"subjects": [{"kind": "Group", "name": "kubeslot:rollout"}],
    "rules": [{"verbs": ["list"], "api_groups": [""], "resources": ["nodes"]}]}],
 "objects": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeslot-system"}}],
 "remove_pods_after_grace": false}
EOF2
  "$REPO/target/debug/fake-apiserver" --listen 127.0.0.1:0 --cert-dir "$dir/pki" --config "$dir/config.json" \
    >"$dir/stdout" 2>>"$WORK/logs/apiserver.log" </dev/null &
  APISERVER_PID=$!
  deadline=$((SECONDS + 15))
  until grep -q '^fake-apiserver: serving on ' "$dir/stdout" 2>/dev/null; do
    kill -0 "$APISERVER_PID" 2>/dev/null || die "fake-apiserver exited (log: $WORK/logs/apiserver.log)"
    [ $SECONDS -lt $deadline ] || die "fake-apiserver did not start in 15 s (log: $WORK/logs/apiserver.log)"
    sleep 0.1
  done
  APISERVER=$(sed -n 's/^fake-apiserver: serving on //p' "$dir/stdout")
  log "fixture API server on $APISERVER (pid $APISERVER_PID)"
}

# apiserver_stop: SIGTERM by PID while it is still our fake-apiserver (as
# registry_stop: PIDs are reused in a long run).
apiserver_stop() {
  [ -n "$APISERVER_PID" ] || return 0
  if [ "$(cat "/proc/$APISERVER_PID/comm" 2>/dev/null)" = fake-apiserver ]; then
    kill "$APISERVER_PID" 2>/dev/null || true
  fi
  wait "$APISERVER_PID" 2>/dev/null || true
  APISERVER_PID=""
}

# registry_blob_gets FROM_LINE: the digests of blobs fetched with GET since
# line FROM_LINE of the registry log (HEAD requests are not downloads).
registry_blob_gets() {
  tail -n +"$(($1 + 1))" "$REGISTRY_LOG" | grep -o '"GET /v2/[^ ]*/blobs/sha256:[0-9a-f]*' |
    sed 's/.*blobs\///' | sort -u
}

registry_log_lines() { wc -l <"$REGISTRY_LOG"; }

# ---------------------------------------------------------------- node trees

# node_tree_fill DIR ROOTFS_TAR KUBELET_BIN: a node machine tree by hand (for
# the scenarios that run without an image): the node rootfs, the fixture
# kubelet (also as the crictl subset) and the images' config layer as staged by images_stage (units,
# kubelet and containerd config, the test units), enabled.
node_tree_fill() {
  local dir=$1 tar=$2 kubelet=$3
  mkdir -p "$dir"
  tar -C "$dir" -xpf "$tar" --numeric-owner
  install -m 0755 "$kubelet" "$dir/usr/bin/kubelet"
  # (the TEST-ONLY crictl subset is the same binary, by another name)
  install -m 0755 "$kubelet" "$dir/usr/bin/crictl"
  cp -a "$WORK/images/stage/config/." "$dir/"
}

# machine_probe MACHINE PATH: one GET on the fixture kubelet's port inside
# MACHINE's network namespace, by the probe binary bound into the outer host
# (nothing from the image runs; the machine may have its own veth netns).
machine_probe() {
  local leader
  leader=$(outer machinectl show "$1" -p Leader --value 2>/dev/null) || return 1
  [ -n "$leader" ] || return 1
  outer nsenter -t "$leader" -n /usr/local/bin/e2e-probe --probe "$2" 2>/dev/null
}

# machine_wait_healthy MACHINE TIMEOUT_S: polls the fixture kubelet's
# /healthz in MACHINE until it answers ok.
machine_wait_healthy() {
  local m=$1 deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(machine_probe "$m" /healthz)" = ok ] && return 0
    sleep 0.1
  done
  return 1
}

# machine_wait_running MACHINE TIMEOUT_S: waits for the machine's systemd.
machine_wait_running() {
  local m=$1 deadline=$((SECONDS + $2)) state=""
  while [ $SECONDS -lt $deadline ]; do
    state=$(outer systemctl -M "$m" is-system-running 2>/dev/null || true)
    case $state in running|degraded) echo "$state"; return 0 ;; esac
    sleep 0.2
  done
  echo "${state:-unreachable}"
  return 1
}

# tamper_file FILE: inverts one byte in the middle of FILE (same size, so
# only a digest check can notice).
tamper_file() {
  python3 - "$1" <<'PY'
import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0xFF]))
PY
}

# ---------------------------------------------------------------- assertions

# Each scenario is a function; a failed check returns non-zero with a reason.
fail() { log "  check failed: $*"; return 1; }

check() {
  local what=$1; shift
  if "$@"; then
    log "  ok: $what"
  else
    fail "$what (command: $*)"
  fi
}

check_eq() {
  if [ "$2" = "$3" ]; then
    log "  ok: $1 = $3"
  else
    fail "$1: expected '$3', got '$2'"
  fi
}

# Negative checks. Each one tells "it ran and found nothing" from "it could
# not run": a `! cmd` passes just as well when cmd cannot start, cannot
# read its input or enters no namespace, so none of them is written that
# way (ci/e2e/README.md, "Checks that can fail").

# check_absent WHAT ERE FILE...: no line of the FILEs matches ERE; each
# FILE must exist and hold something (an empty or missing log shows no
# absence), and grep must have read them all.
check_absent() {
  local what=$1 pattern=$2 f rc=0
  shift 2
  for f in "$@"; do
    [ -s "$f" ] || { fail "$what: $f is missing or empty, so it shows nothing"; return 1; }
  done
  grep -Eq -- "$pattern" "$@" || rc=$?
  case $rc in
    # (the matching words, not the whole lines: an access log's are long)
    0) fail "$what: '$pattern' found in $(grep -El -- "$pattern" "$@" | paste -sd' '): $(grep -Eoh -- "[^ ]*($pattern)[^ ]*" "$@" | head -n 3 | paste -sd' ')" ;;
    1) log "  ok: $what" ;;
    *) fail "$what: grep could not read $* (exit $rc)" ;;
  esac
}

# check_unit_inactive UNIT: systemd in the outer host says UNIT is
# inactive (or failed): a word systemctl printed, not just its exit status.
check_unit_inactive() {
  local got
  got=$(outer systemctl is-active "$1" 2>&1) || true
  case $got in
    inactive | failed) log "  ok: $1 is $got" ;;
    *) fail "$1: expected inactive or failed, systemctl is-active said '$got'" ;;
  esac
}

# check_unit_disabled UNIT: systemd in the outer host says UNIT is
# disabled (it does not start at boot).
check_unit_disabled() {
  local got
  got=$(outer systemctl is-enabled "$1" 2>&1) || true
  check_eq "$1 at boot (systemctl is-enabled)" "$got" disabled
}

# check_refused WHAT ADDR PORT [CMD...]: a TCP connection to ADDR:PORT,
# made by bash (run through CMD, e.g. `nsenter -t PID -n`, when given), is
# refused: the attempt was made and answered "Connection refused".
check_refused() {
  local what=$1 addr=$2 port=$3 out
  shift 3
  if out=$("$@" bash -c "exec 3<>/dev/tcp/$addr/$port" 2>&1); then
    fail "$what: $addr:$port accepted a connection"
  elif grep -q 'Connection refused' <<<"$out"; then
    log "  ok: $what ($addr:$port refuses connections)"
  else
    fail "$what: the connection to $addr:$port failed, but not as refused: $out"
  fi
}

# ---------------------------------------------------------------- cleanup

# kill_tree PID: SIGTERM to PID and every descendant (children first
# collected, then all signalled), waiting up to 10 s for them to go; a
# scenario's tar or nsenter must not outlive it while cleanup removes files.
kill_tree() {
  local pids=("$1") i=0 child
  while [ $i -lt ${#pids[@]} ]; do
    for child in $(ps -o pid= --ppid "${pids[$i]}" 2>/dev/null); do pids+=("$child"); done
    i=$((i + 1))
  done
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local deadline=$((SECONDS + 10)) alive
  while [ $SECONDS -lt $deadline ]; do
    alive=0
    for child in "${pids[@]}"; do kill -0 "$child" 2>/dev/null && alive=1; done
    [ $alive = 1 ] || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  OUTER_STOP_GRACE=10
  # the pod scenarios' outer host and registries (ci/e2e/pods.sh), if booted
  if declare -F pods_cleanup >/dev/null; then pods_cleanup; fi
  [ -n "${WORK:-}" ] && outer_reload
  outer_stop
  registry_stop
  apiserver_stop
  cgroup_cleanup
  if [ -n "${WORK:-}" ] && [ -d "$WORK" ]; then
    # Nothing may still be mounted below WORK before it is removed.
    local m
    awk -v w="$WORK" '$2 == w || index($2, w "/") == 1 { print $2 }' /proc/self/mounts | sort -r |
      while IFS= read -r m; do umount -l "$m" 2>/dev/null; done
    # (that includes WORK's own tmpfs, listed last after the sort)
    if [ "${KUBESLOT_E2E_KEEP:-0}" = 1 ]; then
      log "kept $WORK (KUBESLOT_E2E_KEEP=1)"
    else
      rm -rf --one-file-system "$WORK"
    fi
  fi
  return "$rc"
}
