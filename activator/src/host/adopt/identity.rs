//! The adopted node's kubelet identity carried into the node state: the
//! kubelet's `pki/` (regular files and links, nothing else) and, with a
//! bootstrap token, a kubeconfig for its client certificate, read from the
//! adopted tree through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! with capped sizes (the tree is another tool's and was never verified),
//! written beside the node state and renamed in.
//!
//! The kubeconfig the adopted kubelet wrote is not copied: its `server`,
//! CA, `exec` or auth provider would come from that untrusted tree and
//! every later kubelet would use them. Only its `client-certificate` and
//! `client-key` are taken, and only when they name a file of the copied
//! `pki/`; the kubeconfig is rebuilt around them from the config (its API
//! server, the cluster CA the host binds into every slot).

use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use crate::paths::Root;
use crate::slot::Slot;

use super::{AdoptError, Identity};

/// Caps for what is read from the adopted (unverified) tree.
const MAX_IDENTITY_FILE: u64 = 1 << 20;
const MAX_PKI_ENTRIES: usize = 256;

/// One entry of the adopted `pki/` directory.
enum PkiEntry {
    File { bytes: Vec<u8>, mode: u32 },
    Link(std::ffi::OsString),
}

/// Opens `rel` under `tree` without leaving it and without following any
/// symlink on the way (the tree is another tool's, written by a node that
/// is root in its machine). `None` when it does not exist.
fn open_beneath(
    tree: &rustix::fd::OwnedFd,
    rel: &str,
    flags: rustix::fs::OFlags,
) -> Result<Option<rustix::fd::OwnedFd>, rustix::io::Errno> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    match rustix::fs::openat2(
        tree,
        rel,
        flags | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why reading the adopted tree stopped at `path`.
fn refused(path: &Path, e: rustix::io::Errno) -> AdoptError {
    AdoptError::Identity {
        path: path.to_path_buf(),
        reason: if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::XDEV {
            "a symlink on the way, or a path leading out of the tree: not followed".into()
        } else {
            e.to_string()
        },
    }
}

/// The adopted tree's directory, opened without following a link.
fn open_tree(tree: &Path) -> Result<rustix::fd::OwnedFd, AdoptError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        tree,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| refused(tree, e))
}

/// The file `rel` of `machine`'s adopted tree, read as the identity is
/// (beneath the tree, no link followed, capped); `None` when it is absent.
pub(super) fn read_tree_file(
    root: &Root,
    machine: Slot,
    rel: &str,
) -> Result<Option<Vec<u8>>, AdoptError> {
    let tree_path = root.machine_tree(machine.machine());
    let path = tree_path.join(rel);
    let tree = open_tree(&tree_path)?;
    match open_beneath(&tree, rel, rustix::fs::OFlags::empty()).map_err(|e| refused(&path, e))? {
        Some(fd) => Ok(Some(read_capped(fd, &path)?)),
        None => Ok(None),
    }
}

fn read_capped(fd: rustix::fd::OwnedFd, what: &Path) -> Result<Vec<u8>, AdoptError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_IDENTITY_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| AdoptError::Identity {
            path: what.to_path_buf(),
            reason: e.to_string(),
        })?;
    if bytes.len() as u64 > MAX_IDENTITY_FILE {
        return Err(AdoptError::Identity {
            path: what.to_path_buf(),
            reason: format!("larger than {MAX_IDENTITY_FILE} bytes"),
        });
    }
    Ok(bytes)
}

