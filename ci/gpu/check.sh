#!/usr/bin/env bash
# The real-GPU check (docs/host/gpu.md): on a host with an NVIDIA GPU and
# its driver, build the NVIDIA test image (testdata/e2e/node-nvidia.toml.in
# with NVIDIA's real container toolkit in place of the e2e's nvidia-ctk
# recorder, plus crictl), activate it with the real kubeslot-activator on
# this host's systemd, and run a container that asks containerd for
# nvidia.com/gpu=all through CDI and prints `nvidia-smi -L`.
#
#   ci/gpu/check.sh            (as root, on a disposable GPU host)
#
# Exit status: 0 the container listed the GPUs; 77 no GPU here (nothing
# done); 1 anything else failed (the step is named). It is not part of the
# default test command: CI machines have no GPU.
#
# It changes this host the way a node install does (/var/lib/machines/kube1,
# /etc/systemd/nspawn, /etc/kubeslot, /var/lib/kubeslot,
# /usr/local/bin/kubeslot-activator) and removes all of it when it ends; it
# refuses to run where kubeslot is already installed. Needs: systemd as
# PID 1, systemd-container, mmdebstrap, debian-archive-keyring, cargo, cc,
# jq, a free 127.0.0.1:10248, and network access to a Debian mirror
# (KUBESLOT_DEBIAN_MIRROR, default: the first Debian mirror in this host's
# apt sources, else deb.debian.org), NVIDIA's container toolkit repository
# (its keyring at KUBESLOT_NVIDIA_KEYRING, default
# /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg, as NVIDIA's
# install guide leaves it), the crictl release the production recipe pins,
# and the registry of KUBESLOT_GPU_CHECK_IMAGE (default
# docker.io/library/debian:trixie-slim) and of containerd's pause image.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

say() { printf '[gpu-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------- a GPU?

no_gpu() {
  echo "no GPU here: $*; ci/gpu/check.sh needs a host with an NVIDIA GPU and its driver (exit 77, nothing done)"
  exit 77
}
gpu=""
for d in /dev/nvidia[0-9]*; do
  if [ -c "$d" ]; then gpu=$d; break; fi
done
[ -n "$gpu" ] || no_gpu "no /dev/nvidia<N> character device"
[ -r /proc/driver/nvidia/version ] || no_gpu "$gpu exists but the nvidia kernel module is not loaded (/proc/driver/nvidia/version)"
command -v nvidia-smi >/dev/null || no_gpu "the driver's nvidia-smi is not installed"
host_gpus=$(nvidia-smi -L) || no_gpu "nvidia-smi -L fails on the host"
say "host GPUs: $(echo "$host_gpus" | paste -sd';')"

# ---------------------------------------------------------------- preflight

[ "$(id -u)" = 0 ] || die "run as root (systemd-nspawn machines, /var/lib/machines)"
[ -d /run/systemd/system ] || die "systemd is not PID 1 here"
for t in systemd-nspawn:systemd-container machinectl:systemd-container mmdebstrap:mmdebstrap \
  cargo:cargo cc:gcc jq:jq sha256sum:coreutils; do
  command -v "${t%%:*}" >/dev/null || die "required tool '${t%%:*}' is missing: apt-get install -y ${t#*:}"
done
for p in /etc/kubeslot /var/lib/kubeslot /var/lib/machines/kube1 /var/lib/machines/kube2 \
  /usr/local/bin/kubeslot-activator; do
  [ ! -e "$p" ] || die "$p exists: kubeslot is installed on this host; run the check on a disposable GPU host"
done
if (exec 3<>/dev/tcp/127.0.0.1/10248) 2>/dev/null; then
  die "127.0.0.1:10248 is in use (a kubelet?); the check's node answers its health gate there"
fi
keyring=${KUBESLOT_NVIDIA_KEYRING:-/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg}
[ -s "$keyring" ] || die "no NVIDIA container toolkit keyring at $keyring: install it as NVIDIA's container toolkit guide says, or set KUBESLOT_NVIDIA_KEYRING"
mirror=${KUBESLOT_DEBIAN_MIRROR:-$(
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n'
    sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\(http[^[:space:]]*\).*/\2/p' /etc/apt/sources.list 2>/dev/null || true
  } | grep -v security | grep -E '^https?://.*/debian/?$' | head -n1 || true
)}
mirror=${mirror:-http://deb.debian.org/debian}
case $(uname -m) in
  x86_64) arch=amd64 ;;
  *) die "the NVIDIA test image is built for amd64 (testdata/e2e/node-nvidia.toml.in); this host is $(uname -m)" ;;
