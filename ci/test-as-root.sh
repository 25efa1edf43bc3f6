#!/usr/bin/env bash
# The test command as root, from a user who may sudo (GitHub's runner:
# .github/workflows/ci.yml): the pinned Rust toolchain with rustfmt and
# clippy installed for that user (rustup), then ci/test.sh through sudo,
# with the toolchain's environment kept (sudo resets PATH and the rest).
# ci/test.sh then installs the packages it needs (ci/setup.sh) and tests.
#
# Inputs (environment):
#   KUBESLOT_RUST_TOOLCHAIN  the toolchain (default 1.95.0, as ci/publish/setup.sh)
#   KUBESLOT_DEBIAN_MIRROR   a Debian mirror's URL, required where the apt
#                            sources name no Debian archive (Ubuntu): kept
#                            for the tests (ci/lib/debian-mirror.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'ci/test-as-root.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Fail before the long part when the tests could find no Debian mirror.
ci/lib/debian-mirror.sh >/dev/null ||
  die "no Debian mirror: set KUBESLOT_DEBIAN_MIRROR (on GitHub: the repository variable of that name, Settings > Secrets and variables > Actions > Variables)"
command -v rustup >/dev/null || die "rustup is not installed: the toolchain comes from it"
toolchain=${KUBESLOT_RUST_TOOLCHAIN:-1.95.0}
rustup toolchain install "$toolchain" --profile minimal --component rustfmt,clippy
if [ "$(id -u)" = 0 ]; then
  exec env RUSTUP_TOOLCHAIN="$toolchain" ci/test.sh
fi
command -v sudo >/dev/null || die "not root and no sudo: run ci/test.sh as root"
exec sudo --non-interactive env \
  "PATH=$PATH" \
  "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" \
  "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" \
  "RUSTUP_TOOLCHAIN=$toolchain" \
  "KUBESLOT_DEBIAN_MIRROR=${KUBESLOT_DEBIAN_MIRROR:-}" \
  "CI=${CI:-}" \
  ci/test.sh
