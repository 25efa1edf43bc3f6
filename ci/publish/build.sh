#!/usr/bin/env bash
# Build, sign and (optionally) push one recipe's node image.
#
#   1. `kubeslot-builder build` into the OCI layout WORK/layout (tag TAG),
#      with the source/revision annotations; the index digest goes to
#      WORK/digest.
#   2. `kubeslot-builder sign` of the index and every platform manifest with
#      the signing key, naming IDENTITY (env.sh); the key lives in a 0600
#      file in a private temp dir only while `sign` runs.
#   3. `kubeslot-builder copy` to the oci-archive WORK/STEM.tar (the
#      air-gapped form, with its .sig/.sbom), verifying every signature with
#      the public key hosts trust: a signing key that does not match that
#      key fails here, before anything is published.
#   4. With KUBESLOT_PUSH=1: `kubeslot-builder push` to REF, which reads the
#      tag back and verifies the signatures in the registry; REF@digest goes
#      to WORK/pushed.
#
# Keyless instead, when no signing key is configured (no KUBESLOT_SIGNING_KEY,
# KUBESLOT_EPHEMERAL_KEY not 1) and the run can get an OIDC token (GitHub
# Actions with `id-token: write`) and has cosign: the image is pushed
# unsigned, then `cosign sign` signs the index and every platform manifest
# with a Fulcio certificate naming this workflow run (KEYLESS_IDENTITY,
# env.sh; the bundle goes to the registry as an OCI referrer, or under the
# referrers fallback tag), and the archive is copied back from the registry
# with those referrers. WORK/keyless records the identity for verify.sh.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE         the recipe file (required)
#   KUBESLOT_SIGNING_KEY    (secret) the PKCS#8 PEM private key from
#                           `kubeslot-builder keygen`; required unless
#                           KUBESLOT_EPHEMERAL_KEY=1
#   KUBESLOT_EPHEMERAL_KEY  1: sign with a throwaway key made for this run
#                           (pull requests: no secret leaves the repository,
#                           nothing is pushed); its public key is WORK/ephemeral.pub
#   KUBESLOT_PUBLIC_KEY     the PEM public key hosts trust (required with
#                           KUBESLOT_SIGNING_KEY)
#   KUBESLOT_PUSH           1: push to REF (default 0)
#   KUBESLOT_BUILD_AS_ROOT  1: run `build` itself through sudo (a package base
#                           installs with mmdebstrap as root); the outputs are
#                           then given back to the calling user. Signing and
#                           pushing never run as root and root never sees a secret.
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe to build, e.g. recipes/ubuntu2404.toml"
# A package base without its lock cannot be built: say so before anything else.
require_lock "$KUBESLOT_RECIPE"
kubeslot_image "$KUBESLOT_RECIPE"
push=${KUBESLOT_PUSH:-0}

# The key first: a run that cannot sign fails before it builds.
signing_key='' keyless=0
if [ -n "${KUBESLOT_SIGNING_KEY:-}" ]; then
  need_env KUBESLOT_PUBLIC_KEY "the PEM public key hosts trust, to check the signatures against before anything is pushed"
  signing_key=$(private_copy signing.key "$KUBESLOT_SIGNING_KEY")
elif [ "${KUBESLOT_EPHEMERAL_KEY:-0}" = 1 ]; then
  [ "$push" != 1 ] || die "KUBESLOT_EPHEMERAL_KEY=1 with KUBESLOT_PUSH=1: a throwaway key's signatures would be published; set KUBESLOT_SIGNING_KEY"
  kb keygen --out "$PRIVATE/ephemeral" >/dev/null
  signing_key=$PRIVATE/ephemeral.key
elif [ -n "${ACTIONS_ID_TOKEN_REQUEST_URL:-}" ] && [ -n "$KEYLESS_IDENTITY" ] && command -v cosign >/dev/null; then
  [ "$push" = 1 ] || die "keyless signing signs the image in the registry: it needs KUBESLOT_PUSH=1 (or set KUBESLOT_EPHEMERAL_KEY=1)"
  keyless=1
