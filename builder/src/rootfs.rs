//! Deterministic layers: an in-memory tree of entries (metadata only; file
//! contents stay on disk) and the writer that turns it into a compressed tar
//! blob whose bytes depend only on the tree and the settings.
//!
//! Given entries from a base tarball (re-normalised), a directory, extracted
//! component members or inline files, it writes every entry with headers it
//! sets itself: GNU format, paths sorted bytewise, parent directories
//! emitted, numeric uid/gid with empty user/group names, mtimes clamped to
//! `SOURCE_DATE_EPOCH`, no atime/ctime, setuid/setgid/sticky bits kept,
//! `SCHILY.xattr.*` records kept (file capabilities), hard links pointing at
//! the first path of their set in sorted order. gzip uses a fixed level and
//! header; zstd a fixed level, job size and overlap in zstd's multi-threaded
//! mode, whose frame is the same for any number of workers >= 1 (libzstd's
//! single-threaded mode, 0 workers, writes a different frame and is never
//! used: one codepath, one set of bytes). The tar, the
//! compressor and the two digests (`diff_id`, blob digest) are one streaming
//! pipeline to a temp file that is renamed to its digest when complete.
//!
//! It deliberately drops device nodes (a node machine gets `/dev` from
//! systemd-nspawn, and the activator refuses them) and refuses sparse files
//! and other entry types; it knows nothing about recipes or images.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubeslot_image::digest::HashingWriter;
use kubeslot_image::oci::Compression;
use kubeslot_image::Digest;
use tar::{EntryType, Header};

/// gzip level used for every layer (fixed: it is part of the digest).
pub const GZIP_LEVEL: u32 = 6;
/// zstd level used for every layer (fixed: it is part of the digest).
pub const ZSTD_LEVEL: i32 = 3;
/// Input bytes per job of zstd's multi-threaded mode (fixed: it is part of
/// the digest). libzstd's own choice at level 3 (4 × the 2 MiB window),
/// pinned here instead of left to the library's defaults.
pub const ZSTD_JOB_SIZE: u32 = 8 << 20;
/// How much of the previous job each job reloads, as zstd's `overlapLog`
/// (6: 1/8 of the window; libzstd's default for level 3's strategy), pinned
/// like the job size.
pub const ZSTD_OVERLAP_LOG: u32 = 6;

