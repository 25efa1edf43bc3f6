# shellcheck shell=bash
# REF_vN and DIGEST_vN are set by images.sh (sourced before this file).
# shellcheck disable=SC2154
# The host's whole life, sourced by ci/e2e/run.sh after activator.sh: the
# Debian package installed and removed (deb_install), a node machine that
# another tool set up refused and then adopted (unmanaged_machine_refused,
# adopt_unbounded, which ends with `uninstall --purge`), the outer host
# powered off and on after a commit (reboot) and killed in a health gate
# (reboot_mid_flip), and a flip refused by preflight (preflight_fails).
#
# Ground truth first, as in activator.sh: which units systemd runs and
# enables, what the machines' kubelets answer, which files exist.

# install_deb: the package built by ci/deb/build.sh, installed in the
# booted outer host with dpkg -i (setup). Its postinst enables and starts
# kubeslot-activator.path; the scenarios drive activations themselves, so
# the path unit is stopped and disabled again (config_change_activates
# starts it). kubeslot-activator.service stays enabled: at every boot of the
# outer it runs `activate` (the reboot scenarios rely on it).
install_deb() {
  cp "$DEB" "$OUTER/var/tmp/kubeslot-activator.deb"
  outer dpkg -i /var/tmp/kubeslot-activator.deb >"$WORK/logs/dpkg-install.log" 2>&1 ||
    { cat "$WORK/logs/dpkg-install.log" >&2; die "dpkg -i of the activator package failed"; }
  outer systemctl disable --now --quiet kubeslot-activator.path
  # the follow scenarios start follow runs themselves
  outer systemctl disable --now --quiet kubeslot-activator-follow.timer
  log "installed $(basename "$DEB") in the outer host"
}

unit_enabled() { outer systemctl is-enabled --quiet "$1" 2>/dev/null; }

