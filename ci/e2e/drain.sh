# shellcheck shell=bash
# REF_vN/DIGEST_vN are assigned by images.sh (printf -v), sourced first by run.sh.
# shellcheck disable=SC2154
# Draining and the cluster's view (issue 38; docs/host/cluster.md), sourced
# by ci/e2e/run.sh. The node's life goes on from wherever the scenarios
# before left it (any committed machine, node_joins_api's Node): each flip
# here goes to an image that is neither the running one nor marked bad.
# The config gets a `cluster` section (the node's own kubeconfig, the
# default); the fixture API server grants system:nodes what
# deploy/kubeslot-node.yaml grants (lib.sh, apiserver_start). Pods bound
# through the API do not run in this outer host (ci/e2e/api.sh): the
# fixture kubelet only reports and confirms them, and a pod a budget must
# count is made Running and Ready here, as the admin, through /status.

DRAIN_METRICS=/var/lib/kubeslot/kubeslot.prom

# drain_config REF CLUSTER: write_config with the `cluster` section CLUSTER
# (a jq object expression) plus the metrics file.
drain_config() {
  local cluster
  cluster=$(jq -nc --arg m "$DRAIN_METRICS" "{metrics_file: \$m} * ($2)") ||
    { fail "drain_config: not a jq object: $2"; return 1; }
  E2E_CLUSTER=$cluster write_config "$1"
}

# drain_flip_ref: the reference of an image to flip to (v2, v5, v1, v4 or
# v6: the first neither running nor marked bad here; v6 last, airgap_archive
# after these wants it unseen, and v4 is keyless_verified_offline's).
drain_flip_ref() {
  local v ref
  v=$(free_version v2 v5 v1 v4 v6) || return 1
  ref=REF_$v
  echo "${!ref}"
}

# drain_current_ref: the reference of the image running now (the one the
# last run committed).
drain_current_ref() {
  local st=$OUTER/var/lib/kubeslot/state.json v digest
  for v in "${E2E_VERSIONS[@]}"; do
    digest=DIGEST_$v
    if jq -e --arg d "${!digest}" --arg p "${PLATFORM_DIGEST[${!digest}]:-${!digest}}" \
      '.slots[.active].digest | . == $d or . == $p' "$st" >/dev/null; then
      local ref=REF_$v
      echo "${!ref}"
      return 0
    fi
  done
  fail "the running image is none of ${E2E_VERSIONS[*]}"
  return 1
}

# kube_create JSON: creates the object as the admin.
kube_create() {
  kube create --validate=false -f - <<<"$1" >/dev/null ||
    { fail "kubectl create: $(jq -c '[.kind, .metadata.name]' <<<"$1")"; return 1; }
}

# replicaset NAME: a ReplicaSet in default (its pods' controller; no
# controller manager here makes pods for it). Prints its UID.
replicaset() {
  kube_create "$(jq -n --arg n "$1" '{apiVersion: "apps/v1", kind: "ReplicaSet",
    metadata: {name: $n, namespace: "default"},
    spec: {replicas: 1, selector: {matchLabels: {app: $n}},
      template: {metadata: {labels: {app: $n}}, spec: {containers: [{name: "c", image: "pause"}]}}}}')" || return 1
  kube get rs -n default "$1" -o 'jsonpath={.metadata.uid}'
}

# bound_pod NAME APP OWNER_KIND OWNER_NAME OWNER_UID [ANNOTATIONS_JSON]: a pod
# in default bound to e2e-node (tolerating its taint), owned by that
# controller (none when OWNER_KIND is "-").
bound_pod() {
  local ann=${6:-}
  [ -n "$ann" ] || ann='{}'
  kube_create "$(jq -n --arg n "$1" --arg app "$2" --arg kind "$3" --arg owner "$4" --arg uid "$5" \
    --argjson ann "$ann" '{apiVersion: "v1", kind: "Pod",
    metadata: ({name: $n, namespace: "default", labels: {app: $app}, annotations: $ann}
      + (if $kind == "-" then {} else {ownerReferences: [{apiVersion: "apps/v1", kind: $kind,
          name: $owner, uid: $uid, controller: true}]} end)),
    spec: {nodeName: "e2e-node", terminationGracePeriodSeconds: 5,
      tolerations: [{key: "kubeslot.io/e2e", operator: "Exists"}],
      containers: [{name: "c", image: "pause"}]}}')"
}

