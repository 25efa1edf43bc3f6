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
//! The node never sees `bundle_dir`: [`install`] (called by
//! `render::write` before the `.nspawn` file) copies the archives into
//! the root-only `/var/lib/kubeslot/bundles/<key>` ([`Copy`]) and verifies
//! the copy, which is bound read-only into the machine; the image's
//! `kubeslot-images.service` imports from it into containerd's `k8s.io`
//! namespace before the kubelet starts. Once made, a copy that verifies
//! is what [`verify`] checks and what every later render keeps: swapping
//! an archive in `bundle_dir` changes nothing the node imports. [`prune`]
//! (`gc`) removes the copies neither slot binds. [`verify`] writes
//! nothing but a scratch directory (removed) for the archive's
//! `index.json`.

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
    // made by an earlier render: the copy is what the node imports, and
    // what the original became since changes nothing
    if let Some(copy) = Copy::of(images) {
        let at = root.bundle_copies().join(&copy.key);
        if at.is_dir() && copy.verify_in(&at, &copy.host_dir()).is_ok() {
            return Ok(());
        }
    }
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
    archive_file(path).map_err(|reason| BundleError::Image {
        file: shown.to_path_buf(),
        name: b.name.clone(),
        reason,
    })?;
    verify_content(path, shown, b, listed)
}

/// The archive at `path` holds `b` as the config lists it, and only what
/// `listed` lists (the module doc's checks but the file's owner).
fn verify_content(
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

/// The offline bundle's private copy: the listed archives copied out of
/// `images.bundle_dir` into `/var/lib/kubeslot/bundles/<key>/` (root only:
/// `bundles` is 0700), verified there, and bound read-only into the
/// machine in place of `bundle_dir`. Whoever swaps an archive in
/// `bundle_dir` after the render changes nothing the node imports. `key`
/// names the bundle list (each `file name digest`): a copy verified
/// under it imports exactly those images, whatever bytes it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
    /// The hex of the bundle list's sha256.
    pub key: String,
    pub images: Images,
}

impl Copy {
    /// The copy `images` needs (`None` without a bundle).
    pub fn of(images: &Images) -> Option<Copy> {
        images.bundle_dir.as_ref()?;
        if images.bundle.is_empty() {
            return None;
        }
        let mut text = String::new();
        for b in &images.bundle {
            text += &format!("{}\0{}\0{}\n", b.file, b.name, b.digest);
        }
        Some(Copy {
            key: kubeslot_image::Digest::of(text.as_bytes()).hex(),
            images: images.clone(),
        })
    }

    /// Its directory as the host sees it (what the `.nspawn` file binds).
    pub fn host_dir(&self) -> PathBuf {
        Root::new("/").bundle_copies().join(&self.key)
    }

    /// The archive files, each once, in config order.
    fn files(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for b in &self.images.bundle {
            if !out.contains(&b.file.as_str()) {
                out.push(&b.file);
            }
        }
        out
    }

    /// Every listed image of the copy in `dir` verified (the files are
    /// kubeslot's own: their owner is not checked).
    fn verify_in(&self, dir: &Path, shown: &Path) -> Result<(), BundleError> {
        for b in &self.images.bundle {
            let listed: Vec<&BundleImage> = self
                .images
                .bundle
                .iter()
                .filter(|o| o.file == b.file)
                .collect();
            verify_content(&dir.join(&b.file), &shown.join(&b.file), b, &listed)?;
        }
        Ok(())
    }
}

/// Takes the lock of `/var/lib/kubeslot/bundles` (made 0700 first): held
/// by a render from the copy to the `.nspawn` file that names it, and by
/// `gc` while it removes copies, so neither removes what the other made.
pub fn lock_copies(root: &Root) -> Result<std::fs::File, BundleError> {
    let dir = root.bundle_copies();
    let fail = |reason: String| BundleError::Image {
        file: Root::new("/").bundle_copies(),
        name: "images.bundle".into(),
        reason,
    };
    crate::paths::private_dir(&dir).map_err(|e| fail(e.to_string()))?;
    let handle = std::fs::File::open(&dir).map_err(|e| fail(format!("open: {e}")))?;
    rustix::fs::flock(&handle, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| fail(format!("lock: {e}")))?;
    Ok(handle)
}

