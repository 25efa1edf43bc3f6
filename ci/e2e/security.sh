# shellcheck shell=bash
# The host's other users and the node as attackers (issue 26), sourced by
# ci/e2e/run.sh: what a local unprivileged user (`nobody`, through the
# outer's real setpriv) cannot reach on a host kubeslot runs, and a slot the
# node tampered with refused by `rollback`, in whichever slot mode the run
# uses. They run inside the activator chain (see ci/e2e/README.md).

# as_nobody SCRIPT: runs `sh -c SCRIPT` in the outer host as nobody
# (uid/gid 65534, no groups); true when it succeeded.
as_nobody() {
  outer setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "$1" </dev/null >/dev/null 2>&1
}

# nobody_cannot WHAT SCRIPT: a check that nobody fails to do WHAT, for
# the reason that matters: "Permission denied" (a try that could not run at
# all, or failed for another reason, shows nothing).
nobody_cannot() {
  local out rc=0
  out=$(outer setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "$2" </dev/null 2>&1) || rc=$?
  if [ $rc = 0 ]; then
    fail "nobody could $1 ($2)"
  elif grep -q 'Permission denied' <<<"$out"; then
    log "  ok: nobody cannot $1 ($(head -n1 <<<"$out"))"
  else
    fail "nobody's try to $1 failed (exit $rc), but not for want of permission: $out"
  fi
}

# After activate_v1 (a node runs): the state, its lock, the layer store and
# the machines dir are root's alone; nobody can neither read them, nor take
# the run lock, nor write into the running slot's world-writable /tmp; and
# a run afterwards is not kept out.
scenario_local_user_cannot_touch_state() {
  local m
  m=$(running_machine) || return 1
  check_eq "/var/lib/kubeslot" "$(outer stat -c '%a %U' /var/lib/kubeslot)" "700 root" || return 1
  check_eq "/var/lib/kubeslot/lock" "$(outer stat -c '%a %U' /var/lib/kubeslot/lock)" "600 root" || return 1
  check_eq "/var/lib/machines" "$(outer stat -c '%a %U' /var/lib/machines)" "700 root" || return 1
  if outer test -d /var/lib/kubeslot/layers; then
    check_eq "/var/lib/kubeslot/layers" "$(outer stat -c '%a %U' /var/lib/kubeslot/layers)" "700 root" || return 1
  fi
  # the probe itself works: nobody runs, and reaches what is open to all
  check "nobody can list /var/lib" as_nobody "ls /var/lib" || return 1
  check "$m's /tmp is world-writable inside it" outer test -w "/var/lib/machines/$m/tmp" -a -k "/var/lib/machines/$m/tmp" || return 1
  nobody_cannot "take the run lock" "flock --nonblock /var/lib/kubeslot/lock true" || return 1
  nobody_cannot "list the state dir" "ls /var/lib/kubeslot" || return 1
  nobody_cannot "read the report" "cat /var/lib/kubeslot/report.json" || return 1
  nobody_cannot "list the layer store" "ls /var/lib/kubeslot/layers" || return 1
  nobody_cannot "list the machines dir" "ls /var/lib/machines" || return 1
  nobody_cannot "write into $m's /tmp" "echo x > /var/lib/machines/$m/tmp/e2e-by-nobody" || return 1
  check "nothing of nobody's in $m" outer test ! -e "/var/lib/machines/$m/tmp/e2e-by-nobody" || return 1
  act activate || { show_log; log_report; fail "activate after nobody's tries exited non-zero"; return 1; }
  check_eq "outcome of the next run" "$(jq -r .outcome "$(report_file)")" up-to-date
}

