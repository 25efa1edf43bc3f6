#!/usr/bin/env bash
# Verify what build.sh pushed, the way others will read it, after the push:
#
#   1. skopeo (an independent client): REF resolves to the digest the build
#      printed, every platform manifest of the index is served for its
#      platform, and each manifest has its `sha256-<hex>.sig` tag;
#   2. kubeslot-builder: a full pull of IMAGE@digest into WORK/pulled (every
#      blob digest-checked) with every signature verified against the public
#      key hosts trust;
#   3. every signature payload names IDENTITY (env.sh) and the digest it signs.
#
# Keyless images (WORK/keyless, build.sh): `cosign verify` of the index and
# every platform manifest with the identity and issuer hosts name, then the
# full pull of 2.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE       the recipe build.sh pushed (required)
#   KUBESLOT_PUBLIC_KEY   the PEM public key hosts trust (required unless keyless)
# Reads WORK/digest and WORK/pushed (build.sh); writes WORK/pulled.
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe whose image to verify"
kubeslot_image "$KUBESLOT_RECIPE"
[ -f "$WORK/pushed" ] || die "$WORK/pushed is missing: build.sh did not push $REF (KUBESLOT_PUSH=1)"
digest=$(cat "$WORK/digest")

# Keyless (build.sh signed with cosign): cosign verifies each digest
# against the identity and issuer a host's trust.keyless names, and the
# image (with its referrers) is pulled through kubeslot-builder.
if [ -f "$WORK/keyless" ]; then
  identity=$(cat "$WORK/keyless")
  docker_config
  index_blob=$WORK/layout/blobs/sha256/${digest#sha256:}
  for d in "$digest" $(jq -r '.manifests[].digest' "$index_blob"); do
    cosign verify --certificate-identity "$identity" --certificate-oidc-issuer "$KEYLESS_ISSUER" \
      "$IMAGE@$d" >/dev/null || die "cosign does not verify $IMAGE@$d as $identity"
  done
  rm -rf "$WORK/pulled"
  kb copy "$IMAGE@$digest" "oci:$WORK/pulled:$TAG" >&2
  log "verified: $IMAGE@$digest, keyless signatures by $identity"
  exit 0
fi

need_env KUBESLOT_PUBLIC_KEY "the PEM public key hosts trust"
key=$(trusted_key)
skopeo_auth

# 1. skopeo
skopeo inspect "${SKOPEO_ARGS[@]}" --raw "docker://$REF" >"$PRIVATE/index.json" ||
  die "skopeo cannot read $REF"
served=sha256:$(sha256sum <"$PRIVATE/index.json" | cut -d' ' -f1)
[ "$served" = "$digest" ] || die "$REF is $served, the build made $digest"
manifests=0
while read -r os arch manifest; do
  skopeo inspect "${SKOPEO_ARGS[@]}" --raw "docker://$IMAGE@$manifest" >"$PRIVATE/manifest.json" ||
    die "skopeo cannot read the $os/$arch manifest $IMAGE@$manifest"
  got=sha256:$(sha256sum <"$PRIVATE/manifest.json" | cut -d' ' -f1)
  [ "$got" = "$manifest" ] || die "$IMAGE@$manifest is served as content that hashes to $got"
  # What skopeo picks from the index for this platform: that manifest's layers.
  skopeo inspect "${SKOPEO_ARGS[@]}" --override-os "$os" --override-arch "$arch" \
    "docker://$IMAGE@$digest" >"$PRIVATE/inspect.json" ||
    die "skopeo cannot read the $os/$arch image of $IMAGE@$digest"
  jq -e --arg arch "$arch" --slurpfile m "$PRIVATE/manifest.json" \
    '.Architecture == $arch and .Layers == [$m[0].layers[].digest]' "$PRIVATE/inspect.json" >/dev/null ||
    die "skopeo's $os/$arch image of $IMAGE@$digest is not the manifest $manifest"
  skopeo inspect "${SKOPEO_ARGS[@]}" --raw "docker://$IMAGE:sha256-${manifest#sha256:}.sig" >/dev/null ||
    die "$IMAGE has no signature tag for the $os/$arch manifest $manifest"
  manifests=$((manifests + 1))
done < <(jq -r '.manifests[] | "\(.platform.os) \(.platform.architecture) \(.digest)"' "$PRIVATE/index.json")
[ "$manifests" -gt 0 ] || die "$REF is not an index of platform manifests"
log "skopeo: $REF is $digest, $manifests platform manifests, each signed"

# 2. kubeslot-builder: pull everything, verify every signature
rm -rf "$WORK/pulled"
kb copy "$IMAGE@$digest" "oci:$WORK/pulled:$TAG" --verify-key "$key" >&2

# 3. the identity and digest inside every signature payload
layout=$WORK/pulled
blob() { printf '%s/blobs/sha256/%s' "$layout" "${1#sha256:}"; }
signed=0
while read -r tag sig; do
  signs=sha256:${tag#sha256-}
  signs=${signs%.sig}
  while read -r payload; do
    names=$(jq -r '.critical.identity["docker-reference"]' "$(blob "$payload")")
    covers=$(jq -r '.critical.image["docker-manifest-digest"]' "$(blob "$payload")")
    [ "$names" = "$IDENTITY" ] || die "signature $tag names $names, not $IDENTITY"
    [ "$covers" = "$signs" ] || die "signature $tag covers $covers, not $signs"
    signed=$((signed + 1))
  done < <(jq -r '.layers[].digest' "$(blob "$sig")")
done < <(jq -r '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] // "" | endswith(".sig"))
  | "\(.annotations["org.opencontainers.image.ref.name"]) \(.digest)"' "$layout/index.json")
[ "$signed" -gt "$manifests" ] || die "$WORK/pulled holds $signed signatures for $manifests manifests and the index"
log "verified: $IMAGE@$digest, $signed signatures by the trusted key naming $IDENTITY"
