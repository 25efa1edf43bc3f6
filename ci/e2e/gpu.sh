# shellcheck shell=bash
# The GPU scenario, sourced by ci/e2e/run.sh: a fake NVIDIA driver on the
# outer host (character devices made with mknod with NVIDIA's major numbers,
# real ELF shared objects and an nvidia-smi executable built here with cc
# and named like the driver's, the outer's real ldconfig), laid out like the
# GPU host of issue 25: the driver under /usr/local/nvidia (lib64 named in
# ld.so.conf.d, its tools in bin) and /usr/bin/nvidia-smi a wrapper script
# that execs the real one; the e2e test variant of the NVIDIA image
# (testdata/e2e/node-nvidia.toml.in: Debian trixie, the production image's
# kubeslot-nvidia-setup and its unit), activated by the real activator, and
# then inside the machine: the libraries linked and known to `ldconfig -p`,
# containerd's merged config with the nvidia runtime and CDI, the exact
# `nvidia-ctk cdi generate` arguments (a recorder stands in for nvidia-ctk,
# which cannot be installed here: the spec's contents are not exercised), a
# driver upgraded under the node picked up at the next start, a broken
# driver failing the unit by name, and a node without GPU left clean.
#
# No real GPU is involved: ci/gpu/check.sh does the real thing on a GPU host.

GPU_DRIVER_OLD=550.127.05
GPU_DRIVER_NEW=570.86.10
# The fake driver's libraries: file stem and soname version.
GPU_FAKE_LIBS="libcuda:1 libnvidia-ml:1 libnvidia-ptxjitcompiler:1 libnvidia-encode:1"
# Where the node's setup links the driver's libraries (inside the machine).
GPU_LIBDIR=/usr/lib/x86_64-linux-gnu
# Where the host keeps the driver (the /usr/local/nvidia layout).
GPU_HOST_LIB64=/usr/local/nvidia/lib64
GPU_HOST_LIB32=/usr/local/nvidia/lib
GPU_HOST_BIN=/usr/local/nvidia/bin