# Before `rollback` (kube2 runs v2, kube1 holds v1): kube1's image is
# changed as its node could have left it, in a way the cheap fingerprint
# cannot see (entry count and bytes unchanged): its kubelet rewritten at the
# same size and made setuid (overlay: in its upper, a copied-up file, as
# overlayfs writes it; copy: in the tree). `rollback` refuses naming it and
# changes nothing. The change is then undone, exactly, for `rollback`.
scenario_rollback_refuses_tampered_image() {
  local run prev upper kubelet mode added=() d rc=0 overlay=0
  run=$(running_machine) || return 1
  prev=$(other_machine "$run")
  upper=$OUTER/var/lib/kubeslot/slots/$prev/upper
  if outer test -f "/etc/systemd/system/var-lib-machines-$prev.mount"; then
    overlay=1
    # what the node wrote is in its upper (written unmounted, as a stopped
    # slot's upper is; rollback mounts it)
    outer systemctl stop "var-lib-machines-$prev.mount"
    for d in usr usr/bin; do
      if [ ! -d "$upper/$d" ]; then
        mkdir -m 0755 "$upper/$d"
        added=("$d" "${added[@]}")
      fi
    done
    kubelet=$upper/usr/bin/kubelet
    [ ! -e "$kubelet" ] || { fail "$prev's upper already holds usr/bin/kubelet"; return 1; }
    cp "$WORK/kubelet/v1/kubelet" "$kubelet"
    mode=0755
  else
    kubelet=$OUTER/var/lib/machines/$prev/usr/bin/kubelet
    mode=$(stat -c %a "$kubelet")
  fi
  tamper_file "$kubelet"
  chmod 4755 "$kubelet"
  act rollback || rc=$?
  log "  rollback exited $rc: $(act_error)"
  check_eq "rollback's exit code" "$rc" 1 || { show_log; return 1; }
  check "the refusal names the kubelet" grep -q '/usr/bin/kubelet' <<<"$(act_error)" || return 1
  check "the refusal says how to override" grep -q -- '--force' <<<"$(act_error)" || return 1
  check_eq "machine running after the refusal" "$(active_machines)" "$run" || return 1

  # undone: the next scenario rolls back to the image as it was installed
  if [ $overlay = 1 ]; then
    outer systemctl stop "var-lib-machines-$prev.mount"
    rm "$kubelet"
    for d in "${added[@]}"; do rmdir "$upper/$d"; done
  else
    tamper_file "$kubelet"
    chmod "$mode" "$kubelet"
    check "$prev's kubelet is v1's again" cmp -s "$kubelet" "$WORK/kubelet/v1/kubelet" || return 1
  fi
}

# Issue 40, item 2, on the unbounded-agent host unmanaged_machine_refused
# left (kube1 running, no kubeslot state): the adopted tree is the node's,
# so `adopt --write-config` refuses (exit 3) the kubelet flags in its
# /etc/default/kubelet that open the kubelet (anonymous auth, AlwaysAllow,
# a static-pod path; `_` spelled as the kubelet reads it), and plain ones
# without --force, naming them in full; nothing is recorded or written.
# The host's own /etc/kubeslot/default-kubelet with an underscored owned
# flag or a security flag is refused by `render` (exit 3) before anything
# is written. Leaves kube1 as it found it for adopt_unbounded.
scenario_adopt_refuses_untrusted_kubelet_flags() {
  [ "$(active_machines)" = kube1 ] || unbounded_kube1 || return 1
  local host_args=$OUTER/etc/kubeslot/default-kubelet saved="" rc=0
  [ ! -e "$host_args" ] || saved=$(cat "$host_args")
  rm -f "$host_args"
  untrusted_kubelet_flags_refused || rc=$?
  # whatever happened: kube1's tree and the host's file as they were, for
  # adopt_unbounded and activate_v1
  rm -f "$host_args" "$OUTER/var/lib/machines/kube1/etc/default/kubelet"
  [ -z "$saved" ] || printf '%s\n' "$saved" >"$host_args"
  [ $rc = 0 ] || return $rc
  check_eq "machines running after the refusals" "$(active_machines)" kube1
}

