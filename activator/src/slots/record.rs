//! Per-entry records of what a tree held when it was made (a layer
//! directory of the layer store, a copied slot tree), and the check of a
//! tree against its record (`verify-layers`, layer reuse, `rollback`).
//!
//! A record lists every entry below the tree's root by its path (the bytes,
//! hex-encoded): its type, permission bits (setuid, setgid and sticky
//! included), owner, extended attributes (all but `security.selinux`, the
//! label the host's policy assigns, not the image), and per type the size
//! and sha256 of a regular file, the target of a symlink, the device
//! number of a device node (an overlayfs whiteout is a 0:0 character
//! device). A tree just unpacked is recorded with [`record_known`]: each
//! file's size and sha256 from the unpacker, which hashed the data as it
//! wrote it, the rest from a walk that reads no file data (one read of
//! the data per flip); [`record`] reads every file (checks, and trees no
//! unpacker wrote). A
//! layer's record also names the unpack policy it was made under
//! ([`Record::policy`]). Records are JSON, written atomically (0600) beside
//! the tree (`layers/<diff_id>.files`, `slots/<machine>.files`) before the
//! tree is used: a layer never exists without its record.
//!
//! [`check`] walks the tree again ([`crate::walk`]: any depth, any path
//! length, nothing followed) and reports what differs: changed, missing,
//! added or retyped entries, modes, owners, xattrs, device numbers. It owns
//! no policy about what to do with a difference.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use kubeslot_image::digest::HashingReader;
use kubeslot_image::unpack::FileHashes;
use rustix::fs::{FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::walk::{self, Visit};

/// The record format written now. Records of the first format (no
/// version: no modes, owners or xattrs) are refused as such.
pub const VERSION: u32 = 2;

/// The xattr never recorded: the host's security policy assigns it.
const HOST_LABEL: &str = "security.selinux";

/// What an entry is, with what identifies its contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    File {
        size: u64,
        sha256: String,
    },
    /// The target's bytes, hex-encoded.
    Symlink {
        target: String,
    },
    Dir,
    Char {
        rdev: u64,
    },
    Block {
        rdev: u64,
    },
    Fifo,
    Socket,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::File { .. } => "file",
            Kind::Symlink { .. } => "symlink",
            Kind::Dir => "directory",
            Kind::Char { .. } => "character device",
            Kind::Block { .. } => "block device",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
        }
    }
}

/// One entry of a tree, keyed by its path (hex of the bytes) in [`Record`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(flatten)]
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Extended attributes: name to hex-encoded value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// What a tree held: entry by hex-encoded relative path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub version: u32,
    /// The sha256 of the unpack policy a layer was unpacked under
    /// (`layers::policy_hash`): a layer is reused only under the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    pub entries: BTreeMap<String, Entry>,
}

impl Default for Record {
    fn default() -> Record {
        Record {
            version: VERSION,
            policy: None,
            entries: BTreeMap::new(),
        }
    }
}

/// One difference between a tree and its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The entry's path relative to the tree, as text.
    pub path: String,
    /// `missing`, `added`, or what changed.
    pub what: String,
    /// The path's bytes.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

impl Mismatch {
    fn new(hex_path: &str, what: String) -> Mismatch {
        let bytes = hex::decode(hex_path).unwrap_or_else(|_| hex_path.as_bytes().to_vec());
        Mismatch {
            path: String::from_utf8_lossy(&bytes).into_owned(),
            what,
            bytes,
        }
    }

    /// An entry the record does not have.
    pub fn is_addition(&self) -> bool {
        self.what == ADDED
    }

    /// A recorded entry that is not there any more.
    pub fn is_removal(&self) -> bool {
        self.what == MISSING
    }

    /// A regular file whose contents alone changed.
    pub fn is_contents_only(&self) -> bool {
        self.what == CONTENTS
    }

    /// An entry of another type than the recorded one.
    pub fn is_retype(&self) -> bool {
        self.what.starts_with(RETYPED)
    }
}

const ADDED: &str = "added";
const MISSING: &str = "missing";
const RETYPED: &str = "was a ";
const CONTENTS: &str = "contents changed";

/// Records the tree at `dir` (not following links), made under `policy`.
pub fn record(dir: &Path, policy: Option<String>) -> io::Result<Record> {
    Ok(recorded(dir, policy, &|_| false, &FileHashes::new())?.0)
}