# pod_names SELECTOR: the names of the pods in default with that label.
pod_names() { kube get pods -n default -l "$1" -o 'jsonpath={.items[*].metadata.name}'; }

# drain_sampler OLD: until killed, one line per look: whether the fixture
# API server had confirmed the deletion of both e2e-web pods (the old
# kubelet's grace-0 DELETEs in its log), read BEFORE whether OLD's unit
# was still active: a line "2 up" proves the pods were gone while the old
# machine ran.
drain_sampler() {
  local n
  while :; do
    n=$(grep -c 'DELETE /api/v1/namespaces/default/pods/e2e-web-[12] user="system:node:e2e-node".* -> 200$' \
      "$WORK/logs/apiserver.log" || true)
    if unit_active "$1"; then echo "$n up"; else echo "$n down"; fi
    sleep 0.02
  done
}

# cordon_sampler: until killed, the Node's spec.unschedulable, a line a look.
cordon_sampler() {
  while :; do
    echo "unschedulable=$(node_field '{.spec.unschedulable}')"
    sleep 0.2
  done
}

# node_schedulable: the Node is not cordoned.
node_schedulable() { [ "$(node_field '{.spec.unschedulable}')" != true ]; }

# node_annotation KEY: the Node's kubeslot.io/KEY annotation.
node_annotation() { node_field "{.metadata.annotations.kubeslot\.io/$1}"; }

# node_events: "REASON MESSAGE" of each Event about Node e2e-node.
node_events() {
  kube get events -n default -o json |
    jq -r '.items[] | select(.involvedObject.kind == "Node" and .involvedObject.name == "e2e-node") | "\(.reason) \(.message)"'
}