else
  die "KUBESLOT_SIGNING_KEY is not set (the repository secret with the PEM private key), KUBESLOT_EPHEMERAL_KEY is not 1, and keyless signing is not possible here (it needs cosign and a GitHub Actions OIDC token: the job's permission id-token: write)"
fi
# Nothing started from here on inherits the secret.
unset KUBESLOT_SIGNING_KEY

rm -rf "$WORK"
mkdir -p "$WORK" "$CACHE"
if [ "${KUBESLOT_EPHEMERAL_KEY:-0}" = 1 ]; then
  cp "$PRIVATE/ephemeral.pub" "$WORK/ephemeral.pub"
fi

annotations=()
[ -z "$SOURCE_URL" ] || annotations+=(--annotation "org.opencontainers.image.source=$SOURCE_URL")
[ -z "$REVISION" ] || annotations+=(--annotation "org.opencontainers.image.revision=$REVISION")

log "build $KUBESLOT_RECIPE -> oci:$WORK/layout:$TAG"
build=(kb build "$KUBESLOT_RECIPE" --output "oci:$WORK/layout:$TAG" "${annotations[@]}")
if [ "${KUBESLOT_BUILD_AS_ROOT:-0}" = 1 ] && [ "$(id -u)" != 0 ]; then
  # sudo resets the environment: only PATH and HOME go through. The
  # output file is the calling user's on purpose.
  # shellcheck disable=SC2024
  sudo env "PATH=$PATH" "HOME=$HOME" "$BUILDER" --progress plain --cache "$CACHE" "${build[@]:1}" >"$WORK/build.out"
  sudo chown -R "$(id -u):$(id -g)" "$WORK" "$CACHE"
else
  "${build[@]}" >"$WORK/build.out"
fi
digest=$(tail -n1 "$WORK/build.out")
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "build printed no index digest (last line: $digest)"
printf '%s\n' "$digest" >"$WORK/digest"
log "built $digest"

if [ "$keyless" = 1 ]; then
  docker_config
  log "push $REF (unsigned: keyless signatures are made in the registry)"
  kb push "oci:$WORK/layout:$TAG" "$REF" >&2
  index_blob=$WORK/layout/blobs/sha256/${digest#sha256:}
  for d in "$digest" $(jq -r '.manifests[].digest' "$index_blob"); do
    log "cosign sign $IMAGE@$d (keyless, as $KEYLESS_IDENTITY)"
    cosign sign --yes "$IMAGE@$d" >&2
  done
  printf '%s\n' "$KEYLESS_IDENTITY" >"$WORK/keyless"
  printf '%s\n' "$IMAGE@$digest" >"$WORK/pushed"
  log "archive $WORK/$STEM.tar (from the registry, with the signatures' referrers)"
  kb copy "$IMAGE@$digest" "oci-archive:$WORK/$STEM.tar:$TAG" >&2
  printf '%s\n' "$IMAGE@$digest"
  exit 0
fi

log "sign oci:$WORK/layout:$TAG as $IDENTITY"
kb sign --key "$signing_key" --identity "$IDENTITY" "oci:$WORK/layout:$TAG" >&2
# The release statement (expires; renew.sh re-issues it on the workflow's
# schedule) rides with the image into the archive and the registry.
log "release statement for oci:$WORK/layout:$TAG (valid ${KUBESLOT_STATEMENT_HOURS:-168} h)"
kb statement issue --key "$signing_key" --identity "$IDENTITY" \
  --valid-hours "${KUBESLOT_STATEMENT_HOURS:-168}" "oci:$WORK/layout:$TAG" >&2
rm -f "$signing_key"

key=$(trusted_key)
log "archive $WORK/$STEM.tar (signatures verified with $(basename "$key"))"
kb copy "oci:$WORK/layout:$TAG" "oci-archive:$WORK/$STEM.tar:$TAG" --verify-key "$key" >&2

if [ "$push" = 1 ]; then
  log "push $REF"
  kb push "oci:$WORK/layout:$TAG" "$REF" --verify-key "$key" >&2
  printf '%s\n' "$IMAGE@$digest" >"$WORK/pushed"
fi
printf '%s\n' "$IMAGE@$digest"