/// Copies the adopted node's kubelet identity into the node state (see the
/// module doc): `pki/` as a whole (regular files and links, nothing else),
/// and with a bootstrap token the kubeconfig the kubelet wrote, when it
/// names a certificate in `pki/`. An existing `pki/` in the node state is
/// kept. With `dry_run` only says what it would copy.
pub(super) fn carry_identity(
    root: &Root,
    machine: Slot,
    server: Option<&str>,
    dry_run: bool,
) -> Result<Identity, AdoptError> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let node = root.node_state().join("kubelet");
    let dest = node.join("pki");
    if std::fs::symlink_metadata(&dest).is_ok() {
        return Ok(Identity::Kept(
            Root::host().node_state().join("kubelet/pki"),
        ));
    }
    let tree_path = root.machine_tree(machine.machine());
    let pki_path = tree_path.join("var/lib/kubelet/pki");
    let tree = open_tree(&tree_path)?;
    let Some(pki) = open_beneath(&tree, "var/lib/kubelet/pki", OFlags::DIRECTORY)
        .map_err(|e| refused(&pki_path, e))?
    else {
        return Ok(Identity::Absent);
    };
    let mut entries: Vec<(std::ffi::OsString, PkiEntry)> = Vec::new();
    let dir = rustix::fs::Dir::read_from(&pki).map_err(|e| refused(&pki_path, e))?;
    for entry in dir {
        let entry = entry.map_err(|e| refused(&pki_path, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if entries.len() >= MAX_PKI_ENTRIES {
            return Err(AdoptError::Identity {
                path: pki_path,
                reason: format!("more than {MAX_PKI_ENTRIES} entries"),
            });
        }
        let os = std::ffi::OsStr::from_bytes(name).to_os_string();
        let path = pki_path.join(&os);
        let st = rustix::fs::statat(&pki, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| refused(&path, e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(&pki, entry.file_name(), Vec::new())
                    .map_err(|e| refused(&path, e))?;
                let target = std::ffi::OsStr::from_bytes(target.to_bytes()).to_os_string();
                entries.push((os, PkiEntry::Link(target)));
            }
            FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    &pki,
                    entry.file_name(),
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|e| refused(&path, e))?;
                let bytes = read_capped(fd, &path)?;
                entries.push((
                    os,
                    PkiEntry::File {
                        bytes,
                        mode: st.st_mode & 0o777,
                    },
                ));
            }
            // devices, fifos, sockets, directories: nothing a kubelet keeps there
            _ => {}
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let kubeconfig_path = tree_path.join("var/lib/kubelet/kubeconfig");
    let kubeconfig = match server {
        Some(server) if std::fs::symlink_metadata(node.join("kubeconfig")).is_err() => {
            match open_beneath(&tree, "var/lib/kubelet/kubeconfig", OFlags::empty())
                .map_err(|e| refused(&kubeconfig_path, e))?
            {
                // only one the kubelet wrote after bootstrapping (it names
                // its certificate in pki/): rebuilt around that alone
                Some(fd) => {
                    let adopted = read_capped(fd, &kubeconfig_path)?;
                    client_files(&String::from_utf8_lossy(&adopted), &entries)
                        .map(|(cert, key)| rebuilt_kubeconfig(server, &cert, key.as_deref()))
                }
                None => None,
            }
        }
        _ => None,
    };
    let names: Vec<String> = entries
        .iter()
        .map(|(n, _)| n.to_string_lossy().into_owned())
        .collect();
    if !dry_run {
        write_identity(&node, &dest, &entries, kubeconfig.as_deref())?;
    }
    Ok(Identity::Carried {
        pki: names,
        kubeconfig: kubeconfig.is_some(),
    })
}

/// Where the kubelet's state is in a machine: what a carried kubeconfig's
/// client files must be in (`pki/<name>`).
const PKI_IN_MACHINE: &str = "/var/lib/kubelet/pki/";

/// The `client-certificate` and (if any) `client-key` of an adopted
/// kubeconfig, when each is one file of the copied `pki/` (a plain name
/// under [`PKI_IN_MACHINE`]) and the kubeconfig names no other; else
/// `None` (nothing carried: the kubelet bootstraps again).
fn client_files(
    kubeconfig: &str,
    pki: &[(std::ffi::OsString, PkiEntry)],
) -> Option<(String, Option<String>)> {
    let values = |key: &str| -> Vec<String> {
        kubeconfig
            .lines()
            .filter_map(|l| {
                let l = l.trim().trim_start_matches('"');
                let rest = l.strip_prefix(key)?.trim_start_matches('"').trim_start();
                let value = rest.strip_prefix(':')?.trim().trim_end_matches(',');
                Some(value.trim_matches(|c| c == '"' || c == '\'').to_string())
            })
            .collect()
    };
    let in_pki = |path: &str| {
        let name = path.strip_prefix(PKI_IN_MACHINE)?;
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        (plain && pki.iter().any(|(n, _)| n.as_bytes() == name.as_bytes()))
            .then(|| path.to_string())
    };
    let one = |key: &str| -> Option<Option<String>> {
        match values(key).as_slice() {
            [] => Some(None),
            [v] => in_pki(v).map(Some),
            _ => None,
        }
    };
    let cert = one("client-certificate")??;
    let key = one("client-key")?;
    Some((cert, key))
}

/// A kubeconfig for the kubelet's client certificate, from the config's
/// API server and the cluster CA the host binds into every slot.
fn rebuilt_kubeconfig(server: &str, cert: &str, key: Option<&str>) -> Vec<u8> {
    let quoted = serde_json::to_string(server).expect("a string");
    let ca = crate::paths::machine::CLIENT_CA;
    let mut s = format!(
        "# Rebuilt by kubeslot-activator adopt: the API server and CA of the config,\n\
         # the adopted kubelet's client certificate; nothing else of the adopted one.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: kubeslot\n\
         \x20 cluster:\n\
         \x20   server: {quoted}\n\
         \x20   certificate-authority: {ca}\n\
         contexts:\n\
         - name: kubeslot\n\
         \x20 context:\n\
         \x20   cluster: kubeslot\n\
         \x20   user: kubelet\n\
         current-context: kubeslot\n\
         users:\n\
         - name: kubelet\n\
         \x20 user:\n\
         \x20   client-certificate: {cert}\n"
    );
    if let Some(key) = key {
        s.push_str(&format!("    client-key: {key}\n"));
    }
    s.into_bytes()
}

/// Puts the copied identity in place: `pki/` built beside it and renamed
/// in (a crash leaves no half `pki/`), the kubeconfig atomically, 0600.
fn write_identity(
    node: &Path,
    dest: &Path,
    entries: &[(std::ffi::OsString, PkiEntry)],
    kubeconfig: Option<&[u8]>,
) -> Result<(), AdoptError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| AdoptError::Write {
            path: path.clone(),
            reason: e.to_string(),
        }
    };
    let atomic = |path: &Path| {
        let path = path.to_path_buf();
        move |e: kubeslot_image::atomic::AtomicError| AdoptError::Write {
            path: path.clone(),
            reason: kubeslot_image::error_chain(&e),
        }
    };
    kubeslot_image::atomic::create_dir(node, 0o700).map_err(atomic(node))?;
    let tmp = node.join(".pki.adopt");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    kubeslot_image::atomic::create_dir(&tmp, 0o700).map_err(atomic(&tmp))?;
    for (name, entry) in entries {
        let path = tmp.join(name);
        match entry {
            PkiEntry::Link(target) => {
                std::os::unix::fs::symlink(target, &path).map_err(io(&path))?
            }
            PkiEntry::File { bytes, mode } => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(*mode)
                    .open(&path)
                    .map_err(io(&path))?;
                f.write_all(bytes).map_err(io(&path))?;
                f.set_permissions(std::fs::Permissions::from_mode(*mode))
                    .map_err(io(&path))?;
                f.sync_all().map_err(io(&path))?;
            }
        }
    }
    kubeslot_image::atomic::sync_dir(&tmp).map_err(atomic(&tmp))?;
    std::fs::rename(&tmp, dest).map_err(io(dest))?;
    kubeslot_image::atomic::sync_dir(node).map_err(atomic(node))?;
    if let Some(k) = kubeconfig {
        let path = node.join("kubeconfig");
        kubeslot_image::atomic::write_file_mode(&path, k, 0o600).map_err(atomic(&path))?;
    }
    Ok(())
}
