#!/usr/bin/env bash
# Fetches NVIDIA's container toolkit repository key into the keyring path
# recipes/ubuntu2404-nvidia.toml names, and fails unless its fingerprint is
# the one given (the fingerprint NVIDIA publishes). Used by publish.yml.
set -euo pipefail
want=${1:?usage: nvidia-key.sh FINGERPRINT (set the NVIDIA_KEY_FINGERPRINT variable)}
keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
tmp=$(mktemp)
curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor > "$tmp"
got=$(gpg --show-keys --with-colons "$tmp" | awk -F: '$1 == "fpr" { print $10; exit }')
if [ "$got" != "${want// /}" ]; then
  echo "nvidia-key.sh: key fingerprint $got, expected $want" >&2
  exit 1
fi
sudo install -m 0644 "$tmp" "$keyring"
rm -f "$tmp"
