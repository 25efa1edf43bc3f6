#!/usr/bin/env bash
# Installs the real Kubernetes clients the fixture API server's fidelity
# tests run (fixtures/fake-apiserver/tests/clients.rs), beside the
# machine's own packages:
#
#   * kubectl 1.36 from Debian testing (forky), the suite the e2e takes
#     containerd from, through this machine's own Debian mirror (read from
#     its apt sources, never written here). The machine may already have
#     another vendor's kubectl owning /usr/bin/kubectl, so the .deb is
#     unpacked (dpkg -x) under /opt/kubeslot-ci/kubectl and nothing is
#     installed in dpkg's database; apt reads forky's lists from a private
#     state directory, so the machine's sources stay as they are.
#   * the official Python client (`kubernetes` from PyPI) in a venv at
#     /opt/kubeslot-ci/kube-client, as the other Python tools are.
#
#   ci/lib/kube-clients.sh          (idempotent; about 1 min the first time)
#   ci/lib/kube-clients.sh --check  (exit 1 when either is missing; ci/setup.sh)
set -euo pipefail

KUBECTL_SUITE=forky
# The minor version the tests were written against: another one is refused
# rather than silently tested.
KUBECTL_MINOR=1.36
PY_CLIENT='kubernetes==37.0.2'
prefix=/opt/kubeslot-ci/kubectl
venv=/opt/kubeslot-ci/kube-client

# (kubectl's output is read whole before it is matched: `kubectl | grep -q`
# or `| head` can end before kubectl has written, which SIGPIPE and pipefail
# turn into a failure; a clean clone's .ci/run exited 141 on it)
have_kubectl() {
  local out
  [ -x "$prefix/usr/bin/kubectl" ] &&
    out=$("$prefix/usr/bin/kubectl" version --client 2>/dev/null) &&
    grep -q "^Client Version: v${KUBECTL_MINOR//./\\.}\." <<<"$out"
}

have_python_client() {
  "$venv/bin/python" -c "import kubernetes, sys; sys.exit(kubernetes.__version__ != '${PY_CLIENT#*==}')" 2>/dev/null
}

if [ "${1:-}" = --check ]; then
  have_kubectl && have_python_client
  exit
fi

if ! have_kubectl; then
  mirror=$("$(dirname "$0")/debian-mirror.sh")
  state=$(mktemp -d)
  trap 'rm -rf "$state"' EXIT
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
  echo "deb $mirror $KUBECTL_SUITE main" >"$state/sources.list"
  : >"$state/status"
  apt_opts=(
    -o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
    -o "Dir::Cache=$state/cache" -o 'Acquire::Check-Valid-Until=false'
    # apt's download user cannot write the private temp dir
    -o APT::Sandbox::User=root
  )
  apt-get -q "${apt_opts[@]}" update >&2
  version=$(apt-cache "${apt_opts[@]}" policy kubectl | sed -n 's/^ *Candidate: //p')
  case $version in
    "$KUBECTL_MINOR".*) ;;
    *) echo "kube-clients: $KUBECTL_SUITE has kubectl '$version', not $KUBECTL_MINOR.x (the fidelity tests are written for $KUBECTL_MINOR)" >&2; exit 1 ;;
  esac
  (cd "$state/cache" && apt-get -q "${apt_opts[@]}" download "kubectl=$version" >&2)
  rm -rf "$prefix.tmp"
  mkdir -p "$prefix.tmp"
  dpkg -x "$state/cache"/kubectl_*.deb "$prefix.tmp"
  rm -rf "$prefix"
  mv "$prefix.tmp" "$prefix"
  have_kubectl || { echo "kube-clients: $prefix/usr/bin/kubectl does not report v$KUBECTL_MINOR.x" >&2; exit 1; }
fi
out=$("$prefix/usr/bin/kubectl" version --client)
echo "${out%%$'\n'*}"

if ! have_python_client; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$PY_CLIENT"
fi
"$venv/bin/python" -c 'import kubernetes; print("kubernetes (Python client)", kubernetes.__version__)'
