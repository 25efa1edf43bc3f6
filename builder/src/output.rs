//! Writing OCI image layouts and `oci-archive` files, and re-reading what
//! was written with kubeslot-image (the hosts' library) before success is reported.
//!
//! Given a directory of verified blobs (a build's staging area, or another
//! layout) and the `index.json` entries to add, [`write_layout`] creates a
//! layout atomically (a temp sibling renamed into place) or adds to an
//! existing one (blobs first, each by rename; `index.json` last, atomically,
//! replacing an entry with the same tag). [`write_archive`] tars a layout
//! deterministically into a temp sibling of the target and renames it.
//! A failure leaves the target as it was.
//!
//! It deliberately does not build images or talk to registries.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use kubeslot_image::atomic::{self, AtomicError};
use kubeslot_image::digest::HashingReader;
use kubeslot_image::layout::{BlobDir, Layout, LayoutError};
use kubeslot_image::oci::{
    Descriptor, ImageConfig, Index, Manifest, ANNOTATION_REF_NAME, MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_INDEX,
};
use kubeslot_image::{Digest, ImageSource};

/// Why an output could not be written or did not verify.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Write(#[from] AtomicError),
    #[error("output {0:?}: expected oci:DIR[:TAG] or oci-archive:FILE[:TAG]")]
    Target(String),
    #[error("{path}: {what}: {rule}")]
    Verify {
        path: PathBuf,
        what: String,
        rule: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a build goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Layout { dir: PathBuf, tag: Option<String> },
    Archive { file: PathBuf, tag: Option<String> },
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, OutputError> {
        match s.parse::<ImageSource>() {
            Ok(ImageSource::Layout { dir, tag }) => Ok(Target::Layout { dir, tag }),
            Ok(ImageSource::Archive { file, tag }) => Ok(Target::Archive { file, tag }),
            _ => Err(OutputError::Target(s.to_string())),
        }
    }

    pub fn tag(&self) -> Option<&str> {
        match self {
            Target::Layout { tag, .. } | Target::Archive { tag, .. } => tag.as_deref(),
        }
    }

    /// The file or directory written.
    pub fn path(&self) -> &Path {
        match self {
            Target::Layout { dir, .. } => dir,
            Target::Archive { file, .. } => file,
        }
    }
}

/// A temp sibling of `target` (same filesystem, so renames are atomic),
/// named `.NAME.kubeslot-<pid>-XXXXXX` and removed by its guard on every exit
/// path a process survives. A builder that was killed cannot clean up, so
/// staging dirs and temp archives of `target` whose process is gone are
/// removed first.
pub fn staging_dir(target: &Path) -> Result<tempfile::TempDir, OutputError> {
    let parent = parent_of(target);
    fs::create_dir_all(&parent).map_err(io_err(&parent))?;
    let prefix = staging_prefix(target);
    sweep_stale(&parent, &prefix);
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(&parent)
        .map_err(io_err(&parent))
}

/// `.NAME.kubeslot-`: what every temp sibling of `target` starts with.
fn staging_prefix(target: &Path) -> String {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    format!(".{name}.kubeslot-")
}

/// Removes `<parent>/<prefix><pid>-*` entries whose process no longer runs
/// (a build killed by SIGKILL, an OOM kill, a cancelled CI job). Entries of
/// live processes, including concurrent builds, are left alone; failures to
/// remove are ignored (the next run tries again).
fn sweep_stale(parent: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        if removed.is_ok() {
            eprintln!(
                "removed {}: left by a build (pid {pid}) that did not finish",
                path.display()
            );
        }
    }
}

fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(x) if !x.as_os_str().is_empty() => x.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Adds every blob of `blobs` and the `entries` to the layout at `dest`.
/// A missing `dest` is created whole in a temp sibling and renamed into
/// place; an existing one gets the blobs it lacks (each complete before it
/// appears) and then its `index.json` replaced atomically, where an entry
/// with the same ref name (or, untagged, the same digest) is replaced.
pub fn write_layout(
    blobs: &BlobDir,
    entries: &[Descriptor],
    dest: &Path,
) -> Result<(), OutputError> {
    // An empty directory counts as missing: rename(2) replaces it.
    let empty_dir = fs::read_dir(dest).is_ok_and(|mut d| d.next().is_none());
    if dest.exists() && !empty_dir {
        let layout = Layout::open(dest)?;
        copy_blobs(blobs, layout.blobs())?;
        layout.upsert_index(entries.iter().cloned())?;
        return Ok(());
    }
    let tmp = staging_dir(dest)?;
    let layout = Layout::create(tmp.path())?;
    copy_blobs(blobs, layout.blobs())?;
    layout.upsert_index(entries.iter().cloned())?;
    atomic::sync_dir(tmp.path())?;
    let staged = tmp.keep();
    fs::rename(&staged, dest).map_err(|e| {
        let _ = fs::remove_dir_all(&staged);
        io_err(dest)(e)
    })?;
    atomic::sync_dir(&parent_of(dest))?;
    Ok(())
}