# untrusted_kubelet_flags_refused: adopt_refuses_untrusted_kubelet_flags's
# checks (the caller restores the files they write).
untrusted_kubelet_flags_refused() {
  local defaults=$OUTER/var/lib/machines/kube1/etc/default host_args=$OUTER/etc/kubeslot/default-kubelet
  local written=/etc/kubeslot/adopt-e2e.json rc args want name
  local adopt=(adopt --config "$written" --write-config --image "$REF_v1" --public-key /etc/kubeslot/trust/e2e.pub)
  mkdir -p "$defaults"
  while IFS='|' read -r args want; do
    printf 'KUBELET_EXTRA_ARGS="%s"\n' "$args" >"$defaults/kubelet"
    rc=0
    act "${adopt[@]}" || rc=$?
    log "  adopt with $args: exit $rc: $(act_error)"
    check_eq "adopt's exit code with $args" "$rc" 3 || { show_log; return 1; }
    check "the refusal says: $want" grep -qF -- "$want" <<<"$(act_error)" || return 1
    check "no state recorded" test ! -e "$OUTER/var/lib/kubeslot/state.json" || return 1
    check "no config written" test ! -e "$OUTER$written" || return 1
    check "no default-kubelet written" test ! -e "$host_args" || return 1
  done <<'EOF2'
--max-pods=60 --anonymous_auth=true --authorization-mode=AlwaysAllow --pod-manifest-path=/etc/kubernetes/evil|--anonymous-auth turns off part of the node's security
--authorization_mode=AlwaysAllow|--authorization-mode turns off part of the node's security
--max-pods=60 --v=2|KUBELET_EXTRA_ARGS="--max-pods=60 --v=2"; check each and pass --force
EOF2
  # (the last one: plain flags, shown in full, need --force)
  act "${adopt[@]}" --dry-run --force || { show_log; fail "adopt --dry-run --force exited non-zero"; return 1; }
  check "adopt --dry-run shows the adopted flags in full" grep -qF 'KUBELET_EXTRA_ARGS="--max-pods=60 --v=2"' "$ACT_LOG" || { show_log; return 1; }
  check "adopt --dry-run recorded nothing" test ! -e "$OUTER/var/lib/kubeslot/state.json" || return 1
  rm -f "$defaults/kubelet"
  for args in "--bootstrap_kubeconfig=/var/lib/kubelet/evil.conf" "--anonymous_auth=true" "--read-only-port=10255"; do
    printf 'KUBELET_EXTRA_ARGS="%s"\n' "$args" >"$host_args"
    rc=0
    act render kube2 || rc=$?
    log "  render with $args: exit $rc: $(act_error)"
    check_eq "render's exit code with $args in the host's default-kubelet" "$rc" 3 || { show_log; return 1; }
    name=${args%%=*}
    check "render names the flag as the kubelet reads it" grep -qF -- "${name//_/-} " <<<"$(act_error)" || return 1
    check "render wrote no kube2 files" test ! -e "$OUTER/etc/systemd/nspawn/kube2.nspawn" || return 1
  done
}

# Issue 40, item 1, before `rollback` (the previous slot holds v1): the
# image's CNI `bridge` plugin, which containerd runs as root for every pod
# sandbox, replaced as its node could have left it (same size, made
# setuid; overlay: a copied-up file in its upper, written with the slot
# unmounted; copy: in the tree). /opt/cni/bin is the node's to add to, not
# to change the image's files in: `rollback` exits 1 naming the plugin and
# `--force`, the running machine unchanged. The change is then undone,
# exactly, for `rollback`.
scenario_rollback_refuses_changed_cni_plugin() {
  local run prev upper bridge mode added=() d rc=0 overlay=0
  run=$(running_machine) || return 1
  prev=$(other_machine "$run")
  upper=$OUTER/var/lib/kubeslot/slots/$prev/upper
  if outer test -f "/etc/systemd/system/var-lib-machines-$prev.mount"; then
    overlay=1
    outer systemctl stop "var-lib-machines-$prev.mount"
    for d in opt opt/cni opt/cni/bin; do
      if [ ! -d "$upper/$d" ]; then
        mkdir -m 0755 "$upper/$d"
        added=("$d" "${added[@]}")
      fi
    done
    bridge=$upper/opt/cni/bin/bridge
    [ ! -e "$bridge" ] || { fail "$prev's upper already holds opt/cni/bin/bridge"; return 1; }
    cp "$WORK/images/test/cni/bridge" "$bridge"
    mode=0755
  else
    bridge=$OUTER/var/lib/machines/$prev/opt/cni/bin/bridge
    mode=$(stat -c %a "$bridge")
  fi
  tamper_file "$bridge"
  chmod 4755 "$bridge"
  act rollback || rc=$?
  log "  rollback exited $rc: $(act_error)"
  check_eq "rollback's exit code" "$rc" 1 || { show_log; return 1; }
  check "the refusal names the CNI plugin" grep -q '/opt/cni/bin/bridge' <<<"$(act_error)" || return 1
  check "the refusal says how to override" grep -q -- '--force' <<<"$(act_error)" || return 1
  check_eq "machine running after the refusal" "$(active_machines)" "$run" || return 1

  # undone: the next scenarios roll back to the image as it was installed
  if [ $overlay = 1 ]; then
    outer systemctl stop "var-lib-machines-$prev.mount"
    rm "$bridge"
    for d in "${added[@]}"; do rmdir "$upper/$d"; done
  else
    tamper_file "$bridge"
    chmod "$mode" "$bridge"
    check "$prev's bridge is the image's again" cmp -s "$bridge" "$WORK/images/test/cni/bridge" || return 1
  fi
}
