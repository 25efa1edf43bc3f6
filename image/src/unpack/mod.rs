//! The safe layer unpacker: applies an image's layers, in order, into an
//! empty staging directory, refusing anything that could reach outside it,
//! smuggle privileges in, or exhaust the host.
//!
//! Given: the staging directory (opened once as a handle), a [`Policy`], and
//! per layer a reader of the blob with its compressed digest (for errors),
//! its `diff_id` and its compression. It decompresses in-process (gzip,
//! zstd, plain tar), hashes the uncompressed stream against the `diff_id`,
//! reads raw entries with the `tar` crate and decodes their headers itself
//! (`header.rs`: GNU long names and PAX headers read with caps, so no
//! header can make it allocate without bound), then applies each entry
//! with its own code, one function per kind (`entry.rs`) over the
//! handle-only tree (`apply.rs`): never following a symlink, with OCI
//! whiteout and opaque-directory semantics (`whiteout.rs`) and the name
//! rules of `path.rs`. This file reads the stream: decompression, the
//! uncompressed budget, the `diff_id`, padding after the end marker, and
//! directory times once a layer is complete. A layer is read on three
//! threads (`pipe.rs`): the caller's decompresses, one hashes the
//! `diff_id`, one parses and writes; the errors and their order are those
//! of one thread. Every refusal is an [`UnpackError`] naming layer, entry
//! and [`Rule`]. In [`Whiteouts::Overlay`] mode (one layer per target, for an
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
mod entry;
mod header;
pub mod path;
mod pipe;
pub mod rules;
pub mod whiteout;

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;

use apply::{Fail, Tree};
use header::Ext;
pub use path::ImagePath;
pub use rules::{escape, Limits, Policy, Rule, UnpackError};
use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags, Timespec};
use rustix::io::Errno;

use crate::digest::{Digest, Hasher};
use crate::oci::Compression;

/// Bytes asked of the decompressor per read call, and the buffer for file
/// contents. Memory use does not depend on layer size beyond these and the
/// chunks between the threads (`pipe.rs`: 6 MiB at most), plus the
/// per-layer path sets, bounded by `max_entries`.
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
    /// Whether regular files get their data ([`Unpacker::new_skeleton`]
    /// makes them empty).
    contents: bool,
    /// Size and sha256 of each regular file written, by inode, when
    /// [`Unpacker::hash_files`] asked for them.
    hashes: Option<FileHashes>,
}

/// The size and sha256 of the data of each regular file an unpacker wrote,
/// keyed by the file's `(st_dev, st_ino)`: computed from the bytes as they
/// were written, so a record of the tree needs no second read of them. An
/// inode's entry is its last write's (a file replaced later gets a new
/// inode; hard links share theirs).
pub type FileHashes = std::collections::HashMap<(u64, u64), (u64, Digest)>;

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
/// budget; `tripped` tells the tar thread the failure was the budget (set
/// before the failure is sent to it).
struct Budget<'a, R> {
    inner: R,
    used: u64,
    limit: u64,
    tripped: &'a AtomicBool,
}

