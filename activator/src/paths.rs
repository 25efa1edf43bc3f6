//! The root handle and the table of well-known host paths.
//!
//! Every host path the activator touches is built here from a [`Root`] (`/` in
//! production, a temp dir in tests, `--root DIR` for image preparation), so no
//! other module spells out `/etc/...` or `/var/lib/...`, and tests run the
//! real code against a temporary root with no `#[cfg(test)]` switches.

use std::path::{Path, PathBuf};

/// The directory all host paths are relative to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root(PathBuf);

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root(dir.into())
    }

    /// The real host: `/`.
    pub fn host() -> Self {
        Root(PathBuf::from("/"))
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// `rel` (written without a leading `/`) under the root.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// `/etc/kubeslot`: the operator's config, trust keys and credentials
    /// (and the rendered host files under `host/`); removed only by
    /// `uninstall --purge` and the package's purge.
    pub fn config_dir(&self) -> PathBuf {
        self.join("etc/kubeslot")
    }

    /// `/etc/kubeslot/activator.json`, the default config.
    pub fn default_config(&self) -> PathBuf {
        self.join(crate::config::DEFAULT_PATH)
    }

    /// `/var/lib/kubeslot`: content store, state, lock, report.
    pub fn state_dir(&self) -> PathBuf {
        self.join("var/lib/kubeslot")
    }

    /// `/var/lib/kubeslot/blobs`: the content store (`sha256/<hex>`, verified
    /// blobs only).
    pub fn store(&self) -> PathBuf {
        self.state_dir().join("blobs")
    }

    /// `/var/lib/kubeslot/state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir().join("state.json")
    }

    /// `/var/lib/kubeslot/lock`.
    pub fn lock_file(&self) -> PathBuf {
        self.state_dir().join("lock")
    }

    /// `/var/lib/kubeslot/report.json`.
    pub fn report_file(&self) -> PathBuf {
        self.state_dir().join("report.json")
    }

    /// `/var/lib/kubeslot/node`: state bound read-write into whichever slot
    /// runs (`kubelet/`, `containerd/`), so it survives a flip.
    pub fn node_state(&self) -> PathBuf {
        self.state_dir().join("node")
    }

    /// `/var/lib/machines`: the slot trees live here.
    pub fn machines_dir(&self) -> PathBuf {
        self.join("var/lib/machines")
    }

    /// `/var/lib/machines/<machine>`.
    pub fn machine_tree(&self, machine: &str) -> PathBuf {
        self.machines_dir().join(machine)
    }

    /// `/etc/systemd/nspawn/<machine>.nspawn`.
    pub fn nspawn_file(&self, machine: &str) -> PathBuf {
        self.join("etc/systemd/nspawn")
            .join(format!("{machine}.nspawn"))
    }

    /// `/etc/systemd/system/systemd-nspawn@<machine>.service.d/override.conf`.
    pub fn dropin_file(&self, machine: &str) -> PathBuf {
        self.join("etc/systemd/system")
            .join(format!("systemd-nspawn@{machine}.service.d"))
            .join("override.conf")
    }

    /// `/etc/kubeslot/host/<machine>`: host-rendered files bound read-only
    /// into the machine (kubeconfig, CA, kubelet drop-in, resolv.conf).
    pub fn host_files(&self, machine: &str) -> PathBuf {
        self.join("etc/kubeslot/host").join(machine)
    }

    /// `/var/lib/kubeslot/slots/<machine>.json`: the config a slot was
    /// activated with, so `render <machine>` re-renders device binds at every
    /// start without depending on the (possibly newer, possibly broken) config.
    pub fn slot_inputs(&self, machine: &str) -> PathBuf {
        self.state_dir()
            .join("slots")
            .join(format!("{machine}.json"))
    }

    /// `/var/lib/kubeslot/slots/<machine>.tree`: the fingerprint of a slot
    /// tree recorded when it was committed away from, checked by `rollback`.
    /// The per-file record of a copied slot tree as it was installed
    /// (`crate::slots::record`), checked by `rollback`.
    pub fn slot_files_record(&self, machine: &str) -> PathBuf {
        self.state_dir()
            .join("slots")
            .join(format!("{machine}.files"))
    }

    pub fn slot_tree_mark(&self, machine: &str) -> PathBuf {
        self.state_dir()
            .join("slots")
            .join(format!("{machine}.tree"))
    }

    /// `/var/lib/kubeslot/bundles`: the offline bundles' verified private
    /// copies (root only), one directory per bundle list, bound read-only
    /// into the machine instead of `images.bundle_dir`.
    pub fn bundle_copies(&self) -> PathBuf {
        self.state_dir().join("bundles")
    }

    /// `/var/lib/kubeslot/layers`: the layer store of overlay slots, one
    /// directory per verified layer named by its diff_id's hex.
    pub fn layers_dir(&self) -> PathBuf {
        self.state_dir().join("layers")
    }

    /// `/var/lib/kubeslot/slots/<machine>`: an overlay slot's `upper` and
    /// `work` directories (what the running machine wrote).
    pub fn slot_overlay_dir(&self, machine: &str) -> PathBuf {
        self.state_dir().join("slots").join(machine)
    }

    /// `/etc/systemd/system/<escaped machine tree>.mount`: an overlay slot's
    /// mount unit (`var-lib-machines-kube1.mount` on a host).
    pub fn mount_unit_file(&self, machine: &str) -> PathBuf {
        self.systemd_system_dir().join(self.mount_unit(machine))
    }

    /// The name of an overlay slot's mount unit: the machine tree's path,
    /// escaped the way systemd names mount units (`systemd-escape --path`).
    pub fn mount_unit(&self, machine: &str) -> String {
        format!("{}.mount", systemd_escape_path(&self.machine_tree(machine)))
    }

    /// `/var/lib/machines/.kubeslot-staging-<machine>`: where a slot tree is
    /// unpacked before it is renamed into place (same filesystem).
    pub fn machine_staging(&self, machine: &str) -> PathBuf {
        self.machines_dir()
            .join(format!(".kubeslot-staging-{machine}"))
    }

    /// `/dev`: device discovery (GPU nodes, extra devices).
    pub fn dev(&self) -> PathBuf {
        self.join("dev")
    }

    /// `/sys/bus/pci/devices`: the PCI devices (an NVIDIA GPU whose driver
    /// is not loaded has no `/dev` node yet).
    pub fn pci_devices(&self) -> PathBuf {
        self.join("sys/bus/pci/devices")
    }

    /// `/run/systemd/resolve/resolv.conf`: the host's real upstream DNS
    /// servers (systemd-resolved), never the 127.0.0.53 stub.
    pub fn resolved_upstream(&self) -> PathBuf {
        self.join("run/systemd/resolve/resolv.conf")
    }

    /// `/etc/resolv.conf`: the host's resolver file, used when it does not
    /// point at the resolved stub.
    pub fn etc_resolv_conf(&self) -> PathBuf {
        self.join("etc/resolv.conf")
    }

    /// `/sbin/ldconfig`: run as `ldconfig -p` to find the NVIDIA driver
    /// libraries (a process boundary; its output is parsed by `gpu`).
    pub fn ldconfig(&self) -> PathBuf {
        self.join("sbin/ldconfig")
    }

    /// `/lib/modules`: kernel modules, bound read-only into the machine when
    /// the host has them (a bind of a missing source stops nspawn).
    pub fn lib_modules(&self) -> PathBuf {
        self.join(host::LIB_MODULES)
    }

    /// `/etc/hostname`: the default node name.
    pub fn etc_hostname(&self) -> PathBuf {
        self.join("etc/hostname")
    }

    /// `/proc/sys/kernel/hostname`: the kernel's (possibly transient) host
    /// name, the node name of last resort when `/etc/hostname` is missing.
    pub fn kernel_hostname(&self) -> PathBuf {
        self.join("proc/sys/kernel/hostname")
    }

    /// `/etc/systemd/system/kubeslot-render@.service`: the oneshot that
    /// re-renders a machine's host files before every start.
    pub fn render_unit(&self) -> PathBuf {
        self.join("etc/systemd/system").join(RENDER_UNIT)
    }

    /// `/etc/systemd/system`: where a change means `daemon-reload`.
    pub fn systemd_system_dir(&self) -> PathBuf {
        self.join("etc/systemd/system")
    }

    /// `/etc/systemd/system/machines.target.wants/systemd-nspawn@<machine>.service`:
    /// the link `systemctl enable` (and `machinectl enable`) makes, so the
    /// machine starts at boot.
    pub fn machine_wants_link(&self, machine: &str) -> PathBuf {
        self.systemd_system_dir()
            .join("machines.target.wants")
            .join(format!("systemd-nspawn@{machine}.service"))
    }

    /// `/etc/sysctl.d/99-kubeslot.conf`: the kernel settings the node needs
    /// (after `99-kubernetes.conf` of unbounded-agent hosts, so ours win).
    pub fn sysctl_dropin(&self) -> PathBuf {
        self.join("etc/sysctl.d/99-kubeslot.conf")
    }

    /// `/etc/modules-load.d/kubeslot.conf`: the kernel modules the node needs.
    pub fn modules_load_dropin(&self) -> PathBuf {
        self.join("etc/modules-load.d/kubeslot.conf")
    }

    /// `/lib/systemd/systemd-sysctl`: run with kubeslot's drop-in as its
    /// one argument, it applies that file alone (a process boundary; `/lib`
    /// is `/usr/lib` on merged-/usr hosts).
    pub fn systemd_sysctl(&self) -> PathBuf {
        self.join("lib/systemd/systemd-sysctl")
    }

    /// `/lib/systemd/systemd-modules-load`: the same for the modules file.
    pub fn systemd_modules_load(&self) -> PathBuf {
        self.join("lib/systemd/systemd-modules-load")
    }

    /// `/proc/sys/<key with dots as slashes>`: a sysctl's current value.
    pub fn proc_sys(&self, key: &str) -> PathBuf {
        self.join("proc/sys").join(key.replace('.', "/"))
    }

    /// `/proc/<name>` (`swaps`, `modules`, `filesystems`, ...).
    pub fn proc(&self, name: &str) -> PathBuf {
        self.join("proc").join(name)
    }

    /// `/sys/module/<name>`: present for a loaded module (and for a
    /// built-in one with parameters).
    pub fn sys_module(&self, name: &str) -> PathBuf {
        self.join("sys/module").join(name)
    }

    /// `/sys/fs/cgroup`: the cgroup v2 mount on a unified host.
    pub fn cgroup_fs(&self) -> PathBuf {
        self.join("sys/fs/cgroup")
    }

    /// `/lib/modules/<release>`: the modules a kernel can load.
    pub fn kernel_modules(&self, release: &str) -> PathBuf {
        self.lib_modules().join(release)
    }

    /// `/run/systemd/system`: exists when systemd is the init system.
    pub fn systemd_running_marker(&self) -> PathBuf {
        self.join("run/systemd/system")
    }

    /// `/var/lib/dpkg/status`: installed package versions on Debian-family
    /// hosts.
    pub fn dpkg_status(&self) -> PathBuf {
        self.join("var/lib/dpkg/status")
    }

    /// `/etc/unbounded/agent/<machine>-applied-config.json`: what
    /// unbounded-agent last applied to its machine (read by `adopt`).
    pub fn unbounded_applied_config(&self, machine: &str) -> PathBuf {
        self.join("etc/unbounded/agent")
            .join(format!("{machine}-applied-config.json"))
    }
}