/// zstd worker threads for a layer: one per CPU the process may use. Any
/// count >= 1 writes the same bytes (libzstd's streaming multi-threaded
/// mode cuts jobs at fixed input offsets, whatever the number of workers).
pub fn zstd_workers() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// Why a tree could not be read or a layer written.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{archive}: entry {entry:?}: {rule}")]
    Entry {
        archive: PathBuf,
        entry: String,
        rule: String,
    },
    #[error("layer entry {entry:?}: {rule}")]
    Tree { entry: String, rule: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RootfsError + '_ {
    move |source| RootfsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a regular file's bytes are.
#[derive(Clone, Debug)]
pub enum Data {
    Bytes(Arc<Vec<u8>>),
    /// `len` bytes at `offset` of a file on disk.
    Range {
        file: Arc<PathBuf>,
        offset: u64,
        len: u64,
    },
}

impl Data {
    pub fn len(&self) -> u64 {
        match self {
            Data::Bytes(b) => b.len() as u64,
            Data::Range { len, .. } => *len,
        }
    }
    /// A whole file on disk.
    pub fn file(path: &Path) -> Result<Data, RootfsError> {
        let len = std::fs::metadata(path).map_err(io_err(path))?.len();
        Ok(Data::Range {
            file: Arc::new(path.to_path_buf()),
            offset: 0,
            len,
        })
    }
}

#[derive(Clone, Debug)]
pub enum Kind {
    Dir,
    File(Data),
    Symlink(String),
    /// A hard link to another path of the tree (a regular file).
    Hardlink(String),
    Fifo,
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    /// Extended attributes, by name without the `SCHILY.xattr.` prefix.
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

impl Entry {
    /// A root-owned entry.
    pub fn root(kind: Kind, mode: u32, mtime: u64) -> Entry {
        Entry {
            kind,
            mode,
            uid: 0,
            gid: 0,
            mtime,
            xattrs: BTreeMap::new(),
        }
    }
}

/// A layer's entries, keyed by path relative to `/` without leading or
/// trailing slashes (so bytewise key order is the tar order).
#[derive(Clone, Debug, Default)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
}

/// Checks and normalises an entry path (`./a/b/` → `a/b`); `None` for the root.
pub fn clean_path(raw: &str) -> Result<Option<String>, String> {
    let mut parts = Vec::new();
    for seg in raw.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err("path contains ..".into()),
            s => parts.push(s),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

impl Tree {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Adds (or replaces) an entry at a clean relative path.
    pub fn insert(&mut self, path: &str, entry: Entry) -> Result<(), RootfsError> {
        let key = clean_path(path)
            .map_err(|rule| RootfsError::Tree {
                entry: path.to_string(),
                rule,
            })?
            .ok_or_else(|| RootfsError::Tree {
                entry: path.to_string(),
                rule: "the root cannot be an entry".into(),
            })?;
        self.entries.insert(key, entry);
        Ok(())
    }

    /// Reads a tarball (`.tar`, gzip or zstd, detected by magic bytes) into a
    /// tree, clamping mtimes to `epoch`. Compressed input is first expanded
    /// into `work` so entries can be read in sorted order by offset.
    pub fn from_tarball(archive: &Path, work: &Path, epoch: u64) -> Result<Tree, RootfsError> {
        let plain = decompress_to(archive, work)?;
        let f = File::open(&plain).map_err(io_err(&plain))?;
        let mut ar = tar::Archive::new(io::BufReader::with_capacity(1 << 20, f));
        let shared = Arc::new(plain.clone());
        let mut tree = Tree::new();
        let bad = |entry: &str, rule: &str| RootfsError::Entry {
            archive: archive.to_path_buf(),
            entry: entry.to_string(),
            rule: rule.to_string(),
        };
        for e in ar.entries().map_err(io_err(archive))? {
            let mut e = e.map_err(io_err(archive))?;
            let raw = String::from_utf8(e.path_bytes().into_owned())
                .map_err(|_| bad("<non-utf8>", "path is not UTF-8"))?;
            let mut xattrs = BTreeMap::new();
            if let Some(exts) = e.pax_extensions().map_err(io_err(archive))? {
                for ext in exts {
                    let ext = ext.map_err(io_err(archive))?;
                    if let Ok(k) = ext.key() {
                        if let Some(name) = k.strip_prefix("SCHILY.xattr.") {
                            xattrs.insert(name.to_string(), ext.value_bytes().to_vec());
                        }
                    }
                }
            }
            let h = e.header();
            let etype = h.entry_type();
            let Some(path) = clean_path(&raw).map_err(|r| bad(&raw, &r))? else {
                continue; // "./": the root is not an entry of a layer
            };
            let link = || -> Result<String, RootfsError> {
                let l = e
                    .link_name_bytes()
                    .ok_or_else(|| bad(&raw, "link without a target"))?;
                String::from_utf8(l.into_owned()).map_err(|_| bad(&raw, "link target is not UTF-8"))
            };
            let kind = match etype {
                EntryType::Regular | EntryType::Continuous => Kind::File(Data::Range {
                    file: shared.clone(),
                    offset: e.raw_file_position(),
                    len: e.size(),
                }),
                EntryType::Directory => Kind::Dir,
                EntryType::Symlink => Kind::Symlink(link()?),
                EntryType::Link => {
                    let target = clean_path(&link()?)
                        .map_err(|r| bad(&raw, &r))?
                        .ok_or_else(|| bad(&raw, "hard link to the root"))?;
                    Kind::Hardlink(target)
                }
                EntryType::Fifo => Kind::Fifo,
                EntryType::Char | EntryType::Block => {
                    tracing::debug!(entry = %raw, "device node dropped");
                    continue;
                }
                EntryType::XGlobalHeader => continue,
                other => {
                    return Err(bad(
                        &raw,
                        &format!("unsupported entry type {other:?} (sparse or unknown)"),
                    ))
                }
            };
            let entry = Entry {
                kind,
                mode: h.mode().map_err(io_err(archive))? & 0o7777,
                uid: h.uid().map_err(io_err(archive))?,
                gid: h.gid().map_err(io_err(archive))?,
                mtime: h.mtime().map_err(io_err(archive))?.min(epoch),
                xattrs,
            };
            tree.entries.insert(path, entry);
        }
        tree.fix_hardlinks()?;
        Ok(tree)
    }

    /// Reads a directory tree (the benchmark, tests), clamping mtimes.
    pub fn from_dir(dir: &Path, epoch: u64) -> Result<Tree, RootfsError> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let mut tree = Tree::new();
        let mut inodes: BTreeMap<(u64, u64), String> = BTreeMap::new();
        for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
            let e = e.map_err(|e| RootfsError::Io {
                path: dir.to_path_buf(),
                source: e.into(),
            })?;
            let rel = e.path().strip_prefix(dir).expect("walkdir stays below dir");
            let Some(rel) = rel.to_str() else {
                return Err(RootfsError::Tree {
                    entry: rel.display().to_string(),
                    rule: "path is not UTF-8".into(),
                });
            };
            if rel.is_empty() {
                continue;
            }
            let md = e.path().symlink_metadata().map_err(io_err(e.path()))?;
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                Kind::Dir
            } else if ft.is_symlink() {
                let t = std::fs::read_link(e.path()).map_err(io_err(e.path()))?;
                Kind::Symlink(t.to_string_lossy().into_owned())
            } else if ft.is_file() {
                let key = (md.dev(), md.ino());
                match inodes.get(&key) {
                    Some(first) if md.nlink() > 1 => Kind::Hardlink(first.clone()),
                    _ => {
                        if md.nlink() > 1 {
                            inodes.insert(key, rel.to_string());
                        }
                        Kind::File(Data::Range {
                            file: Arc::new(e.path().to_path_buf()),
                            offset: 0,
                            len: md.len(),
                        })
                    }
                }
            } else if ft.is_fifo() {
                Kind::Fifo
            } else {
                continue; // devices and sockets
            };
            let entry = Entry {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid().into(),
                gid: md.gid().into(),
                mtime: (md.mtime().max(0) as u64).min(epoch),
                xattrs: BTreeMap::new(),
            };
            tree.insert(rel, entry)?;
        }
        tree.fix_hardlinks()?;
        Ok(tree)
    }

    /// Makes every hard-link set point at its first path in sorted order,
    /// which then carries the data: an extractor meets the file before any
    /// link to it.
    fn fix_hardlinks(&mut self) -> Result<(), RootfsError> {
        let mut sets: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (path, e) in &self.entries {
            if let Kind::Hardlink(target) = &e.kind {
                // Follow chains (a link to a link) to the file.
                let mut t = target.clone();
                for _ in 0..64 {
                    match self.entries.get(&t).map(|x| &x.kind) {
                        Some(Kind::Hardlink(next)) => t = next.clone(),
                        _ => break,
                    }
                }
                match self.entries.get(&t).map(|x| &x.kind) {
                    Some(Kind::File(_)) => {}
                    _ => {
                        return Err(RootfsError::Tree {
                            entry: path.clone(),
                            rule: format!("hard link to {t:?}, which is not a regular file"),
                        })
                    }
                }
                sets.entry(t).or_default().push(path.clone());
            }
        }
        for (file, links) in sets {
            let first = links.iter().min().expect("non-empty").clone();
            if first > file {
                continue; // the file already comes first
            }
            let original = self.entries.remove(&file).expect("checked above");
            for l in &links {
                if *l != first {
                    self.entries.get_mut(l).expect("link exists").kind =
                        Kind::Hardlink(first.clone());
                }
            }
            let moved = original.clone();
            self.entries.insert(first.clone(), moved);
            let mut link = original;
            link.kind = Kind::Hardlink(first);
            self.entries.insert(file, link);
        }
        Ok(())
    }

    /// The directories and symlinks of this tree (a base), so the layers
    /// above it can repeat its directory metadata and avoid its symlinks.
    pub fn shape(&self) -> BaseShape {
        let mut shape = BaseShape::default();
        for (path, e) in &self.entries {
            match e.kind {
                Kind::Dir => {
                    shape.dirs.insert(path.clone(), e.clone());
                }
                Kind::Symlink(_) => {
                    shape.symlinks.insert(path.clone());
                }
                _ => {}
            }
        }
        shape
    }

    /// Fits this (upper) tree onto a base: refuses entries below a path the
    /// base has as a symlink (a directory entry there would replace, say,
    /// merged-usr's `/lib -> usr/lib`), and gives missing parents the
    /// base's directory metadata instead of the default.
    pub fn fit_onto(&mut self, base: &BaseShape) -> Result<(), RootfsError> {
        for path in self.entries.keys() {
            let mut p = path.as_str();
            while let Some((parent, _)) = p.rsplit_once('/') {
                if base.symlinks.contains(parent) {
                    return Err(RootfsError::Tree {
                        entry: format!("/{path}"),
                        rule: format!(
                            "/{parent} is a symlink in the base; write below its target instead"
                        ),
                    });
                }
                p = parent;
            }
        }
        let mut missing = Vec::new();
        for path in self.entries.keys() {
            let mut p = path.as_str();
            while let Some((parent, _)) = p.rsplit_once('/') {
                if !self.entries.contains_key(parent) {
                    if let Some(d) = base.dirs.get(parent) {
                        missing.push((parent.to_string(), d.clone()));
                    }
                }
                p = parent;
            }
        }
        for (path, e) in missing {
            self.entries.entry(path).or_insert(e);
        }
        Ok(())
    }

    /// Adds a root-owned 0755 directory for every missing parent.
    fn fill_parents(&mut self, epoch: u64) {
        let mut missing = Vec::new();
        for path in self.entries.keys() {
            let mut p = path.as_str();
            while let Some((parent, _)) = p.rsplit_once('/') {
                if !self.entries.contains_key(parent) {
                    missing.push(parent.to_string());
                }
                p = parent;
            }
        }
        for m in missing {
            self.entries
                .entry(m)
                .or_insert_with(|| Entry::root(Kind::Dir, 0o755, epoch));
        }
    }

    /// Writes the tree as a layer blob into `blob_dir` (`<blob_dir>/<hex>`,
    /// created by rename after the stream completed and was fsynced), zstd
    /// on `zstd_workers` threads ([`zstd_workers`] in a build; 0 is taken
    /// as 1; the bytes are the same for any count). Blocking and
    /// CPU-heavy: call it from `spawn_blocking`.
    pub fn write_layer(
        mut self,
        blob_dir: &Path,
        compression: Compression,
        epoch: u64,
        zstd_workers: u32,
    ) -> Result<LayerBlob, RootfsError> {
        self.fill_parents(epoch);
        std::fs::create_dir_all(blob_dir).map_err(io_err(blob_dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".layer-")
            // what other users may read (umask applies), not tempfile's 0600
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(blob_dir)
            .map_err(io_err(blob_dir))?;
        let tmp_path = tmp.path().to_path_buf();
        let file = tmp.as_file().try_clone().map_err(io_err(&tmp_path))?;
        let compressed = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        let encoder =
            Encoder::new(compressed, compression, zstd_workers).map_err(io_err(&tmp_path))?;
        let mut builder = tar::Builder::new(HashingWriter::new(encoder));
        let mut reader = RangeReader::default();
        for (path, e) in &self.entries {
            write_entry(&mut builder, &mut reader, path, e, epoch).map_err(|source| {
                RootfsError::Io {
                    path: PathBuf::from(format!("{} (layer entry {path})", tmp_path.display())),
                    source,
                }
            })?;
        }
        let (encoder, diff_id, _) = builder.into_inner().map_err(io_err(&tmp_path))?.finish();
        let (buffered, digest, size) = encoder.finish().map_err(io_err(&tmp_path))?.finish();
        buffered
            .into_inner()
            .map_err(|e| io_err(&tmp_path)(e.into_error()))?
            .sync_all()
            .map_err(io_err(&tmp_path))?;
        let dest = blob_dir.join(digest.hex());
        tmp.persist(&dest).map_err(|e| io_err(&dest)(e.error))?;
        Ok(LayerBlob {
            digest,
            size,
            diff_id,
            media_type: compression.layer_media_type(),
            path: dest,
        })
    }
}