impl<R: Read> Read for Budget<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.used += n as u64;
        if self.used > self.limit {
            self.tripped.store(true, Ordering::Release);
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

impl LayerState {
    /// Whether this layer wrote the path of `key`, or something under it.
    fn wrote(&self, key: u128) -> bool {
        self.written.contains(&key) || self.ancestors.contains(&key)
    }

    fn new(index: usize) -> LayerState {
        LayerState {
            written: HashSet::new(),
            whited: HashSet::new(),
            ancestors: HashSet::new(),
            dir_times: Vec::new(),
            saved: SavedTimes::default(),
            stats: LayerStats {
                index,
                ..LayerStats::default()
            },
        }
    }
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
            contents: true,
            hashes: None,
        })
    }

    /// From now on, hashes each regular file's data as it is written
    /// ([`FileHashes`], taken with [`Unpacker::take_file_hashes`]).
    pub fn hash_files(&mut self) {
        self.hashes.get_or_insert_with(FileHashes::new);
    }

    /// The hashes of the files written since [`Unpacker::hash_files`]
    /// (empty without it); meaningful once every layer applied.
    pub fn take_file_hashes(&mut self) -> FileHashes {
        self.hashes.take().unwrap_or_default()
    }

    /// An unpacker for one layer into its own directory, whiteouts recorded
    /// the overlayfs way ([`Whiteouts::Overlay`]).
    pub fn new_overlay_layer(target: &Path, policy: Policy) -> Result<Unpacker, UnpackError> {
        let mut u = Unpacker::new(target, policy)?;
        u.whiteouts = Whiteouts::Overlay;
        Ok(u)
    }

    /// An unpacker with the copy mode's semantics whose regular files are
    /// created empty (their data read, hashed with the layer and dropped):
    /// the shape and attributes of the tree without its bytes, for the
    /// overlay slots' metadata layer (`kubeslot-activator`'s `metalayer`).
    pub fn new_skeleton(target: &Path, policy: Policy) -> Result<Unpacker, UnpackError> {
        let mut u = Unpacker::new(target, policy)?;
        u.contents = false;
        Ok(u)
    }

    /// Applies one layer (decompress in-process: flate2 gzip, zstd, plain tar),
    /// hashing the uncompressed stream and comparing it with `diff_id` at the end.
    pub fn apply<R: Read>(&mut self, layer: Layer<R>) -> Result<LayerStats, UnpackError> {
        let errs = self.layer_errors(layer.index, layer.digest);
        if self.failed {
            return Err(errs.at(
                Rule::Target,
                "an earlier layer failed; the staging directory must be discarded".into(),
            ));
        }
        self.failed = true; // cleared on success
        let decoder = decompress(layer.compression, layer.reader)
            .map_err(|d| errs.at(Rule::MalformedArchive, d))?;
        let mut budget = Budget {
            inner: decoder,
            used: 0,
            limit: errs.limit,
            tripped: &errs.tripped,
        };
        let mut state = LayerState::new(layer.index);
        let hasher = self.read_layer(&mut budget, &mut state, &errs)?;
        let bytes = hasher.len();
        let actual = hasher.finish();
        if actual != layer.diff_id {
            return Err(errs.at(
                Rule::DiffIdMismatch,
                format!(
                    "the uncompressed layer ({bytes} bytes) hashes to {actual}, the config's diff_id is {}",
                    layer.diff_id
                ),
            ));
        }
        let stats = self
            .complete(state, bytes)
            .map_err(|(rule, detail)| errs.at(rule, detail))?;
        self.failed = false;
        Ok(stats)
    }

    /// Reads the whole uncompressed stream `src` (the budgeted decoder) on
    /// three threads (`pipe.rs`): this one decompresses, a scoped thread
    /// hashes what it read, another parses the tar and applies the entries,
    /// then checks the padding after the end marker. The tar thread's result
    /// decides: the stream's errors reach it in stream order, so whichever
    /// failure comes first in the stream wins, as on one thread. On success
    /// `src` has been read to its end and the hasher returned has seen every
    /// byte of it.
    fn read_layer(
        &mut self,
        src: &mut impl Read,
        state: &mut LayerState,
        errs: &LayerErrors,
    ) -> Result<Hasher, UnpackError> {
        let (to_tar, from_reader) = mpsc::sync_channel(pipe::CHUNKS_IN_FLIGHT);
        let (to_hash, hash_from_reader) = mpsc::sync_channel(pipe::CHUNKS_IN_FLIGHT);
        let spawn_failed =
            |e: io::Error| errs.at(Rule::Io, format!("cannot start an unpacker thread: {e}"));
        thread::scope(|s| {
            let hash_side = thread::Builder::new()
                .name("unpack-hash".into())
                .spawn_scoped(s, move || pipe::hash(hash_from_reader))
                .map_err(spawn_failed)?;
            let tar_side = thread::Builder::new()
                .name("unpack-tar".into())
                .spawn_scoped(s, move || {
                    let mut archive = tar::Archive::new(pipe::Chunks::new(from_reader));
                    self.entries(&mut archive, state, errs)?;
                    only_padding(&mut archive.into_inner(), errs)
                })
                .map_err(spawn_failed)?;
            pipe::produce(src, to_tar, to_hash);
            // A panic on either thread is the caller's, as it was on one.
            tar_side
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            Ok(hash_side
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    /// How this layer's errors are named, and its uncompressed budget: the
    /// per-layer limit, or what is left of the total when that is less.
    fn layer_errors(&self, index: usize, digest: Digest) -> LayerErrors {
        let limits = &self.policy.limits;
        let total_left = limits.max_total_bytes.saturating_sub(self.stats.bytes);
        let (limit, limit_rule, limit_what, limit_value) = if total_left < limits.max_layer_bytes {
            let what = "all layers together";
            (
                total_left,
                Rule::TotalTooLarge,
                what,
                limits.max_total_bytes,
            )
        } else {
            let what = "one layer";
            (
                limits.max_layer_bytes,
                Rule::LayerTooLarge,
                what,
                limits.max_layer_bytes,
            )
        };
        LayerErrors {
            index,
            digest,
            tripped: AtomicBool::new(false),
            limit,
            limit_rule,
            limit_what,
            limit_value,
        }
    }

    /// Reads the layer's entries in order, extension headers into [`Ext`],
    /// each real entry applied by [`Unpacker::entry`].
    fn entries<R: Read>(
        &mut self,
        archive: &mut tar::Archive<R>,
        state: &mut LayerState,
        errs: &LayerErrors,
    ) -> Result<(), UnpackError> {
        // Raw iteration: the tar crate would read GNU long names and PAX
        // headers of any size into memory; we read them with caps and
        // interpret them ourselves (`header.rs`).
        let entries = archive
            .entries()
            .map_err(|e| errs.stream(e, "reading the tar stream"))?
            .raw(true);
        let mut ext = Ext::default();
        let mut i = 0u64;
        for entry in entries {
            let mut entry = entry
                .map_err(|e| errs.stream(e, &format!("reading tar header after entry {i}")))?;
            let ty = entry.header().entry_type();
            if let Some(cap) = header::extension_cap(ty, &self.policy.limits) {
                let raw_name = entry.header().path_bytes().into_owned();
                ext.read(&mut entry, cap, ty).map_err(|step| {
                    with_entry(
                        errs.step(step, "reading a tar extension header"),
                        i,
                        &raw_name,
                    )
                })?;
                continue;
            }
            let ext_now = std::mem::take(&mut ext);
            let raw_path = ext_now.path(entry.header());
            self.stats.entries += 1;
            if self.stats.entries > self.policy.limits.max_entries {
                let e = errs.at(
                    Rule::TooManyEntries,
                    format!(
                        "more than {} entries in the image",
                        self.policy.limits.max_entries
                    ),
                );
                return Err(with_entry(e, i, &raw_path));
            }
            state.stats.entries += 1;
            self.entry(&mut entry, &ext_now, &raw_path, state)
                .map_err(|step| with_entry(errs.step(step, "reading entry data"), i, &raw_path))?;
            i += 1;
        }
        if !ext.is_empty() {
            return Err(errs.at(
                Rule::MalformedArchive,
                "the archive ends with an extension header that describes no entry".into(),
            ));
        }
        Ok(())
    }

    /// A layer whose bytes all checked out: directory times set (saved
    /// times first: an explicit entry for the same directory wins), its
    /// counts added to the totals.
    fn complete(&mut self, mut state: LayerState, bytes: u64) -> Result<LayerStats, Fail> {
        self.set_dir_times(state.saved.times.iter().map(|(p, t)| (p, t.clone())))?;
        let explicit = state.dir_times.iter().map(|(p, m)| {
            (
                p,
                rfs::Timestamps {
                    last_access: *m,
                    last_modification: *m,
                },
            )
        });
        self.set_dir_times(explicit)?;
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

/// The decompressor for a layer's media type: flate2 gzip (multi-member),
/// zstd with a capped window, or the tar itself.
fn decompress<'a, R: Read + 'a>(
    compression: Compression,
    reader: R,
) -> Result<Box<dyn Read + 'a>, String> {
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::new(reader)
                .map_err(|e| format!("zstd decoder: {e}"))?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| format!("zstd decoder: {e}"))?;
            Box::new(d)
        }
    })
}