/// Makes `dir` a directory only root enters: created 0700, and so is
/// every missing parent it needs (a fresh root's `/var/lib/kubeslot`, made
/// on the way to the layer store, is private from the start, never 0755
/// for a moment), an existing one narrowed to 0700 (an earlier version
/// made the state dir, the layer store and the slot dirs 0755, and
/// `create_dir` leaves what exists as it is). A symlink there is refused,
/// not followed.
pub fn private_dir(dir: &Path) -> Result<(), kubeslot_image::atomic::AtomicError> {
    use rustix::fs::{Mode, OFlags};
    let err = |source: std::io::Error| kubeslot_image::atomic::AtomicError {
        path: dir.to_path_buf(),
        source,
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if std::fs::symlink_metadata(parent).is_err() {
            private_dir(parent)?;
        }
    }
    kubeslot_image::atomic::create_dir(dir, 0o700)?;
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err(e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?;
    if st.st_mode & 0o7777 != 0o700 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| err(e.into()))?;
    }
    Ok(())
}

/// Paths of the unbounded-agent parity work (issue 28).
impl Root {
    /// `/etc/kubeslot/default-kubelet`: the operator's (or an adopted
    /// node's) `KUBELET_EXTRA_ARGS`, in `/etc/default/kubelet` syntax.
    pub fn kubelet_extra_args(&self) -> PathBuf {
        self.join("etc/kubeslot/default-kubelet")
    }