# gpu_build_driver VERSION: the fake driver's files under
# WORK/gpu/driver-VERSION/ as they sit on a host (relative to /): 64-bit
# and 32-bit (i386, linked against a stub libc.so.6 so ldconfig files them
# as libc6 like the real ones: this machine has no 32-bit C library)
# libraries with their sonames, the vdpau driver, the container toolkit's
# libnvidia-container.so.1 (on the host beside the driver, never to be
# linked into the machine), an nvidia-smi executable that prints the
# version, and the /usr/bin/nvidia-smi wrapper that execs it.
gpu_build_driver() {
  local v=$1 out=$WORK/gpu/driver-$1 src=$WORK/gpu/src spec stem so
  mkdir -p "$src" "$out$GPU_HOST_LIB64/vdpau" "$out$GPU_HOST_LIB32" "$out$GPU_HOST_BIN" "$out/usr/bin"
  echo 'int kubeslot_stub(void) { return 0; }' >"$src/stub.c"
  cc -m32 -shared -nostdlib -fPIC -Wl,-soname,libc.so.6 -o "$src/libc.so.6" "$src/stub.c"
  for spec in $GPU_FAKE_LIBS; do
    stem=${spec%:*} so=${spec#*:}
    echo "int kubeslot_fake_${stem//-/_}(void) { return ${v%%.*}; }" >"$src/$stem.c"
    cc -shared -fPIC -Wl,-soname,"$stem.so.$so" -o "$out$GPU_HOST_LIB64/$stem.so.$v" "$src/$stem.c"
    cc -m32 -shared -nostdlib -fPIC -Wl,-soname,"$stem.so.$so" -o "$out$GPU_HOST_LIB32/$stem.so.$v" \
      "$src/$stem.c" -Wl,--no-as-needed "$src/libc.so.6"
  done
  ln -sf libcuda.so.1 "$out$GPU_HOST_LIB64/libcuda.so"
  echo 'int kubeslot_fake_vdpau(void) { return 1; }' >"$src/vdpau.c"
  cc -shared -fPIC -Wl,-soname,libvdpau_nvidia.so.1 -o "$out$GPU_HOST_LIB64/vdpau/libvdpau_nvidia.so.$v" "$src/vdpau.c"
  echo 'int kubeslot_fake_toolkit(void) { return 1; }' >"$src/toolkit.c"
  cc -shared -fPIC -Wl,-soname,libnvidia-container.so.1 -o "$out$GPU_HOST_LIB64/libnvidia-container.so.1.17.0" "$src/toolkit.c"
  printf '#include <stdio.h>\nint main(void) { puts("GPU 0: Fake kubeslot e2e GPU (driver %s)"); return 0; }\n' "$v" >"$src/smi.c"
  cc -o "$out$GPU_HOST_BIN/nvidia-smi" "$src/smi.c"
  printf '#!/bin/sh\nexec %s/nvidia-smi "$@"\n' "$GPU_HOST_BIN" >"$out/usr/bin/nvidia-smi"
  chmod 0755 "$out/usr/bin/nvidia-smi"
}

# gpu_install_driver VERSION / gpu_remove_driver VERSION: the driver's
# files into (out of) the outer host, then the outer's ldconfig (which makes
# the soname links and the cache the activator reads with `ldconfig -p`).
gpu_install_driver() {
  cp -a "$WORK/gpu/driver-$1/." "$OUTER/"
  printf '%s\n' "$GPU_HOST_LIB64" "$GPU_HOST_LIB64/vdpau" "$GPU_HOST_LIB32" >"$OUTER/etc/ld.so.conf.d/zz-kubeslot-e2e-fake-nvidia.conf"
  outer ldconfig
}

gpu_remove_driver() {
  local f
  (cd "$WORK/gpu/driver-$1" && find . -type f -o -type l) | while read -r f; do
    rm -f "$OUTER/${f#./}"
  done
  outer ldconfig
}

# gpu_devices add|remove: the GPU's device nodes in the outer's /dev
# (NVIDIA's major 195 for the GPUs and the control device; the other majors
# are dynamic on a real host, any number does here).
gpu_devices() {
  if [ "$1" = add ]; then
    outer sh -c '
      mknod -m 666 /dev/nvidia0 c 195 0
      mknod -m 666 /dev/nvidiactl c 195 255
      mknod -m 666 /dev/nvidia-uvm c 507 0
      mkdir -p /dev/nvidia-caps /dev/nvidia-caps-imex-channels
      mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c 508 1
      mknod -m 666 /dev/nvidia-caps-imex-channels/channel0 c 509 0'
  else
    outer sh -c 'rm -rf /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-caps /dev/nvidia-caps-imex-channels'
  fi
}

# gpu_in MACHINE SCRIPT: runs SCRIPT with sh inside the machine.
gpu_in() {
  outer systemd-run -M "$1" --quiet --wait --pipe sh -c "$2" </dev/null
}

# gpu_restart MACHINE: stop and start the machine's unit (the render oneshot
# runs again before the start), then wait for its systemd.
gpu_restart() {
  local state
  outer systemctl restart "systemd-nspawn@$1.service" ||
    { fail "systemctl restart systemd-nspawn@$1 failed"; return 1; }
  state=$(machine_wait_running "$1" 60) || { fail "machine $1 is '$state' after 60 s"; return 1; }
}

# gpu_setup_result MACHINE: the setup unit's result and state.
gpu_setup_result() {
  gpu_in "$1" 'systemctl show kubeslot-nvidia-setup.service -p Result -p ActiveState --value | paste -sd" "'
}

gpu_setup_journal() {
  gpu_in "$1" 'journalctl -b -u kubeslot-nvidia-setup.service --no-pager -o cat'
}

# The whole scenario.
scenario_gpu_setup() {
  command -v cc >/dev/null || { fail "cc is not installed: apt-get install -y gcc (the fake driver is built with it)"; return 1; }
  local tar recipe archive=/var/tmp/node-gpu.tar before m got want
  mkdir -p "$WORK/gpu"
  tar=$("$REPO/ci/lib/debian-rootfs.sh" --suite trixie "$NODE_PKGS") || { fail "no trixie rootfs"; return 1; }
  # The GPU image: signed by a key of its own (whatever signed v1..v6),
  # carried with its signature in an oci-archive, so the scenario needs no
  # registry (airgap_archive stops it).
  "$BUILDER" keygen --out "$WORK/keys/gpu" >"$WORK/logs/gpu-keygen.log" 2>&1 ||
    { cat "$WORK/logs/gpu-keygen.log" >&2; fail "kubeslot-builder keygen failed"; return 1; }
  recipe=$WORK/gpu/node-nvidia.toml
  sed -e "s|@BASE_TAR@|$tar|g" \
    -e "s|@BASE_SHA256@|$(sha256sum "$tar" | cut -d' ' -f1)|g" \
    -e "s|@TAG@|gpu|g" \
    -e "s|@KUBELET_SHA256@|$(sha256sum "$WORK/kubelet/v1/kubelet" | cut -d' ' -f1)|g" \
    -e "s|@KUBELET@|$WORK/kubelet/v1/kubelet|g" \
    -e "s|@UNITS@|$E2E_TESTDATA/node/units|g" \
    -e "s|@RECIPE_FILES@|$REPO/recipes/files|g" \
    -e "s|@NVIDIA@|$E2E_TESTDATA/nvidia|g" \
    "$E2E_TESTDATA/node-nvidia.toml.in" >"$recipe"
  "$BUILDER" --progress plain build "$recipe" --layer-cache "$E2E_LAYER_CACHE" --sign-key "$WORK/keys/gpu.key" \
    --identity "$REGISTRY/kubeslot/e2e-gpu" \
    --output "oci-archive:$OUTER$archive:gpu" >"$WORK/logs/build-gpu.log" 2>&1 ||
    { cat "$WORK/logs/build-gpu.log" >&2; fail "kubeslot-builder build of the GPU test image failed"; return 1; }
  gpu_build_driver "$GPU_DRIVER_OLD"
  gpu_build_driver "$GPU_DRIVER_NEW"
  gpu_install_driver "$GPU_DRIVER_OLD"
  gpu_devices add
  check "the outer host's ldconfig -p lists the fake libnvidia-ml" \
    grep -q "libnvidia-ml.so.1 (libc6,x86-64)" <<<"$(outer ldconfig -p)" || return 1

  # --- activate: the host side binds the fake GPU
  [ -s "$WORK/ca.crt" ] || act_setup
  mkdir -p "$OUTER/etc/kubeslot/trust"
  install -m 0644 "$WORK/keys/gpu.pub" "$OUTER/etc/kubeslot/trust/gpu.pub"
  # gpu-driver is ignored: a fake driver has no kernel module
  # (/proc/driver/nvidia/version is the kernel's); the other GPU checks run
  # on the fake devices and the outer's real ldconfig.
  config_json "oci-archive:$archive:gpu" /etc/kubeslot/trust/gpu.pub |
    jq --arg id "$REGISTRY/kubeslot/e2e-gpu" '.gpu = "auto" | .preflight.ignore += ["gpu-driver"] | .trust.identity = $id
      | .gpu_image = .image' >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
  act preflight || true
  got=$(grep -E '^\[[A-Z]+\] gpu-' "$ACT_LOG" | sed 's/;.*//' | paste -sd'|')
  want="[IGNORED] gpu-driver: seen /proc/driver/nvidia/version missing|[PASS] gpu-nvidiactl: seen character device"
  want+="|[PASS] gpu-nvidia-uvm: seen character device"
  want+="|[PASS] gpu-libraries: seen libnvidia-ml.so.1 -> $GPU_HOST_LIB64/libnvidia-ml.so.$GPU_DRIVER_OLD, libcuda.so.1 -> $GPU_HOST_LIB64/libcuda.so.$GPU_DRIVER_OLD"
  want+="|[PASS] gpu-tools: seen nvidia-smi from $GPU_HOST_BIN (bound whole)"
  want+="|[WARN] gpu-persistenced: seen no live process in /run/nvidia-persistenced/nvidia-persistenced.pid"
  want+="|[PASS] gpu-image: seen an NVIDIA GPU device node: gpu_image oci-archive:$archive:gpu"
  check_eq "preflight's GPU checks on the fake driver" "$got" "$want" || { show_log; return 1; }
  before=$(active_machines)
  act activate || { show_log; log_report; fail "activate of the GPU image exited non-zero"; return 1; }
  log_report
  case $before in kube1) m=kube2 ;; *) m=kube1 ;; esac
  check "systemd-nspawn@$m active with the GPU image" unit_active "$m" || return 1
  got=$(grep -E '^(Bind|BindReadOnly)=(/dev/nvidia|.*:/run/host-nvidia)' "$OUTER/etc/systemd/nspawn/$m.nspawn" | paste -sd' ')
  want="Bind=/dev/nvidia-uvm Bind=/dev/nvidia0 Bind=/dev/nvidiactl Bind=/dev/nvidia-caps Bind=/dev/nvidia-caps-imex-channels"
  want+=" BindReadOnly=$GPU_HOST_LIB64:/run/host-nvidia/0 BindReadOnly=$GPU_HOST_LIB64/vdpau:/run/host-nvidia/1"
  want+=" BindReadOnly=$GPU_HOST_LIB32:/run/host-nvidia-i386/0 BindReadOnly=$GPU_HOST_BIN:/run/host-nvidia-bin"
  check_eq "GPU binds in $m.nspawn" "$got" "$want" || return 1
  check "DeviceAllow=char-nvidia-caps in the drop-in" grep -qx 'DeviceAllow=char-nvidia-caps rwm' \
    "$OUTER/etc/systemd/system/systemd-nspawn@$m.service.d/override.conf" || return 1

  # --- inside: links, ldconfig, containerd, CDI
  check_eq "kubeslot-nvidia-setup in $m" "$(gpu_setup_result "$m")" "success active" || { gpu_setup_journal "$m" >&2; return 1; }
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(gpu_in "$m" '
    readlink '"$GPU_LIBDIR"'/libcuda.so.1
    readlink -f '"$GPU_LIBDIR"'/libcuda.so.1
    readlink '"$GPU_LIBDIR"'/vdpau/libvdpau_nvidia.so.1
    test -e '"$GPU_LIBDIR"'/libnvidia-container.so.1 && echo toolkit-lib-linked || echo toolkit-lib-not-linked
    readlink /usr/bin/nvidia-smi
    nvidia-smi' | paste -sd' ')
  want="/run/host-nvidia/0/libcuda.so.1 /run/host-nvidia/0/libcuda.so.$GPU_DRIVER_OLD /run/host-nvidia/1/libvdpau_nvidia.so.1"
  want+=" toolkit-lib-not-linked /run/host-nvidia-bin/nvidia-smi GPU 0: Fake kubeslot e2e GPU (driver $GPU_DRIVER_OLD)"
  check_eq "in $m: links to the host driver, its nvidia-smi" "$got" "$want" || { gpu_setup_journal "$m" >&2; return 1; }
  # (trixie's loader searches /lib/<triplet> first: with the merged /usr,
  # the same directory as /usr/lib/<triplet>)
  got=$(gpu_in "$m" 'ldconfig -p' | grep -E 'lib(cuda|nvidia-ml)\.so\.1 ' |
    sed 's/^[[:space:]]*//; s|=> /lib/|=> /usr/lib/|' | sort | paste -sd';')
  want="libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1;libcuda.so.1 (libc6,x86-64) => $GPU_LIBDIR/libcuda.so.1"
  want+=";libnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1;libnvidia-ml.so.1 (libc6,x86-64) => $GPU_LIBDIR/libnvidia-ml.so.1"
  check_eq "ldconfig -p in $m (64- and 32-bit)" "$got" "$want" || return 1
  got=$(gpu_in "$m" 'cat /run/kubeslot-e2e/nvidia-ctk.args' | paste -sd' ')
  check_eq "nvidia-ctk arguments (recorder)" "$got" \
    "cdi generate --output /etc/cdi/nvidia.yaml --disable-hook all --enable-hook create-symlinks --enable-hook update-ldcache" || return 1
  check "CDI spec written in $m" gpu_in "$m" 'grep -qx "    - path: /dev/nvidia0" /etc/cdi/nvidia.yaml' || return 1
  check "containerd active in $m" outer systemctl -M "$m" is-active --quiet containerd || return 1
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(gpu_in "$m" '
    s=$(systemctl show kubeslot-nvidia-setup -p ExecMainExitTimestampMonotonic --value)
    c=$(systemctl show containerd -p ExecMainStartTimestampMonotonic --value)
    [ "$s" -gt 0 ] && [ "$s" -le "$c" ] && echo before || echo "setup $s containerd $c"')
  check_eq "the setup finished before containerd started" "$got" before || return 1
  # containerd's own view of its merged config (the import of conf.d)
  local dump
  # (containerd 2 writes TOML strings in single quotes)
  dump=$(gpu_in "$m" 'containerd config dump' | tr "'" '"') || { fail "containerd config dump in $m"; return 1; }
  got=$(grep -E '^\s*(enable_cdi|cdi_spec_dirs|default_runtime_name) = ' <<<"$dump" | sed 's/^[[:space:]]*//' | sort | paste -sd';')
  want='cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"];default_runtime_name = "nvidia";enable_cdi = true'
  check_eq "containerd config dump in $m: CDI and the default runtime" "$got" "$want" || { echo "$dump" >&2; return 1; }
  # the nvidia runtime's options table, up to the next blank line
  got=$(awk '/runtimes\.nvidia\.options\]$/ { on = 1; next } on && /^[[:space:]]*$/ { exit } on' <<<"$dump" |
    sed 's/^[[:space:]]*//' | paste -sd';')
  check_eq "containerd config dump in $m: the nvidia runtime" "$got" \
    'BinaryName = "/usr/bin/nvidia-container-runtime";SystemdCgroup = true' || { echo "$dump" >&2; return 1; }

  # --- the host's driver is upgraded under the node: at the next start the
  # binds are rendered again and the setup links the new driver
  gpu_remove_driver "$GPU_DRIVER_OLD"
  gpu_install_driver "$GPU_DRIVER_NEW"
  gpu_restart "$m" || return 1
  check_eq "kubeslot-nvidia-setup after the upgrade" "$(gpu_setup_result "$m")" "success active" || { gpu_setup_journal "$m" >&2; return 1; }
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(gpu_in "$m" '
    readlink -f '"$GPU_LIBDIR"'/libcuda.so.1
    readlink -f /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
    ls -l '"$GPU_LIBDIR"' /usr/lib/i386-linux-gnu '"$GPU_LIBDIR"'/vdpau | grep -c '"$GPU_DRIVER_OLD"' || true
    ldconfig -p | grep -c '"$GPU_DRIVER_OLD"' || true
    nvidia-smi' | paste -sd' ')
  want="/run/host-nvidia/0/libcuda.so.$GPU_DRIVER_NEW /run/host-nvidia-i386/0/libnvidia-ml.so.$GPU_DRIVER_NEW 0 0 GPU 0: Fake kubeslot e2e GPU (driver $GPU_DRIVER_NEW)"
  check_eq "in $m after the upgrade: new driver linked, no link to the old one left" "$got" "$want" || { gpu_setup_journal "$m" >&2; return 1; }

  # --- a broken driver (libnvidia-ml gone): the unit fails and says what
  rm -f "$OUTER$GPU_HOST_LIB64"/libnvidia-ml.so* "$OUTER$GPU_HOST_LIB32"/libnvidia-ml.so*
  outer ldconfig
  gpu_restart "$m" || return 1
  check_eq "kubeslot-nvidia-setup with libnvidia-ml missing" "$(gpu_setup_result "$m")" "exit-code failed" || return 1
  got=$(gpu_setup_journal "$m")
  check "its error names libnvidia-ml.so.1" grep -q 'error: .*libnvidia-ml.so.1 is in none of the host directories' <<<"$got" ||
    { echo "$got" >&2; return 1; }
  check "no CDI spec is left behind" gpu_in "$m" 'test ! -e /etc/cdi/nvidia.yaml' || return 1
  gpu_install_driver "$GPU_DRIVER_NEW"

  # --- the GPU is gone (a host rebooted without it): nothing bound, the
  # unit succeeds and removes the links and the spec of the earlier boot
  gpu_devices remove
  gpu_restart "$m" || return 1
  check_absent "no GPU bind rendered" nvidia "$OUTER/etc/systemd/nspawn/$m.nspawn" || return 1
  check_eq "kubeslot-nvidia-setup without a GPU" "$(gpu_setup_result "$m")" "success active" || return 1
  check "it says there is nothing to set up" grep -q 'no NVIDIA GPU is bound' <<<"$(gpu_setup_journal "$m")" || return 1
  # shellcheck disable=SC2016 # expanded inside the machine
  got=$(gpu_in "$m" '
    find '"$GPU_LIBDIR"' /usr/lib/i386-linux-gnu /usr/bin -maxdepth 2 -lname "/run/host-nvidia*" | wc -l
    test -e /etc/cdi/nvidia.yaml && echo spec || echo no-spec
    ldconfig -p | grep -c "libnvidia-ml" || true' | paste -sd' ')
  check_eq "in $m without a GPU: links, CDI spec, ldconfig entries" "$got" "0 no-spec 0" || return 1
  check "containerd still active in $m" outer systemctl -M "$m" is-active --quiet containerd || return 1
}

# gpu_cdi_injection (after gpu_setup, on its machine): the GPU is back
# (the fake devices, the new driver) and the machine restarted with nspawn's
# own cgroup layout (TEST-ONLY, hybrid_cgroup_dropin: runc needs the v1
# controllers here); a static pod with `nvidia.com/gpu: 1` (hostNetwork: no
# CNI on this outer, which shares this machine's network) gets /dev/nvidia0
# and the driver libraries injected by containerd itself from the CDI spec
# the setup wrote (the TEST-ONLY nvidia-ctk writes it from what the setup
# linked, see its comment); the container lists them. A pod without the
# limit gets neither, though it ran through the default runtime, "nvidia"
# (its TEST-ONLY stand-in models the real one's rule: a container whose
# environment asks for GPUs gets them, any other is passed to runc
# unchanged, and it logs which): the stand-in's log says it passed that
# pod's container unchanged, and the pod's own view (GPU_PROBE) shows no
# GPU device and no driver mount. That view is proven by the other two
# pods, where it shows them: the GPU pod's, and a pod without the limit
# whose environment asks (NVIDIA_VISIBLE_DEVICES=all, as CUDA base images
# set it), which the runtime gives the GPU. The sandbox and container image
# is the test pause image (busybox-static), imported into the node's
# containerd by the test (the GPU test image bakes none).
#
# GPU_PROBE: what a container sees of a GPU, wherever it came from: device
# nodes named /dev/nvidia*, and mounts of driver files (the mount points in
# /proc/self/mountinfo, so it needs no library dir in the image). One line
# per finding, then probe-done. (No single quote: it goes into a YAML
# single-quoted string.)
# shellcheck disable=SC2016 # expanded by the container's shell
GPU_PROBE='for d in /dev/nvidia*; do test -e $d && echo gpu-device $d; done; grep -E "nvidia|libcuda" /proc/self/mountinfo | awk "{ print \"gpu-mount \" \$5 }"; echo probe-done'

# gpu_probe_saw OUTPUT: GPU_PROBE's OUTPUT has /dev/nvidia0 and a mount
# of the driver's libcuda.so.1.
gpu_probe_saw() {
  grep -qx "gpu-device /dev/nvidia0" <<<"$1" && grep -qxF "gpu-mount $GPU_LIBDIR/libcuda.so.1" <<<"$1"
}

# gpu_runtime_said MACHINE POD: the nvidia runtime stand-in's log line for
# POD's container (not its sandbox's), found by the container's id.
gpu_runtime_said() {
  local id
  id=$(in_machine "$1" crictl ps -a -o json |
    jq -r --arg p "$2-e2e-node" '.containers[] | select(.labels["io.kubernetes.pod.name"] == $p) | .id') || return 1
  [ -n "$id" ] || { fail "no container of pod $2 in crictl ps"; return 1; }
  gpu_in "$1" 'cat /run/kubeslot-e2e/nvidia-runtime.log' | grep -F "$id"
}

scenario_gpu_cdi_injection() {
  local m archive=/var/tmp/e2e-pause.oci.tar out
  m=$(running_machine) || return 1
  gpu_devices add
  # (on the template: the render owns the machine's own drop-in dir)
  hybrid_cgroup_dropin systemd-nspawn@.service || return 1
  # (TEST-ONLY, as hand_nspawn's: the kubelet on that cgroup v1 layout)
  gpu_in "$m" 'printf "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n" >/etc/kubernetes/kubelet/config.d/40-allow-cgroup-v1.conf' || return 1
  gpu_restart "$m" || return 1
  check_eq "kubeslot-nvidia-setup with the GPU back" "$(gpu_setup_result "$m")" "success active" || { gpu_setup_journal "$m" >&2; return 1; }
  check "the CDI spec mounts the driver libraries" gpu_in "$m" "grep -q 'containerPath: $GPU_LIBDIR/libcuda.so.1' /etc/cdi/nvidia.yaml" || return 1
  skopeo copy --quiet "oci:$WORK/images/test/layout:pause" "oci-archive:$OUTER$archive:3.10.2" ||
    { fail "skopeo copy of the test pause image"; return 1; }
  outer machinectl copy-to "$m" "$archive" "$archive" || { fail "machinectl copy-to $m"; return 1; }
  gpu_in "$m" "ctr -n k8s.io images import --base-name registry.k8s.io/pause $archive >/dev/null && rm -f $archive" ||
    { fail "import of the pause image into $m"; return 1; }
  cri_manifest "$m" gpu <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: gpu
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: cuda
    image: registry.k8s.io/pause:3.10.2
    command: [sh, -c]
    args: ['ls -l /dev/nvidia0 /dev/nvidiactl; ls $GPU_LIBDIR; $GPU_PROBE; echo gpu-pod-done; trap "exit 0" TERM; sleep 3600 & wait']
    resources:
      limits:
        nvidia.com/gpu: 1
EOF2
  cri_manifest "$m" nogpu <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: nogpu
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: plain
    image: registry.k8s.io/pause:3.10.2
    command: [sh, -c]
    args: ['$GPU_PROBE; echo plain-pod-done; trap "exit 0" TERM; sleep 3600 & wait']
EOF2
  cri_manifest "$m" envgpu <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: envgpu
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: asks
    image: registry.k8s.io/pause:3.10.2
    command: [sh, -c]
    args: ['$GPU_PROBE; echo env-pod-done; trap "exit 0" TERM; sleep 3600 & wait']
    env:
    - {name: NVIDIA_VISIBLE_DEVICES, value: all}
EOF2
  out=$(cri_wait_log "$m" gpu cuda 0 '^gpu-pod-done$' 90) || return 1
  check "the GPU pod sees /dev/nvidia0 (a character device)" grep -Eq '^c.* /dev/nvidia0$' <<<"$out" || { echo "$out" >&2; return 1; }
  check "the GPU pod sees /dev/nvidiactl" grep -Eq '^c.* /dev/nvidiactl$' <<<"$out" || { echo "$out" >&2; return 1; }
  check "the GPU pod has the driver's libcuda.so.1" grep -qx libcuda.so.1 <<<"$out" || { echo "$out" >&2; return 1; }
  check "the GPU pod has the driver's libnvidia-ml.so.1" grep -qx libnvidia-ml.so.1 <<<"$out" || { echo "$out" >&2; return 1; }
  check "not the toolkit's libnvidia-container" test "$(grep -c libnvidia-container <<<"$out")" = 0 || return 1
  check "the probe sees the GPU pod's device and driver mount" gpu_probe_saw "$out" || { echo "$out" >&2; return 1; }
  out=$(cri_wait_log "$m" envgpu asks 0 '^env-pod-done$' 60) || return 1
  check "the runtime gave the pod that asks through its environment the GPU" \
    grep -q ' given /dev/nvidia0 .*(NVIDIA_VISIBLE_DEVICES=all)$' <<<"$(gpu_runtime_said "$m" envgpu)" || return 1
  check "the probe sees the device and driver mount the runtime gave it" gpu_probe_saw "$out" || { echo "$out" >&2; return 1; }
  out=$(cri_wait_log "$m" nogpu plain 0 '^plain-pod-done$' 60) || return 1
  check_eq "what the pod without the limit sees of a GPU (devices, driver mounts)" "$(grep -v plain-pod-done <<<"$out" | paste -sd' ')" probe-done || return 1
  check "the pod without the limit ran through the nvidia runtime, which passed it unchanged" \
    grep -q ' unchanged$' <<<"$(gpu_runtime_said "$m" nogpu)" || return 1
  cri_timings "$m" gpu
}

# gpu_setup_failure_rolls_back (after gpu_setup, whose GPU image runs): the
# GPU image into the idle slot (a config change: one more label) on a host
# whose driver lost libnvidia-ml (the preflight check that sees it ignored,
# as an operator may): the new machine's kubeslot-nvidia-setup fails, its
# containerd (which requires the setup) stays down, and the health gate
# fails with check gpu-setup naming the unit; the old machine runs again,
# and the report's error says why. The driver comes back as soon as the new
# machine's setup has failed, so that the old machine, started again by the
# rollback, sets its GPU up.
scenario_gpu_setup_failure_rolls_back() {
  local archive=/var/tmp/node-gpu.tar before target rc=0 deadline error
  [ -s "$OUTER$archive" ] || { fail "no GPU image in the outer host: gpu_setup runs first"; return 1; }
  before=$(running_machine) || return 1
  target=$(other_machine "$before")
  outer test -e /dev/nvidia0 || gpu_devices add
  gpu_install_driver "$GPU_DRIVER_NEW"
  config_json "oci-archive:$archive:gpu" /etc/kubeslot/trust/gpu.pub |
    jq --arg id "$REGISTRY/kubeslot/e2e-gpu" '.gpu = "auto" | .trust.identity = $id
      | .preflight.ignore += ["gpu-driver", "gpu-libraries"]
      | .kubelet.labels["kubeslot.io/e2e-gpu-try"] = "2" | .gpu_image = .image' >"$OUTER$CONFIG_IN_OUTER.tmp"
  mv "$OUTER$CONFIG_IN_OUTER.tmp" "$OUTER$CONFIG_IN_OUTER"
  rm -f "$OUTER$GPU_HOST_LIB64"/libnvidia-ml.so* "$OUTER$GPU_HOST_LIB32"/libnvidia-ml.so*
  outer ldconfig
  act_bg activate
  # The gate fails the new machine as soon as its setup failed and the
  # rollback stops it at once: the driver comes back when the run says it
  # rolls back (the old machine's setup runs after the new one stopped).
  deadline=$((SECONDS + 120))
  until grep -q '^activate: rollback' "$ACT_LOG" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$ACT_PID" 2>/dev/null; then
      gpu_install_driver "$GPU_DRIVER_NEW"
      wait "$ACT_PID" || true
      show_log
      fail "the run never rolled back"
      return 1
    fi
    sleep 0.05
  done
  gpu_install_driver "$GPU_DRIVER_NEW"
  wait "$ACT_PID" || rc=$?
  log_report
  check_eq "activate exit code (rolled back)" "$rc" 2 || { show_log; return 1; }
  error=$(jq -r .error "$(report_file)")
  check "the report names the gate's gpu-setup check and the unit" \
    grep -q "machine $target: health check gpu-setup failed: kubeslot-nvidia-setup.service failed inside the machine" <<<"$error" ||
    { echo "$error" >&2; return 1; }
  check "$before runs again" unit_active "$before" || return 1
  check "$target is stopped" bash -c "! nsenter -t $OUTER_LEADER -m -u -i -n -p -C -- systemctl is-active --quiet systemd-nspawn@$target.service" || return 1
  check_eq "kubeslot-nvidia-setup in $before after the rollback" "$(gpu_setup_result "$before")" "success active" ||
    { gpu_setup_journal "$before" >&2; return 1; }
}
