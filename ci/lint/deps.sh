#!/usr/bin/env bash
# The dependency rules Cargo alone does not state (ARCHITECTURE.md,
# "Invariants"), checked over `cargo tree` by the test command:
#
#   * the activator (it runs as root on every node) links no async runtime,
#     no async HTTP stack, no OCI client library, no TOML parser and no
#     sigstore: tokio, reqwest, hyper, oci-client, toml, sigstore;
#   * kubeslot-image (what both programs trust) links none of them either;
#   * the builder never links the activator (host code), only kubeslot-image;
#   * no test fixture (fake-apiserver, fake-kubelet) is linked by the
#     activator, kubeslot-image or the builder: they are stand-ins for the
#     cluster in tests, never shipped.
#
# Prints the activator's crate count; exits 1 naming the rule and the chain
# that breaks it.
#
#   ci/lint/deps.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

FORBIDDEN=(tokio reqwest hyper oci-client toml sigstore)
FIXTURES=(fake-apiserver fake-kubelet)
status=0

# normal_tree PKG: "name version" per line, every crate PKG links in a
# normal (non-dev, non-build) build.
normal_tree() {
  cargo tree --locked -q -p "$1" -e normal --prefix none | sed 's/ (.*//' | sort -u
}

for pkg in kubeslot-activator kubeslot-image; do
  tree=$(normal_tree "$pkg")
  for bad in "${FORBIDDEN[@]}"; do
    if grep -q "^$bad v" <<<"$tree"; then
      echo "ci/lint/deps.sh: $pkg links $bad (forbidden for code that runs on hosts); how:" >&2
      cargo tree --locked -q -p "$pkg" -e normal -i "$bad" >&2 || true
      status=1
    fi
  done
done

for pkg in kubeslot-activator kubeslot-image kubeslot-builder; do
  tree=$(cargo tree --locked -q -p "$pkg" -e normal,build --prefix none | sed 's/ (.*//' | sort -u)
  for fixture in "${FIXTURES[@]}"; do
    if grep -q "^$fixture v" <<<"$tree"; then
      echo "ci/lint/deps.sh: $pkg links the test fixture $fixture (fixtures are never shipped); how:" >&2
      cargo tree --locked -q -p "$pkg" -e normal,build -i "$fixture" >&2 || true
      status=1
    fi
  done
done

# (each tree read whole before it is matched: `| grep -q` may end first,
# and pipefail would turn the producer's SIGPIPE into "not linked")
builder_tree=$(normal_tree kubeslot-builder)
builder_dev=$(cargo tree --locked -q -p kubeslot-builder -e dev --prefix none)
if grep -q '^kubeslot-activator v' <<<"$builder_tree"; then
  echo "ci/lint/deps.sh: kubeslot-builder links kubeslot-activator (the builder never links host code); how:" >&2
  cargo tree --locked -q -p kubeslot-builder -e normal -i kubeslot-activator >&2 || true
  status=1
fi
if grep -q '^kubeslot-activator v' <<<"$builder_dev"; then
  echo "ci/lint/deps.sh: kubeslot-builder's tests link kubeslot-activator (read images through kubeslot-image)" >&2
  status=1
fi

crates=$(normal_tree kubeslot-activator | grep -vc '^kubeslot-')
echo "ci/lint/deps.sh: kubeslot-activator links $crates third-party crates, none of: ${FORBIDDEN[*]}"
exit $status