    /// `/etc/systemd/system/run-bpffs-<machine>.mount`: the machine's
    /// private BPF filesystem, which its drop-in requires.
    pub fn bpffs_mount_unit_file(&self, machine: &str) -> PathBuf {
        self.systemd_system_dir().join(bpffs_mount_unit(machine))
    }

    /// `/var/lib/kubeslot/host-network.json`: the links and routing tables
    /// the host had before its first node ran (`uninstall` never removes
    /// them).
    pub fn host_network_record(&self) -> PathBuf {
        self.state_dir().join("host-network.json")
    }

    /// `/sys/class/net`: the network links of the namespace the activator
    /// runs in.
    pub fn net_links(&self) -> PathBuf {
        self.join("sys/class/net")
    }

    /// `/proc/sys/kernel/random/boot_id`: which boot a report belongs to.
    pub fn boot_id(&self) -> PathBuf {
        self.join("proc/sys/kernel/random/boot_id")
    }
}

/// The host directory of a machine's private BPF filesystem
/// (`/run/bpffs/<machine>`, bound at `/sys/fs/bpf`).
pub fn bpffs_dir(machine: &str) -> String {
    format!("/run/bpffs/{machine}")
}

/// The mount unit of [`bpffs_dir`] (`run-bpffs-kube1.mount`).
pub fn bpffs_mount_unit(machine: &str) -> String {
    format!(
        "{}.mount",
        systemd_escape_path(Path::new(&bpffs_dir(machine)))
    )
}

