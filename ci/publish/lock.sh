#!/usr/bin/env bash
# The lock job: every recipe with a package base (`[base] kind = "debian"`)
# must have a lock made from its current [base] section (`kubeslot-builder
# lock --check`). In refresh mode a missing or stale lock is made again (apt
# resolves the package set), the .deb changes against the old lock are
# printed (ci/publish/lock-diff.py) and, given a branch, the new locks are
# committed and pushed to it: on a pull request the reviewer sees exactly
# which .deb versions changed. Recipes without a package base have no lock
# and are named as such.
#
# Inputs (environment; plus env.sh's KUBESLOT_BUILDER):
#   KUBESLOT_RECIPES      recipe files, space-separated (required)
#   KUBESLOT_LOCK_MODE    check (default): fail when a lock is missing or
#                         stale; refresh: lock those again
#   KUBESLOT_LOCK_MIRROR  `--mirror` values for `lock`, space-separated
#                         (default: the recipes' own mirrors)
#   KUBESLOT_LOCK_BRANCH  refresh only: commit the refreshed locks and push
#                         them to this branch of `origin` (the pull request's
#                         branch); empty: leave them in the work tree
#   GITHUB_TOKEN          (secret) with KUBESLOT_LOCK_BRANCH: the token git
#                         pushes with, given to git through its environment
#                         (GIT_CONFIG_*), never written to .git/config
#   GITHUB_SERVER_URL     (set by Actions) the host that token is for
#   GITHUB_STEP_SUMMARY   (set by Actions) the .deb changes are appended to it
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPES "the recipe files to lock, space-separated"
mode=${KUBESLOT_LOCK_MODE:-check}
case $mode in check | refresh) ;; *) die "KUBESLOT_LOCK_MODE is \"$mode\": use check or refresh" ;; esac
branch=${KUBESLOT_LOCK_BRANCH:-}
[ -z "$branch" ] || [ "$mode" = refresh ] || die "KUBESLOT_LOCK_BRANCH is only used with KUBESLOT_LOCK_MODE=refresh"
need python3 python3
mirrors=()
for m in ${KUBESLOT_LOCK_MIRROR:-}; do mirrors+=(--mirror "$m"); done

read -ra recipes <<<"$KUBESLOT_RECIPES"
stale=() refreshed=()
summary=$PRIVATE/changes.md
: >"$summary"
for recipe in "${recipes[@]}"; do
  [ -f "$recipe" ] || die "recipe $recipe: no such file"
  base=$(kb --json check "$recipe" | jq -r .base)
  case $base in
    debian\ *) ;;
    *)
      log "$recipe: no package base ($base), nothing to lock"
      continue
      ;;
  esac
  lock=${recipe%.toml}.lock
  if kb lock --check "$recipe" >&2; then
    continue
  fi
  if [ "$mode" = check ]; then
    stale+=("$recipe")
    continue
  fi
  old=$PRIVATE/old.lock
  rm -f "$old"
  [ ! -f "$lock" ] || cp "$lock" "$old"
  log "$recipe: locking (apt resolves the package set)"
  kb lock "$recipe" "${mirrors[@]}" >&2
  python3 "$KUBESLOT_ROOT/ci/publish/lock-diff.py" "$old" "$lock" >>"$summary"
  refreshed+=("$lock")
done

if [ "${#stale[@]}" -gt 0 ]; then
  die "missing or stale lock for ${stale[*]}: run \`kubeslot-builder lock RECIPE\` (or KUBESLOT_LOCK_MODE=refresh) and commit the .lock"
fi
if [ "${#refreshed[@]}" -eq 0 ]; then
  log "every lock is up to date"
  exit 0
fi
cat "$summary"
step_summary "$summary"
if [ -z "$branch" ]; then
  log "refreshed ${refreshed[*]} (not committed: KUBESLOT_LOCK_BRANCH is empty)"
  exit 0
fi

git add -- "${refreshed[@]}"
{
  printf 'recipes: refresh package-base locks\n\n'
  cat "$summary"
} >"$PRIVATE/message"
GIT_AUTHOR_NAME=kubeslot-ci GIT_AUTHOR_EMAIL=kubeslot-ci@users.noreply.github.com \
  GIT_COMMITTER_NAME=kubeslot-ci GIT_COMMITTER_EMAIL=kubeslot-ci@users.noreply.github.com \
  git commit --quiet --file "$PRIVATE/message" -- "${refreshed[@]}"
if [ -n "${GITHUB_TOKEN:-}" ]; then
  basic=$(printf 'x-access-token:%s' "$GITHUB_TOKEN" | base64 -w0)
  export GIT_CONFIG_COUNT=1
  export GIT_CONFIG_KEY_0="http.${GITHUB_SERVER_URL:-https://github.com}/.extraheader"
  export GIT_CONFIG_VALUE_0="AUTHORIZATION: basic $basic"
fi
git push --quiet origin "HEAD:refs/heads/$branch"
log "committed ${refreshed[*]} to $branch"
