//! The safe layer unpacker: applies an image's layers, in order, into an
//! empty staging directory, refusing anything that could reach outside it,
//! smuggle privileges in, or exhaust the host.
//!
//! Given: the staging directory (opened once as a handle), a [`Policy`], and
//! per layer a reader of the blob with its compressed digest (for errors),
//! its `diff_id` and its compression. It decompresses in-process (gzip,
//! zstd, plain tar), hashes the uncompressed stream against the `diff_id`,
//! reads entries with the `tar` crate and applies them with its own code
//! (`apply.rs`): never following a symlink, with OCI whiteout and
//! opaque-directory semantics (`whiteout.rs`) and the name rules of
//! `path.rs`. Every refusal is an [`UnpackError`] naming layer, entry and
//! [`Rule`].
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
use std::os::fd::AsFd;
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec};
use rustix::io::Errno;

use crate::digest::{Digest, HashingReader};
use crate::oci::Compression;

use apply::{Fail, Meta, Tree};
pub use path::ImagePath;
pub use rules::{escape, Limits, Policy, Rule, UnpackError};
use whiteout::Kind;

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
}

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

/// Per-layer bookkeeping: paths this layer wrote (duplicate detection, and
/// "entries of the same layer survive whiteouts"), their ancestors, and
/// directory times to set once the layer is complete.
struct LayerState {
    written: HashSet<u128>,
    ancestors: HashSet<u128>,
    dir_times: Vec<(ImagePath, Timespec)>,
    stats: LayerStats,
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
        let setuid_allowed = policy.setuid_allowlist.iter().cloned().collect();
        Ok(Unpacker {
            tree,
            policy,
            setuid_allowed,
            stats: Stats::default(),
            buf: vec![0; BUF_BYTES],
            keys: (RandomState::new(), RandomState::new()),
            failed: false,
        })
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
            ancestors: HashSet::new(),
            dir_times: Vec::new(),
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
            let entries = archive
                .entries()
                .map_err(|e| stream_err(e, "reading the tar stream"))?;
            for (i, entry) in entries.enumerate() {
                let i = i as u64;
                let mut entry = entry
                    .map_err(|e| stream_err(e, &format!("reading tar header after entry {i}")))?;
                let with_entry = |mut e: UnpackError, entry: &tar::Entry<'_, _>| {
                    e.entry = Some((i, escape(&entry.path_bytes())));
                    e
                };
                self.stats.entries += 1;
                if self.stats.entries > self.policy.limits.max_entries {
                    let e = at(
                        Rule::TooManyEntries,
                        format!(
                            "more than {} entries in the image",
                            self.policy.limits.max_entries
                        ),
                    );
                    return Err(with_entry(e, &entry));
                }
                state.stats.entries += 1;
                match self.entry(&mut entry, &mut state) {
                    Ok(()) => {}
                    Err(Step::Rule(rule, detail)) => {
                        return Err(with_entry(at(rule, detail), &entry))
                    }
                    Err(Step::Stream(e)) => {
                        let e = stream_err(e, "reading entry data");
                        return Err(with_entry(e, &entry));
                    }
                }
            }
        }

        // The tar end marker is not the end of the stream: hash the rest
        // (padding, or anything appended) so the diff_id covers every byte.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink())
            .map_err(|e| stream_err(e, "reading past the tar end"))?;
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
        self.set_dir_times(&state.dir_times)
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

    fn path_key(&self, p: &[u8]) -> u128 {
        let a = self.keys.0.hash_one(p) as u128;
        let b = self.keys.1.hash_one(p) as u128;
        (a << 64) | b
    }

    /// Applies one entry.
    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let limits = &self.policy.limits;
        let header = entry.header();
        let ty = header.entry_type();
        let raw_mode = header
            .mode()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("mode field: {e}")))?;
        let uid = header
            .uid()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("uid field: {e}")))?;
        let gid = header
            .gid()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("gid field: {e}")))?;
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

        // PAX records: sparse markers, mtime with sub-seconds, xattrs.
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(pax) = entry
            .pax_extensions()
            .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("PAX header: {e}")))?
        {
            for ext in pax {
                let ext = ext
                    .map_err(|e| Step::Rule(Rule::MalformedArchive, format!("PAX record: {e}")))?;
                let key = ext.key_bytes();
                if key.starts_with(b"GNU.sparse.") {
                    return Err(Step::Rule(
                        Rule::Sparse,
                        "PAX GNU.sparse records mark a sparse entry".into(),
                    ));
                }
                if key == b"mtime" {
                    mtime = parse_pax_time(ext.value_bytes()).ok_or_else(|| {
                        Step::Rule(
                            Rule::MalformedArchive,
                            format!("PAX mtime {:?}", escape(ext.value_bytes())),
                        )
                    })?;
                } else if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    xattrs.push((
                        String::from_utf8_lossy(name).into_owned(),
                        ext.value_bytes().to_vec(),
                    ));
                } else if key.starts_with(b"LIBARCHIVE.xattr.") {
                    state.stats.ignored_xattrs += 1;
                }
            }
        }

        let raw_path = entry.path_bytes().into_owned();
        let path = ImagePath::parse(&raw_path, limits).map_err(|(r, d)| Step::Rule(r, d))?;
        let meta = Meta {
            uid: uid.min(u32::MAX as u64) as u32,
            gid: gid.min(u32::MAX as u64) as u32,
            mode,
            mtime,
        };
        if uid > u32::MAX as u64 || gid > u32::MAX as u64 {
            return Err(Step::Rule(
                Rule::MalformedArchive,
                format!("owner {uid}:{gid} does not fit 32 bits"),
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
            let root = self
                .tree
                .open_dir(b"", false)
                .map_err(Step::from)?
                .ok_or_else(|| Step::Rule(Rule::Io, "target vanished".into()))?;
            drop(root);
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

        let (dir, name) = path.split_last().expect("not the root");
        let shown = path.as_bytes();
        match kind {
            EntryKind::File => {
                self.check_setuid(&path, mode, &xattrs)?;
                let parent = self
                    .tree
                    .dir(dir, true)?
                    .expect("created")
                    .try_clone_to_owned();
                let parent = parent.map_err(|e| Step::Rule(Rule::Io, format!("dup: {e}")))?;
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
                let parent = self
                    .tree
                    .dir(dir, true)?
                    .expect("created")
                    .try_clone_to_owned();
                let parent = parent.map_err(|e| Step::Rule(Rule::Io, format!("dup: {e}")))?;
                let fd = self.tree.create_dir(parent.as_fd(), name, shown)?;
                self.set_meta(&fd, &path, &meta, &xattrs, false, &mut state.stats)?;
                state.dir_times.push((path, mtime));
                state.stats.dirs += 1;
            }
            EntryKind::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                check_link_target(&target, limits)?;
                state.stats.ignored_xattrs += xattrs.len() as u64;
                let parent = self
                    .tree
                    .dir(dir, true)?
                    .expect("created")
                    .try_clone_to_owned();
                let parent = parent.map_err(|e| Step::Rule(Rule::Io, format!("dup: {e}")))?;
                self.tree
                    .create_symlink(parent.as_fd(), name, &target, &meta, shown)?;
                state.stats.symlinks += 1;
            }
            EntryKind::Hardlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                self.hardlink(&path, &target)?;
                state.stats.ignored_xattrs += xattrs.len() as u64;
                state.stats.hardlinks += 1;
            }
            EntryKind::Node(ft) => {
                state.stats.ignored_xattrs += xattrs.len() as u64;
                let parent = self
                    .tree
                    .dir(dir, true)?
                    .expect("created")
                    .try_clone_to_owned();
                let parent = parent.map_err(|e| Step::Rule(Rule::Io, format!("dup: {e}")))?;
                self.tree
                    .create_node(parent.as_fd(), name, ft, &meta, shown)?;
                state.stats.nodes += 1;
            }
        }
        Ok(())
    }

    /// Setuid/setgid bits and file capabilities only on allowlisted paths.
    fn check_setuid(
        &self,
        path: &ImagePath,
        mode: u32,
        xattrs: &[(String, Vec<u8>)],
    ) -> Result<(), Step> {
        let caps = xattrs.iter().any(|(n, _)| n == "security.capability");
        if (mode & 0o6000 != 0 || caps) && !self.setuid_allowed.contains(&path.to_absolute()) {
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

    /// A hardlink: the target must be a regular file already in the tree.
    fn hardlink(&mut self, path: &ImagePath, target: &[u8]) -> Result<(), Step> {
        let limits = &self.policy.limits;
        let tpath = ImagePath::parse(target, limits).map_err(|(r, d)| match r {
            Rule::Dotdot | Rule::Absolute => Step::Rule(
                Rule::HardlinkOutside,
                format!("hardlink target \"{}\": {d}", escape(target)),
            ),
            r => Step::Rule(r, format!("hardlink target \"{}\": {d}", escape(target))),
        })?;
        let missing = || {
            Step::Rule(
                Rule::HardlinkMissing,
                format!(
                    "hardlink target \"{}\" is not in the tree (yet)",
                    escape(tpath.as_bytes())
                ),
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
        if privileged && !self.setuid_allowed.contains(&path.to_absolute()) {
            return Err(Step::Rule(
                Rule::Setuid,
                format!(
                    "hardlink {} to setuid/setgid or capability file \"{}\" is not in the setuid allowlist",
                    path.to_absolute(),
                    escape(tpath.as_bytes())
                ),
            ));
        }
        let (dir, name) = path.split_last().expect("not the root");
        let parent = self
            .tree
            .dir(dir, true)?
            .expect("created")
            .try_clone_to_owned()
            .map_err(|e| Step::Rule(Rule::Io, format!("dup: {e}")))?;
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
    fn whiteout(&mut self, dir: &[u8], name: &[u8], state: &LayerState) -> Result<(), Step> {
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
                let keep = |p: &[u8]| self.layer_wrote(p, state);
                let r = self.tree.prune(&fd, &target, &keep);
                self.tree.invalidate();
                r?;
            }
            return Ok(());
        }
        self.tree.remove(parent.as_fd(), name, target.as_bytes())?;
        Ok(())
    }

    /// `dir/.wh..wh..opq`: removes lower layers' entries in `dir`.
    fn opaque(&mut self, dir: &[u8], state: &LayerState) -> Result<(), Step> {
        let Some(fd) = self.tree.open_dir(dir, false)? else {
            return Ok(());
        };
        let dir_path = ImagePath::from_normalised(dir);
        let keep = |p: &[u8]| self.layer_wrote(p, state);
        let r = self.tree.prune(&fd, &dir_path, &keep);
        self.tree.invalidate();
        r.map_err(Step::from)
    }

    fn layer_wrote(&self, p: &[u8], state: &LayerState) -> bool {
        let k = self.path_key(p);
        state.written.contains(&k) || state.ancestors.contains(&k)
    }

    /// Directory times, once no child will change them any more.
    fn set_dir_times(&self, dirs: &[(ImagePath, Timespec)]) -> Result<(), Fail> {
        for (path, mtime) in dirs {
            let ts = rfs::Timestamps {
                last_access: *mtime,
                last_modification: *mtime,
            };
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
            tv_sec: tv_sec - 1,
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
