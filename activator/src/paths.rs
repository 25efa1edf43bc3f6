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
}