/// Records the tree an unpacker just wrote, taking each regular file's
/// size and sha256 from `known` (the unpacker's, computed as it wrote the
/// data) instead of reading the file again: one read of the data per
/// flip. Everything else (type, mode, owner, xattrs, link targets) is
/// what the tree shows, so the record is the one [`record`] makes. A file
/// `known` does not have, or has at another size, is read. Returns the
/// record and how many files were read.
pub fn record_known(
    dir: &Path,
    policy: Option<String>,
    known: &FileHashes,
) -> io::Result<(Record, u64)> {
    recorded(dir, policy, &|_| false, known)
}

fn recorded(
    dir: &Path,
    policy: Option<String>,
    skip: &dyn Fn(&[u8]) -> bool,
    known: &FileHashes,
) -> io::Result<(Record, u64)> {
    let mut r = Recorder {
        entries: BTreeMap::new(),
        skip,
        known,
        read: 0,
    };
    walk::walk(dir, &mut r).map_err(walk::WalkError::into_io)?;
    let record = Record {
        version: VERSION,
        policy,
        entries: r.entries,
    };
    Ok((record, r.read))
}

struct Recorder<'a> {
    entries: BTreeMap<String, Entry>,
    /// Paths neither recorded nor walked into.
    skip: &'a dyn Fn(&[u8]) -> bool,
    known: &'a FileHashes,
    /// Regular files read (their hash not known).
    read: u64,
}

impl Visit for Recorder<'_> {
    fn entry(&mut self, e: &walk::Entry) -> io::Result<bool> {
        if (self.skip)(e.rel) {
            return Ok(false);
        }
        let st = e.stat;
        let is_file = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
        let known = self
            .known
            .get(&(st.st_dev, st.st_ino))
            .filter(|(size, _)| is_file && i64::try_from(*size).is_ok_and(|s| s == st.st_size));
        let entry = match known {
            Some((size, digest)) => attributes_of(
                e,
                Kind::File {
                    size: *size,
                    sha256: digest.hex(),
                },
            )?,
            None => {
                self.read += u64::from(is_file);
                entry_of(e)?
            }
        };
        self.entries.insert(hex::encode(e.rel), entry);
        Ok(true)
    }
}

/// `kind` with the entry's mode, owner and xattrs.
fn attributes_of(e: &walk::Entry, kind: Kind) -> io::Result<Entry> {
    Ok(Entry {
        kind,
        mode: e.stat.st_mode & 0o7777,
        uid: e.stat.st_uid,
        gid: e.stat.st_gid,
        xattrs: xattrs_of(e)?,
    })
}

/// The record entry of what the walk shows.
pub fn entry_of(e: &walk::Entry) -> io::Result<Entry> {
    let st = e.stat;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            // O_NONBLOCK | O_NOCTTY: should the name have become a fifo or
            // a device since the stat, opening it neither blocks nor acts.
            // O_NOATIME: a check writes nothing (an unpacked file's atime is
            // the image's, so its first read would dirty every inode); it
            // needs the file's owner or CAP_FOWNER, else the plain open.
            let flags = OFlags::RDONLY
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC
                | OFlags::NOCTTY
                | OFlags::NONBLOCK;
            let fd = match rustix::fs::openat(e.dir, e.name, flags | OFlags::NOATIME, Mode::empty())
            {
                Err(rustix::io::Errno::PERM) => {
                    rustix::fs::openat(e.dir, e.name, flags, Mode::empty())
                }
                r => r,
            }?;
            let now = rustix::fs::fstat(&fd)?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                return Err(io::Error::other("replaced while it was being read"));
            }
            let mut h = HashingReader::new(File::from(fd));
            io::copy(&mut h, &mut io::sink())?;
            let (digest, size) = h.finish();
            Kind::File {
                size,
                sha256: digest.hex(),
            }
        }
        FileType::Symlink => Kind::Symlink {
            target: hex::encode(rustix::fs::readlinkat(e.dir, e.name, Vec::new())?.to_bytes()),
        },
        FileType::Directory => Kind::Dir,
        FileType::CharacterDevice => Kind::Char { rdev: st.st_rdev },
        FileType::BlockDevice => Kind::Block { rdev: st.st_rdev },
        FileType::Fifo => Kind::Fifo,
        FileType::Socket => Kind::Socket,
        FileType::Unknown => return Err(io::Error::other("an entry of unknown type")),
    };
    attributes_of(e, kind)
}

