//! The safe layer unpacker: applies an image's layers, in order, into an
//! empty staging directory, refusing anything that could reach outside it,
//! smuggle privileges in, or exhaust the host.
//!
//! Given: the staging directory (opened once as a handle), a [`Policy`], and
//! per layer a reader of the blob with its compressed digest (for errors),
//! its `diff_id` and its compression. It decompresses in-process (gzip,
//! zstd, plain tar), hashes the uncompressed stream against the `diff_id`,
//! reads raw entries with the `tar` crate (GNU long names and PAX headers
//! are interpreted here, read with caps, so no header can make it allocate
//! without bound) and applies them with its own code (`apply.rs`): never following a symlink, with OCI whiteout and
//! opaque-directory semantics (`whiteout.rs`) and the name rules of
//! `path.rs`. Every refusal is an [`UnpackError`] naming layer, entry and
//! [`Rule`]. In [`Whiteouts::Overlay`] mode (one layer per target, for an
//! overlayfs lower directory) whiteouts are recorded as overlayfs ones
//! instead of applied: `.wh.NAME` becomes a 0:0 character device `NAME`,
//! `.wh..wh..opq` the `trusted.overlay.opaque=y` xattr on its directory.
//!
//! Deliberately not here: fetching or trusting blobs (the store and
//! `verify` do that; the `diff_id` check here is defence in depth and the
//! only check of the uncompressed bytes), choosing or renaming the staging
//! directory (on any error the caller throws it away: the tree is then
//! half-applied garbage), device nodes (never created), xattrs other than
//! `security.capability` and `user.*` (ignored and counted: `trusted.*`,
//! `security.selinux`, ACLs and the like are host policy, not image
//! content, and ignoring them never grants more than the mode bits), and
//! per-file fsync (one `syncfs` in [`Unpacker::finish`]).

mod apply;
pub mod path;
pub mod rules;
pub mod whiteout;

use std::cell::Cell;
use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::rc::Rc;

use apply::{Fail, Meta, Tree};
pub use path::ImagePath;
pub use rules::{escape, Limits, Policy, Rule, UnpackError};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec};
use rustix::io::Errno;
use whiteout::Kind;

use crate::digest::{Digest, HashingReader};
use crate::oci::Compression;

/// Read buffer between the decompressor and the tar reader, and for file
/// contents. Memory use does not depend on layer size beyond this (plus the
/// per-layer path sets, bounded by `max_entries`).
const BUF_BYTES: usize = 256 * 1024;

/// Largest zstd window accepted (2^25 = 32 MiB): a frame asking for more is
/// refused rather than allowed to allocate it. Default zstd levels use
/// 8 MiB at most; `zstd --long` (128 MiB) is refused.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// One layer to apply.
pub struct Layer<R> {
    /// Position in the manifest, from 0.
    pub index: usize,
    /// Digest of the compressed blob (named in errors).
    pub digest: Digest,
    /// Expected digest of the uncompressed tar stream (from the config).
    pub diff_id: Digest,
    pub compression: Compression,
    pub reader: R,
}

/// What one layer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub index: usize,
    /// Uncompressed tar bytes (they hashed to the `diff_id`).
    pub bytes: u64,
    /// Tar entries (metadata headers not counted).
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// FIFOs and sockets (only with `allow_fifos_and_sockets`).
    pub nodes: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Extended attributes ignored (namespaces other than
    /// `security.capability` and `user.*`, or on symlinks and nodes).
    pub ignored_xattrs: u64,
}

/// Totals over all layers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub layers: usize,
    pub bytes: u64,
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub whiteouts: u64,
    pub ignored_xattrs: u64,
}

/// Applies layers into one staging directory. Build with [`Unpacker::new`],
/// call [`Unpacker::apply`] once per layer in manifest order, then
/// [`Unpacker::finish`]. After an error the unpacker refuses further work.
pub struct Unpacker {
    tree: Tree,
    policy: Policy,
    setuid_allowed: HashSet<String>,
    stats: Stats,
    buf: Vec<u8>,
    keys: (RandomState, RandomState),
    failed: bool,
    whiteouts: Whiteouts,
}

/// What a whiteout entry does to the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Whiteouts {
    /// All layers go into one tree: a whiteout removes what lower layers
    /// put there (the copy mode).
    #[default]
    Apply,
    /// The target holds one layer, to be an overlayfs lower directory: a
    /// whiteout is recorded as an overlayfs whiteout (a 0:0 character
    /// device), an opaque marker as `trusted.overlay.opaque=y` on its
    /// directory. A hardlink can only point into the same layer.
    Overlay,
}

/// The xattr that makes an overlayfs directory hide lower layers' entries.
pub const OVERLAY_OPAQUE: &str = "trusted.overlay.opaque";

/// A reader that counts uncompressed bytes and fails once they pass a
/// budget; `tripped` tells the caller the failure was the budget.
struct Budget<R> {
    inner: R,
    used: u64,
    limit: u64,
    tripped: Rc<Cell<bool>>,
}

impl<R: Read> Read for Budget<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.used += n as u64;
        if self.used > self.limit {
            self.tripped.set(true);
            return Err(io::Error::other("uncompressed size budget exceeded"));
        }
        Ok(n)
    }
}

/// Directories a layer changed without listing them, with their times from
/// before the change: restored when the layer is done, so a directory's time
/// is what the image says (as umoci does), not the time of unpacking.
#[derive(Default)]
struct SavedTimes {
    seen: HashSet<u128>,
    times: Vec<(ImagePath, rfs::Timestamps)>,
}