esac

WORK=$(mktemp -d /var/tmp/kubeslot-gpu-check.XXXXXX)
INSTALLED=()
cleanup() {
  local rc=$?
  set +e
  say "cleaning up"
  systemctl stop systemd-nspawn@kube1.service systemd-nspawn@kube2.service 2>/dev/null
  rm -rf --one-file-system /var/lib/machines/kube1 /var/lib/machines/kube2 /var/lib/machines/.kubeslot-* 2>/dev/null
  rm -rf /etc/systemd/nspawn/kube1.nspawn /etc/systemd/nspawn/kube2.nspawn \
    /etc/systemd/system/systemd-nspawn@kube1.service.d /etc/systemd/system/systemd-nspawn@kube2.service.d \
    /etc/systemd/system/kubeslot-render@.service /etc/kubeslot /var/lib/kubeslot "${INSTALLED[@]}"
  systemctl daemon-reload
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
mkdir -p "$WORK/logs"

# ---------------------------------------------------------------- build

say "building kubeslot-activator, kubeslot-builder and the fixture kubelet"
cargo build --quiet --locked -p kubeslot-activator -p kubeslot-builder -p fake-kubelet
BUILDER=$REPO/target/debug/kubeslot-builder

say "building a Debian trixie rootfs with NVIDIA's container toolkit (mmdebstrap, $mirror)"
# (containerd 2, runc and the CNI plugins from Debian testing, as the e2e
# node has them: the image carries the production containerd config)
pkgs=systemd,systemd-sysv,dbus,containerd/forky,runc/forky,containernetworking-plugins/forky,iproute2,iptables
pkgs+=,nvidia-container-toolkit,ca-certificates
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=minbase --include="$pkgs" \
  --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='APT::Default-Release "trixie"' \
  --format=tar trixie "$WORK/rootfs.tar" \
  "deb $mirror trixie main" "deb $mirror forky main" \
  "deb [signed-by=$keyring] https://nvidia.github.io/libnvidia-container/stable/deb/$arch /" \
  >"$WORK/logs/mmdebstrap.log" 2>&1 || { cat "$WORK/logs/mmdebstrap.log" >&2; die "mmdebstrap"; }

# The e2e test variant without its stand-ins for nvidia-ctk,
# nvidia-container-runtime and crictl (the toolkit's real ones are in the
# rootfs), plus crictl as the production recipe pins it.
recipe=$WORK/node-nvidia-check.toml
sed -e "s|@BASE_TAR@|$WORK/rootfs.tar|g" \
  -e "s|@BASE_SHA256@|$(sha256sum "$WORK/rootfs.tar" | cut -d' ' -f1)|g" \
  -e "s|@TAG@|gpu-check|g" \
  -e "s|@KUBELET_SHA256@|$(sha256sum "$REPO/target/debug/fake-kubelet" | cut -d' ' -f1)|g" \
  -e "s|@KUBELET@|$REPO/target/debug/fake-kubelet|g" \
  -e "s|@UNITS@|$REPO/testdata/e2e/node/units|g" \
  -e "s|@RECIPE_FILES@|$REPO/recipes/files|g" \
  -e "s|@NVIDIA@|$REPO/testdata/e2e/nvidia|g" \
  testdata/e2e/node-nvidia.toml.in |
  awk 'BEGIN { RS = ""; ORS = "\n\n" } !/path = "\/usr\/bin\/(nvidia-ctk|nvidia-container-runtime|crictl)"/' >"$recipe"
grep -Eq 'path = "/usr/bin/(nvidia-ctk|nvidia-container-runtime|crictl)"' "$recipe" && die "a stand-in is still in $recipe"
awk '/^\[components.crictl\]/ { on = 1 } on && /^$/ { exit } on' recipes/ubuntu2404-nvidia.toml >>"$recipe"
grep -q '^\[components.crictl\]' "$recipe" || die "no crictl component in recipes/ubuntu2404-nvidia.toml"
sed -i 's|^group = "runtime"$|group = "kubernetes"|' "$recipe"

say "building and signing the image"
"$BUILDER" keygen --out "$WORK/key" >"$WORK/logs/keygen.log" 2>&1 || { cat "$WORK/logs/keygen.log" >&2; die "keygen"; }
"$BUILDER" build "$recipe" --sign-key "$WORK/key.key" --identity registry.invalid/kubeslot/gpu-check \
  --output "oci-archive:$WORK/node.tar:gpu-check" \
  >"$WORK/logs/build.log" 2>&1 || { cat "$WORK/logs/build.log" >&2; die "kubeslot-builder build"; }

# ---------------------------------------------------------------- activate

install -m 0755 target/debug/kubeslot-activator /usr/local/bin/kubeslot-activator
INSTALLED+=(/usr/local/bin/kubeslot-activator)
mkdir -p /etc/kubeslot/trust
install -m 0644 "$WORK/key.pub" /etc/kubeslot/trust/check.pub
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=kubeslot-gpu-check \
  -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2>/dev/null || die "openssl (test CA)"
jq -n --arg image "oci-archive:$WORK/node.tar:gpu-check" --arg ca "$(cat "$WORK/ca.crt")" '{
  image: $image,
  trust: {public_keys: ["/etc/kubeslot/trust/check.pub"], identity: "registry.invalid/kubeslot/gpu-check"},
  kubelet: {api_server: "https://192.0.2.1:6443", ca_data: $ca,
            bootstrap_token: "abcdef.0123456789abcdef", node_name: "gpu-check"},
  gpu: "on",
  health: {timeout_secs: 60}
}' >/etc/kubeslot/activator.json
chmod 0600 /etc/kubeslot/activator.json
say "kubeslot-activator activate"
kubeslot-activator activate || die "kubeslot-activator activate (report: /var/lib/kubeslot/report.json)"
in_machine() { systemd-run -M kube1 --quiet --wait --pipe "$@" </dev/null; }
result=$(in_machine systemctl show kubeslot-nvidia-setup.service -p Result --value)
if [ "$result" != success ]; then
  in_machine journalctl -b -u kubeslot-nvidia-setup.service --no-pager >&2 || true
  die "kubeslot-nvidia-setup.service in kube1: $result"
