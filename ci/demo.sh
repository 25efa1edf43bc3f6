#!/usr/bin/env bash
# The offline demo (README "Set up and run"): build the demo node image from
# the stand-in artifacts in testdata/demo, sign it, write it as an
# oci-archive (the air-gapped form), then, as a host would, verify it and
# show what `activate` would do and unpack it into a scratch tree.
# Nothing leaves the machine; no systemd is needed.
#
#   ci/demo.sh [OUT_DIR]     (default out/demo; replaced on every run)
#
# KUBESLOT_BIN_DIR=target/debug uses already-built binaries (ci/test.sh does);
# otherwise the release binaries are built first.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-out/demo}
if [ -n "${KUBESLOT_BIN_DIR:-}" ]; then
  bin=$KUBESLOT_BIN_DIR
else
  cargo build --release --locked -p kubeslot-builder -p kubeslot-activator
  bin=target/release
fi
builder=$bin/kubeslot-builder
activator=$bin/kubeslot-activator

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=$out/cache

step() { printf '\n== %s\n' "$*"; }

step "signing key"
"$builder" keygen --out "$out/keys/release"

step "build, sign and write an oci-archive"
"$builder" build testdata/recipes/demo.toml --cache "$cache" \
  --sign-key "$out/keys/release.key" --identity registry.example/kubeslot/demo-node \
  --output "oci-archive:$out/node.tar"

step "a host root with the activator's config"
root=$out/host
mkdir -p "$root/etc/kubeslot/keys"
cp "$out/keys/release.pub" "$root/etc/kubeslot/keys/release.pub"
# A scratch root is no host (no systemd, cgroups or /dev/kmsg in it): the
# preflight, which plan runs as activate does, would refuse it. The demo
# shows the plan of a host that passes, so it ignores the checks.
cat > "$root/etc/kubeslot/activator.json" <<JSON
{
  "image": "oci-archive:$out/node.tar",
  "trust": {
    "public_keys": ["/etc/kubeslot/keys/release.pub"],
    "identity": "registry.example/kubeslot/demo-node"
  },
  "kubelet": {
    "api_server": "https://10.0.0.1:6443",
    "ca_data": "-----BEGIN CERTIFICATE-----\nZGVtbw==\n-----END CERTIFICATE-----\n",
    "bootstrap_token": "abcdef.0123456789abcdef",
    "node_name": "demo-node",
    "labels": { "pool": "demo" },
    "cluster_dns": ["10.96.0.10"]
  },
  "gpu": "off",
  "nameservers": ["192.0.2.53"],
  "preflight": { "ignore": ["all"] }
}
JSON
echo "$root/etc/kubeslot/activator.json"

step "plan: what activate would do on this host"
"$activator" plan --root "$root"

step "verify and unpack into a scratch tree"
"$activator" unpack --root "$root" --config "$root/etc/kubeslot/activator.json" \
  "oci-archive:$out/node.tar" "$out/tree"
ls -l "$out/tree/usr/local/bin" "$out/tree/usr/share/kubeslot"

step "a tampered archive is refused"
cp "$out/node.tar" "$out/tampered.tar"
python3 - "$out/tampered.tar" <<'PY'
import io, json, platform, sys, tarfile
src = sys.argv[1]
with tarfile.open(src) as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
files = {m.name.lstrip("./"): d for m, d in members if d is not None}
blob = lambda digest: json.loads(files["blobs/sha256/" + digest.split(":")[1]])
# flip one byte in the first layer of this host's platform image (the
# layers a host reads; blobs of other platforms are never read)
top = blob(json.loads(files["index.json"])["manifests"][0]["digest"])
arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
if "manifests" in top:
    top = blob(next(m["digest"] for m in top["manifests"] if m.get("platform", {}).get("architecture") == arch))
target = "blobs/sha256/" + top["layers"][0]["digest"].split(":")[1]
with tarfile.open(src, "w") as t:
    for m, d in members:
        if d is not None and m.name.lstrip("./") == target:
            d = bytes([d[0] ^ 1]) + d[1:]
        t.addfile(m, io.BytesIO(d) if d is not None else None)
PY
# A host that has not seen this image (a host whose store already holds the
# verified layer would use its own copy and never read the tampered one).
fresh=$out/fresh-host
mkdir -p "$fresh"
cp -a "$root/etc" "$fresh/"
if "$activator" unpack --root "$fresh" --config "$fresh/etc/kubeslot/activator.json" \
  "oci-archive:$out/tampered.tar" "$out/tampered-tree"; then
  echo "demo: the tampered archive was accepted" >&2
  exit 1
fi
test ! -e "$out/tampered-tree"
echo "refused, and nothing was written to $out/tampered-tree"

step "done: $out/node.tar is what an air-gapped host activates"
