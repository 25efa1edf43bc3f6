#!/usr/bin/env bash
# Every benchmark under ci/bench/ once at its smoke size, so that none can
# rot unnoticed (ci/test.sh runs this after the tests). A bench that exits
# non-zero fails the smoke run (its output is shown); timings are printed,
# never asserted. Smoke sizes:
#   activator-size.sh  the binaries in KUBESLOT_BIN_DIR (no release build)
#   build.sh           --rootfs SMALL
#   debian-base.sh     --packages base-files (the minbase alone)
#   fetch.sh           --rootfs SMALL
#   fleet.sh           --hosts 5 --image-mb 1 (every topology)
#   rollout.sh         --nodes 40 --limit 4 --flip-ms 200 (2 holders killed, 1 s outage, every 20th request 429/5xx)
#   unpack.sh          --rootfs SMALL
#   update.sh          --rootfs SMALL 1 (a 1 MB Kubernetes layer)
# SMALL is a ~14 MB slice of the tests' Debian rootfs (ci/lib/debian-rootfs.sh
# systemd,dbus,iproute2, cached by the unpack tests): /dev, /etc, /usr/sbin,
# /usr/share/zoneinfo, /var/lib/dpkg (files, symlinks, device nodes).
#
#   ci/bench/smoke.sh [-v] [NAME...]     (default: every bench; -v shows
#                                         every bench's output, not only a
#                                         failed one's)
#
# KUBESLOT_BIN_DIR=DIR: the binaries (and DIR/examples) the benches use;
# ci/test.sh passes target/debug, which its tests just built. Without it,
# `cargo test --workspace --locked --no-run` makes sure target/debug is
# current (the benches' own release builds are what their full runs use,
# minutes each on 2 cores). fleet.sh and update.sh run under the shared
# lock /tmp/kubeslot-e2e.lock, unless a process this one descends from
# holds it already (`flock /tmp/kubeslot-e2e.lock ci/test.sh`); the wait
# for it is printed apart from the bench's time. As root,
# the work files (TMPDIR of every bench) go to a private tmpfs: on a busy
# disk, debian-base.sh's four mmdebstrap runs took 7.7 minutes, on a tmpfs
# 2.3 (the same load). debian-base.sh (a minute
# or more, mostly on one core) runs in the background beside the others,
# which take their turns; its line comes last.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