impl SavedTimes {
    /// Remembers the times of directory `path` (handle `fd`, key `key`)
    /// the first time this layer is about to change it.
    fn note(&mut self, key: u128, path: &[u8], fd: BorrowedFd<'_>) -> Result<(), Fail> {
        if !self.seen.insert(key) {
            return Ok(());
        }
        let st = rfs::fstat(fd).map_err(|e| {
            (
                Rule::Io,
                format!("stat directory \"{}\": {e}", escape(path)),
            )
        })?;
        let ts = |sec: i64, nsec: u64| Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        };
        self.times.push((
            ImagePath::from_normalised(path),
            rfs::Timestamps {
                last_access: ts(st.st_atime as i64, st.st_atime_nsec as u64),
                last_modification: ts(st.st_mtime as i64, st.st_mtime_nsec as u64),
            },
        ));
        Ok(())
    }
}

/// Per-layer bookkeeping: paths this layer wrote (duplicate detection, and
/// "entries of the same layer survive whiteouts"), their ancestors, and
/// directory times to set once the layer is complete.
struct LayerState {
    written: HashSet<u128>,
    ancestors: HashSet<u128>,
    dir_times: Vec<(ImagePath, Timespec)>,
    saved: SavedTimes,
    stats: LayerStats,
    /// Paths this layer whited out ([`Whiteouts::Overlay`] only).
    whited: HashSet<u128>,
}

impl Unpacker {
    /// `target` must exist and be empty; it is opened once as a directory fd.
    pub fn new(target: &Path, policy: Policy) -> Result<Unpacker, UnpackError> {
        let tree = Tree::open(target).map_err(|(rule, detail)| UnpackError {
            layer: None,
            entry: None,
            rule,
            detail,
        })?;
        // Only the shape matters here; the limits apply to entries.
        let unlimited = Limits {
            max_path_bytes: usize::MAX,
            max_depth: usize::MAX,
            ..Limits::default()
        };
        for entry in &policy.setuid_allowlist {
            let normal = entry
                .strip_prefix('/')
                .and_then(|rest| ImagePath::parse(rest.as_bytes(), &unlimited).ok())
                .filter(|p| !p.is_root())
                .is_some_and(|p| p.to_absolute() == *entry);
            if !normal {
                return Err(UnpackError {
                    layer: None,
                    entry: None,
                    rule: Rule::Policy,
                    detail: format!(
                        "setuid allowlist entry {entry:?} is not a normalised absolute path (like \"/usr/bin/su\")"
                    ),
                });
            }
        }
        let setuid_allowed = policy.setuid_allowlist.iter().cloned().collect();
        Ok(Unpacker {
            tree,
            policy,
            setuid_allowed,
            stats: Stats::default(),
            buf: vec![0; BUF_BYTES],
            keys: (RandomState::new(), RandomState::new()),
            failed: false,
            whiteouts: Whiteouts::Apply,
        })
    }

    /// An unpacker for one layer into its own directory, whiteouts recorded
    /// the overlayfs way ([`Whiteouts::Overlay`]).
    pub fn new_overlay_layer(target: &Path, policy: Policy) -> Result<Unpacker, UnpackError> {
        let mut u = Unpacker::new(target, policy)?;
        u.whiteouts = Whiteouts::Overlay;
        Ok(u)
    }

