# shellcheck shell=bash
# REF_*, POD_* and the pod outer's helpers come from the files run.sh
# sources before this one.
# shellcheck disable=SC2154
# The CRI scenarios, sourced by ci/e2e/run.sh: the node's production runtime
# (containerd 2 with recipes/files/containerd-config.toml) driven as a
# kubelet drives it. Static pods are written into the machine's
# staticPodPath; the fixture kubelet runs them over CRI and prints what each
# step took ("CRI timing: ..." in its journal, collected into the log's
# CRI TIMINGS lines); the TEST-ONLY crictl subset in the image reads the
# runtime's state back over CRI. `runtime_not_ready_fails_gate` runs in the
# main outer host; the pod scenarios in the pod outer host of pods.sh
# (private network, the registry and its TLS mirror inside).

# in_machine MACHINE CMD...: CMD inside the node machine, output piped back.
in_machine() {
  local m=$1; shift
  outer systemd-run -M "$m" --quiet --wait --pipe "$@" </dev/null
}

# cri_manifest MACHINE NAME: stdin as the static pod manifest NAME.yaml in
# MACHINE's staticPodPath (written to a dot file, then renamed: the kubelet
# skips dot files, so it never reads half a manifest).
cri_manifest() {
  outer systemd-run -M "$1" --quiet --wait --pipe sh -c \
    "mkdir -p /etc/kubernetes/manifests && cat >/etc/kubernetes/manifests/.$2.tmp && mv /etc/kubernetes/manifests/.$2.tmp /etc/kubernetes/manifests/$2.yaml" >/dev/null
}

# cri_pod_dir MACHINE POD: the pod's log directory under /var/log/pods
# (default_<POD>-e2e-node_<uid>), empty until the kubelet made the sandbox.
cri_pod_dir() {
  in_machine "$1" sh -c "ls -d /var/log/pods/default_$2-e2e-node_* 2>/dev/null" | head -n1
}

# cri_wait_log MACHINE POD CONTAINER ATTEMPT PATTERN TIMEOUT_S: until the
# container's CRI log (/var/log/pods/.../CONTAINER/ATTEMPT.log, written by
# containerd) has a line matching PATTERN; prints the log's messages.
cri_wait_log() {
  local m=$1 pod=$2 c=$3 n=$4 pattern=$5 deadline=$((SECONDS + $6)) dir="" text=""
  while [ $SECONDS -lt $deadline ]; do
    [ -n "$dir" ] || dir=$(cri_pod_dir "$m" "$pod")
    if [ -n "$dir" ]; then
      # CRI log lines: <time> <stream> <P|F> <message>
      text=$(in_machine "$m" cat "$dir/$c/$n.log" 2>/dev/null | cut -d' ' -f4-)
      if grep -Eq "$pattern" <<<"$text"; then
        log "  ok: $dir/$c/$n.log has '$pattern'"
        printf '%s\n' "$text"
        return 0
      fi
    fi
    sleep 0.5
  done
  fail "no line '$pattern' in ${dir:-/var/log/pods/default_$pod-e2e-node_*}/$c/$n.log after $6 s"
  in_machine "$m" journalctl _SYSTEMD_UNIT=kubelet.service + UNIT=kubelet.service + SYSLOG_IDENTIFIER=kubelet --no-pager -o cat | grep -E "$pod|rror" | tail -n 15 >&2 || true
  [ -z "$text" ] || printf '%s\n' "$text" >&2
  return 1
}

# kubelet_log_wait MACHINE PATTERN TIMEOUT_S: until the machine's kubelet
# journal has a line matching PATTERN (journald may lag a loaded machine).
# The kubelet's journal, here and below: its unit's lines, systemd's about
# it, and its syslog identifier's, as the activator's diagnostics read it.
# No `grep -q` after journalctl: under pipefail its early exit fails the
# pipeline with journalctl's SIGPIPE.
kubelet_log_wait() {
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    in_machine "$1" journalctl _SYSTEMD_UNIT=kubelet.service + UNIT=kubelet.service + SYSLOG_IDENTIFIER=kubelet --no-pager -o cat | grep -E "$2" >/dev/null && return 0
    sleep 0.5
  done
  kubelet_journal_evidence "$1"
  return 1
}

