#!/usr/bin/env bash
# Static checks of the publishing workflow and of every shell script, part
# of the test command (ci/test.sh):
#   * shellcheck on every shell script in the repository (by extension or
#     shebang, as git lists them), following sourced files;
#   * check-jsonschema with the GitHub workflow schema, and zizmor --offline
#     (GitHub Actions security audit), on ci/github/publish.yml: zero
#     findings, or an inline `# zizmor: ignore[audit]` with its reason;
#   * the workflow's shape: every `run:` calls one executable ci/publish
#     script and nothing else (inputs go through `env:`), every `uses:` is
#     pinned to a full commit SHA with its version in a comment.
# A missing tool fails with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
workflow=ci/github/publish.yml
fail() { printf 'ci/lint/scripts.sh: %s\n' "$*" >&2; exit 1; }
venv_hint="python3 -m venv /opt/kubeslot-ci/lint && /opt/kubeslot-ci/lint/bin/pip install 'check-jsonschema==0.39.0' 'zizmor==1.32.0' (.ci/run does this)"
command -v shellcheck >/dev/null || fail "shellcheck is not installed: apt-get install -y shellcheck"
command -v check-jsonschema >/dev/null || fail "check-jsonschema is not installed: $venv_hint"
command -v zizmor >/dev/null || fail "zizmor is not installed: $venv_hint"
command -v git >/dev/null || fail "git is not installed: apt-get install -y git"

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

check-jsonschema --builtin-schema vendor.github-workflows "$workflow"
zizmor --offline --quiet "$workflow"

# The workflow's shape.
bad=0
while IFS= read -r line; do
  n=${line%%:*} text=${line#*:}
  if [[ $text =~ ^[[:space:]]*(-[[:space:]]+)?run:[[:space:]]*(.*)$ ]]; then
    cmd=${BASH_REMATCH[2]}
    if [[ ! $cmd =~ ^ci/publish/[a-z0-9-]+\.sh$ ]]; then
      printf '%s:%s: run: must call one ci/publish script (inputs through env:), found: %s\n' "$workflow" "$n" "$cmd" >&2
      bad=1
    elif [ ! -x "$cmd" ]; then
      printf '%s:%s: %s is not an executable script\n' "$workflow" "$n" "$cmd" >&2
      bad=1
    fi
  elif [[ $text =~ ^[[:space:]]*(-[[:space:]]+)?uses:[[:space:]]*(.*)$ ]]; then
    if [[ ! ${BASH_REMATCH[2]} =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}\ \#\ v[0-9]+(\.[0-9]+)*$ ]]; then
      printf '%s:%s: uses: must be pinned to a full commit SHA with "# vX.Y.Z" after it, found: %s\n' "$workflow" "$n" "${BASH_REMATCH[2]}" >&2
      bad=1
    fi
  fi
done < <(grep -n . "$workflow")
[ "$bad" = 0 ] || exit 1
echo "$workflow: schema, zizmor and shape clean"