fi
say "in kube1: $(in_machine sh -c 'ldconfig -p | grep -c "libnvidia-ml\|libcuda"') driver libraries known to ldconfig; CDI spec: $(in_machine sh -c 'grep -c "name:" /etc/cdi/nvidia.yaml') names"

# ---------------------------------------------------------------- a GPU pod

image=${KUBESLOT_GPU_CHECK_IMAGE:-docker.io/library/debian:trixie-slim}
say "a container asking for nvidia.com/gpu=all through CDI ($image, crictl in kube1)"
in_machine sh -c "crictl --runtime-endpoint unix:///run/containerd/containerd.sock pull '$image'" >"$WORK/logs/pull.log" 2>&1 ||
  { cat "$WORK/logs/pull.log" >&2; die "crictl pull $image"; }
cat >"$WORK/pod.json" <<'EOF'
{"metadata": {"name": "kubeslot-gpu-check", "namespace": "default", "uid": "kubeslot-gpu-check"},
 "log_directory": "/var/log/pods/kubeslot-gpu-check",
 "linux": {"cgroup_parent": "kubeslot-gpu-check.slice",
           "security_context": {"namespace_options": {"network": 2}}}}
EOF
jq -n --arg image "$image" '{
  metadata: {name: "nvidia-smi"},
  image: {image: $image},
  command: ["nvidia-smi", "-L"],
  annotations: {"cdi.k8s.io/kubeslot-gpu-check": "nvidia.com/gpu=all"},
  log_path: "nvidia-smi.log"
}' >"$WORK/container.json"
mkdir -p /var/lib/machines/kube1/var/tmp/gpu-check
cp "$WORK/pod.json" "$WORK/container.json" /var/lib/machines/kube1/var/tmp/gpu-check/
# shellcheck disable=SC2016 # expanded inside the machine
out=$(in_machine sh -c '
  set -e
  c="crictl --runtime-endpoint unix:///run/containerd/containerd.sock"
  pod=$($c runp /var/tmp/gpu-check/pod.json)
  ctr=$($c create "$pod" /var/tmp/gpu-check/container.json /var/tmp/gpu-check/pod.json)
  $c start "$ctr" >/dev/null
  for i in $(seq 60); do
    [ "$($c inspect -o go-template --template "{{.status.state}}" "$ctr")" = CONTAINER_EXITED ] && break
    sleep 1
  done
  $c logs "$ctr"
  $c rm -f "$ctr" >/dev/null; $c stopp "$pod" >/dev/null; $c rmp "$pod" >/dev/null' 2>&1) ||
  { echo "$out" >&2; die "running the container in kube1"; }
echo "$out"
grep -q '^GPU 0: ' <<<"$out" || die "the container did not list GPU 0 (above: its output)"
echo "gpu check passed: a container on the kubeslot node got the host's GPUs through CDI"