# Pods bound through the API are evicted before the old machine stops:
# two pods of a ReplicaSet go (the old kubelet confirms their deletion,
# seen while the old unit is still active), a DaemonSet's pod and a mirror
# (static) pod stay; the Node is cordoned during the flip and schedulable
# after the commit; the report says what was evicted and skipped.
scenario_flip_drains_first() {
  local before target ref rs ds watch=$WORK/drain-watch.txt cordons=$WORK/drain-cordons.txt
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  ref=$(drain_flip_ref) || return 1
  check "Node e2e-node is there and schedulable" node_schedulable || return 1
  rs=$(replicaset e2e-web) || return 1
  bound_pod e2e-web-1 e2e-web ReplicaSet e2e-web "$rs" || return 1
  bound_pod e2e-web-2 e2e-web ReplicaSet e2e-web "$rs" || return 1
  kube_create '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "e2e-ds", "namespace": "default"},
    "spec": {"selector": {"matchLabels": {"app": "e2e-ds"}}, "template": {"metadata": {"labels": {"app": "e2e-ds"}},
    "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}' || return 1
  ds=$(kube get ds -n default e2e-ds -o 'jsonpath={.metadata.uid}')
  bound_pod e2e-ds-pod e2e-ds DaemonSet e2e-ds "$ds" || return 1
  bound_pod e2e-static-e2e-node e2e-static - - - '{"kubernetes.io/config.mirror": "e2e", "kubernetes.io/config.source": "file"}' || return 1
  drain_config "$ref" '{drain: {timeout_secs: 60}}' || return 1
  drain_sampler "$before" >"$watch" &
  local sampler=$!
  cordon_sampler >"$cordons" &
  local csampler=$!
  local rc=0
  act activate || rc=$?
  kill "$sampler" "$csampler" 2>/dev/null; wait "$sampler" "$csampler" 2>/dev/null || true
  [ $rc = 0 ] || { show_log; log_report; fail "activate $ref (drained) exited $rc"; return 1; }
  log_report
  check_eq "running machine after the drained flip" "$(running_machine)" "$target" || return 1
  echo "$ref" >"$WORK/drain-ref"
  local f
  f=$(report_file)
  log "  drain: $(jq -c .drain "$f")"
  check_eq "report: drain result" "$(jq -r .drain.result "$f")" drained || return 1
  check_eq "report: evicted" "$(jq -r '.drain.evicted | sort | join(" ")' "$f")" "default/e2e-web-1 default/e2e-web-2" || return 1
  check "report: the DaemonSet pod skipped" grep -q '^default/e2e-ds-pod: .*DaemonSet' <<<"$(jq -r '.drain.skipped[]' "$f")" || return 1
  check "report: the mirror pod skipped" grep -q '^default/e2e-static-e2e-node: .*mirror' <<<"$(jq -r '.drain.skipped[]' "$f")" || return 1
  check_eq "e2e-web pods left" "$(pod_names app=e2e-web)" "" || return 1
  check_eq "DaemonSet and mirror pods left" "$(pod_names 'app in (e2e-ds,e2e-static)')" "e2e-ds-pod e2e-static-e2e-node" || return 1
  check "both e2e-web deletions confirmed while $before still ran (a '2 up' look; $(sort -u "$watch" | paste -sd,))" \
    grep -qx '2 up' "$watch" || return 1
  check "no look saw $before stopped with an e2e-web pod left" test -z "$(grep -E '^[01] down$' "$watch")" || return 1
  check "the Node was cordoned during the flip" grep -qx 'unschedulable=true' "$cordons" || return 1
  check "the Node is schedulable after the commit" node_schedulable || return 1
  check_eq "the report says kubeslot cordoned it" "$(jq -r .drain.cordoned "$f")" true
}

# pdb_setup: ReplicaSet e2e-db, its pod e2e-db-1 Running and Ready (the status a kubelet would
# report; this outer's kubelet cannot run it), so budget e2e-db counts it
# healthy and allows no disruption.
pdb_setup() {
  local rs deadline
  rs=$(replicaset e2e-db) || return 1
  bound_pod e2e-db-1 e2e-db ReplicaSet e2e-db "$rs" || return 1
  kube_create '{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "e2e-db", "namespace": "default"},
    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "e2e-db"}}}}' || return 1
  # after the kubelet's own first report (it reports a pod once a change)
  deadline=$((SECONDS + 15))
  until [ -n "$(kube get pod -n default e2e-db-1 -o 'jsonpath={.status.conditions}')" ] || [ $SECONDS -ge $deadline ]; do sleep 1; done
  kube patch pod -n default e2e-db-1 --subresource=status --type=merge \
    -p '{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}, {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}]}}' >/dev/null ||
    { fail "could not make e2e-db-1 Ready"; return 1; }
  deadline=$((SECONDS + 15))
  until [ "$(kube get pdb -n default e2e-db -o 'jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}')" = 1/0 ] || [ $SECONDS -ge $deadline ]; do sleep 1; done
  check_eq "budget e2e-db: healthy/allowed disruptions" "$(kube get pdb -n default e2e-db -o 'jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}')" 1/0
}

