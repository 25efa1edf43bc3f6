# shellcheck shell=bash
# The cgroup layout the e2e runs on, decided once from the machine itself
# (sourced by ci/e2e/run.sh; ci/e2e/cgroup-test.sh runs cgroup_layout on
# fake roots). Two layouts are known:
#
#   unified  systemd is PID 1 and /sys/fs/cgroup is cgroup2 with the
#            controllers runc needs (cpu, cpuset, memory, pids: the
#            activator's own cgroup-v2 preflight check): production hosts
#            and GitHub's Ubuntu 24.04 runner (.github/workflows/ci.yml).
#            The outer hosts boot in a systemd scope with Delegate=yes (a
#            child of our own cgroup could get no controllers: cgroup2 gives
#            them only to cgroups without processes of their own), node
#            machines run on the rendered cgroup2 layout (no test drop-in),
#            and the activator's cgroup-v2 check is not ignored.
#   hybrid   v1 controllers on a tmpfs at /sys/fs/cgroup and a cgroup2
#            without controllers beside them: these development and CI
#            machines (E2E.md). The outer hosts boot in private child
#            cgroups of ours, one per hierarchy, and the scenarios that run
#            containers give node machines nspawn's own layout
#            (hybrid_cgroup_dropin, pods.sh), since runc needs controllers.
#
# Anything else is refused, saying what was seen.

# cgroup_layout [ROOT]: prints `unified` or `hybrid` for the machine whose
# / is ROOT (default: this one), from ROOT/proc/1/comm,
# ROOT/proc/self/mountinfo and ROOT/sys/fs/cgroup/cgroup.controllers; fails
# with the reason on stderr for any other layout.
cgroup_layout() {
  local root=${1:-} init fstype controllers c v1
  init=$(cat "$root/proc/1/comm" 2>/dev/null || true)
  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - FSTYPE
  # SOURCE SUPER; the last mount on /sys/fs/cgroup is the one seen
  fstype=$(awk '$5 == "/sys/fs/cgroup" { for (i = 7; i < NF; i++) if ($i == "-") { t = $(i + 1); break } } END { print t }' \
    "$root/proc/self/mountinfo" 2>/dev/null || true)
  case $fstype in
    cgroup2)
      controllers=$(cat "$root/sys/fs/cgroup/cgroup.controllers" 2>/dev/null || true)
      for c in cpu cpuset memory pids; do
        if [[ " $controllers " != *" $c "* ]]; then
          echo "cgroup_layout: /sys/fs/cgroup is cgroup2 without the $c controller (controllers: ${controllers:-none}): runc could run no pod" >&2
          return 1
        fi
      done
      if [ "$init" != systemd ]; then
        echo "cgroup_layout: /sys/fs/cgroup is cgroup2 with controllers but PID 1 is '${init:-unknown}', not systemd: the outer hosts need systemd-run for a delegated scope" >&2
        return 1
      fi
      echo unified
      ;;
    tmpfs)
      v1=$(awk '$5 ~ "^/sys/fs/cgroup/" { for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup") n++; break } } END { print n + 0 }' \
        "$root/proc/self/mountinfo")
      if [ "$v1" = 0 ]; then
        echo "cgroup_layout: /sys/fs/cgroup is a tmpfs with no cgroup v1 hierarchy below it" >&2
        return 1
      fi
      echo hybrid
      ;;
    *)
      echo "cgroup_layout: /sys/fs/cgroup is ${fstype:-not mounted} (neither cgroup2 nor a tmpfs of v1 hierarchies)" >&2
      return 1
      ;;
  esac
}
