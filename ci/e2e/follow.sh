# shellcheck shell=bash
# REF_vN/DIGEST_vN are assigned by images.sh (printf -v), sourced first by run.sh.
# shellcheck disable=SC2154
# The following host's scenarios (source.follow by tag, issue 39), sourced
# by ci/e2e/run.sh: the tag `stable` in the e2e repository is moved to a
# release, its release statement issued with `kubeslot-builder statement
# issue` (the images' key), and `kubeslot-activator follow` (what the
# packaged timer runs) takes it, refuses it, or waits. Each picks a release
# that is not running and not marked bad, and the config allows a
# downgrade, so they run after any scenario that leaves a node up.

# follow_target: a release (v1, v2, v5, v4, v6, in that order: v6 last,
# airgap_archive wants it unseen; v4 is keyless_verified_offline's) the running node
# does not run and this host has not marked bad (a rollback marks the image
# it left).
follow_target() { free_version v1 v2 v5 v4 v6; }

# publish_stable VERSION HOURS: the tag `stable` moved to VERSION, with a
# release statement valid HOURS (0: expired at once) whose one wave opens now.
publish_stable() {
  push_one "oci:$IMAGE_LAYOUT:$1" "$REGISTRY/$IMAGE_REPO:stable"
  "$BUILDER" statement issue --key "$WORK/keys/e2e.key" --identity "$REGISTRY/$IMAGE_REPO" \
    --valid-hours "$2" --schedule 0:100 --new-schedule "$REGISTRY/$IMAGE_REPO:stable" \
    >>"$WORK/logs/statement.log" 2>&1 ||
    { cat "$WORK/logs/statement.log" >&2; fail "kubeslot-builder statement issue"; return 1; }
  log "  stable -> $1, statement valid $2 h"
}

# write_follow_config [ROLLOUT_JSON]: the e2e config following `stable`.
write_follow_config() {
  local rollout=${1:-'{}'}
  config_json "$REF_v1" /etc/kubeslot/trust/e2e.pub |
    jq --argjson rollout "$rollout" '.source = {follow: {tag: "stable"}}
      | .trust.allow_downgrade = true | .rollout = $rollout' >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
}

# A new signed tag with its statement: the timer's run takes it through
# the flip and the gate.
scenario_follow_tag_updates() {
  local before target v digest
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  v=$(follow_target) || return 1
  publish_stable "$v" 168 || return 1
  write_follow_config
  act follow || { show_log; log_report; fail "follow exited non-zero"; return 1; }
  log_report
  check_eq "follow's outcome" "$(jq -r .outcome "$(report_file)")" committed || return 1
  digest=DIGEST_$v
  expect_status "$target" "${!digest}" || return 1
  check "the report shows the statement" test -n "$(jq -r '.rollout.statement_expires // empty' "$(report_file)")"
}

# The same with an expired statement: nothing changes and the run says why;
# a restart of the committed node (as at boot) and two rollbacks still work.
scenario_expired_statement_refused() {
  local before v rc=0 m
  before=$(node_snapshot) || return 1
  v=$(follow_target) || return 1
  publish_stable "$v" 0 || return 1
  write_follow_config
  act follow || rc=$?
  [ $rc != 0 ] || { show_log; fail "follow took a release under an expired statement"; return 1; }
  log "  refused (exit $rc): $(act_error)"
  check "the error says the statement expired" grep -q 'release statement expired at .* (a mirror may be frozen)' <<<"$(act_error)" || { show_log; return 1; }
  check "the report says so too" grep -q 'expired at' <<<"$(jq -r .error "$(report_file)")" || return 1
  expect_unchanged "$before" || return 1
  # the committed node stopped (a host coming back): started again
  m=$(running_machine) || return 1
  outer systemctl stop "systemd-nspawn@$m.service"
  act follow || true
  check "the committed node is started although the statement expired" machine_wait_healthy "$m" 30 || { show_log; return 1; }
  # and a rollback does not look at statements; the second one brings the
  # committed release back, which lifts the mark the first one set (the
  # scenarios after this one still have a release to take)
  act rollback || { show_log; log_report; fail "rollback under an expired statement"; return 1; }
  check_eq "machine after the rollback" "$(running_machine)" "$(other_machine "$m")" || return 1
  act rollback || { show_log; log_report; fail "the second rollback under an expired statement"; return 1; }
  check_eq "machine after the second rollback" "$(running_machine)" "$m" || return 1
  # shellcheck disable=SC2016 # jq's variables
  check "the release brought back is not marked bad" \
    jq -e '.state as $s | [($s.bad // [])[].digest] | index($s.slots[$s.active].digest) == null' "$(status_json)" >/dev/null || return 1
}

