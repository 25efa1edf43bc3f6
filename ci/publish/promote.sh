#!/usr/bin/env bash
# Promote a verified release: point IMAGE:latest (or KUBESLOT_PROMOTE_TAG)
# at the image build.sh pushed, so the next run's release notes compare with
# it. Pushes from the build's layout: every blob and attachment is already in
# the registry, so only the tag moves; the tag is read back and the
# signatures verified there again.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE       the recipe build.sh pushed (required)
#   KUBESLOT_PUBLIC_KEY   the PEM public key hosts trust (required)
#   KUBESLOT_PROMOTE_TAG  the moving tag (default: latest)
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe whose image to promote"
need_env KUBESLOT_PUBLIC_KEY "the PEM public key hosts trust"
kubeslot_image "$KUBESLOT_RECIPE"
[ -f "$WORK/pushed" ] || die "$WORK/pushed is missing: only a pushed and verified image is promoted"
moving=${KUBESLOT_PROMOTE_TAG:-latest}
valid_tag "$moving" || die "KUBESLOT_PROMOTE_TAG \"$moving\" is not a valid image tag"
key=$(trusted_key)
kb push "oci:$WORK/layout:$TAG" "$IMAGE:$moving" --verify-key "$key" >&2
log "$IMAGE:$moving is now $(cat "$WORK/digest")"
