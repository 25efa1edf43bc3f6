#!/usr/bin/env bash
# What the test command (ci/test.sh) needs, installed when it is missing:
# the one list of the system packages its tests, lints, benchmarks and e2e
# call, and the Python tools that come from PyPI (each in a venv of its
# own). ci/test.sh runs it first; .ci/run runs ci/test.sh.
#
#   ci/setup.sh           install what is missing, then say what is there
#   ci/setup.sh --check   only say what is missing (exit 1 when anything is)
#
# Quick and changes nothing when everything is there (one dpkg-query, a few
# file tests). Installing needs root (apt-get, /opt, /usr/local/bin): as
# another user a missing piece fails, naming the command that installs it.
# apt waits up to 5 minutes for another apt or dpkg to let go of its lock.
# Debian 12 (the development and CI machines) and Ubuntu 24.04 (GitHub's
# runner, .github/workflows/ci.yml); where the two name a package
# differently, ubuntu_name says so. The Rust toolchain (cargo, rustfmt,
# clippy) is checked, not installed: rustup installs it.
#
# KUBESLOT_CI_TIMES=FILE: one "step<TAB>seconds" line per part (setup-apt,
# setup-python) is appended to FILE, for ci/test.sh's time table.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'ci/setup.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_only=0
case ${1:-} in
  "") ;;
  --check) check_only=1 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument $1 (see --help)" ;;
esac

# The system packages, by what needs them. A tool a test calls is here, and
# the test fails naming its package when it is missing (never skips).
PACKAGES=(
  # the tests' own registries (started by the harness on free ports) and
  # images: copy, unpack, compress
  docker-registry skopeo umoci zstd
  # the egress proxy the registries are reached through (fetch::proxy, the
  # e2e's egress_through_proxy)
  tinyproxy
  # Debian root trees for tests, benchmarks and the e2e (ci/lib/debian-rootfs.sh),
  # checked against Debian's archive keys, on Ubuntu too
  mmdebstrap debian-archive-keyring apt-utils ca-certificates
  # the e2e's outer host and node machines (systemd-nspawn, nsenter, ps, ip)
  systemd-container util-linux procps iproute2
  # scripts and their checks
  python3 python3-venv gpg openssl jq binutils git curl shellcheck
  # the GPU tests build fake NVIDIA driver libraries (real ELF objects)
  gcc
  # the pod scenarios' container images are made from a static busybox
  busybox-static
  # the fixture kubelet's CRI client is generated from the CRI proto at
  # build time (k8s-cri's build script runs protoc)
  protobuf-compiler
  # the benchmarks' smoke run (ci/bench/smoke.sh): the fleet bench's caching
  # mirror and rate limiter, peak RSS of fetch and unpack (/usr/bin/time)
  nginx-light time
)

# ubuntu_name PACKAGE: the package's name on Ubuntu 24.04.
ubuntu_name() {
  case $1 in
    # Ubuntu's nginx is one package (Debian 12 splits it into flavours);
    # the bench needs only its core modules (proxy_cache, limit_req)
    nginx-light) echo nginx ;;
    *) echo "$1" ;;
  esac
}

# The Python tools: DIR under /opt/kubeslot-ci, the requirements installed
# there, and the commands linked into /usr/local/bin. Debian's and Ubuntu's
# python3 refuse `pip install` into the system (PEP 668), hence the venvs.
#  spdx-tools: the SBOM test's SPDX validator (pyspdxtools)
#  lint: the workflows' schema check and security audit (ci/lint/scripts.sh)
VENVS=(
  "spdx-tools|spdx-tools>=0.8,<0.9|pyspdxtools"
  "lint|check-jsonschema==0.39.0 zizmor==1.32.0|check-jsonschema zizmor"
)
VENV_ROOT=/opt/kubeslot-ci

times=${KUBESLOT_CI_TIMES:-}
record() { [ -z "$times" ] || printf '%s\t%s\n' "$1" "$2" >>"$times"; }
is_root() { [ "$(id -u)" = 0 ]; }

# ---------------------------------------------------------------- packages

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  die "no apt on this machine: install these packages by hand (Debian names): ${PACKAGES[*]}"
fi
distro=$(. /etc/os-release && echo "${ID:-debian}")
wanted=()
for p in "${PACKAGES[@]}"; do
  if [ "$distro" = ubuntu ]; then wanted+=("$(ubuntu_name "$p")"); else wanted+=("$p"); fi
done

t0=$SECONDS
# (dpkg-query names the packages it does not know on stderr and exits 1)
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${wanted[@]}" 2>/dev/null |
  awk '$2 == "ii" { print $1 }' || true)
