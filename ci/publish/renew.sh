#!/usr/bin/env bash
# Re-issue the release statement of a published image (the publishing
# workflow's `schedule:` run), so a current release never lapses: a host
# following a tag (source.follow) takes an update only under an unexpired
# statement, and a frozen mirror keeps serving only statements that expire.
# `kubeslot-builder statement issue` keeps the schedule (the waves) of the
# statement it replaces, then `statement verify` reads it back with the
# public key hosts trust.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE           the recipe whose published image to renew (required)
#   KUBESLOT_SIGNING_KEY      (secret) the PKCS#8 PEM private key the image is
#                             signed with; without it (keyless signing) there
#                             is no statement to renew: said, exit 0
#   KUBESLOT_PUBLIC_KEY       the PEM public key hosts trust (required with the key)
#   KUBESLOT_RENEW_TAG        the tag whose image to renew (default: latest)
#   KUBESLOT_STATEMENT_HOURS  validity of the new statement (default 168)
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe whose published image to renew"
kubeslot_image "$KUBESLOT_RECIPE"
moving=${KUBESLOT_RENEW_TAG:-latest}
valid_tag "$moving" || die "KUBESLOT_RENEW_TAG \"$moving\" is not a valid image tag"
if [ -z "${KUBESLOT_SIGNING_KEY:-}" ]; then
  log "KUBESLOT_SIGNING_KEY is not set: keyless releases carry no release statement (keyless statements are not supported yet); nothing to renew for $IMAGE:$moving"
  exit 0
fi
need_env KUBESLOT_PUBLIC_KEY "the PEM public key hosts trust"
signing_key=$(private_copy signing.key "$KUBESLOT_SIGNING_KEY")
unset KUBESLOT_SIGNING_KEY
log "renew the release statement of $IMAGE:$moving (valid ${KUBESLOT_STATEMENT_HOURS:-168} h)"
kb statement issue --key "$signing_key" --identity "$IDENTITY" \
  --valid-hours "${KUBESLOT_STATEMENT_HOURS:-168}" "$IMAGE:$moving" >&2
rm -f "$signing_key"
key=$(trusted_key)
kb statement verify --public-key "$key" --identity "$IDENTITY" "$IMAGE:$moving"
