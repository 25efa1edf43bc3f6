#!/usr/bin/env bash
# The fleet simulation (issue 39): NODES simulated nodes roll one release
# through the real rollout code and API client against the fixture API
# server (activator/examples/rollout_sim.rs), a node's drain+flip+gate a
# sleep of FLIP_MS. Prints the largest number of nodes ever in flight
# (never above LIMIT: the run fails otherwise), the makespan against the
# ideal (nodes / limit x flip), API requests per node, and the time until
# the leases of K killed holders are held again (one lease duration),
# and the errors retried when the API server is away for O ms (every
# connection cut, new ones refused, once half the nodes are done), and
# with --fault-every N every Nth request answered 429/503/500 in turn
# (default 0: none; the smoke size injects them).
#
#   ci/bench/rollout.sh [--nodes N] [--limit L] [--flip-ms F] [--lease-s S]
#                       [--poll-ms P] [--kill K] [--outage-ms O] [--fault-every N]
#   (defaults: the figures in docs/benchmarks.md: 1000 nodes, limit 50,
#   flip 2000 ms, lease 10 s, poll 5000 ms, 5 killed, 3000 ms outage: with
#   hundreds waiting, a freed lease is taken within milliseconds however
#   long each one sleeps between polls)
#
# KUBESLOT_BIN_DIR=DIR: use DIR/examples/rollout_sim (ci/bench/smoke.sh
# passes target/debug); else a release build of the example.
set -euo pipefail
cd "$(dirname "$0")/../.."
nodes=1000 limit=50 flip=2000 lease=10 poll=5000 kill=5 outage=3000 faults=0
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2 ;;
    --limit) limit=$2 ;;
    --flip-ms) flip=$2 ;;
    --lease-s) lease=$2 ;;
    --poll-ms) poll=$2 ;;
    --kill) kill=$2 ;;
    --outage-ms) outage=$2 ;;
    --fault-every) faults=$2 ;;
    *) echo "rollout.sh: unknown option $1 (see the header)" >&2; exit 2 ;;
  esac
  shift 2
done
if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  sim=$KUBESLOT_BIN_DIR/examples/rollout_sim
  [ -x "$sim" ] || { echo "rollout.sh: $sim is missing: cargo test -p kubeslot-activator --no-run builds it" >&2; exit 1; }
else
  cargo build --release --locked --quiet -p kubeslot-activator --example rollout_sim
  sim=target/release/examples/rollout_sim
fi
# the fixture logs each request on stderr: kept apart, its count printed
log=$(mktemp "${TMPDIR:-/tmp}/rollout-sim.XXXXXX")
trap 'rm -f "$log"' EXIT
rc=0
"$sim" "$nodes" "$limit" "$flip" --lease-s "$lease" --poll-ms "$poll" --kill "$kill" --outage-ms "$outage" --fault-every "$faults" 2>"$log" || rc=$?
grep -v '^fake-apiserver: ' "$log" >&2 || true
echo "fixture requests logged: $(grep -c '^fake-apiserver: ' "$log" || true) ($(grep '^fake-apiserver: ' "$log" | grep -c -- '-> 409' || true) conflicts)"
exit "$rc"
