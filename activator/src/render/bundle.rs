//! Offline image bundles (config `images`): container images an
//! air-gapped host hands its node as OCI archives in a host directory,
//! so that kube-proxy, the CNI's images or anything else a cluster needs
//! before its registry is reachable start without one.
//!
//! Owns the check of each listed archive against the config, before the
//! machine that imports it starts ([`verify`], called by `render::gather`
//! at every render): the archive is read with the same code as an
//! `oci-archive:` node image (`kubeslot_image::archive::scan`: header
//! caps, only layout names), every blob in it must hash to its name, its
//! `index.json` must name the configured image at the configured digest
//! (`io.containerd.image.name`, or `org.opencontainers.image.ref.name` as
//! a full reference: how `ctr images import` names what it imports), and
//! that image must have a manifest for this host's platform whose config
//! and layers are all in the archive. [`list`] is the host file the
//! node's import unit reads (`NAME DIGEST FILE` per line).
//!
//! The directory is bound read-only into the machine and the image's
//! `kubeslot-images.service` imports from it into containerd's `k8s.io`
//! namespace before the kubelet starts. Writes nothing but a scratch
//! directory (removed) for the archive's `index.json`.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use kubeslot_image::archive::{self, ReadAt};
use kubeslot_image::digest::HashingReader;
use kubeslot_image::oci::{Descriptor, Index, Manifest, Platform, ANNOTATION_REF_NAME};

use crate::config::{BundleImage, Images};
use crate::paths::Root;

/// The annotation containerd's importer names an image by first.
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Documents (index, manifests) read from an archive are capped.
const MAX_DOCUMENT: u64 = 4 * 1024 * 1024;

/// Why a bundle image was refused; names the archive and the rule.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("images.bundle {file} ({name}): {reason}")]
    Image {
        file: PathBuf,
        name: String,
        reason: String,
    },
    #[error("images.bundle {file} ({name}): {source}")]
    Archive {
        file: PathBuf,
        name: String,
        #[source]
        source: Box<archive::ArchiveError>,
    },
}

/// Checks every image of `images` (see the module doc); the paths in
/// errors are the host's.
pub fn verify(root: &Root, images: &Images) -> Result<(), BundleError> {
    let Some(dir) = &images.bundle_dir else {
        return Ok(());
    };
    trusted_dir(root, dir)?;
    for b in &images.bundle {
        let shown = dir.join(&b.file);
        // what else the config lists in the same archive
        let listed: Vec<&BundleImage> = images.bundle.iter().filter(|o| o.file == b.file).collect();
        verify_one(&root.join(&shown.to_string_lossy()), &shown, b, &listed)?;
    }
    Ok(())
}

/// Why a path on the way to an archive cannot be trusted: not root's, or
/// writable by its group or others (who could swap the archive after it
/// was verified: the machine imports it from the bound directory later);
/// `None` when it is fine.
fn untrusted(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    if meta.uid() != 0 {
        return Some(format!("owned by uid {}, not root", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "mode {:04o}: writable by its group or others",
            meta.mode() & 0o7777
        ));
    }
    None
}

/// `bundle_dir` and each directory above it (below the root handle's
/// top): root's, and writable by nobody else.
fn trusted_dir(root: &Root, dir: &Path) -> Result<(), BundleError> {
    let mut at = PathBuf::from("/");
    for c in dir.components().skip(1) {
        at.push(c);
        let refuse = |reason: String| {
            BundleError::Image {
            file: dir.to_path_buf(),
            name: "images.bundle_dir".into(),
            reason: format!("{}: {reason}; make it root's and mode 0755 or narrower (chown root:root, chmod go-w)", at.display()),
        }
        };
        let meta = std::fs::symlink_metadata(root.join(&at.to_string_lossy()))
            .map_err(|e| refuse(format!("cannot read: {e}")))?;
        if !meta.is_dir() {
            return Err(refuse("not a directory".into()));
        }
        if let Some(why) = untrusted(&meta) {
            return Err(refuse(why));
        }
    }
    Ok(())
}