# kubelet_journal_evidence MACHINE: what the machine shows when the
# kubelet's lines were not found (ci/e2e/README.md, "Fixed: the kubelet's
# own journal lines"): where
# the kubelet's stdout goes, its last journal lines of any kind, and
# systemd's words about connecting a stream to the journal.
kubelet_journal_evidence() {
  local pid
  pid=$(in_machine "$1" systemctl show kubelet -p MainPID --value 2>/dev/null || true)
  {
    echo "  evidence ($1): $(in_machine "$1" systemctl show kubelet -p StandardOutput -p ActiveState -p NRestarts 2>&1 | tr '\n' ' ')"
    [ -z "$pid" ] || [ "$pid" = 0 ] || echo "  evidence ($1): kubelet pid $pid stdout -> $(in_machine "$1" readlink "/proc/$pid/fd/1" 2>&1)"
    echo "  evidence ($1): journal stream sockets: $(in_machine "$1" sh -c 'ls -l /run/systemd/journal/ 2>&1 | tr "\n" " "')"
    echo "  evidence ($1): the last lines with _PID of the kubelet: $(in_machine "$1" journalctl "_PID=$pid" --no-pager -o cat -n 3 2>&1 | tr '\n' '|')"
    echo "  evidence ($1): systemd on the journal: $(in_machine "$1" journalctl _PID=1 --no-pager -o cat 2>&1 | grep -i 'journal' | tail -n 3 | tr '\n' '|')"
  } >&2
}

# cri_timings MACHINE POD: the kubelet's "CRI timing" lines for POD, one
# summary line appended to WORK/cri-timings.txt (printed at the end).
cri_timings() {
  local lines sandbox pulled started
  kubelet_log_wait "$1" "CRI timing: container started.*pod=\"default/$2-e2e-node\"" 10 || true
  lines=$(in_machine "$1" journalctl _SYSTEMD_UNIT=kubelet.service + UNIT=kubelet.service + SYSLOG_IDENTIFIER=kubelet --no-pager -o cat | grep "CRI timing" | grep "pod=\"default/$2-e2e-node\"" || true)
  sandbox=$(grep 'sandbox ready' <<<"$lines" | tail -n1 | grep -o 'ms="[0-9]*"' | tr -dc 0-9 || true)
  pulled=$(grep 'image pulled' <<<"$lines" | tail -n1 | grep -o 'ms="[0-9]*"' | tr -dc 0-9 || true)
  started=$(grep 'container started' <<<"$lines" | tail -n1 | grep -o 'ms="[0-9]*"' | tr -dc 0-9 || true)
  echo "CRI TIMINGS ($1, pod $2): sandbox ready ${sandbox:-?} ms, image pulled ${pulled:-not pulled (present)}${pulled:+ ms}, container started ${started:-?} ms" |
    tee -a "$WORK/cri-timings.txt" >&2
}

# version_at_least HAVE WANT: dotted versions compared numerically.
version_at_least() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

# cri_expect_production_runtime MACHINE: containerd >= 2.1, runc >= 1.3,
# the CNI plugins >= 1.9, the production config file as the image carries
# it, and containerd's own merged view of it (`containerd config dump`):
# pinned sandbox image, certs.d mirrors, CDI with both spec dirs, the
# systemd cgroup driver for runc.
cri_expect_production_runtime() {
  local m=$1 v dump got
  # (`containerd github.com/containerd/containerd/v2 2.1.9+unknown`)
  v=$(in_machine "$m" containerd --version | awk '{ print $3 }' | sed 's/[^0-9.].*//')
  check "containerd $v >= 2.1" version_at_least "$v" 2.1 || return 1
  v=$(in_machine "$m" runc --version | sed -n 's/^runc version \([0-9.]*\).*/\1/p')
  check "runc $v >= 1.3" version_at_least "$v" 1.3 || return 1
  # (Debian's CNI plugins print "version unknown": the package's version,
  # and /opt/cni/bin's plugins are that package's files)
  # (no ${...} format: the machine's systemd would expand it in the command)
  v=$(in_machine "$m" dpkg-query -W containernetworking-plugins | awk '{ print $2 }' | sed 's/[^0-9.].*//')
  check "CNI plugins $v >= 1.9" version_at_least "$v" 1.9 || return 1
  check "/opt/cni/bin/bridge is the package's" in_machine "$m" cmp -s /opt/cni/bin/bridge /usr/lib/cni/bridge || return 1
  check "/etc/containerd/config.toml is recipes/files/containerd-config.toml" \
    cmp -s <(in_machine "$m" cat /etc/containerd/config.toml) "$REPO/recipes/files/containerd-config.toml" || return 1
  # (containerd 2 writes TOML strings in single quotes)
  dump=$(in_machine "$m" containerd config dump | tr "'" '"') || { fail "containerd config dump in $m"; return 1; }
  # each production setting, as containerd merged it (other plugins have
  # keys of the same names, e.g. an empty config_path)
  local want trimmed
  trimmed=$(awk '{ sub(/^[[:space:]]+/, ""); print }' <<<"$dump")
  while IFS= read -r want; do
    check "containerd config dump in $m: $want" grep -qxF "$want" <<<"$trimmed" ||
      { echo "$dump" >&2; return 1; }
  done <<'EOF2'
sandbox = "registry.k8s.io/pause:3.10.2"
config_path = "/etc/containerd/certs.d"
enable_cdi = true
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
SystemdCgroup = true
default_runtime_name = "runc"
EOF2
  got=$(in_machine "$m" crictl info -q | jq -r '.status.conditions[] | select(.type == "RuntimeReady" or .type == "NetworkReady") | "\(.type)=\(.status)"' | sort | paste -sd' ')
  check_eq "CRI Status in $m" "$got" "NetworkReady=true RuntimeReady=true"
}

