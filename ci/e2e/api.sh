# shellcheck shell=bash
# The node and the cluster's API, sourced by ci/e2e/run.sh: the node
# machine's kubelet (the fixture) joins the fixture API server
# (fixtures/fake-apiserver, started beside the registry by apiserver_start)
# with the bootstrap kubeconfig the activator rendered, exactly as a real
# kubelet joins a kubeadm cluster (TLS bootstrap, Node, Lease); what the
# cluster sees is read with the real kubectl 1.36 (ci/lib/kube-clients.sh).

KUBECTL=/opt/kubeslot-ci/kubectl/usr/bin/kubectl

# kube ARGS...: kubectl as the cluster admin (its discovery cache in WORK).
kube() {
  HOME=$WORK/kube-home "$KUBECTL" --kubeconfig "$WORK/apiserver/pki/admin.kubeconfig" "$@"
}

# node_field JSONPATH: a field of Node e2e-node.
node_field() { kube get node e2e-node -o "jsonpath=$1" 2>/dev/null; }

# node_wait_ready VERSION TIMEOUT_S: e2e-node is Ready with that kubelet version.
node_wait_ready() {
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(node_field '{.status.conditions[?(@.type=="Ready")].status} {.status.nodeInfo.kubeletVersion}')" = "True $1" ]; then
      return 0
    fi
    sleep 1
  done
  return 1
}

# show_kubelet MACHINE: the kubelet's last journal lines and the API's view.
show_kubelet() {
  outer journalctl -M "$1" -u kubelet --no-pager -o cat 2>/dev/null | tail -n 25 | sed 's/^/    | /' >&2
  kube get nodes -o wide >&2 || true
}

# The node machine of activate_v1 joins: its Node is registered by TLS
# bootstrap with the config's bootstrap token, carries the config's labels
# and taints and the kubelet's version, turns Ready, and its Lease is
# renewed. (Pods bound through the API are not run here: this outer's
# machines have the rendered cgroup2-only layout, whose v2 hierarchy has no
# controllers on this hybrid-cgroup host, so runc cannot make pods; the
# pod scenarios run in their own outer host.) The Node's UID is kept for
# activate_v2_flip, which checks the next slot's kubelet takes the same
# Node over.
scenario_node_joins_api() {
  check "Node e2e-node Ready with kubelet v1.35.0-e2e.1" node_wait_ready v1.35.0-e2e.1 60 || { show_kubelet kube1; return 1; }
  log "  kubectl get nodes -o wide: $(kube get nodes -o wide | tr -s ' ' | paste -sd'|')"
  check_eq "the config's label on the Node" "$(node_field '{.metadata.labels.kubeslot\.io/e2e}')" true || return 1
  check_eq "the config's taint on the Node" "$(node_field '{.spec.taints[*].key}={.spec.taints[*].value}:{.spec.taints[*].effect}')" "kubeslot.io/e2e=true:NoSchedule" || return 1
  check "the container runtime is containerd" grep -q '^containerd://2\.' <<<"$(node_field '{.status.nodeInfo.containerRuntimeVersion}')" || return 1
  # (earlier scenarios that purged the node's state made their kubelets
  # bootstrap too: one CSR per fresh node state, each alike)
  local csr
  csr=$(kube get csr -o json | jq -r '.items[] | [.spec.username, .spec.signerName, .status.conditions[0].reason, (.status.certificate != null)] | join(" ")')
  check "TLS bootstrap: CSRs by the bootstrap token, approved and issued ($(wc -l <<<"$csr"))" test -n "$csr" || return 1
  check_eq "every CSR" "$(sort -u <<<"$csr")" \
    "system:bootstrap:abcdef kubernetes.io/kube-apiserver-client-kubelet AutoApproved true" || return 1
  wc -l <<<"$csr" >"$WORK/csr-count"
  # (read inside the machine: kubelet-client-current.pem links to the
  # dated file by its in-machine path, as the real kubelet's does)
  check "the kubelet wrote its kubeconfig and client certificate into the node's state (/var/lib/kubelet)" \
    outer systemd-run -M kube1 --quiet --wait --pipe test -s /var/lib/kubelet/kubeconfig -a -s /var/lib/kubelet/pki/kubelet-client-current.pem </dev/null || return 1

  # the Lease: held by the node, renewed every 10 s
  local holder renew1 renew2="" deadline
  holder=$(kube get lease -n kube-node-lease e2e-node -o 'jsonpath={.spec.holderIdentity} {.metadata.ownerReferences[0].uid}')
  check_eq "Lease kube-node-lease/e2e-node holder and owner" "$holder" "e2e-node $(node_field '{.metadata.uid}')" || return 1
  renew1=$(kube get lease -n kube-node-lease e2e-node -o 'jsonpath={.spec.renewTime}')
  deadline=$((SECONDS + 25))
  while [ $SECONDS -lt $deadline ]; do
    renew2=$(kube get lease -n kube-node-lease e2e-node -o 'jsonpath={.spec.renewTime}')
    [ "$renew2" != "$renew1" ] && break
    sleep 1
  done
  check "the Lease was renewed within 25 s ($renew1 -> $renew2)" test "$renew2" != "$renew1" || return 1

  node_field '{.metadata.uid}' >"$WORK/node-uid"
}

# node_after_flip VERSION: after a flip, the same Node (the UID
# node_joins_api saw) is Ready again with the new kubelet, which reused the
# client certificate in the node's state (no second CSR).
node_after_flip() {
  check "Node e2e-node Ready with kubelet $1" node_wait_ready "$1" 60 || { show_kubelet kube2; return 1; }
  check_eq "the Node's UID across the flip" "$(node_field '{.metadata.uid}')" "$(cat "$WORK/node-uid")" || return 1
  check_eq "CSRs (the new slot's kubelet did not bootstrap again)" "$(kube get csr -o name | wc -l)" "$(cat "$WORK/csr-count")"
}