    /// Applies one layer (decompress in-process: flate2 gzip, zstd, plain tar),
    /// hashing the uncompressed stream and comparing it with `diff_id` at the end.
    pub fn apply<R: Read>(&mut self, layer: Layer<R>) -> Result<LayerStats, UnpackError> {
        let (index, digest) = (layer.index, layer.digest);
        let at = |rule: Rule, detail: String| UnpackError {
            layer: Some((index, digest)),
            entry: None,
            rule,
            detail,
        };
        if self.failed {
            return Err(at(
                Rule::Target,
                "an earlier layer failed; the staging directory must be discarded".into(),
            ));
        }
        self.failed = true; // cleared on success
        let limits = &self.policy.limits;
        let total_left = limits.max_total_bytes.saturating_sub(self.stats.bytes);
        let (limit, limit_rule, limit_what) = if total_left < limits.max_layer_bytes {
            (total_left, Rule::TotalTooLarge, "all layers together")
        } else {
            (limits.max_layer_bytes, Rule::LayerTooLarge, "one layer")
        };
        let limit_value = match limit_rule {
            Rule::TotalTooLarge => limits.max_total_bytes,
            _ => limits.max_layer_bytes,
        };
        let tripped = Rc::new(Cell::new(false));
        let over_budget = || {
            at(
                limit_rule,
                format!("uncompressed bytes pass the limit for {limit_what} ({limit_value} bytes)"),
            )
        };

        let decoder: Box<dyn Read + '_> = match layer.compression {
            Compression::None => Box::new(layer.reader),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(layer.reader)),
            Compression::Zstd => {
                let mut d = zstd::stream::read::Decoder::new(layer.reader)
                    .map_err(|e| at(Rule::MalformedArchive, format!("zstd decoder: {e}")))?;
                d.window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(|e| at(Rule::MalformedArchive, format!("zstd decoder: {e}")))?;
                Box::new(d)
            }
        };
        let budget = Budget {
            inner: HashingReader::new(decoder),
            used: 0,
            limit,
            tripped: tripped.clone(),
        };
        let mut archive = tar::Archive::new(BufReader::with_capacity(BUF_BYTES, budget));
        let mut state = LayerState {
            written: HashSet::new(),
            whited: HashSet::new(),
            ancestors: HashSet::new(),
            dir_times: Vec::new(),
            saved: SavedTimes::default(),
            stats: LayerStats {
                index,
                ..LayerStats::default()
            },
        };

        let stream_err = |e: io::Error, what: &str| {
            if tripped.get() {
                over_budget()
            } else {
                at(Rule::MalformedArchive, format!("{what}: {e}"))
            }
        };

        {
            // Raw iteration: the tar crate would read GNU long names and PAX
            // headers of any size into memory; we read them with caps and
            // interpret them ourselves (`Ext`).
            let entries = archive
                .entries()
                .map_err(|e| stream_err(e, "reading the tar stream"))?
                .raw(true);
            let mut ext = Ext::default();
            let mut i = 0u64;
            for entry in entries {
                let mut entry = entry
                    .map_err(|e| stream_err(e, &format!("reading tar header after entry {i}")))?;
                let ty = entry.header().entry_type();
                let with_entry = |mut e: UnpackError, name: &[u8]| {
                    e.entry = Some((i, escape(name)));
                    e
                };
                let meta_cap = match ty {
                    tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
                        // the name, its NUL, and nothing more
                        Some(self.policy.limits.max_path_bytes as u64 + 1)
                    }
                    tar::EntryType::XHeader => Some(MAX_PAX_BYTES),
                    _ => None,
                };
                if let Some(cap) = meta_cap {
                    let raw_name = entry.header().path_bytes().into_owned();
                    let data = read_capped(&mut entry, cap, ty).map_err(|step| match step {
                        Step::Stream(e) => {
                            with_entry(stream_err(e, "reading a tar extension header"), &raw_name)
                        }
                        Step::Rule(r, d) => with_entry(at(r, d), &raw_name),
                    })?;
                    ext.set(ty, data)
                        .map_err(|(r, d)| with_entry(at(r, d), &raw_name))?;
                    continue;
                }
                let ext_now = std::mem::take(&mut ext);
                let raw_path = ext_now.path(entry.header());
                self.stats.entries += 1;
                if self.stats.entries > self.policy.limits.max_entries {
                    let e = at(
                        Rule::TooManyEntries,
                        format!(
                            "more than {} entries in the image",
                            self.policy.limits.max_entries
                        ),
                    );
                    return Err(with_entry(e, &raw_path));
                }
                state.stats.entries += 1;
                match self.entry(&mut entry, &ext_now, &raw_path, &mut state) {
                    Ok(()) => {}
                    Err(Step::Rule(rule, detail)) => {
                        return Err(with_entry(at(rule, detail), &raw_path))
                    }
                    Err(Step::Stream(e)) => {
                        let e = stream_err(e, "reading entry data");
                        return Err(with_entry(e, &raw_path));
                    }
                }
                i += 1;
            }
            if !ext.is_empty() {
                return Err(at(
                    Rule::MalformedArchive,
                    "the archive ends with an extension header that describes no entry".into(),
                ));
            }
        }

        // The tar end marker is not the end of the stream: hash the rest so
        // the diff_id covers every byte, and refuse anything but zero
        // padding there (data after the end marker is what another parser
        // might read as more entries).
        let mut rest = archive.into_inner();
        let mut buf = [0u8; 8192];
        let mut offset = 0u64;
        loop {
            let n = rest
                .read(&mut buf)
                .map_err(|e| stream_err(e, "reading past the tar end"))?;
            if n == 0 {
                break;
            }
            if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
                return Err(at(
                    Rule::MalformedArchive,
                    format!(
                        "data after the tar end marker (a non-zero byte {} bytes past it)",
                        offset + i as u64
                    ),
                ));
            }
            offset += n as u64;
        }
        let (actual, bytes) = rest.into_inner().inner.finish();
        if actual != layer.diff_id {
            return Err(at(
                Rule::DiffIdMismatch,
                format!(
                    "the uncompressed layer ({bytes} bytes) hashes to {actual}, the config's diff_id is {}",
                    layer.diff_id
                ),
            ));
        }
        // Saved times first: an explicit entry for the same directory wins.
        self.set_dir_times(state.saved.times.iter().map(|(p, t)| (p, t.clone())))
            .map_err(|(rule, detail)| at(rule, detail))?;
        let explicit = state.dir_times.iter().map(|(p, m)| {
            (
                p,
                rfs::Timestamps {
                    last_access: *m,
                    last_modification: *m,
                },
            )
        });
        self.set_dir_times(explicit)
            .map_err(|(rule, detail)| at(rule, detail))?;

        let s = &mut state.stats;
        s.bytes = bytes;
        self.stats.layers += 1;
        self.stats.bytes += bytes;
        self.stats.files += s.files;
        self.stats.dirs += s.dirs;
        self.stats.symlinks += s.symlinks;
        self.stats.hardlinks += s.hardlinks;
        self.stats.whiteouts += s.whiteouts;
        self.stats.ignored_xattrs += s.ignored_xattrs;
        self.failed = false;
        Ok(state.stats)
    }

    /// Syncs the tree (syncfs on the target fd) and returns totals.
    pub fn finish(self) -> Result<Stats, UnpackError> {
        let err = |rule, detail| UnpackError {
            layer: None,
            entry: None,
            rule,
            detail,
        };
        if self.failed {
            return Err(err(
                Rule::Target,
                "a layer failed; the staging directory must be discarded".into(),
            ));
        }
        rfs::syncfs(self.tree.root())
            .map_err(|e| err(Rule::Io, format!("syncfs on the target: {e}")))?;
        Ok(self.stats)
    }

    /// A 128-bit keyed hash of a path (per-unpacker random keys): the
    /// per-layer sets hold these instead of names, so their size does not
    /// grow with name length.
    fn path_key(&self, p: &[u8]) -> u128 {
        let a = self.keys.0.hash_one(p) as u128;
        let b = self.keys.1.hash_one(p) as u128;
        (a << 64) | b
    }

    /// Applies one entry.
    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Ext,
        raw_path: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let limits = &self.policy.limits;
        let header = entry.header();
        let ty = header.entry_type();
        let raw_mode = header
            .mode()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("mode field: {e}")))?;
        let mut uid = header
            .uid()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("uid field: {e}")))?;
        let mut gid = header
            .gid()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("gid field: {e}")))?;
        let header_size = header
            .entry_size()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("size field: {e}")))?;
        let mut mtime = Timespec {
            tv_sec: header
                .mtime()
                .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("mtime field: {e}")))?
                .min(i64::MAX as u64) as i64,
            tv_nsec: 0,
        };

        // Entry types first: some are refused whatever their name.
        let kind = match ty {
            tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
            tar::EntryType::Directory => EntryKind::Dir,
            tar::EntryType::Symlink => EntryKind::Symlink,
            tar::EntryType::Link => EntryKind::Hardlink,
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(Step::Rule(
                    Rule::Device,
                    "device nodes are never created from an image".into(),
                ))
            }
            tar::EntryType::Fifo => EntryKind::Node(FileType::Fifo),
            tar::EntryType::XGlobalHeader => {
                return Err(Step::Rule(
                    Rule::PaxGlobalHeader,
                    "a PAX global header would change how every later entry is read".into(),
                ))
            }
            tar::EntryType::GNUSparse => {
                return Err(Step::Rule(
                    Rule::Sparse,
                    "GNU sparse entries are not supported".into(),
                ))
            }
            other => {
                return Err(Step::Rule(
                    Rule::EntryType,
                    format!(
                        "entry type {:?} ({}) is not applied",
                        other,
                        other.as_byte() as char
                    ),
                ))
            }
        };
        // Sockets have no tar type; a writer can only express one in the
        // mode's file-type bits.
        let kind = if raw_mode & 0o170000 == 0o140000 {
            EntryKind::Node(FileType::Socket)
        } else {
            kind
        };
        if let EntryKind::Node(ft) = kind {
            if !self.policy.allow_fifos_and_sockets {
                return Err(Step::Rule(
                    Rule::FifoOrSocket,
                    format!("a {ft:?} entry, and the policy refuses FIFOs and sockets"),
                ));
            }
        }
        let mode = raw_mode & 0o7777;

        // PAX records: sparse markers, size/uid/gid/mtime overrides, xattrs.
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(pax) = &ext.pax {
            let bad = |what: &str, v: &[u8]| {
                Step::Rule(
                    Rule::MalformedArchive,
                    format!("PAX {what} {:?}", escape(v)),
                )
            };
            let mut keys = std::collections::BTreeSet::new();
            for rec in tar::PaxExtensions::new(pax) {
                let rec = rec
                    .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("PAX record: {e}")))?;
                let (key, value) = (rec.key_bytes(), rec.value_bytes());
                // Parsers disagree on which of two values wins.
                if !keys.insert(key) {
                    return Err(Step::Rule(
                        Rule::MalformedArchive,
                        format!("PAX key {:?} appears twice in one header", escape(key)),
                    ));
                }
                match key {
                    b"mtime" => mtime = parse_pax_time(value).ok_or_else(|| bad("mtime", value))?,
                    b"uid" => uid = parse_u64(value).ok_or_else(|| bad("uid", value))?,
                    b"gid" => gid = parse_u64(value).ok_or_else(|| bad("gid", value))?,
                    // The raw reader skips by the header's size; a PAX size
                    // that disagrees would make parsers see different files.
                    b"size" => {
                        if parse_u64(value) != Some(header_size) {
                            return Err(Step::Rule(
                                Rule::MalformedArchive,
                                format!(
                                    "PAX size {:?} disagrees with the header's {header_size}",
                                    escape(value)
                                ),
                            ));
                        }
                    }
                    _ if key.starts_with(b"GNU.sparse.") => {
                        return Err(Step::Rule(
                            Rule::Sparse,
                            "PAX GNU.sparse records mark a sparse entry".into(),
                        ));
                    }
                    _ => {
                        if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                            xattrs
                                .push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
                        } else if key.starts_with(b"LIBARCHIVE.xattr.") {
                            state.stats.ignored_xattrs += 1;
                        }
                    }
                }
            }
        }

        ext.check()?;
        let path = ImagePath::parse(raw_path, limits).map_err(|(r, d)| Step::Rule(r, d))?;
        let meta = Meta {
            uid: uid.min(u32::MAX as u64) as u32,
            gid: gid.min(u32::MAX as u64) as u32,
            mode,
            mtime,
        };
        // (u32)-1 means "leave unchanged" to chown: the file would stay
        // root-owned while the image said otherwise.
        if uid >= u32::MAX as u64 || gid >= u32::MAX as u64 {
            return Err(Step::Rule(
                Rule::MalformedArchive,
                format!("owner {uid}:{gid} is not a valid 32-bit uid:gid"),
            ));
        }

        // One path, one entry per layer: a second entry for the same path
        // is how tar-level tricks make tools disagree.
        let key = self.path_key(path.as_bytes());
        if !state.written.insert(key) {
            return Err(Step::Rule(
                Rule::Duplicate,
                "the same path appears twice in one layer".into(),
            ));
        }
        for anc in path.ancestors() {
            if !state.ancestors.insert(self.path_key(anc)) {
                break; // its own ancestors were recorded with it
            }
        }

        if path.is_root() {
            if kind != EntryKind::Dir {
                return Err(Step::Rule(
                    Rule::RootEntry,
                    "the root of the tree can only be a directory".into(),
                ));
            }
            let fd = rfs::openat(
                self.tree.root(),
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Step::Rule(Rule::Io, format!("open the target: {e}")))?;
            self.set_meta(&fd, &path, &meta, &xattrs, false, &mut state.stats)?;
            state.dir_times.push((path, mtime));
            state.stats.dirs += 1;
            return Ok(());
        }

        match whiteout::classify(&path).map_err(|(r, d)| Step::Rule(r, d))? {
            Kind::Plain => {}
            Kind::Whiteout(dir, name) => {
                state.stats.whiteouts += 1;
                return self.whiteout(dir, name, state);
            }
            Kind::Opaque(dir) => {
                state.stats.opaque_dirs += 1;
                return self.opaque(dir, state);
            }
        }

        let Some((dir, name)) = path.split_last() else {
            return Err(Step::Rule(
                Rule::RootEntry,
                "the root of the tree can only be a directory".into(),
            ));
        };
        let shown = path.as_bytes();
        match kind {
            EntryKind::File => {
                self.check_setuid(&path, mode, &xattrs)?;
                let parent = self.parent(dir, state)?;
                let mut file = self.tree.create_file(parent.as_fd(), name, shown)?;
                let expected = entry.size();
                let mut copied = 0u64;
                loop {
                    let k = match entry.read(&mut self.buf) {
                        Ok(0) => break,
                        Ok(k) => k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(Step::Stream(e)),
                    };
                    file.write_all(&self.buf[..k]).map_err(|e| {
                        Step::Rule(Rule::Io, format!("write \"{}\": {e}", escape(shown)))
                    })?;
                    copied += k as u64;
                }
                if copied != expected {
                    return Err(Step::Rule(
                        Rule::MalformedArchive,
                        format!("entry data ends after {copied} of {expected} bytes"),
                    ));
                }
                self.set_meta(&file, &path, &meta, &xattrs, true, &mut state.stats)?;
                state.stats.files += 1;
            }
            EntryKind::Dir => {
                let parent = self.parent(dir, state)?;
                let fd = self.tree.create_dir(parent.as_fd(), name, shown)?;
                self.set_meta(&fd, &path, &meta, &xattrs, false, &mut state.stats)?;
                if self.whiteouts == Whiteouts::Overlay && state.whited.contains(&key) {
                    // Whited out and written in the same layer: the lower
                    // layers' directory is gone, this layer's stays.
                    set_opaque(&fd, shown)?;
                }
                state.dir_times.push((path, mtime));
                state.stats.dirs += 1;
            }
            EntryKind::Symlink => {
                let target = ext.link(entry.header());
                check_link_target(&target, limits)?;
                state.stats.ignored_xattrs += xattrs.len() as u64;
                let parent = self.parent(dir, state)?;
                self.tree
                    .create_symlink(parent.as_fd(), name, &target, &meta, shown)?;
                state.stats.symlinks += 1;
            }
            EntryKind::Hardlink => {
                let target = ext.link(entry.header());
                self.hardlink(&path, &target, state)?;
                state.stats.ignored_xattrs += xattrs.len() as u64;
                state.stats.hardlinks += 1;
            }
            EntryKind::Node(ft) => {
                state.stats.ignored_xattrs += xattrs.len() as u64;
                let parent = self.parent(dir, state)?;
                self.tree
                    .create_node(parent.as_fd(), name, ft, &meta, shown)?;
                state.stats.nodes += 1;
            }
        }
        Ok(())
    }

    /// The parent directory of a new leaf, created if missing (a handle of
    /// its own, so the tree can be changed while it is held).
    fn parent(&mut self, dir: &[u8], state: &mut LayerState) -> Result<std::os::fd::OwnedFd, Step> {
        let key = self.path_key(dir);
        if let Some(fd) = self.tree.dir(dir, false)? {
            state.saved.note(key, dir, fd)?;
        } else {
            // Missing parents are about to be created: their first existing
            // ancestor changes.
            let dir_path = ImagePath::from_normalised(dir);
            for anc in dir_path.ancestors().chain([&b""[..]]) {
                let key = self.path_key(anc);
                if let Some(fd) = self.tree.open_dir(anc, false)? {
                    state.saved.note(key, anc, fd.as_fd())?;
                    break;
                }
            }
        }
        let fd = self.tree.dir(dir, true)?.ok_or_else(|| {
            Step::Rule(
                Rule::Io,
                format!("parent \"{}\" was not created", escape(dir)),
            )
        })?;
        fd.try_clone_to_owned()
            .map_err(|e| Step::Rule(Rule::Io, format!("duplicate a directory handle: {e}")))
    }

    /// Whether `path` is on the setuid allowlist (compared byte for byte; a
    /// name that is not UTF-8 never is).
    fn allowlisted(&self, path: &ImagePath) -> bool {
        std::str::from_utf8(path.as_bytes())
            .is_ok_and(|s| self.setuid_allowed.contains(&format!("/{s}")))
    }

    /// Setuid/setgid bits and file capabilities only on allowlisted paths.
    fn check_setuid(
        &self,
        path: &ImagePath,
        mode: u32,
        xattrs: &[(String, Vec<u8>)],
    ) -> Result<(), Step> {
        let caps = xattrs.iter().any(|(n, _)| n == "security.capability");
        if (mode & 0o6000 != 0 || caps) && !self.allowlisted(path) {
            let what = if caps {
                "file capabilities (security.capability)".to_string()
            } else {
                format!("mode {mode:04o} (setuid/setgid)")
            };
            return Err(Step::Rule(
                Rule::Setuid,
                format!(
                    "{what} on {}, which is not in the setuid allowlist",
                    path.to_absolute()
                ),
            ));
        }
        Ok(())
    }

    /// Owner, mode, allowed xattrs, and (for files) times, in the order that
    /// keeps them: chown clears setuid bits and capabilities, so it goes
    /// first; writing clears capabilities, so data is already written.
    fn set_meta(
        &self,
        fd: &impl AsFd,
        path: &ImagePath,
        meta: &Meta,
        xattrs: &[(String, Vec<u8>)],
        is_file: bool,
        stats: &mut LayerStats,
    ) -> Result<(), Step> {
        let shown = || escape(path.as_bytes());
        rfs::fchown(
            fd,
            Some(rfs::Uid::from_raw(meta.uid)),
            Some(rfs::Gid::from_raw(meta.gid)),
        )
        .map_err(|e| Step::Rule(Rule::Io, format!("chown \"{}\": {e}", shown())))?;
        rfs::fchmod(fd, Mode::from_raw_mode(meta.mode))
            .map_err(|e| Step::Rule(Rule::Io, format!("chmod \"{}\": {e}", shown())))?;
        for (name, value) in xattrs {
            let wanted = name.starts_with("user.") || (is_file && name == "security.capability");
            if !wanted {
                stats.ignored_xattrs += 1;
                continue;
            }
            rfs::fsetxattr(fd, name.as_str(), value, rfs::XattrFlags::empty()).map_err(|e| {
                Step::Rule(
                    Rule::Xattr,
                    format!("xattr {name:?} on \"{}\": {e}", shown()),
                )
            })?;
        }
        if is_file {
            rfs::futimens(fd, &meta.timestamps())
                .map_err(|e| Step::Rule(Rule::Io, format!("set times \"{}\": {e}", shown())))?;
        }
        Ok(())
    }

    /// A hardlink: the target must be a regular file already in the tree
    /// (in overlay mode: in this layer).
    fn hardlink(
        &mut self,
        path: &ImagePath,
        target: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let limits = &self.policy.limits;
        let tpath = ImagePath::parse(target, limits).map_err(|(r, d)| match r {
            Rule::Dotdot | Rule::Absolute => Step::Rule(
                Rule::HardlinkOutside,
                format!("hardlink target \"{}\": {d}", escape(target)),
            ),
            r => Step::Rule(r, format!("hardlink target \"{}\": {d}", escape(target))),
        })?;
        let overlay = self.whiteouts == Whiteouts::Overlay;
        let missing = || {
            Step::Rule(
                Rule::HardlinkMissing,
                if overlay {
                    format!(
                        "hardlink target \"{}\" is not in this layer (an overlay layer cannot link into a lower one; slots.mode = \"copy\" can)",
                        escape(tpath.as_bytes())
                    )
                } else {
                    format!(
                        "hardlink target \"{}\" is not in the tree (yet)",
                        escape(tpath.as_bytes())
                    )
                },
            )
        };
        let Some((tdir, tname)) = tpath.split_last() else {
            return Err(Step::Rule(
                Rule::HardlinkToDirectory,
                "hardlink to the root directory".into(),
            ));
        };
        let tparent = self.tree.open_dir(tdir, false)?.ok_or_else(missing)?;
        let st = match rfs::statat(&tparent, tname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Err(missing()),
            Err(e) => return Err(Step::Rule(Rule::Io, format!("stat hardlink target: {e}"))),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => {
                return Err(Step::Rule(
                    Rule::HardlinkToDirectory,
                    format!(
                        "hardlink target \"{}\" is a directory",
                        escape(tpath.as_bytes())
                    ),
                ))
            }
            other => {
                return Err(Step::Rule(
                    Rule::HardlinkNotRegular,
                    format!(
                        "hardlink target \"{}\" is a {other:?}, not a regular file",
                        escape(tpath.as_bytes())
                    ),
                ))
            }
        }
        // A second name for a privileged file is a privileged file.
        let mut privileged = st.st_mode & 0o6000 != 0;
        if !privileged {
            let f = rfs::openat(
                &tparent,
                tname,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .map_err(|e| Step::Rule(Rule::Io, format!("open hardlink target: {e}")))?;
            privileged = rfs::fgetxattr(&f, "security.capability", &mut [0u8; 64][..]).is_ok();
        }
        if privileged && !self.allowlisted(path) {
            return Err(Step::Rule(
                Rule::Setuid,
                format!(
                    "hardlink {} to setuid/setgid or capability file \"{}\" is not in the setuid allowlist",
                    path.to_absolute(),
                    escape(tpath.as_bytes())
                ),
            ));
        }
        let Some((dir, name)) = path.split_last() else {
            return Err(Step::Rule(
                Rule::RootEntry,
                "the root of the tree can only be a directory".into(),
            ));
        };
        let parent = self.parent(dir, state)?;
        self.tree.create_hardlink(
            tparent.as_fd(),
            tname,
            parent.as_fd(),
            name,
            path.as_bytes(),
        )?;
        Ok(())
    }

    /// `dir/.wh.name`: removes `dir/name` of lower layers. If this layer
    /// already wrote that path (or something under it), only lower
    /// layers' contents beneath it go.
    fn whiteout(&mut self, dir: &[u8], name: &[u8], state: &mut LayerState) -> Result<(), Step> {
        if self.whiteouts == Whiteouts::Overlay {
            return self.overlay_whiteout(dir, name, state);
        }
        let Some(parent) = self.tree.open_dir(dir, false)? else {
            return Ok(()); // nothing below to hide
        };
        let target = ImagePath::from_normalised(dir).join(name);
        let key = self.path_key(target.as_bytes());
        if state.written.contains(&key) || state.ancestors.contains(&key) {
            // This layer's own non-directory stays as it is; a directory
            // keeps this layer's entries and loses lower layers' ones.
            if let Ok(fd) = rfs::openat(
                &parent,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                self.prune(&fd, &target, state)?;
            }
            return Ok(());
        }
        let exists = rfs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if exists {
            state.saved.note(self.path_key(dir), dir, parent.as_fd())?;
            self.tree.remove(parent.as_fd(), name, target.as_bytes())?;
        }
        Ok(())
    }

    /// `dir/.wh..wh..opq`: removes lower layers' entries in `dir`.
    fn opaque(&mut self, dir: &[u8], state: &mut LayerState) -> Result<(), Step> {
        if self.whiteouts == Whiteouts::Overlay {
            let parent = self.parent(dir, state)?;
            return set_opaque(&parent, dir);
        }
        let Some(fd) = self.tree.open_dir(dir, false)? else {
            return Ok(());
        };
        self.prune(&fd, &ImagePath::from_normalised(dir), state)
    }

    /// `dir/.wh.name` in a layer of its own: an overlayfs whiteout device
    /// `dir/name` (0:0), unless this layer wrote that path itself: its own
    /// non-directory hides the lower one already, its own directory becomes
    /// opaque. A later entry of this layer for the path replaces the device.
    fn overlay_whiteout(
        &mut self,
        dir: &[u8],
        name: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let target = ImagePath::from_normalised(dir).join(name);
        let key = self.path_key(target.as_bytes());
        let parent = self.parent(dir, state)?;
        if state.written.contains(&key) || state.ancestors.contains(&key) {
            if let Ok(fd) = rfs::openat(
                &parent,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                set_opaque(&fd, target.as_bytes())?;
            }
            return Ok(());
        }
        state.whited.insert(key);
        rfs::mknodat(
            &parent,
            name,
            FileType::CharacterDevice,
            Mode::empty(),
            rfs::makedev(0, 0),
        )
        .map_err(|e| {
            Step::Rule(
                Rule::Io,
                format!(
                    "create the overlayfs whiteout \"{}\" (a 0:0 character device): {e}",
                    escape(target.as_bytes())
                ),
            )
        })
    }

    /// Removes lower layers' entries under `dir` (see [`Tree::prune`]).
    fn prune(
        &mut self,
        fd: &std::os::fd::OwnedFd,
        dir: &ImagePath,
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let LayerState {
            written,
            ancestors,
            saved,
            ..
        } = state;
        let keys = &self.keys;
        let key_of = |p: &[u8]| {
            let a = keys.0.hash_one(p) as u128;
            let b = keys.1.hash_one(p) as u128;
            (a << 64) | b
        };
        let keep = |p: &[u8]| {
            let k = key_of(p);
            written.contains(&k) || ancestors.contains(&k)
        };
        let mut before_change =
            |p: &ImagePath, fd: BorrowedFd<'_>| saved.note(key_of(p.as_bytes()), p.as_bytes(), fd);
        let r = self.tree.prune(fd, dir, &keep, &mut before_change);
        self.tree.invalidate();
        r.map_err(Step::from)
    }

    /// Directory times, once no child will change them any more.
    fn set_dir_times<'p>(
        &self,
        dirs: impl Iterator<Item = (&'p ImagePath, rfs::Timestamps)>,
    ) -> Result<(), Fail> {
        for (path, ts) in dirs {
            let fd = if path.is_root() {
                rfs::openat(
                    self.tree.root(),
                    ".",
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            } else {
                rfs::openat2(
                    self.tree.root(),
                    path.as_bytes(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                )
            };
            match fd {
                Ok(fd) => rfs::futimens(&fd, &ts).map_err(|e| {
                    (
                        Rule::Io,
                        format!("set times \"{}\": {e}", escape(path.as_bytes())),
                    )
                })?,
                // Replaced later in the same layer: nothing to date.
                Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => {}
                Err(e) => {
                    return Err((
                        Rule::Io,
                        format!("open \"{}\": {e}", escape(path.as_bytes())),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Largest PAX extended header accepted (paths, times, xattrs all fit).
const MAX_PAX_BYTES: u64 = 1 << 20;

/// GNU long name/link and PAX headers seen since the last real entry; they
/// describe the next one.
#[derive(Default)]
struct Ext {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

impl Ext {
    fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }

    /// Records an extension header; two of a kind for one entry is an
    /// ambiguity parsers resolve differently, so it is refused.
    fn set(&mut self, ty: tar::EntryType, data: Vec<u8>) -> Result<(), Fail> {
        let (slot, what) = match ty {
            tar::EntryType::GNULongName => (&mut self.long_name, "GNU long name"),
            tar::EntryType::GNULongLink => (&mut self.long_link, "GNU long link"),
            _ => (&mut self.pax, "PAX"),
        };
        if slot.is_some() {
            return Err((
                Rule::MalformedArchive,
                format!("two {what} headers describe the same entry"),
            ));
        }
        *slot = Some(data);
        Ok(())
    }

    fn pax_value(&self, key: &[u8]) -> Option<&[u8]> {
        tar::PaxExtensions::new(self.pax.as_deref()?)
            .filter_map(Result::ok)
            .find(|r| r.key_bytes() == key)
            .map(|r| r.value_bytes())
    }

    /// The entry's name: PAX `path`, else the GNU long name (without its
    /// terminating NUL), else the header's (prefix and) name.
    fn path(&self, header: &tar::Header) -> Vec<u8> {
        if let Some(p) = self.pax_value(b"path") {
            return p.to_vec();
        }
        if let Some(n) = &self.long_name {
            return n.strip_suffix(b"\0").unwrap_or(n).to_vec();
        }
        header.path_bytes().into_owned()
    }

    /// The link target: PAX `linkpath`, else the GNU long link, else the header's.
    fn link(&self, header: &tar::Header) -> Vec<u8> {
        if let Some(p) = self.pax_value(b"linkpath") {
            return p.to_vec();
        }
        if let Some(n) = &self.long_link {
            return n.strip_suffix(b"\0").unwrap_or(n).to_vec();
        }
        header
            .link_name_bytes()
            .map(|c| c.into_owned())
            .unwrap_or_default()
    }

    /// A GNU long name and a PAX path for one entry may disagree; refuse both.
    fn check(&self) -> Result<(), Step> {
        if (self.long_name.is_some() && self.pax_value(b"path").is_some())
            || (self.long_link.is_some() && self.pax_value(b"linkpath").is_some())
        {
            return Err(Step::Rule(
                Rule::MalformedArchive,
                "both a GNU long name and a PAX path name this entry".into(),
            ));
        }
        Ok(())
    }
}

/// Reads an extension header's data, refusing it unread past `cap`.
fn read_capped<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    cap: u64,
    ty: tar::EntryType,
) -> Result<Vec<u8>, Step> {
    let size = entry.size();
    if size > cap {
        return Err(Step::Rule(
            if ty == tar::EntryType::XHeader {
                Rule::MalformedArchive
            } else {
                Rule::PathTooLong
            },
            format!("a {size}-byte extension header ({ty:?}), more than the {cap} allowed"),
        ));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut data).map_err(Step::Stream)?;
    if data.len() as u64 != size {
        return Err(Step::Rule(
            Rule::MalformedArchive,
            format!(
                "extension header data ends after {} of {size} bytes",
                data.len()
            ),
        ));
    }
    Ok(data)
}

/// Marks directory `fd` opaque for overlayfs (lower layers' entries under
/// it are hidden). `fd` may be an `O_PATH` handle: it is reopened readable.
fn set_opaque(fd: &impl AsFd, shown: &[u8]) -> Result<(), Step> {
    let readable = rfs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        Step::Rule(
            Rule::Io,
            format!("open directory \"{}\": {e}", escape(shown)),
        )
    })?;
    rfs::fsetxattr(&readable, OVERLAY_OPAQUE, b"y", rfs::XattrFlags::empty()).map_err(|e| {
        Step::Rule(
            Rule::Xattr,
            format!(
                "{OVERLAY_OPAQUE} on \"{}\" (the layer store's filesystem must keep trusted.* xattrs): {e}",
                escape(shown)
            ),
        )
    })
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Node(FileType),
}

/// How applying an entry failed: a rule, or the stream under it (whose
/// cause, budget or corruption, the caller knows).
enum Step {
    Rule(Rule, String),
    Stream(io::Error),
}

impl From<Fail> for Step {
    fn from((rule, detail): Fail) -> Step {
        Step::Rule(rule, detail)
    }
}

fn check_link_target(target: &[u8], limits: &Limits) -> Result<(), Step> {
    if target.is_empty() {
        return Err(Step::Rule(Rule::EmptyName, "empty symlink target".into()));
    }
    if target.contains(&0) {
        return Err(Step::Rule(
            Rule::NulByte,
            "symlink target contains a NUL byte".into(),
        ));
    }
    if target.len() > limits.max_path_bytes {
        return Err(Step::Rule(
            Rule::PathTooLong,
            format!(
                "symlink target is {} bytes, more than the limit of {}",
                target.len(),
                limits.max_path_bytes
            ),
        ));
    }
    Ok(())
}

/// A PAX time: `SECONDS[.FRACTION]`, possibly negative.
fn parse_pax_time(v: &[u8]) -> Option<Timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let tv_sec: i64 = secs.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let tv_nsec: i64 = digits.parse().ok()?;
    // -1.5 means 1.5 s before the epoch.
    if secs.starts_with('-') && tv_nsec > 0 {
        return Some(Timespec {
            tv_sec: tv_sec.checked_sub(1)?,
            tv_nsec: 1_000_000_000 - tv_nsec,
        });
    }
    Some(Timespec { tv_sec, tv_nsec })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        let t = parse_pax_time(b"1700000000.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 500_000_000));
        let t = parse_pax_time(b"12").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (12, 0));
        let t = parse_pax_time(b"-1.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (-2, 500_000_000));
        assert!(parse_pax_time(b"x").is_none());
    }
}