# A budget allowing no disruption holds e2e-db-1: within a 8 s
# cluster.drain.timeout_secs nothing flips (exit 8), the Node is
# schedulable again, and the error, the report's drain and a
# KubeslotDrainBlocked Event name the pod and the budget.
scenario_drain_blocked_by_pdb() {
  local before ref rc=0 f
  before=$(running_machine) || return 1
  ref=$(drain_flip_ref) || return 1
  pdb_setup || return 1
  drain_config "$ref" '{drain: {timeout_secs: 8}}' || return 1
  act activate || rc=$?
  log "  activate $ref with the budget in the way exited $rc: $(act_error)"
  log_report
  check_eq "exit code (drain)" "$rc" 8 || { show_log; return 1; }
  check_eq "running machine (no flip)" "$(running_machine)" "$before" || return 1
  check "kubelet healthy in $before" machine_wait_healthy "$before" 10 || return 1
  check "the Node is schedulable again" node_schedulable || return 1
  f=$(report_file)
  check_eq "report: drain result" "$(jq -r .drain.result "$f")" blocked || return 1
  check_eq "report: the pod still there and its budget" "$(jq -r '.drain.stuck[] | "\(.pod) \(.budget)"' "$f")" "default/e2e-db-1 default/e2e-db" || return 1
  check "the error names the pod and the budget" grep -q 'default/e2e-db-1 (budget default/e2e-db' <<<"$(act_error)" || return 1
  check "a KubeslotDrainBlocked Event names them" grep -q '^KubeslotDrainBlocked .*default/e2e-db-1 (budget default/e2e-db' <<<"$(node_events)" || return 1
  check_eq "the Node's last-result" "$(node_annotation last-result)" drain-blocked || return 1
  check "e2e-db-1 is still there, not terminating" test -z "$(kube get pod -n default e2e-db-1 -o 'jsonpath={.metadata.deletionTimestamp}')"
}

# The activator SIGKILLed while the budget holds its drain (the Node
# cordoned, the record in state.json): the next run (an activate of the
# running image) uncordons it in its recovery and says so; the old machine
# ran throughout.
scenario_kill_mid_drain() {
  local before ref deadline
  before=$(running_machine) || return 1
  ref=$(drain_flip_ref) || return 1
  drain_config "$ref" '{drain: {timeout_secs: 300}}' || return 1
  act_bg activate
  deadline=$((SECONDS + 120))
  while [ $SECONDS -lt $deadline ] && kill -0 "$ACT_PID" 2>/dev/null &&
    ! grep -q 'default/e2e-db-1: .*asking again' "$ACT_LOG"; do sleep 0.2; done
  if ! grep -q 'default/e2e-db-1: .*asking again' "$ACT_LOG" || ! kill -0 "$ACT_PID" 2>/dev/null; then
    wait "$ACT_PID" || true; show_log; fail "the activator never got to its drain (or ended before the kill)"; return 1
  fi
  kill_activator || return 1
  check "the Node is left cordoned by the dead run" test "$(node_field '{.spec.unschedulable}')" = true || return 1
  check_eq "state.json records kubeslot's cordon" "$(jq -r '.cordoned.node // "none"' "$OUTER/var/lib/kubeslot/state.json")" e2e-node || return 1
  check_eq "running machine after the kill" "$(running_machine)" "$before" || return 1
  drain_config "$(drain_current_ref)" '{drain: {timeout_secs: 60}}' || return 1
  act activate || { show_log; log_report; fail "the activate after the kill exited non-zero"; return 1; }
  log_report
  check "the next run says it uncordoned the dead run's cordon" \
    grep -q "a dead run's drain: uncordoned node e2e-node" <<<"$(jq -r '.recovered // ""' "$(report_file)")" || { show_log; return 1; }
  check "the Node is schedulable" node_schedulable || return 1
  check_eq "state.json's cordon record" "$(jq -r '.cordoned // "none"' "$OUTER/var/lib/kubeslot/state.json")" none || return 1
  check_eq "running machine" "$(running_machine)" "$before" || return 1
  check "kubelet healthy in $before" machine_wait_healthy "$before" 10 || return 1
  # the budget goes; its pod with it
  kube delete pdb -n default e2e-db >/dev/null
  kube delete pod -n default e2e-db-1 --grace-period=0 --force >/dev/null 2>&1 || true
}