/// Absolute host paths as they appear *inside rendered files* (the `.nspawn`
/// file and drop-ins name real host paths, whatever root we write them under).
pub mod host {
    /// Kernel modules, bound read-only into every machine.
    pub const LIB_MODULES: &str = "/lib/modules";
    /// The host-rendered files of a machine (`<dir>/<machine>`).
    pub const HOST_FILES_DIR: &str = "/etc/kubeslot/host";
    /// Node state kept across flips, bound read-write.
    pub const NODE_KUBELET: &str = "/var/lib/kubeslot/node/kubelet";
    pub const NODE_CONTAINERD: &str = "/var/lib/kubeslot/node/containerd";
    /// Where `machinectl` lives (the drop-in's `ExecStartPre=`).
    pub const MACHINECTL: &str = "/usr/bin/machinectl";
    /// Where the activator binary is installed (units call it; the Debian
    /// package puts it there).
    pub const ACTIVATOR_BIN: &str = "/usr/bin/kubeslot-activator";
    /// Where the NVIDIA GPU operator mounts its driver container's root
    /// (the driver's libraries and tools, in no cache of the host's).
    pub const OPERATOR_DRIVER_ROOT: &str = "/run/nvidia/driver";
    /// The distribution's program directory (of the host, or of a driver
    /// tree): where the driver's tools are looked for last.
    pub const DISTRO_BIN: &str = "/usr/bin";
    /// Program directories never bound into a machine whole (of the host,
    /// or of a driver tree): the node would get every program in them.
    pub const SYSTEM_BIN_DIRS: &[&str] = &[
        "/bin",
        "/sbin",
        "/usr/bin",
        "/usr/sbin",
        "/usr/local/bin",
        "/usr/local/sbin",
    ];
}

