#!/usr/bin/env bash
# The GitHub workflows' static checks (part of ci/lint/scripts.sh, so of the
# test command; builder/tests/workflow.rs runs it on the real workflows and
# on broken copies):
#   * check-jsonschema with the GitHub workflow schema;
#   * zizmor --offline (GitHub Actions security audit): zero findings, or an
#     inline `# zizmor: ignore[audit]` with its reason;
#   * their shape: nothing granted by default (`permissions: {}` at the
#     top; each job asks for what it uses), every `run:` calls one
#     executable script under ci/ and nothing else (inputs go through
#     `env:`, so no expression is ever expanded into a shell), every
#     `uses:` is pinned to a full commit SHA with its version in a comment.
#
#   ci/lint/workflows.sh [WORKFLOW.yml...]   (default: .github/workflows/*.yml)
#
# A missing tool fails with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { printf 'ci/lint/workflows.sh: %s\n' "$*" >&2; exit 1; }
hint="ci/setup.sh installs it (as root)"
command -v check-jsonschema >/dev/null || fail "check-jsonschema is not installed: $hint"
command -v zizmor >/dev/null || fail "zizmor is not installed: $hint"

workflows=("$@")
if [ ${#workflows[@]} = 0 ]; then
  shopt -s nullglob
  workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
  shopt -u nullglob
  [ ${#workflows[@]} -gt 0 ] || fail "no workflow in .github/workflows"
fi

check-jsonschema --color never --builtin-schema vendor.github-workflows "${workflows[@]}"
# plain text whatever the terminal or CI says (FORCE_COLOR, CLICOLOR_FORCE): errors are read by people and tests
zizmor --offline --quiet --color never "${workflows[@]}"

bad=0
for workflow in "${workflows[@]}"; do
  if ! grep -qx 'permissions: {}' "$workflow"; then
    printf '%s: no top-level "permissions: {}" (nothing by default; each job asks for what it uses)\n' "$workflow" >&2
    bad=1
  fi
  while IFS= read -r line; do
    n=${line%%:*} text=${line#*:}
    if [[ $text =~ ^[[:space:]]*(-[[:space:]]+)?run:[[:space:]]*(.*)$ ]]; then
      cmd=${BASH_REMATCH[2]}
      if [[ ! $cmd =~ ^ci/[a-z0-9/-]+\.sh$ ]]; then
        printf '%s:%s: run: must call one script under ci/ (inputs through env:), found: %s\n' "$workflow" "$n" "$cmd" >&2
        bad=1
      elif [ ! -x "$cmd" ]; then
        printf '%s:%s: %s is not an executable script\n' "$workflow" "$n" "$cmd" >&2
        bad=1
      fi
    elif [[ $text =~ ^[[:space:]]*(-[[:space:]]+)?uses:[[:space:]]*(.*)$ ]]; then
      # (a failed match empties BASH_REMATCH: keep what was found)
      used=${BASH_REMATCH[2]}
      if [[ ! $used =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}\ \#\ v[0-9]+(\.[0-9]+)*$ ]]; then
        printf '%s:%s: uses: must be pinned to a full commit SHA with "# vX.Y.Z" after it, found: %s\n' "$workflow" "$n" "$used" >&2
        bad=1
      fi
    fi
  done < <(grep -n . "$workflow")
done
[ "$bad" = 0 ] || exit 1
echo "workflows: ${workflows[*]}: schema, zizmor and shape clean"