# The package as an operator installs it: removed while a run holds the
# lock (prerm waits for the run to end instead of killing it), then the
# units stopped and the binary gone, /etc/kubeslot kept; purged (/etc/kubeslot
# removed, saying so; the units' enablement forgotten: an upgrade or a
# reinstall after `dpkg -r` keeps what the administrator chose, and the
# harness had disabled the path unit), then installed again with dpkg -i:
# the binary and the shipped units appear, the path unit is enabled and
# started by the maintainer scripts, the service enabled (for boot), and
# nothing is activated without a config.
scenario_deb_install() {
  local version
  check "dpkg knows the package" bash -c "nsenter -t $OUTER_LEADER -m -u -i -n -p -C -- dpkg-query -W -f='\${Status}' kubeslot-activator | grep -qx 'install ok installed'" || return 1
  # shellcheck disable=SC2016 # a dpkg-query format, not a shell expansion
  version=$(outer dpkg-query -W -f='${Version}' kubeslot-activator)
  check_eq "kubeslot-activator version = the package's" "$(outer kubeslot-activator version)" "$version" || return 1
  # A run in flight holds the run lock (here a stand-in holds it until told
  # to let go): dpkg -r waits for it in prerm instead of killing it and
  # removing the binary under it.
  local release=/var/tmp/e2e-release-lock holder dpkg_pid
  rm -f "$OUTER$release"
  outer mkdir -p /var/lib/kubeslot
  outer flock /var/lib/kubeslot/lock sh -c "while [ ! -e $release ]; do sleep 0.1; done" &
  holder=$!
  local deadline=$((SECONDS + 10))
  while [ $SECONDS -lt $deadline ] && outer flock --nonblock --shared /var/lib/kubeslot/lock true; do sleep 0.1; done
  # an operator's file under /etc/kubeslot (a credential), which the remove keeps
  outer install -d -m 0700 /etc/kubeslot
  echo "e2e bootstrap token" >"$OUTER/etc/kubeslot/e2e-operator-credential"
  outer dpkg -r kubeslot-activator >"$WORK/logs/dpkg-remove.log" 2>&1 &
  dpkg_pid=$!
  sleep 3
  check "dpkg -r still waits while a run holds the lock" kill -0 "$dpkg_pid" || { touch "$OUTER$release"; wait "$holder"; cat "$WORK/logs/dpkg-remove.log" >&2; return 1; }
  check "the binary is still there while the run goes on" test -x "$OUTER/usr/bin/kubeslot-activator" || { touch "$OUTER$release"; return 1; }
  touch "$OUTER$release"
  wait "$holder" || true
  wait "$dpkg_pid" || { cat "$WORK/logs/dpkg-remove.log" >&2; fail "dpkg -r"; return 1; }
  check "prerm said it waited" grep -q "an activation is running; waiting for it to end" "$WORK/logs/dpkg-remove.log" || { cat "$WORK/logs/dpkg-remove.log" >&2; return 1; }
  rm -f "$OUTER$release"
  rm -rf "$OUTER/var/lib/kubeslot"
  check "binary gone after dpkg -r" test ! -e "$OUTER/usr/bin/kubeslot-activator" || return 1
  check_unit_inactive kubeslot-activator.path || return 1
  check "dpkg -r keeps /etc/kubeslot" test -f "$OUTER/etc/kubeslot/e2e-operator-credential" || return 1
  # the purge takes the operator's config, keys and credentials (saved
  # here and put back for the scenarios after this one)
  rm -rf "$WORK/etc-kubeslot-saved"
  cp -a "$OUTER/etc/kubeslot" "$WORK/etc-kubeslot-saved"
  rm -f "$WORK/etc-kubeslot-saved/e2e-operator-credential"
  outer dpkg --purge kubeslot-activator >>"$WORK/logs/dpkg-remove.log" 2>&1 || { cp -a "$WORK/etc-kubeslot-saved" "$OUTER/etc/kubeslot"; cat "$WORK/logs/dpkg-remove.log" >&2; fail "dpkg --purge"; return 1; }
  local purged=0
  test ! -e "$OUTER/etc/kubeslot" && grep -q "purged /etc/kubeslot" "$WORK/logs/dpkg-remove.log" || purged=1
  rm -rf "$OUTER/etc/kubeslot"
  cp -a "$WORK/etc-kubeslot-saved" "$OUTER/etc/kubeslot"
  check "dpkg --purge removed /etc/kubeslot and said so" test "$purged" = 0 || { cat "$WORK/logs/dpkg-remove.log" >&2; return 1; }
  check "boot link of the service gone after the purge" test ! -e "$OUTER/etc/systemd/system/multi-user.target.wants/kubeslot-activator.service" || return 1
  outer dpkg -i /var/tmp/kubeslot-activator.deb >"$WORK/logs/dpkg-reinstall.log" 2>&1 ||
    { cat "$WORK/logs/dpkg-reinstall.log" >&2; fail "dpkg -i"; return 1; }
  local f
  for f in /usr/bin/kubeslot-activator /usr/lib/systemd/system/kubeslot-activator.service \
    /usr/lib/systemd/system/kubeslot-activator.path \
    /usr/lib/systemd/system/kubeslot-activator-follow.timer \
    /usr/share/doc/kubeslot-activator/examples/activator.json /usr/share/doc/kubeslot-activator/README.Debian; do
    check "package installed $f" test -f "$OUTER$f" || return 1
  done
  check "kubeslot-activator.path enabled on install" unit_enabled kubeslot-activator.path || return 1
  check "kubeslot-activator.path started on install" outer systemctl is-active --quiet kubeslot-activator.path || return 1
  check "kubeslot-activator.service enabled on install (runs at boot)" unit_enabled kubeslot-activator.service || return 1
  check "no activation without a config" bash -c "[ \"\$(nsenter -t $OUTER_LEADER -m -u -i -n -p -C -- systemctl show kubeslot-activator.service -p ExecMainStartTimestampMonotonic --value)\" = 0 ]" || return 1
  check "kubeslot-activator-follow.timer enabled on install" unit_enabled kubeslot-activator-follow.timer || return 1
  # back to the harness's convention: the scenarios start activations
  outer systemctl disable --now --quiet kubeslot-activator.path
  outer systemctl disable --now --quiet kubeslot-activator-follow.timer
}

