# shellcheck shell=bash
# The keyless scenario, sourced by ci/e2e/run.sh (it uses lib.sh,
# images.sh and activator.sh; images.sh sets DIGEST_v4 and IMAGE_LAYOUT).
# shellcheck disable=SC2154
#
# keyless_verified_offline: v4, copied from the build layout into a layout
# of its own (no key signature) and signed there by a TEST-ONLY Sigstore
# instance (target/debug/kubeslot-test-sigstore: its own Fulcio CAs, Rekor
# and CT keys, written as a trusted_root.json; test-support's
# keyless::TestSigstore), both ways cosign signs: a legacy `.sig` layer and
# a v0.3 bundle among the referrers (fallback tag `sha256-<hex>`). No public
# Sigstore vector signs an image for this host. The host's config has
# `trust.keyless` and no keys; the image comes from an oci-archive made by
# `kubeslot-builder copy` (which carries the signatures), whatever the
# registry's state (airgap_archive, before it, stops it). First a copy whose
# bundle has a flipped SET byte (its only signature) is refused, naming
# why, with the node unchanged; then the signed one is activated and the
# idle slot runs it.
#
# Needs a running node (activate_v1 or later); v4 must not be marked bad
# on the host (no scenario marks it).

KEYLESS_REPO=kubeslot/e2e-keyless

# keyless_config IMAGE IDENTITY ISSUER: the activator config trusting the
# test Sigstore root (keyless only) for REGISTRY/KEYLESS_REPO.
keyless_config() {
  config_json "$1" /etc/kubeslot/trust/e2e.pub |
    jq --arg repo "$REGISTRY/$KEYLESS_REPO" --arg id "$2" --arg issuer "$3" '.trust = {
      identity: $repo,
      keyless: {
        trusted_root: "/etc/kubeslot/keyless-trusted-root.json",
        issuer: $issuer,
        identity: $id,
        require_sct: true
      }
    }' >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
}

scenario_keyless_verified_offline() {
  local dir=$WORK/keyless signer=$REPO/target/debug/kubeslot-test-sigstore said identity issuer before after
  check "the test Sigstore command is built" test -x "$signer" || return 1
  rm -rf "$dir"
  mkdir -p "$dir" "$OUTER/etc/kubeslot"
  "$BUILDER" copy "oci:$IMAGE_LAYOUT:v4" "oci:$dir/good:v4" >"$WORK/logs/keyless-copy.log" 2>&1 ||
    { cat "$WORK/logs/keyless-copy.log" >&2; fail "kubeslot-builder copy of v4"; return 1; }
  # the mutated copy shares the image's blobs (hard links; the signer only adds files)
  cp -al "$dir/good" "$dir/bad"
  said=$("$signer" --trusted-root "$OUTER/etc/kubeslot/keyless-trusted-root.json" \
    --repository "$REGISTRY/$KEYLESS_REPO" --layout "$dir/good" --tag v4 \
    --mutation flipped-set-byte --mutated-layout "$dir/bad") || { fail "kubeslot-test-sigstore"; return 1; }
  identity=$(jq -r .identity <<<"$said") issuer=$(jq -r .issuer <<<"$said")
  log "  signed keylessly as $identity (issuer $issuer): $(jq -r '.signed | join(", ")' <<<"$said")"
  check "v4's index is what the test Sigstore signed" grep -q "$DIGEST_v4" <<<"$said" || return 1
  local v
  for v in good bad; do
    "$BUILDER" copy "oci:$dir/$v:v4" "oci-archive:$OUTER/var/tmp/node-keyless-$v.tar:v4" >>"$WORK/logs/keyless-copy.log" 2>&1 ||
      { cat "$WORK/logs/keyless-copy.log" >&2; fail "kubeslot-builder copy to an oci-archive"; return 1; }
  done
  local tag=sha256-${DIGEST_v4#sha256:}
  # shellcheck disable=SC2016 # a jq program
  check "the archive carries v4's referrers (fallback tag $tag) and $tag.sig" jq -e --arg r "$tag" \
    '[.manifests[].annotations["org.opencontainers.image.ref.name"]] | index($r) != null and index($r + ".sig") != null' \
    <<<"$(tar -xOf "$OUTER/var/tmp/node-keyless-good.tar" --wildcards --no-anchored index.json)" || return 1

  # A flipped SET byte: refused, naming why; nothing changes.
  before=$(node_snapshot) || return 1
  keyless_config "oci-archive:/var/tmp/node-keyless-bad.tar:v4" "$identity" "$issuer"
  if act activate; then show_log; fail "a bundle with a flipped SET byte was accepted"; return 1; fi
  log "  mutated bundle refused: $(act_error)"
  check "the refusal names the rule" grep -q "signed entry timestamp does not verify" <<<"$(act_error)" || { show_log; return 1; }
  check "the refusal names the certificate" grep -qF "certificate $identity (issuer $issuer)" <<<"$(act_error)" || { show_log; return 1; }
  expect_unchanged "$before" || return 1

  # The signed archive: activated into the idle slot.
  after=$(other_machine "${before%% *}")
  keyless_config "oci-archive:/var/tmp/node-keyless-good.tar:v4" "$identity" "$issuer"
  # (--force: the follow scenarios' operator rollback may have marked v4 bad
  # on this host; --force retries it, the signature is checked as ever)
  act activate --force || { show_log; log_report; fail "a keylessly signed image was refused"; return 1; }
  log_report
  expect_running "$after" v1.35.3-e2e.4 || return 1
  expect_status "$after" "$DIGEST_v4" || return 1
  rm -f "$OUTER/var/tmp/node-keyless-good.tar" "$OUTER/var/tmp/node-keyless-bad.tar"
  rm -rf "$dir"
}
