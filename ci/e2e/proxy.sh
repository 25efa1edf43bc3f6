# shellcheck shell=bash
# shellcheck disable=SC2154 # REF_*, REGISTRY, IMAGE_REPO, CONFIG_IN_OUTER: set by images.sh, lib.sh and activator.sh, which run.sh sources first
# The egress proxy (issue 42; docs/host/host-files.md, "Egress proxy"): a
# host that reaches its registry only through a proxy. Sourced by run.sh.
#
# The image is named registry.kubeslot-e2e.test:PORT (the test registry's
# port): a name only the proxy can resolve. The proxy is Debian's tinyproxy
# on a free 127.0.0.1 port of this machine, started in a private mount
# namespace whose /etc/hosts maps the name to 127.0.0.1; the outer host
# (this machine's network, its own /etc/hosts) cannot reach the registry by
# that name without it.

PROXY_REGISTRY_NAME=registry.kubeslot-e2e.test
PROXY_PID=""

# proxy_start: tinyproxy in the foreground (a private /etc/hosts), logging
# every request to $WORK/logs/tinyproxy.log; sets PROXY_PORT.
proxy_start() {
  local dir=$WORK/proxy deadline
  command -v tinyproxy >/dev/null || { fail "tinyproxy is missing (Debian package tinyproxy; ci/setup.sh installs it)"; return 1; }
  mkdir -p "$dir"
  PROXY_PORT=$(free_port)
  printf '127.0.0.1 localhost\n127.0.0.1 %s\n' "$PROXY_REGISTRY_NAME" >"$dir/hosts"
  cat >"$dir/tinyproxy.conf" <<EOF2
Port $PROXY_PORT
Listen 127.0.0.1
Timeout 60
LogFile "$WORK/logs/tinyproxy.log"
LogLevel Connect
PidFile "$dir/tinyproxy.pid"
MaxClients 20
Allow 127.0.0.1
EOF2
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --propagation private sh -c 'mount --bind "$1" /etc/hosts && exec tinyproxy -d -c "$2"' \
    sh "$dir/hosts" "$dir/tinyproxy.conf" >"$WORK/logs/tinyproxy.out" 2>&1 </dev/null &
  PROXY_PID=$!
  deadline=$((SECONDS + 10))
  until (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$PROXY_PID" 2>/dev/null; then
      cat "$WORK/logs/tinyproxy.out" >&2
      fail "tinyproxy did not listen on 127.0.0.1:$PROXY_PORT"
      return 1
    fi
    sleep 0.1
  done
  log "  tinyproxy on 127.0.0.1:$PROXY_PORT (pid $PROXY_PID), $PROXY_REGISTRY_NAME -> 127.0.0.1 in its namespace only"
}

proxy_stop() {
  [ -n "$PROXY_PID" ] || return 0
  kill "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
  PROXY_PID=""
}

scenario_egress_through_proxy() {
  local rc=0
  proxy_start || return 1
  proxy_checks || rc=$?
  proxy_stop
  return "$rc"
}

# v5 (any version: a downgrade is allowed here, so that the scenario runs
# on whatever an earlier one left) by the name only the proxy resolves,
# through the proxy the config names; the node's containerd and kubelet
# run with the proxy as their environment.
proxy_checks() {
  local image=$PROXY_REGISTRY_NAME:${REGISTRY#*:}/${REF_v5#*/} target env unit
  act_setup
  check "the outer host cannot resolve $PROXY_REGISTRY_NAME itself" \
    bash -c "! nsenter -t $OUTER_LEADER -m -u -i -n -p -C -- getent hosts $PROXY_REGISTRY_NAME" || return 1
  config_json "$image" /etc/kubeslot/trust/e2e.pub |
    jq --arg id "$REGISTRY/$IMAGE_REPO" --arg host "$PROXY_REGISTRY_NAME:${REGISTRY#*:}" \
      --arg proxy "http://127.0.0.1:$PROXY_PORT" '
      .trust.identity = $id | .trust.allow_downgrade = true
      | .registries[$host] = {insecure: true}
      | .proxy = {https: $proxy, http: $proxy, no_proxy: ["localhost"]}' >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
  act activate || { show_log; log_report; fail "activate through the proxy exited non-zero"; return 1; }
  log_report
  check "the activator reached the registry through the proxy" \
    grep -q "CONNECT $PROXY_REGISTRY_NAME:${REGISTRY#*:} " "$WORK/logs/tinyproxy.log" ||
    { cat "$WORK/logs/tinyproxy.log" >&2; return 1; }
  target=$(running_machine) || return 1
  expect_running "$target" v1.35.4-e2e.5 || return 1
  for unit in containerd kubelet; do
    env=$(outer systemctl -M "$target" show "$unit" -p Environment --value)
    check "$unit in $target runs with the proxy" grep -qE "HTTPS_PROXY=http://127.0.0.1:$PROXY_PORT .*NO_PROXY=localhost,127.0.0.1,::1( |,|$)" <<<"$env" ||
      { echo "$env" >&2; return 1; }
  done
}
