#!/usr/bin/env bash
# The test of ci/gpu/node-root-check.sh on a machine without a GPU (part of
# the test command, ci/test.sh; as root):
#   * `--prepare DIR` writes every file, SHA256SUMS matches, at most 64 MiB;
#   * the prepared activator verifies and unpacks the prepared image with
#     the prepared key, and the tree holds the image's kubeslot-nvidia-setup;
#   * the prepared cuda-probe runs in a chroot of that tree (the node
#     image's glibc): without a driver it fails naming libnvidia-ml.so.1;
#     with a stand-in driver linked in (testdata/gpu/fake-cuda.c) and the
#     tree's own ldconfig run, every step passes, and a broken stand-in
#     fails the step it broke;
#   * DIR/node-root-check.sh exits 77 ("no GPU here") and leaves nothing
#     behind.
# What the real driver does is checked only on a GPU host (the README's
# "GPU nodes"). Exit 0 when all hold, 1 naming the first that does not.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
  echo "node-root-check-test: FAIL: $*" >&2
  exit 1
}
ok() { echo "node-root-check-test: ok: $*"; }

[ "$(id -u)" = 0 ] || fail "run as root (it chroots into the unpacked node tree)"
command -v cc >/dev/null || fail "cc is missing: apt-get install -y gcc"
if [ -e /dev/nvidia0 ]; then
  fail "this machine has /dev/nvidia0: the test expects a machine without a GPU (run ci/gpu/node-root-check.sh itself here)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kubeslot-node-root-check-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
DIR=$WORK/prepared

# ---- prepare
ci/gpu/node-root-check.sh --prepare "$DIR" >"$WORK/prepare.log" 2>&1 ||
  { cat "$WORK/prepare.log" >&2; fail "--prepare exited non-zero"; }
for f in node-root-check.sh kubeslot-activator node-nvidia.tar node.pub cluster-ca.crt cuda-probe cuda-probe.c SHA256SUMS; do
  [ -s "$DIR/$f" ] || fail "--prepare wrote no $f"
done
got=$(find "$DIR" -mindepth 1 -printf '%f\n' | LC_ALL=C sort | paste -sd' ')
[ "$got" = "SHA256SUMS cluster-ca.crt cuda-probe cuda-probe.c kubeslot-activator node-nvidia.tar node-root-check.sh node.pub" ] ||
  fail "the prepared dir holds: $got"
(cd "$DIR" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match the prepared files"
total=$(du -cb "$DIR"/* | tail -n1 | cut -f1)
[ "$total" -le $((64 * 1024 * 1024)) ] || fail "the prepared dir holds $total bytes, more than 64 MiB"
cmp -s "$DIR/kubeslot-activator" target/release/kubeslot-activator || fail "the prepared activator is not the release build"
ok "prepared: every file, SHA256SUMS, $total bytes ($((total / 1024 / 1024)) MiB)"

# ---- the image: verified with the prepared key, unpacked
pem=$(awk '{ printf "%s\\n", $0 }' "$DIR/cluster-ca.crt")
cat >"$WORK/unpack.json" <<EOF
{"image": "oci-archive:$DIR/node-nvidia.tar:gpu-check",
 "trust": {"public_keys": ["$DIR/node.pub"], "identity": "kubeslot.invalid/node-root-check/gpu"},
 "kubelet": {"api_server": "https://192.0.2.1:6443", "ca_data": "$pem", "bootstrap_token": "abcdef.0123456789abcdef"}}
EOF
T=$WORK/tree
"$DIR/kubeslot-activator" unpack --config "$WORK/unpack.json" "oci-archive:$DIR/node-nvidia.tar:gpu-check" "$T" \
  >"$WORK/unpack.log" 2>&1 || { cat "$WORK/unpack.log" >&2; fail "the prepared activator refused the prepared image"; }
cmp -s "$T/usr/lib/kubeslot/nvidia-setup" recipes/files/kubeslot-nvidia-setup ||
  fail "the unpacked tree has not the image's kubeslot-nvidia-setup"
[ -x "$T/sbin/ldconfig" ] || fail "the unpacked tree has no ldconfig"
ok "the prepared activator verified and unpacked the prepared image"

# ---- the probe on the node image's glibc
mkdir -p "$T/run/probe"
cp "$DIR/cuda-probe" "$T/run/probe/cuda-probe"
in_tree() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$T" "$@"; }
rc=0
out=$(in_tree /run/probe/cuda-probe 2>&1) || rc=$?
if [ "$rc" != 1 ] || ! grep -q '^FAIL load: dlopen libnvidia-ml.so.1: libnvidia-ml.so.1: cannot open shared object file' <<<"$out"; then
  fail "the probe without a driver (exit $rc): $out"
fi
ok "without a driver the probe fails naming libnvidia-ml.so.1"
lib=$T/usr/lib/x86_64-linux-gnu
for so in libcuda.so.1 libnvidia-ml.so.1; do
  cc -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,"$so" -o "$lib/${so%.1}.0.0-fake" testdata/gpu/fake-cuda.c
done
in_tree ldconfig || fail "ldconfig in the tree"
in_tree ldconfig -p | grep -q 'libcuda.so.1 (libc6,x86-64)' || fail "the tree's loader cache has no libcuda.so.1"
out=$(in_tree /run/probe/cuda-probe 4096 2>&1) || fail "the probe with the stand-in driver: $out"
want="ok nvml: driver 0.0-fake, 1 GPU(s): 0: Fake kubeslot GPU
ok cuda: CUDA 12.8 driver API, 1 device(s), device 0: Fake kubeslot GPU
ok context: on device 0
ok memory: 2 x 16384 bytes on the device
ok copy: 16384 bytes written and read back unchanged
ok kernel: PTX JIT-compiled and launched over 4096 elements (16 blocks of 256), every result right
cuda-probe: every step passed"
[ "$out" = "$want" ] || fail "the probe with the stand-in driver printed:
$out"
ok "with a stand-in driver every probe step passes"
for b in init:cuda copy:copy kernel:kernel; do
  rc=0
  out=$(in_tree env FAKE_CUDA_BREAK="${b%:*}" /run/probe/cuda-probe 4096 2>&1) || rc=$?
  if [ "$rc" != 1 ] || ! grep -q "^FAIL ${b#*:}: " <<<"$out"; then
    fail "a broken ${b%:*} (exit $rc): $out"
  fi
done
ok "a broken stand-in fails the probe at the broken step (cuda, copy, kernel)"

# ---- the check itself: no GPU here
tmp=$WORK/check-tmp
mkdir -p "$tmp"
rc=0
out=$(KUBESLOT_CHECK_TMP=$tmp "$DIR/node-root-check.sh" 2>&1) || rc=$?
[ "$rc" = 77 ] || fail "node-root-check.sh exited $rc here, not 77: $out"
grep -q 'no GPU here: no /dev/nvidia<N> character device and no NVIDIA GPU on the PCI bus' <<<"$out" ||
  fail "node-root-check.sh did not say why: $out"
[ -z "$(ls -A "$tmp")" ] || fail "node-root-check.sh left files in its scratch dir: $(ls -A "$tmp")"
ok "node-root-check.sh exits 77 here (no GPU), nothing done"