/// The entry's xattrs (but [`HOST_LABEL`]), read through
/// `/proc/self/fd/<dir>/<name>` with the `l*` calls: relative to the open
/// directory (no long path is resolved) and the entry itself, never what a
/// link names. Works for every type, where `f*` calls need an open file.
fn xattrs_of(e: &walk::Entry) -> io::Result<BTreeMap<String, String>> {
    let mut path = format!("/proc/self/fd/{}/", e.dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(e.name.to_bytes());
    let path = PathBuf::from(OsString::from_vec(path));
    let mut out = BTreeMap::new();
    let names = match read_sized(|buf| match buf {
        None => rustix::fs::llistxattr_query(&path),
        Some(b) => rustix::fs::llistxattr(&path, b),
    }) {
        Ok(n) => n,
        Err(e) if e == rustix::io::Errno::NOTSUP => return Ok(out),
        Err(e) => return Err(e.into()),
    };
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if name == HOST_LABEL {
            continue;
        }
        let value = match read_sized(|buf| match buf {
            None => rustix::fs::lgetxattr_query(&path, name.as_str()),
            Some(b) => rustix::fs::lgetxattr(&path, name.as_str(), b),
        }) {
            Ok(v) => v,
            // removed between the list and the read
            Err(e) if e == rustix::io::Errno::NODATA => continue,
            Err(e) => return Err(e.into()),
        };
        out.insert(name, hex::encode(value));
    }
    Ok(out)
}

/// Calls `call(None)` for the size, then `call(Some(buf))`, again when the
/// value grew in between (ERANGE).
fn read_sized(
    call: impl Fn(Option<&mut [u8]>) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    loop {
        let size = call(None)?;
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size];
        match call(Some(&mut buf)) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `record` to `path` atomically (0600).
pub fn save(path: &Path, record: &Record) -> io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    kubeslot_image::atomic::write_file_mode(path, &bytes, 0o600)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Reads a record; one of the first format (no modes, owners or xattrs)
/// is an error that says so.
pub fn load(path: &Path) -> io::Result<Record> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        if bytes.starts_with(b"{\"entries\"") {
            io::Error::other(
                "written by an earlier kubeslot version (no modes, owners or xattrs): not trusted",
            )
        } else {
            io::Error::other(e)
        }
    })
}

/// What differs between `dir` now and `record`, sorted by path.
pub fn check(dir: &Path, record: &Record) -> io::Result<Vec<Mismatch>> {
    let now = self::record(dir, None)?;
    Ok(compare(&record.entries, &now.entries))
}

/// [`check`] of everything but what `skip` names (a path it names is
/// neither read nor reported, nor anything below it).
pub fn check_except(
    dir: &Path,
    record: &Record,
    skip: &dyn Fn(&[u8]) -> bool,
) -> io::Result<Vec<Mismatch>> {
    let (now, _) = recorded(dir, None, skip, &FileHashes::new())?;
    let want: BTreeMap<String, Entry> = record
        .entries
        .iter()
        .filter(|(p, _)| !hex::decode(p).is_ok_and(|b| skip(&b)))
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    Ok(compare(&want, &now.entries))
}

/// What differs from `want` in `got` (both by hex path), sorted by path.
pub fn compare(want: &BTreeMap<String, Entry>, got: &BTreeMap<String, Entry>) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => out.push(Mismatch::new(p, MISSING.into())),
            Some(g) => {
                if let Some(what) = difference(w, g) {
                    out.push(Mismatch::new(p, what));
                }
            }
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        out.push(Mismatch::new(p, ADDED.into()));
    }
    out.sort_by(|a, b| a.bytes.cmp(&b.bytes));
    out
}

/// How `got` differs from `want`, in words; `None` when it does not.
pub fn difference(want: &Entry, got: &Entry) -> Option<String> {
    let mut what = Vec::new();
    match (&want.kind, &got.kind) {
        (a, b) if a == b => {}
        (Kind::File { .. }, Kind::File { .. }) => what.push(CONTENTS.to_string()),
        (Kind::Symlink { .. }, Kind::Symlink { .. }) => what.push("target changed".into()),
        (Kind::Char { .. }, Kind::Char { .. }) | (Kind::Block { .. }, Kind::Block { .. }) => {
            what.push("device number changed".into())
        }
        (a, b) => what.push(format!("{RETYPED}{}, is a {}", a.name(), b.name())),
    }
    if want.mode != got.mode {
        what.push(format!("mode {:04o} -> {:04o}", want.mode, got.mode));
    }
    if (want.uid, want.gid) != (got.uid, got.gid) {
        what.push(format!(
            "owner {}:{} -> {}:{}",
            want.uid, want.gid, got.uid, got.gid
        ));
    }
    if want.xattrs != got.xattrs {
        let names = |e: &Entry| e.xattrs.keys().cloned().collect::<Vec<_>>().join(" ");
        what.push(format!("xattrs [{}] -> [{}]", names(want), names(got)));
    }
    (!what.is_empty()).then(|| what.join(", "))
}