missing=()
for p in "${wanted[@]}"; do
  grep -qx -- "$p" <<<"$installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$check_only" = 1 ]; then
    log "missing packages: ${missing[*]}"
  elif ! is_root; then
    die "missing packages: ${missing[*]}; install them as root: sudo ci/setup.sh (or apt-get install -y --no-install-recommends ${missing[*]})"
  else
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Packages whose install scripts start a service (docker-registry,
    # nginx) must not: the tests start their own, on free ports. A
    # policy-rc.d answering 101 keeps invoke-rc.d and deb-systemd-invoke
    # from starting them; one this script made is removed afterwards.
    policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# made by kubeslot ci/setup.sh while it installs\nexit 101\n' >"$policy"
      chmod 0755 "$policy"
      made_policy=1
      trap '[ "$made_policy" = 0 ] || rm -f "$policy"' EXIT
    fi
    apt-get update -q -o DPkg::Lock::Timeout=300
    apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}"
    if [ "$made_policy" = 1 ]; then rm -f "$policy"; made_policy=0; fi
  fi
fi
record setup-apt $((SECONDS - t0))

# ---------------------------------------------------------------- Python tools

# venv_current DIR REQUIREMENT...: DIR's venv has every requirement
# installed at a version it allows (pip's own requirement parser).
venv_current() {
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || return 1
  "$dir/bin/python" - "$@" <<'PY' 2>/dev/null
import importlib.metadata as md
import sys
from pip._vendor.packaging.requirements import Requirement

for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(version, prereleases=True):
        sys.exit(1)
PY
}

t0=$SECONDS
stale=()
for v in "${VENVS[@]}"; do
  IFS='|' read -r name reqs cmds <<<"$v"
  dir=$VENV_ROOT/$name
  read -ra reqs <<<"$reqs"
  read -ra cmds <<<"$cmds"
  linked=1
  for c in "${cmds[@]}"; do
    [ "$(readlink "/usr/local/bin/$c" 2>/dev/null)" = "$dir/bin/$c" ] && [ -x "$dir/bin/$c" ] || linked=0
  done
  if [ "$linked" = 1 ] && venv_current "$dir" "${reqs[@]}"; then
    continue
  fi
  if [ "$check_only" = 1 ] || ! is_root; then
    stale+=("$dir (${reqs[*]}; ${cmds[*]} in /usr/local/bin)")
    continue
  fi
  log "installing ${reqs[*]} into $dir"
  if ! [ -x "$dir/bin/python" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "${reqs[@]}"
  for c in "${cmds[@]}"; do ln -sfn "$dir/bin/$c" "/usr/local/bin/$c"; done
done
record setup-python $((SECONDS - t0))

# ---------------------------------------------------------------- Kubernetes clients

# The real clients the fixture API server is proven with
# (fixtures/fake-apiserver/tests/clients.rs): kubectl 1.36 from Debian
# testing unpacked under /opt/kubeslot-ci/kubectl (another vendor's kubectl
# may own /usr/bin/kubectl), the Python client `kubernetes` in a venv.
t0=$SECONDS
if ! ci/lib/kube-clients.sh --check >/dev/null 2>&1; then
  if [ "$check_only" = 1 ] || ! is_root; then
    stale+=("the Kubernetes clients (kubectl 1.36 under /opt/kubeslot-ci/kubectl, the Python client in /opt/kubeslot-ci/kube-client: ci/lib/kube-clients.sh)")
  else
    log "installing kubectl 1.36 and the Python client (ci/lib/kube-clients.sh)"
    ci/lib/kube-clients.sh >&2
  fi
fi
record setup-kube-clients $((SECONDS - t0))

# ---------------------------------------------------------------- Rust

rust_missing=()
command -v cargo >/dev/null || rust_missing+=(cargo)
if command -v cargo >/dev/null; then
  cargo fmt --version >/dev/null 2>&1 || rust_missing+=(rustfmt)
  cargo clippy --version >/dev/null 2>&1 || rust_missing+=(clippy)
fi

problems=0
if [ "$check_only" = 1 ] && [ ${#missing[@]} -gt 0 ]; then problems=1; fi
if [ ${#stale[@]} -gt 0 ]; then
  for s in "${stale[@]}"; do log "missing or outdated Python tools: $s"; done
  if [ "$check_only" = 0 ]; then
    die "install them as root: sudo ci/setup.sh"
  fi
  problems=1
fi
if [ ${#rust_missing[@]} -gt 0 ]; then
  log "missing from the Rust toolchain: ${rust_missing[*]} (rustup: \`rustup component add rustfmt clippy\`; the workspace builds with Rust 1.95)"
  [ "$check_only" = 1 ] || exit 1
  problems=1
fi
[ "$problems" = 0 ] || exit 1
log "every tool is there (${#wanted[@]} packages on $distro, ${#VENVS[@]} Python venvs, cargo with rustfmt and clippy)"