# ready_look: one look: the Node's Ready status, then the state's pending
# phase and active slot.
ready_look() {
  echo "$(node_field '{.status.conditions[?(@.type=="Ready")].status}') $(jq -r '[(.pending.phase // "none"), .active] | join(" ")' "$OUTER/var/lib/kubeslot/state.json" 2>/dev/null)"
}

# ready_sampler: until killed, a look every 0.2 s.
ready_sampler() {
  while :; do ready_look; sleep 0.2; done
}

# v7's kubelet is healthy at once but withholds the Node's Ready for 20 s:
# with a 90 s health timeout the commit waits for it (looks with the
# Node not Ready while the try is pending, none committed before Ready);
# back on the old machine (`rollback`, drained too), v7 again (forced: the
# operator's rollback marks it failed) with a 12 s timeout: the cluster gate fails (node-ready), the old machine runs
# again, the Node is schedulable. What the cluster and the host saw after
# the commit is kept for node_reports_image.
scenario_cluster_gate_waits_for_ready() {
  local before target watch=$WORK/ready-watch.txt rc=0
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  E2E_HEALTH_TIMEOUT=90 drain_config "$REF_v7" '{drain: {timeout_secs: 60}}' || return 1
  ready_sampler >"$watch" &
  local sampler=$!
  act activate || rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
  # and one look once it returned (a commit that did not wait is seen
  # here at the latest: v7 withholds Ready for 20 s)
  ready_look >>"$watch"
  [ $rc = 0 ] || { show_log; log_report; fail "activate v7 exited $rc"; return 1; }
  log_report
  expect_running "$target" v1.35.6-e2e.7 || return 1
  expect_status "$target" "$DIGEST_v7" || return 1
  check "the gate waited: a look with the Node not Ready during the try ($(sort -u "$watch" | paste -sd,))" \
    grep -Eq '^False trying ' "$watch" || return 1
  check "no look saw $target committed before the Node was Ready" test -z "$(grep -Ev '^True ' "$watch" | grep -E " none $target\$")" || return 1
  check "the report's health names the cluster gate" grep -q 'sees node e2e-node Ready' <<<"$(jq -r .health "$(report_file)")" || return 1
  check "the Node is schedulable after the commit" node_schedulable || return 1
  mkdir -p "$WORK/cluster-view"
  kube get node e2e-node -o json | jq '.metadata.annotations' >"$WORK/cluster-view/commit-annotations.json"
  cp "$OUTER$DRAIN_METRICS" "$WORK/cluster-view/commit.prom" || { fail "no metrics file at $DRAIN_METRICS"; return 1; }
  echo "$target" >"$WORK/cluster-view/commit-slot"

  act rollback || { show_log; log_report; fail "rollback to $before exited non-zero"; return 1; }
  check_eq "running machine after the rollback" "$(running_machine)" "$before" || return 1
  rc=0
  E2E_HEALTH_TIMEOUT=12 drain_config "$REF_v7" '{drain: {timeout_secs: 60}}' || return 1
  # (--force: the operator's rollback marked v7 as failed here)
  act activate --force || rc=$?
  log "  activate v7 with a 12 s gate exited $rc: $(act_error)"
  log_report
  [ $rc != 0 ] || { show_log; fail "v7 committed although its Node was not Ready within 12 s"; return 1; }
  check "the report names the failed check (node-ready)" grep -q 'node-ready' <<<"$(jq -r .error "$(report_file)")" || return 1
  check_eq "running machine after the rollback" "$(running_machine)" "$before" || return 1
  check "kubelet healthy in $before" machine_wait_healthy "$before" 10 || return 1
  check "the Node is schedulable after the rollback" node_schedulable || return 1
  echo "$before" >"$WORK/cluster-view/rollback-slot"
}