# unbounded_kube1: kube1 as unbounded-agent leaves a host (seed-unbounded.md
# sections 1.5, 2.2, 2.3, 6.3): the node tree (here: the v2 fixture kubelet,
# to tell it apart from kubeslot's v1) with the kubelet's client
# certificate as a bootstrapped kubelet leaves it (pki/ and the link to
# the current one), the agent's .nspawn file and drop-in, its applied
# config with the .sha256 sidecar, its daemon unit (Restart=always; a
# sleep stands in for the agent), `machinectl enable` and
# `machinectl start kube1`; no kubeslot state.
unbounded_kube1() {
  local tree=$OUTER/var/lib/machines/kube1 applied=$OUTER/etc/unbounded/agent/kube1-applied-config.json
  node_tree_fill "$tree" "$NODE_TAR" "$WORK/kubelet/v2/kubelet"
  install -d -m 0700 "$tree/var/lib/kubelet/pki"
  echo "e2e kubelet client certificate" >"$tree/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem"
  chmod 0600 "$tree/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem"
  ln -sfn /var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem "$tree/var/lib/kubelet/pki/kubelet-client-current.pem"
  cat >"$OUTER/etc/systemd/system/unbounded-agent-daemon.service" <<'EOF2'
[Unit]
Description=Unbounded Agent Daemon (e2e stand-in)

[Service]
Type=simple
ExecStart=/bin/sleep infinity
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF2
  mkdir -p "$OUTER/etc/systemd/nspawn" "$OUTER/etc/systemd/system/systemd-nspawn@kube1.service.d"
  cat >"$OUTER/etc/systemd/nspawn/kube1.nspawn" <<'EOF2'
# unbounded-agent: the stock unit's --settings=override lets this file win
[Exec]
Capability=all
PrivateUsers=no
SystemCallFilter=@keyring bpf

[Network]
VirtualEthernet=no

[Files]
BindReadOnly=/lib/modules
EOF2
  cat >"$OUTER/etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf" <<'EOF2'
[Unit]
StartLimitIntervalSec=0

[Service]
Restart=on-failure
RestartSec=10s
ExecStartPre=-/usr/bin/machinectl terminate kube1
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
EOF2
  install -d -m 0750 "$(dirname "$applied")"
  jq -n --arg ca "$(base64 -w0 <"$WORK/ca.crt")" '{
    MachineName: "e2e-machine",
    Cluster: {CaCertBase64: $ca, ClusterDNS: "10.96.0.10", Version: "1.35.0"},
    Kubelet: {
      ApiServer: "https://192.0.2.1:6443",
      Auth: {BootstrapToken: "abcdef.0123456789abcdef"},
      Labels: {"kubeslot.io/e2e": "true"},
      RegisterWithTaints: ["e2e=adopted:NoSchedule"]
    },
    CRI: {Containerd: {Version: "2.0.4"}, Runc: {Version: "1.1.12"}},
    CNI: {PluginVersion: "1.5.1"},
    OCIImage: "ghcr.io/azure/agent-ubuntu2404:v20260427"
  }' >"$applied"
  chmod 0600 "$applied"
  sha256sum <"$applied" | cut -d' ' -f1 >"$applied.sha256"
  outer systemctl daemon-reload
  outer systemctl enable --now --quiet unbounded-agent-daemon.service
  outer machinectl enable kube1 >/dev/null 2>&1
  outer machinectl start kube1
  machine_wait_healthy kube1 60 || { fail "the unbounded-style kube1 did not turn healthy"; return 1; }
}