/// What the layers above a base need to know about it.
#[derive(Clone, Debug, Default)]
pub struct BaseShape {
    pub dirs: BTreeMap<String, Entry>,
    pub symlinks: std::collections::BTreeSet<String>,
}

/// A written layer blob.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    /// Digest of the compressed blob.
    pub digest: Digest,
    pub size: u64,
    /// Digest of the uncompressed tar.
    pub diff_id: Digest,
    pub media_type: &'static str,
    pub path: PathBuf,
}

fn write_entry<W: Write>(
    b: &mut tar::Builder<W>,
    reader: &mut RangeReader,
    path: &str,
    e: &Entry,
    epoch: u64,
) -> io::Result<()> {
    if !e.xattrs.is_empty() {
        let recs: Vec<(String, &[u8])> = e
            .xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.as_slice()))
            .collect();
        b.append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), *v)))?;
    }
    let mut h = Header::new_gnu();
    h.set_mode(e.mode & 0o7777);
    h.set_uid(e.uid);
    h.set_gid(e.gid);
    h.set_mtime(e.mtime.min(epoch));
    h.set_size(0);
    match &e.kind {
        Kind::Dir => {
            h.set_entry_type(EntryType::Directory);
            b.append_data(&mut h, format!("{path}/"), io::empty())
        }
        Kind::Fifo => {
            h.set_entry_type(EntryType::Fifo);
            b.append_data(&mut h, path, io::empty())
        }
        Kind::Symlink(target) => {
            h.set_entry_type(EntryType::Symlink);
            b.append_link(&mut h, path, target)
        }
        Kind::Hardlink(target) => {
            h.set_entry_type(EntryType::Link);
            b.append_link(&mut h, path, target)
        }
        Kind::File(data) => {
            h.set_entry_type(EntryType::Regular);
            h.set_size(data.len());
            match data {
                Data::Bytes(bytes) => b.append_data(&mut h, path, &bytes[..]),
                Data::Range { file, offset, len } => {
                    let r = reader.open(file, *offset, *len)?;
                    b.append_data(&mut h, path, r)
                }
            }
        }
    }
}

