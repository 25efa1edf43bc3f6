#!/usr/bin/env bash
# The lock job: every recipe with a package base (`[base] kind = "debian"`)
# must have a lock made from its current [base] section (`kubeslot-builder
# lock --check`). In refresh mode a missing or stale lock is made again (apt
# resolves the package set), the .deb changes against the old lock are
# printed (ci/publish/lock-diff.py) and, given a branch, the new locks are
# committed and pushed to it: on a pull request the reviewer sees exactly
# which .deb versions changed. Given a pull request branch instead (the lock
# workflow, .github/workflows/lock.yml, weekly and on demand), the commit
# goes to that branch, made afresh from the base each time, and a pull
# request from it is opened (or its description updated) with `gh`, the
# .deb changes as its description. Recipes without a package base have no
# lock and are named as such; a missing or stale lock in check mode names
# the lock workflow.
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
#   KUBESLOT_LOCK_PULL_REQUEST  refresh only, instead of KUBESLOT_LOCK_BRANCH:
#                         commit the refreshed locks on this branch (made
#                         from HEAD, force-pushed: it belongs to this job)
#                         and open a pull request from it into
#                         KUBESLOT_LOCK_BASE, or update the open one's
#                         description
#   KUBESLOT_LOCK_BASE    the pull request's base branch (default:
#                         $GITHUB_REF_NAME, else the checked-out branch)
#   GITHUB_TOKEN          (secret) with KUBESLOT_LOCK_BRANCH or
#                         KUBESLOT_LOCK_PULL_REQUEST: the token git pushes
#                         and gh opens the pull request with, given to git
#                         through its environment (GIT_CONFIG_*), never
#                         written to .git/config
#   GITHUB_REPOSITORY     (set by Actions) the repository gh acts on
#   GITHUB_SERVER_URL     (set by Actions) the host that token is for
#   GITHUB_STEP_SUMMARY   (set by Actions) the .deb changes are appended to it
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPES "the recipe files to lock, space-separated"
mode=${KUBESLOT_LOCK_MODE:-check}
case $mode in check | refresh) ;; *) die "KUBESLOT_LOCK_MODE is \"$mode\": use check or refresh" ;; esac
branch=${KUBESLOT_LOCK_BRANCH:-}
pr_branch=${KUBESLOT_LOCK_PULL_REQUEST:-}
[ -z "$branch" ] || [ "$mode" = refresh ] || die "KUBESLOT_LOCK_BRANCH is only used with KUBESLOT_LOCK_MODE=refresh"
[ -z "$pr_branch" ] || [ "$mode" = refresh ] || die "KUBESLOT_LOCK_PULL_REQUEST is only used with KUBESLOT_LOCK_MODE=refresh"
[ -z "$branch" ] || [ -z "$pr_branch" ] || die "KUBESLOT_LOCK_BRANCH and KUBESLOT_LOCK_PULL_REQUEST are both set: one or the other"
need python3 python3
if [ -n "$pr_branch" ]; then
  need gh gh
  need git git
  base_branch=${KUBESLOT_LOCK_BASE:-${GITHUB_REF_NAME:-$(git symbolic-ref --quiet --short HEAD || true)}}
  [ -n "$base_branch" ] || die "KUBESLOT_LOCK_BASE is not set and HEAD is no branch: the branch the pull request goes into"
  [ "$base_branch" != "$pr_branch" ] || die "KUBESLOT_LOCK_PULL_REQUEST is the base branch $base_branch itself"
fi
mirrors=()
for m in ${KUBESLOT_LOCK_MIRROR:-}; do mirrors+=(--mirror "$m"); done

read -ra recipes <<<"$KUBESLOT_RECIPES"
missing=() stale=() refreshed=()
summary=$PRIVATE/changes.md
: >"$summary"
for recipe in "${recipes[@]}"; do
  [ -f "$recipe" ] || die "recipe $recipe: no such file"
  base=$(recipe_base "$recipe")
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
    if [ -f "$lock" ]; then stale+=("$recipe"); else missing+=("$recipe"); fi
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

if [ "${#missing[@]}" -gt 0 ] || [ "${#stale[@]}" -gt 0 ]; then
  [ "${#missing[@]}" -eq 0 ] || log "no lock committed for ${missing[*]}"
  [ "${#stale[@]}" -eq 0 ] || log "stale lock (made from another [base] section) for ${stale[*]}"
  die "missing or stale lock for ${missing[*]}${missing[*]:+${stale[*]:+ }}${stale[*]}: $LOCK_WORKFLOW_HINT (or run \`kubeslot-builder lock RECIPE\` where the package archive is reachable, and commit the .lock)"
fi
if [ "${#refreshed[@]}" -eq 0 ]; then
  log "every lock is up to date"
  exit 0
fi
cat "$summary"
step_summary "$summary"
if [ -z "$branch" ] && [ -z "$pr_branch" ]; then
  log "refreshed ${refreshed[*]} (not committed: KUBESLOT_LOCK_BRANCH and KUBESLOT_LOCK_PULL_REQUEST are empty)"
  exit 0
fi

if [ -n "$pr_branch" ]; then
  # from the base as checked out, whatever an earlier run left on the branch
  git checkout --quiet -B "$pr_branch"
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
if [ -n "$branch" ]; then
  git push --quiet origin "HEAD:refs/heads/$branch"
  log "committed ${refreshed[*]} to $branch"
  exit 0
fi

# A week with no new package versions gives the same locks: the branch is
# left as it is then (no new commit on the open pull request).
if git fetch --quiet origin "refs/heads/$pr_branch" 2>/dev/null &&
  git diff --quiet FETCH_HEAD HEAD -- "${refreshed[@]}"; then
  log "$pr_branch already has these locks: not pushed again"
else
  git push --quiet --force origin "HEAD:refs/heads/$pr_branch"
  log "committed ${refreshed[*]} to $pr_branch"
fi
{
  printf 'The package-base locks, made again by the lock workflow (%s):\n' "$LOCK_WORKFLOW"
  printf 'the .deb changes per recipe and platform are below. Merging this\n'
  printf 'publishes with them (the publishing workflow builds from the committed locks).\n\n'
  cat "$summary"
  printf '\nOpened by a workflow with GITHUB_TOKEN: GitHub starts no workflow for\n'
  printf 'it; close and reopen it (or push to it) to run the checks.\n'
} >"$PRIVATE/body.md"
title="recipes: refresh package-base locks"
# gh reads the token from GH_TOKEN; the repository from GH_REPO.
export GH_TOKEN=${GITHUB_TOKEN:-${GH_TOKEN:-}}
[ -z "${GITHUB_REPOSITORY:-}" ] || export GH_REPO=$GITHUB_REPOSITORY
open_pr=$(gh pr list --head "$pr_branch" --base "$base_branch" --state open --json number --jq '.[0].number // empty')
if [ -n "$open_pr" ]; then
  gh pr edit "$open_pr" --title "$title" --body-file "$PRIVATE/body.md" >&2
  log "updated pull request #$open_pr ($pr_branch into $base_branch)"
else
  gh pr create --base "$base_branch" --head "$pr_branch" --title "$title" --body-file "$PRIVATE/body.md" >&2
  log "opened a pull request: $pr_branch into $base_branch"
fi
