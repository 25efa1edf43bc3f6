# shellcheck shell=bash
# shellcheck disable=SC2034 # the names set here are read by the scripts that source it
# Sourced by every ci/publish script: the one place image names, tags and the
# signing identity are derived, plus the helpers the steps share (the builder
# call, skopeo with registry credentials, a private temp dir for secrets).
#
# Inputs (environment):
#   KUBESLOT_BUILDER    the kubeslot-builder binary
#                       (default: target/release/kubeslot-builder of this checkout)
#   KUBESLOT_REGISTRY   registry host[:port] (default: ghcr.io)
#   KUBESLOT_NAMESPACE  repository path under the registry (default:
#                       $GITHUB_REPOSITORY, i.e. owner/repository); lowercased,
#                       as ghcr.io refuses upper-case names
#   KUBESLOT_OUT        work and output directory (default: out/publish)
#   KUBESLOT_CACHE      the builder's download cache (default:
#                       ${XDG_CACHE_HOME:-~/.cache}/kubeslot, what actions/cache keeps)
#   GITHUB_SERVER_URL, GITHUB_REPOSITORY, GITHUB_SHA (set by GitHub Actions):
#                       the org.opencontainers.image.source and .revision
#                       annotations (none when unset)
# Registry credentials (secrets; kubeslot-builder reads them itself, skopeo
# gets them through a private auth file; never printed):
#   KUBESLOT_REGISTRY_USER + KUBESLOT_REGISTRY_PASSWORD, else for ghcr.io
#   GITHUB_ACTOR + GITHUB_TOKEN.
#
# `kubeslot_image RECIPE` sets, for one recipe:
#   STEM      the recipe's file name without .toml (ubuntu2404)
#   IMAGE     REGISTRY/NAMESPACE/STEM in lower case: the repository pushed to
#   IDENTITY  the docker-reference every signature names (= IMAGE)
#   TAG       the recipe's `tag`, as `kubeslot-builder check` reads it
#   REF       IMAGE:TAG
#   WORK      KUBESLOT_OUT/STEM: what the steps hand on to each other
#             (layout/, digest, pushed, pulled/, sbom/, release-notes.md)