/// Refuses an index entry of the archive that the config does not list
/// (for this file) by its name and digest: the import unit imports every
/// named entry, so a second name in the archive (`registry.k8s.io/pause`)
/// would replace an image containerd already has.
fn only_listed(index: &Index, listed: &[&BundleImage]) -> Result<(), String> {
    for d in &index.manifests {
        let ns = names(d);
        let ok = listed
            .iter()
            .any(|b| b.digest == d.digest && ns.iter().all(|n| *n == b.name));
        if !ok {
            return Err(format!(
                "index.json also holds {} {}, which the config does not list for this archive with that digest; containerd would import it too (every entry must be listed in images.bundle with its name and digest)",
                if ns.is_empty() {
                    "an unnamed image".to_string()
                } else {
                    ns.join("/")
                },
                d.digest
            ));
        }
    }
    Ok(())
}

/// The archive itself: a regular file (a link could point anywhere on the
/// host; the bind shows the node the file, so the file itself must be what
/// is checked), root's and writable by nobody else.
fn archive_file(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => match untrusted(&m) {
            Some(why) => Err(format!(
                "{why}; make it root's and mode 0644 or narrower (chown root:root, chmod go-w)"
            )),
            None => Ok(()),
        },
        Ok(_) => Err("not a regular file".into()),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

fn verify_one(
    path: &Path,
    shown: &Path,
    b: &BundleImage,
    listed: &[&BundleImage],
) -> Result<(), BundleError> {
    let refuse = |reason: String| BundleError::Image {
        file: shown.to_path_buf(),
        name: b.name.clone(),
        reason,
    };
    archive_file(path).map_err(refuse)?;
    let scratch = tempfile::tempdir().map_err(|e| refuse(format!("scratch dir: {e}")))?;
    let (layout, members, file) =
        archive::scan(path, scratch.path()).map_err(|source| BundleError::Archive {
            file: shown.to_path_buf(),
            name: b.name.clone(),
            source: Box::new(source),
        })?;
    let index = layout
        .index()
        .map_err(|e| refuse(format!("index.json: {e}")))?;
    let Some(entry) = index.manifests.iter().find(|d| d.digest == b.digest) else {
        let found: Vec<String> = index
            .manifests
            .iter()
            .map(|d| format!("{} {}", names(d).join("/"), d.digest))
            .collect();
        return Err(refuse(format!(
            "index.json names no image of digest {} (it has: {})",
            b.digest,
            if found.is_empty() {
                "nothing".into()
            } else {
                found.join(", ")
            }
        )));
    };
    if !names(entry).iter().any(|n| n == &b.name) {
        return Err(refuse(format!(
            "index.json's entry for {} is not named {} (annotations {ANNOTATION_CONTAINERD_NAME} or {ANNOTATION_REF_NAME}: {}); containerd would import it under another name (`ctr images export` and kubeslot-builder's image archives write {ANNOTATION_CONTAINERD_NAME}; `skopeo copy ... oci-archive:FILE:{}` writes the full name)",
            b.digest,
            b.name,
            if names(entry).is_empty() {
                "none".to_string()
            } else {
                names(entry).join(", ")
            },
            b.name
        )));
    }
    only_listed(&index, listed).map_err(refuse)?;
    // every blob is what its name says: the node imports them all
    for (digest, at) in &members {
        let mut r = HashingReader::new(ReadAt::new(file.clone(), at.0, at.1));
        std::io::copy(&mut r, &mut std::io::sink())
            .map_err(|e| refuse(format!("blob {digest}: {e}")))?;
        let (actual, n) = r.finish();
        if actual != *digest || n != at.1 {
            return Err(refuse(format!(
                "blob {digest}: its {n} bytes hash to {actual}: the archive is damaged or was altered"
            )));
        }
    }
    let read = |d: &Descriptor| -> Result<Vec<u8>, BundleError> {
        let at = members.get(&d.digest).ok_or_else(|| {
            refuse(format!(
                "blob {} ({}) is not in the archive",
                d.digest, d.media_type
            ))
        })?;
        if at.1 > MAX_DOCUMENT {
            return Err(refuse(format!(
                "document {} is larger than {MAX_DOCUMENT} bytes",
                d.digest
            )));
        }
        let mut bytes = Vec::new();
        ReadAt::new(file.clone(), at.0, at.1)
            .read_to_end(&mut bytes)
            .map_err(|e| refuse(format!("blob {}: {e}", d.digest)))?;
        Ok(bytes)
    };
    let host = Platform::host();
    let top = read(entry)?;
    let manifest_bytes = if is_index(entry, &top) {
        let idx: Index = serde_json::from_slice(&top)
            .map_err(|e| refuse(format!("index {}: {e}", entry.digest)))?;
        let m = idx
            .manifests
            .iter()
            .find(|m| m.platform.as_ref().is_some_and(|p| host.matches(p)))
            .ok_or_else(|| refuse(format!("index {} has no manifest for {host}", entry.digest)))?;
        read(m)?
    } else {
        top
    };
    let manifest: Manifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| refuse(format!("manifest: {e}")))?;
    for d in std::iter::once(&manifest.config).chain(&manifest.layers) {
        if !members.contains_key(&d.digest) {
            return Err(refuse(format!(
                "blob {} ({}) is not in the archive",
                d.digest, d.media_type
            )));
        }
    }
    Ok(())
}