/// `systemd-escape --path`: `/` separators become `-`, every byte outside
/// `[A-Za-z0-9:_.]` (and a leading `.`) becomes `\xNN`.
fn systemd_escape_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = path.as_os_str().as_bytes();
    let parts: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    if parts.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, &b) in part.iter().enumerate() {
            let plain = b.is_ascii_alphanumeric()
                || b == b':'
                || b == b'_'
                || (b == b'.' && !(i == 0 && j == 0));
            if plain {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}

/// The template unit file name of the render oneshot.
pub const RENDER_UNIT: &str = "kubeslot-render@.service";

/// The render oneshot's instance for a machine (`kubeslot-render@kube1.service`).
pub fn render_unit_instance(machine: &str) -> String {
    format!("kubeslot-render@{machine}.service")
}

/// File names inside a machine's host-files dir (`/etc/kubeslot/host/<machine>/`).
pub mod host_files {
    /// A kubeconfig with the bootstrap token (TLS bootstrap), mode 0600.
    pub const BOOTSTRAP_KUBECONFIG: &str = "bootstrap-kubeconfig";
    /// A kubeconfig with an exec credential plugin, mode 0600.
    pub const EXEC_KUBECONFIG: &str = "kubeconfig";
    /// The cluster CA certificate.
    pub const CLIENT_CA: &str = "apiserver-client-ca.crt";
    /// The kubelet.service drop-in (node name, node IP, labels, taints,
    /// kubeconfigs).
    pub const KUBELET_DROPIN: &str = "20-kubeslot.conf";
    /// The kubelet config drop-in (`--config-dir`): cluster DNS and domain,
    /// resolv.conf, serving certificate mode, `kubelet.config`.
    pub const KUBELET_CONFIG: &str = "kubelet-config.conf";
    /// containerd's registry host dirs (`<host>/hosts.toml`, `<host>/ca.crt`).
    pub const CERTS_D: &str = "certs.d";
    pub const RESOLV_CONF: &str = "resolv.conf";
    pub const HOSTNAME: &str = "hostname";
    /// The kubelet's environment file (`KUBELET_EXTRA_ARGS` only).
    pub const KUBELET_DEFAULTS: &str = "default-kubelet";
    /// containerd's drop-in (sandbox image, metrics address), when the
    /// config sets any.
    pub const CONTAINERD_DROPIN: &str = "containerd.toml";
    /// The offline bundle's images for the import unit: one
    /// `NAME DIGEST FILE` line each.
    pub const BUNDLE_LIST: &str = "bundle-images";
    /// The egress proxy's environment, a drop-in for containerd.service and
    /// kubelet.service (when the config names a proxy).
    pub const PROXY_DROPIN: &str = "proxy.conf";
    /// The proxy's CA (`ca.crt`), for `SSL_CERT_DIR` (when `proxy.ca`).
    pub const PROXY_CA_DIR: &str = "proxy-ca";
}

/// Paths inside a node machine (the targets of binds).
pub mod machine {
    /// The host files dir appears here, read-only.
    pub const HOST_FILES: &str = "/etc/kubeslot/host";
    pub const RESOLV_CONF: &str = "/etc/resolv.conf";
    pub const HOSTNAME: &str = "/etc/hostname";
    pub const CLIENT_CA: &str = "/etc/kubernetes/pki/apiserver-client-ca.crt";
    pub const KUBELET_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/20-kubeslot.conf";
    /// The image's kubelet reads drop-ins from `--config-dir` (this file's
    /// directory); ours sorts after the image's own `1x-`/`4x-` ones.
    pub const KUBELET_CONFIG_DROPIN: &str = "/etc/kubernetes/kubelet/config.d/50-kubeslot.conf";
    /// containerd's `config_path` (the image's config.toml names it).
    pub const CERTS_D: &str = "/etc/containerd/certs.d";
    pub const KUBELET_STATE: &str = "/var/lib/kubelet";
    pub const CONTAINERD_STATE: &str = "/var/lib/containerd";
    /// NVIDIA library directories are bound at `<this>/<i>` (the NVIDIA
    /// image's `kubeslot-nvidia-setup` links their libraries from there).
    pub const HOST_NVIDIA: &str = "/run/host-nvidia";
    /// 32-bit (i386) NVIDIA library directories of amd64 hosts, at `<this>/<i>`.
    pub const HOST_NVIDIA_I386: &str = "/run/host-nvidia-i386";
    /// The driver's tools (`nvidia-smi`, ...): the driver's own `bin`
    /// directory bound here whole, or each tool at `<this>/<name>`.
    pub const HOST_NVIDIA_BIN: &str = "/run/host-nvidia-bin";
    /// The kubelet's own kubeconfig, written by TLS bootstrap into its state.
    pub const KUBELET_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
    /// The kubelet unit's environment file (the unbounded agent's path).
    pub const KUBELET_DEFAULTS: &str = "/etc/default/kubelet";
    /// containerd's drop-in dir entry for the host's settings.
    pub const CONTAINERD_DROPIN: &str = "/etc/containerd/conf.d/50-kubeslot.toml";
    /// The egress proxy's environment for containerd.service.
    pub const CONTAINERD_PROXY_DROPIN: &str =
        "/etc/systemd/system/containerd.service.d/50-kubeslot-proxy.conf";
    /// The egress proxy's environment for kubelet.service.
    pub const KUBELET_PROXY_DROPIN: &str =
        "/etc/systemd/system/kubelet.service.d/50-kubeslot-proxy.conf";
    /// The offline bundle's archives (a verified private copy of the
    /// host's `images.bundle_dir`, `/var/lib/kubeslot/bundles/<key>`).
    pub const BUNDLE_DIR: &str = "/etc/kubeslot/bundle";
    /// The machine's private BPF filesystem.
    pub const BPFFS: &str = "/sys/fs/bpf";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        let r = Root::new("/tmp/r");
        assert_eq!(r.store(), Path::new("/tmp/r/var/lib/kubeslot/blobs"));
        assert_eq!(
            r.dropin_file("kube1"),
            Path::new("/tmp/r/etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf")
        );
        assert_eq!(
            Root::host().nspawn_file("kube2"),
            Path::new("/etc/systemd/nspawn/kube2.nspawn")
        );
    }

    #[test]
    fn mount_units_are_named_like_systemd_escape_path() {
        assert_eq!(
            Root::host().mount_unit("kube1"),
            "var-lib-machines-kube1.mount"
        );
        assert_eq!(systemd_escape_path(Path::new("/.a")), "\\x2ea");
        assert_eq!(
            systemd_escape_path(Path::new("/tmp/.x-y/a b/")),
            "tmp-.x\\x2dy-a\\x20b"
        );
    }
}