# An image without a CNI config (nocni: v1's, less /etc/cni/net.d): the
# kubelet starts and answers /healthz, but containerd reports NetworkReady
# false; the gate fails naming that condition, the flip rolls back, the
# image is marked bad.
scenario_runtime_not_ready_fails_gate() {
  local before target rc=0 t0 bad version
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  version=$(outer systemd-run -M "$before" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null)
  write_config "$REF_nocni"
  t0=$(now_ms)
  act activate || rc=$?
  [ $rc = 2 ] || { show_log; log_report; fail "activate of the image without a CNI config exited $rc, not 2 (rolled back)"; return 1; }
  log "  activate of nocni rolled back as expected after $(($(now_ms) - t0)) ms: $(act_error)"
  log_report
  check "the gate's error names NetworkReady" grep -q 'health check cri-network-ready failed: NetworkReady is false' <<<"$(jq -r .error "$(report_file)")" || return 1
  check "the runtime's reason is in it" grep -qi 'cni' <<<"$(jq -r .error "$(report_file)")" || return 1
  expect_running "$before" "${version#Kubernetes }" || return 1
  bad=$(digest_alternatives "$DIGEST_nocni")
  check "status marks nocni bad" grep -Eq "^state\.bad\.[0-9]+\.digest=$bad\$" <<<"$(flatten "$(status_json)")" || return 1
  # (its tree is there to look at: the kubelet it ran is in it)
  check "the failed $target's tree is there" outer test -x "/var/lib/machines/$target/usr/bin/kubelet" || return 1
  check "the failed $target had no CNI config" outer test ! -e "/var/lib/machines/$target/etc/cni/net.d/10-e2e-bridge.conflist" || return 1
}

# A static pod in the production-config node: a sandbox with a CNI bridge
# address, its container's lines in /var/log/pods (written by containerd),
# the node IP reached from the pod; restart per restartPolicy (Always
# restarts a container that exits, OnFailure leaves one that exited 0).
scenario_cri_static_pod() {
  pods_enter || return 1
  cri_manifest kube1 hello <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: hello
spec:
  containers:
  - name: hello
    image: $POD_REGISTRY_NAME/e2e/hello:1
    command: [sh, -c]
    args: ["echo hello from an e2e pod; ip -4 addr show eth0; ping -c1 -W5 $POD_NODE_IP && echo reached-node-ip; trap 'exit 0' TERM; sleep 3600 & wait"]
EOF2
  local out ip id
  out=$(cri_wait_log kube1 hello hello 0 'reached-node-ip|packets received' 90) || return 1
  check "the container printed its line" grep -qx 'hello from an e2e pod' <<<"$out" || { echo "$out" >&2; return 1; }
  check "the container has a CNI bridge address" grep -q 'inet 10\.88\.' <<<"$out" || { echo "$out" >&2; return 1; }
  check "the container reached the node IP" grep -qx 'reached-node-ip' <<<"$out" || { echo "$out" >&2; return 1; }
  id=$(in_machine kube1 crictl pods --name hello-e2e-node -q | head -n1)
  ip=$(in_machine kube1 crictl inspectp "$id" | jq -r .status.network.ip)
  check "crictl inspectp: the sandbox's IP $ip is a bridge address" grep -q '^10\.88\.' <<<"$ip" || return 1
  check "the sandbox is ready" grep -qx SANDBOX_READY <<<"$(in_machine kube1 crictl inspectp "$id" | jq -r .status.state)" || return 1
  cri_timings kube1 hello

  # restartPolicy: Always restarts (the first restart at once), OnFailure
  # does not restart a container that exited 0
  cri_manifest kube1 again <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: again
spec:
  restartPolicy: Always
  containers:
  - name: once
    image: $POD_REGISTRY_NAME/e2e/hello:1
    command: [sh, -c, "echo run; exit 1"]
EOF2
  cri_manifest kube1 exits <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: exits
spec:
  restartPolicy: OnFailure
  containers:
  - name: once
    image: $POD_REGISTRY_NAME/e2e/hello:1
    command: [sh, -c, "echo run; exit 0"]
EOF2
  cri_wait_log kube1 again once 1 '^run$' 60 >/dev/null || return 1
  cri_wait_log kube1 exits once 0 '^run$' 60 >/dev/null || return 1
  sleep 3
  out=$(in_machine kube1 crictl ps -a -o json | jq -r '.containers[] | select(.labels["io.kubernetes.pod.name"] == "exits-e2e-node") | .metadata.attempt' | sort -u | paste -sd' ')
  check_eq "attempts of the OnFailure container that exited 0" "$out" 0 || return 1
  # a manifest with a field outside the subset is refused, naming it
  cri_manifest kube1 bad <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: bad
spec:
  containers:
  - name: c
    image: $POD_REGISTRY_NAME/e2e/hello:1
    ports: [{containerPort: 80}]
EOF2
  check "bad.yaml refused naming spec.containers[0].ports" \
    kubelet_log_wait kube1 'Could not process manifest file.*bad.yaml.*spec.containers\[0\].ports' 10 || return 1
  in_machine kube1 rm -f /etc/kubernetes/manifests/again.yaml /etc/kubernetes/manifests/exits.yaml /etc/kubernetes/manifests/bad.yaml
}