# A release outside the maintenance window waits: the run ends "waiting"
# (exit 0), nothing changes, plan and status say until when.
scenario_window_closed_waits() {
  local before v open close rollout
  before=$(node_snapshot) || return 1
  v=$(follow_target) || return 1
  publish_stable "$v" 168 || return 1
  # a one-hour window that opens in two hours (UTC)
  open=$((($(date -u +%s) + 7200) / 60 % 1440))
  close=$(((open + 60) % 1440))
  rollout=$(jq -nc --arg s "$(printf '%02d:%02d' $((open / 60)) $((open % 60)))" \
    --arg e "$(printf '%02d:%02d' $((close / 60)) $((close % 60)))" \
    '{windows: [{start: $s, end: $e, utc_offset: "+00:00"}]}')
  write_follow_config "$rollout"
  act follow || { show_log; fail "a closed window is a wait, not a failure"; return 1; }
  check_eq "follow's outcome" "$(jq -r .outcome "$(report_file)")" waiting || return 1
  check "the report says why" grep -q 'outside the maintenance windows' <<<"$(jq -r .rollout.waiting "$(report_file)")" || return 1
  check "status says it waits" grep -q 'waiting: outside the maintenance windows' <<<"$(outer kubeslot-activator status)" || return 1
  check "plan shows the window" grep -q 'window closed until' <<<"$(outer kubeslot-activator plan)" || return 1
  expect_unchanged "$before"
}

# rollout_identity: the rollout identity's kubeconfig (the fixture's
# `rollout` client certificate, deploy/rollout.yaml's rules) inside the
# outer host, as /etc/kubeslot/rollout.kubeconfig.
rollout_identity() {
  local pki=$WORK/apiserver/pki
  mkdir -p "$OUTER/etc/kubeslot/rollout"
  cp "$pki/ca.crt" "$pki/rollout.crt" "$pki/rollout.key" "$OUTER/etc/kubeslot/rollout/"
  sed "s#$pki/#/etc/kubeslot/rollout/#g" "$pki/rollout.kubeconfig" >"$OUTER/etc/kubeslot/rollout.kubeconfig"
}

# rollout_limit [EXTRA_JSON]: rollout.limit with one lease of 15 s.
rollout_limit() {
  jq -nc --argjson extra "${1:-{\}}" '{limit: ({kubeconfig: "/etc/kubeslot/rollout.kubeconfig",
    max_unavailable: 1, lease_duration_secs: 15} + $extra)}'
}

# micro_time SECONDS_AGO: a Lease's MicroTime that long ago.
micro_time() { date -u -d "@$(($(date -u +%s) - $1))" +%Y-%m-%dT%H:%M:%S.000000Z; }

# ghost_lease HOLDER SECONDS_AGO DURATION: the rollout's only lease, held by
# another (fictional) node, last renewed SECONDS_AGO with DURATION.
ghost_lease() {
  jq -n --arg h "$1" --arg t "$(micro_time "$2")" --argjson d "$3" '{apiVersion: "coordination.k8s.io/v1",
    kind: "Lease", metadata: {name: "kubeslot-rollout-0", namespace: "kubeslot-system"},
    spec: {holderIdentity: $h, leaseDurationSeconds: $d, acquireTime: $t, renewTime: $t}}' >"$WORK/ghost-lease.json"
  kube delete lease -n kubeslot-system kubeslot-rollout-0 --ignore-not-found >/dev/null
  kube create --validate=false -f "$WORK/ghost-lease.json" >/dev/null
}