SCRIPT=$(basename "$0")
KUBESLOT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILDER=${KUBESLOT_BUILDER:-$KUBESLOT_ROOT/target/release/kubeslot-builder}
REGISTRY=$(printf '%s' "${KUBESLOT_REGISTRY:-ghcr.io}" | tr '[:upper:]' '[:lower:]')
NAMESPACE=$(printf '%s' "${KUBESLOT_NAMESPACE:-${GITHUB_REPOSITORY:-}}" | tr '[:upper:]' '[:lower:]')
OUT=${KUBESLOT_OUT:-out/publish}
CACHE=${KUBESLOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeslot}
SOURCE_URL=''
if [ -n "${GITHUB_SERVER_URL:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ]; then
  SOURCE_URL=$GITHUB_SERVER_URL/$GITHUB_REPOSITORY
fi
REVISION=${GITHUB_SHA:-}

log() { printf '%s: %s\n' "$SCRIPT" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# need TOOL PACKAGE: fail with the install command when TOOL is missing.
need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is not installed: apt-get install -y $2 (ci/setup.sh installs every tool)"
}
# need_env NAME WHAT: fail naming the variable when it is empty.
need_env() { [ -n "${!1:-}" ] || die "$1 is not set: $2"; }

need jq jq
[ -x "$BUILDER" ] || die "kubeslot-builder not found at $BUILDER: run \`cargo build --release -p kubeslot-builder\` or set KUBESLOT_BUILDER"

# Secrets go only into this directory (mode 0700, files 0600), removed on
# exit however the script ends.
umask 077
PRIVATE=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-publish.XXXXXX")
trap 'rm -rf "$PRIVATE"' EXIT
umask 022

# kb ARGS...: kubeslot-builder with the shared cache and plain progress lines.
kb() { "$BUILDER" --progress plain --cache "$CACHE" "$@"; }

# private_copy NAME VALUE: writes VALUE into PRIVATE/NAME (0600), prints the
# path. VALUE reaches the file through printf, a shell builtin: it never
# appears in a process's arguments. Carriage returns and trailing blank
# lines (a secret pasted with them) are dropped: PEM parsers refuse them.
private_copy() {
  local path=$PRIVATE/$1 value=${2//$'\r'/}
  value=${value%"${value##*[!$'\n']}"}
  (umask 077 && printf '%s\n' "$value" >"$path")
  printf '%s\n' "$path"
}

# The OCI distribution grammar for repository path components and tags:
# bad names fail here, naming the input, not later in a registry error.
valid_component() { [[ $1 =~ ^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$ ]]; }
valid_tag() { [[ $1 =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; }

kubeslot_image() {
  local recipe=$1 summary component
  [ -f "$recipe" ] || die "recipe $recipe: no such file"
  [ -n "$NAMESPACE" ] || die "KUBESLOT_NAMESPACE (or GITHUB_REPOSITORY) is not set: the repository path under $REGISTRY, e.g. owner/repository"
  STEM=$(basename "$recipe" .toml)
  IMAGE=$(printf '%s' "$REGISTRY/$NAMESPACE/$STEM" | tr '[:upper:]' '[:lower:]')
  local parts
  IFS=/ read -ra parts <<<"${IMAGE#"$REGISTRY"/}"
  for component in "${parts[@]}"; do
    valid_component "$component" || die "image name $IMAGE: path component \"$component\" is not a valid repository name (lower-case letters, digits, and . _ __ - between them)"
  done
  summary=$(kb --json check "$recipe") || die "recipe $recipe does not validate"
  TAG=$(jq -r .tag <<<"$summary")
  valid_tag "$TAG" || die "recipe $recipe: tag \"$TAG\" is not a valid image tag"
  IDENTITY=$IMAGE
  REF=$IMAGE:$TAG
  WORK=$OUT/$STEM
}

# The registry is plain HTTP only on loopback (as kubeslot-builder decides).
registry_is_loopback() {
  case $REGISTRY in
    127.0.0.1 | 127.0.0.1:* | localhost | localhost:* | '[::1]' | '[::1]:'*) return 0 ;;
    *) return 1 ;;
  esac
}

# skopeo_auth: writes skopeo's auth file from the credentials above (same
# precedence as kubeslot-builder) into PRIVATE; SKOPEO_ARGS then holds the
# options every skopeo call takes. Call it in the script, not in $(...).
SKOPEO_ARGS=()
skopeo_auth() {
  need skopeo skopeo
  local user='' pass='' auth
  SKOPEO_ARGS=()
  registry_is_loopback && SKOPEO_ARGS+=(--tls-verify=false)
  if [ -n "${KUBESLOT_REGISTRY_USER:-}" ]; then
    user=$KUBESLOT_REGISTRY_USER pass=${KUBESLOT_REGISTRY_PASSWORD:-}
  elif [ "$REGISTRY" = ghcr.io ] && [ -n "${GITHUB_TOKEN:-}" ]; then
    user=${GITHUB_ACTOR:-github-actions} pass=$GITHUB_TOKEN
  else
    return 0
  fi
  auth=$(printf '%s:%s' "$user" "$pass" | base64 -w0)
  private_copy skopeo-auth.json "{\"auths\":{\"$REGISTRY\":{\"auth\":\"$auth\"}}}" >/dev/null
  SKOPEO_ARGS+=(--authfile "$PRIVATE/skopeo-auth.json")
}

# Keyless signing (no signing key configured): the certificate Fulcio gives
# this workflow run names it as https://github.com/OWNER/REPO/.github/
# workflows/FILE@REF (GITHUB_WORKFLOW_REF), issued for GitHub's OIDC issuer.
# A host's trust.keyless names the same (docs/host/trust.md, "Keyless signatures").
KEYLESS_ISSUER=https://token.actions.githubusercontent.com
KEYLESS_IDENTITY=''
if [ -n "${GITHUB_WORKFLOW_REF:-}" ]; then
  KEYLESS_IDENTITY=${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_WORKFLOW_REF
fi

# docker_config: DOCKER_CONFIG (for cosign) pointing at a private copy of
# skopeo's auth file (the same credentials). Call it in the script.
docker_config() {
  skopeo_auth
  mkdir -p "$PRIVATE/docker"
  if [ -f "$PRIVATE/skopeo-auth.json" ]; then
    cp "$PRIVATE/skopeo-auth.json" "$PRIVATE/docker/config.json"
  else
    printf '{}\n' >"$PRIVATE/docker/config.json"
  fi
  export DOCKER_CONFIG=$PRIVATE/docker
}

# trusted_key: prints the path of the public key the images must verify
# with: KUBESLOT_PUBLIC_KEY (PEM text; the key hosts trust, a repository
# variable), else the throwaway key build.sh made for an unpublished run.
trusted_key() {
  if [ -n "${KUBESLOT_PUBLIC_KEY:-}" ]; then
    private_copy trusted.pub "$KUBESLOT_PUBLIC_KEY"
  elif [ -f "$WORK/ephemeral.pub" ]; then
    printf '%s\n' "$WORK/ephemeral.pub"
  else
    die "KUBESLOT_PUBLIC_KEY is not set: the PEM public key hosts trust (\`kubeslot-builder keygen\` wrote it beside the signing key)"
  fi
}

# The workflow that makes and refreshes the package-base locks and opens a
# pull request with them (weekly and on demand): what a run without a
# committed lock is told to run.
LOCK_WORKFLOW=".github/workflows/lock.yml"
LOCK_WORKFLOW_HINT="run the \"lock package bases\" workflow ($LOCK_WORKFLOW: Actions, lock package bases, Run workflow) and merge the pull request it opens"

# recipe_base RECIPE: the recipe's base as \`kubeslot-builder check\` says it
# ("debian SUITE ..." for a package base, which needs a lock).
recipe_base() { kb --json check "$1" | jq -r .base; }

# require_lock RECIPE: fails, naming the lock workflow, when RECIPE has a
# package base and no lock beside it (only a machine that reaches the
# package archive can make one: the lock workflow's runner).
require_lock() {
  local recipe=$1 base
  [ -f "$recipe" ] || die "recipe $recipe: no such file"
  base=$(recipe_base "$recipe") || die "recipe $recipe does not validate"
  case $base in debian\ *) ;; *) return 0 ;; esac
  [ -f "${recipe%.toml}.lock" ] ||
    die "recipe $recipe has a package base but no lock ${recipe%.toml}.lock committed: $LOCK_WORKFLOW_HINT"
}

# step_summary FILE: appends FILE to the job's summary page when there is one.
step_summary() {
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$1" >>"$GITHUB_STEP_SUMMARY"
  fi
}