/// Keeps the last source file open: a re-normalised base reads thousands
/// of ranges of one expanded tarball.
#[derive(Default)]
struct RangeReader {
    open: Option<(Arc<PathBuf>, File)>,
}

impl RangeReader {
    fn open(&mut self, path: &Arc<PathBuf>, offset: u64, len: u64) -> io::Result<impl Read + '_> {
        let reuse = matches!(&self.open, Some((p, _)) if Arc::ptr_eq(p, path) || **p == **path);
        if !reuse {
            self.open = Some((path.clone(), File::open(path.as_path())?));
        }
        let f = &mut self.open.as_mut().expect("just opened").1;
        f.seek(SeekFrom::Start(offset))?;
        let r = io::BufReader::with_capacity(256 * 1024, f.take(len));
        Ok(ExactReader {
            inner: r,
            left: len,
            path: path.clone(),
        })
    }
}

/// Fails if the source ends early (a truncated file would shift the tar).
struct ExactReader<R> {
    inner: R,
    left: u64,
    path: Arc<PathBuf>,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: ended {} bytes early", self.path.display(), self.left),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

enum Encoder<W: Write> {
    Gzip(flate2::write::GzEncoder<W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
    None(W),
}

impl<W: Write> Encoder<W> {
    fn new(w: W, c: Compression, zstd_workers: u32) -> io::Result<Self> {
        Ok(match c {
            // GzEncoder writes a fixed header: mtime 0, no name, OS 255.
            Compression::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                w,
                flate2::Compression::new(GZIP_LEVEL),
            )),
            // Always the multi-threaded mode (>= 1 worker): see the module docs.
            Compression::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(w, ZSTD_LEVEL)?;
                e.multithread(zstd_workers.max(1))?;
                e.set_parameter(zstd::zstd_safe::CParameter::JobSize(ZSTD_JOB_SIZE))?;
                e.set_parameter(zstd::zstd_safe::CParameter::OverlapSizeLog(
                    ZSTD_OVERLAP_LOG,
                ))?;
                Encoder::Zstd(e)
            }
            Compression::None => Encoder::None(w),
        })
    }
    fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Zstd(e) => e.finish(),
            Encoder::None(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Gzip(e) => e.write(buf),
            Encoder::Zstd(e) => e.write(buf),
            Encoder::None(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
            Encoder::None(w) => w.flush(),
        }
    }
}