# A host unbounded-agent set up (kube1 running, its applied config, no
# kubeslot state) is refused by activate and fetch, naming the machine and
# `adopt`; nothing changes: no state, kube1 still runs, no kube2 tree.
scenario_unmanaged_machine_refused() {
  act_setup
  unbounded_kube1 || return 1
  write_config "$REF_v1"
  local cmd rc
  for cmd in activate fetch; do
    rc=0
    act "$cmd" || rc=$?
    check_eq "exit code of $cmd on an unmanaged host" "$rc" 3 || { show_log; return 1; }
    log "  $cmd refused: $(act_error)"
    check "$cmd names kube1 and adopt" grep -q "machine kube1 is running.*kubeslot-activator adopt" <<<"$(act_error)" || { show_log; return 1; }
  done
  check "no kubeslot state written" test ! -e "$OUTER/var/lib/kubeslot/state.json" || return 1
  check "no kube2 tree" test ! -e "$OUTER/var/lib/machines/kube2" || return 1
  check_eq "machines running after the refusals" "$(active_machines)" kube1 || return 1
  check "kube1's kubelet still healthy" machine_wait_healthy kube1 10
}

# adopt: kube1 recorded as the adopted active slot; --write-config turns the
# applied config into the activator config (API server, CA, token, labels,
# taints); the next activate flips into kube2 (v1) leaving kube1's tree and
# the agent's files as they were; rollback returns to the adopted kube1.
# Then `uninstall --purge` takes everything kubeslot made off the host and
# the agent's leftovers are removed, so activate_v1 starts on an empty host.
scenario_adopt_unbounded() {
  [ "$(active_machines)" = kube1 ] || unbounded_kube1 || return 1
  local nspawn_before tree_before cfg=$OUTER$CONFIG_IN_OUTER
  nspawn_before=$(sha256sum <"$OUTER/etc/systemd/nspawn/kube1.nspawn")
  tree_before=$(sha256sum <"$OUTER/var/lib/machines/kube1/usr/bin/kubelet")
  check "the agent's daemon runs before adopt" outer systemctl is-active --quiet unbounded-agent-daemon.service || return 1
  act adopt --dry-run --write-config --force --image "$REF_v1" --public-key /etc/kubeslot/trust/e2e.pub ||
    { show_log; fail "adopt --dry-run exited non-zero"; return 1; }
  check "adopt --dry-run names the agent's daemon" grep -q "warning: unbounded-agent-daemon.service is installed" "$ACT_LOG" || { show_log; return 1; }
  check "adopt --dry-run shows the config's token as not shown" grep -q '"bootstrap_token": "<secret: not shown>"' "$ACT_LOG" || { show_log; return 1; }
  check_absent "adopt --dry-run printed no token" 0123456789abcdef "$ACT_LOG" || { show_log; return 1; }
  act adopt --write-config --force --disable-agent --image "$REF_v1" --public-key /etc/kubeslot/trust/e2e.pub ||
    { show_log; fail "adopt exited non-zero"; return 1; }
  log "  $(head -n1 "$ACT_LOG")"
  check "adopt lists what it did not carry over" grep -q "OCIImage: unbounded-agent's thin image" "$ACT_LOG" || { show_log; return 1; }
  check_absent "adopt printed no token" 0123456789abcdef "$ACT_LOG" || return 1
  # --disable-agent stopped the agent's daemon, and it stays off at boot
  check_unit_inactive unbounded-agent-daemon.service || return 1
  check_unit_disabled unbounded-agent-daemon.service || return 1
  check "adopt carried the kubelet's client certificate into the node state" \
    test -L "$OUTER/var/lib/kubeslot/node/kubelet/pki/kubelet-client-current.pem" || { show_log; return 1; }
  check_eq "written config: api server, CA, token, DNS, labels, taints" \
    "$(jq -c '[.kubelet.api_server, ((.kubelet.ca_data | rtrimstr("\n")) == $ca), .kubelet.bootstrap_token, .kubelet.cluster_dns, .kubelet.labels, .kubelet.taints]' --arg ca "$(cat "$WORK/ca.crt")" "$cfg")" \
    '["https://192.0.2.1:6443",true,"abcdef.0123456789abcdef",["10.96.0.10"],{"kubeslot.io/e2e":"true"},["e2e=adopted:NoSchedule"]]' || return 1
  check_eq "written config's mode" "$(stat -c %a "$cfg")" 600 || return 1
  check_eq "status after adopt" "$(jq -r '[.state.active, .state.slots.kube1.status, .state.slots.kube1.adopted] | map(tostring) | join(" ")' "$(status_json)")" "kube1 active true" || return 1
  # what adopt cannot know: this test host's settings (the node name, DNS
  # servers, the e2e gate and preflight ignores), merged in as an operator
  # would edit the written file
  jq --argjson ignore "$E2E_PREFLIGHT_IGNORE" '.kubelet.node_name = "e2e-node" | .gpu = "off" | .nameservers = ["192.0.2.53"]
      | .health = {timeout_secs: 20, successes: 2, interval_ms: 500} | .preflight = {ignore: $ignore}' \
    "$cfg" >"$cfg.tmp" && mv "$cfg.tmp" "$cfg"

  act activate || { show_log; log_report; fail "activate after adopt exited non-zero"; return 1; }
  log_report
  expect_running kube2 v1.35.0-e2e.1 || return 1
  expect_status kube2 "$DIGEST_v1" || return 1
  check_eq "kube2 has the adopted node's client certificate" \
    "$(outer systemd-run -M kube2 --quiet --wait --pipe cat /var/lib/kubelet/pki/kubelet-client-current.pem </dev/null)" \
    "e2e kubelet client certificate" || return 1
  check "kube2 starts at boot" unit_enabled systemd-nspawn@kube2.service || return 1
  check_unit_disabled systemd-nspawn@kube1.service || return 1
  check_eq "the agent's kube1.nspawn kept" "$(sha256sum <"$OUTER/etc/systemd/nspawn/kube1.nspawn")" "$nspawn_before" || return 1
  check_eq "the adopted kube1 tree kept" "$(sha256sum <"$OUTER/var/lib/machines/kube1/usr/bin/kubelet")" "$tree_before" || return 1
  check_eq "kube1 is the previous (adopted) slot" "$(jq -r '[.slots.kube1.status, .slots.kube1.adopted] | map(tostring) | join(" ")' "$OUTER/var/lib/kubeslot/state.json")" "previous true" || return 1

  act rollback || { show_log; log_report; fail "rollback to the adopted kube1 exited non-zero"; return 1; }
  log_report
  expect_running kube1 v1.35.1-e2e.2 || return 1
  check_eq "status after the rollback" "$(jq -r '[.state.active, .state.slots.kube1.adopted, (.state.pending != null)] | map(tostring) | join(" ")' "$(status_json)")" "kube1 true false" || return 1
  check_eq "the agent's kube1.nspawn still kept" "$(sha256sum <"$OUTER/etc/systemd/nspawn/kube1.nspawn")" "$nspawn_before" || return 1

  # uninstall takes off what is kubeslot's (kube2, rendered files, host
  # settings, state) and leaves the adopted kube1 running as it was
  # --purge removes /etc/kubeslot too (issue 42): kept aside for the
  # scenarios after this one, put back once the removal is seen
  rm -rf "$WORK/etc-kubeslot.kept"
  cp -a "$OUTER/etc/kubeslot" "$WORK/etc-kubeslot.kept"
  act uninstall --purge || { show_log; fail "uninstall --purge exited non-zero"; return 1; }
  check_eq "machines running after uninstall: the adopted node" "$(active_machines)" kube1 || return 1
  check "uninstall says it kept the adopted kube1" grep -q "kept the adopted machine kube1 (running" "$ACT_LOG" || { show_log; return 1; }
  check_eq "the adopted kube1 tree kept by uninstall" "$(sha256sum <"$OUTER/var/lib/machines/kube1/usr/bin/kubelet")" "$tree_before" || return 1
  check_eq "the agent's kube1.nspawn kept by uninstall" "$(sha256sum <"$OUTER/etc/systemd/nspawn/kube1.nspawn")" "$nspawn_before" || return 1
  local p
  for p in /var/lib/machines/kube2 /etc/systemd/nspawn/kube2.nspawn /etc/systemd/system/systemd-nspawn@kube2.service.d \
    /etc/systemd/system/kubeslot-render@.service /etc/kubeslot/host /etc/sysctl.d/99-kubeslot.conf \
    /etc/modules-load.d/kubeslot.conf /var/lib/kubeslot; do
    check "uninstall removed $p" test ! -e "$OUTER$p" || return 1
  done
  check "uninstall --purge removed the config and the trust keys" test ! -e "$OUTER/etc/kubeslot" || return 1
  cp -a "$WORK/etc-kubeslot.kept" "$OUTER/etc/kubeslot"
  check "the config is back for what follows" test -f "$cfg" || return 1
  # Without kubeslot's record kube1 is the agent's machine again: a second
  # uninstall refuses it (exit 3, nothing changed) until asked explicitly.
  local rc=0
  act uninstall || rc=$?
  check_eq "exit code of uninstall with an unmanaged kube1" "$rc" 3 || { show_log; return 1; }
  check "the refusal names kube1" grep -q "machine kube1 is not kubeslot's" <<<"$(act_error)" || { show_log; return 1; }
  check_eq "machines running after the refusal" "$(active_machines)" kube1 || return 1
  act uninstall --remove-unmanaged || { show_log; fail "uninstall --remove-unmanaged exited non-zero"; return 1; }
  check_eq "machines running after uninstall --remove-unmanaged" "$(active_machines)" "" || return 1
  for p in /var/lib/machines/kube1 /etc/systemd/nspawn/kube1.nspawn /etc/systemd/system/systemd-nspawn@kube1.service.d; do
    check "uninstall --remove-unmanaged removed $p" test ! -e "$OUTER$p" || return 1
  done
  # The operator retires unbounded-agent's leftovers and turns the
  # package's boot-time activation back on: uninstall disabled it, and a
  # reinstall of the package without --purge would keep it disabled
  # (Debian keeps the administrator's choice), so activate_v1 needs this.
  rm -rf "$OUTER/etc/unbounded" "$OUTER/etc/systemd/system/unbounded-agent-daemon.service"
  outer systemctl enable --quiet kubeslot-activator.service
  outer systemctl daemon-reload
}

