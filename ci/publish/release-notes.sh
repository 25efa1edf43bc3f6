#!/usr/bin/env bash
# Release notes: what changed since the image published before, from
# `kubeslot-builder diff` (layers with sizes, component versions from the
# dev.kubeslot.version.* annotations, and package changes from the SBOMs:
# for a package base, the .deb diff between the two locks the images were
# built from). Written as Markdown to WORK/release-notes.md (and the job's
# summary page), with `diff --json` beside it as WORK/diff.json.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE     the recipe build.sh built (required)
#   KUBESLOT_PREVIOUS   the image to compare with (default: IMAGE:latest,
#                       which promote.sh moves after each release); any
#                       `kubeslot-builder diff` operand. A registry image that
#                       does not exist yet makes this the first release.
# Reads WORK/digest and WORK/pushed (the new image is IMAGE@digest once
# pushed, else the build's layout).
# shellcheck disable=SC2016 # backquotes in printf formats are Markdown code spans
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe whose release to describe"
kubeslot_image "$KUBESLOT_RECIPE"
digest=$(cat "$WORK/digest")
previous=${KUBESLOT_PREVIOUS:-$IMAGE:latest}
if [ -f "$WORK/pushed" ]; then
  new=$IMAGE@$digest
else
  new=oci:$WORK/layout:$TAG
fi
notes=$WORK/release-notes.md

first=0
case $previous in
  oci:* | oci-archive:*) ;;
  *)
    skopeo_auth
    if ! skopeo inspect "${SKOPEO_ARGS[@]}" --raw "docker://$previous" >/dev/null 2>"$PRIVATE/previous.err"; then
      # Only "there is no such image" means a first release; anything else
      # (refused credentials, a dead registry) is an error.
      if grep -Eqi 'manifest unknown|name unknown|not found' "$PRIVATE/previous.err"; then
        first=1
      else
        cat "$PRIVATE/previous.err" >&2
        die "cannot read the previous image $previous"
      fi
    fi
    ;;
esac

{
  printf '## %s %s\n\n' "$STEM" "$TAG"
  printf '`%s` (signed as `%s`)\n\n' "$IMAGE@$digest" "$IDENTITY"
} >"$notes"
if [ "$first" = 1 ]; then
  log "$previous does not exist: first release"
  {
    printf 'First release (nothing was published as `%s`). Components:\n\n' "$previous"
    kb --json check "$KUBESLOT_RECIPE" | jq -r '.components | to_entries[] | "* \(.key) \(.value)"'
  } >>"$notes"
  printf '{"first_release": true}\n' >"$WORK/diff.json"
else
  log "diff $previous $new"
  kb --json diff "$previous" "$new" >"$WORK/diff.json"
  {
    printf 'Changes since `%s`:\n\n```text\n' "$previous"
    kb diff "$previous" "$new"
    printf '```\n'
  } >>"$notes"
fi
step_summary "$notes"
cat "$notes"