/// Expands a gzip or zstd tarball into a temp file under `work` (a plain
/// tar is used in place). Compression is detected by magic bytes, so a
/// mirror's file name does not matter.
pub fn decompress_to(archive: &Path, work: &Path) -> Result<PathBuf, RootfsError> {
    let mut f = File::open(archive).map_err(io_err(archive))?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic).map_err(io_err(archive))?;
    f.seek(SeekFrom::Start(0)).map_err(io_err(archive))?;
    let src = io::BufReader::with_capacity(1 << 20, f);
    let mut reader: Box<dyn Read> = if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::MultiGzDecoder::new(src))
    } else if n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::with_buffer(src).map_err(io_err(archive))?)
    } else {
        return Ok(archive.to_path_buf());
    };
    std::fs::create_dir_all(work).map_err(io_err(work))?;
    let (mut out, path) = tempfile::Builder::new()
        .prefix("expanded-")
        .suffix(".tar")
        .tempfile_in(work)
        .map_err(io_err(work))?
        .keep()
        .map_err(|e| io_err(work)(e.error))?;
    io::copy(&mut reader, &mut out).map_err(io_err(archive))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(epoch: u64) -> Tree {
        let mut t = Tree::new();
        let f = |b: &[u8], mode| {
            Entry::root(
                Kind::File(Data::Bytes(Arc::new(b.to_vec()))),
                mode,
                epoch + 99,
            )
        };
        t.insert("usr/bin/su", f(b"su", 0o4755)).unwrap();
        t.insert("b/x", f(b"x", 0o644)).unwrap();
        t.insert("a", Entry::root(Kind::Symlink("b/x".into()), 0o777, 5))
            .unwrap();
        t.insert("z", Entry::root(Kind::Hardlink("b/x".into()), 0o644, 5))
            .unwrap();
        t
    }

    #[test]
    fn layers_are_byte_identical_and_sorted_with_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let a = sample(1000)
            .write_layer(&tmp.path().join("a"), Compression::Gzip, 1000, 1)
            .unwrap();
        let b = sample(1000)
            .write_layer(&tmp.path().join("b"), Compression::Gzip, 1000, 1)
            .unwrap();
        assert_eq!((a.digest, a.diff_id), (b.digest, b.diff_id));
        assert_eq!(Digest::of(&std::fs::read(&a.path).unwrap()), a.digest);

        let dec = flate2::read::GzDecoder::new(File::open(&a.path).unwrap());
        let mut ar = tar::Archive::new(dec);
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert!(h.mtime().unwrap() <= 1000);
            assert_eq!(h.username_bytes(), Some(&b""[..]));
            seen.push((e.path().unwrap().display().to_string(), h.mode().unwrap()));
        }
        let names: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b/", "b/x", "usr/", "usr/bin/", "usr/bin/su", "z"]
        );
        assert_eq!(seen[5].1, 0o4755, "setuid bit kept");

        let z = sample(1000)
            .write_layer(&tmp.path().join("c"), Compression::Zstd, 1000, 1)
            .unwrap();
        let z2 = sample(1000)
            .write_layer(&tmp.path().join("d"), Compression::Zstd, 1000, 1)
            .unwrap();
        assert_eq!(z.digest, z2.digest);
        assert_eq!(z.diff_id, a.diff_id, "same tar under both compressions");
    }

    /// A tree of several zstd jobs' worth of compressible, non-repeating
    /// bytes (so that jobs really run side by side and overlap).
    fn big_tree() -> Tree {
        let mut t = sample(1000);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let jobs = 4;
        for f in 0..jobs * 8 {
            let bytes: Vec<u8> = (0..(ZSTD_JOB_SIZE as usize / 8 + 4093))
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    b"kubeslot layer \n0123456789"[(x >> 59) as usize % 26]
                })
                .collect();
            t.insert(
                &format!("data/{f:03}"),
                Entry::root(Kind::File(Data::Bytes(Arc::new(bytes))), 0o644, 1000),
            )
            .unwrap();
        }
        t
    }

    #[test]
    fn zstd_layers_are_the_same_bytes_for_any_worker_count() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |workers: u32| {
            big_tree()
                .write_layer(
                    &tmp.path().join(workers.to_string()),
                    Compression::Zstd,
                    1000,
                    workers,
                )
                .unwrap()
        };
        let one = write(1);
        let bytes = std::fs::read(&one.path).unwrap();
        assert!(
            one.size > 3 * u64::from(ZSTD_JOB_SIZE) / 8,
            "several jobs of output ({} bytes)",
            one.size
        );
        for workers in [2, 4, 0] {
            let other = write(workers);
            assert_eq!(
                (other.digest, other.diff_id, other.size),
                (one.digest, one.diff_id, one.size),
                "{workers} workers against 1"
            );
            assert_eq!(std::fs::read(&other.path).unwrap(), bytes);
        }
        // The blob decodes to the whole tar, which has the layer's diff_id.
        let tar = zstd::stream::decode_all(&bytes[..]).unwrap();
        assert!(
            tar.len() > 3 * ZSTD_JOB_SIZE as usize,
            "{} bytes",
            tar.len()
        );
        assert_eq!(Digest::of(&tar), one.diff_id);
        let gzip = big_tree()
            .write_layer(&tmp.path().join("gz"), Compression::Gzip, 1000, 1)
            .unwrap();
        assert_eq!(
            gzip.diff_id, one.diff_id,
            "same tar under both compressions"
        );
    }

    #[test]
    fn hardlink_sets_point_at_first_path() {
        let mut t = sample(10);
        t.insert(
            "0first",
            Entry::root(Kind::Hardlink("b/x".into()), 0o644, 5),
        )
        .unwrap();
        t.fix_hardlinks().unwrap();
        assert!(matches!(t.get("0first").unwrap().kind, Kind::File(_)));
        assert!(matches!(&t.get("b/x").unwrap().kind, Kind::Hardlink(p) if p == "0first"));
        assert!(matches!(&t.get("z").unwrap().kind, Kind::Hardlink(p) if p == "0first"));
    }

    #[test]
    fn tarballs_are_renormalised() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("in.tar");
        {
            let mut b = tar::Builder::new(File::create(&src).unwrap());
            fn add(
                b: &mut tar::Builder<File>,
                path: &str,
                t: EntryType,
                link: Option<&str>,
                data: &[u8],
                mtime: u64,
            ) {
                let mut h = Header::new_gnu();
                h.set_entry_type(t);
                h.set_mode(0o755);
                h.set_uid(1000);
                h.set_gid(1000);
                h.set_mtime(mtime);
                h.set_size(data.len() as u64);
                match link {
                    Some(l) => b.append_link(&mut h, path, l).unwrap(),
                    None => b.append_data(&mut h, path, data).unwrap(),
                }
            }
            add(
                &mut b,
                "./zz/file",
                EntryType::Regular,
                None,
                b"data",
                5_000,
            );
            add(
                &mut b,
                "./aa/link",
                EntryType::Link,
                Some("zz/file"),
                b"",
                5,
            );
            add(&mut b, "./dev/null", EntryType::Char, None, b"", 5);
            b.append_pax_extensions([("SCHILY.xattr.security.capability", &b"\x01cap"[..])])
                .unwrap();
            add(
                &mut b,
                "./usr/bin/ping",
                EntryType::Regular,
                None,
                b"ping",
                5,
            );
            b.finish().unwrap();
        }
        let tree = Tree::from_tarball(&src, &tmp.path().join("work"), 1_000).unwrap();
        assert!(tree.get("dev/null").is_none(), "device nodes are dropped");
        let first = tree.get("aa/link").unwrap();
        assert!(
            matches!(first.kind, Kind::File(_)),
            "the first path carries the data"
        );
        assert_eq!(
            (first.uid, first.mtime),
            (1000, 1_000),
            "ids kept, mtime clamped"
        );
        assert!(matches!(&tree.get("zz/file").unwrap().kind, Kind::Hardlink(t) if t == "aa/link"));
        let ping = tree.get("usr/bin/ping").unwrap();
        assert_eq!(ping.xattrs.get("security.capability").unwrap(), b"\x01cap");

        let blob = tree
            .write_layer(&tmp.path().join("b"), Compression::Gzip, 1_000, 1)
            .unwrap();
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(
            File::open(&blob.path).unwrap(),
        ));
        let mut names = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            if name == "usr/bin/ping" {
                let x: Vec<_> = e
                    .pax_extensions()
                    .unwrap()
                    .unwrap()
                    .map(|x| x.unwrap().key().unwrap().to_string())
                    .collect();
                assert_eq!(x, ["SCHILY.xattr.security.capability"]);
            }
            names.push(name);
        }
        assert_eq!(
            names,
            [
                "aa/",
                "aa/link",
                "usr/",
                "usr/bin/",
                "usr/bin/ping",
                "zz/",
                "zz/file"
            ]
        );
    }

    #[test]
    fn upper_layers_fit_onto_the_base() {
        let mut base = Tree::new();
        base.insert(
            "lib",
            Entry::root(Kind::Symlink("usr/lib".into()), 0o777, 1),
        )
        .unwrap();
        base.insert("root", Entry::root(Kind::Dir, 0o700, 1))
            .unwrap();
        let shape = base.shape();
        let file = || Entry::root(Kind::File(Data::Bytes(Arc::new(vec![]))), 0o644, 1);
        let mut up = Tree::new();
        up.insert("root/.profile", file()).unwrap();
        up.fit_onto(&shape).unwrap();
        assert_eq!(
            up.get("root").unwrap().mode,
            0o700,
            "base dir metadata repeated"
        );
        let mut bad = Tree::new();
        bad.insert("lib/systemd/system/x.service", file()).unwrap();
        let e = bad.fit_onto(&shape).unwrap_err().to_string();
        assert!(e.contains("/lib is a symlink"), "{e}");
    }

    #[test]
    fn rejects_dotdot() {
        assert!(clean_path("a/../b").is_err());
        assert_eq!(clean_path("./a//b/").unwrap().as_deref(), Some("a/b"));
        assert_eq!(clean_path("./").unwrap(), None);
    }
}