# What the cluster and the host see: after cluster_gate_waits_for_ready's
# commit the Node's annotations named v7, its digest and slot and the
# metrics file its image and a committed activation; after its rollback
# the annotations say rolled-back with the failed check, the metrics file
# counts the rollback, and Events tell the drain, the flip, the commit, the
# rollback and the blocked drain.
scenario_node_reports_image() {
  local dir=$WORK/cluster-view slot before digest
  [ -s "$dir/commit-annotations.json" ] || { fail "cluster_gate_waits_for_ready has not run (no $dir)"; return 1; }
  slot=$(cat "$dir/commit-slot") before=$(cat "$dir/rollback-slot")
  digest=$(digest_alternatives "$DIGEST_v7")
  local a
  a=$(jq -r 'to_entries[] | select(.key | startswith("kubeslot.io/")) | "\(.key)=\(.value)"' "$dir/commit-annotations.json")
  log "  annotations after the commit: $(paste -sd' ' <<<"$a")"
  check "after the commit: phase and last-result committed" test "$(grep -c -x -e 'kubeslot.io/phase=committed' -e 'kubeslot.io/last-result=committed' <<<"$a")" = 2 || return 1
  check_eq "after the commit: image" "$(sed -n 's|^kubeslot.io/image=||p' <<<"$a")" "$REF_v7" || return 1
  check "after the commit: digest" grep -Eqx "kubeslot.io/digest=$digest" <<<"$a" || return 1
  check_eq "after the commit: slot" "$(sed -n 's|^kubeslot.io/slot=||p' <<<"$a")" "$slot" || return 1
  check "after the commit: kubeslot_image_info names v7 in $slot" \
    grep -Eq "^kubeslot_image_info\\{digest=\"$digest\",slot=\"$slot\",image=\"$REF_v7\"\\} 1\$" "$dir/commit.prom" || { cat "$dir/commit.prom" >&2; return 1; }
  check "after the commit: a committed activation counted" grep -Eq '^kubeslot_activations_total\{result="committed"\} [1-9]' "$dir/commit.prom" || return 1
  check "after the commit: the last activation's time" grep -Eq '^kubeslot_last_activation_timestamp_seconds [1-9][0-9]*$' "$dir/commit.prom" || return 1
  check "after the commit: the flip's downtime" grep -Eq '^kubeslot_flip_downtime_seconds [0-9.]+$' "$dir/commit.prom" || return 1

  check_eq "after the rollback: phase" "$(node_annotation phase)" rolled-back || return 1
  check_eq "after the rollback: last-result" "$(node_annotation last-result)" rolled-back || return 1
  check "after the rollback: last-reason names the check" grep -q node-ready <<<"$(node_annotation last-reason)" || return 1
  local prom=$OUTER$DRAIN_METRICS
  check "after the rollback: a rolled-back activation counted" grep -Eq '^kubeslot_activations_total\{result="rolled-back"\} [1-9]' "$prom" || { cat "$prom" >&2; return 1; }
  check "after the rollback: kubeslot_image_info names $before" grep -Eq "^kubeslot_image_info\\{.*slot=\"$before\".*\\} 1\$" "$prom" || { cat "$prom" >&2; return 1; }
  check "after the rollback: the blocked drain counted" grep -Eq '^kubeslot_activations_total\{result="drain-blocked"\} [1-9]' "$prom" || return 1
  local ev reason
  ev=$(node_events)
  for reason in KubeslotDrain KubeslotFlip KubeslotCommit KubeslotRollback KubeslotDrainBlocked; do
    check "an Event $reason about Node e2e-node" grep -q "^$reason " <<<"$ev" || { echo "$ev" >&2; return 1; }
  done
  check "the KubeslotDrain Event names the evicted pods" grep -q '^KubeslotDrain .*default/e2e-web-1' <<<"$ev" || return 1
  check "the KubeslotRollback Event names the failed check" grep -q '^KubeslotRollback .*node-ready' <<<"$ev"
}