/// Makes `copy` (see [`Copy`]): kept when it is there and verifies, else
/// each archive copied (not following a link) into a directory beside it,
/// verified there, then renamed into place; nothing half-written is ever
/// under the name the `.nspawn` file binds. Returns the held lock of
/// [`lock_copies`].
pub fn install(root: &Root, copy: &Copy) -> Result<std::fs::File, BundleError> {
    let lock = lock_copies(root)?;
    let Some(src) = &copy.images.bundle_dir else {
        return Ok(lock);
    };
    let copies = root.bundle_copies();
    let target = copies.join(&copy.key);
    let shown = copy.host_dir();
    if target.is_dir() && copy.verify_in(&target, &shown).is_ok() {
        return Ok(lock);
    }
    let fail = |file: &str, reason: String| BundleError::Image {
        file: shown.join(file),
        name: "images.bundle".into(),
        reason,
    };
    let tmp = copies.join(format!(".tmp-{}", copy.key));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = (|| -> Result<(), BundleError> {
        kubeslot_image::atomic::create_dir(&tmp, 0o755).map_err(|e| fail("", e.to_string()))?;
        for file in copy.files() {
            let from = root.join(&src.join(file).to_string_lossy());
            copy_file(&from, &tmp.join(file))
                .map_err(|e| fail(file, format!("copying {}: {e}", src.join(file).display())))?;
        }
        kubeslot_image::atomic::sync_dir(&tmp).map_err(|e| fail("", e.to_string()))?;
        // the copy is what the node imports: the copy is what is verified
        copy.verify_in(&tmp, &shown)?;
        if target.exists() {
            // a damaged copy: replaced whole
            std::fs::remove_dir_all(&target).map_err(|e| fail("", format!("removing: {e}")))?;
        }
        std::fs::rename(&tmp, &target).map_err(|e| fail("", format!("renaming: {e}")))?;
        kubeslot_image::atomic::sync_dir(&copies).map_err(|e| fail("", e.to_string()))
    })();
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    made.map(|()| lock)
}

/// Copies the regular file `from` (a link is refused) to `to`, new, mode
/// 0644, synced.
fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(from)?;
    if !src.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(to)?;
    std::io::copy(&mut src, &mut dst)?;
    dst.sync_all()
}

/// The copies the two slots' `.nspawn` files bind (their keys).
pub fn referenced(root: &Root) -> std::collections::BTreeSet<String> {
    let prefix = format!("BindReadOnly={}/", Root::new("/").bundle_copies().display());
    let mut keys = std::collections::BTreeSet::new();
    for slot in crate::slot::Slot::ALL {
        let Ok(text) = std::fs::read_to_string(root.nspawn_file(slot.machine())) else {
            continue;
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&prefix) {
                if let Some((key, _)) = rest.split_once(':') {
                    keys.insert(key.to_string());
                }
            }
        }
    }
    keys
}

/// Removes (unless `dry`) the copies neither slot binds and leftovers of
/// an interrupted copy, under the lock; returns the host paths removed.
pub fn prune(root: &Root, dry: bool) -> Result<Vec<PathBuf>, BundleError> {
    if !root.bundle_copies().is_dir() {
        return Ok(Vec::new());
    }
    let _lock = lock_copies(root)?;
    let keep = referenced(root);
    let mut removed = Vec::new();
    let entries = std::fs::read_dir(root.bundle_copies()).map_err(|e| BundleError::Image {
        file: Root::new("/").bundle_copies(),
        name: "images.bundle".into(),
        reason: e.to_string(),
    })?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) {
            continue;
        }
        if !dry {
            let _ = std::fs::remove_dir_all(e.path());
        }
        removed.push(Root::new("/").bundle_copies().join(name));
    }
    removed.sort();
    Ok(removed)
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