# The hello pod's image came by CRI PullImage through the rendered
# hosts.toml (mirror + CA), while its registry name resolves nowhere: the
# TLS mirror was asked on behalf of registry.e2e.invalid, the plain
# registry never for e2e/hello, and the node has no default route.
scenario_cri_pull_through_mirror() {
  pods_enter || return 1
  # (.invalid never resolves, RFC 2606; and the namespace has no way out)
  # (getent's exit code 2 is "not found"; one that could not run says otherwise)
  local rc=0
  in_machine kube1 getent hosts "$POD_REGISTRY_NAME" >/dev/null 2>&1 || rc=$?
  check_eq "exit code of getent hosts $POD_REGISTRY_NAME in kube1 (2: resolves nowhere)" "$rc" 2 || return 1
  check_eq "default route in the node's network namespace" \
    "$(nsenter -t "$OUTER_LEADER" -n ip -4 route show default)" "" || return 1
  check "the kubelet pulled the image (PullImage)" kubelet_log_wait kube1 "CRI timing: image pulled.*image=\"$POD_REGISTRY_NAME/e2e/hello:1\"" 10 || return 1
  # (containerd resolves the tag with HEAD, then fetches by digest)
  check "the mirror was asked for the manifest on behalf of $POD_REGISTRY_NAME" \
    grep -Eq "\"(HEAD|GET) /v2/e2e/hello/manifests/[^ ]*[?&]ns=$POD_REGISTRY_NAME" "$WORK/logs/registry-pods-mirror.log" ||
    { grep -E '/v2/e2e/hello/' "$WORK/logs/registry-pods-mirror.log" | tail -n 5 >&2; return 1; }
  check "the mirror served the layers" grep -Eq "\"GET /v2/e2e/hello/blobs/sha256:" "$WORK/logs/registry-pods-mirror.log" || return 1
  check_absent "the plain registry was never asked for e2e/hello" '/v2/e2e/hello/' "$WORK/logs/registry-pods.log" || return 1
  check "crictl images lists it" grep -qx "$POD_REGISTRY_NAME/e2e/hello:1" \
    <<<"$(in_machine kube1 crictl images -o json | jq -r '.images[].repoTags[]')" || return 1
}

# The sandbox image is the baked, pinned one: containerd marks it pinned,
# every sandbox runs without it ever being pulled. A pull would be seen:
# the pod outer's config mirrors registry.k8s.io too (pods_config), to the
# TLS mirror, which serves the same pause image as `pause` (images.sh):
# had the node lacked the baked image, its sandboxes would have run all
# the same, pulled through the mirror, whose log would say so.
scenario_cri_sandbox_pinned() {
  pods_enter || return 1
  local got
  got=$(in_machine kube1 cat /etc/containerd/certs.d/registry.k8s.io/hosts.toml) || { fail "no hosts.toml for registry.k8s.io in kube1"; return 1; }
  check "kube1's containerd mirrors registry.k8s.io to the TLS mirror" grep -qxF "[host.\"https://$POD_MIRROR\"]" <<<"$got" || { echo "$got" >&2; return 1; }
  check_absent "neither registry the node reaches was asked for the pause image" '/v2/(e2e/)?pause/' \
    "$WORK/logs/registry-pods.log" "$WORK/logs/registry-pods-mirror.log" || return 1
  got=$(in_machine kube1 crictl images -o json | jq -r '.images[] | select(.repoTags | index("registry.k8s.io/pause:3.10.2")) | "\(.pinned) \(.id)"')
  check "registry.k8s.io/pause:3.10.2 is pinned in containerd" grep -q '^true sha256:' <<<"$got" || { echo "$got" >&2; return 1; }
  got=$(in_machine kube1 crictl pods -o json | jq -r '[.items[] | select(.state == "SANDBOX_READY")] | length')
  check "sandboxes are running on it ($got ready)" test "${got:-0}" -ge 1 || return 1
}
