#!/usr/bin/env bash
# A GitHub-hosted runner's tools for one job, then the builder: the apt
# packages the job's steps call and `cargo build --release --locked` of
# kubeslot-builder with the pinned Rust toolchain. The only step the test
# command does not run (it installs system packages); ci/setup.sh installs the
# same tools on the test machine.
#
# Inputs (environment):
#   KUBESLOT_SETUP           lock | publish (required): which job's tools
#   KUBESLOT_RUST_TOOLCHAIN  the toolchain to build with (default: 1.95.0)
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { printf 'setup.sh: %s\n' "$*" >&2; }
toolchain=${KUBESLOT_RUST_TOOLCHAIN:-1.95.0}
case ${KUBESLOT_SETUP:-} in
  # apt resolves the package sets; gpg checks NVIDIA's key; git and gh
  # push the new locks and open their pull request (lock.yml).
  lock) packages=(apt-utils ubuntu-keyring gpg curl jq python3 git gh) ;;
  # mmdebstrap installs them (qemu-user for arm64 on amd64); skopeo reads
  # back what was pushed.
  publish) packages=(apt-utils ubuntu-keyring gpg curl jq mmdebstrap qemu-user-static binfmt-support skopeo) ;;
  *) log "error: KUBESLOT_SETUP is \"${KUBESLOT_SETUP:-}\": use lock or publish"; exit 1 ;;
esac
sudo apt-get update -q
sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
rustup toolchain install "$toolchain" --profile minimal
cargo "+$toolchain" build --release --locked -p kubeslot-builder
log "target/release/kubeslot-builder: $(target/release/kubeslot-builder version)"