/// The tar end marker is not the end of the stream: reads the rest so the
/// diff_id covers every byte, and refuses anything but zero padding there
/// (data after the end marker is what another parser might read as more
/// entries).
fn only_padding(rest: &mut impl Read, errs: &LayerErrors) -> Result<(), UnpackError> {
    let mut buf = [0u8; 8192];
    let mut offset = 0u64;
    loop {
        let n = rest
            .read(&mut buf)
            .map_err(|e| errs.stream(e, "reading past the tar end"))?;
        if n == 0 {
            return Ok(());
        }
        if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
            return Err(errs.at(
                Rule::MalformedArchive,
                format!(
                    "data after the tar end marker (a non-zero byte {} bytes past it)",
                    offset + i as u64
                ),
            ));
        }
        offset += n as u64;
    }
}

/// Names one layer in its errors, and tells a stream error caused by the
/// uncompressed budget (`tripped`) from a corrupt stream.
struct LayerErrors {
    index: usize,
    digest: Digest,
    tripped: AtomicBool,
    /// Uncompressed bytes this layer may have.
    limit: u64,
    limit_rule: Rule,
    limit_what: &'static str,
    /// The configured limit named in the error.
    limit_value: u64,
}

impl LayerErrors {
    fn at(&self, rule: Rule, detail: String) -> UnpackError {
        UnpackError {
            layer: Some((self.index, self.digest)),
            entry: None,
            rule,
            detail,
        }
    }

    /// A read error of the stream: the budget, or corruption.
    fn stream(&self, e: io::Error, what: &str) -> UnpackError {
        if self.tripped.load(Ordering::Acquire) {
            self.at(
                self.limit_rule,
                format!(
                    "uncompressed bytes pass the limit for {} ({} bytes)",
                    self.limit_what, self.limit_value
                ),
            )
        } else {
            self.at(Rule::MalformedArchive, format!("{what}: {e}"))
        }
    }

    fn step(&self, step: Step, what: &str) -> UnpackError {
        match step {
            Step::Rule(rule, detail) => self.at(rule, detail),
            Step::Stream(e) => self.stream(e, what),
        }
    }
}

/// Names entry number `i` (raw name `name`) in `e`.
fn with_entry(mut e: UnpackError, i: u64, name: &[u8]) -> UnpackError {
    e.entry = Some((i, escape(name)));
    e
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
