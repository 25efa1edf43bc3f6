#!/usr/bin/env bash
# The SBOMs: every platform manifest of the image must carry its SPDX
# document as a `sha256-<hex>.sbom` attachment (`build` attaches them and
# `push`/`copy` carry them). This step reads them back from the copy verify.sh
# pulled from the registry (WORK/pulled), or from the build's own layout when
# nothing was pushed, checks each one's subject and SPDX version, and writes
# them out as WORK/sbom/<os>-<arch>.spdx.json for the run's artifacts.
#
# Inputs (environment; plus env.sh's):
#   KUBESLOT_RECIPE   the recipe build.sh built (required)
# Reads WORK/pulled or WORK/layout; writes WORK/sbom/.
set -euo pipefail
# shellcheck source=ci/publish/env.sh
. "$(dirname "$0")/env.sh"

need_env KUBESLOT_RECIPE "the recipe whose SBOMs to export"
kubeslot_image "$KUBESLOT_RECIPE"
layout=$WORK/layout
[ ! -f "$WORK/pushed" ] || layout=$WORK/pulled
[ -f "$layout/index.json" ] || die "$layout is not an OCI layout: run build.sh (and verify.sh after a push) first"
digest=$(cat "$WORK/digest")
blob() { printf '%s/blobs/sha256/%s' "$layout" "${1#sha256:}"; }
ref_name='.annotations["org.opencontainers.image.ref.name"]'

rm -rf "$WORK/sbom"
mkdir -p "$WORK/sbom"
count=0
while read -r os arch manifest; do
  tag=sha256-${manifest#sha256:}.sbom
  attachment=$(jq -r --arg tag "$tag" ".manifests[] | select($ref_name == \$tag) | .digest" "$layout/index.json")
  [ -n "$attachment" ] || die "$REF: the $os/$arch manifest $manifest has no SBOM ($tag is missing in $layout)"
  subject=$(jq -r '.subject.digest' "$(blob "$attachment")")
  [ "$subject" = "$manifest" ] || die "$tag: its subject is $subject, not $manifest"
  doc=$(jq -r '.layers[] | select(.mediaType == "text/spdx+json") | .digest' "$(blob "$attachment")")
  [ -n "$doc" ] || die "$tag has no text/spdx+json layer"
  out=$WORK/sbom/$os-$arch.spdx.json
  cp "$(blob "$doc")" "$out"
  version=$(jq -r .spdxVersion "$out")
  [ "$version" = SPDX-2.3 ] || die "$tag: spdxVersion is $version, not SPDX-2.3"
  log "$os/$arch: $(jq '[.packages[] | select(.SPDXID != "SPDXRef-Image")] | length' "$out") packages -> $out"
  count=$((count + 1))
done < <(jq -r '.manifests[] | "\(.platform.os) \(.platform.architecture) \(.digest)"' "$(blob "$digest")")
[ "$count" -gt 0 ] || die "$REF@$digest names no platform manifest"