# waits_for WHY BEFORE: `follow` ends "waiting" (exit 0) with WHY in the
# report, status says so, and the node (and its idle slot) is unchanged.
waits_for() {
  act follow || { show_log; log_report; fail "a wait is not a failure"; return 1; }
  check_eq "follow's outcome" "$(jq -r .outcome "$(report_file)")" waiting || { log_report; return 1; }
  check "the report says why ($1)" grep -qF "$1" <<<"$(jq -r .rollout.waiting "$(report_file)")" || { log_report; return 1; }
  check "status says it waits" grep -qF "$1" <<<"$(outer kubeslot-activator status | grep '^ *waiting: ')" || return 1
  expect_unchanged "$2"
}

# The only rollout lease held by another node: the update waits (nothing
# staged, stopped or flipped); once that holder stops renewing and its
# lease expires, the next run takes the lease, flips and releases it.
scenario_lease_limit_waits() {
  local before target v digest holder
  before=$(node_snapshot) || return 1
  target=$(other_machine "$(running_machine)")
  v=$(follow_target) || return 1
  publish_stable "$v" 168 || return 1
  rollout_identity
  ghost_lease e2e-ghost 0 300 || { fail "creating the ghost lease"; return 1; }
  write_follow_config "$(rollout_limit)"
  waits_for "waiting for a rollout lease: all 1 held (max_unavailable); kubeslot-rollout-0 by e2e-ghost" "$before" || return 1
  check "plan says so too" grep -qF 'kubeslot-rollout-0 by e2e-ghost' <<<"$(outer kubeslot-activator plan)" || return 1
  # the ghost went silent: its lease expired 10 s ago
  ghost_lease e2e-ghost 20 10 || { fail "expiring the ghost lease"; return 1; }
  act follow || { show_log; log_report; fail "follow after the lease expired"; return 1; }
  check_eq "follow's outcome" "$(jq -r .outcome "$(report_file)")" committed || { log_report; return 1; }
  digest=DIGEST_$v
  expect_status "$target" "${!digest}" || return 1
  holder=$(kube get lease -n kubeslot-system kubeslot-rollout-0 -o json | jq -r '"\(.spec.holderIdentity // "")/\(.spec.leaseTransitions)"')
  check_eq "the lease released after the commit (holder/transitions)" "$holder" "/1"
}

# The pause switch, then a rollback of the digest on another (fictional)
# node with halt_after 1: each halts the update (nothing changes, status
# says why).
scenario_halted_rollout_waits() {
  local before v d digest
  before=$(node_snapshot) || return 1
  v=$(follow_target) || return 1
  publish_stable "$v" 168 || return 1
  rollout_identity
  kube delete lease -n kubeslot-system kubeslot-rollout-0 --ignore-not-found >/dev/null
  kube create --validate=false -f - >/dev/null <<<'{"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "kubeslot-pause", "namespace": "kubeslot-system"},
    "data": {"paused": "true", "reason": "e2e-incident"}}'
  write_follow_config "$(rollout_limit '{"halt_after": 1}')"
  waits_for 'the rollout is paused (ConfigMap kubeslot-pause has paused: "true"): e2e-incident' "$before" || return 1
  kube delete configmap -n kubeslot-system kubeslot-pause >/dev/null
  d=DIGEST_$v
  digest=${PLATFORM_DIGEST[${!d}]:-${!d}}
  jq -n --arg d "$digest" '{apiVersion: "v1", kind: "Node", metadata: {name: "e2e-ghost",
    annotations: {"kubeslot.io/last-digest": $d, "kubeslot.io/last-result": "rolled-back: e2e"}}}' |
    kube create --validate=false -f - >/dev/null
  waits_for "is halted: 1 node(s) rolled it back (e2e-ghost), halt_after is 1" "$before"
  kube delete node e2e-ghost >/dev/null
}