/// The record file of the tree at `dir`: `<dir>.files`.
pub fn record_path(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(".files");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{chown, PermissionsExt as _};

    fn changes(d: &Path, r: &Record) -> Vec<(String, String)> {
        check(d, r)
            .unwrap()
            .into_iter()
            .map(|m| (m.path, m.what))
            .collect()
    }

    /// A check reads with O_NOATIME: a layer store checked on every flip
    /// is not written to by it (an unpacked file's atime is the image's
    /// old time, which relatime would replace at the first read).
    #[test]
    fn recording_a_tree_leaves_its_access_times_alone() {
        use std::os::unix::fs::MetadataExt as _;
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
        for p in [&a, &b] {
            std::fs::write(p, b"data").unwrap();
            let f = File::options().write(true).open(p).unwrap();
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(old)
                    .set_modified(old),
            )
            .unwrap();
        }
        let atime = |p: &Path| std::fs::metadata(p).unwrap().atime();
        // control: a plain read on this file system does move an old atime
        std::fs::read(&a).unwrap();
        assert_ne!(
            atime(&a),
            1_500_000_000,
            "this test needs a relatime or strictatime mount"
        );
        record(d.path(), None).unwrap();
        assert_eq!(atime(&b), 1_500_000_000);
    }

    #[test]
    fn a_changed_added_or_removed_entry_is_reported() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("layer");
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::write(d.join("usr/bin/kubelet"), b"v1").unwrap();
        std::fs::write(d.join("etc"), b"x").unwrap();
        std::os::unix::fs::symlink("kubelet", d.join("usr/bin/k")).unwrap();
        let r = record(&d, Some("p".into())).unwrap();
        save(&record_path(&d), &r).unwrap();
        assert_eq!(load(&record_path(&d)).unwrap(), r);
        assert!(check(&d, &r).unwrap().is_empty());
        std::fs::write(d.join("usr/bin/kubelet"), b"v2").unwrap();
        std::fs::remove_file(d.join("etc")).unwrap();
        std::fs::write(d.join("new"), b"").unwrap();
        std::fs::remove_file(d.join("usr/bin/k")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", d.join("usr/bin/k")).unwrap();
        assert_eq!(
            changes(&d, &r),
            [
                ("etc".to_string(), "missing".to_string()),
                ("new".into(), "added".into()),
                ("usr/bin/k".into(), "target changed".into()),
                ("usr/bin/kubelet".into(), "contents changed".into()),
            ]
        );
    }

    #[test]
    fn modes_owners_xattrs_and_device_numbers_are_recorded() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("layer");
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::write(d.join("usr/bin/kubelet"), b"v1").unwrap();
        crate::render::gpu::mknod_char(&d.join("wh"), 0, 0).unwrap();
        let r = record(&d, None).unwrap();
        assert_eq!(
            r.entries[&hex::encode("wh")].kind,
            Kind::Char { rdev: 0 },
            "{r:?}"
        );
        // same contents, same size: only the metadata changes
        let kubelet = d.join("usr/bin/kubelet");
        chown(&kubelet, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o4755)).unwrap();
        rustix::fs::setxattr(
            &kubelet,
            "security.capability",
            &[1u8, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        std::fs::remove_file(d.join("wh")).unwrap();
        crate::render::gpu::mknod_char(&d.join("wh"), 1, 3).unwrap();
        let got = changes(&d, &r);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0].1,
            "mode 0644 -> 4755, owner 0:0 -> 65534:65534, xattrs [] -> [security.capability]"
        );
        assert_eq!(got[1], ("wh".into(), "device number changed".into()));
    }

    #[test]
    fn a_record_of_the_first_format_is_refused_as_such() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("l.files");
        std::fs::write(&p, br#"{"entries":{"6574":{"type":"dir"}}}"#).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("earlier kubeslot version"), "{e}");
    }
}
