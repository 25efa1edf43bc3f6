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

/// A client from the kubeconfig at `path` (read as the node's: see
/// [`host_path`]).
pub fn client(
    root: &Root,
    machine: &str,
    path: &Path,
    timeout: Duration,
) -> anyhow::Result<Client> {
    let kc = Kubeconfig::load(path, &|p| host_path(root, machine, p))?;
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
        assert_eq!(
            kubeconfig_path(&root, &c, false, "kube1"),
            PathBuf::from("/r/var/lib/kubeslot/node/kubelet/kubeconfig")
        );
    }
}