fn is_index(d: &Descriptor, bytes: &[u8]) -> bool {
    d.media_type.contains("index") || d.media_type.contains("manifest.list") || {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .is_ok_and(|v| v.get("manifests").is_some())
    }
}

/// The names containerd's importer gives an index entry: its
/// `io.containerd.image.name`, else a full `ref.name`.
fn names(d: &Descriptor) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = d.annotations.get(ANNOTATION_CONTAINERD_NAME) {
        out.push(n.clone());
    } else if let Some(n) = d.annotations.get(ANNOTATION_REF_NAME) {
        if n.contains(['/', ':', '@']) {
            out.push(n.clone());
        }
    }
    out
}

/// The import unit's list: `NAME DIGEST FILE` per image, in config order.
pub fn list(images: &Images) -> String {
    let mut s = String::from(
        "# Rendered by kubeslot-activator: the offline bundle's images, verified\n\
         # on the host; imported by kubeslot-images.service before the kubelet.\n",
    );
    for b in &images.bundle {
        s += &format!("{} {} {}\n", b.name, b.digest, b.file);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeslot_image::Digest;
    use kubeslot_test_support::image::bundle_archive;

    const NAME: &str = "registry.example/e2e/hello:1";

    /// A host root with one bundle archive at /srv/bundle/hello.tar.
    fn host(dir: &Path) -> (Root, Digest) {
        let root = Root::new(dir.join("root"));
        std::fs::create_dir_all(root.join("srv/bundle")).unwrap();
        let digest = bundle_archive(
            &dir.join("layout"),
            NAME,
            b"BUNDLE-MARKER",
            &root.join("srv/bundle/hello.tar"),
        );
        (root, digest)
    }

    fn images(name: &str, digest: Digest) -> Images {
        Images {
            bundle_dir: Some("/srv/bundle".into()),
            bundle: vec![BundleImage {
                file: "hello.tar".into(),
                name: name.into(),
                digest,
            }],
        }
    }

    #[test]
    fn a_listed_archive_is_verified_and_listed_for_the_import_unit() {
        let dir = tempfile::tempdir().unwrap();
        let (root, digest) = host(dir.path());
        verify(&root, &images(NAME, digest)).unwrap();
        assert!(list(&images(NAME, digest)).ends_with(&format!("\n{NAME} {digest} hello.tar\n")));
        // containerd's own annotation names it too
        let index = dir.path().join("layout/index.json");
        let text = std::fs::read_to_string(&index).unwrap();
        let swapped = text.replace(
            "\"org.opencontainers.image.ref.name\"",
            "\"io.containerd.image.name\"",
        );
        assert_ne!(swapped, text);
        std::fs::write(&index, swapped).unwrap();
        kubeslot_test_support::image::write_archive(
            &dir.path().join("layout"),
            &root.join("srv/bundle/hello.tar"),
        );
        verify(&root, &images(NAME, digest)).unwrap();
    }

    #[test]
    fn refusals_name_the_archive_and_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let (root, digest) = host(dir.path());
        let e = |i: Images| verify(&root, &i).unwrap_err().to_string();
        let other = Digest::of(b"another image");
        let msg = e(images(NAME, other));
        assert!(
            msg.starts_with("images.bundle /srv/bundle/hello.tar (registry.example/e2e/hello:1): index.json names no image of digest")
                && msg.contains(&format!("{NAME} {digest}")),
            "{msg}"
        );
        let msg = e(images("registry.example/e2e/other:1", digest));
        assert!(
            msg.contains("is not named registry.example/e2e/other:1"),
            "{msg}"
        );
        let mut missing = images(NAME, digest);
        missing.bundle[0].file = "gone.tar".into();
        assert!(e(missing).contains("gone.tar (registry.example/e2e/hello:1): cannot read"));
        // a link is not the file the node gets
        std::os::unix::fs::symlink("hello.tar", root.join("srv/bundle/link.tar")).unwrap();
        let mut link = images(NAME, digest);
        link.bundle[0].file = "link.tar".into();
        assert!(e(link).contains("not a regular file"));
        // one byte of the layer changed
        let path = root.join("srv/bundle/hello.tar");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(13)
            .position(|w| w == b"BUNDLE-MARKER")
            .unwrap();
        bytes[at] = b'X';
        std::fs::write(&path, &bytes).unwrap();
        let msg = e(images(NAME, digest));
        assert!(
            msg.contains("the archive is damaged or was altered"),
            "{msg}"
        );
    }

    /// Issue 40, item 3: an archive with a second entry named like an image
    /// containerd already has passed (only the configured entry was
    /// checked), and the node's import unit imported it over that name.
    #[test]
    fn an_entry_the_config_does_not_list_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (root, digest) = host(dir.path());
        let pause = "registry.k8s.io/pause:3.10.2";
        let other = bundle_archive(
            &dir.path().join("layout"),
            pause,
            b"PAYLOAD",
            &root.join("srv/bundle/hello.tar"),
        );
        let msg = verify(&root, &images(NAME, digest))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("images.bundle /srv/bundle/hello.tar (registry.example/e2e/hello:1): index.json also holds registry.k8s.io/pause:3.10.2 ")
                && msg.contains(&other.to_string()),
            "{msg}"
        );
        // listed with its name and digest, for the same archive: both pass
        let mut both = images(NAME, digest);
        both.bundle.push(BundleImage {
            file: "hello.tar".into(),
            name: pause.into(),
            digest: other,
        });
        verify(&root, &both).unwrap();
        // listed at another digest: refused
        both.bundle[1].digest = Digest::of(b"not it");
        assert!(verify(&root, &both).is_err());
    }

    /// Issue 40, item 3: the archive is imported later from the bound
    /// directory, so whoever may write it could swap it after it was
    /// verified: the directory (and those above it) and the archive must
    /// be root's and writable by nobody else.
    #[test]
    fn an_archive_others_could_swap_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (root, digest) = host(dir.path());
        let set = |p: &str, mode: u32| {
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let e = || verify(&root, &images(NAME, digest)).map_err(|e| e.to_string());
        set("srv/bundle", 0o755);
        set("srv/bundle/hello.tar", 0o644);
        e().unwrap();
        set("srv/bundle/hello.tar", 0o666);
        let msg = e().unwrap_err();
        assert!(
            msg.contains("hello.tar") && msg.contains("mode 0666: writable by its group or others"),
            "{msg}"
        );
        set("srv/bundle/hello.tar", 0o644);
        std::os::unix::fs::chown(root.join("srv/bundle/hello.tar"), Some(65534), None).unwrap();
        assert!(e().unwrap_err().contains("owned by uid 65534, not root"));
        std::os::unix::fs::chown(root.join("srv/bundle/hello.tar"), Some(0), None).unwrap();
        set("srv", 0o777);
        let msg = e().unwrap_err();
        assert!(msg.contains("/srv: mode 0777"), "{msg}");
        set("srv", 0o755);
        e().unwrap();
    }
}