# reboot_outer: the outer host shut down (as `poweroff`) and booted again
# from the same tree; its boot runs machines.target (the enabled node) and
# kubeslot-activator.service (activate) before it counts as running.
reboot_outer() {
  outer_stop
  cgroup_reset
  outer_start
}

# After a commit the outer host is powered off and booted again: the
# committed slot runs (started by machines.target, or by the boot-time
# activate's reconcile), the other does not, status and boot enablement
# agree, and the boot-time run changed nothing.
scenario_reboot() {
  local before version report
  before=$(running_machine) || return 1
  version=$(outer systemd-run -M "$before" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null | cut -d' ' -f2)
  reboot_outer
  report=$(report_file)
  check_eq "last run after the boot" "$(jq -r .command "$report")" activate || return 1
  log "  boot-time activate: $(jq -c '{exit_code, outcome, slot, recovered, error}' "$report")"
  check "the boot-time activate found the node as committed" grep -Eqx 'up-to-date|started' <<<"$(jq -r .outcome "$report")" || return 1
  expect_running "$before" "$version" || return 1
  expect_status "$before" "$(jq -r --arg m "$before" '.slots[$m].digest' "$OUTER/var/lib/kubeslot/state.json")" || return 1
  check "$before starts at boot" unit_enabled "systemd-nspawn@$before.service" || return 1
  check_unit_disabled "systemd-nspawn@$(other_machine "$before").service"
}

