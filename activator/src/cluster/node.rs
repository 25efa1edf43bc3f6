//! This node's way to the API: which kubeconfig (the configured one, or the
//! node's own), where the files it names lie on the host, and the drain's
//! settings from the config.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Cluster;
use crate::paths::{self, Root};

use super::drain::Settings;
use super::pods::DrainOptions;
use super::{Client, Kubeconfig};

/// The kubeconfig a `cluster` section means, as a host path under `root`:
/// `cluster.kubeconfig`, else the kubelet's own after TLS bootstrap (in the
/// node state every slot binds), else (exec credentials) the rendered one
/// of `machine`.
pub fn kubeconfig_path(root: &Root, cluster: &Cluster, exec: bool, machine: &str) -> PathBuf {
    if let Some(k) = &cluster.kubeconfig {
        return root.join(&k.to_string_lossy());
    }
    if exec {
        return root
            .host_files(machine)
            .join(paths::host_files::EXEC_KUBECONFIG);
    }
    root.join(paths::host::NODE_KUBELET).join("kubeconfig")
}

/// Where a path named in the node's kubeconfig lies on the host: the
/// kubelet's state (`/var/lib/kubelet`) is the node state, the machine's
/// CA and host files are `machine`'s host files; anything else is a host
/// path under `root`.
pub fn host_path(root: &Root, machine: &str, p: &Path) -> PathBuf {
    let inside = [
        (
            paths::machine::KUBELET_STATE,
            root.join(paths::host::NODE_KUBELET),
        ),
        (
            paths::machine::CLIENT_CA,
            root.host_files(machine).join(paths::host_files::CLIENT_CA),
        ),
        (paths::machine::HOST_FILES, root.host_files(machine)),
    ];
    for (at, host) in inside {
        if let Ok(rest) = p.strip_prefix(at) {
            return if rest.as_os_str().is_empty() {
                host
            } else {
                host.join(rest)
            };
        }
    }
    root.join(&p.to_string_lossy())
}

/// [`host_path`] of `p`, its symlinks followed as the machine sees them
/// (8 at most): the kubelet's `kubelet-client-current.pem` links to the
/// dated certificate by its absolute path inside the machine.
pub fn host_path_resolved(root: &Root, machine: &str, p: &Path) -> PathBuf {
    let mut inside = p.to_path_buf();
    for _ in 0..8 {
        let host = host_path(root, machine, &inside);
        match std::fs::read_link(&host) {
            Ok(target) if target.is_absolute() => inside = target,
            Ok(target) => {
                inside = inside
                    .parent()
                    .map_or_else(|| target.clone(), |d| d.join(&target))
            }
            Err(_) => return host,
        }
    }
    host_path(root, machine, &inside)
}

/// A client from the kubeconfig at `path` (read as the node's: see
/// [`host_path_resolved`]).
pub fn client(
    root: &Root,
    machine: &str,
    path: &Path,
    timeout: Duration,
) -> anyhow::Result<Client> {
    let kc = Kubeconfig::load(path, &|p| host_path_resolved(root, machine, p))?;
    Client::new(&kc, timeout)
}

/// The drain's settings from the config.
pub fn drain_settings(cluster: &Cluster) -> Settings {
    Settings {
        options: DrainOptions {
            force: cluster.drain.force,
            delete_emptydir_data: cluster.drain.delete_emptydir_data,
            ..DrainOptions::default()
        },
        timeout: Duration::from_secs(cluster.drain.timeout_secs),
        grace_cap_secs: cluster.drain.pod_grace_cap_secs,
        poll: Duration::from_secs(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_s_kubeconfig_paths_map_to_the_host() {
        let root = Root::new("/r");
        assert_eq!(
            host_path(
                &root,
                "kube2",
                Path::new("/var/lib/kubelet/pki/kubelet-client-current.pem")
            ),
            PathBuf::from("/r/var/lib/kubeslot/node/kubelet/pki/kubelet-client-current.pem")
        );
        assert_eq!(
            host_path(
                &root,
                "kube2",
                Path::new("/etc/kubernetes/pki/apiserver-client-ca.crt")
            ),
            PathBuf::from("/r/etc/kubeslot/host/kube2/apiserver-client-ca.crt")
        );
        assert_eq!(
            host_path(&root, "kube2", Path::new("/etc/ssl/ca.pem")),
            PathBuf::from("/r/etc/ssl/ca.pem")
        );
        let c: Cluster = serde_json::from_value(serde_json::json!({})).unwrap();
        // the kubelet's current certificate: an absolute link inside the
        // machine, to the dated file; a relative one works too
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let pki = root.join("var/lib/kubeslot/node/kubelet/pki");
        std::fs::create_dir_all(&pki).unwrap();
        std::fs::write(pki.join("kubelet-client-2026-12-05.pem"), "x").unwrap();
        std::os::unix::fs::symlink(
            "/var/lib/kubelet/pki/kubelet-client-2026-12-05.pem",
            pki.join("kubelet-client-current.pem"),
        )
        .unwrap();
        std::os::unix::fs::symlink("kubelet-client-current.pem", pki.join("relative.pem")).unwrap();
        for name in ["kubelet-client-current.pem", "relative.pem"] {
            assert_eq!(
                host_path_resolved(
                    &root,
                    "kube1",
                    &Path::new("/var/lib/kubelet/pki").join(name)
                ),
                pki.join("kubelet-client-2026-12-05.pem"),
                "{name}"
            );
        }
        let root = Root::new("/r");
        assert_eq!(
            kubeconfig_path(&root, &c, false, "kube1"),
            PathBuf::from("/r/var/lib/kubeslot/node/kubelet/kubeconfig")
        );
    }
}
