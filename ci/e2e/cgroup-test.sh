#!/usr/bin/env bash
# cgroup_layout (ci/e2e/cgroup.sh) on fake machine roots: the layouts the
# e2e knows (GitHub's Ubuntu 24.04 runner, these hybrid CI machines) and
# the ones it refuses, each with what it names. Part of the test command
# (ci/test.sh); no root needed. Last, the layout of this machine is
# printed (not asserted: it is whatever the machine is).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=ci/e2e/cgroup.sh
. ci/e2e/cgroup.sh

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# fake NAME INIT CONTROLLERS MOUNTINFO: a root with PID 1's name,
# /sys/fs/cgroup/cgroup.controllers (none when CONTROLLERS is "-") and
# /proc/self/mountinfo.
fake() {
  local r=$work/$1
  mkdir -p "$r/proc/1" "$r/proc/self" "$r/sys/fs/cgroup"
  printf '%s\n' "$2" >"$r/proc/1/comm"
  [ "$3" = - ] || printf '%s\n' "$3" >"$r/sys/fs/cgroup/cgroup.controllers"
  printf '%s\n' "$4" >"$r/proc/self/mountinfo"
  echo "$r"
}

# expect NAME ROOT WANT [STDERR-PATTERN]: cgroup_layout ROOT prints WANT
# (or, with WANT "-", fails saying STDERR-PATTERN).
expect() {
  local name=$1 root=$2 want=$3 pattern=${4:-} got err rc=0
  got=$(cgroup_layout "$root" 2>"$work/err") || rc=$?
  err=$(cat "$work/err")
  if [ "$want" = - ]; then
    if [ "$rc" != 0 ] && [ -z "$got" ] && grep -q -- "$pattern" <<<"$err"; then
      passed=$((passed + 1)); echo "ok   $name: refused ($err)"
    else
      failed=$((failed + 1)); echo "FAIL $name: wanted a refusal naming '$pattern', got rc=$rc '$got' ($err)"
    fi
  elif [ "$rc" = 0 ] && [ "$got" = "$want" ]; then
    passed=$((passed + 1)); echo "ok   $name: $got"
  else
    failed=$((failed + 1)); echo "FAIL $name: wanted $want, got rc=$rc '$got' ($err)"
  fi
}

sys_mounts='24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw'
v2_mount='35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot'
all_controllers='cpuset cpu io memory hugetlb pids rdma misc'
# as on these machines: a tmpfs of v1 hierarchies, an empty v2 in unified/
hybrid_mounts="$sys_mounts
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"

expect "GitHub's Ubuntu 24.04 runner" \
  "$(fake runner systemd "$all_controllers" "$sys_mounts
$v2_mount")" unified
expect "these CI machines (hybrid, PID 1 not systemd)" \
  "$(fake hybrid process_api - "$hybrid_mounts")" hybrid
expect "a hybrid systemd host" \
  "$(fake hybrid-systemd systemd - "$hybrid_mounts")" hybrid
expect "cgroup2 without the memory controller" \
  "$(fake no-memory systemd 'cpuset cpu io pids' "$sys_mounts
$v2_mount")" - "without the memory controller"
expect "cgroup2 with no controllers file" \
  "$(fake no-controllers systemd - "$sys_mounts
$v2_mount")" - "controllers: none"
expect "cgroup2 with controllers, PID 1 not systemd (a container)" \
  "$(fake container sh "$all_controllers" "$sys_mounts
$v2_mount")" - "PID 1 is 'sh', not systemd"
expect "a tmpfs with no v1 hierarchy" \
  "$(fake empty-tmpfs systemd - "$sys_mounts
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755")" - "no cgroup v1 hierarchy"
expect "nothing on /sys/fs/cgroup" \
  "$(fake unmounted systemd - "$sys_mounts")" - "not mounted"
# a cgroup2 mounted over an earlier tmpfs: the last mount is the one seen
expect "the last mount wins" \
  "$(fake stacked systemd "$all_controllers" "$hybrid_mounts
$v2_mount")" unified

if layout=$(cgroup_layout / 2>&1); then
  echo "this machine: $layout"
else
  echo "this machine: refused ($layout)"
fi
echo "cgroup_layout: $passed passed, $failed failed"
[ "$failed" = 0 ]