# A flip that the host refuses before anything changes: preflight fails for
# a real reason the outer host has, (1) systemd-nspawn missing (moved aside
# for the test), (2) no /dev/kmsg once that check is not ignored: activate
# exits 3 naming the check, the running node, status and the idle slot are
# unchanged, no staging dir; the standalone `preflight` agrees.
scenario_preflight_fails() {
  local before rc
  before=$(node_snapshot) || return 1
  write_config "$REF_v4"
  mv "$OUTER/usr/bin/systemd-nspawn" "$OUTER/usr/bin/systemd-nspawn.e2e-hidden"
  rc=0
  act activate || rc=$?
  mv "$OUTER/usr/bin/systemd-nspawn.e2e-hidden" "$OUTER/usr/bin/systemd-nspawn"
  check_eq "exit code with systemd-nspawn missing" "$rc" 3 || { show_log; return 1; }
  log "  refused: $(act_error)"
  check "the error names systemd-container" grep -q "systemd-container (seen: missing: systemd-nspawn" <<<"$(act_error)" || { show_log; return 1; }
  check "report.json names it" grep -q '"name": "systemd-container"' "$(report_file)" || return 1
  expect_unchanged "$before" || return 1

  PREFLIGHT_IGNORE='["cgroup-v2", "sysctl-*"]' write_config "$REF_v4"
  rc=0
  act preflight || rc=$?
  check_eq "exit code of preflight without /dev/kmsg ignored" "$rc" 3 || { show_log; return 1; }
  check "preflight prints the failed check" grep -q '^\[FAIL\] dev-kmsg: seen missing' "$ACT_LOG" || { show_log; return 1; }
  sed 's/^/    | /' "$ACT_LOG" >&2
  rc=0
  act activate || rc=$?
  check_eq "exit code of activate without /dev/kmsg ignored" "$rc" 3 || { show_log; return 1; }
  check "the error names dev-kmsg" grep -q "dev-kmsg (seen: missing" <<<"$(act_error)" || { show_log; return 1; }
  check_eq "staging dirs" "$(find "$OUTER/var/lib/machines" -maxdepth 1 -name '.*staging*' | wc -l)" 0 || return 1
  expect_unchanged "$before" || return 1
  write_config "$REF_v4"
}