all=(activator-size build debian-base fetch fleet rollout unpack update)
# Every bench has a smoke size: a script added under ci/bench/ without one
# fails here.
for f in ci/bench/*.sh; do
  name=$(basename "$f" .sh)
  [ "$name" = smoke ] && continue
  [[ " ${all[*]} " == *" $name "* ]] || {
    echo "smoke.sh: $f has no smoke size: add it to ci/bench/smoke.sh" >&2
    exit 1
  }
done
verbose=0
if [ "${1:-}" = -v ]; then verbose=1; shift; fi
selected=("${@:-${all[@]}}")
for name in "${selected[@]}"; do
  [[ " ${all[*]} " == *" $name "* ]] || { echo "smoke.sh: no bench $name (${all[*]})" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "smoke.sh: /usr/bin/time is missing: apt-get install -y time" >&2; exit 1; }
command -v flock >/dev/null || { echo "smoke.sh: flock is missing: apt-get install -y util-linux" >&2; exit 1; }

if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$(cd "$KUBESLOT_BIN_DIR" && pwd)
else
  cargo test --workspace --locked --no-run --quiet 2>/dev/null ||
    cargo test --workspace --locked --no-run
  bin=$repo/target/debug
fi
export KUBESLOT_BIN_DIR=$bin

work=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-bench-smoke.XXXXXX")
mounted='' bg=''
cleanup() {
  local rc=$?
  # (the background bench: its processes get ^C with this script's)
  [ -z "$bg" ] || kill "$bg" 2>/dev/null || true
  # (lazily when a bench killed with this script still uses it)
  [ -z "$mounted" ] || umount "$mounted" 2>/dev/null || umount -l "$mounted" || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=3g,mode=0755 kubeslot-bench-smoke "$work" 2>/dev/null; then
  mounted=$work
fi
mkdir "$work/tmp" "$work/logs"

# The small rootfs: a slice of the tests' rootfs, hard links kept only with
# their targets.
big=$(ci/lib/debian-rootfs.sh systemd,dbus,iproute2)
small=$work/small-rootfs.tar
python3 - "$big" "$small" <<'PY'
import sys, tarfile
keep = ("./dev", "./etc", "./usr/sbin", "./usr/share/zoneinfo", "./var/lib/dpkg")
def wanted(name):
    n = name.rstrip("/")
    return n == "." or any(n == k or n.startswith(k + "/") or k.startswith(n + "/") for k in keep)
kept = set()
with tarfile.open(sys.argv[1]) as src, tarfile.open(sys.argv[2], "w", format=tarfile.PAX_FORMAT) as dst:
    for m in src:
        if not wanted(m.name) or (m.islnk() and m.linkname not in kept):
            continue
        kept.add(m.name)
        dst.addfile(m, src.extractfile(m) if m.isreg() else None)
PY

# lock_held_by_ancestor: whether a process this shell descends from holds
# the flock on /tmp/kubeslot-e2e.lock (flock LOCK CMD: the flock process).
lock=/tmp/kubeslot-e2e.lock
lock_held_by_ancestor() {
  [ -e "$lock" ] || return 1
  local ino holders p
  ino=$(stat -c %i "$lock")
  # /proc/locks: "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"
  # (waiters are "1: -> FLOCK ...": not holders)
  holders=" $(awk -v ino="$ino" '$2 == "FLOCK" { n = split($6, f, ":"); if (f[n] == ino) print $5 }' /proc/locks | tr '\n' ' ') "
  p=$$
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    [[ $holders == *" $p "* ]] && return 0
    p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
  done
  return 1
}
take_lock=1
if lock_held_by_ancestor; then take_lock=0; fi

# bench NAME: runs one bench at its smoke size; writes its report (its
# line, and its output when it failed or with -v) to logs/NAME.report, its
# exit status to logs/NAME.rc and the seconds it waited for the lock to
# logs/NAME.waited.
bench() {
  local name=$1 needs_lock=0 cmd log=$work/logs/$1.log waited='' w s e usr sys rc=0 status=ok
  case $name in
    activator-size) cmd=(ci/bench/activator-size.sh) ;;
    build) cmd=(ci/bench/build.sh --rootfs "$small") ;;
    debian-base) cmd=(ci/bench/debian-base.sh --packages base-files) ;;
    fetch) cmd=(ci/bench/fetch.sh --rootfs "$small") ;;
    fleet) needs_lock=1 cmd=(ci/bench/fleet.sh --hosts 5 --image-mb 1) ;;
    rollout) cmd=(ci/bench/rollout.sh --nodes 40 --limit 4 --flip-ms 200 --lease-s 2 --poll-ms 100 --kill 2 --outage-ms 1000 --fault-every 20) ;;
    unpack) cmd=(env BENCH_DIR="$work/unpack" ci/bench/unpack.sh --rootfs "$small") ;;
    update) needs_lock=1 cmd=(ci/bench/update.sh --rootfs "$small" 1) ;;
  esac
  if [ "$needs_lock" = 1 ] && [ "$take_lock" = 1 ]; then
    # The wait is counted apart: on a shared machine it is others' e2e time.
    w=$(date +%s.%N)
    exec 9>>"$lock"
    flock 9
    waited=$(awk -v w="$w" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - w }')
  fi
  s=$(date +%s.%N)
  # (fd 9, the lock, is not handed to the bench's processes)
  TMPDIR=$work/tmp /usr/bin/time -f '%U %S' -o "$work/logs/$name.cpu" "${cmd[@]}" >"$log" 2>&1 9>&- || rc=$?
  e=$(date +%s.%N)
  if [ -n "$waited" ]; then flock -u 9; exec 9>&-; fi
  [ "$rc" = 0 ] || status="FAILED (exit $rc)"
  # (after a failure, time's file starts with "Command exited with ...")
  read -r usr sys < <(tail -n1 "$work/logs/$name.cpu") || { usr=0; sys=0; }
  {
    if [ "$rc" != 0 ] || [ "$verbose" = 1 ]; then
      echo "--- ci/bench/$name.sh (${cmd[*]}) output:"
      cat "$log"
      echo "---"
    fi
    awk -v n="$name" -v st="$status" -v s="$s" -v e="$e" -v u="$usr" -v y="$sys" -v w="$waited" \
      'BEGIN { printf "bench smoke: %-15s %s, %.1f s (cpu %.1f s%s)\n", n, st, e - s, u + y,
               w == "" ? "" : ", after " w " s waiting for the e2e lock" }'
  } >"$work/logs/$name.report"
  echo "${waited:-0}" >"$work/logs/$name.waited"
  echo "$rc" >"$work/logs/$name.rc"
}

t_start=$(date +%s.%N)
# debian-base (mmdebstrap, mostly one core, a minute or more) runs beside
# the others, which take their turns.
bg=''
if [[ " ${selected[*]} " == *" debian-base "* ]]; then
  bench debian-base &
  bg=$!
fi
for name in "${selected[@]}"; do
  [ "$name" = debian-base ] && continue
  bench "$name"
  cat "$work/logs/$name.report"
done
if [ -n "$bg" ]; then
  wait "$bg" || true
  bg=''
  cat "$work/logs/debian-base.report" 2>/dev/null || echo "bench smoke: debian-base     FAILED (no report)"
fi
failed=()
for name in "${selected[@]}"; do
  [ "$(cat "$work/logs/$name.rc" 2>/dev/null)" = 0 ] || failed+=("$name")
done
lock_wait=$(cat "$work"/logs/*.waited | awk '{ s += $1 } END { print s + 0 }')
awk -v s="$t_start" -v e="$(date +%s.%N)" -v n="${#selected[@]}" -v w="$lock_wait" \
  'BEGIN { printf "bench smoke: %d benches in %.1f s (%.1f s of it waiting for the e2e lock)\n", n, e - s, w }'
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench smoke: failed: ${failed[*]}" >&2
  exit 1
fi
