#!/usr/bin/env bash
# NVIDIA's container toolkit repository key, installed at the keyring path
# recipes/ubuntu2404-nvidia.toml names, only if its fingerprint is the one
# NVIDIA publishes (the repository variable NVIDIA_KEY_FINGERPRINT): `lock`
# checks that repository's InRelease with this keyring, so the key decides
# which packages are trusted. Nothing is installed when the fingerprint differs.
#
# Inputs (environment):
#   NVIDIA_KEY_FINGERPRINT   the expected fingerprint (required; spaces allowed)
#   KUBESLOT_NVIDIA_KEY_URL  where to fetch the key (default: NVIDIA's gpgkey URL)
#   KUBESLOT_NVIDIA_KEYRING  where to install it (default:
#                            /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg;
#                            through sudo when that directory is not writable)
set -euo pipefail
log() { printf 'nvidia-key.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v gpg >/dev/null || die "gpg is not installed: apt-get install -y gpg"
command -v curl >/dev/null || die "curl is not installed: apt-get install -y curl"
want=${NVIDIA_KEY_FINGERPRINT:-}
[ -n "$want" ] || die "NVIDIA_KEY_FINGERPRINT is not set: the fingerprint NVIDIA publishes for its container toolkit repository key"
want=${want// /}
url=${KUBESLOT_NVIDIA_KEY_URL:-https://nvidia.github.io/libnvidia-container/gpgkey}
keyring=${KUBESLOT_NVIDIA_KEYRING:-/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A private GnuPG home: nothing is read from or written to the user's.
export GNUPGHOME=$tmp/gnupg
mkdir -m 0700 "$GNUPGHOME"
curl -fsSL "$url" -o "$tmp/key.asc" || die "cannot fetch $url"
gpg --batch --quiet --dearmor <"$tmp/key.asc" >"$tmp/key.gpg" || die "$url is not an OpenPGP key"
got=$(gpg --batch --show-keys --with-colons "$tmp/key.gpg" | awk -F: '$1 == "fpr" { print $10; exit }')
[ "${got^^}" = "${want^^}" ] || die "the key at $url has fingerprint ${got:-none}, expected $want: not installed"
if [ -w "$(dirname "$keyring")" ]; then
  install -m 0644 "$tmp/key.gpg" "$keyring"
else
  sudo install -m 0644 "$tmp/key.gpg" "$keyring"
fi
log "installed $keyring (fingerprint $got)"