# Power loss inside a health gate: v5 into the idle slot, the outer host
# killed (SIGKILL to its init: every process dies) as soon as the new
# machine's unit is active; boot: machines.target starts the old committed
# node (the new one was never enabled) and the boot-time activate rolls the
# dead run's try back (v5 marked bad, its one try used): the old slot runs,
# status agrees, nothing is pending.
scenario_reboot_mid_flip() {
  local before target digest
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  digest=$(jq -r --arg m "$before" '.slots[$m].digest' "$OUTER/var/lib/kubeslot/state.json")
  local version
  version=$(outer systemd-run -M "$before" --quiet --wait --pipe /usr/bin/kubelet --version </dev/null | cut -d' ' -f2)
  write_config "$REF_v5"
  act_bg activate
  local deadline=$((SECONDS + 180))
  while [ $SECONDS -lt $deadline ] && kill -0 "$ACT_PID" 2>/dev/null && ! unit_active "$target"; do sleep 0.02; done
  if ! unit_active "$target"; then
    wait "$ACT_PID" || true; show_log; fail "the activator never started $target"; return 1
  fi
  check_eq "pending try recorded before the power loss" "$(jq -r '.pending.phase + " " + .pending.to' "$OUTER/var/lib/kubeslot/state.json")" "trying $target" || return 1
  outer_kill
  wait "$ACT_PID" 2>/dev/null || true
  outer_start
  local report
  report=$(report_file)
  log "  boot-time activate: $(jq -c '{exit_code, outcome, recovered, error}' "$report")"
  check "the boot-time run rolled the dead try back" grep -q "rolled back a dead run's flip to $target" <<<"$(jq -r '.recovered // ""' "$report")" || return 1
  expect_running "$before" "$version" || return 1
  expect_status "$before" "$digest" || return 1
  check "v5 marked bad (its one try was used)" grep -Eq "$(digest_alternatives "$DIGEST_v5")" <<<"$(jq -r '.state.bad[].digest' "$(status_json)")" || return 1
  check "$before starts at boot" unit_enabled "systemd-nspawn@$before.service"
}
