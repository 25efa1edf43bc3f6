#!/usr/bin/env bash
# Static checks of every shell script and of the GitHub workflows, part of
# the test command (ci/test.sh):
#   * shellcheck on every shell script in the repository (by extension or
#     shebang, as git lists them), following sourced files;
#   * the workflows in .github/workflows: schema, zizmor and shape
#     (ci/lint/workflows.sh says which).
# A missing tool fails with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { printf 'ci/lint/scripts.sh: %s\n' "$*" >&2; exit 1; }
command -v shellcheck >/dev/null || fail "shellcheck is not installed: apt-get install -y shellcheck (or ci/setup.sh, as root)"
command -v git >/dev/null || fail "git is not installed: apt-get install -y git (or ci/setup.sh, as root)"

scripts=()
while IFS= read -r -d '' f; do
  case $f in
    *.sh) scripts+=("$f") ;;
    *) if [ -f "$f" ] && head -n1 "$f" | grep -Eq '^#!.*/(env )?(ba|da)?sh( |$)'; then scripts+=("$f"); fi ;;
  esac
done < <(git ls-files -z)
[ -f .ci/run ] && scripts+=(.ci/run)
mapfile -t scripts < <(printf '%s\n' "${scripts[@]}" | sort -u)
# A few files per process, one process per core (shellcheck is single-threaded).
printf '%s\0' "${scripts[@]}" | xargs -0 -n 4 -P "$(nproc)" shellcheck -x ||
  fail "shellcheck found problems (above)"
echo "shellcheck: ${#scripts[@]} scripts clean"

ci/lint/workflows.sh