/// Copies (hard links when possible) blobs that `to` lacks, each through a
/// temp name and a rename, then fsyncs the blob directory.
fn copy_blobs(from: &BlobDir, to: &BlobDir) -> Result<(), OutputError> {
    let src = from.root().join("sha256");
    let dst = to.root().join("sha256");
    fs::create_dir_all(&dst).map_err(io_err(&dst))?;
    for e in fs::read_dir(&src).map_err(io_err(&src))? {
        let e = e.map_err(io_err(&src))?;
        let name = e.file_name();
        let Some(digest) = name.to_str().and_then(|n| Digest::from_hex(n).ok()) else {
            continue; // temp files and strays are not blobs
        };
        if to.contains(&digest) {
            continue;
        }
        let target = to.path(&digest);
        let tmp = dst.join(format!(".incoming-{}", digest.hex()));
        let _ = fs::remove_file(&tmp);
        if fs::hard_link(e.path(), &tmp).is_err() {
            let mut r = File::open(e.path()).map_err(io_err(&e.path()))?;
            let mut w = File::create(&tmp).map_err(io_err(&tmp))?;
            io::copy(&mut r, &mut w).map_err(io_err(&tmp))?;
            w.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, &target).map_err(io_err(&target))?;
    }
    atomic::sync_dir(&dst)?;
    Ok(())
}

/// Writes the layout at `layout_dir` as an `oci-archive` (a tar of the
/// layout: `oci-layout`, `index.json`, `blobs/sha256/*`, sorted, numeric
/// owner 0, mtime 0) to `file`, via a temp sibling and a rename.
pub fn write_archive(layout_dir: &Path, file: &Path) -> Result<(), OutputError> {
    let parent = parent_of(file);
    fs::create_dir_all(&parent).map_err(io_err(&parent))?;
    let prefix = staging_prefix(file);
    sweep_stale(&parent, &prefix);
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        // what other users may read (umask applies), not tempfile's 0600
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(&parent)
        .map_err(io_err(&parent))?;
    {
        let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, tmp.as_file()));
        fn add<W: Write>(
            b: &mut tar::Builder<W>,
            name: &str,
            path: Option<&Path>,
        ) -> io::Result<()> {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match path {
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    b.append_data(&mut h, name, io::empty())
                }
                Some(p) => {
                    let f = File::open(p)?;
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o644);
                    h.set_size(f.metadata()?.len());
                    b.append_data(&mut h, name, io::BufReader::new(f))
                }
            }
        }
        let blob_dir = layout_dir.join("blobs").join("sha256");
        let mut blobs: Vec<String> = fs::read_dir(&blob_dir)
            .map_err(io_err(&blob_dir))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| Digest::from_hex(n).is_ok())
            .collect();
        blobs.sort();
        let res = (move || {
            add(&mut b, "blobs/", None)?;
            add(&mut b, "blobs/sha256/", None)?;
            for n in &blobs {
                add(
                    &mut b,
                    &format!("blobs/sha256/{n}"),
                    Some(&blob_dir.join(n)),
                )?;
            }
            add(&mut b, "index.json", Some(&layout_dir.join("index.json")))?;
            add(&mut b, "oci-layout", Some(&layout_dir.join("oci-layout")))?;
            b.into_inner()?.flush()
        })();
        res.map_err(io_err(file))?;
    }
    tmp.as_file().sync_all().map_err(io_err(file))?;
    tmp.persist(file).map_err(|e| io_err(file)(e.error))?;
    atomic::sync_dir(&parent)?;
    Ok(())
}

/// Re-reads the image tagged `tag` (or with digest `index`) in a layout:
/// parses the index, every manifest and config, checks every blob's size
/// and digest and that each config has one `diff_id` per layer.
pub fn verify_layout(
    layout: &Layout,
    tag: Option<&str>,
    index: &Digest,
) -> Result<(), OutputError> {
    let bad = |what: String, rule: String| OutputError::Verify {
        path: layout.dir().to_path_buf(),
        what,
        rule,
    };
    let top = layout.index()?;
    let entry = top
        .manifests
        .iter()
        .find(|d| match tag {
            Some(t) => d.annotations.get(ANNOTATION_REF_NAME).map(String::as_str) == Some(t),
            None => d.digest == *index,
        })
        .ok_or_else(|| bad("index.json".into(), format!("no entry for tag {tag:?}")))?;
    if entry.digest != *index {
        return Err(bad(
            format!("index.json entry {tag:?}"),
            format!("points at {}, the build made {index}", entry.digest),
        ));
    }
    if entry.media_type != MEDIA_TYPE_INDEX && entry.media_type != MEDIA_TYPE_DOCKER_LIST {
        return Err(bad(
            format!("entry {index}"),
            "is not an image index".into(),
        ));
    }
    let idx: Index = layout.read_json(&entry.digest, Some(entry.size))?;
    for m in &idx.manifests {
        let manifest: Manifest = layout.read_json(&m.digest, Some(m.size))?;
        let config: ImageConfig =
            layout.read_json(&manifest.config.digest, Some(manifest.config.size))?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(bad(
                format!("manifest {}", m.digest),
                format!(
                    "{} layers but {} diff_ids in its config",
                    manifest.layers.len(),
                    config.rootfs.diff_ids.len()
                ),
            ));
        }
        for l in &manifest.layers {
            let f = layout.blobs().open_blob(&l.digest)?;
            let mut r = HashingReader::new(io::BufReader::with_capacity(1 << 20, f));
            io::copy(&mut r, &mut io::sink()).map_err(io_err(&layout.blobs().path(&l.digest)))?;
            let (actual, len) = r.finish();
            if actual != l.digest || len != l.size {
                return Err(bad(
                    format!("layer {}", l.digest),
                    format!(
                        "content is {actual} with {len} bytes, descriptor says {} bytes",
                        l.size
                    ),
                ));
            }
        }
    }
    Ok(())
}
