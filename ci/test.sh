#!/usr/bin/env bash
# The test command (README "Test"): the tools it needs installed when
# missing (ci/setup.sh), format and lint gates, every crate's tests, then
# the end-to-end scenarios. People run it by hand; CI runs exactly this
# (.ci/run, .github/workflows/ci.yml). Run it as root: the setup installs
# with apt, and the e2e boots containers (as another user it stops at the
# first missing tool, naming the command that installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
# The end-to-end scenarios are part of the test command: a run.sh that lost
# its mode bit fails here, at once, rather than being skipped at the end.
[ -x ci/e2e/run.sh ] || { echo "ci/test.sh: ci/e2e/run.sh is not executable (git update-index --chmod=+x ci/e2e/run.sh)" >&2; exit 1; }

# Where the time goes: every step below is timed, and the table is printed
# when the command ends (passed or failed). ci/setup.sh writes its own parts
# (setup-apt, setup-python) to the same file; KUBESLOT_CI_TIMES=FILE keeps
# the rows in FILE (a caller's own steps can go there too).
times=${KUBESLOT_CI_TIMES:-$(mktemp)}
step() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '%s\t%s\n' "$name" "$((SECONDS - t0))" >>"$times"
  return "$rc"
}
print_times() {
  local rc=$?
  [ -z "${layer_cache:-}" ] || rm -rf "$layer_cache"
  echo "== time per step (s) =="
  awk -F'\t' '{ printf "%-28s %6d\n", $1, $2; t += $2 } END { printf "%-28s %6d\n", "total", t }' "$times"
  [ -n "${KUBESLOT_CI_TIMES:-}" ] || rm -f "$times"
  exit "$rc"
}
trap print_times EXIT

# Quick when everything is there (a dpkg-query and a few file tests).
KUBESLOT_CI_TIMES=$times ci/setup.sh
step fmt cargo fmt --all -- --check
# The structure rules: no async/OCI/TOML/sigstore crate on hosts, the
# builder never links the activator, no module cycle, no library -> command
# arrow; no file over 1,000 lines, no function outside tests over 120;
# README.md <= 400 lines, ARCHITECTURE.md <= 600, no broken link in the docs.
step structure-lints sh -c 'ci/lint/deps.sh && ci/lint/modules.py && ci/lint/sizes.py && ci/lint/docs.py'
# The tests are built first and linted with the same profile: clippy then
# reuses the dependencies the test build compiled (1 min instead of 4-6 on
# 2 cores, measured on a clean clone).
step build-tests cargo test --workspace --locked --no-run
step clippy cargo clippy --workspace --all-targets --locked --profile test -- -D warnings
# Every shell script through shellcheck; the GitHub workflows' schema,
# security audit (zizmor) and shape.
step script-lints ci/lint/scripts.sh
# The e2e's cgroup layout decision (unified or hybrid) on fake machine roots.
step e2e-cgroup-layout ci/e2e/cgroup-test.sh
step cargo-test cargo test --workspace --locked
# The README's offline demo, with the binaries the tests just built.
# Its output (which includes the refusal of a tampered archive) is shown
# only when it fails.
demo_log=$(mktemp)
if ! step demo env KUBESLOT_BIN_DIR=target/debug ci/demo.sh "${TMPDIR:-/tmp}/kubeslot-demo" >"$demo_log" 2>&1; then
  cat "$demo_log"
  rm -f "$demo_log"
  echo "ci/demo.sh failed" >&2
  exit 1
fi
rm -f "$demo_log"
echo "ci/demo.sh: ok"
# The real-GPU check without a GPU (with the binaries the tests just built):
# --prepare writes a complete dir under 64 MiB, its image and CUDA probe work in a chroot of the node tree (a
# stand-in driver), and the check itself exits 77 here.
step gpu-check-dry env KUBESLOT_BIN_DIR=target/debug ci/gpu/node-root-check-test.sh
# Every benchmark once at its smoke size, with the binaries the tests just
# built: a bench that fails fails the test command (timings not asserted).
step bench-smoke env KUBESLOT_BIN_DIR=target/debug ci/bench/smoke.sh
# Both slot modes: every scenario in the default (overlay where the outer
# host can, which it can here), and again on copied trees the scenarios
# whose outcome can depend on the slot mode (the pod and CRI scenarios'
# checks inside a running node, and the image checks, run once).
# The node images' base layer is written once for both passes
# (`kubeslot-builder build --layer-cache`, ~9 s saved per image build).
layer_cache=$(mktemp -d "${TMPDIR:-/var/tmp}/kubeslot-e2e-layers.XXXXXX")
export KUBESLOT_E2E_LAYER_CACHE=$layer_cache
step e2e-default ci/e2e/run.sh
step e2e-copy-slot-sensitive env KUBESLOT_E2E_SLOTS=copy ci/e2e/run.sh --slot-sensitive
